"""The acceptance rules in Triton (reference/rules.py defines them; config/acceptance.py is their table) and the
decision every verification kernel shares: one acceptance function and one residual function for every rule, the
per-token distortion terms, and lantern's neighbour gathers. The constexpr ``RULE`` of every verification kernel is a
code of the table (STRICT ... LANTERN_PLUS below, read from it).

The decision (reference.verify), written once for the four kernels, which differ only in how they sum p, q and the
terms over the row:

* :func:`acceptance`: the draft's (a(x), strict a(x)), computed as soon as the kernel has p(x), q(x) and the rule's
  term (before its distortion sweep: a(x) waiting through the sweep takes fewer registers than its inputs);
* :func:`position_distortion`: the position's distortion from its summed terms (csd's gate, NaN where not gathered);
* :func:`decide`: the rule relaxes an informed slot whose distortion is not above ``st.max_distortion``
  (:func:`relaxed_slot`) and the strict test decides every other: a(x), u < a(x), the distortion stored (0 where the
  strict test decides) and the slot's ``relaxed``;
* :func:`relaxed_residual`: what a rejection resamples from, the rule's residual where relaxed, the strict one
  elsewhere (only gsd's differs: the chunked and split paths, which never run gsd, draw from the strict residual
  before they decide);
* :func:`next_draft`: the draft of a position after accept_len, by the coupling.

The tree kernel decides child by child: the main draft under its level's cap, the siblings strictly (not informed),
each rejection on the strict residual (RRS).

Kernel parameters (named alike in every path): ``params``, the rule's parameters as a tuple in the table's order, as
many as it declares (csd: λ, τ; gsd: k, δ; arsample: c, s0; lantern: δ, k; lantern++: λ, k), read as ``params[i]``
only in that rule's constexpr branch; ``nb_ptr`` / ``s_nb`` / ``nb_k`` the neighbour table
[V, k] (lantern, lantern++); ``GATHER_DIST`` computes lantern's distortion (k gathers per token; NaN without).
"""

import triton
import triton.language as tl

from ....config.acceptance import RULE_CODES
from .common import GUMBEL, INDEPENDENT, MAXIMAL, load_mix, order_key

STRICT = tl.constexpr(RULE_CODES["strict"])
CSD = tl.constexpr(RULE_CODES["csd"])
GSD = tl.constexpr(RULE_CODES["gsd"])
ARSAMPLE = tl.constexpr(RULE_CODES["arsample"])
LANTERN = tl.constexpr(RULE_CODES["lantern"])
LANTERN_PLUS = tl.constexpr(RULE_CODES["lantern++"])
BLOCK_K = tl.constexpr(256)  # neighbours gathered at once: k = 1000 in four steps, a split program's 128 lanes busy


@triton.jit
def is_lantern(RULE: tl.constexpr):
    return (RULE == LANTERN) or (RULE == LANTERN_PLUS)


@triton.jit
def arsample_s(h, params):
    """ARsample's s = clamp(H / c + s0, 0, 1)."""
    return tl.minimum(tl.maximum(h / params[0] + params[1], 0.0), 1.0)


@triton.jit
def acceptance(p_x, q_x, h, tvd, params, extra_x, RULE: tl.constexpr):
    """(a(x), strict a(x)) as reference.rules.acceptance_at: 0 where q(x) = 0 (callers pass q(x) = 0 for a draft
    outside the support of p). extra_x: lantern's c_m(x) (lantern_bonus), gsd's group ratio (gsd.py)."""
    pos_ok = q_x > 0
    safe_q = tl.where(pos_ok, q_x, 1.0)
    ratio = tl.where(pos_ok, p_x / safe_q, 0.0)
    strict_a = tl.minimum(ratio, 1.0)
    if RULE == CSD:
        a = tl.minimum(tl.where(tvd < params[1], tl.where(pos_ok, ratio + params[0] * h, 0.0), ratio), 1.0)
    elif RULE == ARSAMPLE:
        s = arsample_s(h, params)
        a = tl.where(pos_ok, tl.where(s > 0, tl.minimum(strict_a / tl.where(s > 0, s, 1.0), 1.0), 1.0), 0.0)
    elif is_lantern(RULE):
        a = tl.where(pos_ok, tl.minimum((p_x + extra_x) / safe_q, 1.0), 0.0)
    elif RULE == GSD:
        a = tl.where(pos_ok, tl.minimum(extra_x, 1.0), 0.0)
    else:
        a = strict_a
    return a, strict_a


@triton.jit
def slot_informed(inf_ptr, s_ib, s_il, b, i, HAS_INFORMED: tl.constexpr):
    """The slot's draft carries information (ops.verify's ``informed``; always without the mask): where it does not,
    every rule decides by the strict test, with distortion 0 and the strict residual (reference.verify)."""
    informed = tl.full((), 1, tl.int1)
    if HAS_INFORMED:
        informed = tl.load(inf_ptr + b * s_ib + i * s_il) != 0
    return informed


