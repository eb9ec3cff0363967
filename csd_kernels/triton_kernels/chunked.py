"""Chunked path: one program per (row, window position) streaming the row in chunks, for V above the register path.

Three sweeps (the first reads HBM, sweeps 2 and 3 re-read the row from L2 while it is resident):
(1) non-finite check, online max / Z (or first argmax for T = 0), gumbel argmax;
(2) p, H, TVD, p(x), q(x), the draft-probs check, and the running CDF totals of the residual and of p;
(3) closed-form distortion and the two inverse-CDF searches (running prefix sums seeded by the chunk carries).
With top_k, 32 counting sweeps find the k-th largest logit first. The CDF carries of sweep 2 and the prefix sums of
sweep 3 come from the same code on the same data, so the target u·total and the searched CDF are consistent.
"""

import triton
import triton.language as tl

from .common import (
    S_BAD_LOGITS,
    S_BAD_TOKEN,
    S_BAD_PROBS,
    S_MISSING,
    F_STOP,
    position_rng,
    gumbel_uniforms,
    load_mix,
    nonfinite,
    order_key,
    chunk_cdf,
)


@triton.jit
def position_chunked_kernel(
    logits_ptr, s_cb, s_cl,
    uncond_ptr, s_ub, s_ul,
    q_ptr, s_qb, s_ql, s_qv,
    draft_ptr, s_db, s_dl,
    start_ptr, s_start, positions_ptr, s_pos,
    seed_ptr, seed_stride, offset_ptr, offset_stride,
    probs_ptr, ent_ptr, tvd_ptr, acc_ptr, dist_ptr,
    res_ptr, later_ptr, flags_ptr,
    L, V, cfg_scale, inv_t, top_k, entropy_coef, tvd_threshold,
    HAS_UNCOND: tl.constexpr, HAS_Q: tl.constexpr, GREEDY: tl.constexpr, TOP_K: tl.constexpr,
    MODE_CSD: tl.constexpr, NEXT_DRAFTS: tl.constexpr, RETURN_PROBS: tl.constexpr,
    PER_ROW_SEED: tl.constexpr, BLOCK_V: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)
    b = pid // L
    i = pid % L
    lane = tl.arange(0, BLOCK_V)
    NEG_INF: tl.constexpr = float("-inf")
    c_row = logits_ptr + b * s_cb + i * s_cl
    u_row = uncond_ptr + b * s_ub + i * s_ul
    q_row = q_ptr + b * s_qb + i * s_ql

    x = tl.load(draft_ptr + b * s_db + i * s_dl).to(tl.int64)
    bad_tok = (x < -1) | (x >= V)
    x = tl.where(bad_tok, -1, x)
    has_draft = x >= 0
    committed = i < tl.load(start_ptr + b * s_start)
    pos, row_id, k0, k1, u_acc, u_smp = position_rng(seed_ptr, seed_stride, positions_ptr, s_pos,
                                                      offset_ptr + b * offset_stride, b, i, PER_ROW_SEED)

    # ---- sweep 0 (top_k only): k-th largest z by bisection, 32 counting sweeps
    thr = tl.full((), -2147483648, tl.int64)
    if TOP_K:
        if not GREEDY:
            hi = tl.full((), 2147483647, tl.int64)
            for _ in range(32):
                mid = (thr + hi + 1) >> 1
                cnt = tl.zeros((), tl.int32)
                for v0 in range(0, V, BLOCK_V):
                    offs = v0 + lane
                    mask = offs < V
                    z = load_mix(c_row, u_row, offs, mask, cfg_scale, inv_t, HAS_UNCOND, GREEDY)
                    cnt += tl.sum((mask & (order_key(z) >= mid.to(tl.int32))).to(tl.int32), 0)
                ok = cnt >= top_k
                thr = tl.where(ok, mid, thr)
                hi = tl.where(ok, hi, mid - 1)

    # ---- sweep 1: non-finite check, online max / Z, greedy argmax, gumbel argmax
    badi = tl.zeros((), tl.int32)
    m = tl.full((), NEG_INF, tl.float32)
    zsum = tl.zeros((), tl.float32)
    amax = tl.zeros((), tl.int32)
    gbest = tl.full((), NEG_INF, tl.float32)
    gidx = tl.zeros((), tl.int32)
    for v0 in range(0, V, BLOCK_V):
        offs = v0 + lane
        mask = offs < V
        z = load_mix(c_row, u_row, offs, mask, cfg_scale, inv_t, HAS_UNCOND, GREEDY)
        badi = tl.maximum(badi, nonfinite(z, mask))
        z = tl.where(mask, z, NEG_INF)
        if TOP_K:
            if not GREEDY:
                z = tl.where(order_key(z) >= thr.to(tl.int32), z, NEG_INF)
        m_c = tl.max(z, 0)
        if GREEDY:
            a_c = tl.argmax(z, 0, tie_break_left=True) + v0
            amax = tl.where(m_c > m, a_c.to(tl.int32), amax)
            m = tl.maximum(m, m_c)
        else:
            m_new = tl.maximum(m, m_c)
            m_ref = tl.where(m_new == NEG_INF, 0.0, m_new)
            zsum = zsum * tl.exp(m - m_ref) + tl.sum(tl.exp(z - m_ref), 0)
            m = m_new
            if NEXT_DRAFTS == 2:
                g = -tl.log(-tl.log(gumbel_uniforms(v0, pos, row_id, k0, k1, BLOCK_V)))
                s = z + g
                s_c = tl.max(s, 0)
                i_c = tl.argmax(s, 0, tie_break_left=True) + v0
                gidx = tl.where(s_c > gbest, i_c.to(tl.int32), gidx)
                gbest = tl.maximum(gbest, s_c)
    bad = badi > 0
    # A bad row emits token 0 and NaN statistics whatever is computed below.

    # ---- sweep 2: p, H, TVD, p(x), q(x), draft-probs check, CDF totals
    h_acc = tl.zeros((), tl.float32)
    absdiff = tl.zeros((), tl.float32)
    psum = tl.zeros((), tl.float32)
    p_x = tl.zeros((), tl.float32)
    q_x = tl.zeros((), tl.float32)
    badq_i = tl.zeros((), tl.int32)
    carry_r = tl.zeros((), tl.float32)
    carry_p = tl.zeros((), tl.float32)
    for v0 in range(0, V, BLOCK_V):
        offs = v0 + lane
        mask = offs < V
        if GREEDY:
            p = tl.where(offs == amax, 1.0, 0.0)
        else:
            z = load_mix(c_row, u_row, offs, mask, cfg_scale, inv_t, HAS_UNCOND, GREEDY)
            z = tl.where(mask, z, NEG_INF)
            if TOP_K:
                z = tl.where(order_key(z) >= thr.to(tl.int32), z, NEG_INF)
            p = tl.exp(z - m) / zsum
        h_acc += tl.sum(p * tl.log(tl.where(p > 0, p, 1.0)), 0)
        if HAS_Q:
            q = tl.load(q_row + offs * s_qv, mask=mask, other=0.0).to(tl.float32)
            badq_i = tl.maximum(badq_i, tl.max((mask & ~((q >= 0.0) & (q < float("inf")))).to(tl.int32), 0))
            q = tl.where(mask, q, 0.0)
        else:
            q = tl.where(offs == x, 1.0, 0.0)
        absdiff += tl.sum(tl.abs(p - q), 0)
        psum += tl.sum(p, 0)
        is_x = offs == x
        p_x += tl.sum(tl.where(is_x, p, 0.0), 0)
        q_x += tl.sum(tl.where(is_x, q, 0.0), 0)
        _cr, carry_r = chunk_cdf(tl.maximum(p - q, 0.0), carry_r, lane, BLOCK_V)
        _cp, carry_p = chunk_cdf(p, carry_p, lane, BLOCK_V)
        if RETURN_PROBS:
            tl.store(probs_ptr + pid * V + offs, tl.where(bad, float("nan"), p), mask=mask)
    h = -h_acc
    bad_q = badq_i > 0
    tvd = tl.where(bad_q, 0.5 * psum, 0.5 * absdiff)
    q_x = tl.where(bad_q, 0.0, q_x)

    pos_ok = q_x > 0
    ratio = tl.where(pos_ok, p_x / tl.where(pos_ok, q_x, 1.0), 0.0)
    strict_a = tl.minimum(ratio, 1.0)
    if MODE_CSD:
        gate = tvd < tvd_threshold
        a = tl.minimum(tl.where(gate, tl.where(pos_ok, ratio + entropy_coef * h, 0.0), ratio), 1.0)
    else:
        a = strict_a
    accepted = has_draft & (u_acc < a)
    # residual draws use max(p − q, 0) unless it sums to 0, there is no draft, or q was flagged (then r = p)
    use_r = has_draft & ~bad_q & (carry_r > 0)
    total_w = tl.where(use_r, carry_r, carry_p)
    target_w = u_smp * total_w
    target_p = u_smp * carry_p

    # ---- sweep 3: distortion and inverse-CDF searches
    gate_v = tvd < tvd_threshold
    dist = tl.zeros((), tl.float32)
    cw = tl.zeros((), tl.float32)
    cpp = tl.zeros((), tl.float32)
    first_w = tl.full((), 2147483647, tl.int32)
    last_w = tl.full((), -1, tl.int32)
    first_p = tl.full((), 2147483647, tl.int32)
    last_p = tl.full((), -1, tl.int32)
    for v0 in range(0, V, BLOCK_V):
        offs = v0 + lane
        mask = offs < V
        if GREEDY:
            p = tl.where(offs == amax, 1.0, 0.0)
        else:
            z = load_mix(c_row, u_row, offs, mask, cfg_scale, inv_t, HAS_UNCOND, GREEDY)
            z = tl.where(mask, z, NEG_INF)
            if TOP_K:
                z = tl.where(order_key(z) >= thr.to(tl.int32), z, NEG_INF)
            p = tl.exp(z - m) / zsum
        if HAS_Q:
            q = tl.load(q_row + offs * s_qv, mask=mask, other=0.0).to(tl.float32)
            q = tl.where(mask, q, 0.0)
        else:
            q = tl.where(offs == x, 1.0, 0.0)
        if MODE_CSD:
            if HAS_Q:
                qz = tl.where(bad_q, 0.0, q)
                qpos = qz > 0
                rv = tl.where(qpos, p / tl.where(qpos, qz, 1.0), 0.0)
                rv = tl.where(gate_v, tl.where(qpos, rv + entropy_coef * h, 0.0), rv)
                dist += tl.sum(tl.maximum(qz * tl.minimum(rv, 1.0) - tl.minimum(p, qz), 0.0), 0)
        # the same carries as sweep 2, recomputed on the same data
        w = tl.where(use_r, tl.maximum(p - q, 0.0), p)
        cdf_w, cw = chunk_cdf(w, cw, lane, BLOCK_V)
        hit = tl.min(tl.where(mask & (cdf_w > target_w), offs, 2147483647), 0).to(tl.int32)
        first_w = tl.minimum(first_w, hit)
        last_w = tl.maximum(last_w, tl.max(tl.where(w > 0, offs, -1), 0).to(tl.int32))
        if NEXT_DRAFTS == 0:
            cdf_p, cpp = chunk_cdf(p, cpp, lane, BLOCK_V)
            hit_p = tl.min(tl.where(mask & (cdf_p > target_p), offs, 2147483647), 0).to(tl.int32)
            first_p = tl.minimum(first_p, hit_p)
            last_p = tl.maximum(last_p, tl.max(tl.where(p > 0, offs, -1), 0).to(tl.int32))
    if MODE_CSD:
        if not HAS_Q:
            dist = tl.maximum(a - p_x, 0.0)
        dist = tl.where(has_draft, dist, 0.0)
    resampled = tl.where(first_w < V, first_w, last_w)
    if NEXT_DRAFTS == 0:
        later = tl.where(first_p < V, first_p, last_p)
    elif NEXT_DRAFTS == 1:
        keep = has_draft & (u_acc < strict_a)
        later = tl.where(keep, x.to(tl.int32), resampled)
    else:
        if GREEDY:
            later = amax
        else:
            later = gidx

    nan = float("nan")
    out = pid
    tl.store(ent_ptr + out, tl.where(bad, nan, h))
    tl.store(tvd_ptr + out, tl.where(bad, nan, tvd))
    tl.store(acc_ptr + out, tl.where(bad, nan, a))
    tl.store(dist_ptr + out, tl.where(bad, nan, dist))
    stop = (~accepted & ~committed) | bad
    flags = (tl.where(bad, S_BAD_LOGITS, 0) | tl.where(bad_tok, S_BAD_TOKEN, 0)
             | tl.where(bad_q, S_BAD_PROBS, 0) | tl.where(committed & ~has_draft, S_MISSING, 0)
             | tl.where(stop, F_STOP, 0))
    tl.store(flags_ptr + out, flags.to(tl.int32))
    tl.store(res_ptr + out, resampled.to(tl.int32))
    tl.store(later_ptr + out, later.to(tl.int32))
