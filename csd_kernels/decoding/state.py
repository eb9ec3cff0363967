"""The per-row bookkeeping of the Jacobi loop, and the window of one iteration.

Row b has committed n_b tokens (grid indices, raster order); its window is the W grid positions [n_b, e_b),
e_b = min(n_b + W, H·W). One iteration covers [m, end) with m = min_b n_b: rows at most ``lead`` tokens ahead of m
are active; a paused row is verified as fully committed and keeps all its state. ``n`` (host list) mirrors ``n_dev``
and is refreshed by the one host sync per iteration.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch

__all__ = ["RowState", "Window"]


@dataclass
class RowState:
    seq: torch.Tensor  # [B, H·W] committed tokens, then the drafts sampled for the row's window
    maps: torch.Tensor  # [4, B, H·W] entropy, acceptance probability, distortion, TVD of the committing step
    n: list  # [B] committed tokens per row (host)
    n_dev: torch.Tensor  # [B, 1] the same on the device
    drafted_dev: torch.Tensor  # [B, 1] seq[b, n_b:drafted_b] holds drafts sampled in the row's last active iteration
    sampled_rows: list  # [B] the row holds such drafts (host)
    attempts: torch.Tensor  # [B] it_b: iterations in which row b was active (its Philox offset)
    q_store: Optional[torch.Tensor]  # [B, W, V] p of the row's last active iteration at n_b .. n_b + W - 1
    accepted: list = field(default_factory=list)  # per iteration: [B] tokens each row committed

    @classmethod
    def empty(cls, batch: int, total: int, window: int, vocab: int, need_q: bool, device) -> "RowState":
        zeros = lambda *shape, dtype=torch.int64: torch.zeros(*shape, dtype=dtype, device=device)  # noqa: E731
        q_store = zeros(batch, window, vocab, dtype=torch.float32) if need_q else None
        return cls(zeros(batch, total), zeros(4, batch, total, dtype=torch.float32), [0] * batch, zeros(batch, 1),
                   zeros(batch, 1), [False] * batch, zeros(batch), q_store)

    def done(self, total: int) -> bool:
        return min(self.n) >= total

    def window(self, lead: int, window: int, total: int) -> "Window":
        m = min(self.n)
        active = [nb <= m + lead for nb in self.n]  # host-known; the slowest row is always active
        end = min(max(nb for nb, a in zip(self.n, active) if a) + window, total)
        device = self.seq.device
        active_dev = self.n_dev <= m + lead  # [B, 1], the same mask on the device (no sync)
        grid_pos = torch.arange(m, end, device=device)[None, :]  # [1, L] absolute grid index of window slot i
        win_end = (self.n_dev + window).clamp(max=total)  # [B, 1] e_b
        committed = (grid_pos < self.n_dev) | ~active_dev  # [B, L]; a paused row is verified as fully committed
        draftable = (grid_pos >= self.n_dev) & (grid_pos < win_end - 1) & active_dev  # [B, L] slots with a draft
        sampled = draftable & (grid_pos < self.drafted_dev)
        start = torch.where(active_dev[:, 0], (self.n_dev[:, 0] - m).clamp(0, end - m), end - m)  # [B]
        return Window(m, end, active, active_dev, grid_pos, win_end, committed, sampled, draftable & ~sampled, start)


@dataclass
class Window:
    """Grid positions [m, end) of one iteration (L = end − m slots) and, per row, what each slot holds."""

    m: int
    end: int
    active: list  # [B] host
    active_dev: torch.Tensor  # [B, 1]
    grid_pos: torch.Tensor  # [1, L]
    win_end: torch.Tensor  # [B, 1] e_b
    committed: torch.Tensor  # [B, L] committed (or paused): verified as given, never re-decided
    sampled: torch.Tensor  # [B, L] a draft sampled in the row's previous active iteration (q = its p)
    fresh: torch.Tensor  # [B, L] a fresh draft (uniform, or the token above)
    start: torch.Tensor  # [B] committed prefix length in the window (verify's ``start``)

    @property
    def length(self) -> int:
        return self.end - self.m

    @property
    def all_active(self) -> bool:
        return all(self.active)
