"""The models the ``csd`` command drives, by name: the shipped digits model (``load("digits")``) and local checkpoints
of the three families (``load("llamagen", weights=..., config=..., vq=...)``, ``load("lumina-mgpt", weights=DIR)``,
``load("janus-pro", weights=DIR)``; :mod:`.checkpoints`).

An entry bundles what the command needs besides the decoding loop: the model (an adapter :func:`csd_kernels.generate`
drives), how prompts on the command line become generate() inputs, the sampling defaults of the family, and — where
the model has one — a quality measure of generated images.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np
import torch

__all__ = ["ZooModel", "MODEL_NAMES", "load", "describe_options"]


@dataclass
class ZooModel:
    name: str
    model: object  # an ImageAdapter (csd_kernels.models)
    prompt_inputs: Callable[[list[str]], dict]  # prompts -> generate() inputs (input_ids [B, S], attention_mask)
    defaults: dict = field(default_factory=dict)  # generate() keyword defaults for this model
    quality: Optional[Callable[[torch.Tensor, list[str]], dict]] = None  # (tokens [B, H*W], prompts) -> metrics
    # (prompts, seed) -> the same metrics for held-out real images of those prompts: the best a model can score
    heldout_quality: Optional[Callable[[list[str], int], dict]] = None
    prompt_help: str = ""


def _no_options(name: str, options: dict) -> None:
    given = sorted(k for k, v in options.items() if v is not None)
    if given:
        flags = ", ".join("--" + k.replace("_", "-") for k in given)
        raise ValueError(f"--model {name} ships its weights: {flags} do not apply")


def _digits(device: Optional[torch.device] = None, **options) -> ZooModel:
    _no_options("digits", options)
    from ..models import ImageGPT
    from .digits import DEFAULT_CFG, GRID, NULL_TOKEN_ID, NUM_CLASSES, NUM_CODES, load_codebook, load_lm, prompt_ids

    codebook = load_codebook()
    lm = load_lm() if device is None else load_lm().to(device)
    model = ImageGPT(lm, image_token_range=(0, NUM_CODES), grid=GRID, null_token_id=NULL_TOKEN_ID,
                     decode=lambda tokens: codebook.decode(tokens.cpu()))

    def parse(prompts: list[str]) -> dict:
        classes = []
        for prompt in prompts:
            text = str(prompt).strip()
            if not text.isdigit() or not 0 <= int(text) < NUM_CLASSES:
                raise ValueError(f"prompt {prompt!r}: the digits model takes a class id 0..{NUM_CLASSES - 1}")
            classes.append(int(text))
        ids = prompt_ids(classes)
        return {"input_ids": ids if device is None else ids.to(device)}

    def measure(tokens: torch.Tensor, prompts: list[str]) -> dict:
        return _digits_quality(codebook.decode(tokens.cpu()), prompts)

    def heldout(prompts: list[str], seed: int) -> dict:
        return _digits_quality(_digits_heldout_images(prompts, seed), prompts)

    return ZooModel("digits", model, parse, defaults=dict(cfg_scale=DEFAULT_CFG), quality=measure,
                    heldout_quality=heldout, prompt_help=f"a digit class 0..{NUM_CLASSES - 1}")


def _scenes(device: Optional[torch.device] = None, **options) -> ZooModel:
    _no_options("scenes", options)
    from .scenes import zoo_model

    return zoo_model(device)


def _digits_quality(images: torch.Tensor, prompts: list[str]) -> dict:
    """Classifier accuracy and Fréchet distance to the train-split digits of the prompted classes."""
    from .digits import quality

    labels = np.array([int(p) for p in prompts])
    real = _digits_train_features(tuple(sorted(set(labels.tolist()))))
    # a Fréchet distance is a statistic of a set: none for a single image
    frechet = quality.frechet_distance(quality.features(images), real) if len(images) >= 2 else None
    return {"accuracy": quality.class_accuracy(images, labels), "frechet": frechet}


@functools.lru_cache(maxsize=None)
def _digits_train_features(classes: tuple[int, ...]) -> np.ndarray:
    """Classifier features of the train-split digits of the prompted classes (the Fréchet reference set)."""
    from .digits import quality

    _, _, y, _ = quality._data_split()
    return quality.real_features(split="train")[np.isin(y, classes)]


def digits_heldout_per_class() -> int:
    """Held-out (test-split) digits of the rarest class: the most images per class the held-out ceiling can match."""
    from .digits import quality

    _, _, _, y = quality._data_split()
    return int(np.bincount(y).min())


def _digits_heldout_images(prompts: list[str], seed: int) -> torch.Tensor:
    """Held-out (test-split) digits [N, 32, 32], one per prompt of its class, drawn without replacement by ``seed``."""
    from .digits import quality, upsample

    _, x8, _, y = quality._data_split()
    labels = [int(p) for p in prompts]
    rng = np.random.default_rng(seed)
    pools = {c: list(rng.permutation(np.flatnonzero(y == c))) for c in set(labels)}
    for c in pools:
        if labels.count(c) > len(pools[c]):
            raise ValueError(f"class {c}: {labels.count(c)} prompts but {len(pools[c])} held-out digits")
    return upsample(x8[[pools[c].pop() for c in labels]])


def _loaders() -> dict:
    from . import checkpoints

    return {"digits": _digits, "scenes": _scenes, "llamagen": checkpoints.llamagen,
            "lumina-mgpt": checkpoints.lumina_mgpt, "janus-pro": checkpoints.janus_pro, "emu3": checkpoints.emu3}


MODEL_NAMES = ("digits", "scenes", "llamagen", "lumina-mgpt", "janus-pro", "emu3")


@functools.lru_cache(maxsize=None)
def load(name: str, *, device=None, **options) -> ZooModel:
    """The model ``name`` (loaded once per process and set of arguments) on ``device`` (default: its own).

    ``options``: ``weights``, ``config``, ``vq``, ``image_size``, ``size``, ``dtype`` where the family takes them
    (see :mod:`.checkpoints`); ValueError with one line saying what is wrong (unknown name, missing file, a folder
    that is not such a checkpoint, an option that does not apply).
    """
    loaders = _loaders()
    if name not in loaders:
        raise ValueError(f"--model {name!r}: unknown model; choose from {', '.join(MODEL_NAMES)}")
    return loaders[name](device=None if device is None else torch.device(device), **options)


def describe_options(options: dict) -> dict:
    """The options that were given, with absolute paths: what a run records to recognise its model."""
    return {k: os.path.abspath(v) if k in ("weights", "vq") else v for k, v in sorted(options.items()) if v is not None}
