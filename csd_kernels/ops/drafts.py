"""Fresh draft tokens for the decoding loop: lane 2 of the step stream (reference.random_draft_tokens), computed by
the fastest implementation for the tensors' device — the C++ extension on the CPU, a Triton kernel on a GPU, the
reference otherwise. Every implementation returns the same tokens bit for bit (tests/test_reference.py)."""

from __future__ import annotations

import torch

from . import reference as ref
from .dispatch import backend_status, compiled_extension

__all__ = ["random_draft_tokens"]


def random_draft_tokens(seed: torch.Tensor, offset: torch.Tensor, positions: torch.Tensor, length: int,
                        vocab: int) -> torch.Tensor:
    """[B, L] int64 uniformly random tokens in [0, V).  Shape: seed [1] or [B], offset [1] or [B], positions [B]."""
    device = positions.device
    if torch.compiler.is_compiling():  # traced: the reference, which torch.compile fuses
        return ref.random_draft_tokens(seed, offset, positions, length, vocab)
    if device.type == "cpu" and compiled_extension() is not None:
        return compiled_extension().random_draft_tokens(seed, offset, positions, length, vocab)
    if device.type == "cuda" and backend_status("triton", device)[0]:
        return _triton_draft_tokens(seed, offset, positions, length, vocab)
    return ref.random_draft_tokens(seed, offset, positions, length, vocab)


def _triton_draft_tokens(seed, offset, positions, length, vocab):
    from .triton_kernels.drafts import draft_tokens_kernel
    from .triton_verify import device_guard

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
