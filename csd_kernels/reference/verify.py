"""The whole verification step of a window, defined: the accepted prefix, the resampled token, the next drafts by
coupling and the result every backend returns. The ``torch`` backend *is* :func:`verify` with
``compute_dtype=torch.float32``."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch

from ..config.acceptance import RULE_NAMES
from ..constants import COUPLINGS, DEFAULT_ENTROPY_COEF, DEFAULT_TVD_THRESHOLD
from .distributions import (
    STATUS_BAD_DRAFT_PROBS,
    STATUS_BAD_DRAFT_TOKEN,
    STATUS_BAD_LOGITS,
    STATUS_MISSING_COMMITTED_TOKEN,
    Drafts,
    Target,
    draft_distribution,
    inverse_cdf_sample,
    target_distribution,
    target_distribution_from_probs,
    total_variation,
)
from .rng import gumbel_uniforms, step_uniforms
from .rules import Acceptance, relaxed_slots

__all__ = ["RULES", "COUPLINGS", "DEFAULT_ENTROPY_COEF", "DEFAULT_TVD_THRESHOLD", "VerifyResult", "accept_prefix",
           "assemble", "verify"]

RULES = RULE_NAMES  # the acceptance rules of verify, by code (config/acceptance.py)


@dataclass
class VerifyResult:
    """What one verification step returns (every backend, and :func:`csd_kernels.verify`).

    Shape: accept_len [B] int32; tokens [B, L] int64; probs [B, L, V] float32 or None;
    entropy, tvd, accept_prob, distortion [B, L] float32; status [B] int32.

    accept_len: first position at or after ``start`` whose draft was rejected or missing (L if none).
    tokens: the drafts before accept_len, the resampled token at accept_len, and the next drafts after it.
    probs: the target distribution p (after CFG, temperature, top-k).
    entropy: H(p) in nats. tvd: ½Σ|p − q| (½ where there is neither a draft nor draft_probs).
    accept_prob: a(x) for the draft (0 where there is none). distortion: ½Σ|out − p| of the rule at that position
    (NaN for a rule whose distortion needs gathers, lantern and lantern++, unless asked for).
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
    neighbours: Optional[torch.Tensor] = None,
    gather_distortion: bool = False,
    start: torch.Tensor,
    coupling: str = "independent",
    positions: torch.Tensor,
    seed: torch.Tensor,
    offset: torch.Tensor,
    return_probs: bool = True,
    compute_dtype: torch.dtype = torch.float32,
    uniforms: Optional[tuple[torch.Tensor, torch.Tensor]] = None,
    informed: Optional[torch.Tensor] = None,
    max_distortion: float = math.inf,
    **rule_params,
) -> VerifyResult:
    """The reference verification step on already-validated arguments (see csd_kernels.verify for the API).

    ``rule`` and its parameters (``rule_params``, by name; config/acceptance.py): reference.rules defines them.
    ``uniforms`` = (u_accept, u_sample), each [B, L], replaces the Philox step stream (tests use it to fix u).
    ``target_probs`` replaces target_logits (then no CFG, temperature 1 and no top-k / top-p / min-p).
    ``informed`` [B, L] bool (None: every slot): False where the slot's draft carries no information (a uniform fresh
    draft); such a slot is decided by the strict rule whatever ``rule`` is (a = min(1, p/q), distortion 0, the strict
    residual): a relaxed rule relaxes only a drafter's guess (docs/op.md#uninformed-drafts).
    ``max_distortion``: where the rule's distortion at a slot exceeds it, the slot is decided strictly too (the cap a
    relaxed rule may spend per position; inf: none). The decision is a function of p and q, so the slot's law is the
    rule's below the cap and p above it.
    Shape: target_logits or target_probs [B, L, V], draft_tokens [B, L], draft_probs [B, L, V] or None,
    neighbours [V, k] int64 or None, start/positions [B], seed [1] or [B], offset [1] or [B] (per-row step-stream
    offsets).
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
    acc = Acceptance(rule, p, q, support=target.support, h=target.h, tvd=tvd, neighbours=neighbours, **rule_params)
    capped = max_distortion < math.inf
    asked = gather_distortion or capped or not acc.rule.distortion_gathers  # else NaN (its cost: the rule's table)
    q_times_a = acc.accepted_mass() if acc.rule.residual_qa or (asked and not acc.rule.lossless) else None
    distortion = acc.distortion(q_times_a) if asked else torch.full_like(target.h, float("nan"))
    relaxed = relaxed_slots(informed, distortion, max_distortion)
    strict = None if relaxed is None else Acceptance("strict", p, q, support=target.support)
    a_x = _by_slot(relaxed, acc.at(x[..., None])[..., 0], lambda: strict.at(x[..., None])[..., 0])
    accept_prob = torch.where(drafts.has_draft, a_x, torch.zeros_like(target.h))
    distortion = _by_slot(relaxed, distortion, lambda: torch.zeros_like(distortion))
    distortion = torch.where(drafts.has_draft, distortion, torch.zeros_like(distortion))

    u_accept, u_sample = step_uniforms(seed, offset, positions, length) if uniforms is None else (
        u.to(torch.float32) for u in uniforms)
    accepted = drafts.has_draft & (u_accept.to(compute_dtype) < accept_prob)
    accept_len, committed = accept_prefix(accepted, start, target.bad)
    residual = _by_slot(relaxed, acc.residual(q_times_a), lambda: strict.residual(), per_token=True)
    residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual, p)
    from_p = inverse_cdf_sample(p, u_sample)
    resampled = torch.where(drafts.has_draft, inverse_cdf_sample(residual, u_sample), from_p)
    later = _next_drafts(coupling, target, drafts, resampled, from_p, u_accept, temperature, seed, positions,
                         compute_dtype)
    return assemble(target, drafts, accept_len, committed, resampled, later, tvd, accept_prob, distortion, return_probs)


def _by_slot(relaxed: Optional[torch.Tensor], by_rule: torch.Tensor, by_strict, per_token: bool = False):
    """``by_rule`` where the slot is relaxed (relaxed_slots), ``by_strict()`` (the strict rule's value) where it is
    not; [B, L] (or [B, L, V] with ``per_token``)."""
    if relaxed is None:
        return by_rule
    return torch.where(relaxed[..., None] if per_token else relaxed, by_rule, by_strict())


def _next_drafts(coupling, target, drafts, resampled, from_p, u_accept, temperature, seed, positions,
                 compute_dtype) -> torch.Tensor:
    """The tokens drafted for the positions after accept_len, by coupling (see COUPLINGS)."""
    if coupling == "independent":
        return from_p
    if coupling == "maximal":  # keep x with min(1, p(x)/q(x)), else the (strict) residual's draw
        strict = Acceptance("strict", target.p, drafts.q, support=target.support).at(drafts.token[..., None])[..., 0]
        keep = drafts.has_draft & (u_accept.to(compute_dtype) < strict)
        return torch.where(keep, drafts.token, resampled)
    if temperature == 0:  # gumbel
        return target.z.argmax(-1)
    length, vocab = target.z.shape[1:]
    gumbel = -torch.log(-torch.log(gumbel_uniforms(seed, positions, length, vocab)))
    return (target.z + gumbel.to(compute_dtype)).argmax(-1)
