"""Triton backend of the fused tree verification (reference.verify_tree): the host function over
``kernels/tree.py``. It checks nothing (the public op did) and never synchronises with the device.

One program per row walks the tree: only the nodes on the walk's path are computed (at most M + 1 of them), each in
chunks of the vocabulary, with the row's current p and q (the RRS residuals) in a [B, 2, V] fp32 scratch.
"""

from __future__ import annotations

from typing import Optional

import torch

from ...config.acceptance import RULES
from ..spec import TreeArgs, settings_of
from .verify import CHUNK_V, device_guard, kernel_settings, pow2, register_num_warps

try:  # pragma: no cover - exercised by whichever environment imports us
    from .kernels.tree import tree_kernel

    _TRITON_ERROR: Optional[str] = None
except Exception as exc:  # pragma: no cover
    tree_kernel = None
    _TRITON_ERROR = f"{type(exc).__name__}: {exc}"

__all__ = ["verify_tree_triton", "tree_block"]


def tree_block(vocab: int) -> int:
    """The vocabulary chunk of one sweep: the whole row up to CHUNK_V tokens, else CHUNK_V."""
    return min(CHUNK_V, max(16, pow2(vocab)))


def verify_tree_triton(a: TreeArgs):
    """The tree verification on validated arguments (backends/spec.py); the fields of reference.verify_tree.

    Shape: target_logits, uncond_logits [B, S, V] (f32 / bf16 / f16); node_tokens [B, S] int64; draft_probs,
    sibling_probs [B, M, V] f32 (sibling_probs None: draft_probs); children [S, K] int64 (-1 none);
    neighbours [V, k] int64 or None; seed, offset [1] or [B] int64. top_k 0, top_p 1.0 and min_p 0.0 are
    off. Every rule but gsd (its groups need the node's row sorted: the cpu, cuda and torch backends run it).
    Returns accept_len [B] int64, path, tokens [B, M + 1] int64, accept_prob, entropy, tvd, distortion
    [B, M + 1] float32, status [B] int32.
    """
    if tree_kernel is None:  # pragma: no cover
        raise RuntimeError(f"triton is not importable ({_TRITON_ERROR})")
    st = settings_of(a)
    if RULES[st.rule].sorts_row:
        raise RuntimeError(f"the triton backend verifies no {RULES[st.rule].name} trees (its groups sort the node's "
                           "row); use the cpu, cuda or torch backend")
    target_logits, draft_probs = a.target_logits, a.draft_probs
    batch, _slots, vocab = target_logits.shape
    levels = draft_probs.shape[1]
    device = target_logits.device
    i64, f32 = dict(dtype=torch.int64, device=device), dict(dtype=torch.float32, device=device)
    accept_len, path, tokens = torch.empty(batch, **i64), torch.empty(batch, levels + 1, **i64), torch.empty(
        batch, levels + 1, **i64)
    floats = [torch.empty(batch, levels + 1, **f32) for _ in range(4)]  # accept_prob, entropy, tvd, distortion
    status = torch.empty(batch, dtype=torch.int32, device=device)
    if batch == 0:
        return accept_len, path, tokens, *floats, status
    greedy = st.temperature == 0
    uncond = a.uncond_logits if a.uncond_logits is not None else target_logits  # never read without CFG
    siblings = a.sibling_probs if a.sibling_probs is not None else draft_probs
    children = a.children.to(device)
    seed, offset = a.seed.reshape(-1), a.offset.reshape(-1)
    node_tokens = a.node_tokens
    nb = a.neighbours if a.neighbours is not None else children  # never read without a table
    block = tree_block(vocab)
    scratch = torch.empty(batch, 2, vocab, **f32)
    constexprs = dict(HAS_UNCOND=a.uncond_logits is not None, GREEDY=greedy,
                      TOP_K=(not greedy) and 0 < st.top_k < vocab, TOP_P=(not greedy) and st.top_p < 1.0,
                      MIN_P=(not greedy) and st.min_p > 0.0, RULE=int(st.rule), PER_ROW_SEED=seed.numel() != 1,
                      BLOCK_V=block, BLOCK_M=max(2, pow2(levels + 1)), GATHER_DIST=bool(st.gather_distortion),
                      HAS_INFORMED=a.informed is not None)
    informed = a.informed.view(torch.uint8) if a.informed is not None else children  # a byte per level; else unread
    with device_guard(device):
        tree_kernel[(batch,)](
            target_logits, target_logits.stride(0), target_logits.stride(1),
            uncond, uncond.stride(0), uncond.stride(1),
            draft_probs, *draft_probs.stride(),
            siblings, *siblings.stride(),
            node_tokens, *node_tokens.stride(),
            children, *children.stride(),
            seed, seed.stride(0) if seed.numel() != 1 else 0, offset, offset.stride(0) if offset.numel() != 1 else 0,
            scratch, accept_len, path, tokens, *floats, status,
            levels, children.shape[1], vocab, kernel_settings(st), nb, nb.stride(0) if a.neighbours is not None else 0,
            a.neighbours.shape[1] if a.neighbours is not None else 0,
            informed, *(informed.stride() if a.informed is not None else (0, 0)),
            **constexprs, num_warps=register_num_warps(block), enable_fp_fusion=False)
    return accept_len, path, tokens, *floats, status
