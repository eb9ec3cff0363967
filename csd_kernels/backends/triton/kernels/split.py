"""Split path: S programs per (row, window position), each owning one BLOCK_V slice of the vocabulary.

For the small batches of image generation (B·L far below the SM count) one program per position leaves the GPU
idle and each program walks thousands of elements in sequence. Here the grid is (B·L·S,), pid = position·S + split:

* ``split_stats_kernel``: per slice, max m_s, Z_s = Σ e^(z−m_s), S1_s = Σ e^(z−m_s)(z−m_s), the non-finite flag,
  the first argmax (T = 0) or the gumbel argmax (value and index). It also zeroes this launch's arrival counters.
* ``split_finish_kernel``: every program combines the S slice statistics of its position (m, Z, and
  H = ln Z − Σ_s e^(m_s−m)(S1_s + (m_s−m)Z_s)/Z), then computes p on its slice and the slice sums of |p − q|,
  max(p − q, 0), p and the gated distortion Σ_{p<q} min(q − p, λH·q) (= Σ max(q·a − min(p, q), 0) with the gate
  open; 0 with it closed). The last program of a position to arrive (an atomic counter) combines those sums, makes
  the decision, and draws by inverse CDF: the slice holding u·total is found from the slice totals, then only that
  slice is scanned. The last position of a row to finish runs the row epilogue. Two launches, no host sync.

Arrival: each program stores its sums, passes a CTA barrier, then increments the counter with acq_rel semantics;
the program that sees S − 1 reads the others' sums through L2 (``.cg``). Under Triton's interpreter programs run
one after another, so the last one is always the last split: the logic is the same either way.
"""

import triton
import triton.language as tl

from . import rules
from .common import (
    GUMBEL,
    INDEPENDENT,
    PROB_SUM_TOLERANCE,
    gumbel_uniforms,
    load_mix,
    load_mix_flagged,
    position_rng,
    row_epilogue,
    row_key,
    store_position,
    window_draft,
)

N_STATS: tl.constexpr = tl.constexpr(5)  # m_s, Z_s, S1_s, gumbel best, (unused)  (+ int: bad flag, argmax index)
N_SUMS: tl.constexpr = tl.constexpr(5)  # Σ|p − q|, Σ max(p − q, 0), Σ p, distortion terms, Σ q  (+ int: bad q flag)


@triton.jit
def _split_coords(L, V, BLOCK_V: tl.constexpr):
    """(pid, position, split count S, split s, row b, window index i, slice offsets, slice mask)."""
    pid = tl.program_id(0).to(tl.int64)
    n_split = tl.cdiv(V, BLOCK_V)
    position = pid // n_split
    s = pid % n_split
    offs = s * BLOCK_V + tl.arange(0, BLOCK_V)
    return pid, position, n_split, s, position // L, position % L, offs, offs < V


