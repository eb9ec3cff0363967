"""One Jacobi iteration, in the pieces every loop calls (the eager loop, eager.py; the static loop, static.py; the draft
tree, tree.py):

    win          = window(state, positions, length, active, run)   what each of the L slots of a row holds
    drafted      = draft(state, win, run)                          a token for every slot
    q            = draft_probs(win, drafted, run, stored)          the drafts' q
    cond, uncond = forward(call, state.seq, win, drafts)           one target-model call
    verified     = verify(cond, uncond, q, run, state, win, drafted)   by the mode's rule (config/modes.py)
    committed    = commit(state, win, drafted, verified)           on the device, in place; [B] tokens committed

The loops differ in where a row's slots sit and when the host looks: the eager loop gives every row the grid positions
[m, end) (m the slowest row's n) and reads the counts once per iteration; the static loop gives each row its own W
slots from its n and never reads; the tree loop puts a draft tree in those slots and verifies it with verify_tree.
Every piece is a function of tensors: no host read, the same ops whatever the values.

Shapes: B rows, L window slots, V image tokens, W the window, N = H·W grid tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch

from .. import reference as ref
from ..config.acceptance import PARAMS
from ..config.generation import GenerationConfig
from ..config.modes import MODE_TABLE, Mode
from ..ops.drafts import random_draft_tokens
from ..ops.verify import verify as verify_op
from ..reference import draft_uniforms, inverse_cdf_sample
from .state import State

__all__ = ["SAMPLING", "Settings", "Window", "Drafted", "Verified", "window", "draft", "from_above", "informed_slots",
           "uniform_probs", "draft_probs", "forward", "verify", "check_status", "commit", "keep_p_rows",
           "sampling_kwargs"]


SAMPLING = ("cfg_scale", "temperature", "top_k", "top_p", "min_p")  # the target distribution's settings


@dataclass(frozen=True)
class Settings:
    """What generate() was asked, resolved (every field as the steps use it); built by keyword from the
    GenerationConfig by :meth:`of`."""

    mode: str
    window: int
    total: int  # H·W grid tokens
    width: int  # W
    vocab: int
    draft_init: str
    coupling: str  # reference.COUPLINGS
    backend: Optional[str]
    seeds: torch.Tensor  # [B] per-row seeds
    need_q: bool  # drafts carry their q (sampling modes with T > 0)
    sampling: dict  # the target distribution: SAMPLING's keywords of verify / verify_tree
    rule: dict  # the verification: rule=, its parameters, neighbours=, gather_distortion=, max_distortion= (verify's)
    tree: Optional[tuple] = None  # (K, D): a draft tree in the window (static loop; decoding/tree.py)

    @classmethod
    def of(cls, config: GenerationConfig, *, window: int, total: int, width: int, vocab: int, coupling: str,
           seeds: torch.Tensor, tree: Optional[tuple] = None,
           neighbours: Optional[torch.Tensor] = None) -> "Settings":
        mode = MODE_TABLE[config.mode]
        rule = dict(rule=mode.rule or "strict", neighbours=neighbours, gather_distortion=config.gather_distortion,
                    max_distortion=config.max_distortion, **config.as_dict(tuple(PARAMS)))
        return cls(mode=config.mode, window=window, total=total, width=width, vocab=vocab,
                   draft_init=config.draft_init, coupling=coupling, backend=config.backend, seeds=seeds,
                   need_q=config.temperature > 0 and mode.needs_q, sampling=config.as_dict(SAMPLING), rule=rule,
                   tree=tree)

    @property
    def p_columns(self) -> int:
        """The columns of the loop's store of p one row back (State.p_rows): the grid's width for "above-p"."""
        return self.width if self.draft_init == "above-p" else 0

    @property
    def info(self) -> Mode:
        """The mode's facts (config/modes.py)."""
        return MODE_TABLE[self.mode]


