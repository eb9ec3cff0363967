"""The sibling candidates of a draft tree for the decoding loop (reference.tree_candidates on the tree stream's
uniforms, reference.tree_gumbel_uniforms), computed by the fastest implementation for the tensors' device — the C++
extension on the CPU, a Triton kernel on a GPU, the reference otherwise. Every implementation returns the same tokens
(tests/test_tree_drafts.py); keys equal to the last float bit are not promised (std::log, Triton's log and torch's
vectorised log may differ by an ulp), so tokens could differ only where two keys are within an ulp of each other."""

from __future__ import annotations

import torch

from . import reference as ref
from .dispatch import backend_status, compiled_extension

__all__ = ["tree_candidates"]

MAX_BRANCHING = 65  # the kernels keep at most 64 siblings (csrc/cpu/tree_candidates.cpp); wider trees: the reference


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
    device, fp32 = q.device, q.dtype == torch.float32
    if torch.compiler.is_compiling() or not fp32 or not 1 < branching <= MAX_BRANCHING:  # traced: the reference
        return _reference(seed, offset, main_tokens, q, branching, first)
    if device.type == "cpu" and compiled_extension() is not None:
        return compiled_extension().tree_candidates(seed, offset, main_tokens, q, branching, first)
    if device.type == "cuda" and backend_status("triton", device)[0]:
        return _triton_candidates(seed, offset, main_tokens, q, branching, first)
    return _reference(seed, offset, main_tokens, q, branching, first)


def _reference(seed, offset, main_tokens, q, branching, first):
    batch, levels, vocab = q.shape
    u = ref.tree_gumbel_uniforms(seed.to(q.device), offset.to(q.device), batch, first + levels, vocab, first=first)
    return ref.tree_candidates(main_tokens, q, branching, u)


def _triton_candidates(seed, offset, main_tokens, q, branching, first, block=None):
    from .triton_kernels.tree_candidates import tree_candidates_kernel
    from .triton_verify import device_guard

    batch, levels, vocab = q.shape
    seed, offset = seed.reshape(-1), offset.reshape(-1)
    main_tokens, q = main_tokens.contiguous(), q.contiguous()
    out = torch.empty((batch, levels, branching), dtype=torch.int64, device=q.device)
    if batch * levels:
        with device_guard(q.device):  # launch on the tensors' device, not the current one
            tree_candidates_kernel[(batch, levels)](
                seed, seed.stride(0) if seed.numel() != 1 else 0, offset,
                offset.stride(0) if offset.numel() != 1 else 0, main_tokens, q, out, levels, vocab, first,
                PER_ROW_SEED=seed.numel() != 1, SIBLINGS=branching - 1,
                BLOCK_K=max(2, 1 << (branching - 2).bit_length()), BLOCK_V=block or candidate_block(vocab), num_warps=4)
    return out


def candidate_block(vocab: int) -> int:
    """Vocabulary chunk of the Triton kernel: the vocabulary rounded up to a power of two, at most 1024."""
    return min(1024, max(16, 1 << (vocab - 1).bit_length()))
