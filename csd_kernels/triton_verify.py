"""Triton backend of CSD verification: one fused pass per (row, window position) plus a tiny per-row epilogue.

The maths is :mod:`csd_kernels.reference` (``verify(..., compute_dtype=torch.float32)``); this module only changes
*how* it is computed.

Design
------
Kernel 1, ``_position_kernel`` / ``_position_chunked_kernel``: grid ``(B·L,)``, one program per (row b, position i).

* ``V <= REGISTER_MAX_BLOCK`` (16384, covers the image-token vocabularies CFG decoding uses): ``BLOCK_V =
  next_power_of_2(V)`` and the whole row lives in registers.  The logits (both CFG halves, converted to fp32 right
  after the load) and the draft row q are read from HBM **once**; mix, 1/T, top-k select, max, Z, p, H, TVD, a(x),
  the accept decision, the closed-form distortion, the resample / later draws and the status bits are all computed
  from registers.  num_warps = 4 / 8 / 16 for BLOCK_V <= 1024 / 2048 / 16384 (sm_90 ptxas: no spill up to 4096,
  8 B at 8192, 128 B at 16384, 16 warps).
* ``V > REGISTER_MAX_BLOCK``: the row is streamed in ``CHUNK_V`` (4096, 16 warps) chunks, three sweeps (the first one reads
  HBM, sweeps 2 and 3 re-read the same row, which comes from L2 while it is resident):
  (1) non-finite check, online max / Z (or first argmax for T = 0), gumbel argmax;
  (2) p, H, TVD, p(x), q(x), the draft-probs check, and the running CDF totals of the residual and of p;
  (3) closed-form distortion and the two inverse-CDF searches (running prefix sums seeded by the chunk carries).
  With top_k, 32 more counting sweeps find the k-th largest logit first (bisection on the float bits).
  The CDF carries of sweep 2 and the prefix sums of sweep 3 are computed by the same code on the same data, so the
  target u·total and the searched CDF are consistent, exactly like the register path (which is the same code with
  a single chunk and carry 0).

Top-k: the k-th largest z is found exactly by a 32-step bisection over the order-preserving int32 image of the fp32
bits (count(z >= t) >= k), then z >= threshold is kept (ties kept), as ``reference.restrict_top_k``.

Kernel 2, ``_finalize_kernel``: grid ``(B,)``; accept_len = first stopping position, the token selection
(draft / resampled / later draw, 0 for flagged positions) and the per-row status OR.  Intermediate per-position
results go through three small int32 [B, L] scratch tensors.

Random numbers: Philox4x32-10 written here with uint32 ``tl.umulhi`` and wrapping ``tl.mul`` (bit-identical to
``reference.philox4x32``); seeds and the offset (one shared or one per row) are read inside the kernel from device
tensors, so the launcher never
synchronises with the device (CUDA-graph safe).  FMA contraction is disabled (``enable_fp_fusion=False``) so the
fp32 mix ``u + s·(c − u)`` rounds as in the reference.
"""

from __future__ import annotations

import os
import struct
from typing import Optional

import torch

from . import reference as ref

try:  # pragma: no cover - exercised by whichever environment imports us
    import triton
    import triton.language as tl

    _TRITON_ERROR: Optional[str] = None
except Exception as exc:  # pragma: no cover
    triton = None
    tl = None
    _TRITON_ERROR = f"{type(exc).__name__}: {exc}"

_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"

REGISTER_MAX_BLOCK = 16384  # largest V kept entirely in registers (one HBM read)
CHUNK_V = 4096  # chunk of the multi-sweep path for larger V

__all__ = ["verify_triton", "is_available", "REGISTER_MAX_BLOCK", "CHUNK_V"]


