"""Grouped speculative decoding (GSD, So et al. 2025) verification, in plain vectorised PyTorch.

For a draft x at a position with target p and draft distribution q, the *group* of x is the set of tokens whose rank
in p (sorted by p, descending; ties by token id) is within ±``group_rank`` of x's rank AND whose probability is
within ``group_delta`` of p(x) (absolute difference). Because p is monotone along the ranks, both conditions give an
interval of ranks, so every token's group is a contiguous rank interval and its sums come from prefix sums: O(V log V)
per position, no loop over tokens. Acceptance:

    a(x) = min(1, Σ_{y∈G(x)} p(y) / Σ_{y∈G(x)} q(y))          (0 when the group has no q mass)

On rejection the token is resampled from the distortion-optimal residual r ∝ max(p − q·a, 0)
(:func:`csd_kernels.reference.optimal_residual` with the grouped q·a), so the emitted law is
out = q·a + (1 − Σ q·a)·r and distortion = ½ Σ |out − p| (exact, per position).

Defaults k = 12, δ = 0.15 follow the CSD authors' GSD baseline settings. Randomness is the reference step stream
(u_accept, u_sample) of :func:`csd_kernels.reference.step_uniforms`; the positions after the accepted prefix get
independent draws from p (the "independent" next-draft rule), so batching and seeding behave as in ``verify``.
"""

from __future__ import annotations

from typing import Optional

import torch

from . import reference as R

__all__ = ["DEFAULT_GROUP_RANK", "DEFAULT_GROUP_DELTA", "group_acceptance", "grouped_verify"]

DEFAULT_GROUP_RANK = 12
DEFAULT_GROUP_DELTA = 0.15


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
    ratio = torch.where(sum_q > 0, sum_p / torch.where(sum_q > 0, sum_q, torch.ones_like(sum_q)), torch.zeros_like(sum_p))
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
    group_rank: int = DEFAULT_GROUP_RANK,
    group_delta: float = DEFAULT_GROUP_DELTA,
    start: torch.Tensor,
    positions: torch.Tensor,
    seed: torch.Tensor,
    offset: torch.Tensor,
    return_probs: bool = True,
) -> R.VerifyOutputs:
    """GSD verification with the outputs of :func:`csd_kernels.reference.verify` (same shapes and conventions:
    positions < start[b] are committed; accept_len = first uncommitted rejection; tokens = drafts, resampled token,
    then fresh draws from p).  Shape: target_logits [B, L, V], draft_tokens [B, L], draft_probs [B, L, V] or None,
    seed [1] or [B], offset [1] or [B] (per-row step-stream offsets, as in the reference)."""
    batch, length, vocab = target_logits.shape
    device = target_logits.device
    z = R.mixed_logits(target_logits, uncond_logits, cfg_scale, temperature)
    bad_logits = ~torch.isfinite(z).all(-1)  # [B, L]: NaN / Inf in the model's logits
    z = R.restrict_top_k(torch.where(bad_logits[..., None], torch.zeros_like(z), z), top_k)
    p = R.target_probs(z, temperature)  # [B, L, V]
    h = R.entropy(p)
    token = draft_tokens.to(torch.int64)
    has_draft = token >= 0
    index = token.clamp(min=0)[..., None]
    if draft_probs is None:
        q = torch.nn.functional.one_hot(token.clamp(min=0), vocab).to(p.dtype) * has_draft[..., None]
    else:
        q = draft_probs.to(p.dtype).expand(batch, length, vocab)
    a = group_acceptance(p, q, group_rank, group_delta)  # [B, L, V]
    q_times_a = q * a
    residual = R.optimal_residual(p, q_times_a)
    out = R.output_distribution(p, q, q_times_a, residual)
    distortion = torch.where(has_draft, 0.5 * (out - p).abs().sum(-1), torch.zeros_like(h))
    q_x = q.gather(-1, index).squeeze(-1)
    accept_prob = torch.where(has_draft & (q_x > 0), a.gather(-1, index).squeeze(-1), torch.zeros_like(h))

    u_accept, u_sample = R.step_uniforms(seed.reshape(-1), offset.reshape(-1), positions, length)
    window = torch.arange(length, device=device)
    committed = window[None, :] < start.reshape(-1, 1)
    accepted = has_draft & (u_accept < accept_prob)
    stops = ~accepted & ~committed
    accept_len = torch.where(stops.any(-1), stops.to(torch.int64).argmax(-1), torch.full((batch,), length, device=device))
    from_p = R.inverse_cdf_sample(p, u_sample)
    resampled = torch.where(has_draft, R.inverse_cdf_sample(residual, u_sample), from_p)
    tokens = torch.where(window < accept_len[:, None], token, from_p)
    tokens = torch.where(window == accept_len[:, None], resampled, tokens)
    tvd = R.total_variation(p, q)
    return R.VerifyOutputs(
        accept_len=accept_len.to(torch.int32),
        tokens=tokens,
        probs=p.float() if return_probs else None,
        entropy=h.float(),
        tvd=torch.where(has_draft, tvd, torch.full_like(tvd, float("nan"))).float(),
        accept_prob=accept_prob.float(),
        distortion=distortion.float(),
        status=bad_logits.any(-1).to(torch.int32) * R.STATUS_BAD_LOGITS,
    )
