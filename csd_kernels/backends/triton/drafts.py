"""Triton hosts of the decoding loop's draft tokens (:mod:`csd_kernels.ops.drafts` picks them on a GPU): fresh random
tokens (lane 2 of the step stream, reference.random_draft_tokens) and the sibling candidates of a draft tree
(reference.tree_candidates on the tree stream's uniforms). They check nothing (the op did) and never synchronise."""

from __future__ import annotations

import torch

from .kernels.drafts import draft_tokens_kernel
from .kernels.tree_candidates import tree_candidates_kernel
from .verify import device_guard

__all__ = ["draft_tokens", "tree_candidates", "candidate_block"]


def draft_tokens(seed, offset, positions, length, vocab):
    """[B, L] int64 uniformly random tokens in [0, V).  Shape: seed [1] or [B], offset [1] or [B], positions [B]."""
    seed, offset, positions = seed.reshape(-1), offset.reshape(-1), positions.reshape(-1)
    batch = positions.numel()
    out = torch.empty((batch, length), dtype=torch.int64, device=positions.device)
    if batch * length:
        with device_guard(positions.device):  # launch on the tensors' device, not the current one
            draft_tokens_kernel[(batch,)](
                seed, seed.stride(0) if seed.numel() != 1 else 0, offset,
                offset.stride(0) if offset.numel() != 1 else 0, positions, positions.stride(0), out, length, vocab,
                PER_ROW_SEED=seed.numel() != 1, BLOCK_L=max(16, 1 << (length - 1).bit_length()), num_warps=1)
    return out


def tree_candidates(seed, offset, main_tokens, q, branching, first, block=None):
    """[B, P, K] int64 candidates (see ops.drafts.tree_candidates); ``block``: the vocabulary chunk (tests force it).

    Shape: seed [1] or [B], offset [1] or [B], main_tokens [B, P] int64, q [B, P, V] float32."""
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
