"""The eager Jacobi loop (``generate(..., static=False)``): the iteration of step.py over one span of grid positions
[m, end) for every row, on the adapter's growing KV cache, cropped to the slowest row each iteration.

m is the slowest row's n; rows at most ``lead`` tokens ahead of m are active, so the forward call covers at most
lead + W positions; a paused row (and a row's committed prefix in the span) is verified as committed and keeps
everything. The host learns n and the status bits once per iteration (:func:`read_counts`: the one host sync),
which fixes the next span.
"""

from __future__ import annotations

from typing import Optional

import torch

from .state import EagerState
from .step import Settings, Window, check_status, commit, draft, draft_probs, forward, verify, window

__all__ = ["run_eager", "stored_probs", "read_counts"]


def run_eager(adapter, run: Settings, state: EagerState, lead: int, clock, bar=None) -> None:
    """Iterate until every row has committed its grid. ``clock.phase(name)`` times the model call and verification
    (with the commit and the host read, where the host waits for the device)."""
    while not state.done(run.total):
        m, end, active = state.span(lead, run.window, run.total)
        win = window(state, state.n.new_full(state.n.shape, m), end - m, state.n <= m + lead, run)
        stored = stored_probs(state, win, active)
        drafted = draft(state, win, run, stored)
        q = draft_probs(win, drafted, run, stored)
        with clock.phase("model"):
            adapter.crop(m - 1)
            cond, uncond = forward(lambda inputs: adapter.forward(inputs, m - 1), state.seq, win,
                                   drafted.tokens[:, :-1])
        before = min(state.counts)
        with clock.phase("verify"):
            verified = verify(cond, uncond, q, run, state, win, drafted)
            read_counts(state, commit(state, win, drafted, verified), run, m, end, active)
        if bar is not None:
            bar.update(min(state.counts) - before)


def stored_probs(state: EagerState, win: Window, active: list) -> Optional[torch.Tensor]:
    """The q store at the span's slots [B, L, V]; None when no active row holds sampled drafts (the host knows)."""
    if state.q_store is None or not any(s and a for s, a in zip(state.sampled_rows, active)):
        return None
    slots, vocab = state.q_store.shape[1:]
    index = (win.grid_pos - state.n[:, None]).clamp(0, slots - 1)  # [B, L] slot of the row's q store
    return state.q_store.gather(1, index[..., None].expand(-1, -1, vocab))


def read_counts(state: EagerState, committed: torch.Tensor, run: Settings, m: int, end: int, active: list) -> None:
    """The iteration's one host sync: n, the tokens committed and the status bits, together; the host mirror
    follows. ValueError when verification flagged an active row."""
    counts, got, status = torch.stack([state.n, committed, state.status]).tolist()
    check_status(status, f" at grid positions {m}..{end - 1}")
    state.sampled_rows = [min(nb + run.window, run.total) > nn if act else s
                          for nb, nn, act, s in zip(state.counts, counts, active, state.sampled_rows)]
    state.accepted.append(got)
    state.counts = counts