@triton.jit(do_not_specialize=["seed_ptr"])  # an int seed: one kernel for every value
def split_stats_kernel(
    logits_ptr, s_cb, s_cl, uncond_ptr, s_ub, s_ul,
    positions_ptr, s_pos, seed_ptr, seed_stride,
    stats_ptr, index_ptr, position_count_ptr, row_count_ptr,
    L, V, st,
    HAS_UNCOND: tl.constexpr, GREEDY: tl.constexpr, GUMBEL: tl.constexpr, PER_ROW_SEED: tl.constexpr,
    BLOCK_V: tl.constexpr, SEED_VALUE: tl.constexpr = False,
):
    """Grid (B·L·S,): the slice statistics. Parameters: common.py."""
    cfg_scale, inv_t = st.cfg_scale, st.inv_t
    pid, position, n_split, s, b, i, offs, mask = _split_coords(L, V, BLOCK_V)
    # the counters of split_finish_kernel, zeroed here so that a launch (or a CUDA-graph replay) needs no memset
    tl.store(position_count_ptr + position, 0, mask=s == 0)
    tl.store(row_count_ptr + b, 0, mask=(s == 0) & (i == 0))

    z, bad = load_mix_flagged(logits_ptr + b * s_cb + i * s_cl, uncond_ptr + b * s_ub + i * s_ul, offs, mask,
                              cfg_scale, inv_t, HAS_UNCOND, GREEDY)
    z = tl.where(mask, z, float("-inf"))
    m = tl.max(z, 0)
    if GREEDY:
        index = tl.argmax(z, 0, tie_break_left=True) + s * BLOCK_V
        z_sum = tl.zeros((), tl.float32)
        s1 = tl.zeros((), tl.float32)
        g_best = tl.zeros((), tl.float32)
    else:
        kept = z > float("-inf")  # masked tokens (and a slice with none kept: m = −inf) add nothing
        d = tl.where(kept, z - m, 0.0)
        e = tl.where(kept, tl.exp(d), 0.0)
        z_sum = tl.sum(e, 0)
        s1 = tl.sum(e * d, 0)
        if GUMBEL:
            k0, k1, row_id = row_key(seed_ptr, seed_stride, b, PER_ROW_SEED, SEED_VALUE)
            pos = ((tl.load(positions_ptr + b * s_pos).to(tl.int64) + i) & 0xFFFFFFFF).to(tl.uint32)
            score = z - tl.log(-tl.log(gumbel_uniforms(s * BLOCK_V, pos, row_id, k0, k1, BLOCK_V)))
            g_best = tl.max(score, 0)
            index = tl.argmax(score, 0, tie_break_left=True) + s * BLOCK_V
        else:
            g_best = tl.zeros((), tl.float32)
            index = tl.zeros((), tl.int64)
    tl.store(stats_ptr + pid * N_STATS + 0, m)
    tl.store(stats_ptr + pid * N_STATS + 1, z_sum)
    tl.store(stats_ptr + pid * N_STATS + 2, s1)
    tl.store(stats_ptr + pid * N_STATS + 3, g_best)
    tl.store(index_ptr + pid * 2 + 0, bad)
    tl.store(index_ptr + pid * 2 + 1, index.to(tl.int32))


@triton.jit
def _combine_stats(stats_ptr, index_ptr, position, n_split, V, GREEDY: tl.constexpr, GUMBEL: tl.constexpr,
                   S_BLOCK: tl.constexpr):
    """(bad, m, 1/Z, H, argmax, gumbel argmax) of a position from its S slice statistics."""
    sv = tl.arange(0, S_BLOCK)
    smask = sv < n_split
    row = (position * n_split + sv) * N_STATS
    bad = tl.max(tl.load(index_ptr + (position * n_split + sv) * 2, mask=smask, other=0), 0) > 0
    m_s = tl.load(stats_ptr + row + 0, mask=smask, other=float("-inf"))
    m = tl.max(m_s, 0)
    bad = bad | (m == float("-inf"))  # no finite logit in the row
    # the first slice holding the maximum holds the first argmax (slices are in vocabulary order)
    first = tl.min(tl.where(smask & (m_s == m), sv, S_BLOCK), 0)
    amax = tl.load(index_ptr + (position * n_split + first) * 2 + 1, mask=first < n_split, other=0)
    if GREEDY:
        inv_z = tl.full((), 1.0, tl.float32)
        h = tl.zeros((), tl.float32)
        later = amax
    else:
        z_s = tl.load(stats_ptr + row + 1, mask=smask, other=0.0)
        s1_s = tl.load(stats_ptr + row + 2, mask=smask, other=0.0)
        live = smask & (m_s > float("-inf"))  # a slice of masked tokens only adds nothing
        shift = tl.where(live, m_s - m, 0.0)
        scale = tl.where(live, tl.exp(shift), 0.0)
        z_total = tl.sum(z_s * scale, 0)
        inv_z = 1.0 / z_total
        h = tl.log(z_total) - tl.sum(scale * (s1_s + shift * z_s), 0) * inv_z
        h = tl.maximum(h, 0.0)
        later = amax
        if GUMBEL:
            g_s = tl.load(stats_ptr + row + 3, mask=smask, other=float("-inf"))
            g_best = tl.max(g_s, 0)
            g_first = tl.min(tl.where(smask & (g_s == g_best), sv, S_BLOCK), 0)
            later = tl.load(index_ptr + (position * n_split + g_first) * 2 + 1, mask=g_first < n_split, other=0)
    # a bad row is computed as if z were 0 (uniform p); its outputs are NaN / token 0 anyway
    m = tl.where(bad, 0.0, m)
    inv_z = tl.where(bad, 1.0 / V, inv_z)
    h = tl.where(bad, 0.0, h)
    return bad, m, inv_z, h, amax, later


