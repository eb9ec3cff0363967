"""The models the ``csd`` command drives, by name (:data:`MODELS`): the ones shipped here (``load("digits")``,
``load("scenes")``; ``load("scenes", weights=DIR)`` for a scenes model trained elsewhere), then the checkpoint families
of :mod:`csd_kernels.models.registry` (``load("llamagen", weights=..., config=..., vq=...)``, ``load("lumina-mgpt",
weights=DIR)``, ``load("janus-pro", weights=DIR)``, ``load("emu3", weights=DIR)``; each family's command.py says what
its options are).

A :class:`ZooModel` bundles what the command needs besides the decoding loop: the model (an adapter
:func:`csd_kernels.generate` drives), how prompts on the command line become generate() inputs, the sampling defaults
of the family, and — where the model has one — quality measures of generated images (``measures``: what each number
is and which way is better, so that the frontier, the tables and the plots of ``csd sweep`` / ``csd compare`` follow
the model).
"""

from __future__ import annotations

import functools
import os
from typing import TYPE_CHECKING, Optional

from ..config.generation import GenerationConfig
from ..fileio.inputs import InputError, quote, read_prompt_lines
from ..models.registry import Measure, ZooModel, command_models

if TYPE_CHECKING:
    import numpy as np
    import torch

__all__ = ["MODELS", "MODEL_NAMES", "MEASURED_MODELS", "DIGITS_MEASURES", "Measure", "ZooModel", "check_prompts",
           "check_prompt_file", "check_lantern_k",
           "describe_options", "load", "measurement_prompts"]

DIGITS_MEASURES = (Measure("accuracy", "accuracy", True, "classifier accuracy"),
                   Measure("frechet", "Fréchet", False, "Fréchet distance to real digits", ".2f", log_scale=True))
# torch-free checks of each shipped model's prompts (the command runs them before it loads the model)
SHIPPED_PROMPTS = {"digits": "csd_kernels.zoo.digits.prompts:check", "scenes": "csd_kernels.zoo.scenes.prompts:check"}
MEASURED_MODELS = ("digits", "scenes")  # the shipped models with quality measures (csd sweep)


def _no_options(name: str, options: dict) -> None:
    given = sorted(k for k, v in options.items() if v is not None)
    if given:
        flags = ", ".join("--" + k.replace("_", "-") for k in given)
        raise ValueError(f"--model {name} ships its weights: {flags} {'does' if len(given) == 1 else 'do'} not "
                         "apply")


def _digits(device: Optional[torch.device] = None, **options) -> ZooModel:
    _no_options("digits", options)
    from ..models import ImageGPT
    from .digits import DEFAULT_CFG, GRID, NULL_TOKEN_ID, NUM_CLASSES, NUM_CODES, load_codebook, load_lm, prompt_ids
    from .digits.prompts import check

    codebook = load_codebook()
    lm = load_lm() if device is None else load_lm().to(device)
    model = ImageGPT(lm, image_token_range=(0, NUM_CODES), grid=GRID, null_token_id=NULL_TOKEN_ID,
                     decode=lambda tokens: codebook.decode(tokens.cpu()), codebook=codebook.values)

    def parse(prompts: list[str]) -> dict:
        ids = prompt_ids(check(prompts))
        return {"input_ids": ids if device is None else ids.to(device)}

    def measure(tokens: torch.Tensor, prompts: list[str]) -> dict:
        return _digits_quality(codebook.decode(tokens.cpu()), prompts)

    def heldout(prompts: list[str], seed: int) -> dict:
        return _digits_quality(_digits_heldout_images(prompts, seed), prompts)

    return ZooModel("digits", model, parse, defaults=GenerationConfig(cfg_scale=DEFAULT_CFG), quality=measure,
                    heldout_quality=heldout, prompt_help=f"a digit class 0..{NUM_CLASSES - 1}",
                    measures=DIGITS_MEASURES, ceiling_label="held-out real digits")


def _scenes(device: Optional[torch.device] = None, weights: Optional[str] = None, **options) -> ZooModel:
    """The shipped scenes model, or (``weights=DIR``) a trained one: DIR holds config.json and model.safetensors
    (and tokenizer.safetensors, else the shipped tokenizer)."""
    _no_options("scenes", options)
    from .scenes import zoo_model

    return zoo_model(device, weights)


def measurement_prompts(name: str, per_class: Optional[int] = None, images: Optional[int] = None) -> list[str]:
    """The prompts a measurement of ``name`` generates (``csd sweep``): digits each class ``per_class`` times (default
    8), scenes a fixed mix of ``images`` prompts on the textured backgrounds, clouds and waves in turn (default 64;
    1-3 objects uniformly, ``world.random_prompts(images, seed=0, backgrounds=world.TEXTURES)``: the regime of real
    image models, where a token depends on its neighbours). ValueError, one line, for a model without a quality
    measure or the flag that does not apply."""
    if name == "digits":
        if images is not None:
            raise ValueError("--images does not apply to --model digits (its prompts are the ten classes): "
                             "use --per-class N")
        return [str(c) for c in range(10) for _ in range(8 if per_class is None else per_class)]
    if name == "scenes":
        if per_class is not None:
            raise ValueError("--per-class does not apply to --model scenes (it has no classes; its prompts are a "
                             "fixed mix): use --images N")
        from .scenes.world import TEXTURES, random_prompts

        return random_prompts(64 if images is None else images, seed=0, backgrounds=TEXTURES)
    raise ValueError(f"--model {name}: csd sweep needs a quality measure; only {' and '.join(MEASURED_MODELS)} "
                     "have one")


