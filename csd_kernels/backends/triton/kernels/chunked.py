"""Chunked path: one program per (row, window position) streaming the row in chunks, for V above the register path.

Three sweeps (the first reads HBM, sweeps 2 and 3 re-read the row from L2 while it is resident):
(1) non-finite check, online max / Z (or first argmax for T = 0), gumbel argmax;
(2) p, H, TVD, p(x), q(x), the draft-probs check, and the running CDF totals of the residual and of p;
(3) closed-form distortion and the two inverse-CDF searches (running prefix sums seeded by the chunk carries).
With top_k, 32 counting sweeps find the k-th largest logit first; with top_p, a max sweep and 33 mass sweeps (the
total, then a bisection on the order keys); with min_p, a max sweep and one sweep for the smallest kept z. The three
restrictions become one order-key threshold. With PROBS the row holds target probabilities w: p = w / Σw, z = ln w.
The CDF carries of sweep 2 and the prefix sums of
sweep 3 come from the same code on the same data, so the target u·total and the searched CDF are consistent.
"""

import triton
import triton.language as tl

from . import rules
from .common import (
    GUMBEL,
    INDEPENDENT,
    PROB_SUM_TOLERANCE,
    chunk_cdf,
    chunk_lanes,
    gumbel_uniforms,
    load_mix,
    load_mix_flagged,
    load_prob,
    load_probs,
    log_or_minus_inf,
    order_key,
    position_rng,
    store_position,
    window_draft,
)

_NO_HIT: tl.constexpr = tl.constexpr(2147483647)


@triton.jit
def restrict(z, mask, thr, TOP_K: tl.constexpr):
    """−inf outside the vocabulary and, with a restriction (TOP_K: top-k, top-p or min-p), below the threshold key."""
    z = tl.where(mask, z, float("-inf"))
    if TOP_K:
        z = tl.where(order_key(z) >= thr.to(tl.int32), z, float("-inf"))
    return z


@triton.jit
def load_z(c_row, u_row, offs, mask, cfg_scale, inv_t, HAS_UNCOND: tl.constexpr, GREEDY: tl.constexpr,
           PROBS: tl.constexpr):
    """z of one chunk: the masked CFG mix, or ln w for target probabilities."""
    if PROBS:
        return log_or_minus_inf(load_prob(c_row, offs, mask))
    return load_mix(c_row, u_row, offs, mask, cfg_scale, inv_t, HAS_UNCOND, GREEDY)


@triton.jit
def chunk_p(c_row, u_row, offs, mask, thr, m, z_sum, amax, cfg_scale, inv_t, HAS_UNCOND: tl.constexpr,
            GREEDY: tl.constexpr, TOP_K: tl.constexpr, PROBS: tl.constexpr):
    """(p, support) on one chunk."""
    if PROBS:
        w, _bad = load_probs(c_row, offs, mask)
        return w / z_sum, w > 0
    if GREEDY:
        return tl.where(offs == amax, 1.0, 0.0), mask
    z = restrict(load_mix(c_row, u_row, offs, mask, cfg_scale, inv_t, HAS_UNCOND, GREEDY), mask, thr, TOP_K)
    return tl.exp(z - m) / z_sum, z > float("-inf")


@triton.jit
def _chunk_q(q_row, s_qv, offs, mask, x, HAS_Q: tl.constexpr):
    """(q on one chunk, 0 outside the vocabulary; 1 if an entry is negative or non-finite): one-hot(x) without q.
    (The row sum is checked by the caller.)"""
    if HAS_Q:
        q = tl.load(q_row + offs * s_qv, mask=mask, other=0.0).to(tl.float32)
        bad = tl.max((mask & ~((q >= 0.0) & (q < float("inf")))).to(tl.int32), 0)
        return tl.where(mask, q, 0.0), bad
    return tl.where(offs == x, 1.0, 0.0), tl.zeros((), tl.int32)


