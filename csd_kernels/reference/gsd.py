"""Grouped speculative decoding (GSD, So et al. 2025) verification, in plain vectorised PyTorch.

For a draft x at a position with target p and draft distribution q, the *group* of x is the set of tokens whose rank
in p (sorted by p, descending; ties by token id) is within ±``group_rank`` of x's rank AND whose probability is
within ``group_delta`` of p(x) (absolute difference). Because p is monotone along the ranks, both conditions give an
interval of ranks, so every token's group is a contiguous rank interval and its sums come from prefix sums: O(V log V)
per position, no loop over tokens. Acceptance:

    a(x) = min(1, Σ_{y∈G(x)} p(y) / Σ_{y∈G(x)} q(y))          (0 when the group has no q mass)

On rejection the token is resampled from the distortion-optimal residual r ∝ max(p − q·a, 0)
(:func:`.distributions.optimal_residual` with the grouped q·a), so the emitted law is
out = q·a + (1 − Σ q·a)·r and distortion = ½ Σ |out − p| (exact, per position).

Defaults k = 12, δ = 0.15 follow the CSD authors' GSD baseline settings. Randomness is the reference step stream
(u_accept, u_sample) of :func:`.rng.step_uniforms`; the positions after the accepted prefix get
independent draws from p (the "independent" next-draft rule), so batching and seeding behave as in ``verify``.
"""

from __future__ import annotations

from typing import Optional

import torch

from ..constants import DEFAULT_GROUP_DELTA, DEFAULT_GROUP_RANK
from .distributions import (
    draft_distribution,
    inverse_cdf_sample,
    optimal_residual,
    output_distribution,
    target_distribution,
    total_variation,
)
from .rng import step_uniforms
from .verify import VerifyResult, accept_prefix, assemble

__all__ = ["DEFAULT_GROUP_RANK", "DEFAULT_GROUP_DELTA", "group_acceptance", "grouped_verify"]



def group_acceptance(p: torch.Tensor, q: torch.Tensor, group_rank: int = DEFAULT_GROUP_RANK,
                     group_delta: float = DEFAULT_GROUP_DELTA) -> torch.Tensor:
    """a(y) = min(1, Σ_G(y) p / Σ_G(y) q) for every token y.  Shape: p, q [..., V] -> [..., V]."""
    vocab = p.shape[-1]
    order = torch.sort(p, dim=-1, descending=True, stable=True).indices  # [..., V] token at each rank
    p_sorted = p.gather(-1, order)
    q_sorted = q.gather(-1, order)
    ascending = (-p_sorted).contiguous()  # ascending along the ranks
    low_p = torch.searchsorted(ascending, (-(p_sorted + group_delta)).contiguous(), right=False)
    high_p = torch.searchsorted(ascending, (-(p_sorted - group_delta)).contiguous(), right=True) - 1
    rank = torch.arange(vocab, device=p.device)
    low = torch.maximum(rank - group_rank, low_p).clamp(0, vocab - 1)
    high = torch.minimum(rank + group_rank, high_p).clamp(0, vocab - 1)
    high = torch.maximum(high, rank)  # the group always holds x itself (guards float rounding)
    low = torch.minimum(low, rank)
    zero = torch.zeros_like(p_sorted[..., :1])
    cum_p = torch.cat([zero, p_sorted.cumsum(-1)], -1)  # [..., V + 1]
    cum_q = torch.cat([zero, q_sorted.cumsum(-1)], -1)
    sum_p = (cum_p.gather(-1, high + 1) - cum_p.gather(-1, low)).clamp(min=0)
    sum_q = (cum_q.gather(-1, high + 1) - cum_q.gather(-1, low)).clamp(min=0)
    ratio = torch.where(sum_q > 0, sum_p / torch.where(sum_q > 0, sum_q, torch.ones_like(sum_q)),
                        torch.zeros_like(sum_p))
    a_sorted = ratio.clamp(max=1.0)
    return torch.zeros_like(a_sorted).scatter(-1, order, a_sorted)


@torch.no_grad()
def grouped_verify(
    target_logits: torch.Tensor,
    draft_tokens: torch.Tensor,
    draft_probs: Optional[torch.Tensor] = None,
    *,
    uncond_logits: Optional[torch.Tensor] = None,
    cfg_scale: float = 1.0,
    temperature: float = 1.0,
    top_k: Optional[int] = None,
    top_p: Optional[float] = None,
    min_p: Optional[float] = None,
    group_rank: int = DEFAULT_GROUP_RANK,
    group_delta: float = DEFAULT_GROUP_DELTA,
    start: torch.Tensor,
    positions: torch.Tensor,
    seed: torch.Tensor,
    offset: torch.Tensor,
    return_probs: bool = True,
) -> VerifyResult:
    """GSD verification with the outputs and conventions of :func:`csd_kernels.reference.verify` (built from the same
    pieces: target and draft distributions, the accepted prefix, the assembled result), only the acceptance and the
    residual differ. Shape: target_logits [B, L, V], draft_tokens [B, L], draft_probs [B, L, V] or None,
    seed [1] or [B], offset [1] or [B] (per-row step-stream offsets, as in the reference)."""
    length, vocab = target_logits.shape[1:]
    target = target_distribution(target_logits, uncond_logits, cfg_scale, temperature, top_k, torch.float32, top_p,
                                     min_p)
    drafts = draft_distribution(draft_tokens, draft_probs, vocab, torch.float32)
    p, q, index = target.p, drafts.q, drafts.token.clamp(min=0)[..., None]
    a = group_acceptance(p, q, group_rank, group_delta)  # [B, L, V]
    q_times_a = q * a
    residual = optimal_residual(p, q_times_a)
    out = output_distribution(p, q, q_times_a, residual)
    distortion = torch.where(drafts.has_draft, 0.5 * (out - p).abs().sum(-1), torch.zeros_like(target.h))
    q_x = q.gather(-1, index).squeeze(-1)
    accept_prob = torch.where(drafts.has_draft & (q_x > 0), a.gather(-1, index).squeeze(-1), torch.zeros_like(target.h))

    u_accept, u_sample = step_uniforms(seed.reshape(-1), offset.reshape(-1), positions, length)
    accept_len, committed = accept_prefix(drafts.has_draft & (u_accept < accept_prob), start, target.bad)
    from_p = inverse_cdf_sample(p, u_sample)
    resampled = torch.where(drafts.has_draft, inverse_cdf_sample(residual, u_sample), from_p)
    return assemble(target, drafts, accept_len, committed, resampled, from_p, total_variation(p, q),
                        accept_prob, distortion, return_probs)