@triton.jit
def _slice_p(c_row, u_row, offs, mask, bad, m, inv_z, amax, cfg_scale, inv_t, HAS_UNCOND: tl.constexpr,
             GREEDY: tl.constexpr):
    """(p, support) on one slice (p = 0 outside the vocabulary and at masked tokens)."""
    if GREEDY:
        p = tl.where(mask & (offs == amax), 1.0, 0.0)
        support = mask
    else:
        z = load_mix(c_row, u_row, offs, mask, cfg_scale, inv_t, HAS_UNCOND, GREEDY)
        z = tl.where(bad, 0.0, z)
        support = mask & (z > float("-inf"))
        p = tl.where(support, tl.exp(z - m) * inv_z, 0.0)
    return p, support


@triton.jit
def _slice_q(q_row, s_qv, offs, mask, x, HAS_Q: tl.constexpr):
    """(q on one slice with invalid entries zeroed, 1 if any entry was invalid): one-hot(x) without draft_probs."""
    if HAS_Q:
        q = tl.load(q_row + offs * s_qv, mask=mask, other=0.0).to(tl.float32)
        ok = (q >= 0.0) & (q < float("inf"))
        bad_q = tl.max((mask & ~ok).to(tl.int32), 0)
        q = tl.where(mask & ok, q, 0.0)
    else:
        q = tl.where(offs == x, 1.0, 0.0)
        bad_q = tl.zeros((), tl.int32)
    return q, bad_q


@triton.jit
def _slice_search(weight_totals_ptr, position, n_split, target_u, c_row, u_row, q_row, s_qv, x, bad, m, inv_z, amax,
                  cfg_scale, inv_t, V, USE_RESIDUAL, HAS_UNCOND: tl.constexpr, HAS_Q: tl.constexpr,
                  GREEDY: tl.constexpr, BLOCK_V: tl.constexpr, S_BLOCK: tl.constexpr):
    """Inverse-CDF draw at u·total over the row's weights (max(p − q, 0) when USE_RESIDUAL, else p), given the
    slice totals at ``weight_totals_ptr`` (stride N_SUMS): find the slice, then scan only that slice."""
    sv = tl.arange(0, S_BLOCK)
    smask = sv < n_split
    base = weight_totals_ptr + position * n_split * N_SUMS
    w_s = tl.load(base + sv * N_SUMS, mask=smask, other=0.0, cache_modifier=".cg")
    w_before = tl.load(base + (sv - 1) * N_SUMS, mask=smask & (sv > 0), other=0.0, cache_modifier=".cg")
    start = tl.cumsum(w_before, 0)  # exclusive prefix
    end = start + w_s
    total = tl.max(tl.where(smask, end, float("-inf")), 0)
    target = target_u * total
    hit = tl.min(tl.where(smask & (end > target), sv, S_BLOCK), 0)
    last_positive = tl.max(tl.where(smask & (w_s > 0), sv, -1), 0)
    found = hit < n_split
    chosen = tl.where(found, hit, tl.maximum(last_positive, 0))
    carry = tl.sum(tl.where(sv == chosen, start, 0.0), 0)
    target = tl.where(found, target, float("inf"))  # rounding overshoot: the last positive weight

    offs = chosen * BLOCK_V + tl.arange(0, BLOCK_V)
    mask = offs < V
    p, _support = _slice_p(c_row, u_row, offs, mask, bad, m, inv_z, amax, cfg_scale, inv_t, HAS_UNCOND, GREEDY)
    q, _bad_q = _slice_q(q_row, s_qv, offs, mask, x, HAS_Q)
    w = tl.where(USE_RESIDUAL, rules.residual(p, q, q, rules.STRICT), p)
    cdf = carry + tl.cumsum(w, 0)
    first = tl.min(tl.where(mask & (cdf > target), offs, V), 0)
    last = tl.max(tl.where(mask & (w > 0), offs, -1), 0)
    return tl.where(first < V, first, last)


