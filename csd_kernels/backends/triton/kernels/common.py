"""Pieces every Triton verification kernel shares: Philox4x32-10 and the two random streams, the CFG mix, the
window bookkeeping, the per-position stores and the per-row epilogue (the acceptance rules: rules.py).

Philox is written with uint32 ``tl.umulhi`` and wrapping ``tl.mul``, bit-identical to ``reference.philox4x32``.
Seeds and offsets are read inside the kernels from device tensors, so no launcher synchronises with the device.

Kernel parameters, named alike in every path:

* ``logits_ptr`` / ``uncond_ptr`` / ``q_ptr`` / ``draft_ptr``: target logits, unconditional logits, draft
  probabilities q, draft tokens; ``s_<t><d>`` is the stride of tensor t (c = logits, u = uncond, q, d = drafts) along
  dim d (b = row, l = window position, v = vocabulary). ``start_ptr``/``positions_ptr`` [B] with strides ``s_start``
  /``s_pos``; ``seed_ptr``/``offset_ptr`` [1] or [B] with ``seed_stride``/``offset_stride`` (0 when shared), or
  with ``SEED_VALUE``/``OFFSET_VALUE`` the int64 word itself (an eager call's int: no fill kernel; these two
  parameters are never specialized on their value, so one compiled kernel serves every seed and offset).
* outputs ``probs_ptr`` [B, L, V], ``ent_ptr``/``tvd_ptr``/``acc_ptr``/``dist_ptr`` [B, L]; per-position scratch
  ``res_ptr`` (resampled token), ``later_ptr`` (the draw for positions after accept_len), ``flags_ptr`` (status bits
  and F_STOP) [B, L] int32, read by the row epilogue.
* scalars ``L``, ``V``, ``cfg_scale``, ``inv_t`` (1/T rounded to fp32), ``top_k``, ``rule_p0``, ``rule_p1`` (the
  rule's parameters, rules.py); constexpr switches ``HAS_UNCOND``, ``HAS_Q``, ``GREEDY`` (T = 0), ``TOP_K``,
  ``RULE`` (a code of config/acceptance.py's table, rules.py),
  ``COUPLING`` (INDEPENDENT / MAXIMAL / GUMBEL), ``RETURN_PROBS``, ``PER_ROW_SEED``, ``BLOCK_V``, ``SEED_VALUE``,
  ``OFFSET_VALUE``.
"""

import triton
import triton.language as tl

from .... import reference as ref
from ..interpreter_compat import squeeze_scalar_index

squeeze_scalar_index()  # runtime loop bounds under older Triton interpreters with numpy >= 2.4 (see there)

M0 = tl.constexpr(ref.PHILOX_M0)
M1 = tl.constexpr(ref.PHILOX_M1)
W0 = tl.constexpr(ref.PHILOX_W0)
W1 = tl.constexpr(ref.PHILOX_W1)
TAG = tl.constexpr(ref.GUMBEL_STREAM_TAG)
S_BAD_LOGITS = tl.constexpr(ref.STATUS_BAD_LOGITS)
S_BAD_TOKEN = tl.constexpr(ref.STATUS_BAD_DRAFT_TOKEN)
S_BAD_PROBS = tl.constexpr(ref.STATUS_BAD_DRAFT_PROBS)
S_MISSING = tl.constexpr(ref.STATUS_MISSING_COMMITTED_TOKEN)
PROB_SUM_TOLERANCE = tl.constexpr(ref.PROB_SUM_TOLERANCE)
F_STOP = tl.constexpr(16)  # flag bit (scratch only): this position ends the accepted prefix
INDEPENDENT = tl.constexpr(ref.COUPLINGS.index("independent"))
MAXIMAL = tl.constexpr(ref.COUPLINGS.index("maximal"))
GUMBEL = tl.constexpr(ref.COUPLINGS.index("gumbel"))


# ----------------------------------------------------------------------------------------------------------------
# Philox4x32-10 and the two streams
# ----------------------------------------------------------------------------------------------------------------
@triton.jit
def philox(c0, c1, c2, c3, k0, k1):
    """Philox4x32-10 on uint32 values (same broadcast shape in, four words out)."""
    for _ in tl.static_range(10):
        hi0 = tl.umulhi(c0, M0)
        lo0 = tl.mul(c0, M0, sanitize_overflow=False)
        hi1 = tl.umulhi(c2, M1)
        lo1 = tl.mul(c2, M1, sanitize_overflow=False)
        n0 = hi1 ^ c1 ^ k0
        n2 = hi0 ^ c3 ^ k1
        c0 = n0
        c1 = lo1
        c2 = n2
        c3 = lo0
        k0 = tl.add(k0, W0, sanitize_overflow=False)
        k1 = tl.add(k1, W1, sanitize_overflow=False)
    return c0, c1, c2, c3

