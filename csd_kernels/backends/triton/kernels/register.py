"""Register path: one program per (row, window position) holding the whole row in registers (V <= 16384).

The logits (both CFG halves, converted to fp32 right after the load) and the draft row q are read from HBM once;
mix, 1/T, top-k select, max, Z, p, H, TVD, a(x), the decision, the closed-form distortion, the resample / later draws
and the status bits are computed from registers. Top-k: the k-th largest z is found exactly by a 32-step bisection
over the order-preserving int32 image of the fp32 bits (count(z >= t) >= k); z >= threshold is kept (ties kept).
Top-p bisects the same keys on the softmax mass instead of the count; min-p keeps z − max z >= ln(min_p).
With PROBS the row holds target probabilities w: p = w / Σw, z = ln w.
"""

import triton
import triton.language as tl

from .common import (
    GUMBEL,
    INDEPENDENT,
    MAXIMAL,
    PROB_SUM_TOLERANCE,
    acceptance,
    gated_distortion,
    gumbel_uniforms,
    inverse_cdf,
    load_mix_flagged,
    load_probs,
    log_or_minus_inf,
    order_key,
    position_rng,
    store_position,
    top_p_keep,
    window_draft,
)


@triton.jit
def _top_k_threshold(z, mask, top_k):
    """The k-th largest z, exactly: 32-step bisection over the order-preserving int32 image of the fp32 bits."""
    key = order_key(z)
    lo = tl.full((), -2147483648, tl.int64)
    hi = tl.full((), 2147483647, tl.int64)
    for _ in range(32):
        mid = (lo + hi + 1) >> 1
        ok = tl.sum((mask & (key >= mid.to(tl.int32))).to(tl.int32), 0) >= top_k
        lo = tl.where(ok, mid, lo)
        hi = tl.where(ok, hi, mid - 1)
    return key >= lo.to(tl.int32)