@triton.jit
def _slice_sums(sums_ptr, bad_q_ptr, probs_ptr, pid, position, c_row, u_row, q_row, s_qv, offs, mask, x, bad, m,
                inv_z, h, amax, st, nb_ptr, s_nb, nb_k, V, HAS_UNCOND: tl.constexpr, HAS_Q: tl.constexpr,
                GREEDY: tl.constexpr, RULE: tl.constexpr, RETURN_PROBS: tl.constexpr, GATHER_DIST: tl.constexpr):
    """Store program ``pid``'s slice sums (N_SUMS floats) and bad-q flag; write its slice of the position's probs."""
    cfg_scale, inv_t, params = st.cfg_scale, st.inv_t, st.params
    p, support = _slice_p(c_row, u_row, offs, mask, bad, m, inv_z, amax, cfg_scale, inv_t, HAS_UNCOND, GREEDY)
    q, bad_q = _slice_q(q_row, s_qv, offs, mask, x, HAS_Q)
    if RETURN_PROBS:
        tl.store(probs_ptr + position * V + offs, tl.where(bad, float("nan"), p), mask=mask)
    sums = sums_ptr + pid * N_SUMS
    tl.store(sums + 0, tl.sum(tl.abs(p - q), 0))
    tl.store(sums + 1, tl.sum(rules.residual(p, q, q, rules.STRICT), 0))
    tl.store(sums + 2, tl.sum(p, 0))
    terms = tl.zeros((), tl.float32)
    if rules.has_token_terms(RULE):
        terms = tl.sum(rules.distortion_terms(p, q, support, h, params, RULE), 0)
    if rules.is_lantern(RULE) and GATHER_DIST:  # k gathers per token of the slice
        terms = tl.sum(rules.lantern_terms(nb_ptr, s_nb, nb_k, offs, p, q, support, params[0], c_row, u_row, m, inv_z,
                                           0, 0.0, amax, V, cfg_scale, inv_t, RULE, HAS_UNCOND, GREEDY, False, False,
                                           False), 0)
    tl.store(sums + 3, terms)
    tl.store(sums + 4, tl.sum(q, 0))
    tl.store(bad_q_ptr + pid, bad_q)


@triton.jit
def _position_total(sums_ptr, position, n_split, k, S_BLOCK: tl.constexpr):
    """Σ over a position's S slices of their k-th sum (read through L2: other programs wrote them in this launch)."""
    sv = tl.arange(0, S_BLOCK)
    sums = sums_ptr + (position * n_split + sv) * N_SUMS
    return tl.sum(tl.load(sums + k, mask=sv < n_split, other=0.0, cache_modifier=".cg"), 0)


@triton.jit
def _position_sums(sums_ptr, bad_q_ptr, position, n_split, HAS_Q: tl.constexpr, S_BLOCK: tl.constexpr):
    """(TVD, residual total, bad q) of a position from its slices' sums; a flagged q counts as the zero vector."""
    abs_diff = _position_total(sums_ptr, position, n_split, 0, S_BLOCK)
    residual = _position_total(sums_ptr, position, n_split, 1, S_BLOCK)
    p_total = _position_total(sums_ptr, position, n_split, 2, S_BLOCK)
    sv = tl.arange(0, S_BLOCK)
    bad_q_s = tl.load(bad_q_ptr + position * n_split + sv, mask=sv < n_split, other=0, cache_modifier=".cg")
    bad_q_row = tl.max(bad_q_s, 0) > 0
    if HAS_Q:  # q rows must sum to 1 (reference.PROB_SUM_TOLERANCE)
        q_total = _position_total(sums_ptr, position, n_split, 4, S_BLOCK)
        bad_q_row = bad_q_row | ~(tl.abs(q_total - 1.0) <= PROB_SUM_TOLERANCE)
    return tl.where(bad_q_row, 0.5 * p_total, 0.5 * abs_diff), residual, bad_q_row


