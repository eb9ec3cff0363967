"""The maths of CSD verification, written once.

Every backend (Triton, C++/CPU, CUDA) and every test is held against the functions in this module. They are plain,
vectorised PyTorch (no Python loop over rows or positions) and take a ``compute_dtype`` so tests can run them in
float64. The ``torch`` backend *is* :func:`verify` with ``compute_dtype=torch.float32``.

Definitions (per row b and window position i; V = vocabulary size):

* target distribution   z = (u + s·(c − u)) · (1/T)   (c, u: conditional / unconditional logits, s: CFG scale);
                        z_v = −inf where c_v or u_v is −inf (a masked token: p_v = 0, never NaN).
                        p = softmax(z), restricted to the support S = {v : z_v finite} ∩ top-k ∩ top-p ∩ min-p:
                        top_k: z_v ≥ k-th largest finite z (ties kept); top_p: z_v ≥ z_(j) where z_(1) ≥ z_(2) ≥ …
                        are the kept z sorted and j the first index whose cumulative softmax mass reaches
                        top_p·total (ties kept); min_p: z_v − max z ≥ float32(ln min_p), i.e. p_v ≥ min_p·max p.
                        T = 0 means greedy: p = one-hot(argmax z) (lowest index on ties), S = {argmax}.
                        target_probs w instead of logits: p = w / Σw (rows within PROB_SUM_TOLERANCE of 1),
                        S = {v : w_v > 0}, z = ln w (for the gumbel coupling).
* entropy               H = −Σ p ln p  (nats, 0 ln 0 = 0)
* total variation       TVD = ½ Σ |p − q|        (q = draft_probs row, or one-hot(x) when draft_probs is None,
                                                  or the zero vector when there is neither: TVD = ½)
* acceptance of draft x strict: a(x) = min(1, p(x)/q(x));  csd: a(x) = min(1, p(x)/q(x) + λ·H) if TVD < τ else strict;
                        a(x) = 0 when q(x) = 0 (invalid draft for that position: rejected, never divided by zero)
                        and when x ∉ S (a masked or filtered draft is always rejected, whatever the rule)
* decision              accept iff u_accept < a(x)
* resampling            r ∝ max(p − q, 0) (the residual); p when the residual sums to zero
* output distribution   out(y) = q(y)a(y) + (1 − Σ q a) r(y);   distortion = ½ Σ |out − p|
                        (0 for strict; for csd with the gate open it equals Σ_y (q a − min(p, q))(y), see
                        :func:`closed_form_distortion`)
* next drafts           positions after accept_len get a new draft, marginally ~ p:
                        independent: inverse-CDF draw from p;  maximal: keep x iff u_accept < min(1, p(x)/q(x)),
                        else draw from the residual;  gumbel: argmax(z + G), G fixed per (seed, row, absolute position).

Random numbers: Philox4x32-10 (Salmon et al., 2011), see :func:`philox4x32`. Keys and counters:

* key = the row's seed as (low 32 bits, high 32 bits).
* step stream, one Philox call per (row, position):
  counter = (pos, row_id, offset_lo, offset_hi); lane 0 -> u_accept, lane 1 -> u_sample, lane 2 -> the uniformly
  random draft token floor(x·V / 2^32) that a decoding loop puts at a fresh position (:func:`random_draft_tokens`).
* gumbel stream, one call per (row, position, 4 tokens): counter = (v >> 2, pos, row_id, 0x80000000), lane v & 3.
  It does not depend on ``offset``, so the noise is the same in every iteration of a decoding loop.

where pos = (positions[b] + i) mod 2^32 (absolute token index), row_id = b when one seed is shared by the batch and 0
when every row has its own seed (so a row's stream does not depend on its place in a batch), and offset < 2^63 so the
step stream's top bit is always 0. ``offset`` is one value shared by the batch ([1]) or one per row ([B]): the step
stream of row b uses offset[b] (offset[0] when it is shared), so with per-row seeds and offsets a row's step stream
does not depend on the batch at all (a decoding loop keys each row by its own attempt count). A 32-bit Philox word x
becomes the uniform ((x >> 9) + 0.5) · 2^-23, which is exact in float32 and lies strictly inside (0, 1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch

__all__ = [
    "RULES",
    "COUPLINGS",
    "STATUS_BAD_LOGITS",
    "STATUS_BAD_DRAFT_TOKEN",
    "STATUS_BAD_DRAFT_PROBS",
    "STATUS_MISSING_COMMITTED_TOKEN",
    "PROB_SUM_TOLERANCE",
    "PHILOX_M0",
    "PHILOX_M1",
    "PHILOX_W0",
    "PHILOX_W1",
    "GUMBEL_STREAM_TAG",
    "philox4x32",
    "uniform_from_bits",
    "step_uniforms",
    "gumbel_uniforms",
    "random_draft_tokens",
    "mixed_logits",
    "restrict_top_k",
    "restrict_top_p",
    "restrict_min_p",
    "target_probs",
    "entropy",
    "total_variation",
    "acceptance_probability",
    "accepted_mass",
    "output_distribution",
    "optimal_residual",
    "verify_tree",
    "valid_levels",
    "tree_inputs",
    "TreeResult",
    "closed_form_distortion",
    "inverse_cdf_sample",
    "VerifyResult",
    "Target",
    "Drafts",
    "target_distribution",
    "target_distribution_from_probs",
    "draft_distribution",
    "accept_prefix",
    "assemble",
    "verify",
]

RULES = ("strict", "csd")  # the acceptance rule of verify
COUPLINGS = ("independent", "maximal", "gumbel")  # how positions after accept_len get their next draft

# Per-row status bits written by every backend (OR over the row's positions). The Python wrapper turns them into
# ValueErrors naming the argument when validate=True.
STATUS_BAD_LOGITS = 1  # NaN or +Inf in target_logits / uncond_logits, an overflowing CFG mix, no finite logit;
#                        with target_probs: a negative or non-finite value, or a sum off 1 by > PROB_SUM_TOLERANCE
STATUS_BAD_DRAFT_TOKEN = 2  # a draft token outside [-1, V)
STATUS_BAD_DRAFT_PROBS = 4  # a negative or non-finite value in draft_probs, or a row sum off 1 by > PROB_SUM_TOLERANCE
STATUS_MISSING_COMMITTED_TOKEN = 8  # draft_tokens[b, i] = -1 at a position i < start[b]

# |Σ row − 1| allowed in draft_probs and target_probs rows (fp32 softmax over any vocabulary is far inside it; a row
# scaled by 0.5 or left unnormalised after masking is far outside it).
PROB_SUM_TOLERANCE = 1e-3

PHILOX_M0 = 0xD2511F53
PHILOX_M1 = 0xCD9E8D57
PHILOX_W0 = 0x9E3779B9
PHILOX_W1 = 0xBB67AE85
PHILOX_ROUNDS = 10
GUMBEL_STREAM_TAG = 0x80000000
_MASK32 = 0xFFFFFFFF


# --------------------------------------------------------------------------------------------------------------------
# Philox4x32-10 on int64 tensors holding uint32 values
# --------------------------------------------------------------------------------------------------------------------
def _mulhilo32(multiplier: int, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(high, low) 32-bit halves of multiplier·x for uint32 values held in int64, without int64 overflow."""
    low_part = multiplier * (x & 0xFFFF)  # < 2^48
    high_part = multiplier * (x >> 16)  # < 2^48; product = low_part + high_part·2^16
    lo = (low_part + ((high_part & 0xFFFF) << 16)) & _MASK32
    hi = (((low_part >> 16) + high_part) >> 16) & _MASK32
    return hi, lo