@triton.jit(do_not_specialize=["seed_ptr", "offset_ptr"])  # int seeds: one kernel for all
def position_kernel(
    logits_ptr, s_cb, s_cl,
    uncond_ptr, s_ub, s_ul,
    q_ptr, s_qb, s_ql, s_qv,
    draft_ptr, s_db, s_dl,
    start_ptr, s_start, positions_ptr, s_pos,
    seed_ptr, seed_stride, offset_ptr, offset_stride,
    probs_ptr, ent_ptr, tvd_ptr, acc_ptr, dist_ptr,
    res_ptr, later_ptr, flags_ptr,
    L, V, cfg_scale, inv_t, top_k, entropy_coef, tvd_threshold, top_p, log_min_p,
    HAS_UNCOND: tl.constexpr, HAS_Q: tl.constexpr, GREEDY: tl.constexpr, TOP_K: tl.constexpr,
    CSD_RULE: tl.constexpr, COUPLING: tl.constexpr, RETURN_PROBS: tl.constexpr,
    PER_ROW_SEED: tl.constexpr, BLOCK_V: tl.constexpr,
    TOP_P: tl.constexpr = False, MIN_P: tl.constexpr = False, PROBS: tl.constexpr = False,
    SEED_VALUE: tl.constexpr = False, OFFSET_VALUE: tl.constexpr = False,
):
    """Grid (B·L,): one program per (row, window position), BLOCK_V >= V. Parameters: see common.py."""
    pid = tl.program_id(0).to(tl.int64)
    b = pid // L
    i = pid % L
    offs = tl.arange(0, BLOCK_V)
    mask = offs < V
    x, bad_tok, has_draft, committed = window_draft(draft_ptr, s_db, s_dl, start_ptr, s_start, b, i, V)

    # ---- target distribution (the only read of the logits); z = −inf outside the support of p
    if PROBS:
        w, bad_w = load_probs(logits_ptr + b * s_cb + i * s_cl, offs, mask)
        bad = (bad_w > 0) | ~(tl.abs(tl.sum(w, 0) - 1.0) <= PROB_SUM_TOLERANCE)
        w = tl.where(bad, tl.where(mask, 1.0, 0.0), w)  # a bad row continues as uniform
        z = log_or_minus_inf(w)
        p = w / tl.sum(w, 0)
    else:
        z, bad_z = load_mix_flagged(logits_ptr + b * s_cb + i * s_cl, uncond_ptr + b * s_ub + i * s_ul, offs, mask,
                                    cfg_scale, inv_t, HAS_UNCOND, GREEDY)
        z = tl.where(mask, z, float("-inf"))
        bad = (bad_z > 0) | (tl.max(z, 0) == float("-inf"))  # bad input, or no finite logit
        z = tl.where(mask & bad, 0.0, z)  # a bad row continues as z = 0
    if PROBS:
        amax = tl.argmax(z, 0, tie_break_left=True)
    elif GREEDY:
        amax = tl.argmax(z, 0, tie_break_left=True)
        p = tl.where(offs == amax, 1.0, 0.0)
    else:
        if TOP_K:
            z = tl.where(_top_k_threshold(z, mask, top_k), z, float("-inf"))
        m = tl.max(z, 0)
        if TOP_P:
            z = tl.where(top_p_keep(z, tl.exp(z - m), mask, top_p), z, float("-inf"))
        if MIN_P:
            z = tl.where(z - m >= log_min_p, z, float("-inf"))
        e = tl.exp(z - m)
        p = e / tl.sum(e, 0)
    h = -tl.sum(p * tl.log(tl.where(p > 0, p, 1.0)), 0)
    support = z > float("-inf")

    # ---- draft distribution q (one-hot in registers when there is no draft_probs)
    if HAS_Q:
        q = tl.load(q_ptr + b * s_qb + i * s_ql + offs * s_qv, mask=mask, other=0.0).to(tl.float32)
        bad_q = tl.max((mask & ~((q >= 0.0) & (q < float("inf")))).to(tl.int32), 0) > 0
        bad_q = bad_q | ~(tl.abs(tl.sum(tl.where(mask, q, 0.0), 0) - 1.0) <= PROB_SUM_TOLERANCE)
        q = tl.where(bad_q | ~mask, 0.0, q)
    else:
        bad_q = tl.full((), 0, tl.int1)
        q = tl.where(offs == x, 1.0, 0.0)
    tvd = 0.5 * tl.sum(tl.abs(p - q), 0)
    p_x = tl.sum(tl.where(offs == x, p, 0.0), 0)
    q_x = tl.sum(tl.where((offs == x) & support, q, 0.0), 0)  # a draft outside the support is rejected

    # ---- decision and closed-form distortion
    a, strict_a = acceptance(p_x, q_x, h, tvd, entropy_coef, tvd_threshold, CSD_RULE)
    dist = tl.zeros_like(h)
    if CSD_RULE:
        dist = tl.sum(gated_distortion(p, q, entropy_coef * h, support), 0)
        dist = tl.where(has_draft & (tvd < tvd_threshold), dist, 0.0)
    pos, row_id, k0, k1, u_acc, u_smp = position_rng(seed_ptr, seed_stride, positions_ptr, s_pos,
                                                     offset_ptr + b * offset_stride, b, i, PER_ROW_SEED,
                                                     SEED_VALUE, OFFSET_VALUE)
    accepted = has_draft & (u_acc < a)

    # ---- resample from the residual max(p − q, 0) (p when it sums to 0 or there is no draft)
    r = tl.maximum(p - q, 0.0)
    resampled = inverse_cdf(tl.where(has_draft & (tl.sum(r, 0) > 0), r, p), offs, mask, u_smp, V, BLOCK_V)

    # ---- the draw for positions after accept_len
    if COUPLING == INDEPENDENT:
        later = inverse_cdf(p, offs, mask, u_smp, V, BLOCK_V)
    elif COUPLING == MAXIMAL:
        later = tl.where(has_draft & (u_acc < strict_a), x.to(tl.int32), resampled)
    else:
        tl.static_assert(COUPLING == GUMBEL)
        if GREEDY and not PROBS:
            later = amax
        else:
            g = -tl.log(-tl.log(gumbel_uniforms(0, pos, row_id, k0, k1, BLOCK_V)))
            later = tl.argmax(z + g, 0, tie_break_left=True)

    if RETURN_PROBS:
        tl.store(probs_ptr + pid * V + offs, tl.where(bad, float("nan"), p), mask=mask)
    store_position(pid, bad, bad_tok, bad_q, committed, has_draft, accepted, h, tvd, a, dist, resampled, later,
                   ent_ptr, tvd_ptr, acc_ptr, dist_ptr, res_ptr, later_ptr, flags_ptr)
