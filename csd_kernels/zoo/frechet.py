"""The Fréchet distance between Gaussians fitted to two feature sets (the FID formula), the measure both shipped
models report (numpy and scipy)."""

from __future__ import annotations

import warnings

import numpy as np

__all__ = ["frechet_distance"]


def frechet_distance(feats_a, feats_b, eps: float = 1e-6) -> float:
    """Fréchet distance between Gaussians fit to two feature sets [Na, d], [Nb, d]."""
    from scipy import linalg

    a = np.asarray(feats_a, dtype=np.float64)
    b = np.asarray(feats_b, dtype=np.float64)
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[1]:
        raise ValueError(f"feature sets must be [N, d] with equal d, got {a.shape} and {b.shape}")
    if a.shape[0] < 2 or b.shape[0] < 2:
        raise ValueError("need at least 2 samples per set")
    mu1, mu2 = a.mean(0), b.mean(0)
    s1, s2 = np.atleast_2d(np.cov(a, rowvar=False)), np.atleast_2d(np.cov(b, rowvar=False))
    diff = mu1 - mu2
    with warnings.catch_warnings():  # a singular product (few images): scipy warns, the eps retry below answers
        warnings.simplefilter("ignore")
        covmean = linalg.sqrtm(s1 @ s2)
        if not np.isfinite(covmean).all():
            off = np.eye(s1.shape[0]) * eps
            covmean = linalg.sqrtm((s1 + off) @ (s2 + off))
    if np.iscomplexobj(covmean):
        covmean = covmean.real
    fd = float(diff @ diff + np.trace(s1) + np.trace(s2) - 2.0 * np.trace(covmean))
    return max(fd, 0.0)
