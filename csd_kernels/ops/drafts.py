"""Draft tokens for the decoding loop, computed by the fastest implementation for the tensors' device — the C++
extension on the CPU, a Triton kernel on a GPU, the reference otherwise (and when traced: torch.compile fuses it).

* :func:`random_draft_tokens`: fresh tokens, lane 2 of the step stream (reference.random_draft_tokens). Every
  implementation returns the same tokens bit for bit (tests/test_reference.py).
* :func:`tree_candidates`: the sibling candidates of a draft tree (reference.tree_candidates on the tree stream's
  uniforms, reference.tree_gumbel_uniforms). Every implementation returns the same tokens (tests/test_tree_drafts.py);
  keys equal to the last float bit are not promised (std::log, Triton's log and torch's vectorised log may differ by
  an ulp), so tokens could differ only where two keys are within an ulp of each other.
"""

from __future__ import annotations

import torch

from .. import reference as ref
from ..backends import compiled
from .registry import backend_status

__all__ = ["random_draft_tokens", "tree_candidates", "MAX_BRANCHING"]

MAX_BRANCHING = 65  # the kernels keep at most 64 siblings (csrc/cpu/tree_candidates.cpp); wider trees: the reference


def _implementation(device: torch.device) -> str:
    """"compiled", "triton" or "torch" (the reference) for tensors on ``device``; "torch" when traced."""
    if torch.compiler.is_compiling():
        return "torch"
    if device.type == "cpu" and compiled.compiled_extension() is not None:
        return "compiled"
    if device.type == "cuda" and backend_status("triton", device)[0]:
        return "triton"
    return "torch"


def random_draft_tokens(seed: torch.Tensor, offset: torch.Tensor, positions: torch.Tensor, length: int,
                        vocab: int) -> torch.Tensor:
    """[B, L] int64 uniformly random tokens in [0, V).  Shape: seed [1] or [B], offset [1] or [B], positions [B]."""
    chosen = _implementation(positions.device)
    if chosen == "compiled":
        return compiled.random_draft_tokens(seed, offset, positions, length, vocab)
    if chosen == "triton":
        from ..backends.triton import drafts

        return drafts.draft_tokens(seed, offset, positions, length, vocab)
    return ref.random_draft_tokens(seed, offset, positions, length, vocab)


def tree_candidates(seed: torch.Tensor, offset: torch.Tensor, main_tokens: torch.Tensor, q: torch.Tensor,
                    branching: int, first: int) -> torch.Tensor:
    """[B, P, K] int64: rank 0 the main draft, ranks 1..K-1 Gumbel-top-(K-1) of log q without it on the tree stream
    of levels first .. first + P - 1 (-1 where q has no mass left).

    Shape: seed [1] or [B], offset [1] or [B], main_tokens [B, P] int64 (-1: none), q [B, P, V] float32."""
    if q.dim() != 3 or main_tokens.shape != q.shape[:2]:
        raise ValueError(f"main_tokens: expected [B, P] matching q [B, P, V], got {tuple(main_tokens.shape)} and "
                         f"{tuple(q.shape)}")
    if not 1 <= branching <= q.shape[-1] + 1:
        raise ValueError(f"branching: expected 1 .. V + 1 = {q.shape[-1] + 1}, got {branching}")
    if first < 0:
        raise ValueError(f"first: expected >= 0, got {first}")
    kernels = q.dtype == torch.float32 and 1 < branching <= MAX_BRANCHING  # else the reference
    chosen = _implementation(q.device) if kernels else "torch"
    if chosen == "compiled":
        return compiled.tree_candidates(seed, offset, main_tokens, q, branching, first)
    if chosen == "triton":
        from ..backends.triton import drafts

        return drafts.tree_candidates(seed, offset, main_tokens, q, branching, first)
    batch, levels, vocab = q.shape
    u = ref.tree_gumbel_uniforms(seed.to(q.device), offset.to(q.device), batch, first + levels, vocab, first=first)
    return ref.tree_candidates(main_tokens, q, branching, u)