@triton.jit
def _draft_probs(c_row, u_row, q_row, s_qv, x, has_draft, bad, bad_q_row, m, inv_z, amax, cfg_scale, inv_t,
                 HAS_UNCOND: tl.constexpr, HAS_Q: tl.constexpr, GREEDY: tl.constexpr):
    """(p(x), q(x)) of the draft, 0 without one; a masked draft is rejected: q(x) counts as 0."""
    x_safe = tl.maximum(x, 0)
    if GREEDY:
        p_x = tl.where(x_safe == amax, 1.0, 0.0)
        x_in_support = x_safe == amax
    else:
        z_x = tl.where(bad, 0.0, load_mix(c_row, u_row, x_safe, has_draft, cfg_scale, inv_t, HAS_UNCOND, GREEDY))
        p_x = tl.exp(z_x - m) * inv_z
        x_in_support = z_x > float("-inf")
    if HAS_Q:
        q_x = tl.load(q_row + x_safe * s_qv, mask=has_draft, other=0.0).to(tl.float32)
        q_x = tl.where(bad_q_row | ~has_draft | ~x_in_support, 0.0, q_x)
    else:
        q_x = tl.where(has_draft & x_in_support, 1.0, 0.0)
    return tl.where(has_draft, p_x, 0.0), q_x


@triton.jit
def _draws(sums_ptr, position, n_split, u_smp, use_r, c_row, u_row, q_row, s_qv, x, bad, m, inv_z, amax, cfg_scale,
           inv_t, V, COUPLING: tl.constexpr, HAS_UNCOND: tl.constexpr, HAS_Q: tl.constexpr, GREEDY: tl.constexpr,
           BLOCK_V: tl.constexpr, S_BLOCK: tl.constexpr):
    """(resampled, from p): the draw from the residual (from p without use_r) and the independent coupling's fresh
    draw from p, by the same uniform (so the same draw without use_r)."""
    resampled = _slice_search(sums_ptr + tl.where(use_r, 1, 2), position, n_split, u_smp, c_row, u_row, q_row, s_qv, x,
                              bad, m, inv_z, amax, cfg_scale, inv_t, V, use_r, HAS_UNCOND, HAS_Q, GREEDY, BLOCK_V,
                              S_BLOCK)
    from_p = resampled
    if COUPLING == INDEPENDENT:
        if use_r:
            from_p = _slice_search(sums_ptr + 2, position, n_split, u_smp, c_row, u_row, q_row, s_qv, x, bad, m, inv_z,
                                   amax, cfg_scale, inv_t, V, False, HAS_UNCOND, HAS_Q, GREEDY, BLOCK_V, S_BLOCK)
    return resampled, from_p


