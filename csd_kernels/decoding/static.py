"""The static loop of ``generate(..., static=True)``: the iteration of step.py as one function of device state ->
device state (:func:`static_step`), and :class:`StaticLoop`, which runs it (or the tree's, tree.py) until done.

Every row feeds exactly W inputs at its own positions each iteration (x_{n_b-1} and the drafts of [n_b, n_b+W-1)) into
a per-row static KV cache (the adapter's ``forward_static``), is verified from its own window start (verify's
``positions = n``, ``start = 0``), and commits on the device. A finished row is frozen: it is verified as fully
committed, nothing of it is written and it is not counted. The same tensor shapes every call, no host read: the
iteration can be compiled (``torch.compile(fullgraph=True)``) or captured in one CUDA graph and replayed.

The host learns that the loop is done from a lagged copy: after every iteration the flags (min n, status) are copied
non-blocking into pinned memory and read ``lag`` iterations later; the up to ``lag`` surplus iterations change
nothing (every row is frozen) and are not counted as passes. Random streams are keyed as in the per-row loop (seed,
absolute grid position, the row's attempt count), so tokens and pass counts equal ``static=False`` at B = 1 and a
batched row equals the row alone.

Shapes: B rows, W window slots, V image tokens, N = H·W grid tokens; seq and maps have W spare columns past the grid
(the junk slots of windows that run past the last token).
"""

from __future__ import annotations

from typing import Optional

import torch

from .state import StaticState
from .step import Settings, check_status, commit, draft, draft_probs, forward, verify, window

__all__ = ["static_step", "StaticLoop", "DEFAULT_LAG"]

DEFAULT_LAG = 2  # iterations between a flag's copy and its read on an asynchronous device
CPU_LAG = 0  # the CPU runs each iteration before the host goes on: a read costs nothing, a surplus iteration does


def static_step(adapter, run: Settings, state: StaticState) -> None:
    """One iteration for every row, in place on ``state``; no host read, the same shapes every call."""
    n = state.n
    win = window(state, n, run.window, n < run.total, run)  # each row's W slots from its own n
    drafted = draft(state, win, run, state.q_store)
    q = draft_probs(win, drafted, run, state.q_store)  # the q store is aligned with the row's window
    cond, uncond = forward(lambda inputs: adapter.forward_static(inputs, n - 1), state.seq, win, drafted.tokens[:, :-1])
    verified = verify(cond, uncond, q, run, state, win, drafted)
    state.record(commit(state, win, drafted, verified), win.active)


class StaticLoop:
    """Runs :func:`static_step` until every row is done, reading the done flag ``lag`` iterations late.

    ``cuda_graph``: warm up with one real iteration, capture the next in a CUDA graph, replay it. ``compile``: run the
    iteration through ``torch.compile(fullgraph=True)`` (one specialisation per (B, W, V)). ``iteration``: the
    function of (adapter, settings, state) run each time (static_step; a draft tree's tree_step)."""

    def __init__(self, adapter, run: Settings, state: StaticState, *, lag: Optional[int] = None,
                 cuda_graph: bool = False, compile: bool = False, iteration=None):
        self.adapter, self.settings, self.state = adapter, run, state
        self.device = state.n.device
        asynchronous = self.device.type != "cpu"
        self.lag = (DEFAULT_LAG if asynchronous else CPU_LAG) if lag is None else int(lag)
        self.cuda_graph = cuda_graph
        self.iterations = 0

        iteration = static_step if iteration is None else iteration  # tree.tree_step with its layout bound

        def step():
            iteration(adapter, run, state)

        self._step = torch.compile(step, fullgraph=True) if compile else step
        self._graph = None
        pinned = self.device.type == "cuda"
        self._host = [torch.zeros(2, dtype=torch.int64, pin_memory=pinned) for _ in range(self.lag + 1)]
        self._events = [None] * (self.lag + 1)

    def step(self) -> None:
        """One iteration (the first one runs eagerly before a CUDA graph is captured), then its flags' copy."""
        if self.cuda_graph and self._graph is None and self.iterations >= 1:
            self._capture()
        if self._graph is not None:
            self._graph.replay()
        elif self.cuda_graph:
            self._warm_up()
        else:
            self._step()
        self.iterations += 1
        self._push()

    def _warm_up(self) -> None:
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            self._step()
        torch.cuda.current_stream(self.device).wait_stream(side)

    def _capture(self) -> None:
        self._graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self._graph):
            self._step()

    def _push(self) -> None:
        """The flags after this iteration -> a host slot, non-blocking (pinned memory on CUDA)."""
        slot = self.iterations % (self.lag + 1)
        self._host[slot].copy_(self.state.flags, non_blocking=True)
        if self.device.type == "cuda":
            self._events[slot] = torch.cuda.Event()
            self._events[slot].record()

    def lagged_flags(self) -> Optional[list]:
        """(min n, max status) as of ``lag`` iterations ago, or None before that many iterations ran."""
        if self.iterations <= self.lag:
            return None
        slot = (self.iterations - self.lag) % (self.lag + 1)
        if self._events[slot] is not None:
            self._events[slot].synchronize()  # an event from lag iterations ago: long done when the host is behind
        return self._host[slot].tolist()

    def run(self, bar=None) -> None:
        """Iterate until the lagged flags say every row is done (or verification flagged a row)."""
        total = self.settings.total
        limit = total + self.lag + 1  # every counted pass commits a token of the slowest row
        committed = 0
        while True:
            self.step()
            flags = self.lagged_flags()
            if flags is None:
                continue
            if bar is not None:
                bar.update(flags[0] - committed)
            committed = flags[0]
            if flags[1] or committed >= total:
                break
            if self.iterations > limit:
                raise RuntimeError(f"the static loop ran {self.iterations} iterations for {total} tokens")
        check_status(self.state.status.tolist())

    def output(self):
        """(tokens [B, N], maps [4, B, N], accepted: per pass [B] list, passes)."""
        total, state = self.settings.total, self.state
        passes = int(state.passes)
        return (state.seq[:, :total].clone(), state.maps[:, :, :total].clone(), state.accepted[:passes].tolist(),
                passes)
