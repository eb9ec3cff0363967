"""gsd's groups in Triton (reference.rules.group_acceptance), for the register path (the row in one program,
V <= 16384): a(y) by token from the row's p and q in registers.

The row is sorted once (tl.sort of int64 keys: (2^31 − 1 − order key of p) in the high word, the token in the low
word, so ranks are p descending, ties by token id; the key gives p back exactly). The sorted p and the prefix sums
of p and q (fp64, rounded to fp32) go to this position's scratch ``ws_ptr`` [4·BLOCK_V + 2] floats, where a binary
search per rank finds the δ-window's ends and the group sums are read; a(y) is scattered back by token through the
scratch. Two barriers order the scratch's writes and reads within the program.
"""

import triton
import triton.language as tl

from .common import order_key

_LOW32 = tl.constexpr(0xFFFFFFFF)


@triton.jit
def _count(ws_ps, t, V, AT_LEAST: tl.constexpr, STEPS: tl.constexpr):
    """Per lane: the number of ranks i with ps[i] > t (AT_LEAST: >= t), ps descending, by binary search."""
    lo = tl.zeros(t.shape, tl.int32)
    hi = tl.zeros(t.shape, tl.int32) + V
    for _ in tl.static_range(STEPS):
        active = lo < hi
        mid = (lo + hi) // 2
        val = tl.load(ws_ps + mid, mask=active, other=0.0)
        go = (val >= t) if AT_LEAST else (val > t)
        lo = tl.where(active & go, mid + 1, lo)
        hi = tl.where(active & ~go, mid, hi)
    return lo


@triton.jit
def gsd_groups(p, q, offs, mask, V, group_rank, group_delta, ws_ptr, BLOCK_V: tl.constexpr, STEPS: tl.constexpr):
    """a(y) = min(1, Σ_G(y) p / Σ_G(y) q) by token (0 outside the vocabulary), p and q the row [BLOCK_V]."""
    high_word = (2147483647 - order_key(p)).to(tl.int64)  # p >= 0: key >= 0, descending p ascending here
    keys = tl.where(mask, (high_word << 32) | offs.to(tl.int64), 9223372036854775807)
    keys = tl.sort(keys, 0)
    rank = tl.arange(0, BLOCK_V)
    real = rank < V
    token = (keys & _LOW32).to(tl.int32)
    key_p = (2147483647 - (keys >> 32)).to(tl.int32)
    ps = tl.where(real, key_p.to(tl.float32, bitcast=True), 0.0)
    # q at each rank, from the row in registers: gathered through the scratch's a slot
    ws_ps = ws_ptr
    ws_cp = ws_ptr + BLOCK_V
    ws_cq = ws_ptr + 2 * BLOCK_V + 1
    ws_a = ws_ptr + 3 * BLOCK_V + 2
    tl.store(ws_a + offs, q, mask=mask)
    tl.debug_barrier()
    qs = tl.load(ws_a + token, mask=real, other=0.0)
    tl.store(ws_ps + rank, ps, mask=real)
    tl.store(ws_cp + 1 + rank, tl.cumsum(ps.to(tl.float64), 0).to(tl.float32), mask=real)
    tl.store(ws_cq + 1 + rank, tl.cumsum(qs.to(tl.float64), 0).to(tl.float32), mask=real)
    tl.store(ws_cp, 0.0)
    tl.store(ws_cq, 0.0)
    tl.debug_barrier()
    lo_p = _count(ws_ps, ps + group_delta, V, False, STEPS)
    hi_p = _count(ws_ps, ps - group_delta, V, True, STEPS) - 1
    low = tl.minimum(tl.maximum(tl.maximum(rank - group_rank, lo_p), 0), V - 1)
    high = tl.minimum(tl.maximum(tl.minimum(rank + group_rank, hi_p), 0), V - 1)
    high = tl.maximum(high, rank)
    low = tl.minimum(low, rank)
    sum_p = tl.load(ws_cp + high + 1, mask=real, other=0.0) - tl.load(ws_cp + low, mask=real, other=0.0)
    sum_q = tl.load(ws_cq + high + 1, mask=real, other=0.0) - tl.load(ws_cq + low, mask=real, other=0.0)
    sum_p = tl.maximum(sum_p, 0.0)
    sum_q = tl.maximum(sum_q, 0.0)
    ratio = tl.minimum(tl.where(sum_q > 0, sum_p / tl.where(sum_q > 0, sum_q, 1.0), 0.0), 1.0)
    tl.debug_barrier()  # every lane has read q from the a slot
    tl.store(ws_a + token, ratio, mask=real)
    tl.debug_barrier()
    return tl.load(ws_a + offs, mask=mask, other=0.0)
