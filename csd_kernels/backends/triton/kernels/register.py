"""Register path: one program per (row, window position) holding the whole row in registers (V <= 16384).

The logits (both CFG halves, converted to fp32 right after the load) and the draft row q are read from HBM once;
mix, 1/T, top-k select, max, Z, p, H, TVD, a(x), the decision, the closed-form distortion, the resample / later draws
and the status bits are computed from registers. Top-k: the k-th largest z is found exactly by a 32-step bisection
over the order-preserving int32 image of the fp32 bits (count(z >= t) >= k); z >= threshold is kept (ties kept).
Top-p bisects the same keys on the softmax mass instead of the count; min-p keeps z − max z >= ln(min_p).
With PROBS the row holds target probabilities w: p = w / Σw, z = ln w.

gsd without its distortion decides from the draft's own group (no sort) and leaves the resampled token as a
placeholder; a second launch with GSD_ROWS (grid (B,)) draws it at each row's first stop, the only position whose
residual max(p − q·a, 0), hence every token's a(y) and the sorted row, is read.
"""

import triton
import triton.language as tl

from . import rules
from .common import (
    GUMBEL,
    INDEPENDENT,
    PROB_SUM_TOLERANCE,
    first_stop,
    gumbel_uniforms,
    inverse_cdf,
    load_mix_flagged,
    load_probs,
    log_or_minus_inf,
    order_key,
    position_rng,
    store_position,
    top_p_key,
    window_draft,
)
from .gsd import gsd_term


@triton.jit
def _top_k_key(z, mask, top_k):
    """The order key of the k-th largest z, exactly: 32-step bisection over the order-preserving int32 image of the
    fp32 bits (z is kept where its key is >= this)."""
    key = order_key(z)
    lo = tl.full((), -2147483648, tl.int64)
    hi = tl.full((), 2147483647, tl.int64)
    for _ in range(32):
        mid = (lo + hi + 1) >> 1
        ok = tl.sum((mask & (key >= mid.to(tl.int32))).to(tl.int32), 0) >= top_k
        lo = tl.where(ok, mid, lo)
        hi = tl.where(ok, hi, mid - 1)
    return lo


@triton.jit
def _draft_row(q_row, s_qv, offs, mask, x, HAS_Q: tl.constexpr):
    """(q, bad_q): the draft row (one-hot at x without draft_probs); a row that is not a distribution within
    PROB_SUM_TOLERANCE is bad and used as zero."""
    if HAS_Q:
        q = tl.load(q_row + offs * s_qv, mask=mask, other=0.0).to(tl.float32)
        bad_q = tl.max((mask & ~((q >= 0.0) & (q < float("inf")))).to(tl.int32), 0) > 0
        bad_q = bad_q | ~(tl.abs(tl.sum(tl.where(mask, q, 0.0), 0) - 1.0) <= PROB_SUM_TOLERANCE)
        q = tl.where(bad_q | ~mask, 0.0, q)
    else:
        bad_q = tl.full((), 0, tl.int1)
        q = tl.where(offs == x, 1.0, 0.0)
    return q, bad_q


@triton.jit
def _draft_term(p, q, p_x, q_x, x, h, support, offs, mask, st, nb_ptr, s_nb, nb_k, c_row, u_row, m, inv_z, thr_key,
                amax, V, gsd_row, RULE: tl.constexpr, GSD_SORTED: tl.constexpr, HAS_UNCOND: tl.constexpr,
                GREEDY: tl.constexpr, PROBS: tl.constexpr, RESTRICT: tl.constexpr, MIN_P: tl.constexpr,
                BLOCK_V: tl.constexpr):
    """(extra_x, qa): the rule's term of the draft for rules.acceptance (gsd: its group's ratio, lantern: its
    neighbours' mass) and the q·a its residual takes (gsd; q for the others)."""
    extra_x = tl.zeros_like(h)
    qa = q
    if RULE == rules.GSD:
        extra_x, qa = gsd_term(p, q, offs, mask, support, x, V, st.params, gsd_row, GSD_SORTED, BLOCK_V)
    if rules.is_lantern(RULE):
        limit = rules.lantern_limit(p_x, st.params[0], RULE)
        extra_x = rules.lantern_bonus(nb_ptr, s_nb, nb_k, tl.where(q_x > 0, x, -1), limit, c_row, u_row, m, inv_z,
                                      thr_key, st.log_min_p, amax, V, st.cfg_scale, st.inv_t, HAS_UNCOND, GREEDY,
                                      PROBS, RESTRICT, MIN_P)
    return extra_x, qa