# ----------------------------------------------------------------------------------------------------------------------
# the window: which slot holds what
# ----------------------------------------------------------------------------------------------------------------------
@dataclass
class Window:
    """L slots per row at grid positions positions_b .. positions_b + L - 1, and what each slot holds."""

    positions: torch.Tensor  # [B] grid index of slot 0 (verify's ``positions``; the model's first input precedes it)
    grid_pos: torch.Tensor  # [B, L]
    active: torch.Tensor  # [B] the row takes part; an inactive row is verified as committed and keeps everything
    win_end: torch.Tensor  # [B] e_b = min(n_b + W, N): the row commits at most up to there
    draft_end: torch.Tensor  # [B] slots before draft_end_b - 1 get a draft (e_b; a tree: the end of its main chain)
    committed: torch.Tensor  # [B, L] committed (or the row inactive): verified as given, never re-decided
    sampled: torch.Tensor  # [B, L] a draft sampled in the row's last active iteration (q = its p)
    fresh: torch.Tensor  # [B, L] a fresh draft (uniform, or from the row above)
    start: torch.Tensor  # [B] committed prefix length in the window (verify's ``start``)
    length: int  # L


def window(state: State, positions: torch.Tensor, length: int, active: torch.Tensor, run: Settings,
           levels: Optional[int] = None) -> Window:
    """The L slots from ``positions`` [B] for every row; ``levels``: drafts at the first ``levels`` positions from n
    only (a tree's main chain). The last slot of a row's window never holds a draft (its token is sampled)."""
    n = state.n
    grid_pos = positions[:, None] + torch.arange(length, device=n.device)  # [B, L]
    win_end = (n + run.window).clamp(max=run.total)
    draft_end = win_end if levels is None else torch.minimum(n + levels + 1, win_end)
    draftable = (grid_pos >= n[:, None]) & (grid_pos < draft_end[:, None] - 1) & active[:, None]
    sampled = draftable & (grid_pos < state.drafted[:, None])
    committed = (grid_pos < n[:, None]) | ~active[:, None]
    start = torch.where(active, (n - positions).clamp(0, length), length)
    return Window(positions, grid_pos, active, win_end, draft_end, committed, sampled, draftable & ~sampled, start,
                  length)


# ----------------------------------------------------------------------------------------------------------------------
# drafts and their q
# ----------------------------------------------------------------------------------------------------------------------
@dataclass
class Drafted:
    tokens: torch.Tensor  # [B, L] committed tokens, sampled or fresh drafts, -1 where there is none
    current: torch.Tensor  # [B, L] what seq holds at the slots (what an inactive row keeps)
    fresh_tokens: torch.Tensor  # [B, L] the fresh draft of every slot
    above: Optional[torch.Tensor]  # [B, L] fresh slots drafted from the row above (draft_init "above", "above-p")
    fresh_q: Optional[torch.Tensor] = None  # [B, L, V] q of the fresh drafts drawn from p above (1/V elsewhere)


def draft(state: State, win: Window, run: Settings, stored: Optional[torch.Tensor] = None) -> Drafted:
    """A draft for every slot: the committed token, the token sampled there last time, or a fresh draft (uniformly
    random from the step stream, or from the grid row above: see :func:`from_above`). ``stored``: the q store at the
    window's slots, as draft_probs takes it (the q of a sampled draft a fresh one below it is drawn from)."""
    fresh_tokens = random_draft_tokens(run.seeds, state.attempts, win.positions, win.length, run.vocab)  # [B, L]
    current = state.seq.gather(1, win.grid_pos)
    above, fresh_q = None, None
    if run.draft_init != "uniform":
        fresh_tokens, above, fresh_q = from_above(state, win, run, fresh_tokens, current, stored)
    tokens = torch.where(win.committed | win.sampled, current, torch.where(win.fresh, fresh_tokens, -1))
    return Drafted(tokens, current, fresh_tokens, above, fresh_q)


