"""Small, real, CPU-sized models shipped with csd_kernels, by name (``load("digits")``).

A zoo entry bundles what the ``csd`` command needs besides the decoding loop: the model (an adapter
:func:`csd_kernels.generate` drives), how a prompt on the command line becomes ``input_ids``, the sampling defaults
the model was tuned for, and — where the model has one — a quality measure of generated images.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np
import torch

__all__ = ["ZooModel", "MODEL_NAMES", "load"]


@dataclass
class ZooModel:
    name: str
    model: object  # an ImageAdapter (csd_kernels.models)
    prompt_ids: Callable[[list[str]], torch.Tensor]  # prompts -> input_ids [B, S]; ValueError on a bad prompt
    defaults: dict = field(default_factory=dict)  # generate() keyword defaults for this model
    quality: Optional[Callable[[torch.Tensor, list[str]], dict]] = None  # (tokens [B, H*W], prompts) -> metrics
    prompt_help: str = ""


def _digits() -> ZooModel:
    from ..models import ImageGPT
    from .digits import GRID, NULL_TOKEN_ID, NUM_CLASSES, NUM_CODES, load_codebook, load_lm, prompt_ids, quality

    codebook = load_codebook()
    model = ImageGPT(load_lm(), image_token_range=(0, NUM_CODES), grid=GRID, null_token_id=NULL_TOKEN_ID,
                     decode=codebook.decode)

    def parse(prompts: list[str]) -> torch.Tensor:
        classes = []
        for prompt in prompts:
            text = str(prompt).strip()
            if not text.isdigit() or not 0 <= int(text) < NUM_CLASSES:
                raise ValueError(f"prompt {prompt!r}: the digits model takes a class id 0..{NUM_CLASSES - 1}")
            classes.append(int(text))
        return prompt_ids(classes)

    def measure(tokens: torch.Tensor, prompts: list[str]) -> dict:
        images = codebook.decode(tokens.cpu())
        labels = np.array([int(p) for p in prompts])
        gen = quality.features(images)
        real = _digits_real_features(tuple(sorted(set(labels.tolist()))))
        return {"accuracy": quality.class_accuracy(images, labels), "frechet": quality.frechet_distance(gen, real)}

    return ZooModel("digits", model, parse, defaults=dict(cfg_scale=3.0), quality=measure,
                    prompt_help=f"a digit class 0..{NUM_CLASSES - 1}")


@functools.lru_cache(maxsize=None)
def _digits_real_features(classes: tuple[int, ...]) -> np.ndarray:
    """Classifier features of the real digits of the prompted classes (the Fréchet reference set)."""
    from sklearn.datasets import load_digits

    from .digits import quality

    digits = load_digits()
    keep = np.isin(digits.target, classes)
    x8 = torch.from_numpy(digits.data[keep].astype(np.float32).reshape(-1, 1, 8, 8) / 16.0)
    x32 = torch.nn.functional.interpolate(x8, size=(32, 32), mode="bilinear", align_corners=False)[:, 0]
    return quality.features(x32)


_LOADERS = {"digits": _digits}
MODEL_NAMES = tuple(_LOADERS)


@functools.lru_cache(maxsize=None)
def load(name: str) -> ZooModel:
    """The zoo model ``name`` (loaded once per process)."""
    if name not in _LOADERS:
        raise ValueError(f"unknown model {name!r}; the zoo has {', '.join(MODEL_NAMES)}")
    return _LOADERS[name]()