@triton.jit
def _row_distortion(p, q, qa, support, h, tvd, st, nb_ptr, s_nb, nb_k, offs, c_row, u_row, m, inv_z, thr_key, amax, V,
                    RULE: tl.constexpr, HAS_UNCOND: tl.constexpr, GREEDY: tl.constexpr, PROBS: tl.constexpr,
                    RESTRICT: tl.constexpr, MIN_P: tl.constexpr, GATHER_DIST: tl.constexpr):
    """The rule's distortion at the position (rules.position_distortion): closed-form terms, gsd's from the sorted
    row and lantern's k gathers per token only when asked."""
    params = st.params
    terms = tl.zeros_like(h)
    if rules.has_token_terms(RULE):
        terms = tl.sum(rules.distortion_terms(p, q, support, h, params, RULE), 0)
    elif RULE == rules.GSD and GATHER_DIST:
        terms = tl.sum(tl.maximum(qa - p, 0.0), 0)
    elif rules.is_lantern(RULE) and GATHER_DIST:
        terms = tl.sum(rules.lantern_terms(nb_ptr, s_nb, nb_k, offs, p, q, support, params[0], c_row, u_row, m, inv_z,
                                           thr_key, st.log_min_p, amax, V, st.cfg_scale, st.inv_t, RULE, HAS_UNCOND,
                                           GREEDY, PROBS, RESTRICT, MIN_P), 0)
    return rules.position_distortion(terms, tvd, params, RULE, GATHER_DIST)


@triton.jit
def _later_draw(p, z, x, has_draft, u_acc, u_smp, strict_a, resampled, amax, pos, row_id, k0, k1, offs, mask, V,
                COUPLING: tl.constexpr, GREEDY: tl.constexpr, PROBS: tl.constexpr, BLOCK_V: tl.constexpr):
    """The draw for a position after accept_len (rules.next_draft), with the coupling's own draw made only where it
    is read: a fresh draw from p (independent), argmax z + G (gumbel on a sampled row)."""
    from_p = resampled
    gumbel = amax
    if COUPLING == INDEPENDENT:
        from_p = inverse_cdf(p, offs, mask, u_smp, V, BLOCK_V)
    if COUPLING == GUMBEL and (PROBS or not GREEDY):
        g = -tl.log(-tl.log(gumbel_uniforms(0, pos, row_id, k0, k1, BLOCK_V)))
        gumbel = tl.argmax(z + g, 0, tie_break_left=True)
    return rules.next_draft(from_p, x, has_draft, u_acc, strict_a, resampled, gumbel, amax, COUPLING,
                            GREEDY and not PROBS)


@triton.jit
def _target_row(c_row, u_row, offs, mask, st, HAS_UNCOND: tl.constexpr, GREEDY: tl.constexpr, TOP_K: tl.constexpr,
                TOP_P: tl.constexpr, MIN_P: tl.constexpr, PROBS: tl.constexpr):
    """(z, p, bad, m, 1/Z, thr_key, amax): the target distribution (the only read of the logits), z = −inf outside
    its support, and what p_at needs to recompute p at any token (lantern's neighbours): m, 1/Z, the restriction's
    order key. A bad row continues as uniform (target probabilities) or z = 0."""
    if PROBS:
        w, bad_w = load_probs(c_row, offs, mask)
        bad = (bad_w > 0) | ~(tl.abs(tl.sum(w, 0) - 1.0) <= PROB_SUM_TOLERANCE)
        w = tl.where(bad, tl.where(mask, 1.0, 0.0), w)
        z = log_or_minus_inf(w)
        p = w / tl.sum(w, 0)
    else:
        z, bad_z = load_mix_flagged(c_row, u_row, offs, mask, st.cfg_scale, st.inv_t, HAS_UNCOND, GREEDY)
        z = tl.where(mask, z, float("-inf"))
        bad = (bad_z > 0) | (tl.max(z, 0) == float("-inf"))  # bad input, or no finite logit
        z = tl.where(mask & bad, 0.0, z)
    m = tl.zeros((), tl.float32)
    thr_key = tl.full((), -2147483648, tl.int64)
    if PROBS:
        amax = tl.argmax(z, 0, tie_break_left=True)
        inv_z = 1.0 / tl.sum(w, 0)
    elif GREEDY:
        amax = tl.argmax(z, 0, tie_break_left=True)
        p = tl.where(offs == amax, 1.0, 0.0)
        inv_z = tl.full((), 1.0, tl.float32)
    else:
        amax = tl.zeros((), tl.int32)
        if TOP_K:
            thr_key = _top_k_key(z, mask, st.top_k)
            z = tl.where(order_key(z) >= thr_key.to(tl.int32), z, float("-inf"))
        m = tl.max(z, 0)
        if TOP_P:
            thr_key = tl.maximum(thr_key, top_p_key(z, tl.exp(z - m), mask, st.top_p))
            z = tl.where(order_key(z) >= thr_key.to(tl.int32), z, float("-inf"))
        if MIN_P:
            z = tl.where(z - m >= st.log_min_p, z, float("-inf"))
        e = tl.exp(z - m)
        inv_z = 1.0 / tl.sum(e, 0)
        p = e / tl.sum(e, 0)
    return z, p, bad, m, inv_z, thr_key, amax