@triton.jit
def _top_k_threshold(c_row, u_row, V, top_k, cfg_scale, inv_t, HAS_UNCOND: tl.constexpr, BLOCK_V: tl.constexpr):
    """The k-th largest z's order key: 32 bisection steps, each a counting sweep over the row."""
    lane = tl.arange(0, BLOCK_V)
    thr = tl.full((), -2147483648, tl.int64)
    hi = tl.full((), 2147483647, tl.int64)
    for _ in range(32):
        mid = (thr + hi + 1) >> 1
        count = tl.zeros((), tl.int32)
        for v0 in range(0, V, BLOCK_V):
            offs, mask = chunk_lanes(v0, lane, V)
            z = load_mix(c_row, u_row, offs, mask, cfg_scale, inv_t, HAS_UNCOND, False)
            count += tl.sum((mask & (order_key(z) >= mid.to(tl.int32))).to(tl.int32), 0)
        ok = count >= top_k
        thr = tl.where(ok, mid, thr)
        hi = tl.where(ok, hi, mid - 1)
    return thr


@triton.jit
def _max_sweep(c_row, u_row, V, cfg_scale, inv_t, HAS_UNCOND: tl.constexpr, BLOCK_V: tl.constexpr):
    """max z over the row (top-k keeps it, so it is the max of the restricted row too)."""
    lane = tl.arange(0, BLOCK_V)
    m = tl.full((), float("-inf"), tl.float32)
    for v0 in range(0, V, BLOCK_V):
        offs, mask = chunk_lanes(v0, lane, V)
        z = tl.where(mask, load_mix(c_row, u_row, offs, mask, cfg_scale, inv_t, HAS_UNCOND, False), float("-inf"))
        m = tl.maximum(m, tl.max(z, 0))
    return m


@triton.jit
def _mass_sweep(c_row, u_row, V, key_lo, m, cfg_scale, inv_t, HAS_UNCOND: tl.constexpr, BLOCK_V: tl.constexpr):
    """Σ exp(z − m) over the lanes whose order key is >= key_lo (chunk sums added in order)."""
    lane = tl.arange(0, BLOCK_V)
    mass = tl.zeros((), tl.float32)
    for v0 in range(0, V, BLOCK_V):
        offs, mask = chunk_lanes(v0, lane, V)
        z = tl.where(mask, load_mix(c_row, u_row, offs, mask, cfg_scale, inv_t, HAS_UNCOND, False), float("-inf"))
        mass += tl.sum(tl.where(mask & (order_key(z) >= key_lo.to(tl.int32)), tl.exp(z - m), 0.0), 0)
    return mass


@triton.jit
def _top_p_threshold(c_row, u_row, V, thr, m, top_p, cfg_scale, inv_t, HAS_UNCOND: tl.constexpr,
                     BLOCK_V: tl.constexpr):
    """The largest order key t >= thr with mass(t) >= top_p · mass(thr) (reference.restrict_top_p)."""
    limit = top_p * _mass_sweep(c_row, u_row, V, thr, m, cfg_scale, inv_t, HAS_UNCOND, BLOCK_V)
    lo = thr
    hi = tl.full((), 2147483647, tl.int64)
    for _ in range(32):
        mid = (lo + hi + 1) >> 1
        ok = _mass_sweep(c_row, u_row, V, mid, m, cfg_scale, inv_t, HAS_UNCOND, BLOCK_V) >= limit
        lo = tl.where(ok, mid, lo)
        hi = tl.where(ok, hi, mid - 1)
    return lo


@triton.jit
def _min_p_threshold(c_row, u_row, V, m, log_min_p, cfg_scale, inv_t, HAS_UNCOND: tl.constexpr,
                     BLOCK_V: tl.constexpr):
    """The order key of the smallest z with z − m >= ln(min_p) (reference.restrict_min_p)."""
    lane = tl.arange(0, BLOCK_V)
    lowest = tl.full((), 2147483647, tl.int32)
    for v0 in range(0, V, BLOCK_V):
        offs, mask = chunk_lanes(v0, lane, V)
        z = load_mix(c_row, u_row, offs, mask, cfg_scale, inv_t, HAS_UNCOND, False)
        lowest = tl.minimum(lowest, tl.min(tl.where(mask & (z - m >= log_min_p), order_key(z), 2147483647), 0))
    return lowest.to(tl.int64)


