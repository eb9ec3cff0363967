"""The model families, one entry each: a family is its folder (models/<package>/) plus one line of :data:`FAMILIES`.

:func:`get_adapter`, the ``csd --model`` loaders (:mod:`csd_kernels.zoo`) and the command's choices and help all read
this table. It names code by ``"module:attribute"`` strings, resolved on use, so reading the names and help imports
neither torch nor transformers (this module imports only the standard library).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Optional, Union

if TYPE_CHECKING:
    import torch

    from ..config.generation import GenerationConfig

__all__ = ["FAMILIES", "Family", "Measure", "ZooModel", "command_models", "family_of", "get_adapter", "resolve"]


def resolve(ref: Union[str, Callable]) -> Any:
    """The object a ``"package.module:attribute"`` reference names (the module imported now); a callable as is."""
    if callable(ref):
        return ref
    module, _, attribute = ref.partition(":")
    return getattr(importlib.import_module(module), attribute)


@dataclass(frozen=True)
class Family:
    """One ``csd --model`` name: how to load it from the command line and, for a family of models, how to recognise
    and drive a model object someone built themselves."""

    name: str  # the csd --model name
    help: str  # its line in the command's --model help: what it loads, what a prompt is
    loader: Union[str, Callable, None]  # (device=None, **options) -> ZooModel, or its "module:attribute";
    # None: Python API only
    adapter: Union[str, Callable, None] = None  # called with a recognised model, returns its adapter (or raises)
    recognises: tuple[str, ...] = ()  # model classes get_adapter wraps: a class name or "module.QualName" (MRO)
    hint: str = ""  # what get_adapter takes for this family, for its error when nothing matches
    # (prompts: list) -> None, ValueError for a prompt the model cannot take, decided without torch or the model (so
    # the command refuses it before loading), or its "module:attribute"; None: anything
    prompts: Union[str, Callable, None] = None

    def drives(self, model) -> bool:
        """Whether ``model``'s class (or one it derives from) is one this family recognises; nothing is imported."""
        names = {name for cls in type(model).__mro__ for name in (cls.__name__, f"{cls.__module__}.{cls.__qualname__}")}
        return any(name in names for name in self.recognises)

    def load(self, **options) -> "ZooModel":
        if self.loader is None:
            raise ValueError(f"--model {self.name}: no command-line loader (use the Python API)")
        return resolve(self.loader)(**options)

    def check_prompts(self, prompts: list) -> None:
        """ValueError (one line) for a prompt this model cannot take; nothing is loaded but the grammar."""
        if self.prompts is not None:
            resolve(self.prompts)(prompts)


_MODELS = "csd_kernels.models"
_CLASS_IDS, _TEXT = f"{_MODELS}.prompts:class_id_texts", f"{_MODELS}.prompts:text_prompts"
FAMILIES = (
    Family("llamagen", "class-conditional LlamaGen: --weights c2i_*.pt --config GPT-B [--vq]; prompts: ImageNet ids",
           loader=f"{_MODELS}.llamagen.command:load", adapter=f"{_MODELS}.llamagen:LlamaGenAdapter",
           recognises=(f"{_MODELS}.llamagen.gpt.Transformer",),
           hint="a LlamaGen checkpoint loaded by csd_kernels.models.load_llamagen(...)", prompts=_CLASS_IDS),
    Family("lumina-mgpt", "Lumina-mGPT: --weights DIR [--size 768]; prompts: text",
           loader=f"{_MODELS}.lumina.command:load", adapter=f"{_MODELS}.lumina:LuminaMGPT",
           recognises=("ChameleonForConditionalGeneration",),
           hint="a ChameleonForConditionalGeneration (Lumina-mGPT layout, or "
                "csd_kernels.models.LuminaMGPT(model, ...))", prompts=_TEXT),
    Family("janus-pro", "Janus-Pro: --weights DIR, deepseek-ai's release or the transformers format; prompts: text",
           loader=f"{_MODELS}.janus.command:load", adapter=f"{_MODELS}.janus:JanusAdapter",
           recognises=("JanusForConditionalGeneration",), hint="a JanusForConditionalGeneration", prompts=_TEXT),
    Family("emu3", "Emu3-Gen: --weights DIR in the transformers format [--size 720]; prompts: text",
           loader=f"{_MODELS}.emu3.command:load", adapter=f"{_MODELS}.emu3.adapter:adapter_of",
           recognises=("Emu3ForConditionalGeneration",),
           hint="an Emu3ForConditionalGeneration in csd_kernels.models.Emu3Adapter(model, grid, ...)", prompts=_TEXT),
    Family("image-gpt", "any causal LM over a codebook of image tokens (Python API only)", loader=None,
           hint="a causal LM wrapped in csd_kernels.models.ImageGPT(lm, image_token_range=..., grid=..., "
                "null_token_id=...)"),
)