@triton.jit
def relaxed_slot(informed, dist, max_distortion):
    """Where the rule decides (reference.relaxed_slots): an informed slot whose distortion is not above the cap
    (``st.max_distortion``); elsewhere the strict test, with distortion 0 and the strict residual. NaN (a distortion
    not gathered) is never above."""
    return informed & ~(dist > max_distortion)


@triton.jit
def decide(a, strict_a, informed, dist, max_distortion, has_draft, u_acc):
    """The decision of a slot from its draft's (a(x), strict a(x)) (:func:`acceptance`) and distortion: (a(x),
    accepted, distortion, relaxed). The rule decides an informed slot under the cap (:func:`relaxed_slot`), the
    strict test every other; the distortion is 0 where the strict test decides or there is no draft."""
    relaxed = relaxed_slot(informed, dist, max_distortion)
    a = tl.where(relaxed, a, strict_a)
    dist = tl.where(has_draft & relaxed, dist, 0.0)
    return a, has_draft & (u_acc < a), dist, relaxed


@triton.jit
def residual(p, q, qa, RULE: tl.constexpr):
    """The resampling weights: max(p − q·a, 0) for gsd (qa = q·a), max(p − q, 0) for every other rule."""
    if RULE == GSD:
        return tl.maximum(p - qa, 0.0)
    return tl.maximum(p - q, 0.0)


@triton.jit
def relaxed_residual(p, q, qa, relaxed, RULE: tl.constexpr):
    """The rule's residual where the slot is ``relaxed``, the strict one elsewhere."""
    return tl.where(relaxed, residual(p, q, qa, RULE), residual(p, q, q, STRICT))


@triton.jit
def next_draft(from_p, x, has_draft, u_acc, strict_a, resampled, gumbel, amax, COUPLING: tl.constexpr,
               ONE_HOT: tl.constexpr):
    """The draft of the position after this one, should it follow accept_len, by the coupling: ``from_p`` a fresh
    draw from p (independent); the draft kept with probability min(1, p/q), else ``resampled`` (maximal: the strict
    test, whatever the rule); the gumbel-max token ``gumbel``, or the argmax when p is one-hot there (ONE_HOT: T = 0
    on logits)."""
    if COUPLING == INDEPENDENT:
        later = from_p
    elif COUPLING == MAXIMAL:
        later = tl.where(has_draft & (u_acc < strict_a), x.to(tl.int32), resampled.to(tl.int32))
    else:
        tl.static_assert(COUPLING == GUMBEL)
        later = gumbel
        if ONE_HOT:
            later = amax
    return later


@triton.jit
def has_token_terms(RULE: tl.constexpr):
    """The rule's distortion terms need only p, q and the row (distortion_terms)."""
    return (RULE == CSD) or (RULE == ARSAMPLE)


@triton.jit
def distortion_terms(p, q, support, h, params, RULE: tl.constexpr):
    """max(q·a(y) − p(y), 0) per token for csd (with its gate open: the caller gates the sum) and arsample, division
    free where it can be: min(q − p, λH·q), min(q − p, p/s − p) for p < q in the support; 0 for the other rules."""
    gap = q - p
    if RULE == CSD:
        cap = (params[0] * h) * q
    elif RULE == ARSAMPLE:
        s = arsample_s(h, params)
        cap = tl.where(s > 0, p / tl.where(s > 0, s, 1.0) - p, gap)
    else:
        cap = tl.zeros_like(gap)
    return tl.where(support & (p < q), tl.minimum(gap, cap), 0.0)


@triton.jit
def position_distortion(terms, tvd, params, RULE: tl.constexpr, GATHERED: tl.constexpr):
    """The rule's distortion at a position from the sum of its terms: csd's behind its gate (TVD < τ); NaN for a
    rule whose terms need gathers per token (lantern's neighbours, gsd's sorted row) unless they were GATHERED."""
    dist = terms
    if RULE == CSD:
        dist = tl.where(tvd < params[1], terms, 0.0)
    elif (is_lantern(RULE) or RULE == GSD) and not GATHERED:
        dist = tl.full((), float("nan"), tl.float32)
    return dist


@triton.jit
def lantern_limit(p_y, p0, RULE: tl.constexpr):
    """The bound on the neighbours' prefix sums at y: δ (lantern), (λ − 1)·p(y) (lantern++)."""
    if RULE == LANTERN:
        return tl.zeros_like(p_y) + p0
    return (p0 - 1.0) * p_y