@triton.jit
def restriction_threshold(c_row, u_row, V, top_k, top_p, log_min_p, cfg_scale, inv_t, HAS_UNCOND: tl.constexpr,
                          TOP_K: tl.constexpr, TOP_P: tl.constexpr, MIN_P: tl.constexpr, BLOCK_V: tl.constexpr):
    """The order-key threshold of top-k, top-p (on what top-k kept) and min-p together (the lowest key without any).
    Callers set the flags only with T > 0 and logits."""
    thr = tl.full((), -2147483648, tl.int64)
    if TOP_K:
        thr = _top_k_threshold(c_row, u_row, V, top_k, cfg_scale, inv_t, HAS_UNCOND, BLOCK_V)
    if TOP_P or MIN_P:
        m0 = _max_sweep(c_row, u_row, V, cfg_scale, inv_t, HAS_UNCOND, BLOCK_V)
        if TOP_P:
            thr = _top_p_threshold(c_row, u_row, V, thr, m0, top_p, cfg_scale, inv_t, HAS_UNCOND, BLOCK_V)
        if MIN_P:
            thr = tl.maximum(thr, _min_p_threshold(c_row, u_row, V, m0, log_min_p, cfg_scale, inv_t, HAS_UNCOND,
                                                   BLOCK_V))
    return thr


@triton.jit
def softmax_sweep(c_row, u_row, V, thr, cfg_scale, inv_t, pos, row_id, k0, k1, HAS_UNCOND: tl.constexpr,
                  GREEDY: tl.constexpr, TOP_K: tl.constexpr, WITH_GUMBEL: tl.constexpr, PROBS: tl.constexpr,
                  BLOCK_V: tl.constexpr):
    """Sweep 1: (bad, online max m, Z = Σ e^(z−m) (Σ w for PROBS), first argmax (T = 0), gumbel argmax)."""
    lane = tl.arange(0, BLOCK_V)
    bad = tl.zeros((), tl.int32)
    m = tl.full((), float("-inf"), tl.float32)
    z_sum = tl.zeros((), tl.float32)
    amax = tl.zeros((), tl.int32)
    g_best = tl.full((), float("-inf"), tl.float32)
    g_index = tl.zeros((), tl.int32)
    for v0 in range(0, V, BLOCK_V):
        offs, mask = chunk_lanes(v0, lane, V)
        if PROBS:
            w, bad_c = load_probs(c_row, offs, mask)
            z = log_or_minus_inf(w)
        else:
            z, bad_c = load_mix_flagged(c_row, u_row, offs, mask, cfg_scale, inv_t, HAS_UNCOND, GREEDY)
        bad = tl.maximum(bad, bad_c)
        z = restrict(z, mask, thr, TOP_K)
        m_c = tl.max(z, 0)
        if PROBS:
            z_sum += tl.sum(w, 0)
            m = tl.maximum(m, m_c)
        elif GREEDY:
            amax = tl.where(m_c > m, (tl.argmax(z, 0, tie_break_left=True) + v0).to(tl.int32), amax)
            m = tl.maximum(m, m_c)
        else:
            m_new = tl.maximum(m, m_c)
            m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
            z_sum = z_sum * tl.exp(m - m_ref) + tl.sum(tl.exp(z - m_ref), 0)
            m = m_new
        if WITH_GUMBEL and (PROBS or not GREEDY):  # the Gumbel-max draw of this block, in both sampled branches
            score = z - tl.log(-tl.log(gumbel_uniforms(v0, pos, row_id, k0, k1, BLOCK_V)))
            s_c = tl.max(score, 0)
            g_index = tl.where(s_c > g_best, (tl.argmax(score, 0, tie_break_left=True) + v0).to(tl.int32), g_index)
            g_best = tl.maximum(g_best, s_c)
    if PROBS:
        bad = tl.maximum(bad, (~(tl.abs(z_sum - 1.0) <= PROB_SUM_TOLERANCE)).to(tl.int32))
    return (bad > 0) | (m == float("-inf")), m, z_sum, amax, g_index


