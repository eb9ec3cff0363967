"""The fixed-shape Jacobi iteration of ``generate(..., static=True)``: one function of device state -> device state.

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

from dataclasses import dataclass
from typing import Optional

import torch

from ..ops.drafts import random_draft_tokens
from .steps import VERIFY, Settings

__all__ = ["StaticState", "static_step", "static_draft_probs", "StaticLoop", "DEFAULT_LAG"]

DEFAULT_LAG = 2  # iterations between a flag's copy and its read on an asynchronous device
CPU_LAG = 0  # the CPU runs each iteration before the host goes on: a read costs nothing, a surplus iteration does


@dataclass
class StaticState:
    seq: torch.Tensor  # [B, N + W] committed tokens, then the drafts sampled in the row's last iteration
    maps: torch.Tensor  # [4, B, N + W] entropy, acceptance probability, distortion, TVD of the committing step
    n: torch.Tensor  # [B] committed tokens per row
    drafted: torch.Tensor  # [B] seq[b, n_b:drafted_b] holds drafts sampled in the row's last iteration
    attempts: torch.Tensor  # [B] iterations in which the row was active (its Philox offset)
    q_store: Optional[torch.Tensor]  # [B, W, V] p of the row's last iteration at n_b .. n_b + W - 1
    accepted: torch.Tensor  # [N + 1, B] int64 tokens each row committed, per counted pass
    passes: torch.Tensor  # [1] passes in which some row was active
    status: torch.Tensor  # [B] status bits verification raised for an active row
    flags: torch.Tensor  # [2] (min n, max status): what the host reads, lagged

    @classmethod
    def empty(cls, batch: int, total: int, window: int, vocab: int, need_q: bool, device) -> "StaticState":
        def zeros(*shape, dtype=torch.int64):
            return torch.zeros(*shape, dtype=dtype, device=device)

        q_store = zeros(batch, window, vocab, dtype=torch.float32) if need_q else None
        return cls(zeros(batch, total + window), zeros(4, batch, total + window, dtype=torch.float32), zeros(batch),
                   zeros(batch), zeros(batch), q_store, zeros(total + 1, batch), zeros(1), zeros(batch), zeros(2))


@dataclass
class _Window:  # what the verification functions of steps.VERIFY read from the per-row loop's Window
    start: torch.Tensor  # [B] 0 for an active row, W for a frozen one
    committed: torch.Tensor  # [B, W]
    length: int


@dataclass
class _Drafted:  # ... and from its Drafted
    tokens: torch.Tensor  # [B, W]
    positions: torch.Tensor  # [B] grid index of slot 0 (= n)


@dataclass
class _Attempts:  # ... and from its RowState
    attempts: torch.Tensor


def static_step(adapter, run: Settings, state: StaticState) -> None:
    """One iteration for every row, in place on ``state``; no host read, the same shapes every call."""
    window, total, vocab = run.window, run.total, run.vocab
    n = state.n
    slots = torch.arange(window, device=n.device)
    grid_pos = n[:, None] + slots  # [B, W]
    active = n < total  # [B]
    win_end = (n + window).clamp(max=total)  # [B]
    draftable = grid_pos < win_end[:, None] - 1  # the last slot of a window has no draft
    sampled = draftable & (grid_pos < state.drafted[:, None])
    fresh = draftable & ~sampled
    committed = ~active[:, None].expand_as(grid_pos)

    fresh_tokens = random_draft_tokens(run.seeds, state.attempts, n, window, vocab)  # [B, W]
    above = None
    if run.draft_init == "above":
        above_pos = grid_pos - run.width
        above = fresh & (above_pos >= 0) & (above_pos < n[:, None])
        fresh_tokens = torch.where(above, state.seq.gather(1, above_pos.clamp(min=0)), fresh_tokens)
    current = state.seq.gather(1, grid_pos)  # [B, W]
    tokens = torch.where(committed | sampled, current, torch.where(fresh, fresh_tokens, -1))
    q = static_draft_probs(state, run, sampled, above, fresh_tokens)

    last = state.seq.gather(1, (n - 1).clamp(min=0)[:, None])  # x_{n-1} (the adapter uses the prompt's at n = 0)
    cond, uncond = adapter.forward_static(torch.cat([last, tokens[:, :-1].clamp(min=0)], 1), n - 1)
    if cond.dtype == torch.float64:  # verify takes float32 / bf16 / fp16 logits
        cond, uncond = cond.float(), (None if uncond is None else uncond.float())
    start = torch.where(active, 0, window)
    verified = VERIFY[run.mode](cond, uncond, q, run, _Attempts(state.attempts), _Window(start, committed, window),
                                _Drafted(tokens, n))
    _commit(state, run, verified, grid_pos, current, active, win_end)


def static_draft_probs(state: StaticState, run: Settings, sampled, above, fresh_tokens) -> Optional[torch.Tensor]:
    """q [B, W, V]: the stored p for sampled drafts, one-hot for a token from above, 1/V for fresh ones."""
    if not run.need_q:
        return None
    batch, window, vocab = sampled.shape[0], run.window, run.vocab
    fill = torch.full((1, 1, 1), 1.0 / vocab, device=sampled.device).expand(batch, window, vocab)
    if above is not None:
        fill = torch.where(above[..., None], torch.nn.functional.one_hot(fresh_tokens, vocab).float(), fill)
    return torch.where(sampled[..., None], state.q_store, fill)


def _commit(state: StaticState, run: Settings, verified, grid_pos, current, active, win_end) -> None:
    """Active rows commit the accepted prefix and the resampled token and keep the rest as next drafts (their p as
    q); counts go to the device buffers; a frozen row keeps everything."""
    n, window = state.n, run.window
    res = verified.result
    new_n = torch.where(active, torch.minimum(n + verified.accept_len.to(torch.int64) + 1, win_end), n)  # [B]
    state.seq.scatter_(1, grid_pos, torch.where(active[:, None], res.tokens, current))
    newly = active[:, None] & (grid_pos < new_n[:, None])  # [B, W]
    stats = torch.stack([res.entropy, verified.accept_prob, verified.distortion, res.tvd]).float()  # [4, B, W]
    index = grid_pos[None].expand(4, -1, -1)
    state.maps.scatter_(2, index, torch.where(newly[None], stats, state.maps.gather(2, index)))
    state.accepted.index_copy_(0, state.passes, (new_n - n)[None])
    state.passes.add_(active.any().to(torch.int64))
    if state.q_store is not None:  # p at the row's new window: the q of its next drafts
        slots = torch.arange(window, device=n.device)[None, :]
        index = ((new_n - n)[:, None] + slots).clamp(max=window - 1)  # [B, W] window slot of each q-store slot
        fresh_q = res.probs.gather(1, index[..., None].expand(-1, -1, run.vocab))
        state.q_store.copy_(torch.where(active[:, None, None], fresh_q, state.q_store))
    state.drafted.copy_(torch.where(active, win_end, state.drafted))
    state.attempts.add_(active.to(torch.int64))
    state.status.copy_(torch.where(active, res.status.to(torch.int64), 0) | state.status)
    state.n.copy_(new_n)
    state.flags.copy_(torch.stack([new_n.min(), state.status.max()]))


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
        self._raise_for_status()

    def _raise_for_status(self) -> None:
        status = self.state.status.tolist()
        if any(status):
            raise ValueError(f"verification flagged the model's logits or the drafts (status bits {status}; "
                             "1 = NaN/Inf logits)")

    def output(self):
        """(tokens [B, N], maps [4, B, N], accepted: per pass [B] list, passes)."""
        total, state = self.settings.total, self.state
        passes = int(state.passes)
        return (state.seq[:, :total].clone(), state.maps[:, :, :total].clone(), state.accepted[:passes].tolist(),
                passes)
