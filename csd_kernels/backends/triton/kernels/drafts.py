"""Fresh draft tokens on the GPU: lane 2 of the step stream, bit-identical to reference.random_draft_tokens."""

import triton
import triton.language as tl

from .common import philox, row_key


@triton.jit
def draft_tokens_kernel(seed_ptr, seed_stride, offset_ptr, offset_stride, positions_ptr, s_pos, out_ptr, L, V,
                        PER_ROW_SEED: tl.constexpr, BLOCK_L: tl.constexpr):
    """Grid (B,): out[b, i] = floor(lane2 · V / 2^32) of Philox(pos_b + i, row_id, offset_b, key_b)."""
    b = tl.program_id(0).to(tl.int64)
    k0, k1, row_id = row_key(seed_ptr, seed_stride, b, PER_ROW_SEED)
    i = tl.arange(0, BLOCK_L)
    pos = ((tl.load(positions_ptr + b * s_pos).to(tl.int64) + i) & 0xFFFFFFFF).to(tl.uint32)
    off = tl.load(offset_ptr + b * offset_stride)
    zero = tl.zeros_like(pos)
    off_lo = zero + (off & 0xFFFFFFFF).to(tl.uint32)
    off_hi = zero + ((off >> 32) & 0xFFFFFFFF).to(tl.uint32)
    _w0, _w1, w2, _w3 = philox(pos, zero + row_id, off_lo, off_hi, zero + k0, zero + k1)
    token = (w2.to(tl.uint64) * V.to(tl.uint64)) >> 32
    tl.store(out_ptr + b * L + i, token.to(tl.int64), mask=i < L)