@triton.jit
def uniform(bits):
    """uint32 word -> ((x >> 9) + 0.5)·2^-23, exact in fp32, in (0, 1)."""
    return ((bits >> 9).to(tl.float32) + 0.5) * 1.1920928955078125e-07

@triton.jit
def row_key(seed_ptr, seed_stride, b, PER_ROW_SEED: tl.constexpr, SEED_VALUE: tl.constexpr = False):
    """(k0, k1, row_id) as uint32 scalars for row b (see reference._seed_key)."""
    if SEED_VALUE:  # the seed's signed int64 bit pattern itself (an i32 when it fits: sign-extends to the same)
        s = seed_ptr.to(tl.int64)
    else:
        s = tl.load(seed_ptr + b * seed_stride)
    k0 = (s & 0xFFFFFFFF).to(tl.uint32)
    k1 = ((s >> 32) & 0xFFFFFFFF).to(tl.uint32)
    if PER_ROW_SEED:
        row_id = tl.zeros_like(k0)
    else:
        row_id = (b & 0xFFFFFFFF).to(tl.uint32)
    return k0, k1, row_id

@triton.jit
def step_uniforms(pos, row_id, offset_ptr, k0, k1, OFFSET_VALUE: tl.constexpr = False):
    """(u_accept, u_sample) of the step stream at absolute position ``pos`` (uint32 scalar)."""
    if OFFSET_VALUE:  # the offset itself, as for SEED_VALUE
        off = offset_ptr.to(tl.int64)
    else:
        off = tl.load(offset_ptr)
    off_lo = (off & 0xFFFFFFFF).to(tl.uint32)
    off_hi = ((off >> 32) & 0xFFFFFFFF).to(tl.uint32)
    w0, w1, _w2, _w3 = philox(pos, row_id, off_lo, off_hi, k0, k1)
    return uniform(w0), uniform(w1)

@triton.jit
def position_rng(seed_ptr, seed_stride, positions_ptr, s_pos, offset_ptr, b, i, PER_ROW_SEED: tl.constexpr,
                 SEED_VALUE: tl.constexpr = False, OFFSET_VALUE: tl.constexpr = False):
    """Key, counter words and step uniforms of window position i of row b: (pos, row_id, k0, k1, u_acc, u_smp)."""
    k0, k1, row_id = row_key(seed_ptr, seed_stride, b, PER_ROW_SEED, SEED_VALUE)
    pos = ((tl.load(positions_ptr + b * s_pos).to(tl.int64) + i) & 0xFFFFFFFF).to(tl.uint32)
    u_acc, u_smp = step_uniforms(pos, row_id, offset_ptr, k0, k1, OFFSET_VALUE)
    return pos, row_id, k0, k1, u_acc, u_smp

