"""The static per-row KV cache of the fixed-shape decoding loop, and the masks that go with it.

Every model row owns ``capacity`` cache slots (prompt, grid, one window of look-ahead). A forward call writes its T
inputs at per-row slots ``slots`` [R, T] and attends through an explicit mask over all slots: nothing is cropped or
concatenated, stale slots are hidden by the mask and overwritten later. The mask is the general one (any set of
visible slots per query), so a draft tree's ancestor mask can be passed the same way as a chain's causal one.

:class:`RowCache` is the transformers ``Cache`` form (one preallocated [R, H, S, D] pair per layer, written by
``scatter_``); the native LlamaGen GPT has its own (:class:`csd_kernels.models.llamagen.gpt.RowKVCache`).
"""

from __future__ import annotations

from typing import Optional

import torch

__all__ = ["RowCache", "chain_visibility", "tree_visibility", "additive_mask", "write_rows", "move_rows"]


def write_rows(store: torch.Tensor, slots: torch.Tensor, new: torch.Tensor) -> None:
    """store [R, H, S, D] <- new [R, H, T, D] at slots [R, T] (per row), in place."""
    index = slots[:, None, :, None].expand(-1, new.shape[1], -1, new.shape[3])
    store.scatter_(2, index, new.to(store.dtype))


def chain_visibility(slots: torch.Tensor, capacity: int, key_valid: Optional[torch.Tensor]) -> torch.Tensor:
    """bool [R, T, S]: query t (at slot slots[r, t]) sees every slot at or before its own, except hidden prompt
    padding (key_valid [R, S] False); it always sees itself (so a padded query never sees nothing).

    Correct for a chain of inputs written at increasing slots on top of a cache whose earlier slots hold committed
    inputs; a draft tree passes its own visibility instead."""
    keys = torch.arange(capacity, device=slots.device)  # [S]
    visible = keys[None, None, :] <= slots[:, :, None]  # [R, T, S]
    if key_valid is not None:
        visible = (visible & key_valid[:, None, :]) | (keys[None, None, :] == slots[:, :, None])
    return visible


def tree_visibility(base: torch.Tensor, ancestor: torch.Tensor, capacity: int,
                    key_valid: Optional[torch.Tensor]) -> torch.Tensor:
    """bool [R, W, S]: window input s (written at slot base_r + s) sees the committed slots before base_r (except
    hidden prompt padding) and the window slots of its ancestors and itself (ancestor [W, W], or per row [R, W, W]:
    t is s or above s)."""
    width = ancestor.shape[-1]
    offset = torch.arange(capacity, device=base.device)[None, :] - base[:, None]  # [R, S] slot - window start
    prefix = offset < 0
    if key_valid is not None:
        prefix = prefix & key_valid
    in_window = (offset >= 0) & (offset < width)
    index = offset.clamp(0, width - 1)[:, None, :].expand(-1, width, -1)  # [R, W, S]
    above = ancestor.to(base.device).expand(base.shape[0], -1, -1).gather(2, index)
    return prefix[:, None, :] | (in_window[:, None, :] & above)


def move_rows(store: torch.Tensor, destination: torch.Tensor, source: torch.Tensor) -> None:
    """store [R, H, S, D]: slots destination [R, T] <- the slots source [R, T] (read before any is written)."""
    index = lambda slots: slots[:, None, :, None].expand(-1, store.shape[1], -1, store.shape[3])  # noqa: E731
    store.scatter_(2, index(destination), store.gather(2, index(source)))


def additive_mask(visible: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """bool [R, T, S] -> [R, 1, T, S] additive mask of ``dtype`` (0 where visible, the dtype's minimum elsewhere), the
    4-D form transformers passes to attention as it is (no mask code, no host sync)."""
    zero = torch.zeros((), dtype=dtype, device=visible.device)
    low = torch.full((), torch.finfo(dtype).min, dtype=dtype, device=visible.device)
    return torch.where(visible, zero, low)[:, None]


def _cache_classes():
    from transformers.cache_utils import Cache, CacheLayerMixin

    class RowLayer(CacheLayerMixin):
        """One layer's keys and values [R, H, S, D], written at the owning cache's current ``slots``."""

        is_compileable = True
        is_sliding = False

        def __init__(self, owner: "RowCache"):
            super().__init__()
            self.owner = owner

        def lazy_initialization(self, key_states, value_states) -> None:
            rows, heads, _, head_dim = key_states.shape
            self.allocate(rows, heads, head_dim, key_states.dtype, key_states.device)

        def allocate(self, rows: int, heads: int, head_dim: int, dtype, device) -> None:
            shape = (rows, heads, self.owner.capacity, head_dim)
            self.keys = torch.zeros(shape, dtype=dtype, device=device)
            self.values = torch.zeros(shape, dtype=dtype, device=device)
            self.is_initialized = True

        def update(self, key_states, value_states, *args, **kwargs):
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            write_rows(self.keys, self.owner.slots, key_states)
            write_rows(self.values, self.owner.slots, value_states)
            return self.keys, self.values

        def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
            return self.owner.capacity, 0

        def get_seq_length(self) -> int:
            return self.owner.capacity

        def get_max_length(self) -> int:
            return self.owner.capacity

    class RowCache(Cache):
        """A transformers ``Cache`` with ``capacity`` slots per row; set ``slots`` [R, T] before each forward."""

        def __init__(self, config, rows: int, capacity: int, dtype, device):
            self.capacity = int(capacity)
            self.slots: Optional[torch.Tensor] = None
            super().__init__(layers=[RowLayer(self) for _ in range(config.num_hidden_layers)])
            heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
            head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
            for layer in self.layers:  # now, not at the first forward: every static call then runs the same ops
                layer.allocate(rows, heads, head_dim, dtype, device)

    return RowCache


_ROW_CACHE = None


def RowCache(config, rows: int, capacity: int, dtype: torch.dtype, device):  # noqa: N802 - a class built on first
    """A transformers Cache of ``capacity`` slots for each of ``rows`` rows, for a decoder of ``config``."""
    global _ROW_CACHE  # use (transformers is imported only then)
    if _ROW_CACHE is None:
        _ROW_CACHE = _cache_classes()
    return _ROW_CACHE(config, rows, capacity, dtype, device)
