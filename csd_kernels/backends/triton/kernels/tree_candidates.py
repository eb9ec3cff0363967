"""Sibling candidates of a draft tree on the GPU: reference.tree_candidates on the uniforms of
reference.tree_gumbel_uniforms (the tree stream), one program per (row, level), chunked over the vocabulary keeping
the best K - 1 keys log q - log(-log u). Ties go to the lowest token (the reference's stable sort)."""

import triton
import triton.language as tl

from .... import reference as ref
from .common import philox, row_key, uniform

TREE_TAG = tl.constexpr(ref.TREE_STREAM_TAG)


@triton.jit
def _tree_uniforms(v0, level, off_lo, tag, k0, k1, BLOCK_V: tl.constexpr):
    """Tree-stream uniforms of tokens v0 .. v0 + BLOCK_V - 1 (v0 a multiple of 4) at ``level``: one Philox per 4."""
    grp = (tl.arange(0, BLOCK_V // 4) + v0 // 4).to(tl.uint32)
    zero = tl.zeros_like(grp)
    l0, l1, l2, l3 = philox(grp, zero + level, zero + off_lo, zero + tag, zero + k0, zero + k1)
    return uniform(tl.reshape(tl.join(tl.join(l0, l2), tl.join(l1, l3)), [BLOCK_V]))


@triton.jit
def tree_candidates_kernel(seed_ptr, seed_stride, offset_ptr, offset_stride, main_ptr, q_ptr, out_ptr, P, V, first,
                           PER_ROW_SEED: tl.constexpr, SIBLINGS: tl.constexpr, BLOCK_K: tl.constexpr,
                           BLOCK_V: tl.constexpr):
    """Grid (B, P): out[b, j] = (main, the SIBLINGS best tokens by key, -1 where the key is not finite).
    main_ptr [B, P] int64, q_ptr [B, P, V] fp32, out_ptr [B, P, SIBLINGS + 1] int64, all contiguous."""
    b = tl.program_id(0).to(tl.int64)
    j = tl.program_id(1).to(tl.int64)
    k0, k1, row_id = row_key(seed_ptr, seed_stride, b, PER_ROW_SEED)
    off_lo = (tl.load(offset_ptr + b * offset_stride) & 0xFFFFFFFF).to(tl.uint32)
    tag = (row_id & 0x3FFFFFFF) | TREE_TAG
    level = ((first + j) & 0xFFFFFFFF).to(tl.uint32)
    main = tl.load(main_ptr + b * P + j)
    q_row = q_ptr + (b * P + j) * V
    rank = tl.arange(0, BLOCK_K)
    top_key = tl.full([BLOCK_K], float("-inf"), tl.float32)
    top_tok = tl.full([BLOCK_K], -1, tl.int64)
    for v0 in range(0, V, BLOCK_V):
        offs = v0 + tl.arange(0, BLOCK_V)
        q = tl.load(q_row + offs, mask=offs < V, other=0.0)
        key = tl.log(q) - tl.log(-tl.log(_tree_uniforms(v0, level, off_lo, tag, k0, k1, BLOCK_V)))
        key = tl.where(key != key, float("inf"), key)  # NaN: first in the reference's sort, and -1 like +inf
        key = tl.where((offs >= V) | (offs == main) | (q <= 0.0), float("-inf"), key)
        old_key, old_tok = top_key, top_tok
        # merge: the best SIBLINGS of the kept keys (earlier, lower tokens: they win ties) and this chunk's keys
        for r in tl.static_range(SIBLINGS):
            best_old = tl.max(old_key, 0)
            best_new = tl.max(key, 0)
            take_old = best_old >= best_new
            tok_old = tl.min(tl.where(old_key == best_old, old_tok, V), 0)
            tok_new = tl.min(tl.where(key == best_new, offs.to(tl.int64), V), 0)
            tok = tl.where(take_old, tok_old, tok_new)
            top_key = tl.where(rank == r, tl.where(take_old, best_old, best_new), top_key)
            top_tok = tl.where(rank == r, tok, top_tok)
            old_key = tl.where(old_tok == tok, tl.where(take_old, float("-inf"), old_key), old_key)
            key = tl.where(offs == tok, tl.where(take_old, key, float("-inf")), key)
    out_row = out_ptr + (b * P + j) * (SIBLINGS + 1)
    tl.store(out_row, main)
    finite = (top_key > float("-inf")) & (top_key < float("inf"))
    tl.store(out_row + 1 + rank, tl.where(finite, top_tok, -1), mask=rank < SIBLINGS)