def command_models(shipped_loaders: Optional[dict] = None, shipped_prompts: Optional[dict] = None
                   ) -> tuple[Family, ...]:
    """Every ``csd --model`` entry in the command's order: the models zoo/ ships (constants.SHIPPED_MODELS: names and
    help; ``shipped_loaders``: {name: loader} and ``shipped_prompts``: {name: prompt check}, which the zoo owns; None
    for the names and help alone), then the families with a command-line loader."""
    from ..constants import SHIPPED_MODELS  # on use: this module is read by path, without the package

    loaders, checks = shipped_loaders or {}, shipped_prompts or {}
    shipped = (Family(name, text, loader=loaders.get(name), prompts=checks.get(name))
               for name, text in SHIPPED_MODELS.items())
    return (*shipped, *(family for family in FAMILIES if family.loader is not None))


def family_of(model) -> Optional[Family]:
    """The family that recognises ``model``, or None."""
    return next((family for family in FAMILIES if family.drives(model)), None)


def get_adapter(model):
    """The adapter that drives ``model`` (an adapter is returned as is); ValueError when none can."""
    from .protocol import is_adapter

    if is_adapter(model):
        return model
    family = family_of(model)
    if family is not None:
        return resolve(family.adapter)(model)
    hints = ", ".join(family.hint for family in FAMILIES if family.hint)
    raise ValueError(f"no csd_kernels adapter can drive a {type(model).__name__}: pass {hints}, "
                     "or any object implementing csd_kernels.models.ImageAdapter")


def _default_config() -> "GenerationConfig":
    from ..config.generation import GenerationConfig  # on use: this module is read by path, without the package

    return GenerationConfig()


@dataclass(frozen=True)
class Measure:
    """One quality number of a zoo model: ``quality(...)[name]``, shown as ``label`` (tables) and ``axis`` (plots)."""

    name: str
    label: str
    higher_is_better: bool
    axis: str  # what the number is, as a plot's axis says it
    fmt: str = ".3f"  # table format of mean and std
    log_scale: bool = False  # plot on a log axis (a distance: a collapsed setting is 100x worse than the rest)


@dataclass
class ZooModel:
    """What ``csd --model NAME`` runs: the model and what the command needs besides the decoding loop."""

    name: str
    model: object  # an ImageAdapter (csd_kernels.models)
    parse: Callable[[list[str]], dict]  # prompts -> generate() inputs (input_ids [B, S], attention_mask)
    defaults: "GenerationConfig" = field(default_factory=_default_config)  # generate()'s settings for this model
    quality: Optional[Callable[["torch.Tensor", list[str]], dict]] = None  # (tokens [B, H*W], prompts) -> metrics
    # (prompts, seed) -> the same metrics for held-out real images of those prompts: the best a model can score
    heldout_quality: Optional[Callable[[list[str], int], dict]] = None
    prompt_help: str = ""
    measures: tuple = ()  # the Measures quality() returns, in table order
    ceiling_label: str = "held-out real images"  # what heldout_quality measures, as a table row names it

    def prompt_inputs(self, prompts: list[str]) -> dict:
        """generate()'s inputs for ``prompts`` (a list: one string is refused, not read as its characters);
        ValueError, one line, for a prompt the model cannot take."""
        from .prompts import prompt_list

        return self.parse(prompt_list(prompts))