def from_above(state: State, win: Window, run: Settings, uniform: torch.Tensor, current: torch.Tensor,
               stored: Optional[torch.Tensor]) -> tuple:
    """Fresh drafts from the grid row above (W columns up) -> (fresh tokens [B, L], above [B, L], q [B, L, V] or
    None). A fresh slot whose position above is committed is drafted from it; one whose position above is a sampled
    draft or a draft from above of this window (a window reaching into the next row) from that draft, row by row down
    the window. "above": the token itself (q one-hot). "above-p": a draw by the step stream's lane 3 from p there
    (the p the committing pass computed, state.p_rows, or the q of the draft above), q = that p; without a p store
    (T = 0 or a mode without q) the token itself, which at T = 0 is p's argmax. Other fresh slots stay uniform."""
    above_pos = win.grid_pos - run.width
    above = win.fresh & (above_pos >= 0) & (above_pos < state.n[:, None])
    in_window = win.fresh & (above_pos >= state.n[:, None])  # the slot above is a draft of this window
    tokens = torch.where(above, state.seq.gather(1, above_pos.clamp(min=0)), uniform)
    q = None
    if state.p_rows is not None and run.draft_init == "above-p":
        column = (win.grid_pos % run.width)[..., None].expand(-1, -1, run.vocab)
        q = torch.where(above[..., None], state.p_rows.gather(1, column),
                        uniform_probs(*tokens.shape, run.vocab, tokens.device))
    keep = win.committed | win.sampled
    for _ in range((win.length - 1) // run.width):  # one grid row further down the window each time
        informed = in_window & _down(above | win.sampled, run.width)
        tokens = torch.where(informed, _down(torch.where(keep, current, tokens), run.width), tokens)
        if q is not None:
            drafts_q = q if stored is None else torch.where(win.sampled[..., None], stored, q)
            q = torch.where(informed[..., None], _down(drafts_q, run.width), q)
        above = above | informed
    if q is None:
        return tokens, above, None
    u = draft_uniforms(run.seeds, state.attempts, win.positions, win.length)
    return torch.where(above, inverse_cdf_sample(q, u), tokens), above, q


def _down(x: torch.Tensor, rows: int) -> torch.Tensor:
    """x [B, L, ...] moved ``rows`` slots along L: slot i gets slot i - rows (the first ``rows`` slots keep theirs)."""
    return torch.cat([x[:, :rows], x[:, :-rows]], 1) if rows < x.shape[1] else x


def informed_slots(win: Window, drafted: Drafted) -> torch.Tensor:
    """[B, L] bool: the slot's draft carries information — every slot but a fresh one drafted uniformly (a draft
    from the row above is a drafter's guess: the token, q one-hot, or a draw from p there, q = that p). verify's
    ``informed``: a relaxed rule was defined for a drafter's q, and with q = 1/V it accepts noise
    (docs/op.md#uninformed-drafts)."""
    uniform = win.fresh if drafted.above is None else win.fresh & ~drafted.above
    return ~uniform


def uniform_probs(batch: int, length: int, vocab: int, device) -> torch.Tensor:
    """[B, L, V] 1/V everywhere, a stride-0 view."""
    return torch.full((1, 1, 1), 1.0 / vocab, device=device).expand(batch, length, vocab)


def draft_probs(win: Window, drafted: Drafted, run: Settings, stored: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """q [B, L, V] of the drafts: 1/V for uniform fresh ones, one-hot for a token from above, p above for a draw from
    it, ``stored`` [B, L, V] (the q store at the window's slots; None: no slot is sampled) for sampled ones. None when
    q is not needed (at T = 0 p is one-hot and any q gives the same decisions)."""
    if not run.need_q:
        return None
    batch = drafted.tokens.shape[0]
    fill = uniform_probs(batch, win.length, run.vocab, drafted.tokens.device)
    if drafted.fresh_q is not None:
        fill = drafted.fresh_q
    elif drafted.above is not None:
        one_hot = torch.nn.functional.one_hot(drafted.fresh_tokens, run.vocab).float()
        fill = torch.where(drafted.above[..., None], one_hot, fill)
    if stored is None:
        return fill
    return torch.where(win.sampled[..., None], stored, fill)


# ----------------------------------------------------------------------------------------------------------------------
# the model call
# ----------------------------------------------------------------------------------------------------------------------
def forward(call: Callable, seq: torch.Tensor, win: Window, drafts: torch.Tensor, float32: bool = False):
    """One target-model call on x_{positions-1} and ``drafts`` [B, L - 1] -> (cond, uncond or None) logits [B, L, V].
    ``call(inputs [B, L])`` is the adapter's forward with the loop's positions bound. The logits come back in a dtype
    verify takes (float64 -> float32; ``float32``: always float32, as the tree loop verifies)."""
    last = seq.gather(1, (win.positions - 1).clamp(min=0)[:, None])  # x_{n-1} (the adapter uses the prompt's at n = 0)
    cond, uncond = call(torch.cat([last, drafts.clamp(min=0)], 1))
    if float32 or cond.dtype == torch.float64:
        cond, uncond = cond.float(), (None if uncond is None else uncond.float())
    return cond, uncond


# ----------------------------------------------------------------------------------------------------------------------
# verification, by mode
# ----------------------------------------------------------------------------------------------------------------------
@dataclass
class Verified:
    tokens: torch.Tensor  # [B, L] accepted prefix, the resampled token, then the next drafts
    accept_len: torch.Tensor  # [B] accepted slots (the committed prefix included)
    stats: torch.Tensor  # [4, B, L] float32 entropy, acceptance probability, distortion, TVD (the maps)
    probs: Optional[torch.Tensor]  # [B, L', V] p at the slots: the next drafts' q (None when not needed)
    status: torch.Tensor  # [B] status bits

    @classmethod
    def chain(cls, res: ref.VerifyResult, accept_len: torch.Tensor, accept_prob: torch.Tensor,
              distortion: torch.Tensor) -> "Verified":
        """From verify's result, with the mode's accepted length and map values."""
        stats = torch.stack([res.entropy, accept_prob, distortion, res.tvd]).float()
        return cls(res.tokens, accept_len, stats, res.probs, res.status)


def sampling_kwargs(run: Settings, uncond: Optional[torch.Tensor], attempts: torch.Tensor) -> dict:
    """The target distribution and the random stream, as verify and verify_tree take them."""
    return dict(uncond_logits=uncond, **run.sampling, seed=run.seeds, offset=attempts)


def _window_kwargs(run: Settings, uncond, state: State, win: Window) -> dict:
    return dict(sampling_kwargs(run, uncond, state.attempts), start=win.start, positions=win.positions)


def _speculative(cond, uncond, q, run: Settings, state: State, win: Window, drafted: Drafted) -> Verified:
    """ar and every speculative mode: one verify call with the mode's acceptance rule (config/modes.py)."""
    res = verify_op(cond, drafted.tokens, q, **_window_kwargs(run, uncond, state, win), **run.rule,
                    coupling=run.coupling, return_probs=run.need_q, informed=informed_slots(win, drafted),
                    backend=run.backend, validate=False)
    return Verified.chain(res, res.accept_len, res.accept_prob, res.distortion)


def _jacobi(cond, uncond, q, run: Settings, state: State, win: Window, drafted: Drafted) -> Verified:
    """jd: fresh samples at every uncommitted position; drafts are accepted while they equal the fresh sample."""
    fresh_only = torch.where(win.committed, drafted.tokens, -1)  # every uncommitted slot sampled afresh
    res = verify_op(cond, fresh_only, None, **_window_kwargs(run, uncond, state, win), rule="strict",
                    coupling="independent", return_probs=False, backend=run.backend, validate=False)
    match = win.committed | (drafted.tokens == res.tokens)  # [B, L]
    accept_len = torch.where(match.all(-1), win.length, (~match).to(torch.int64).argmax(-1))
    # the acceptance map holds the match indicator; the distortion of matching sampled drafts is not tracked
    return Verified.chain(res, accept_len, match.float(), torch.full_like(res.entropy, float("nan")))


def verify(cond, uncond, q, run: Settings, state: State, win: Window, drafted: Drafted) -> Verified:
    """The window verified by the run's mode: cond, uncond [B, L, V] logits, q [B, L, V] or None (jd: the exact
    match; every other mode its acceptance rule)."""
    return (_jacobi if run.info.rule is None else _speculative)(cond, uncond, q, run, state, win, drafted)


def check_status(status: list, where: str = "") -> None:
    """ValueError when verification flagged a row: ``status`` [B] bits as read on the host."""
    if any(status):
        raise ValueError(f"verification flagged the model's logits or the drafts (status bits {status}; "
                         f"1 = NaN/Inf logits){where}")


# ----------------------------------------------------------------------------------------------------------------------
# commit
# ----------------------------------------------------------------------------------------------------------------------
def commit(state: State, win: Window, drafted: Drafted, verified: Verified) -> torch.Tensor:
    """Active rows commit their accepted prefix and the resampled token, keep the next drafts (their p as q) for
    their new window and count the attempt; an inactive row keeps everything. In place on ``state`` (its tensors
    keep their storage: a CUDA graph replays this). Returns [B] the tokens each row committed."""
    n, active = state.n, win.active  # (win.positions may be state.n itself: every read of it precedes n's update)
    new_n = torch.where(active, torch.minimum(win.positions + verified.accept_len.to(torch.int64) + 1, win.win_end), n)
    state.seq.scatter_(1, win.grid_pos, torch.where(active[:, None], verified.tokens, drafted.current))
    newly = (win.grid_pos >= n[:, None]) & (win.grid_pos < new_n[:, None])  # [B, L]
    index = win.grid_pos[None].expand(4, -1, -1)
    state.maps.scatter_(2, index, torch.where(newly[None], verified.stats, state.maps.gather(2, index)))
    if state.q_store is not None and verified.probs is not None:  # p at the row's new window: its next drafts' q
        slots = torch.arange(state.q_store.shape[1], device=n.device)[None, :]
        shift = ((new_n - win.positions)[:, None] + slots).clamp(0, verified.probs.shape[1] - 1)  # [B, W]
        fresh_q = verified.probs.gather(1, shift[..., None].expand(-1, -1, state.q_store.shape[2]))
        state.q_store.copy_(torch.where(active[:, None, None], fresh_q, state.q_store))
    if state.p_rows is not None and verified.probs is not None:
        keep_p_rows(state.p_rows, win, n, new_n, verified.probs)
    state.drafted.copy_(torch.where(active, win.draft_end, state.drafted))
    state.attempts.add_(active.to(torch.int64))
    state.status.copy_(torch.where(active, verified.status.to(torch.int64), 0) | state.status)
    committed = new_n - n
    state.n.copy_(new_n)
    return committed


def keep_p_rows(p_rows: torch.Tensor, win: Window, n: torch.Tensor, new_n: torch.Tensor, probs: torch.Tensor) -> None:
    """p [B, L, V] at the newly committed positions [n, new_n) into p_rows [B, W, V], in place: each column gets p at
    its last position committed (a window may commit a column twice)."""
    width = p_rows.shape[1]
    columns = torch.arange(width, device=n.device)[None, :]
    last = new_n[:, None] - 1 - (new_n[:, None] - 1 - columns) % width  # [B, W] the column's last position < new_n
    slot = (last - win.positions[:, None]).clamp(0, probs.shape[1] - 1)
    newly = (last >= n[:, None])[..., None]
    p_rows.copy_(torch.where(newly, probs.gather(1, slot[..., None].expand(-1, -1, p_rows.shape[2])), p_rows))