def _digits_quality(images: "torch.Tensor", prompts: list[str]) -> dict:
    """Classifier accuracy and Fréchet distance to the train-split digits of the prompted classes."""
    import numpy as np

    from .digits import quality

    labels = np.array([int(p) for p in prompts])
    real = _digits_train_features(tuple(sorted(set(labels.tolist()))))
    # a Fréchet distance is a statistic of a set: none for a single image
    frechet = quality.frechet_distance(quality.features(images), real) if len(images) >= 2 else None
    return {"accuracy": quality.class_accuracy(images, labels), "frechet": frechet}


@functools.lru_cache(maxsize=None)
def _digits_train_features(classes: tuple[int, ...]) -> "np.ndarray":
    """Classifier features of the train-split digits of the prompted classes (the Fréchet reference set)."""
    import numpy as np

    from .digits import quality

    _, _, y, _ = quality.data_split()
    return quality.real_features(split="train")[np.isin(y, classes)]


def digits_heldout_per_class() -> int:
    """Held-out (test-split) digits of the rarest class: the most images per class the held-out ceiling can match."""
    import numpy as np

    from .digits import quality

    _, _, _, y = quality.data_split()
    return int(np.bincount(y).min())


def _digits_heldout_images(prompts: list[str], seed: int) -> "torch.Tensor":
    """Held-out (test-split) digits [N, 32, 32], one per prompt of its class, drawn without replacement by ``seed``."""
    import numpy as np

    from .digits import quality, upsample

    _, x8, _, y = quality.data_split()
    labels = [int(p) for p in prompts]
    rng = np.random.default_rng(seed)
    pools = {c: list(rng.permutation(np.flatnonzero(y == c))) for c in set(labels)}
    for c in pools:
        if labels.count(c) > len(pools[c]):
            raise ValueError(f"class {c}: {labels.count(c)} prompts but {len(pools[c])} held-out digits")
    return upsample(x8[[pools[c].pop() for c in labels]])


# Every --model name, one entry each: the models shipped in zoo/, then the families with a command-line loader.
MODELS = command_models({"digits": _digits, "scenes": _scenes}, SHIPPED_PROMPTS)
MODEL_NAMES = tuple(entry.name for entry in MODELS)


@functools.lru_cache(maxsize=None)
def load(name: str, *, device=None, **options) -> ZooModel:
    """The model ``name`` (loaded once per process and set of arguments) on ``device`` (default: its own).

    ``options``: ``weights``, ``config``, ``vq``, ``image_size``, ``size``, ``dtype`` where the family takes them
    (see the family's command.py); ValueError with one line saying what is wrong (unknown name, missing file, a folder
    that is not such a checkpoint, an option that does not apply).
    """
    import torch

    return _entry(name).load(device=None if device is None else torch.device(device), **options)


def _entry(name: str):
    entry = next((entry for entry in MODELS if entry.name == name), None)
    if entry is None:
        raise ValueError(f"--model {quote(name)}: unknown model; choose from {', '.join(MODEL_NAMES)}")
    return entry


def check_prompts(name: str, prompts: list) -> None:
    """ValueError (one line) for a prompt ``--model name`` cannot take, decided without loading the model (or
    torch); a prompt that another shipped model takes says which."""
    try:
        _entry(name).check_prompts(prompts)
    except ValueError as exc:
        for prompt in prompts:
            others = [other.name for other in MODELS if other.name != name and other.name in SHIPPED_PROMPTS
                      and _takes(other, prompt)]
            if not _takes(_entry(name), prompt) and others:
                raise ValueError(f"{exc}; it is a prompt of {' and '.join('--model ' + o for o in others)}") from exc
        raise


def check_prompt_file(name: str, path: str, flag: str = "--prompts") -> list[str]:
    """The prompts of the file ``path`` (one a line), each checked as :func:`check_prompts` does; InputError naming
    the flag, the path and the line."""
    entry = _entry(name)
    lines = read_prompt_lines(path, flag)
    for number, prompt in lines:
        try:
            check_prompts(entry.name, [prompt])
        except ValueError as exc:
            raise InputError(flag, path, f"line {number}: {exc}") from None
    return [prompt for _, prompt in lines]


def check_lantern_k(entry: ZooModel, modes, lantern_k: Optional[int]) -> None:
    """ValueError (one line, naming the flag) for a --lantern-k wider than the model's neighbour table (its V − 1
    other codes), when one of ``modes`` takes the table: decided once the model is loaded, before anything is
    written (the op would refuse it only after the run began)."""
    from ..config.acceptance import rule_named
    from ..config.modes import MODE_TABLE
    from ..models import get_adapter

    rules = [MODE_TABLE[mode].rule for mode in modes if MODE_TABLE[mode].rule is not None]
    if lantern_k is None or not any(rule_named(rule).needs_neighbours for rule in rules):
        return
    width = get_adapter(entry.model).vocab_size - 1
    if lantern_k > width:
        raise ValueError(f"--lantern-k {lantern_k}: expected an int in [1, {width}] for --model {entry.name} (its "
                         f"neighbour table holds the {width} other codes of its codebook)")


def _takes(entry, prompt) -> bool:
    try:
        entry.check_prompts([prompt])
    except ValueError:
        return False
    return True


def describe_options(options: dict) -> dict:
    """The options that were given, with absolute paths: what a run records to recognise its model."""
    return {k: os.path.abspath(v) if k in ("weights", "vq") else v for k, v in sorted(options.items()) if v is not None}
