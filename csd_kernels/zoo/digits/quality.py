"""Sample-quality measures for the digits model (the FID / CLIP-score analogue).

A deterministic scikit-learn classifier (StandardScaler + LogisticRegression) is
trained, at first use, on a fixed 75% split of the real 8x8 ``load_digits``
images and cached in-process (nothing is shipped or downloaded).  Generated
32x32 images are area-averaged back to 8x8 in the 0..16 scale before use.

* :func:`class_accuracy` – fraction of images the classifier assigns to the
  prompted class (the CLIP-score analogue).
* :func:`features` + :func:`frechet_distance` – Fréchet distance between
  Gaussians fit to classifier features (the FID analogue); the features are the
  10 decision-function logits concatenated with the 64 standardised pixels.
"""

from __future__ import annotations

import functools

import numpy as np
import torch
import torch.nn.functional as F

from ..frechet import frechet_distance  # noqa: F401  (the measure of both shipped models)
from .tokenizer import upsample

SPLIT_SEED = 0
TEST_FRACTION = 0.25


def downsample_to_8x8(images32) -> np.ndarray:
    """[N, 32, 32] float in [0, 1] -> float64 [N, 64] in the 0..16 scale of ``load_digits`` (4x4 area average)."""
    x = torch.as_tensor(np.asarray(images32) if not isinstance(images32, torch.Tensor) else images32)
    if x.ndim != 3 or tuple(x.shape[1:]) != (32, 32):
        raise ValueError(f"expected images of shape [N, 32, 32], got {tuple(x.shape)}")
    x = x.detach().float().cpu().clamp(0.0, 1.0)
    small = F.avg_pool2d(x[:, None], kernel_size=4)[:, 0]  # [N, 8, 8]
    return (small.reshape(x.shape[0], 64).double() * 16.0).numpy()


@functools.lru_cache(maxsize=1)
def data_split():
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    d = load_digits()
    return train_test_split(
        d.data.astype(np.float64), d.target, test_size=TEST_FRACTION, random_state=SPLIT_SEED, stratify=d.target
    )


def _round_trip8(x8: np.ndarray) -> np.ndarray:
    """[N, 64] 0..16 -> bilinear 32x32 -> area 8x8 (what a perfectly reproduced upsampled digit looks like)."""
    return downsample_to_8x8(upsample(x8))


@functools.lru_cache(maxsize=1)
def classifier():
    """The cached, deterministic classifier (sklearn Pipeline) trained on the fixed train split."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    x_tr, _, y_tr, _ = data_split()
    # train on the raw 8x8 digits and on the same digits passed through the 8 -> 32 (bilinear)
    # -> 8 (area) round trip that generated images go through, so both domains are covered
    x_rt = _round_trip8(x_tr)
    clf = make_pipeline(StandardScaler(), LogisticRegression(C=0.5, max_iter=3000))
    clf.fit(np.concatenate([x_tr, x_rt]), np.concatenate([y_tr, y_tr]))
    return clf


def heldout_accuracy(round_trip: bool = False) -> float:
    """Accuracy of the classifier on the held-out real 8x8 digits (optionally after the 8->32->8 round trip)."""
    _, x_te, _, y_te = data_split()
    if round_trip:
        x_te = _round_trip8(x_te)
    return float((classifier().predict(x_te) == y_te).mean())


def predict(images32) -> np.ndarray:
    return classifier().predict(downsample_to_8x8(images32))


def class_accuracy(images32, labels) -> float:
    """Fraction of 32x32 images the classifier assigns to ``labels``."""
    labels = np.asarray(torch.as_tensor(labels).cpu()).reshape(-1)
    pred = predict(images32)
    if pred.shape[0] != labels.shape[0]:
        raise ValueError(f"{pred.shape[0]} images but {labels.shape[0]} labels")
    return float((pred == labels).mean())


def _features8(x8: np.ndarray) -> np.ndarray:
    return np.asarray(classifier().decision_function(x8), dtype=np.float64)


def features(images32) -> np.ndarray:
    """Classifier features [N, 10]: the decision-function logits of the downsampled images."""
    return _features8(downsample_to_8x8(images32))


def real_features(n: int | None = None, split: str = "all", seed: int = 0, round_trip: bool = True) -> np.ndarray:
    """Features of real digits (``split`` in {"all", "train", "test"}); ``n`` draws a fixed random subset.

    With ``round_trip`` (default) the digits first go through the same 8 -> 32 (bilinear) -> 8 (area)
    path as generated images (i.e. ``features(digits_dataset()[0])``), the like-for-like reference
    for samples of the digits model; ``round_trip=False`` uses the raw 8x8 digits.
    """
    from sklearn.datasets import load_digits

    if split == "all":
        x = load_digits().data.astype(np.float64)
    elif split in ("train", "test"):
        x_tr, x_te, _, _ = data_split()
        x = x_tr if split == "train" else x_te
    else:
        raise ValueError(f"split must be 'all', 'train' or 'test', got {split!r}")
    if n is not None:
        if n <= 0 or n > x.shape[0]:
            raise ValueError(f"n must be in 1..{x.shape[0]}, got {n}")
        idx = np.random.default_rng(seed).permutation(x.shape[0])[:n]
        x = x[np.sort(idx)]
    if round_trip:
        x = _round_trip8(x)
    return _features8(x)
