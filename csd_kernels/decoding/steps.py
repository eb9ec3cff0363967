"""The steps of one Jacobi iteration: drafts for the window, their q, one forward call, verification by mode (one
table, :data:`VERIFY`), commit. Shapes: B rows, L window slots (grid positions [m, end)), V image tokens."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from .. import reference as ref
from ..ops.drafts import random_draft_tokens
from ..ops.verify import verify
from ..reference.gsd import grouped_verify
from .state import RowState, Window

__all__ = ["Settings", "Drafted", "Verified", "draft_window", "draft_probs", "forward", "VERIFY", "commit"]


@dataclass(frozen=True)
class Settings:
    """What generate() was asked, resolved (every field as the steps use it)."""

    mode: str
    window: int
    total: int  # H·W grid tokens
    width: int  # W
    vocab: int
    cfg_scale: float
    temperature: float
    top_k: Optional[int]
    entropy_coef: float
    tvd_threshold: float
    draft_init: str
    coupling: str  # reference.COUPLINGS
    backend: Optional[str]
    group_rank: int
    group_delta: float
    seeds: torch.Tensor  # [B] per-row seeds
    need_q: bool  # drafts carry their q (sampling modes with T > 0)
    top_p: Optional[float] = None
    min_p: Optional[float] = None
    tree: Optional[tuple] = None  # (K, D): a draft tree in the window (static loop, sjd or csd; decoding/tree.py)


@dataclass
class Drafted:
    tokens: torch.Tensor  # [B, L] committed tokens, sampled or fresh drafts, -1 where there is none
    fresh_tokens: torch.Tensor  # [B, L] the fresh draft of every slot
    above: Optional[torch.Tensor]  # [B, L] fresh slots drafted from the row above (draft_init="above")
    positions: torch.Tensor  # [B] absolute grid index of slot 0 (verify's ``positions``)


@dataclass
class Verified:
    result: ref.VerifyResult
    accept_len: torch.Tensor  # [B]
    accept_prob: torch.Tensor  # [B, L] for the acceptance map
    distortion: torch.Tensor  # [B, L] for the distortion map


def draft_window(state: RowState, win: Window, run: Settings) -> Drafted:
    """A draft for every slot: the committed token, the token sampled there last time, or a fresh draft (uniformly
    random from the step stream, or the committed token of the grid row above)."""
    batch = state.seq.shape[0]
    positions = torch.full((batch,), win.m, dtype=torch.int64, device=state.seq.device)  # [B]
    fresh_tokens = random_draft_tokens(run.seeds, state.attempts, positions, win.length, run.vocab)  # [B, L]
    above = None
    if run.draft_init == "above":
        above_pos = win.grid_pos[0] - run.width  # [L]
        above = win.fresh & (above_pos >= 0) & (above_pos < state.n_dev)  # [B, L]
        fresh_tokens = torch.where(above, state.seq[:, above_pos.clamp(min=0)], fresh_tokens)
    tokens = torch.where(win.committed | win.sampled, state.seq[:, win.m:win.end],
                         torch.where(win.fresh, fresh_tokens, -1))
    return Drafted(tokens, fresh_tokens, above, positions)


def draft_probs(state: RowState, win: Window, drafted: Drafted, run: Settings) -> Optional[torch.Tensor]:
    """q [B, L, V] of the drafts: 1/V for fresh ones (a stride-0 view), one-hot for a token from above, the stored p
    for sampled ones. None when q is not needed (at T = 0 p is one-hot and any q gives the same decisions)."""
    if not run.need_q:
        return None
    batch, length, vocab = state.seq.shape[0], win.length, run.vocab
    fill = torch.full((1, 1, 1), 1.0 / vocab, device=state.seq.device).expand(batch, length, vocab)
    if drafted.above is not None:
        fill = torch.where(drafted.above[..., None], torch.nn.functional.one_hot(drafted.fresh_tokens, vocab).float(),
                           fill)
    if not any(s and a for s, a in zip(state.sampled_rows, win.active)):
        return fill
    index = (win.grid_pos - state.n_dev).clamp(0, run.window - 1)  # [B, L] slot of the row's q store
    stored = state.q_store.gather(1, index[..., None].expand(batch, length, vocab))
    return torch.where(win.sampled[..., None], stored, fill)


def forward(adapter, state: RowState, win: Window, drafted: Drafted):
    """One model call on the inputs x_{m-1} .. x_{end-2} -> (cond, uncond or None) logits [B, L, V]."""
    adapter.crop(win.m - 1)
    batch = state.seq.shape[0]
    last = state.seq[:, win.m - 1:win.m] if win.m > 0 else state.seq.new_zeros(batch, 1)
    cond, uncond = adapter.forward(torch.cat([last, drafted.tokens[:, :-1].clamp(min=0)], 1), win.m - 1)
    if cond.dtype == torch.float64:  # verify takes float32 / bf16 / fp16 logits
        cond, uncond = cond.float(), (None if uncond is None else uncond.float())
    return cond, uncond


# ----------------------------------------------------------------------------------------------------------------------
# verification, by mode
# ----------------------------------------------------------------------------------------------------------------------
def _common(cond, uncond, run: Settings, state: RowState, win: Window, drafted: Drafted) -> dict:
    return dict(uncond_logits=uncond, cfg_scale=run.cfg_scale, temperature=run.temperature, top_k=run.top_k,
                top_p=run.top_p, min_p=run.min_p, start=win.start, positions=drafted.positions, seed=run.seeds,
                offset=state.attempts)


def _speculative(cond, uncond, q, run: Settings, state: RowState, win: Window, drafted: Drafted) -> Verified:
    """ar, sjd (strict rule), csd (CSD's rule): one verify call."""
    res = verify(cond, drafted.tokens, q, **_common(cond, uncond, run, state, win, drafted),
                 rule="csd" if run.mode == "csd" else "strict", entropy_coef=run.entropy_coef,
                 tvd_threshold=run.tvd_threshold, coupling=run.coupling, return_probs=run.need_q, backend=run.backend,
                 validate=False)
    return Verified(res, res.accept_len, res.accept_prob, res.distortion)


def _jacobi(cond, uncond, q, run: Settings, state: RowState, win: Window, drafted: Drafted) -> Verified:
    """jd: fresh samples at every uncommitted position; drafts are accepted while they equal the fresh sample."""
    res = verify(cond, torch.where(win.committed, drafted.tokens, -1), None,
                 **_common(cond, uncond, run, state, win, drafted), rule="strict", coupling="independent",
                 return_probs=False, backend=run.backend, validate=False)
    match = win.committed | (drafted.tokens == res.tokens)  # [B, L]
    accept_len = torch.where(match.all(-1), win.length, (~match).to(torch.int64).argmax(-1))
    # the acceptance map holds the match indicator; the distortion of matching sampled drafts is not tracked
    return Verified(res, accept_len, match.float(), torch.full_like(res.entropy, float("nan")))


def _grouped(cond, uncond, q, run: Settings, state: RowState, win: Window, drafted: Drafted) -> Verified:
    """gsd: grouped acceptance (torch)."""
    res = grouped_verify(cond, drafted.tokens, q, **_common(cond, uncond, run, state, win, drafted),
                         group_rank=run.group_rank, group_delta=run.group_delta, return_probs=run.need_q)
    return Verified(res, res.accept_len, res.accept_prob, res.distortion)


VERIFY = {"ar": _speculative, "jd": _jacobi, "sjd": _speculative, "gsd": _grouped, "csd": _speculative}


# ----------------------------------------------------------------------------------------------------------------------
# commit
# ----------------------------------------------------------------------------------------------------------------------
def commit(state: RowState, win: Window, verified: Verified, accept_list: list, run: Settings) -> None:
    """Active rows commit their accepted prefix and the resampled token, keep the next drafts (and their p as q)
    for their new window, and count the attempt; a paused row keeps everything as it is."""
    window, total = run.window, run.total
    new_n = [min(win.m + a + 1, max(min(nb + window, total), nb)) if act else nb
             for a, nb, act in zip(accept_list, state.n, win.active)]
    new_dev = torch.minimum(win.m + verified.accept_len.to(torch.int64)[:, None] + 1,
                            torch.maximum(win.win_end, state.n_dev))  # [B, 1]
    new_dev = torch.where(win.active_dev, new_dev, state.n_dev)
    res = verified.result
    span = state.seq[:, win.m:win.end]
    state.seq[:, win.m:win.end] = res.tokens if win.all_active else torch.where(win.active_dev, res.tokens, span)
    newly = (win.grid_pos >= state.n_dev) & (win.grid_pos < new_dev)  # [B, L]
    stats = torch.stack([res.entropy, verified.accept_prob, verified.distortion, res.tvd]).float()  # [4, B, L]
    state.maps[:, :, win.m:win.end] = torch.where(newly[None], stats, state.maps[:, :, win.m:win.end])
    state.accepted.append([b - a for a, b in zip(state.n, new_n)])
    state.sampled_rows = [min(nb + window, total) > nn if act else s
                          for nb, nn, act, s in zip(state.n, new_n, win.active, state.sampled_rows)]
    if run.need_q and any(state.sampled_rows):  # p at the row's new window: the q of its next drafts
        slots = torch.arange(window, device=new_dev.device)[None, :]
        index = (new_dev - win.m + slots).clamp(0, win.length - 1)  # [B, W] window slot of each q-store slot
        fresh_q = res.probs.gather(1, index[..., None].expand(-1, -1, run.vocab))
        state.q_store = fresh_q if win.all_active else torch.where(win.active_dev[..., None], fresh_q, state.q_store)
    state.drafted_dev = torch.where(win.active_dev, win.win_end, state.drafted_dev)
    state.attempts = state.attempts + win.active_dev[:, 0].to(torch.int64)
    state.n, state.n_dev = new_n, new_dev