@triton.jit
def p_at(c_row, u_row, v, mask, m, inv_z, thr_key, log_min_p, amax, cfg_scale, inv_t, HAS_UNCOND: tl.constexpr,
         GREEDY: tl.constexpr, PROBS: tl.constexpr, RESTRICT: tl.constexpr, MIN_P: tl.constexpr):
    """p at tokens ``v`` (any shape, 0 outside ``mask``), recomputed from the row: w·(1/Σw) for target probabilities,
    one-hot of ``amax`` when greedy, else exp(z − m)·(1/Z) in the support (order key >= thr_key with RESTRICT,
    z − m >= ln(min_p) with MIN_P)."""
    if PROBS:
        w = tl.load(c_row + v, mask=mask, other=0.0).to(tl.float32)
        return tl.where(mask, w * inv_z, 0.0)
    if GREEDY:
        return tl.where(mask & (v == amax), 1.0, 0.0)
    z = load_mix(c_row, u_row, v, mask, cfg_scale, inv_t, HAS_UNCOND, GREEDY)
    keep = mask & (z > float("-inf"))
    if RESTRICT:
        keep = keep & (order_key(z) >= thr_key.to(tl.int32))
    if MIN_P:
        keep = keep & (z - m >= log_min_p)
    return tl.where(keep, tl.exp(z - m) * inv_z, 0.0)


@triton.jit
def lantern_bonus(nb_ptr, s_nb, nb_k, x, limit, c_row, u_row, m, inv_z, thr_key, log_min_p, amax, V, cfg_scale,
                  inv_t, HAS_UNCOND: tl.constexpr, GREEDY: tl.constexpr, PROBS: tl.constexpr,
                  RESTRICT: tl.constexpr, MIN_P: tl.constexpr):
    """c_m at the scalar token x (reference.rules.neighbour_mass): the largest prefix sum of p over N[x] (fp64,
    rounded to fp32 at each j) not above ``limit``; entries outside [0, V) add nothing."""
    lane = tl.arange(0, BLOCK_K)
    best = tl.zeros((), tl.float32)
    carry = tl.zeros((), tl.float64)
    alive = x >= 0
    for j0 in range(0, nb_k, BLOCK_K):
        jj = j0 + lane
        jm = tl.where(alive, jj < nb_k, False)  # (block & scalar trips the interpreter's masked load)
        v = tl.load(nb_ptr + tl.maximum(x, 0) * s_nb + jj, mask=jm, other=-1)
        ok = jm & (v >= 0) & (v < V)
        pv = p_at(c_row, u_row, tl.where(ok, v, 0), ok, m, inv_z, thr_key, log_min_p, amax, cfg_scale, inv_t,
                  HAS_UNCOND, GREEDY, PROBS, RESTRICT, MIN_P)
        run = carry + tl.cumsum(pv.to(tl.float64), 0)
        c = run.to(tl.float32)
        within = jm & (c <= limit)  # a prefix of the block (the sums only grow)
        best = tl.where(alive, tl.maximum(best, tl.max(tl.where(within, c, 0.0), 0)), best)
        alive = alive & (tl.sum((jm & ~within).to(tl.int32), 0) == 0)
        carry = tl.max(tl.where(jj < nb_k, run, 0.0), 0)
    return best


@triton.jit
def lantern_terms(nb_ptr, s_nb, nb_k, offs, p, q, support, p0, c_row, u_row, m, inv_z, thr_key, log_min_p,
                  amax, V, cfg_scale, inv_t, RULE: tl.constexpr, HAS_UNCOND: tl.constexpr, GREEDY: tl.constexpr,
                  PROBS: tl.constexpr, RESTRICT: tl.constexpr, MIN_P: tl.constexpr):
    """lantern's distortion terms at the tokens ``offs`` (a block): min(q − p, c_m(y)) for p < q in the support, the
    neighbours walked until the prefix passes the bound or reaches q − p (k gathers per token at most)."""
    live = support & (p < q)
    gap = q - p
    limit = lantern_limit(p, p0, RULE)
    acc = tl.zeros(p.shape, tl.float64)
    best = tl.zeros(p.shape, tl.float32)
    alive = live
    for j in range(0, nb_k):
        v = tl.load(nb_ptr + offs * s_nb + j, mask=alive, other=-1)
        ok = alive & (v >= 0) & (v < V)
        pv = p_at(c_row, u_row, tl.where(ok, v, 0), ok, m, inv_z, thr_key, log_min_p, amax, cfg_scale, inv_t,
                  HAS_UNCOND, GREEDY, PROBS, RESTRICT, MIN_P)
        acc += pv.to(tl.float64)
        c = acc.to(tl.float32)
        alive = alive & (c <= limit)
        best = tl.where(alive, c, best)
        alive = alive & (best < gap)
    return tl.where(live, tl.minimum(gap, best), 0.0)
