"""Other decoders' speculative-sampling conventions as thin wrappers over :func:`csd_kernels.verify`.

* :func:`chain_speculative_sampling`: FlashInfer's ``flashinfer.sampling.chain_speculative_sampling`` (shapes,
  output layout, accepted / emitted counts).
* :func:`rejection_sample`: vLLM's rejection sampler (placeholder −1, greedy path, bonus token, recovered tokens)
  on padded [B, n] drafts.

Both call ``verify`` once with L = n + 1 window positions: n drafted positions and an undrafted last slot (draft −1),
where verify samples from the target p — the bonus token when every draft was accepted. The rule is the lossless
speculative test (``rule="strict"``): accept x with probability min(1, p(x)/q(x)), else draw from max(p − q, 0).
Nothing here computes probabilities itself: the maths is verify's (defined once in :mod:`csd_kernels.reference`).
"""

from __future__ import annotations

from typing import Optional

import torch

from .checks import SeedLike
from .verify import verify

__all__ = ["PLACEHOLDER_TOKEN_ID", "chain_speculative_sampling", "rejection_sample"]

PLACEHOLDER_TOKEN_ID = -1  # vLLM's and FlashInfer's padding after the emitted tokens


def _window_drafts(draft_token_ids: torch.Tensor, length: int) -> torch.Tensor:
    """[B, L] drafts: the [B, n] drafts followed by −1 (undrafted) up to L = n + 1."""
    if not isinstance(draft_token_ids, torch.Tensor) or draft_token_ids.dim() != 2:
        raise ValueError(f"draft_token_ids must be an integer tensor [B, n], got "
                         f"{getattr(draft_token_ids, 'shape', type(draft_token_ids).__name__)}")
    batch, n = draft_token_ids.shape
    window = draft_token_ids.new_full((batch, length), -1, dtype=torch.int64)
    window[:, :n] = draft_token_ids  # one copy, whatever the integer dtype
    return window


def _window_draft_probs(draft_probs: Optional[torch.Tensor], n: int, batch: int, vocab: int):
    """[B, n + 1, V] q for verify: the draft rows, then a zero row for the undrafted bonus slot (a q row where no
    draft is tested decides nothing and is not checked). A [B, n + 1, V] draft_probs is taken as is (no copy)."""
    if draft_probs is None:
        return None
    if not isinstance(draft_probs, torch.Tensor) or draft_probs.dim() != 3:
        raise ValueError(f"draft_probs must be a float32 tensor [B, n, V], got "
                         f"{getattr(draft_probs, 'shape', type(draft_probs).__name__)}")
    if tuple(draft_probs.shape) == (batch, n + 1, vocab):
        return draft_probs
    if tuple(draft_probs.shape) != (batch, n, vocab):
        raise ValueError(f"draft_probs must have shape [B, n, V] = {(batch, n, vocab)} (or [B, n + 1, V]), got "
                         f"{tuple(draft_probs.shape)}")
    return torch.cat([draft_probs, draft_probs.new_zeros(batch, 1, vocab)], 1)


def _check_target(name: str, target: torch.Tensor, batch: int, n: int) -> None:
    if not isinstance(target, torch.Tensor) or target.dim() != 3:
        raise ValueError(f"{name} must be a tensor [B, n + 1, V], got "
                         f"{getattr(target, 'shape', type(target).__name__)}")
    if tuple(target.shape[:2]) != (batch, n + 1):
        raise ValueError(f"{name} must have shape [B, n + 1, V] with [B, n] = {(batch, n)} from draft_token_ids, got "
                         f"{tuple(target.shape)}")


def _seed(seed: Optional[SeedLike], offset: Optional[SeedLike], generator: Optional[torch.Generator]):
    """(seed, offset): as given, or — like FlashInfer without seed/offset — a fresh seed drawn on the host from
    ``generator`` (torch's default CPU generator when None), so repeated calls are not correlated. No device sync."""
    if seed is None:
        seed = int(torch.randint(0, 1 << 62, (), generator=generator))
    return seed, 0 if offset is None else offset