@triton.jit(do_not_specialize=["seed_ptr", "offset_ptr"])  # int seeds: one kernel for all
def position_kernel(
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
    GSD_ROWS: tl.constexpr = False,
):
    """Grid (B·L,): one program per (row, window position), BLOCK_V >= V. Parameters: see common.py and rules.py
    (gsd_ptr: gsd's scratch, 4·BLOCK_V + 2 floats per position). GSD_ROWS: grid (B,), after the first launch: the
    resampled token of each row's first stop, with the row sorted (nothing else is stored)."""
    if GSD_ROWS:
        b = tl.program_id(0).to(tl.int64)
        stop = first_stop(flags_ptr + b * L, L)
        i = tl.minimum(stop, L - 1).to(tl.int64)  # a row without a stop computes its last position, unstored
        pid = b * L + i
    else:
        pid = tl.program_id(0).to(tl.int64)
        b = pid // L
        i = pid % L
    offs = tl.arange(0, BLOCK_V)
    mask = offs < V
    x, bad_tok, has_draft, committed = window_draft(draft_ptr, s_db, s_dl, start_ptr, s_start, b, i, V)
    c_row = logits_ptr + b * s_cb + i * s_cl
    u_row = uncond_ptr + b * s_ub + i * s_ul
    z, p, bad, m, inv_z, thr_key, amax = _target_row(c_row, u_row, offs, mask, st, HAS_UNCOND, GREEDY, TOP_K, TOP_P,
                                                     MIN_P, PROBS)
    h = -tl.sum(p * tl.log(tl.where(p > 0, p, 1.0)), 0)
    support = z > float("-inf")

    q, bad_q = _draft_row(q_ptr + b * s_qb + i * s_ql, s_qv, offs, mask, x, HAS_Q)
    tvd = 0.5 * tl.sum(tl.abs(p - q), 0)
    p_x = tl.sum(tl.where(offs == x, p, 0.0), 0)
    q_x = tl.sum(tl.where((offs == x) & support, q, 0.0), 0)  # a draft outside the support is rejected

    # ---- the rule's term of the draft, the distortion and the decision
    RESTRICT: tl.constexpr = TOP_K or TOP_P
    GSD_SORTED: tl.constexpr = GATHER_DIST or GSD_ROWS  # every a(y) is read (else the draft's group decides)
    extra_x, qa = _draft_term(p, q, p_x, q_x, x, h, support, offs, mask, st, nb_ptr, s_nb, nb_k, c_row, u_row, m, inv_z,
                              thr_key, amax, V, gsd_ptr + pid * (4 * BLOCK_V + 2), RULE, GSD_SORTED, HAS_UNCOND,
                              GREEDY, PROBS, RESTRICT, MIN_P, BLOCK_V)
    a, strict_a = rules.acceptance(p_x, q_x, h, tvd, st.params, extra_x, RULE)
    dist = _row_distortion(p, q, qa, support, h, tvd, st, nb_ptr, s_nb, nb_k, offs, c_row, u_row, m, inv_z, thr_key,
                           amax, V, RULE, HAS_UNCOND, GREEDY, PROBS, RESTRICT, MIN_P, GATHER_DIST)
    pos, row_id, k0, k1, u_acc, u_smp = position_rng(seed_ptr, seed_stride, positions_ptr, s_pos,
                                                     offset_ptr + b * offset_stride, b, i, PER_ROW_SEED,
                                                     SEED_VALUE, OFFSET_VALUE)
    a, accepted, dist, relaxed = rules.decide(a, strict_a, rules.slot_informed(inf_ptr, s_ib, s_il, b, i, HAS_INFORMED),
                                              dist, st.max_distortion, has_draft, u_acc)

    # ---- resample from the residual (p when it sums to 0 or there is no draft)
    if RULE == rules.GSD and not GSD_SORTED:
        resampled = tl.zeros((), tl.int32)  # a placeholder: the GSD_ROWS launch draws the row's first stop's
    else:
        r = rules.relaxed_residual(p, q, qa, relaxed, RULE)
        resampled = inverse_cdf(tl.where(has_draft & (tl.sum(r, 0) > 0), r, p), offs, mask, u_smp, V, BLOCK_V)
    later = _later_draw(p, z, x, has_draft, u_acc, u_smp, strict_a, resampled, amax, pos, row_id, k0, k1, offs, mask, V,
                        COUPLING, GREEDY, PROBS, BLOCK_V)

    if GSD_ROWS:
        tl.store(res_ptr + pid, resampled.to(tl.int32), mask=stop < L)
    else:
        if RETURN_PROBS:
            tl.store(probs_ptr + pid * V + offs, tl.where(bad, float("nan"), p), mask=mask)
        store_position(pid, bad, bad_tok, bad_q, committed, has_draft, accepted, h, tvd, a, dist, resampled, later,
                       ent_ptr, tvd_ptr, acc_ptr, dist_ptr, res_ptr, later_ptr, flags_ptr)
