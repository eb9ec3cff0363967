"""``ck.codebook_neighbours``: each code's nearest codes in a VQ codebook, the neighbour table lantern and lantern++
take (reference.rules.codebook_neighbours defines it), and the decoding loop's cached table of a model's codebook."""

from __future__ import annotations

import numbers
from typing import Optional

import torch

from .. import reference as ref

__all__ = ["codebook_neighbours", "model_neighbours"]

_CACHE: dict = {}  # (id(codebook), k) -> (codebook, table): the loop asks once per generate() call
_CACHE_SIZE = 8


def codebook_neighbours(codebook: torch.Tensor, k: int) -> torch.Tensor:
    """[V, k] int64: each code's k nearest codes in ``codebook`` [V, D] by L2 distance, nearest first, ties by the
    lower index, the code itself excluded (1 <= k <= V − 1); on the codebook's device. ValueError naming the argument
    otherwise."""
    if not isinstance(codebook, torch.Tensor) or codebook.dim() != 2 or not codebook.is_floating_point():
        got = f"{codebook.dtype} {tuple(codebook.shape)}" if isinstance(codebook, torch.Tensor) else \
            type(codebook).__name__
        raise ValueError(f"codebook must be a floating-point tensor [V, D], got {got}")
    vocab = codebook.shape[0]
    if vocab < 2 or codebook.shape[1] < 1:
        raise ValueError(f"codebook must have V >= 2 codes of D >= 1 dims, got {tuple(codebook.shape)}")
    if isinstance(k, bool) or not isinstance(k, numbers.Integral) or not 1 <= k <= vocab - 1:
        raise ValueError(f"k must be an int in [1, V - 1] = [1, {vocab - 1}], got {k!r}")
    if not torch.isfinite(codebook).all():
        raise ValueError("codebook must be finite")
    return ref.codebook_neighbours(codebook.detach(), int(k))


def model_neighbours(codebook: Optional[torch.Tensor], k: int, vocab: int) -> Optional[torch.Tensor]:
    """The table of a model's codebook [vocab, D] with min(k, vocab − 1) neighbours (None without a codebook),
    made once per codebook and k."""
    if codebook is None:
        return None
    if codebook.dim() != 2 or codebook.shape[0] != vocab:
        raise ValueError(f"the model's codebook must be [V, D] with V = {vocab} image tokens, got "
                         f"{tuple(codebook.shape)}")
    k = min(int(k), vocab - 1)
    key = (id(codebook), k)
    hit = _CACHE.get(key)
    if hit is not None and hit[0] is codebook:
        return hit[1]
    table = codebook_neighbours(codebook, k)
    if len(_CACHE) >= _CACHE_SIZE:
        _CACHE.pop(next(iter(_CACHE)))
    _CACHE[key] = (codebook, table)
    return table