def _emitted_layout(tokens: torch.Tensor, emitted: torch.Tensor) -> torch.Tensor:
    """[B, n + 1] int32: the first emitted + 1 tokens, PLACEHOLDER_TOKEN_ID after them."""
    window = torch.arange(tokens.shape[1], device=tokens.device)
    keep = window[None, :] <= emitted[:, None]
    return torch.where(keep, tokens, PLACEHOLDER_TOKEN_ID).to(torch.int32)


def chain_speculative_sampling(
    draft_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    target_probs: torch.Tensor,
    maybe_output_accepted_token_num: Optional[torch.Tensor] = None,
    maybe_output_emitted_draft_token_num: Optional[torch.Tensor] = None,
    deterministic: bool = True,
    generator: Optional[torch.Generator] = None,
    seed: Optional[SeedLike] = None,
    offset: Optional[SeedLike] = None,
    *,
    backend: Optional[str] = None,
    validate: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """FlashInfer's ``chain_speculative_sampling`` on :func:`csd_kernels.verify` (same arguments and outputs).

    Returns (output_token_ids, output_accepted_token_num, output_emitted_draft_token_num):

    * output_token_ids [B, n + 1] int32: the accepted drafts, then one token from the target — drawn from
      max(p − q, 0) at the first rejection, or the bonus token from the last row of target_probs when all n drafts
      were accepted — then −1.
    * emitted [B] int32: how many drafts were accepted in a row (0..n); emitted + 1 entries are not −1.
    * accepted [B] int32: how many of the n drafts pass their own test u_i < min(1, p(x_i)/q(x_i)) when each
      position is considered on its own (the alignment of draft and target; ≥ emitted).

    Given ``maybe_output_*`` tensors [B] int32, the counts are added to them in place (FlashInfer's convention).
    ``seed`` / ``offset``: as in :func:`csd_kernels.verify` (ints or int64 tensors of 1 or B elements, tensors keep
    the call CUDA-graph safe); without a seed, one is drawn on the host from ``generator``. The result is always
    deterministic for a given seed, offset and input (``deterministic`` is accepted and ignored).
    Differences from FlashInfer: a draft with q(x) = 0 is rejected (FlashInfer accepts it when p(x) > 0); a draft
    token −1 means "no draft" (the position is sampled from the target and ends the chain); rows of target_probs, and
    the draft_probs rows of drafted positions, must sum to 1 within 1e-3 (target rows are renormalised, see
    ``verify(target_probs=)``; the q row of an undrafted position decides nothing and is not checked).
    ``validate=True`` raises ValueError on bad input (one host sync); ``validate=False`` never syncs.

    Shape: draft_probs [B, n, V] float32 (or [B, n + 1, V], without a copy: the last row, at the undrafted bonus
    slot, decides nothing and may be anything, e.g. zeros),
    draft_token_ids [B, n] int, target_probs [B, n + 1, V].
    """
    del deterministic
    result, n = _verify_chain(draft_token_ids, draft_probs, dict(target_probs=target_probs), seed, offset, generator,
                              backend, validate)
    emitted = result.accept_len
    output = _emitted_layout(result.tokens, emitted)
    # coupling="maximal": after the first rejection a position keeps its draft iff u_i < min(1, p/q) (its own test);
    # a residual draw never equals a rejected draft, and accept_prob > 0 excludes drafts with q(x) = 0.
    window = torch.arange(n, device=emitted.device)
    later_pass = (result.tokens[:, :n] == draft_token_ids) & (result.accept_prob[:, :n] > 0)
    accepted = emitted + (later_pass & (window[None, :] > emitted[:, None])).sum(1, dtype=torch.int32)
    if maybe_output_accepted_token_num is not None:
        accepted = maybe_output_accepted_token_num.add_(accepted)
    if maybe_output_emitted_draft_token_num is not None:
        emitted = maybe_output_emitted_draft_token_num.add_(emitted)
    return output, accepted, emitted


def rejection_sample(
    draft_token_ids: torch.Tensor,
    draft_probs: Optional[torch.Tensor] = None,
    target_logits: Optional[torch.Tensor] = None,
    *,
    target_probs: Optional[torch.Tensor] = None,
    temperature: float = 1.0,
    bonus_token_ids: Optional[torch.Tensor] = None,
    seed: Optional[SeedLike] = None,
    offset: Optional[SeedLike] = None,
    generator: Optional[torch.Generator] = None,
    backend: Optional[str] = None,
    validate: bool = True,
) -> torch.Tensor:
    """vLLM's rejection sampler on :func:`csd_kernels.verify`, on padded drafts.

    Returns output_token_ids [B, n + 1] int32: per row the accepted drafts, then the recovered token (drawn from
    max(p − q, 0) at the first rejection) or the bonus token (when every draft of the row was accepted), then
    PLACEHOLDER_TOKEN_ID (−1).

    * Ragged batches: pad draft_token_ids with −1 after a row's last draft (vLLM's flattened
      ``cu_num_draft_tokens`` layout → one row per request); the bonus token of a row with k drafts comes from
      position k of its target rows.
    * ``draft_probs=None`` (n-gram / EAGLE-style drafts without probabilities): q is one-hot at the draft, so x is
      accepted with probability p(x) and the recovered token is drawn from p with x removed.
    * ``temperature=0``: the greedy path — p is one-hot at argmax(target logits), so a draft is accepted iff it
      equals the argmax, and the recovered / bonus token is the argmax.
    * ``bonus_token_ids`` [B] (vLLM samples it with its ordinary sampler): replaces the token verify draws at the
      bonus position of rows that accepted every draft.

    Exactly one of ``target_logits`` and ``target_probs`` (each [B, n + 1, V]); ``temperature`` applies to logits
    only (target_probs are the final distribution: take the argmax yourself for a greedy path on probabilities).
    Seeds, ``validate``, ``backend``: as in :func:`chain_speculative_sampling`.

    Shape: draft_token_ids [B, n] int, draft_probs [B, n, V] float32 or None, bonus_token_ids [B] int.
    """
    if (target_logits is None) == (target_probs is None):
        raise ValueError("give exactly one of target_logits and target_probs")
    _check_bonus(bonus_token_ids, draft_token_ids)
    target = dict(target_logits=target_logits, temperature=temperature) if target_probs is None else dict(
        target_probs=target_probs)
    result, n = _verify_chain(draft_token_ids, draft_probs, target, seed, offset, generator, backend, validate)
    emitted, tokens = result.accept_len, result.tokens
    if bonus_token_ids is not None:
        drafted = (draft_token_ids >= 0).sum(1)  # a row's bonus slot: its first undrafted position
        slot = torch.arange(n + 1, device=tokens.device)[None, :] == emitted[:, None]
        tokens = torch.where(slot & (emitted == drafted)[:, None], bonus_token_ids.to(tokens.dtype)[:, None], tokens)
    return _emitted_layout(tokens, emitted)


def _check_bonus(bonus_token_ids, draft_token_ids) -> None:
    if bonus_token_ids is None:
        return
    batch = draft_token_ids.shape[0] if isinstance(draft_token_ids, torch.Tensor) else None
    if (not isinstance(bonus_token_ids, torch.Tensor) or bonus_token_ids.is_floating_point()
            or tuple(bonus_token_ids.shape) != (batch,)):
        got = getattr(bonus_token_ids, "shape", type(bonus_token_ids).__name__)
        raise ValueError(f"bonus_token_ids must be an integer tensor [B] = [{batch}], got "
                         f"{getattr(bonus_token_ids, 'dtype', '')} {got}")


def _verify_chain(draft_token_ids, draft_probs, target: dict, seed, offset, generator, backend, validate):
    """(verify's result over L = n + 1 positions, n) with the lossless rule and the maximal coupling.

    ``target``: target_logits= (and temperature=) or target_probs=, as verify takes them.
    """
    if not isinstance(draft_token_ids, torch.Tensor) or draft_token_ids.dim() != 2:
        raise ValueError(f"draft_token_ids must be an integer tensor [B, n], got "
                         f"{getattr(draft_token_ids, 'shape', type(draft_token_ids).__name__)}")
    batch, n = draft_token_ids.shape
    name = "target_probs" if "target_probs" in target else "target_logits"
    _check_target(name, target[name], batch, n)
    q = _window_draft_probs(draft_probs, n, batch, target[name].shape[-1])
    seed, offset = _seed(seed, offset, generator)
    result = verify(draft_tokens=_window_drafts(draft_token_ids, n + 1), draft_probs=q, **target, rule="strict",
                    coupling="maximal", seed=seed, offset=offset, return_probs=False, backend=backend,
                    validate=validate)
    return result, n