def is_available(device) -> tuple[bool, str]:
    """(usable, reason) for tensors on ``device``; reason is "" when usable, else how to make it usable."""
    if triton is None:
        return False, f"triton is not importable ({_TRITON_ERROR}); install triton"
    device = torch.device(device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            return False, "torch.cuda is not available; use a CUDA build of torch with a GPU"
        return True, "triton on CUDA"
    if device.type == "cpu":
        if _INTERPRET:
            return True, ""
        return False, "CPU tensors need the Triton interpreter: set TRITON_INTERPRET=1 before importing triton/csd_kernels"
    return False, f"device type {device.type!r} is not supported by the triton backend"


if triton is not None:
    _M0 = tl.constexpr(ref.PHILOX_M0)
    _M1 = tl.constexpr(ref.PHILOX_M1)
    _W0 = tl.constexpr(ref.PHILOX_W0)
    _W1 = tl.constexpr(ref.PHILOX_W1)
    _TAG = tl.constexpr(ref.GUMBEL_STREAM_TAG)
    _S_BAD_LOGITS = tl.constexpr(ref.STATUS_BAD_LOGITS)
    _S_BAD_TOKEN = tl.constexpr(ref.STATUS_BAD_DRAFT_TOKEN)
    _S_BAD_PROBS = tl.constexpr(ref.STATUS_BAD_DRAFT_PROBS)
    _S_MISSING = tl.constexpr(ref.STATUS_MISSING_COMMITTED_TOKEN)
    _F_STOP = tl.constexpr(16)  # flag bit (scratch only): this position ends the accepted prefix
    _STATUS_MASK = tl.constexpr(15)

    # ----------------------------------------------------------------------------------------------------------------
    # Philox4x32-10 and the two streams
    # ----------------------------------------------------------------------------------------------------------------
    @triton.jit
    def _philox(c0, c1, c2, c3, k0, k1):
        """Philox4x32-10 on uint32 values (same broadcast shape in, four words out)."""
        for _ in tl.static_range(10):
            hi0 = tl.umulhi(c0, _M0)
            lo0 = tl.mul(c0, _M0, sanitize_overflow=False)
            hi1 = tl.umulhi(c2, _M1)
            lo1 = tl.mul(c2, _M1, sanitize_overflow=False)
            n0 = hi1 ^ c1 ^ k0
            n2 = hi0 ^ c3 ^ k1
            c0 = n0
            c1 = lo1
            c2 = n2
            c3 = lo0
            k0 = tl.add(k0, _W0, sanitize_overflow=False)
            k1 = tl.add(k1, _W1, sanitize_overflow=False)
        return c0, c1, c2, c3

    @triton.jit
    def _uniform(bits):
        """uint32 word -> ((x >> 9) + 0.5)·2^-23, exact in fp32, in (0, 1)."""
        return ((bits >> 9).to(tl.float32) + 0.5) * 1.1920928955078125e-07

    @triton.jit
    def _row_key(seed_ptr, seed_stride, b, PER_ROW_SEED: tl.constexpr):
        """(k0, k1, row_id) as uint32 scalars for row b (see reference._seed_key)."""
        s = tl.load(seed_ptr + b * seed_stride)
        k0 = (s & 0xFFFFFFFF).to(tl.uint32)
        k1 = ((s >> 32) & 0xFFFFFFFF).to(tl.uint32)
        if PER_ROW_SEED:
            row_id = tl.zeros_like(k0)
        else:
            row_id = (b & 0xFFFFFFFF).to(tl.uint32)
        return k0, k1, row_id

    @triton.jit
    def _step_uniforms(pos, row_id, offset_ptr, k0, k1):
        """(u_accept, u_sample) of the step stream at absolute position ``pos`` (uint32 scalar)."""
        off = tl.load(offset_ptr)
        off_lo = (off & 0xFFFFFFFF).to(tl.uint32)
        off_hi = ((off >> 32) & 0xFFFFFFFF).to(tl.uint32)
        w0, w1, _w2, _w3 = _philox(pos, row_id, off_lo, off_hi, k0, k1)
        return _uniform(w0), _uniform(w1)

    @triton.jit
    def _position_rng(seed_ptr, seed_stride, positions_ptr, s_pos, offset_ptr, b, i, PER_ROW_SEED: tl.constexpr):
        """Key, counter words and step uniforms of window position i of row b: (pos, row_id, k0, k1, u_acc, u_smp)."""
        k0, k1, row_id = _row_key(seed_ptr, seed_stride, b, PER_ROW_SEED)
        pos = ((tl.load(positions_ptr + b * s_pos).to(tl.int64) + i) & 0xFFFFFFFF).to(tl.uint32)
        u_acc, u_smp = _step_uniforms(pos, row_id, offset_ptr, k0, k1)
        return pos, row_id, k0, k1, u_acc, u_smp

    @triton.jit
    def _gumbel_uniforms(v0, pos, row_id, k0, k1, BLOCK: tl.constexpr):
        """Uniforms of the gumbel stream for tokens v0 .. v0 + BLOCK - 1 (v0 a multiple of 4): one Philox call per 4."""
        grp = (tl.arange(0, BLOCK // 4) + v0 // 4).to(tl.uint32)
        zero = tl.zeros_like(grp)
        l0, l1, l2, l3 = _philox(grp, zero + pos, zero + row_id, zero + _TAG, zero + k0, zero + k1)
        bits = tl.reshape(tl.join(tl.join(l0, l2), tl.join(l1, l3)), [BLOCK])
        return _uniform(bits)

    # ----------------------------------------------------------------------------------------------------------------
    # Shared per-chunk helpers
    # ----------------------------------------------------------------------------------------------------------------
    @triton.jit
    def _load_mix(c_row, u_row, offs, mask, cfg_scale, inv_t, HAS_UNCOND: tl.constexpr, GREEDY: tl.constexpr):
        """z = (u + s·(c − u))·(1/T) in fp32 (unscaled for T = 0); masked lanes hold 0."""
        z = tl.load(c_row + offs, mask=mask, other=0.0).to(tl.float32)
        if HAS_UNCOND:
            u = tl.load(u_row + offs, mask=mask, other=0.0).to(tl.float32)
            z = u + cfg_scale * (z - u)
        if not GREEDY:
            z = z * inv_t
        return z

    @triton.jit
    def _nonfinite(x, mask):
        """1 if any unmasked element of x is NaN or ±Inf, else 0 (int32 scalar)."""
        bad = mask & ~(tl.abs(x) < float("inf"))
        return tl.max(bad.to(tl.int32), 0)

    @triton.jit
    def _order_key(z):
        """Order-preserving int32 image of fp32 z (−0 mapped to +0 so ties compare as in torch)."""
        bits = tl.where(z == 0.0, 0.0, z).to(tl.int32, bitcast=True)
        return tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)

    @triton.jit
    def _chunk_cdf(w, carry, offs, BLOCK: tl.constexpr):
        """Running CDF of one chunk seeded by ``carry`` and the carry for the next chunk (its last CDF value)."""
        cdf = carry + tl.cumsum(w, 0)
        last = tl.sum(tl.where(offs == BLOCK - 1, cdf, 0.0), 0)
        return cdf, last

    # ----------------------------------------------------------------------------------------------------------------
    # Kernel 1a: whole row in registers
    # ----------------------------------------------------------------------------------------------------------------
    @triton.jit
    def _position_kernel(
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
        z = _load_mix(logits_ptr + b * s_cb + i * s_cl, uncond_ptr + b * s_ub + i * s_ul, offs, mask,
                      cfg_scale, inv_t, HAS_UNCOND, GREEDY)
        bad = _nonfinite(z, mask) > 0
        z = tl.where(bad, 0.0, z)
        z = tl.where(mask, z, NEG_INF)
        if GREEDY:
            amax = tl.argmax(z, 0, tie_break_left=True)
            p = tl.where(offs == amax, 1.0, 0.0)
        else:
            if TOP_K:
                key = _order_key(z)
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

        pos, row_id, k0, k1, u_acc, u_smp = _position_rng(seed_ptr, seed_stride, positions_ptr, s_pos,
                                                          offset_ptr + b * offset_stride, b, i, PER_ROW_SEED)
        accepted = has_draft & (u_acc < a)

        # ---- resample: inverse CDF over the residual max(p − q, 0) (p when it sums to 0 or there is no draft)
        r = tl.maximum(p - q, 0.0)
        use_r = has_draft & (tl.sum(r, 0) > 0)
        w = tl.where(use_r, r, p)
        cdf, total = _chunk_cdf(w, 0.0, offs, BLOCK_V)
        target = u_smp * total
        first = tl.min(tl.where(mask & (cdf > target), offs, BLOCK_V), 0)
        lastpos = tl.max(tl.where(w > 0, offs, -1), 0)
        resampled = tl.where(first < V, first, lastpos)

        # ---- the draw for positions after accept_len
        if NEXT_DRAFTS == 0:
            cdf_p, total_p = _chunk_cdf(p, 0.0, offs, BLOCK_V)
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
                g = -tl.log(-tl.log(_gumbel_uniforms(0, pos, row_id, k0, k1, BLOCK_V)))
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
        flags = (tl.where(bad, _S_BAD_LOGITS, 0) | tl.where(bad_tok, _S_BAD_TOKEN, 0)
                 | tl.where(bad_q, _S_BAD_PROBS, 0) | tl.where(committed & ~has_draft, _S_MISSING, 0)
                 | tl.where(stop, _F_STOP, 0))
        tl.store(flags_ptr + out, flags.to(tl.int32))
        tl.store(res_ptr + out, resampled.to(tl.int32))
        tl.store(later_ptr + out, later.to(tl.int32))

    # ----------------------------------------------------------------------------------------------------------------
    # Kernel 1b: chunked multi-sweep fallback for large V
    # ----------------------------------------------------------------------------------------------------------------
    @triton.jit
    def _position_chunked_kernel(
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
        pos, row_id, k0, k1, u_acc, u_smp = _position_rng(seed_ptr, seed_stride, positions_ptr, s_pos,
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
                        z = _load_mix(c_row, u_row, offs, mask, cfg_scale, inv_t, HAS_UNCOND, GREEDY)
                        cnt += tl.sum((mask & (_order_key(z) >= mid.to(tl.int32))).to(tl.int32), 0)
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
            z = _load_mix(c_row, u_row, offs, mask, cfg_scale, inv_t, HAS_UNCOND, GREEDY)
            badi = tl.maximum(badi, _nonfinite(z, mask))
            z = tl.where(mask, z, NEG_INF)
            if TOP_K:
                if not GREEDY:
                    z = tl.where(_order_key(z) >= thr.to(tl.int32), z, NEG_INF)
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
                    g = -tl.log(-tl.log(_gumbel_uniforms(v0, pos, row_id, k0, k1, BLOCK_V)))
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
                z = _load_mix(c_row, u_row, offs, mask, cfg_scale, inv_t, HAS_UNCOND, GREEDY)
                z = tl.where(mask, z, NEG_INF)
                if TOP_K:
                    z = tl.where(_order_key(z) >= thr.to(tl.int32), z, NEG_INF)
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
            _cr, carry_r = _chunk_cdf(tl.maximum(p - q, 0.0), carry_r, lane, BLOCK_V)
            _cp, carry_p = _chunk_cdf(p, carry_p, lane, BLOCK_V)
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
                z = _load_mix(c_row, u_row, offs, mask, cfg_scale, inv_t, HAS_UNCOND, GREEDY)
                z = tl.where(mask, z, NEG_INF)
                if TOP_K:
                    z = tl.where(_order_key(z) >= thr.to(tl.int32), z, NEG_INF)
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
            cdf_w, cw = _chunk_cdf(w, cw, lane, BLOCK_V)
            hit = tl.min(tl.where(mask & (cdf_w > target_w), offs, 2147483647), 0).to(tl.int32)
            first_w = tl.minimum(first_w, hit)
            last_w = tl.maximum(last_w, tl.max(tl.where(w > 0, offs, -1), 0).to(tl.int32))
            if NEXT_DRAFTS == 0:
                cdf_p, cpp = _chunk_cdf(p, cpp, lane, BLOCK_V)
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
        flags = (tl.where(bad, _S_BAD_LOGITS, 0) | tl.where(bad_tok, _S_BAD_TOKEN, 0)
                 | tl.where(bad_q, _S_BAD_PROBS, 0) | tl.where(committed & ~has_draft, _S_MISSING, 0)
                 | tl.where(stop, _F_STOP, 0))
        tl.store(flags_ptr + out, flags.to(tl.int32))
        tl.store(res_ptr + out, resampled.to(tl.int32))
        tl.store(later_ptr + out, later.to(tl.int32))

    # ----------------------------------------------------------------------------------------------------------------
    # Kernel 2: per-row epilogue
    # ----------------------------------------------------------------------------------------------------------------
    @triton.jit
    def _finalize_kernel(
        draft_ptr, s_db, s_dl, res_ptr, later_ptr, flags_ptr,
        tokens_ptr, accept_len_ptr, status_ptr, L, V, BLOCK_L: tl.constexpr,
    ):
        b = tl.program_id(0).to(tl.int64)
        offs = tl.arange(0, BLOCK_L)
        mask = offs < L
        flags = tl.load(flags_ptr + b * L + offs, mask=mask, other=0)
        stop = mask & ((flags & _F_STOP) != 0)
        accept_len = tl.min(tl.where(stop, offs, L), 0)
        x = tl.load(draft_ptr + b * s_db + offs * s_dl, mask=mask, other=-1).to(tl.int64)
        x = tl.where((x < -1) | (x >= V), -1, x)
        res = tl.load(res_ptr + b * L + offs, mask=mask, other=0).to(tl.int64)
        later = tl.load(later_ptr + b * L + offs, mask=mask, other=0).to(tl.int64)
        tok = tl.where(offs < accept_len, x, later)
        tok = tl.where(offs == accept_len, res, tok)
        tok = tl.where(((flags & _S_BAD_LOGITS) != 0) | (tok < 0) | (tok >= V), 0, tok)
        tl.store(tokens_ptr + b * L + offs, tok, mask=mask)
        status = tl.zeros((), tl.int32)
        for bit in tl.static_range(4):
            status |= tl.max(((flags >> bit) & 1), 0) << bit
        tl.store(accept_len_ptr + b, accept_len.to(tl.int32))
        tl.store(status_ptr + b, status)


def _fp32(value: float) -> float:
    try:
        return struct.unpack("f", struct.pack("f", value))[0]
    except OverflowError:
        return float("inf") if value > 0 else float("-inf")


def num_warps(block: int) -> int:
    # From `ptxas -v` for sm_90a on the heaviest variant (CFG + q + top-k + csd + gumbel): no spills up to 4096
    # (<= 111 registers), 8 B of spill at 8192 and 128 B at 16384 (128 registers, 16 warps).
    if block <= 1024:
        return 4
    if block <= 2048:
        return 8
    return 16


def pick_kernel(vocab: int):
    """(position kernel, BLOCK_V) the launcher uses for a vocabulary of ``vocab`` tokens."""
    if triton.next_power_of_2(vocab) <= REGISTER_MAX_BLOCK:
        return _position_kernel, max(16, triton.next_power_of_2(vocab))
    return _position_chunked_kernel, CHUNK_V


def verify_triton(
    target_logits: torch.Tensor,
    draft_tokens: torch.Tensor,
    draft_probs: Optional[torch.Tensor],
    uncond_logits: Optional[torch.Tensor],
    cfg_scale: float,
    temperature: float,
    top_k: int,
    mode: int,
    entropy_coef: float,
    tvd_threshold: float,
    start: torch.Tensor,
    next_drafts: int,
    positions: torch.Tensor,
    seed: torch.Tensor,
    offset: torch.Tensor,
    return_probs: bool,
):
    """Triton verification step on validated arguments (see module docstring); no host synchronisation.

    Returns (accept_len int32 [B], tokens int64 [B, L], probs float32 [B, L, V] or an empty (0,) tensor,
    entropy, tvd, accept_prob, distortion float32 [B, L], status int32 [B]).
    """
    if triton is None:  # pragma: no cover
        raise RuntimeError(f"triton is not importable ({_TRITON_ERROR})")
    B, L, V = target_logits.shape
    device = target_logits.device
    f32 = dict(dtype=torch.float32, device=device)
    i32 = dict(dtype=torch.int32, device=device)

    probs = torch.empty((B, L, V) if return_probs else (0,), **f32)
    ent = torch.empty((B, L), **f32)
    tvd = torch.empty((B, L), **f32)
    acc = torch.empty((B, L), **f32)
    dist = torch.empty((B, L), **f32)
    res = torch.empty((B, L), **i32)
    later = torch.empty((B, L), **i32)
    flags = torch.empty((B, L), **i32)
    tokens = torch.empty((B, L), dtype=torch.int64, device=device)
    accept_len = torch.empty((B,), **i32)
    status = torch.empty((B,), **i32)
    if B * L == 0:
        accept_len.fill_(L)
        status.zero_()
        return accept_len, tokens, probs, ent, tvd, acc, dist, status

    has_uncond = uncond_logits is not None
    unc = uncond_logits if has_uncond else target_logits
    has_q = draft_probs is not None
    qt = draft_probs if has_q else ent  # dummy pointer, never read
    q_strides = (draft_probs.stride(0), draft_probs.stride(1), draft_probs.stride(2)) if has_q else (0, 0, 0)
    seed = seed.reshape(-1)
    offset = offset.reshape(-1)
    per_row_seed = seed.numel() != 1
    greedy = temperature == 0
    inv_t = _fp32(1.0 / temperature) if not greedy else 1.0  # 1/T rounded to fp32 once, as the reference
    use_top_k = (not greedy) and 0 < top_k < V
    positions = positions.reshape(-1)
    start = start.reshape(-1)

    kernel, block = pick_kernel(V)
    kernel[(B * L,)](
        target_logits, target_logits.stride(0), target_logits.stride(1),
        unc, unc.stride(0), unc.stride(1),
        qt, *q_strides,
        draft_tokens, draft_tokens.stride(0), draft_tokens.stride(1),
        start, start.stride(0), positions, positions.stride(0),
        seed, seed.stride(0) if per_row_seed else 0, offset, offset.stride(0) if offset.numel() != 1 else 0,
        probs, ent, tvd, acc, dist,
        res, later, flags,
        L, V, float(cfg_scale), inv_t, int(top_k), float(entropy_coef), float(tvd_threshold),
        HAS_UNCOND=has_uncond, HAS_Q=has_q, GREEDY=greedy, TOP_K=use_top_k,
        MODE_CSD=int(mode) == 1, NEXT_DRAFTS=int(next_drafts), RETURN_PROBS=bool(return_probs),
        PER_ROW_SEED=per_row_seed, BLOCK_V=block,
        num_warps=num_warps(block), enable_fp_fusion=False,
    )
    _finalize_kernel[(B,)](
        draft_tokens, draft_tokens.stride(0), draft_tokens.stride(1), res, later, flags,
        tokens, accept_len, status, L, V, BLOCK_L=max(16, triton.next_power_of_2(L)),
        num_warps=1,
    )
    return accept_len, tokens, probs, ent, tvd, acc, dist, status