def philox4x32(c0, c1, c2, c3, k0, k1) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Philox4x32-10 of counter (c0, c1, c2, c3) under key (k0, k1); all uint32 values in int64 tensors.

    Shape: every argument broadcasts to a common shape, which the four outputs have.
    """
    words = (c0, c1, c2, c3, k0, k1)
    device = next((t.device for t in words if isinstance(t, torch.Tensor)), None)  # ints join the tensors' device
    words = [torch.as_tensor(t, dtype=torch.int64, device=device) for t in words]
    c0, c1, c2, c3, k0, k1 = torch.broadcast_tensors(*words)
    c0, c1, c2, c3 = (c & _MASK32 for c in (c0, c1, c2, c3))
    k0, k1 = k0 & _MASK32, k1 & _MASK32
    for _ in range(PHILOX_ROUNDS):
        hi0, lo0 = _mulhilo32(PHILOX_M0, c0)
        hi1, lo1 = _mulhilo32(PHILOX_M1, c2)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        k0 = (k0 + PHILOX_W0) & _MASK32
        k1 = (k1 + PHILOX_W1) & _MASK32
    return c0, c1, c2, c3


def uniform_from_bits(bits: torch.Tensor) -> torch.Tensor:
    """Map uint32 words (in int64) to float32 uniforms ((x >> 9) + 0.5)·2^-23 in the open interval (0, 1)."""
    return ((bits >> 9).to(torch.float32) + 0.5) * (2.0**-23)


def _seed_key(seed: torch.Tensor, batch: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-row Philox key halves and row ids: a shared seed keys rows by index, per-row seeds by themselves."""
    seed = seed.reshape(-1).to(torch.int64)
    if seed.numel() == 1:
        seed = seed.expand(batch)
        row_id = torch.arange(batch, dtype=torch.int64, device=seed.device)
    else:
        row_id = torch.zeros(batch, dtype=torch.int64, device=seed.device)
    return seed & _MASK32, (seed >> 32) & _MASK32, row_id


def _row_offsets(offset: torch.Tensor, batch: int) -> torch.Tensor:
    """[B, 1] int64 step-stream offset of each row: offset[b] when one per row is given, else offset[0]."""
    offset = torch.as_tensor(offset, dtype=torch.int64).reshape(-1)
    if offset.numel() == 1:
        return offset.expand(batch)[:, None]
    if offset.numel() != batch:
        raise ValueError(f"offset: expected 1 or {batch} values, got {offset.numel()}")
    return offset[:, None]


def _absolute_positions(positions: torch.Tensor, length: int) -> torch.Tensor:
    """[B, L] uint32 (in int64) absolute index of each window position."""
    window = torch.arange(length, dtype=torch.int64, device=positions.device)
    return (positions.reshape(-1, 1).to(torch.int64) + window) & _MASK32


def step_uniforms(seed: torch.Tensor, offset: torch.Tensor, positions: torch.Tensor, length: int):
    """(u_accept, u_sample), each [B, L] float32, from the step stream.

    Shape: seed [1] or [B] int64, offset [1] or [B] int64 (row b uses offset[b]), positions [B] int64.
    """
    batch = positions.numel()
    k0, k1, row_id = _seed_key(seed, batch)
    offset = _row_offsets(offset, batch)
    pos = _absolute_positions(positions, length)
    lane0, lane1, _, _ = philox4x32(
        pos, row_id[:, None], offset & _MASK32, (offset >> 32) & _MASK32, k0[:, None], k1[:, None]
    )
    return uniform_from_bits(lane0), uniform_from_bits(lane1)


def random_draft_tokens(seed: torch.Tensor, offset: torch.Tensor, positions: torch.Tensor, length: int,
                        vocab: int) -> torch.Tensor:
    """[B, L] int64 uniformly random tokens in [0, V) from lane 2 of the step stream (q = 1/V drafts).

    Keyed like the verification uniforms, so a decoding loop's initial drafts depend on (seed, position, offset) only.
    Shape: seed [1] or [B], offset [1] or [B] (row b uses offset[b]), positions [B].
    """
    batch = positions.numel()
    k0, k1, row_id = _seed_key(seed, batch)
    offset = _row_offsets(offset, batch)
    pos = _absolute_positions(positions, length)
    _, _, lane2, _ = philox4x32(pos, row_id[:, None], offset & _MASK32, (offset >> 32) & _MASK32, k0[:, None],
                                k1[:, None])
    return (lane2 * vocab) >> 32


def gumbel_uniforms(seed: torch.Tensor, positions: torch.Tensor, length: int, vocab: int) -> torch.Tensor:
    """[B, L, V] float32 uniforms of the gumbel stream (independent of the step offset)."""
    batch = positions.numel()
    k0, k1, row_id = _seed_key(seed, batch)
    pos = _absolute_positions(positions, length)
    token = torch.arange(vocab, dtype=torch.int64, device=positions.device)
    lanes = philox4x32(
        (token >> 2)[None, None, :],
        pos[:, :, None],
        row_id[:, None, None],
        GUMBEL_STREAM_TAG,
        k0[:, None, None],
        k1[:, None, None],
    )
    lane_of_token = (token & 3).expand(batch, length, vocab)
    bits = torch.stack(lanes, dim=-1).gather(-1, lane_of_token.unsqueeze(-1)).squeeze(-1)
    return uniform_from_bits(bits)