@triton.jit
def _stats_sweep(c_row, u_row, q_row, s_qv, probs_row, x, bad, V, thr, m, z_sum, amax, cfg_scale, inv_t,
                 HAS_UNCOND: tl.constexpr, HAS_Q: tl.constexpr, GREEDY: tl.constexpr, TOP_K: tl.constexpr,
                 RETURN_PROBS: tl.constexpr, PROBS: tl.constexpr, BLOCK_V: tl.constexpr):
    """Sweep 2: (H, Σ|p − q|, Σp, p(x), q(x), bad q, residual CDF total, p CDF total); writes probs."""
    lane = tl.arange(0, BLOCK_V)
    h_acc = tl.zeros((), tl.float32)
    abs_diff = tl.zeros((), tl.float32)
    p_sum = tl.zeros((), tl.float32)
    p_x = tl.zeros((), tl.float32)
    q_x = tl.zeros((), tl.float32)
    bad_q = tl.zeros((), tl.int32)
    carry_r = tl.zeros((), tl.float32)
    carry_p = tl.zeros((), tl.float32)
    q_sum = tl.zeros((), tl.float32)
    for v0 in range(0, V, BLOCK_V):
        offs, mask = chunk_lanes(v0, lane, V)
        p, _support = chunk_p(c_row, u_row, offs, mask, thr, m, z_sum, amax, cfg_scale, inv_t, HAS_UNCOND, GREEDY,
                              TOP_K, PROBS)
        q, bad_c = _chunk_q(q_row, s_qv, offs, mask, x, HAS_Q)
        bad_q = tl.maximum(bad_q, bad_c)
        q_sum += tl.sum(q, 0)
        h_acc += tl.sum(p * tl.log(tl.where(p > 0, p, 1.0)), 0)
        abs_diff += tl.sum(tl.abs(p - q), 0)
        p_sum += tl.sum(p, 0)
        p_x += tl.sum(tl.where(offs == x, p, 0.0), 0)
        q_x += tl.sum(tl.where(offs == x, q, 0.0), 0)
        _cdf_r, carry_r = chunk_cdf(rules.residual(p, q, q, rules.STRICT), carry_r, lane, BLOCK_V)
        _cdf_p, carry_p = chunk_cdf(p, carry_p, lane, BLOCK_V)
        if RETURN_PROBS:
            tl.store(probs_row + offs, tl.where(bad, float("nan"), p), mask=mask)
    if HAS_Q:
        bad_q = tl.maximum(bad_q, (~(tl.abs(q_sum - 1.0) <= PROB_SUM_TOLERANCE)).to(tl.int32))
    return -h_acc, abs_diff, p_sum, p_x, q_x, bad_q > 0, carry_r, carry_p


