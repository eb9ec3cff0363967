"""The target and draft distributions of a window and the per-position statistics: CFG mix, temperature, top-k /
top-p / min-p, entropy, TVD, the residual and the output law (see the package docstring for the definitions; the
acceptance rules are rules.py), and which inputs are bad (the STATUS_* bits every backend writes)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch

__all__ = ["STATUS_BAD_LOGITS", "STATUS_BAD_DRAFT_TOKEN", "STATUS_BAD_DRAFT_PROBS", "STATUS_MISSING_COMMITTED_TOKEN",
           "PROB_SUM_TOLERANCE", "mixed_logits", "restrict_top_k", "restrict_top_p", "restrict_min_p", "target_probs",
           "entropy", "total_variation", "optimal_residual",
           "output_distribution", "closed_form_distortion", "inverse_cdf_sample", "Target", "Drafts",
           "target_distribution", "target_distribution_from_probs", "draft_distribution"]

# Per-row status bits written by every backend (OR over the row's positions). The Python wrapper turns them into
# ValueErrors naming the argument when validate=True.
STATUS_BAD_LOGITS = 1  # NaN or +Inf in target_logits / uncond_logits, an overflowing CFG mix, no finite logit;
#                        with target_probs: a negative or non-finite value, or a sum off 1 by > PROB_SUM_TOLERANCE
STATUS_BAD_DRAFT_TOKEN = 2  # a draft token outside [-1, V)
STATUS_BAD_DRAFT_PROBS = 4  # a negative or non-finite value in draft_probs, or a row sum off 1 by > PROB_SUM_TOLERANCE,
#                             at a position with a draft (an undrafted position's q row decides nothing)
STATUS_MISSING_COMMITTED_TOKEN = 8  # draft_tokens[b, i] = -1 at a position i < start[b]

# |Σ row − 1| allowed in draft_probs and target_probs rows (fp32 softmax over any vocabulary is far inside it; a row
# scaled by 0.5 or left unnormalised after masking is far outside it).
PROB_SUM_TOLERANCE = 1e-3


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
    """½Σ|out − p| of a rule resampled from its optimal residual max(p − q·a, 0): Σ max(q·a − min(p, q), 0)
    (= Σ max(q·a − p, 0) for any a ≤ 1; for a rule with q·a ≥ min(p, q) that residual is max(p − q, 0)).

    The tests hold it against output_distribution.
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
    draft_probs; zeroed where the draft_probs row was not a distribution), and the input flags (bad_probs: such a row
    at a position with a draft).  [B, L, (V)]"""

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
        not_a_law = ~(torch.isfinite(q) & (q >= 0)).all(-1) | ~((total - 1).abs() <= PROB_SUM_TOLERANCE)
        q = torch.where(not_a_law[..., None], torch.zeros_like(q), q)
        # Reported only where a draft is tested: an undrafted position's q row decides nothing (FlashInfer's / vLLM's
        # bonus slot is padded with a zero row); there it only enters the tvd statistic, as the zero vector.
        bad_probs = not_a_law & has_draft
    return Drafts(token, has_draft, bad_token, q, bad_probs)