# --------------------------------------------------------------------------------------------------------------------
# Target distribution and the per-position statistics
# --------------------------------------------------------------------------------------------------------------------
def mixed_logits(
    logits: torch.Tensor,
    uncond_logits: Optional[torch.Tensor] = None,
    cfg_scale: float = 1.0,
    temperature: float = 1.0,
    compute_dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """z = (u + s·(c − u))·(1/T); for T = 0 the unscaled mix (greedy decoding only needs its argmax).

    A token that is −inf in c or u is masked: z = −inf there (never the NaN of −inf − (−inf)). A NaN or +inf in c or
    u, or a mix of finite logits that overflows, gives z = NaN (the row is then flagged by target_distribution).
    The scale 1/T is rounded to float32 once, so every backend multiplies by the same constant.
    Shape: logits [..., V] -> [..., V] in compute_dtype.
    """
    mixed = logits.to(compute_dtype)
    masked, bad = mixed == float("-inf"), _bad_logit(mixed)
    if uncond_logits is not None:
        uncond = uncond_logits.to(compute_dtype)
        masked, bad = masked | (uncond == float("-inf")), bad | _bad_logit(uncond)
        mixed = uncond + cfg_scale * (mixed - uncond)
    if temperature > 0:
        mixed = mixed * float(torch.tensor(1.0 / temperature, dtype=torch.float32))
    bad = bad | (~torch.isfinite(mixed) & ~masked)
    mixed = mixed.masked_fill(masked, float("-inf"))
    return mixed.masked_fill(bad, float("nan"))


def _bad_logit(x: torch.Tensor) -> torch.Tensor:
    """NaN or +inf (−inf is a mask, not an error)."""
    return ~(x < float("inf"))


def restrict_top_k(z: torch.Tensor, top_k: Optional[int]) -> torch.Tensor:
    """−inf outside {v : z_v ≥ k-th largest z} (ties at the k-th value are all kept; fewer than k finite values keep
    every finite one, since the k-th largest is then −inf).  Shape: [..., V]."""
    if top_k is None or top_k >= z.shape[-1]:
        return z
    kth_largest = torch.topk(z, top_k, dim=-1).values[..., -1:]
    return z.masked_fill(z < kth_largest, float("-inf"))


def restrict_top_p(z: torch.Tensor, top_p: Optional[float]) -> torch.Tensor:
    """−inf outside the smallest set of largest z whose softmax mass reaches top_p (ties at the last value kept).

    Sort z descending, e = exp(z − max z), cum = cumsum(e); j = the first index with cum_j ≥ top_p·cum_last
    (top_p rounded to float32); keep {v : z_v ≥ z_(j)}. The kernels find the same threshold by a search over z.
    Shape: [..., V]; rows need at least one finite value.
    """
    if top_p is None or top_p >= 1.0:
        return z
    ordered = z.sort(-1, descending=True).values
    cum = torch.exp(ordered - ordered[..., :1]).cumsum(-1)
    limit = float(torch.tensor(top_p, dtype=torch.float32)) * cum[..., -1:]
    crossing = (cum < limit).sum(-1, keepdim=True).clamp(max=z.shape[-1] - 1)
    return z.masked_fill(z < ordered.gather(-1, crossing), float("-inf"))


def restrict_min_p(z: torch.Tensor, min_p: Optional[float]) -> torch.Tensor:
    """−inf outside {v : z_v − max z ≥ float32(ln min_p)}: p_v ≥ min_p·max p, decided on z (exact in every backend).

    Shape: [..., V].
    """
    if not min_p:
        return z
    log_min_p = float(torch.tensor(math.log(min_p), dtype=torch.float32))
    return z.masked_fill(z - z.amax(-1, keepdim=True) < log_min_p, float("-inf"))


def target_probs(z: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """p from the mixed logits z of :func:`mixed_logits` (one-hot of the first argmax when temperature = 0)."""
    if temperature == 0:
        return torch.nn.functional.one_hot(z.argmax(dim=-1), z.shape[-1]).to(z.dtype)
    return torch.softmax(z, dim=-1)


def entropy(p: torch.Tensor) -> torch.Tensor:
    """H = −Σ p ln p in nats, with 0 ln 0 = 0.  Shape: [..., V] -> [...]."""
    return -torch.where(p > 0, p * torch.log(p), torch.zeros_like(p)).sum(-1)


def total_variation(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """TVD = ½ Σ |p − q|.  Shape: [..., V] -> [...]."""
    return 0.5 * (p - q).abs().sum(-1)


def acceptance_probability(
    p_x: torch.Tensor, q_x: torch.Tensor, h: torch.Tensor, tvd: torch.Tensor, rule: str, entropy_coef: float,
    tvd_threshold: float, in_support: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """a(x) for draft probabilities p(x), q(x) (any broadcastable shapes); 0 where q(x) = 0 or x is outside the
    support of p (``in_support``; default p(x) > 0)."""
    in_support = p_x > 0 if in_support is None else in_support
    valid = (q_x > 0) & in_support
    safe_q = torch.where(valid, q_x, torch.ones_like(q_x))
    ratio = torch.where(valid, p_x / safe_q, torch.zeros_like(p_x))
    if rule == "csd":
        relaxed = torch.where(valid, ratio + entropy_coef * h, torch.zeros_like(ratio))
        ratio = torch.where(tvd < tvd_threshold, relaxed, ratio)
    return ratio.clamp(max=1.0)


def accepted_mass(p: torch.Tensor, q: torch.Tensor, h: torch.Tensor, tvd: torch.Tensor, rule: str,
                  entropy_coef: float, tvd_threshold: float, support: Optional[torch.Tensor] = None):
    """q(y)·a(y) for every token y: the probability of drafting y and accepting it.  Shape: [..., V]."""
    return q * acceptance_probability(p, q, h[..., None], tvd[..., None], rule, entropy_coef, tvd_threshold, support)


def optimal_residual(p: torch.Tensor, q_times_a: torch.Tensor) -> torch.Tensor:
    """The resampling distribution that minimises ½Σ|out − p| for any acceptance rule: r ∝ max(p − q·a, 0).

    Where that residual sums to zero (nothing to correct) it is p, as in the samplers.
    """
    residual = (p - q_times_a).clamp(min=0)
    total = residual.sum(-1, keepdim=True)
    return torch.where(total > 0, residual / torch.where(total > 0, total, torch.ones_like(total)), p)


def output_distribution(p: torch.Tensor, q: torch.Tensor, q_times_a: torch.Tensor,
                        residual: torch.Tensor) -> torch.Tensor:
    """out(y) = q(y)a(y) + (1 − Σ q a)·r(y): the exact law of the token a verified position emits."""
    rejected = (1 - q_times_a.sum(-1, keepdim=True)).clamp(min=0)
    return q_times_a + rejected * residual


def closed_form_distortion(p: torch.Tensor, q: torch.Tensor, q_times_a: torch.Tensor) -> torch.Tensor:
    """½Σ|out − p| for rules with q·a ≥ min(p, q) resampled from max(p − q, 0): Σ (q·a − min(p, q)).

    This is what the kernels compute in their single pass; the tests hold it against output_distribution.
    """
    return (q_times_a - torch.minimum(p, q)).clamp(min=0).sum(-1)


def inverse_cdf_sample(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """First index v with cumsum(weights)[v] > u·Σ weights (the last positive weight if rounding overshoots).

    Shape: weights [..., V] ≥ 0 with a positive sum, u [...] in (0, 1) -> [...] int64.
    """
    cdf = weights.cumsum(-1)
    target = (u.to(weights.dtype) * cdf[..., -1]).unsqueeze(-1)
    index = (cdf <= target).sum(-1)  # number of leading entries not past the target
    vocab = weights.shape[-1]
    last_positive = vocab - 1 - (weights > 0).flip(-1).to(torch.int64).argmax(-1)
    return torch.where(index < vocab, index, last_positive)


# --------------------------------------------------------------------------------------------------------------------
# The whole verification step
# --------------------------------------------------------------------------------------------------------------------
@dataclass
class VerifyResult:
    """What one verification step returns (every backend, and :func:`csd_kernels.verify`).

    Shape: accept_len [B] int32; tokens [B, L] int64; probs [B, L, V] float32 or None;
    entropy, tvd, accept_prob, distortion [B, L] float32; status [B] int32.

    accept_len: first position at or after ``start`` whose draft was rejected or missing (L if none).
    tokens: the drafts before accept_len, the resampled token at accept_len, and the next drafts after it.
    probs: the target distribution p (after CFG, temperature, top-k).
    entropy: H(p) in nats. tvd: ½Σ|p − q| (½ where there is neither a draft nor draft_probs).
    accept_prob: a(x) for the draft (0 where there is none). distortion: ½Σ|out − p| of the rule at that position.
    status: per-row bit mask of input problems (STATUS_*), 0 when the row was fine.
    accept_len_host: accept_len as a Python list when ``csd_kernels.verify(validate=True)`` read it.
    """

    accept_len: torch.Tensor
    tokens: torch.Tensor
    probs: Optional[torch.Tensor]
    entropy: torch.Tensor
    tvd: torch.Tensor
    accept_prob: torch.Tensor
    distortion: torch.Tensor
    status: torch.Tensor
    accept_len_host: Optional[list] = None


@dataclass
class Target:
    """The target side of a window: mixed logits z (−inf outside the support), p, H, the support S of p and which
    positions had bad input.  [B, L, (V)]"""

    z: torch.Tensor
    p: torch.Tensor
    h: torch.Tensor
    bad: torch.Tensor
    support: torch.Tensor


@dataclass
class Drafts:
    """The draft side: sanitised tokens (-1 = none), q (the zero vector where there is neither a draft nor
    draft_probs; zeroed where draft_probs was invalid), and the input flags.  [B, L, (V)]"""

    token: torch.Tensor
    has_draft: torch.Tensor
    bad_token: torch.Tensor
    q: torch.Tensor
    bad_probs: torch.Tensor


def target_distribution(target_logits, uncond_logits, cfg_scale, temperature, top_k, compute_dtype,
                        top_p: Optional[float] = None, min_p: Optional[float] = None) -> Target:
    """p from logits: CFG mix, temperature, then top-k, top-p (on what top-k kept) and min-p."""
    z = mixed_logits(target_logits, uncond_logits, cfg_scale, temperature, compute_dtype)
    # NaN marks bad input (see mixed_logits); a row with no finite logit has no distribution either.
    bad = torch.isnan(z).any(-1) | (z == float("-inf")).all(-1)
    z = torch.where(bad[..., None], torch.zeros_like(z), z)
    z = restrict_min_p(restrict_top_p(restrict_top_k(z, top_k), top_p), min_p)
    p = target_probs(z, temperature)
    support = p > 0 if temperature == 0 else torch.isfinite(z)
    return Target(z, p, entropy(p), bad, support)


def target_distribution_from_probs(weights: torch.Tensor, compute_dtype) -> Target:
    """p = w / Σw from target probabilities; rows with a negative or non-finite value, or a sum off 1 by more than
    PROB_SUM_TOLERANCE, are bad.  Shape: [B, L, V]."""
    w = weights.to(compute_dtype)
    total = w.sum(-1, keepdim=True)
    bad = ~(torch.isfinite(w) & (w >= 0)).all(-1) | ~((total - 1).abs() <= PROB_SUM_TOLERANCE).squeeze(-1)
    w = torch.where(bad[..., None], torch.ones_like(w), w)
    p = w / w.sum(-1, keepdim=True)
    return Target(torch.log(w), p, entropy(p), bad, w > 0)


def draft_distribution(draft_tokens, draft_probs, vocab: int, compute_dtype) -> Drafts:
    draft_tokens = draft_tokens.to(torch.int64)
    bad_token = (draft_tokens < -1) | (draft_tokens >= vocab)
    token = torch.where(bad_token, torch.full_like(draft_tokens, -1), draft_tokens)
    has_draft = token >= 0
    if draft_probs is None:
        q = torch.nn.functional.one_hot(token.clamp(min=0), vocab).to(compute_dtype) * has_draft[..., None]
        bad_probs = torch.zeros_like(has_draft)
    else:
        q = draft_probs.to(compute_dtype).expand(*token.shape, vocab)
        total = q.sum(-1) if draft_probs.stride(-1) else q[..., 0].to(torch.float64) * vocab  # a uniform q: V·q_0
        bad_probs = ~(torch.isfinite(q) & (q >= 0)).all(-1) | ~((total - 1).abs() <= PROB_SUM_TOLERANCE)
        q = torch.where(bad_probs[..., None], torch.zeros_like(q), q)
    return Drafts(token, has_draft, bad_token, q, bad_probs)


def accept_prefix(accepted: torch.Tensor, start: torch.Tensor, bad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(accept_len [B], committed [B, L]): positions before start are committed; the prefix ends at the first
    uncommitted rejection or bad position."""
    batch, length = accepted.shape
    window = torch.arange(length, device=accepted.device)
    committed = window[None, :] < start.reshape(-1, 1)
    stops = (~accepted & ~committed) | bad
    full = torch.full((batch,), length, device=accepted.device)
    return torch.where(stops.any(-1), stops.to(torch.int64).argmax(-1), full), committed


def assemble(target: Target, drafts: Drafts, accept_len, committed, resampled, later, tvd, accept_prob, distortion,
             return_probs: bool) -> VerifyResult:
    """The result of a step: tokens from the prefix, the resampled token and the later draws; NaN statistics, token 0
    and status bits where the inputs were bad."""
    window = torch.arange(drafts.token.shape[1], device=drafts.token.device)
    tokens = torch.where(window < accept_len[:, None], drafts.token, later)
    tokens = torch.where(window == accept_len[:, None], resampled, tokens)
    # Never out of range, whatever the input: flagged positions emit token 0.
    tokens = torch.where(target.bad | (tokens < 0), torch.zeros_like(tokens), tokens)
    status = (
        target.bad.any(-1).to(torch.int32) * STATUS_BAD_LOGITS
        | drafts.bad_token.any(-1).to(torch.int32) * STATUS_BAD_DRAFT_TOKEN
        | drafts.bad_probs.any(-1).to(torch.int32) * STATUS_BAD_DRAFT_PROBS
        | (committed & ~drafts.has_draft).any(-1).to(torch.int32) * STATUS_MISSING_COMMITTED_TOKEN
    )
    nan = lambda t: torch.where(target.bad, torch.full_like(t, float("nan")), t).to(torch.float32)  # noqa: E731
    probs = torch.where(target.bad[..., None], float("nan"), target.p).to(torch.float32) if return_probs else None
    return VerifyResult(accept_len=accept_len.to(torch.int32), tokens=tokens, probs=probs, entropy=nan(target.h),
                        tvd=nan(tvd), accept_prob=nan(accept_prob), distortion=nan(distortion), status=status)


def verify(
    target_logits: Optional[torch.Tensor],
    draft_tokens: torch.Tensor,
    draft_probs: Optional[torch.Tensor] = None,
    *,
    target_probs: Optional[torch.Tensor] = None,
    uncond_logits: Optional[torch.Tensor] = None,
    cfg_scale: float = 1.0,
    temperature: float = 1.0,
    top_k: Optional[int] = None,
    top_p: Optional[float] = None,
    min_p: Optional[float] = None,
    rule: str = "csd",
    entropy_coef: float = 0.5,
    tvd_threshold: float = 0.65,
    start: torch.Tensor,
    coupling: str = "independent",
    positions: torch.Tensor,
    seed: torch.Tensor,
    offset: torch.Tensor,
    return_probs: bool = True,
    compute_dtype: torch.dtype = torch.float32,
    uniforms: Optional[tuple[torch.Tensor, torch.Tensor]] = None,
) -> VerifyResult:
    """The reference verification step on already-validated arguments (see csd_kernels.verify for the API).

    ``uniforms`` = (u_accept, u_sample), each [B, L], replaces the Philox step stream (tests use it to fix u).
    ``target_probs`` replaces target_logits (then no CFG, temperature 1 and no top-k / top-p / min-p).
    Shape: target_logits or target_probs [B, L, V], draft_tokens [B, L], draft_probs [B, L, V] or None,
    start/positions [B], seed [1] or [B], offset [1] or [B] (per-row step-stream offsets).
    """
    if target_probs is not None:
        length, vocab = target_probs.shape[1:]
        target = target_distribution_from_probs(target_probs, compute_dtype)
    else:
        length, vocab = target_logits.shape[1:]
        target = target_distribution(target_logits, uncond_logits, cfg_scale, temperature, top_k, compute_dtype,
                                     top_p, min_p)
    drafts = draft_distribution(draft_tokens, draft_probs, vocab, compute_dtype)
    p, q, x = target.p, drafts.q, drafts.token
    tvd = total_variation(p, q)  # q is the zero vector where there is neither a draft nor draft_probs: TVD = ½
    p_x = p.gather(-1, x.clamp(min=0)[..., None]).squeeze(-1)
    q_x = torch.where(drafts.has_draft, q.gather(-1, x.clamp(min=0)[..., None]).squeeze(-1), torch.zeros_like(p_x))
    x_in_support = target.support.gather(-1, x.clamp(min=0)[..., None]).squeeze(-1)
    accept_prob = acceptance_probability(p_x, q_x, target.h, tvd, rule, entropy_coef, tvd_threshold, x_in_support)
    q_times_a = accepted_mass(p, q, target.h, tvd, rule, entropy_coef, tvd_threshold, target.support)
    distortion = torch.where(drafts.has_draft, closed_form_distortion(p, q, q_times_a), torch.zeros_like(target.h))

    u_accept, u_sample = step_uniforms(seed, offset, positions, length) if uniforms is None else (
        u.to(torch.float32) for u in uniforms)
    accepted = drafts.has_draft & (u_accept.to(compute_dtype) < accept_prob)
    accept_len, committed = accept_prefix(accepted, start, target.bad)
    residual = (p - q).clamp(min=0)
    residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual, p)
    from_p = inverse_cdf_sample(p, u_sample)
    resampled = torch.where(drafts.has_draft, inverse_cdf_sample(residual, u_sample), from_p)
    later = _next_drafts(coupling, target, drafts, resampled, from_p, u_accept, p_x, q_x, x_in_support, temperature,
                         seed, positions, compute_dtype)
    return assemble(target, drafts, accept_len, committed, resampled, later, tvd, accept_prob, distortion, return_probs)


def _next_drafts(coupling, target, drafts, resampled, from_p, u_accept, p_x, q_x, x_in_support, temperature, seed,
                 positions, compute_dtype) -> torch.Tensor:
    """The tokens drafted for the positions after accept_len, by coupling (see COUPLINGS)."""
    if coupling == "independent":
        return from_p
    if coupling == "maximal":
        zero = torch.zeros_like(p_x)
        strict = acceptance_probability(p_x, q_x, zero, zero, "strict", 0.0, 0.0, x_in_support)  # min(1, p(x)/q(x))
        keep = drafts.has_draft & (u_accept.to(compute_dtype) < strict)
        return torch.where(keep, drafts.token, resampled)
    if temperature == 0:  # gumbel
        return target.z.argmax(-1)
    length, vocab = target.z.shape[1:]
    gumbel = -torch.log(-torch.log(gumbel_uniforms(seed, positions, length, vocab)))
    return (target.z + gumbel.to(compute_dtype)).argmax(-1)


# --------------------------------------------------------------------------------------------------------------------
# Draft trees: several candidates per position, verified by recursive rejection sampling (RRS)
# --------------------------------------------------------------------------------------------------------------------
# A window of S slots: slot 0 is the root (the last committed token x_{n-1}), every other slot a draft node whose token
# sits at grid position n - 1 + depth. Tree (K, D): a full K-ary tree of D draft levels below the root (one node at
# level 1, K^(d-1) at level d: (K^D - 1)/(K - 1) nodes), all nodes of one level drawing from the same candidate set
# (candidate r of level d is cand[d - 1, r]: the Cartesian product of SJD-PAC), and the main chain (rank 0 at every
# level) continuing one node per level to fill the window. The main chain takes slots 1 .. M in level order, so a walk
# that stays on it needs no key/value move.
TREE_STREAM_TAG = 0xC0000000  # word 3 of the tree stream's counter (the step stream's top bit is 0, gumbel's is 10)


@dataclass(frozen=True)
class TreeLayout:
    """The static shape of a draft tree in a window of ``slots`` inputs.

    Shape: parent, depth, rank [S] int64 (slot 0: parent -1, depth 0); children [S, K] int64 slots in rank order
    (-1 none); main [M + 1] the main chain's slots by depth (main[0] = 0); ancestor [S, S] bool (t is s or above s).
    """

    branching: int
    depth_limit: int
    parent: torch.Tensor
    depth: torch.Tensor
    rank: torch.Tensor
    children: torch.Tensor
    main: torch.Tensor
    ancestor: torch.Tensor

    @property
    def levels(self) -> int:
        """Draft levels (= the main chain's draft nodes M)."""
        return self.main.numel() - 1

    def to(self, device) -> "TreeLayout":
        """The same layout with its tensors on ``device``."""
        moved = {name: getattr(self, name).to(device) for name in ("parent", "depth", "rank", "children", "main",
                                                                    "ancestor")}
        return TreeLayout(self.branching, self.depth_limit, **moved)


def tree_nodes(branching: int, depth: int) -> int:
    """(K^D − 1)/(K − 1): the draft nodes of a full K-ary tree of D levels (D when K = 1)."""
    return depth if branching == 1 else (branching**depth - 1) // (branching - 1)


def tree_layout(branching: int, depth: int, slots: int) -> TreeLayout:
    """The layout of tree (K, D) in a window of ``slots`` inputs (root + slots - 1 draft nodes); needs
    tree_nodes(K, D) <= slots - 1 (validation.check_tree says so by name)."""
    chain = slots - 1 - (tree_nodes(branching, depth) - depth)  # main-chain draft nodes M >= D
    parent, level, rank = [-1] + list(range(chain)), list(range(chain + 1)), [0] * (chain + 1)
    frontier = [(1, 1)]  # (slot, level) of the tree's nodes whose children are placed next
    for d in range(1, depth):
        below = []
        for slot, _ in frontier:
            for r in range(branching):
                if r == 0 and slot == d:  # the main node's rank-0 child is the main chain's next node
                    below.append((d + 1, d + 1))
                    continue
                parent.append(slot)
                level.append(d + 1)
                rank.append(r)
                below.append((len(parent) - 1, d + 1))
        frontier = below
    size = len(parent)
    children = torch.full((size, max(branching, 1)), -1, dtype=torch.int64)
    for s in range(1, size):
        children[parent[s], rank[s]] = s
    ancestor = torch.eye(size, dtype=torch.bool)
    for s in range(1, size):
        ancestor[s] |= ancestor[parent[s]]
    return TreeLayout(branching, depth, torch.tensor(parent), torch.tensor(level), torch.tensor(rank), children,
                      torch.arange(chain + 1), ancestor)


def _tree_words(seed: torch.Tensor, offset: torch.Tensor, batch: int):
    k0, k1, row_id = _seed_key(seed, batch)
    offset = _row_offsets(offset, batch)[:, 0]
    return k0, k1, offset & _MASK32, TREE_STREAM_TAG | (row_id & 0x3FFFFFFF)


def tree_uniforms(seed: torch.Tensor, offset: torch.Tensor, batch: int, slots: int):
    """(u_accept, u_sample) [B, S] float32 of the tree stream: counter (slot, 2^31, offset_lo, TAG | row_id).

    u_accept[b, s] tests slot s as a candidate; u_sample[b, s] draws the token emitted below slot s. Keyed by the
    row's attempt count, not by position: a batched row equals the row alone (per-row seeds)."""
    k0, k1, off, tag = (w[:, None] for w in _tree_words(seed, offset, batch))
    slot = torch.arange(slots, dtype=torch.int64, device=k0.device)[None, :]
    lane0, lane1, _, _ = philox4x32(slot, 0x80000000, off, tag, k0, k1)
    return uniform_from_bits(lane0), uniform_from_bits(lane1)


def tree_gumbel_uniforms(seed: torch.Tensor, offset: torch.Tensor, batch: int, levels: int, vocab: int,
                         first: int = 0):
    """[B, levels - first, V] float32 uniforms of the tree stream for the sibling candidates of levels first ..
    levels - 1: counter (v >> 2, level, offset_lo, TAG | row_id), lane v & 3."""
    k0, k1, off, tag = (w[:, None, None] for w in _tree_words(seed, offset, batch))
    token = torch.arange(vocab, dtype=torch.int64, device=k0.device)
    level = torch.arange(first, levels, dtype=torch.int64, device=k0.device)
    lanes = philox4x32((token >> 2)[None, None, :], level[None, :, None], off, tag, k0, k1)
    bits = torch.stack(lanes, -1).gather(-1, (token & 3).expand(batch, levels - first, vocab)[..., None]).squeeze(-1)
    return uniform_from_bits(bits)


def tree_candidates(main_tokens: torch.Tensor, q: torch.Tensor, branching: int, uniforms: torch.Tensor):
    """cand [B, P, K]: rank 0 the main draft, ranks 1..K-1 Gumbel-top-(K-1) of log q with the main draft removed —
    given x_1 ~ q, (x_1, .., x_K) are K draws from q without replacement. -1 where q has no mass left. Equal keys go
    to the lowest token (a uniform q ties whenever two 23-bit uniforms do; topk's order among ties is unspecified).

    Shape: main_tokens [B, P] (-1: none), q [B, P, V], uniforms [B, P, V] in (0, 1)."""
    if branching == 1:
        return main_tokens[..., None]
    keys = torch.log(q) - torch.log(-torch.log(uniforms.to(q.dtype)))
    main = torch.nn.functional.one_hot(main_tokens.clamp(min=0), q.shape[-1]).bool() & (main_tokens >= 0)[..., None]
    keys = keys.masked_fill(main | (q <= 0), float("-inf"))
    top = keys.sort(dim=-1, descending=True, stable=True)
    values, indices = top.values[..., :branching - 1], top.indices[..., :branching - 1]
    siblings = torch.where(torch.isfinite(values), indices, -1)
    return torch.cat([main_tokens[..., None], siblings], -1)


def rrs_step(p: torch.Tensor, q: torch.Tensor, x: torch.Tensor, support: Optional[torch.Tensor] = None,
             accept: Optional[torch.Tensor] = None, rest: Optional[torch.Tensor] = None):
    """One candidate of recursive rejection sampling: (a(x), the next p and q if x is rejected).

    a(x) = min(1, p(x)/q(x)), or ``accept`` when given (csd's relaxed a of the main draft). Next p =
    norm(max(p − q, 0)) (p where that is zero); next q = ``rest`` (default q: the law the next candidates are drawn
    from) without x, renormalised (zero when nothing is left). A rejected x has p(x) <= q(x) under both rules (a = 1
    otherwise), so the next p has no mass at x. A missing candidate (x = -1) changes nothing and is never accepted.
    Shape: p, q, rest [..., V], x, accept [...]."""
    present = x >= 0
    index = x.clamp(min=0)[..., None]
    p_x, q_x = p.gather(-1, index).squeeze(-1), q.gather(-1, index).squeeze(-1)
    in_support = p_x > 0 if support is None else support.gather(-1, index).squeeze(-1)
    if accept is None:
        accept = acceptance_probability(p_x, q_x, p_x * 0, p_x * 0, "strict", 0.0, 0.0, in_support)
    a = torch.where(present, accept, 0)
    residual = (p - q).clamp(min=0)
    mass = residual.sum(-1, keepdim=True)
    next_p = torch.where(mass > 0, residual / torch.where(mass > 0, mass, 1), p)
    removed = (q if rest is None else rest).scatter(-1, index, 0.0)
    left = removed.sum(-1, keepdim=True)
    next_q = torch.where(left > 0, removed / torch.where(left > 0, left, 1), 0.0)
    keep = ~present[..., None]
    return a, torch.where(keep, p, next_p), torch.where(keep, q, next_q)


@dataclass
class TreeWalk:
    """The outcome of a tree verification. Shape: accept_len [B] accepted draft nodes; path [B, M + 1] slots by
    depth (path[:, 0] = 0, -1 past the stop); tokens [B, M + 1] the accepted tokens, then the emitted token at
    accept_len (-1 after it); accept_prob [B, M + 1] a(x) of the accepted candidate below each path node (0 at the
    stop); leaf [B] the walk accepted a node without children (the emitted token is then drawn from p there)."""

    accept_len: torch.Tensor
    path: torch.Tensor
    tokens: torch.Tensor
    accept_prob: torch.Tensor
    leaf: torch.Tensor


def tree_walk(p: torch.Tensor, tokens: torch.Tensor, q: torch.Tensor, layout: TreeLayout, u_accept: torch.Tensor,
              u_sample: torch.Tensor, support: Optional[torch.Tensor] = None, rule: str = "strict",
              entropy_coef: float = 0.0, tvd_threshold: float = 0.0,
              sibling_q: Optional[torch.Tensor] = None) -> TreeWalk:
    """Verify a draft tree: from the root, at each accepted node RRS over its children in rank order (their shared
    q is that of their level); the first accepted child is the next node; all rejected: emit a draw from the last
    residual; a node without children: emit a draw from its p. The emitted tokens are distributed exactly as the
    target's autoregressive law (tests/test_tree.py).

    The main draft (rank 0) is tested against q with ``rule`` (csd: + λ·H(p) where TVD(p, q) < τ, both at the node;
    the residual stays norm(max(p − q, 0)), so each emitted token has exactly the law of csd on a chain, and the
    same closed-form distortion); the siblings (ranks 1..) by strict RRS against ``sibling_q`` (default q), the law
    they were drawn from without replacement (tree_candidates on sibling_q).

    Shape: p [B, S, V] the target at each slot's output (the law of its children's position); tokens [B, S] each
    slot's token (-1: missing candidate); q, sibling_q [B, M, V] the q of each draft level; u_accept, u_sample
    [B, S]; support [B, S, V] bool or None (p > 0)."""
    batch, slots, _ = p.shape
    levels = layout.levels
    rows = torch.arange(batch, device=p.device)
    children = layout.children.to(p.device)
    cur = torch.zeros(batch, dtype=torch.int64, device=p.device)
    done = torch.zeros(batch, dtype=torch.bool, device=p.device)
    path = torch.full((batch, levels + 1), -1, dtype=torch.int64, device=p.device)
    out = torch.full_like(path, -1)
    accept_prob = torch.zeros(batch, levels + 1, dtype=p.dtype, device=p.device)
    path[:, 0] = 0
    leaf = torch.zeros_like(done)
    residual = p[:, 0]  # the law the emitted token is drawn from, fixed at the stop
    for level in range(levels + 1):
        kids = children[cur]  # [B, K]
        p_j = p[rows, cur]
        q_j = q[:, min(level, levels - 1)]
        sup = None if support is None else support[rows, cur]
        chosen = torch.full_like(cur, -1)
        chosen_a = torch.zeros_like(accept_prob[:, 0])
        ranks = kids.shape[1] if 1 <= level < layout.depth_limit else 1  # only tree nodes have siblings below
        rest = None if sibling_q is None else sibling_q[:, min(level, levels - 1)]
        for r in range(ranks):
            slot = kids[:, r]
            x = torch.where((slot >= 0) & (chosen < 0), tokens[rows, slot.clamp(min=0)], -1)
            relaxed = _relaxed_main(p_j, q_j, x, sup, rule, entropy_coef, tvd_threshold) if r == 0 else None
            a, next_p, next_q = rrs_step(p_j, q_j, x, sup, relaxed, rest if r == 0 else None)
            hit = (x >= 0) & (u_accept[rows, slot.clamp(min=0)] < a)
            chosen, chosen_a = torch.where(hit, slot, chosen), torch.where(hit, a, chosen_a)
            p_j, q_j = torch.where(hit[:, None], p_j, next_p), torch.where(hit[:, None], q_j, next_q)
        stop = ~done & (chosen < 0)
        residual = torch.where(stop[:, None], p_j, residual)
        leaf |= stop & (kids[:, 0] < 0)
        go = ~done & ~stop
        if level < levels:
            accept_prob[:, level] = torch.where(go, chosen_a, 0)
            cur = torch.where(go, chosen, cur)
            path[:, level + 1] = torch.where(go, chosen, -1)
            out[:, level] = torch.where(go, tokens[rows, chosen.clamp(min=0)], -1)
        done |= stop
    accept_len = (path[:, 1:] >= 0).sum(-1)
    emitted = inverse_cdf_sample(residual, u_sample[rows, cur])  # cur: the stop node
    out = out.scatter(1, accept_len[:, None], emitted[:, None])
    return TreeWalk(accept_len, path, out, accept_prob, leaf)


@dataclass
class TreeResult:
    """What verify_tree returns (every backend). The stats at i describe the node path[i] that emits token i.

    Shape: accept_len [B] int64; path, tokens [B, M + 1] int64 (TreeWalk's); accept_prob, entropy, tvd,
    distortion [B, M + 1] float32 (0 after accept_len); status [B] int32 (STATUS_BAD_LOGITS: a visited node had bad
    logits; STATUS_BAD_DRAFT_TOKEN / STATUS_BAD_DRAFT_PROBS: see tree_inputs). entropy H(p)
    at the node; tvd ½Σ|p − q_i| (½ at i = M, no q); distortion csd's closed form at the node (0 without a main
    draft below it, and under the strict rule)."""

    accept_len: torch.Tensor
    path: torch.Tensor
    tokens: torch.Tensor
    accept_prob: torch.Tensor
    entropy: torch.Tensor
    tvd: torch.Tensor
    distortion: torch.Tensor
    status: torch.Tensor


def valid_levels(probs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(probs as float32 with bad rows zeroed, bad [B]): a row is bad as in verify's draft_probs (a negative or
    non-finite value, or a sum off 1 by more than PROB_SUM_TOLERANCE); a zero q accepts nothing and the node emits
    from p, so a bad level costs speed, never the law.  Shape: [B, M, V]."""
    q = probs.float()
    bad = ~(torch.isfinite(q) & (q >= 0)).all(-1) | ~((q.sum(-1) - 1).abs() <= PROB_SUM_TOLERANCE)
    return torch.where(bad[..., None], torch.zeros_like(q), q), bad.any(-1)


def tree_inputs(node_tokens: torch.Tensor, draft_probs: torch.Tensor, sibling_probs: Optional[torch.Tensor],
                vocab: int) -> tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor], torch.Tensor]:
    """verify_tree's inputs made safe, with the status bits that say so: (node tokens as int64, those outside
    [-1, V) missing (-1) and STATUS_BAD_DRAFT_TOKEN — slot 0, the root, is not a candidate; draft_probs and
    sibling_probs through valid_levels, STATUS_BAD_DRAFT_PROBS). Idempotent on what it returns, status aside.

    Shape: node_tokens [B, S]; draft_probs, sibling_probs [B, M, V]; returns ..., status [B] int32."""
    tokens = node_tokens.to(torch.int64)
    bad_token = (tokens < -1) | (tokens >= vocab)
    bad_token[:, 0] = False
    q, bad_q = valid_levels(draft_probs)
    sibling_q, bad_sibling = (None, bad_q) if sibling_probs is None else valid_levels(sibling_probs)
    status = (bad_token.any(1).to(torch.int32) * STATUS_BAD_DRAFT_TOKEN
              | (bad_q | bad_sibling).to(torch.int32) * STATUS_BAD_DRAFT_PROBS)
    return tokens.masked_fill(bad_token, -1), q, sibling_q, status


def verify_tree(target_logits: torch.Tensor, node_tokens: torch.Tensor, draft_probs: torch.Tensor,
                layout: TreeLayout, *, uncond_logits: Optional[torch.Tensor] = None, cfg_scale: float = 1.0,
                temperature: float = 1.0, top_k: Optional[int] = None, top_p: Optional[float] = None,
                min_p: Optional[float] = None, rule: str = "strict", entropy_coef: float = 0.5,
                tvd_threshold: float = 0.65, sibling_probs: Optional[torch.Tensor] = None, seed: torch.Tensor,
                offset: torch.Tensor) -> TreeResult:
    """The fused tree verification, defined: p at every slot (CFG, temperature, top-k / top-p / min-p), the walk
    on the tree stream's uniforms (tree_walk), and the stats of the nodes on the path.

    Shape: target_logits, uncond_logits [B, S, V]; node_tokens [B, S] (slot 0 unused, -1: missing candidate);
    draft_probs, sibling_probs [B, M, V] (M = layout.levels); seed, offset [1] or [B] int64."""
    batch, slots, _ = target_logits.shape
    target = target_distribution(target_logits, uncond_logits, cfg_scale, temperature, top_k, torch.float32, top_p,
                                 min_p)
    node_tokens, q, sibling_q, status_in = tree_inputs(node_tokens, draft_probs, sibling_probs, target.p.shape[-1])
    u_accept, u_sample = tree_uniforms(seed, offset, batch, slots)
    walk = tree_walk(target.p, node_tokens, q, layout, u_accept, u_sample, target.support, rule, entropy_coef,
                     tvd_threshold, sibling_q)
    rows = torch.arange(batch, device=q.device)[:, None]
    on_path = walk.path >= 0
    node = walk.path.clamp(min=0)
    p_at = target.p[rows, node]  # [B, M + 1, V]
    q_at = torch.cat([q, torch.zeros_like(q[:, :1])], 1)
    h = target.h[rows, node]
    tvd = total_variation(p_at, q_at)
    main_child = layout.children.to(q.device)[node, 0]
    has_draft = (main_child >= 0) & (node_tokens.gather(1, main_child.clamp(min=0)) >= 0)
    q_times_a = accepted_mass(p_at, q_at, h, tvd, rule, entropy_coef, tvd_threshold, target.support[rows, node])
    distortion = torch.where(has_draft & (rule == "csd"), closed_form_distortion(p_at, q_at, q_times_a), 0)
    zero = torch.zeros_like(h)
    status = (target.bad[rows, node] & on_path).any(-1).to(torch.int32) * STATUS_BAD_LOGITS
    status = status | status_in
    return TreeResult(walk.accept_len, walk.path, walk.tokens, walk.accept_prob, torch.where(on_path, h, zero),
                      torch.where(on_path, tvd, zero), torch.where(on_path, distortion, zero), status)


def _relaxed_main(p, q, x, support, rule: str, entropy_coef: float, tvd_threshold: float):
    """csd's a(x) of a main draft against its q at the node (None under the strict rule: rrs_step's min(1, p/q))."""
    if rule == "strict":
        return None
    index = x.clamp(min=0)[..., None]
    p_x, q_x = p.gather(-1, index).squeeze(-1), q.gather(-1, index).squeeze(-1)
    in_support = p_x > 0 if support is None else support.gather(-1, index).squeeze(-1)
    return acceptance_probability(p_x, q_x, entropy(p), total_variation(p, q), rule, entropy_coef, tvd_threshold,
                                  in_support)
