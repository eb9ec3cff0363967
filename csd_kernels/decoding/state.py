"""The per-row state of the Jacobi loops: what every loop keeps on the device (:class:`State`, read and written by the
iteration's pieces in step.py), plus the host mirror of the eager loop (:class:`EagerState`) or the device counters
and lagged flags of the static loop (:class:`StaticState`).

Row b has committed n_b grid tokens (raster order); seq holds them, then the drafts sampled in the row's last active
iteration, up to drafted_b - 1; q_store holds those drafts' q (that iteration's p) for the W positions from n_b;
p_rows (draft_init="above-p") holds p at the last committed position of each grid column: the q of the fresh drafts
of the row below.
Shapes: B rows, W window slots, V image tokens, N = H·W grid tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch

__all__ = ["State", "EagerState", "StaticState"]


def _zeros(device, *shape, dtype=torch.int64) -> torch.Tensor:
    return torch.zeros(*shape, dtype=dtype, device=device)


@dataclass
class State:
    seq: torch.Tensor  # [B, N] (static: [B, N + W], junk slots of windows past the grid) committed tokens, then drafts
    maps: torch.Tensor  # [4, B, like seq] entropy, acceptance probability, distortion, TVD of the committing step
    n: torch.Tensor  # [B] committed tokens per row
    drafted: torch.Tensor  # [B] seq[b, n_b:drafted_b - 1] holds drafts sampled in the row's last active iteration
    attempts: torch.Tensor  # [B] iterations in which the row was active (its Philox offset)
    q_store: Optional[torch.Tensor]  # [B, W, V] p of the row's last active iteration at n_b .. n_b + W - 1
    status: torch.Tensor  # [B] status bits verification raised for an active row
    p_rows: Optional[torch.Tensor]  # [B, W_grid, V] p at the last committed position of each column (or None)

    @staticmethod
    def tensors(batch: int, columns: int, window: int, vocab: int, need_q: bool, device, p_columns: int = 0) -> dict:
        """``p_columns``: the grid's width when the loop keeps p_rows (draft_init="above-p" with q), else 0."""
        q_store = _zeros(device, batch, window, vocab, dtype=torch.float32) if need_q else None
        p_rows = _zeros(device, batch, p_columns, vocab, dtype=torch.float32) if need_q and p_columns else None
        return dict(seq=_zeros(device, batch, columns), maps=_zeros(device, 4, batch, columns, dtype=torch.float32),
                    n=_zeros(device, batch), drafted=_zeros(device, batch), attempts=_zeros(device, batch),
                    q_store=q_store, status=_zeros(device, batch), p_rows=p_rows)


@dataclass
class EagerState(State):
    counts: list = field(default_factory=list)  # [B] n on the host, read once per iteration
    sampled_rows: list = field(default_factory=list)  # [B] the row holds drafts with a stored q (host)
    accepted: list = field(default_factory=list)  # per iteration: [B] tokens each row committed

    @classmethod
    def empty(cls, batch: int, total: int, window: int, vocab: int, need_q: bool, device,
              p_columns: int = 0) -> "EagerState":
        return cls(**cls.tensors(batch, total, window, vocab, need_q, device, p_columns), counts=[0] * batch,
                   sampled_rows=[False] * batch)

    def done(self, total: int) -> bool:
        return min(self.counts) >= total

    def span(self, lead: int, window: int, total: int) -> tuple:
        """(m, end, active): the iteration covers grid positions [m, end), m = the slowest row's n; rows at most
        ``lead`` tokens ahead of m are active (host-known; the slowest row always is)."""
        m = min(self.counts)
        active = [nb <= m + lead for nb in self.counts]
        end = min(max(nb for nb, a in zip(self.counts, active) if a) + window, total)
        return m, end, active


@dataclass
class StaticState(State):
    accepted: Optional[torch.Tensor] = None  # [N + 1, B] tokens each row committed, per counted pass
    passes: Optional[torch.Tensor] = None  # [1] passes in which some row was active
    flags: Optional[torch.Tensor] = None  # [2] (min n, max status): what the host reads, lagged

    @classmethod
    def empty(cls, batch: int, total: int, window: int, vocab: int, need_q: bool, device,
              p_columns: int = 0) -> "StaticState":
        return cls(**cls.tensors(batch, total + window, window, vocab, need_q, device, p_columns),
                   accepted=_zeros(device, total + 1, batch), passes=_zeros(device, 1), flags=_zeros(device, 2))

    def record(self, committed: torch.Tensor, active: torch.Tensor) -> None:
        """A pass's counts into the device buffers (it counts when some row was active) and the flags the host
        reads, lagged: committed [B] tokens each row committed, active [B]."""
        self.accepted.index_copy_(0, self.passes, committed[None])
        self.passes.add_(active.any().to(torch.int64))
        self.flags.copy_(torch.stack([self.n.min(), self.status.max()]))