@triton.jit
def gumbel_uniforms(v0, pos, row_id, k0, k1, BLOCK: tl.constexpr):
    """Uniforms of the gumbel stream for tokens v0 .. v0 + BLOCK - 1 (v0 a multiple of 4): one Philox call per 4."""
    grp = (tl.arange(0, BLOCK // 4) + v0 // 4).to(tl.uint32)
    zero = tl.zeros_like(grp)
    l0, l1, l2, l3 = philox(grp, zero + pos, zero + row_id, zero + TAG, zero + k0, zero + k1)
    bits = tl.reshape(tl.join(tl.join(l0, l2), tl.join(l1, l3)), [BLOCK])
    return uniform(bits)


# ----------------------------------------------------------------------------------------------------------------
# Shared per-chunk helpers
# ----------------------------------------------------------------------------------------------------------------
@triton.jit
def _mix(c_row, u_row, offs, mask, cfg_scale, inv_t, HAS_UNCOND: tl.constexpr, GREEDY: tl.constexpr):
    """Elementwise (z, bad) of :func:`load_mix_flagged` (any shape of offs, scalars included)."""
    c = tl.load(c_row + offs, mask=mask, other=0.0).to(tl.float32)
    masked = c == float("-inf")
    bad = ~(c < float("inf"))
    z = c
    if HAS_UNCOND:
        u = tl.load(u_row + offs, mask=mask, other=0.0).to(tl.float32)
        masked = masked | (u == float("-inf"))
        bad = bad | ~(u < float("inf"))
        z = u + cfg_scale * (c - u)
    if not GREEDY:
        z = z * inv_t
    bad = bad | (~masked & ~(tl.abs(z) < float("inf")))
    return tl.where(masked, float("-inf"), z), mask & bad


@triton.jit
def load_mix_flagged(c_row, u_row, offs, mask, cfg_scale, inv_t, HAS_UNCOND: tl.constexpr, GREEDY: tl.constexpr):
    """(z, bad): z = (u + s·(c − u))·(1/T) in fp32 (unscaled for T = 0), −inf where c or u is −inf (a masked token);
    bad = 1 if a lane of ``mask`` holds NaN or +inf in c or u, or a mix that overflows (int32 scalar). Lanes outside
    ``mask`` hold 0."""
    z, bad = _mix(c_row, u_row, offs, mask, cfg_scale, inv_t, HAS_UNCOND, GREEDY)
    return z, tl.max(bad.to(tl.int32), 0)


@triton.jit
def load_mix(c_row, u_row, offs, mask, cfg_scale, inv_t, HAS_UNCOND: tl.constexpr, GREEDY: tl.constexpr):
    """z of :func:`load_mix_flagged` without the flag."""
    z, _bad = _mix(c_row, u_row, offs, mask, cfg_scale, inv_t, HAS_UNCOND, GREEDY)
    return z


@triton.jit
def load_probs(w_row, offs, mask):
    """(w, bad): target probabilities (0 outside ``mask``); bad = 1 if a lane is negative or not finite."""
    w = tl.load(w_row + offs, mask=mask, other=0.0).to(tl.float32)
    return w, tl.max((mask & ~((w >= 0.0) & (w < float("inf")))).to(tl.int32), 0)


@triton.jit
def load_prob(w_row, offs, mask):
    """w at scalar (or any-shaped) offsets, without the reduction of :func:`load_probs`."""
    return tl.load(w_row + offs, mask=mask, other=0.0).to(tl.float32)


@triton.jit
def log_or_minus_inf(w):
    """ln w, −inf where w = 0 (the z of target probabilities, for the gumbel coupling and the support)."""
    return tl.where(w > 0, tl.log(tl.where(w > 0, w, 1.0)), float("-inf"))


@triton.jit
def top_p_key(z, e, mask, top_p):
    """The order key of top-p (reference.restrict_top_p): the largest t with Σ_{key ≥ t} e ≥ top_p·Σ e, by a 32-step
    bisection (e = exp(z − max z), 0 outside the current support); z is kept where its key is >= t."""
    key = order_key(z)
    limit = top_p * tl.sum(tl.where(mask, e, 0.0), 0)
    lo = tl.full((), -2147483648, tl.int64)
    hi = tl.full((), 2147483647, tl.int64)
    for _ in range(32):
        mid = (lo + hi + 1) >> 1
        ok = tl.sum(tl.where(mask & (key >= mid.to(tl.int32)), e, 0.0), 0) >= limit
        lo = tl.where(ok, mid, lo)
        hi = tl.where(ok, hi, mid - 1)
    return lo

@triton.jit
def nonfinite(x, mask):
    """1 if any unmasked element of x is NaN or ±Inf, else 0 (int32 scalar)."""
    bad = mask & ~(tl.abs(x) < float("inf"))
    return tl.max(bad.to(tl.int32), 0)

@triton.jit
def order_key(z):
    """Order-preserving int32 image of fp32 z (−0 mapped to +0 so ties compare as in torch)."""
    bits = tl.where(z == 0.0, 0.0, z).to(tl.int32, bitcast=True)
    return tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)

@triton.jit
def chunk_lanes(v0, lane, V):
    """(offsets, in-vocabulary mask) of the chunk that starts at v0."""
    offs = v0 + lane
    return offs, offs < V


@triton.jit
def chunk_cdf(w, carry, offs, BLOCK: tl.constexpr):
    """Running CDF of one chunk seeded by ``carry`` and the carry for the next chunk (its last CDF value)."""
    cdf = carry + tl.cumsum(w, 0)
    last = tl.sum(tl.where(offs == BLOCK - 1, cdf, 0.0), 0)
    return cdf, last


# ----------------------------------------------------------------------------------------------------------------
# One window position: its draft, its outputs
# ----------------------------------------------------------------------------------------------------------------
@triton.jit
def window_draft(draft_ptr, s_db, s_dl, start_ptr, s_start, b, i, V):
    """(x, bad_tok, has_draft, committed) of window position i of row b; x is -1 without a usable draft."""
    x = tl.load(draft_ptr + b * s_db + i * s_dl).to(tl.int64)
    bad_tok = (x < -1) | (x >= V)
    x = tl.where(bad_tok, -1, x)
    committed = i < tl.load(start_ptr + b * s_start)
    return x, bad_tok, x >= 0, committed


@triton.jit
def inverse_cdf(w, offs, mask, u, V, BLOCK: tl.constexpr):
    """First index whose running sum of w passes u·Σw (the last positive weight if rounding overshoots)."""
    cdf, total = chunk_cdf(w, 0.0, offs, BLOCK)
    first = tl.min(tl.where(mask & (cdf > u * total), offs, BLOCK), 0)
    return tl.where(first < V, first, tl.max(tl.where(w > 0, offs, -1), 0))


@triton.jit
def store_position(out, bad, bad_tok, bad_q, committed, has_draft, accepted, h, tvd, a, dist, resampled, later,
                   ent_ptr, tvd_ptr, acc_ptr, dist_ptr, res_ptr, later_ptr, flags_ptr):
    """The statistics (NaN where the logits were bad), the status flags and both draws of position ``out``."""
    nan = float("nan")
    tl.store(ent_ptr + out, tl.where(bad, nan, h))
    tl.store(tvd_ptr + out, tl.where(bad, nan, tvd))
    tl.store(acc_ptr + out, tl.where(bad, nan, a))
    tl.store(dist_ptr + out, tl.where(bad, nan, dist))
    stop = (~accepted & ~committed) | bad
    flags = (tl.where(bad, S_BAD_LOGITS, 0) | tl.where(bad_tok, S_BAD_TOKEN, 0)
             | tl.where(bad_q & has_draft, S_BAD_PROBS, 0) | tl.where(committed & ~has_draft, S_MISSING, 0)
             | tl.where(stop, F_STOP, 0))
    tl.store(flags_ptr + out, flags.to(tl.int32))
    tl.store(res_ptr + out, resampled.to(tl.int32))
    tl.store(later_ptr + out, later.to(tl.int32))


# ----------------------------------------------------------------------------------------------------------------
# Per-row epilogue
# ----------------------------------------------------------------------------------------------------------------
@triton.jit
def first_stop(flags_ptr, L):
    """The first of a row's L positions whose flags (written by an earlier launch) hold F_STOP, L if none: the
    row's accept_len."""
    lane = tl.arange(0, 16)
    first = tl.zeros((), tl.int32) + L
    for i0 in range(0, L, 16):
        offs = i0 + lane
        flags = tl.load(flags_ptr + offs, mask=offs < L, other=0)
        first = tl.minimum(first, tl.min(tl.where((flags & F_STOP) != 0, offs, L), 0))
    return first


@triton.jit
def row_epilogue(b, draft_ptr, s_db, s_dl, res_ptr, later_ptr, flags_ptr, tokens_ptr, accept_len_ptr, status_ptr, L, V,
                 BLOCK_L: tl.constexpr):
    """Row b from its positions' scratch: accept_len = the first stopping position; tokens = the drafts before it,
    the resample at it, the later draws after it (0 where the logits were bad); status = OR of the input flags.

    The scratch is read through L2 (``.cg``): in the split path other programs wrote it during this launch.
    """
    offs = tl.arange(0, BLOCK_L)
    mask = offs < L
    flags = tl.load(flags_ptr + b * L + offs, mask=mask, other=0, cache_modifier=".cg")
    stop = mask & ((flags & F_STOP) != 0)
    accept_len = tl.min(tl.where(stop, offs, L), 0)
    x = tl.load(draft_ptr + b * s_db + offs * s_dl, mask=mask, other=-1).to(tl.int64)
    x = tl.where((x < -1) | (x >= V), -1, x)
    res = tl.load(res_ptr + b * L + offs, mask=mask, other=0, cache_modifier=".cg").to(tl.int64)
    later = tl.load(later_ptr + b * L + offs, mask=mask, other=0, cache_modifier=".cg").to(tl.int64)
    tok = tl.where(offs < accept_len, x, later)
    tok = tl.where(offs == accept_len, res, tok)
    tok = tl.where(((flags & S_BAD_LOGITS) != 0) | (tok < 0) | (tok >= V), 0, tok)
    tl.store(tokens_ptr + b * L + offs, tok, mask=mask)
    status = tl.zeros((), tl.int32)
    for bit in tl.static_range(4):
        status |= tl.max(((flags >> bit) & 1), 0) << bit
    tl.store(accept_len_ptr + b, accept_len.to(tl.int32))
    tl.store(status_ptr + b, status)


@triton.jit
def finalize_kernel(draft_ptr, s_db, s_dl, res_ptr, later_ptr, flags_ptr, tokens_ptr, accept_len_ptr, status_ptr, L, V,
                    BLOCK_L: tl.constexpr):
    """Grid (B,): the row epilogue after a per-position kernel."""
    row_epilogue(tl.program_id(0).to(tl.int64), draft_ptr, s_db, s_dl, res_ptr, later_ptr, flags_ptr, tokens_ptr,
                 accept_len_ptr, status_ptr, L, V, BLOCK_L)
