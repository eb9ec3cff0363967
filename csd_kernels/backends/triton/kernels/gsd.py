"""gsd's groups in Triton (reference.rules.group_acceptance), for the register path (the row in one program,
V <= 16384), from the row's p and q in registers: a(x) of the draft alone (:func:`gsd_draft_acceptance`, no sort) or
a(y) of every token (:func:`gsd_groups`, the row sorted: the distortion, and the residual at a row's first stop).

Ranks are the order of int64 keys (2^31 − 1 − order key of p) << 32 | token: p descending, ties by token id (the key
gives p back exactly). gsd_groups sorts them (tl.sort); the sorted p and the prefix sums of p and q (fp64, rounded
to fp32) go to this position's scratch ``ws_ptr`` [4·BLOCK_V + 2] floats, where a binary search per rank finds the
δ-window's ends and the group sums are read; a(y) is scattered back by token through the scratch. Two barriers order
the scratch's writes and reads within the program.
"""

import triton
import triton.language as tl

from .common import order_key

_LOW32 = tl.constexpr(0xFFFFFFFF)
_KEY_MAX = tl.constexpr(9223372036854775807)  # above every key: the lanes outside the vocabulary


@triton.jit
def gsd_keys(p, offs, mask):
    """The rank-order keys of the row (ascending = p descending, ties by token); int64 max outside ``mask``."""
    high_word = (2147483647 - order_key(p)).to(tl.int64)  # p >= 0: key >= 0, descending p ascending here
    return tl.where(mask, (high_word << 32) | offs.to(tl.int64), _KEY_MAX)


@triton.jit
def gsd_group(rank, lo_p, hi_p, V, group_rank):
    """(low, high): the ranks within group_rank of ``rank`` and inside its δ-window [lo_p, hi_p], clamped to the row
    and always holding ``rank``."""
    low = tl.minimum(tl.maximum(tl.maximum(rank - group_rank, lo_p), 0), V - 1)
    high = tl.minimum(tl.maximum(tl.minimum(rank + group_rank, hi_p), 0), V - 1)
    return tl.minimum(low, rank), tl.maximum(high, rank)


@triton.jit
def gsd_ratio(cp_low, cp_high, cq_low, cq_high):
    """min(1, Σp / Σq) of a group from the fp32 prefix sums at its ends (0 when the group has no q mass)."""
    sum_p = tl.maximum(cp_high - cp_low, 0.0)
    sum_q = tl.maximum(cq_high - cq_low, 0.0)
    return tl.minimum(tl.where(sum_q > 0, sum_p / tl.where(sum_q > 0, sum_q, 1.0), 0.0), 1.0)


@triton.jit
def _rank_key(keys, rank):
    """The smallest t with #(keys < t) >= rank, by bisection over the int64 key space (the count is monotone in t):
    the keys below it are exactly the ranks < rank (keys distinct and >= 0, rank <= the keys in the vocabulary)."""
    lo = tl.zeros((), tl.int64)
    hi = tl.full((), _KEY_MAX, tl.int64)
    for _ in range(63):
        mid = lo + ((hi - lo) >> 1)
        enough = tl.sum((keys < mid).to(tl.int32), 0) >= rank
        hi = tl.where(enough, mid, hi)
        lo = tl.where(enough, lo, mid + 1)
    return lo


@triton.jit
def _prefix_sum(w, keys, t):
    """Σ w over the keys below t, in fp64, rounded to fp32: the sorted row's prefix sum up to fp64 rounding."""
    return tl.sum(tl.where(keys < t, w.to(tl.float64), 0.0), 0).to(tl.float32)


@triton.jit
def gsd_draft_acceptance(p, q, offs, mask, x, V, group_rank, group_delta):
    """gsd_groups' a(x) for the one token x, without sorting: x's rank and δ-window are counts over the row, the
    group's prefix sums are sums over the keys below its ends' keys (found by bisection). Equals the sorted row's
    value up to the fp64 rounding of the sums (summed in another order)."""
    keys = gsd_keys(p, offs, mask)
    at_x = offs == x
    kx = tl.sum(tl.where(at_x, keys, 0), 0)
    p_x = tl.sum(tl.where(at_x, p, 0.0), 0)
    rank = tl.sum((keys < kx).to(tl.int32), 0)
    lo_p = tl.sum((mask & (p > p_x + group_delta)).to(tl.int32), 0)
    hi_p = tl.sum((mask & (p >= p_x - group_delta)).to(tl.int32), 0) - 1
    low, high = gsd_group(rank, lo_p, hi_p, V, group_rank)
    t_low = _rank_key(keys, low)
    t_high = _rank_key(keys, high + 1)
    return gsd_ratio(_prefix_sum(p, keys, t_low), _prefix_sum(p, keys, t_high), _prefix_sum(q, keys, t_low),
                     _prefix_sum(q, keys, t_high))


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
    keys = tl.sort(gsd_keys(p, offs, mask), 0)
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
    low, high = gsd_group(rank, lo_p, hi_p, V, group_rank)
    ratio = gsd_ratio(tl.load(ws_cp + low, mask=real, other=0.0), tl.load(ws_cp + high + 1, mask=real, other=0.0),
                      tl.load(ws_cq + low, mask=real, other=0.0), tl.load(ws_cq + high + 1, mask=real, other=0.0))
    tl.debug_barrier()  # every lane has read q from the a slot
    tl.store(ws_a + token, ratio, mask=real)
    tl.debug_barrier()
    return tl.load(ws_a + offs, mask=mask, other=0.0)


@triton.jit
def gsd_term(p, q, offs, mask, support, x, V, params, ws_ptr, SORTED: tl.constexpr, BLOCK_V: tl.constexpr):
    """(the draft's group ratio, q·a by token) of the position: with SORTED from the sorted row (q·a is read: the
    distortion, the residual), else from the draft's own group (q·a is then not read: q stands for it)."""
    group_rank = (params[0] + tl.zeros((), tl.float32)).to(tl.int32)  # a float argument (an int in the table)
    if SORTED:
        a_tok = gsd_groups(p, q, offs, mask, V, group_rank, params[1], ws_ptr, BLOCK_V, BLOCK_V.bit_length())
        ratio_x = tl.sum(tl.where(offs == x, a_tok, 0.0), 0)
        qa = tl.where(support, q * a_tok, 0.0)
    else:
        ratio_x = gsd_draft_acceptance(p, q, offs, mask, x, V, group_rank, params[1])
        qa = q
    return ratio_x, qa