@triton.jit
def _draw_sweep(c_row, u_row, q_row, s_qv, x, bad_q, use_r, target_w, target_p, h, params, nb_ptr, s_nb,
                nb_k, V, thr, m, z_sum, amax, cfg_scale, inv_t, HAS_UNCOND: tl.constexpr, HAS_Q: tl.constexpr,
                GREEDY: tl.constexpr, TOP_K: tl.constexpr, DRAW_FROM_P: tl.constexpr, PROBS: tl.constexpr,
                RULE: tl.constexpr, GATHER_DIST: tl.constexpr, BLOCK_V: tl.constexpr):
    """Sweep 3: (the rule's distortion sum, resampled token, draw from p). The running sums are those of sweep 2,
    recomputed by the same code on the same data, so the targets u·total and the searched CDFs agree."""
    lane = tl.arange(0, BLOCK_V)
    dist = tl.zeros((), tl.float32)
    carry_w = tl.zeros((), tl.float32)
    carry_p = tl.zeros((), tl.float32)
    first_w = tl.full((), _NO_HIT, tl.int32)
    last_w = tl.full((), -1, tl.int32)
    first_p = tl.full((), _NO_HIT, tl.int32)
    last_p = tl.full((), -1, tl.int32)
    for v0 in range(0, V, BLOCK_V):
        offs, mask = chunk_lanes(v0, lane, V)
        p, support = chunk_p(c_row, u_row, offs, mask, thr, m, z_sum, amax, cfg_scale, inv_t, HAS_UNCOND, GREEDY,
                             TOP_K, PROBS)
        q, _bad_c = _chunk_q(q_row, s_qv, offs, mask, x, HAS_Q)
        q_ok = tl.where(bad_q, 0.0, q)
        if rules.has_token_terms(RULE):
            dist += tl.sum(rules.distortion_terms(p, q_ok, support, h, params, RULE), 0)
        if rules.is_lantern(RULE) and GATHER_DIST:
            dist += tl.sum(rules.lantern_terms(nb_ptr, s_nb, nb_k, offs, p, q_ok, support, params[0], c_row, u_row, m,
                                               1.0 / z_sum, thr, 0.0, amax, V, cfg_scale, inv_t, RULE, HAS_UNCOND,
                                               GREEDY, PROBS, TOP_K, False), 0)
        w = tl.where(use_r, rules.residual(p, q, q, rules.STRICT), p)
        cdf_w, carry_w = chunk_cdf(w, carry_w, lane, BLOCK_V)
        first_w = tl.minimum(first_w, tl.min(tl.where(mask & (cdf_w > target_w), offs, _NO_HIT), 0).to(tl.int32))
        last_w = tl.maximum(last_w, tl.max(tl.where(w > 0, offs, -1), 0).to(tl.int32))
        if DRAW_FROM_P:
            cdf_p, carry_p = chunk_cdf(p, carry_p, lane, BLOCK_V)
            first_p = tl.minimum(first_p, tl.min(tl.where(mask & (cdf_p > target_p), offs, _NO_HIT), 0).to(tl.int32))
            last_p = tl.maximum(last_p, tl.max(tl.where(p > 0, offs, -1), 0).to(tl.int32))
    return dist, tl.where(first_w < V, first_w, last_w), tl.where(first_p < V, first_p, last_p)


