"""Register path: one program per (row, window position) holding the whole row in registers (V <= 16384).

The logits (both CFG halves, converted to fp32 right after the load) and the draft row q are read from HBM once;
mix, 1/T, top-k select, max, Z, p, H, TVD, a(x), the decision, the closed-form distortion, the resample / later draws
and the status bits are computed from registers. Top-k: the k-th largest z is found exactly by a 32-step bisection
over the order-preserving int32 image of the fp32 bits (count(z >= t) >= k); z >= threshold is kept (ties kept).
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
def position_kernel(
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
    offs = tl.arange(0, BLOCK_V)
    mask = offs < V
    NEG_INF: tl.constexpr = float("-inf")

    # ---- draft token, window bookkeeping
    x = tl.load(draft_ptr + b * s_db + i * s_dl).to(tl.int64)
    bad_tok = (x < -1) | (x >= V)
    x = tl.where(bad_tok, -1, x)
    has_draft = x >= 0
    committed = i < tl.load(start_ptr + b * s_start)

    # ---- target distribution (the only read of the logits)
    z = load_mix(logits_ptr + b * s_cb + i * s_cl, uncond_ptr + b * s_ub + i * s_ul, offs, mask,
                  cfg_scale, inv_t, HAS_UNCOND, GREEDY)
    bad = nonfinite(z, mask) > 0
    z = tl.where(bad, 0.0, z)
    z = tl.where(mask, z, NEG_INF)
    if GREEDY:
        amax = tl.argmax(z, 0, tie_break_left=True)
        p = tl.where(offs == amax, 1.0, 0.0)
    else:
        if TOP_K:
            key = order_key(z)
            lo = tl.full((), -2147483648, tl.int64)
            hi = tl.full((), 2147483647, tl.int64)
            for _ in range(32):
                mid = (lo + hi + 1) >> 1
                cnt = tl.sum((mask & (key >= mid.to(tl.int32))).to(tl.int32), 0)
                ok = cnt >= top_k
                lo = tl.where(ok, mid, lo)
                hi = tl.where(ok, hi, mid - 1)
            z = tl.where(mask & (key >= lo.to(tl.int32)), z, NEG_INF)
        m = tl.max(z, 0)
        e = tl.exp(z - m)
        p = e / tl.sum(e, 0)
    h = -tl.sum(p * tl.log(tl.where(p > 0, p, 1.0)), 0)

    # ---- draft distribution q (one-hot in registers when there is no draft_probs)
    if HAS_Q:
        q = tl.load(q_ptr + b * s_qb + i * s_ql + offs * s_qv, mask=mask, other=0.0).to(tl.float32)
        bad_q = tl.max((mask & ~((q >= 0.0) & (q < float("inf")))).to(tl.int32), 0) > 0
        q = tl.where(bad_q | ~mask, 0.0, q)
    else:
        bad_q = tl.full((), 0, tl.int1)
        q = tl.where(offs == x, 1.0, 0.0)
    tvd = 0.5 * tl.sum(tl.abs(p - q), 0)
    is_x = offs == x
    p_x = tl.sum(tl.where(is_x, p, 0.0), 0)
    q_x = tl.sum(tl.where(is_x, q, 0.0), 0)

    # ---- acceptance
    pos_ok = q_x > 0
    ratio = tl.where(pos_ok, p_x / tl.where(pos_ok, q_x, 1.0), 0.0)
    strict_a = tl.minimum(ratio, 1.0)
    if MODE_CSD:
        gate = tvd < tvd_threshold
        a = tl.minimum(tl.where(gate, tl.where(pos_ok, ratio + entropy_coef * h, 0.0), ratio), 1.0)
        # closed-form distortion: Σ_y max(q·a − min(p, q), 0)(y)   (0 in strict mode)
        if HAS_Q:
            gate_v = tvd < tvd_threshold
            qpos = q > 0
            rv = tl.where(qpos, p / tl.where(qpos, q, 1.0), 0.0)
            rv = tl.where(gate_v, tl.where(qpos, rv + entropy_coef * h, 0.0), rv)
            qa = q * tl.minimum(rv, 1.0)
            dist = tl.sum(tl.maximum(qa - tl.minimum(p, q), 0.0), 0)
        else:
            dist = tl.maximum(a - p_x, 0.0)
        dist = tl.where(has_draft, dist, 0.0)
    else:
        a = strict_a
        dist = tl.zeros_like(h)

    pos, row_id, k0, k1, u_acc, u_smp = position_rng(seed_ptr, seed_stride, positions_ptr, s_pos,
                                                      offset_ptr + b * offset_stride, b, i, PER_ROW_SEED)
    accepted = has_draft & (u_acc < a)

    # ---- resample: inverse CDF over the residual max(p − q, 0) (p when it sums to 0 or there is no draft)
    r = tl.maximum(p - q, 0.0)
    use_r = has_draft & (tl.sum(r, 0) > 0)
    w = tl.where(use_r, r, p)
    cdf, total = chunk_cdf(w, 0.0, offs, BLOCK_V)
    target = u_smp * total
    first = tl.min(tl.where(mask & (cdf > target), offs, BLOCK_V), 0)
    lastpos = tl.max(tl.where(w > 0, offs, -1), 0)
    resampled = tl.where(first < V, first, lastpos)

    # ---- the draw for positions after accept_len
    if NEXT_DRAFTS == 0:
        cdf_p, total_p = chunk_cdf(p, 0.0, offs, BLOCK_V)
        target_p = u_smp * total_p
        first_p = tl.min(tl.where(mask & (cdf_p > target_p), offs, BLOCK_V), 0)
        lastpos_p = tl.max(tl.where(p > 0, offs, -1), 0)
        later = tl.where(first_p < V, first_p, lastpos_p)
    elif NEXT_DRAFTS == 1:
        keep = has_draft & (u_acc < strict_a)
        later = tl.where(keep, x.to(tl.int32), resampled)
    else:
        if GREEDY:
            later = amax
        else:
            g = -tl.log(-tl.log(gumbel_uniforms(0, pos, row_id, k0, k1, BLOCK_V)))
            later = tl.argmax(z + g, 0, tie_break_left=True)

    # ---- per-position outputs
    nan = float("nan")
    out = pid
    tl.store(ent_ptr + out, tl.where(bad, nan, h))
    tl.store(tvd_ptr + out, tl.where(bad, nan, tvd))
    tl.store(acc_ptr + out, tl.where(bad, nan, a))
    tl.store(dist_ptr + out, tl.where(bad, nan, dist))
    if RETURN_PROBS:
        tl.store(probs_ptr + out * V + offs, tl.where(bad, nan, p), mask=mask)
    stop = (~accepted & ~committed) | bad
    flags = (tl.where(bad, S_BAD_LOGITS, 0) | tl.where(bad_tok, S_BAD_TOKEN, 0)
             | tl.where(bad_q, S_BAD_PROBS, 0) | tl.where(committed & ~has_draft, S_MISSING, 0)
             | tl.where(stop, F_STOP, 0))
    tl.store(flags_ptr + out, flags.to(tl.int32))
    tl.store(res_ptr + out, resampled.to(tl.int32))
    tl.store(later_ptr + out, later.to(tl.int32))