@triton.jit(do_not_specialize=["seed_ptr", "offset_ptr"])  # int seeds: one kernel for all
def split_finish_kernel(
    logits_ptr, s_cb, s_cl,
    uncond_ptr, s_ub, s_ul,
    q_ptr, s_qb, s_ql, s_qv,
    draft_ptr, s_db, s_dl,
    start_ptr, s_start, positions_ptr, s_pos,
    seed_ptr, seed_stride, offset_ptr, offset_stride, inf_ptr, s_ib, s_il,
    probs_ptr, ent_ptr, tvd_ptr, acc_ptr, dist_ptr,
    res_ptr, later_ptr, flags_ptr,
    stats_ptr, index_ptr, sums_ptr, bad_q_ptr, position_count_ptr, row_count_ptr,
    tokens_ptr, accept_len_ptr, status_ptr,
    L, V, st, nb_ptr, s_nb, nb_k,
    HAS_UNCOND: tl.constexpr, HAS_Q: tl.constexpr, GREEDY: tl.constexpr, RULE: tl.constexpr,
    COUPLING: tl.constexpr, RETURN_PROBS: tl.constexpr, PER_ROW_SEED: tl.constexpr,
    BLOCK_V: tl.constexpr, S_BLOCK: tl.constexpr, BLOCK_L: tl.constexpr,
    SEED_VALUE: tl.constexpr = False, OFFSET_VALUE: tl.constexpr = False, GATHER_DIST: tl.constexpr = False,
    HAS_INFORMED: tl.constexpr = False,
):
    """Grid (B·L·S,), after split_stats_kernel. Parameters: common.py, plus the workspaces of the module docstring."""
    cfg_scale, inv_t, params = st.cfg_scale, st.inv_t, st.params
    pid, position, n_split, s, b, i, offs, mask = _split_coords(L, V, BLOCK_V)
    bad, m, inv_z, h, amax, gumbel_later = _combine_stats(stats_ptr, index_ptr, position, n_split, V, GREEDY,
                                                          COUPLING == GUMBEL, S_BLOCK)
    c_row = logits_ptr + b * s_cb + i * s_cl
    u_row = uncond_ptr + b * s_ub + i * s_ul
    q_row = q_ptr + b * s_qb + i * s_ql
    x, bad_tok, has_draft, committed = window_draft(draft_ptr, s_db, s_dl, start_ptr, s_start, b, i, V)
    _slice_sums(sums_ptr, bad_q_ptr, probs_ptr, pid, position, c_row, u_row, q_row, s_qv, offs, mask, x, bad, m, inv_z,
                h, amax, st, nb_ptr, s_nb, nb_k, V, HAS_UNCOND, HAS_Q, GREEDY, RULE, RETURN_PROBS, GATHER_DIST)

    # ---- the last program of the position to arrive finishes it
    tl.debug_barrier()
    arrived = tl.atomic_add(position_count_ptr + position, 1, sem="acq_rel", scope="gpu")
    if arrived == n_split - 1:
        _pos, _row_id, _k0, _k1, u_acc, u_smp = position_rng(seed_ptr, seed_stride, positions_ptr, s_pos,
                                                             offset_ptr + b * offset_stride, b, i, PER_ROW_SEED,
                                                             SEED_VALUE, OFFSET_VALUE)
        tvd, residual, bad_q_row = _position_sums(sums_ptr, bad_q_ptr, position, n_split, HAS_Q, S_BLOCK)
        p_x, q_x = _draft_probs(c_row, u_row, q_row, s_qv, x, has_draft, bad, bad_q_row, m, inv_z, amax, cfg_scale,
                                inv_t, HAS_UNCOND, HAS_Q, GREEDY)
        extra_x = tl.zeros_like(h)
        if rules.is_lantern(RULE):  # the draft's neighbours' mass: k gathers
            limit = rules.lantern_limit(p_x, params[0], RULE)
            extra_x = rules.lantern_bonus(nb_ptr, s_nb, nb_k, tl.where(q_x > 0, x, -1), limit, c_row, u_row, m,
                                          inv_z, 0, 0.0, amax, V, cfg_scale, inv_t, HAS_UNCOND, GREEDY, False, False,
                                          False)
        a, strict_a = rules.acceptance(p_x, q_x, h, tvd, params, extra_x, RULE)
        # a flagged q counts as the zero vector (as in the TVD): no distortion, and q(x) = 0 rejects the draft
        dist = rules.position_distortion(_position_total(sums_ptr, position, n_split, 3, S_BLOCK), tvd, params, RULE,
                                         GATHER_DIST)
        a, accepted, dist, _relaxed = rules.decide(a, strict_a, rules.slot_informed(inf_ptr, s_ib, s_il, b, i,
                                                                                   HAS_INFORMED),
                                                   tl.where(bad_q_row, 0.0, dist), st.max_distortion, has_draft, u_acc)
        # the strict residual (every rule's but gsd's, which this path never runs)
        use_r = has_draft & ~bad_q_row & (residual > 0)
        resampled, from_p = _draws(sums_ptr, position, n_split, u_smp, use_r, c_row, u_row, q_row, s_qv, x, bad, m,
                                   inv_z, amax, cfg_scale, inv_t, V, COUPLING, HAS_UNCOND, HAS_Q, GREEDY, BLOCK_V,
                                   S_BLOCK)
        later = rules.next_draft(from_p, x, has_draft, u_acc, strict_a, resampled, gumbel_later, amax, COUPLING, GREEDY)
        store_position(position, bad, bad_tok, bad_q_row, committed, has_draft, accepted, h, tvd, a, dist, resampled,
                       later, ent_ptr, tvd_ptr, acc_ptr, dist_ptr, res_ptr, later_ptr, flags_ptr)

        # ---- the last position of the row to finish writes the row
        tl.debug_barrier()
        done = tl.atomic_add(row_count_ptr + b, 1, sem="acq_rel", scope="gpu")
        if done == L - 1:
            row_epilogue(b, draft_ptr, s_db, s_dl, res_ptr, later_ptr, flags_ptr, tokens_ptr, accept_len_ptr,
                         status_ptr, L, V, BLOCK_L)