@triton.jit(do_not_specialize=["seed_ptr", "offset_ptr"])  # int seeds: one kernel for all
def position_chunked_kernel(
    logits_ptr, s_cb, s_cl,
    uncond_ptr, s_ub, s_ul,
    q_ptr, s_qb, s_ql, s_qv,
    draft_ptr, s_db, s_dl,
    start_ptr, s_start, positions_ptr, s_pos,
    seed_ptr, seed_stride, offset_ptr, offset_stride, inf_ptr, s_ib, s_il,
    probs_ptr, ent_ptr, tvd_ptr, acc_ptr, dist_ptr,
    res_ptr, later_ptr, flags_ptr,
    L, V, st,
    nb_ptr, s_nb, nb_k, gsd_ptr,
    HAS_UNCOND: tl.constexpr, HAS_Q: tl.constexpr, GREEDY: tl.constexpr, TOP_K: tl.constexpr,
    RULE: tl.constexpr, COUPLING: tl.constexpr, RETURN_PROBS: tl.constexpr,
    PER_ROW_SEED: tl.constexpr, BLOCK_V: tl.constexpr,
    TOP_P: tl.constexpr = False, MIN_P: tl.constexpr = False, PROBS: tl.constexpr = False,
    SEED_VALUE: tl.constexpr = False, OFFSET_VALUE: tl.constexpr = False, GATHER_DIST: tl.constexpr = False,
    HAS_INFORMED: tl.constexpr = False,
):
    """Grid (B·L,): one program per (row, window position), the row in BLOCK_V chunks. Parameters: common.py."""
    cfg_scale, inv_t, top_k = st.cfg_scale, st.inv_t, st.top_k  # the call's settings (verify.KernelSettings)
    top_p, log_min_p, params = st.top_p, st.log_min_p, st.params
    pid = tl.program_id(0).to(tl.int64)
    b = pid // L
    i = pid % L
    c_row = logits_ptr + b * s_cb + i * s_cl
    u_row = uncond_ptr + b * s_ub + i * s_ul
    q_row = q_ptr + b * s_qb + i * s_ql
    x, bad_tok, has_draft, committed = window_draft(draft_ptr, s_db, s_dl, start_ptr, s_start, b, i, V)
    pos, row_id, k0, k1, u_acc, u_smp = position_rng(seed_ptr, seed_stride, positions_ptr, s_pos,
                                                     offset_ptr + b * offset_stride, b, i, PER_ROW_SEED,
                                                     SEED_VALUE, OFFSET_VALUE)

    thr = restriction_threshold(c_row, u_row, V, top_k, top_p, log_min_p, cfg_scale, inv_t, HAS_UNCOND, TOP_K, TOP_P,
                                MIN_P, BLOCK_V)
    RESTRICT: tl.constexpr = TOP_K or TOP_P or MIN_P
    bad, m, z_sum, amax, g_index = softmax_sweep(c_row, u_row, V, thr, cfg_scale, inv_t, pos, row_id, k0, k1,
                                                 HAS_UNCOND, GREEDY, RESTRICT, COUPLING == GUMBEL, PROBS, BLOCK_V)
    h, abs_diff, p_sum, p_x, q_x, bad_q, residual, p_total = _stats_sweep(
        c_row, u_row, q_row, s_qv, probs_ptr + pid * V, x, bad, V, thr, m, z_sum, amax, cfg_scale, inv_t,
        HAS_UNCOND, HAS_Q, GREEDY, RESTRICT, RETURN_PROBS, PROBS, BLOCK_V)
    tvd = tl.where(bad_q, 0.5 * p_sum, 0.5 * abs_diff)  # a flagged q counts as the zero vector
    # a draft outside the support of p (masked, or cut by a restriction) is rejected: q(x) counts as 0
    x_safe = tl.maximum(x, 0)
    z_x = restrict(load_z(c_row, u_row, x_safe, has_draft, cfg_scale, inv_t, HAS_UNCOND, GREEDY, PROBS), has_draft,
                   thr, RESTRICT)
    if GREEDY and not PROBS:
        x_in_support = x_safe == amax
    else:
        x_in_support = z_x > float("-inf")
    q_x = tl.where(bad_q | ~x_in_support, 0.0, q_x)
    extra_x = tl.zeros_like(h)
    if rules.is_lantern(RULE):  # the draft's neighbours' mass: k gathers (the restrictions are one order-key threshold)
        limit = rules.lantern_limit(p_x, params[0], RULE)
        extra_x = rules.lantern_bonus(nb_ptr, s_nb, nb_k, tl.where(q_x > 0, x, -1), limit, c_row, u_row, m,
                                      1.0 / z_sum, thr, 0.0, amax, V, cfg_scale, inv_t, HAS_UNCOND, GREEDY, PROBS,
                                      RESTRICT, False)
    a, strict_a = rules.acceptance(p_x, q_x, h, tvd, params, extra_x, RULE)

    # draws from the strict residual (the rule's own for every rule but gsd, which this path never runs) unless it
    # sums to 0, there is no draft, or q was flagged (then from p)
    use_r = has_draft & ~bad_q & (residual > 0)
    terms, resampled, from_p = _draw_sweep(
        c_row, u_row, q_row, s_qv, x, bad_q, use_r, u_smp * tl.where(use_r, residual, p_total), u_smp * p_total,
        h, params, nb_ptr, s_nb, nb_k, V, thr, m, z_sum, amax, cfg_scale, inv_t, HAS_UNCOND, HAS_Q, GREEDY,
        RESTRICT, COUPLING == INDEPENDENT, PROBS, RULE, GATHER_DIST, BLOCK_V)
    a, accepted, dist, _relaxed = rules.decide(
        a, strict_a, rules.slot_informed(inf_ptr, s_ib, s_il, b, i, HAS_INFORMED),
        rules.position_distortion(terms, tvd, params, RULE, GATHER_DIST), st.max_distortion, has_draft, u_acc)
    later = rules.next_draft(from_p, x, has_draft, u_acc, strict_a, resampled, g_index, amax, COUPLING,
                             GREEDY and not PROBS)
    store_position(pid, bad, bad_tok, bad_q, committed, has_draft, accepted, h, tvd, a, dist, resampled, later,
                   ent_ptr, tvd_ptr, acc_ptr, dist_ptr, res_ptr, later_ptr, flags_ptr)
