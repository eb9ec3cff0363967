"""Shared machinery of the transformers adapters: a decoder backbone with a ``DynamicCache``, CFG rows, padding.

A subclass supplies the model-specific pieces:

* ``_prompt_rows(input_ids, attention_mask, cfg)`` -> (ids [R, P], mask [R, P] or None): the full prompt of the
  R = B (or 2B with CFG: conditional rows first, then unconditional rows) model rows, left-padded, INCLUDING its
  final token (which the base class holds back for the first window);
* ``_window(ids [R, L], first)`` -> (model kwargs {"input_ids": ..} or {"inputs_embeds": ..} with T >= L positions,
  keep [L] long: which of the T outputs predict grid tokens) where ids[:, 0] already is the prompt's final token
  when first == -1;
* ``_to_model_ids(tokens)``: grid ids -> model vocabulary ids (what ``_window`` receives);
* ``_head(hidden [R, L, D])`` -> logits over the image vocabulary [R, L, V];
* ``_seq_index(k)``: sequence index of the input x_k (k >= -1) = the cache length ``crop(k)`` leaves.

The static form (``static_cache`` / ``forward_static``, see :mod:`.protocol`) runs the same pieces on a
:class:`~.cache.RowCache`; a family with forced tokens between grid tokens overrides ``_window_static`` and
``_static_span`` (lumina.RowEndLayout: Lumina-mGPT and Emu3, with their draft trees), one whose prompt end is
embedded differently overrides ``_inputs_static`` (Janus).
"""

from __future__ import annotations

from typing import Optional

import torch

from .cache import RowCache, additive_mask, chain_visibility, move_rows, tree_visibility
from .protocol import PaddedRows, cache_kwarg, crop_cache, new_dynamic_cache

__all__ = ["CachedImageLM"]


class CachedImageLM:
    grid: tuple[int, int]
    vocab_size: int

    def __init__(self, backbone: torch.nn.Module, grid: tuple[int, int], vocab_size: int, cache_config=None):
        self.backbone = backbone
        self.grid = (int(grid[0]), int(grid[1]))
        self.vocab_size = int(vocab_size)
        self._cache_config = cache_config
        self._cache_kw = cache_kwarg(backbone)
        self.cache = None
        self.rows: Optional[PaddedRows] = None
        self.batch = 0
        self.cfg = False
        self.prompt_len = 0  # P: padded prompt length including the final token
        self._last_ids: Optional[torch.Tensor] = None  # [R] the prompt's final token per model row
        self._static_window: Optional[int] = None  # set by static_cache(): the next prefill allocates a RowCache
        self._static = False  # this generation runs on a RowCache
        self._key_valid: Optional[torch.Tensor] = None  # [R, S] False at padded prompt slots (None: no padding)
        self._pads: Optional[torch.Tensor] = None  # [R] left padding per row

    # ---------------------------------------------------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return next(self.backbone.parameters()).device

    @property
    def prompt_vocab_size(self) -> Optional[int]:
        """Rows of the backbone's input embedding: prompt ids must lie in [0, this) (generate() checks them)."""
        get = getattr(self.backbone, "get_input_embeddings", None)
        return getattr(get(), "num_embeddings", None) if callable(get) else None

    def _run(self, **inputs) -> torch.Tensor:
        """One backbone call appending T positions to the cache -> last hidden state [R, T, D]."""
        x = inputs.get("input_ids", inputs.get("inputs_embeds"))
        length = x.shape[1]
        if self._static:  # the static prefill: slots 0 .. T-1
            return self._run_rows(inputs, torch.arange(length, device=x.device)[None, :].expand(x.shape[0], -1))
        mask, positions = self.rows.step(self.cache.get_seq_length(), length)
        out = self.backbone(
            **inputs, attention_mask=mask, position_ids=positions, use_cache=True, **{self._cache_kw: self.cache}
        )
        return out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]

    # ---------------------------------------------------------------------------------------------------------------
    @torch.no_grad()
    def prefill(self, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor], cfg: bool) -> int:
        """Run the prompt minus its final token; returns the number of model calls (0 for a one-token prompt)."""
        self.batch, self.cfg = int(input_ids.shape[0]), bool(cfg)
        ids, mask = self._prompt_rows(input_ids.to(self.device), None if attention_mask is None else
                                      attention_mask.to(self.device), cfg)
        self.prompt_len = int(ids.shape[1])
        self.rows = PaddedRows(mask, self.dtype)
        window, self._static_window = self._static_window, None  # a static_cache() request holds for one prefill
        self._static = window is not None
        self.cache = new_dynamic_cache(self._cache_config) if window is None else self._row_cache(mask, window)
        self._last_ids = ids[:, -1]
        if self.prompt_len == 1:
            return 0
        self._run(**self._prefill_inputs(ids[:, :-1]))
        return 1

    def _prefill_inputs(self, ids: torch.Tensor) -> dict:
        return {"input_ids": ids}

    @torch.no_grad()
    def forward(self, tokens: torch.Tensor, first: int):
        """tokens [B, L] = grid tokens x_first .. x_{first+L-1} -> (cond [B, L, V], uncond [B, L, V] | None)."""
        ids = self._to_model_ids(tokens.to(self.device))  # [B, L]
        if self.cfg:
            ids = torch.cat([ids, ids], 0)  # [2B, L]: the unconditional rows see the same image tokens
        if first == -1:
            ids = torch.cat([self._last_ids[:, None], ids[:, 1:]], 1)
        inputs, keep = self._window(ids, first)
        hidden = self._run(**inputs)  # [R, T, D]
        if keep is not None:
            hidden = hidden[:, keep]
        logits = self._head(hidden)  # [R, L, V]
        if self.cfg:
            return logits[: self.batch], logits[self.batch :]
        return logits, None

    def crop(self, first: int) -> None:
        crop_cache(self.cache, self._seq_index(first))

    def _seq_index(self, k: int) -> int:
        return self.prompt_len + k  # x_{-1} sits at P - 1

    # ---------------------------------------------------------------------------------------------------------------
    # the static form
    # ---------------------------------------------------------------------------------------------------------------
    @property
    def dtype(self) -> torch.dtype:
        return next(self.backbone.parameters()).dtype

    def static_cache(self, window: int, tree=None) -> None:
        """The next prefill (only) allocates a per-row static cache with room for ``window`` inputs past the grid
        (``tree``: the reference.TreeLayout that forward_tree will be fed, or None; see _tree_span)."""
        self._static_window = int(window)

    def _row_cache(self, mask: Optional[torch.Tensor], window: int):
        """A RowCache for prompt + grid + window inputs per row; the prompt's padding as key_valid and pads."""
        rows = (2 if self.cfg else 1) * self.batch
        total = self.grid[0] * self.grid[1]
        capacity = self._seq_index(total - 1) + max(self._static_span(window), self._tree_span(window))
        self._pads = torch.zeros(rows, dtype=torch.int64, device=self.device)
        self._key_valid = None
        if mask is not None:
            self._pads = (mask == 0).sum(-1).to(torch.int64)
            self._key_valid = torch.ones(rows, capacity, dtype=torch.bool, device=mask.device)
            self._key_valid[:, : self.prompt_len] = mask != 0
        return RowCache(self.backbone.config, rows, capacity, self.dtype, self.device)

    def _run_rows(self, inputs: dict, slots: torch.Tensor, visible: Optional[torch.Tensor] = None,
                  seq_index: Optional[torch.Tensor] = None) -> torch.Tensor:
        """One backbone call writing its T inputs at slots [R, T] of the RowCache -> last hidden state [R, T, D].
        Positions count real tokens (sequence index, by default the slot, minus the row's left padding), as in the
        eager path; ``visible`` [R, T, S] defaults to the chain's."""
        cache = self.cache
        if visible is None:
            visible = chain_visibility(slots, cache.capacity, self._key_valid)  # [R, T, S]
        seq_index = slots if seq_index is None else seq_index
        cache.slots = slots
        out = self.backbone(**inputs, attention_mask=additive_mask(visible, self.dtype),
                            position_ids=(seq_index - self._pads[:, None]).clamp(min=0), use_cache=True,
                            **{self._cache_kw: cache})
        return out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]

    @torch.no_grad()
    def forward_static(self, tokens: torch.Tensor, first: torch.Tensor):
        """tokens [B, W] = x_{first_b} .. per row, first [B] -> (cond [B, W, V], uncond [B, W, V] | None)."""
        ids = self._to_model_ids(tokens)  # [B, W]
        if self.cfg:
            ids, first = torch.cat([ids, ids], 0), torch.cat([first, first], 0)  # [R, W], [R]
        inputs, slots, keep = self._window_static(ids, first)
        hidden = self._run_rows(inputs, slots)  # [R, T, D]
        if keep is not None:
            hidden = hidden.gather(1, keep[..., None].expand(-1, -1, hidden.shape[-1]))  # [R, W, D]
        logits = self._head(hidden)
        if self.cfg:
            return logits[: self.batch], logits[self.batch :]
        return logits, None

    @property
    def supports_tree(self) -> bool:
        """Draft trees need one cache slot per input and no forced tokens between grid tokens."""
        cls = type(self)
        return cls._window_static is CachedImageLM._window_static and cls._static_span is CachedImageLM._static_span

    @torch.no_grad()
    def forward_tree(self, tokens: torch.Tensor, first: torch.Tensor, depth: torch.Tensor, ancestor: torch.Tensor):
        """A draft tree: tokens [B, W] (slot 0 = x_{first_b}, slot s at sequence index first_b + depth[s], written
        at cache slot first_b + s), each seeing the committed prefix and its ancestors (ancestor [W, W]) ->
        (cond [B, W, V], uncond [B, W, V] | None) logits at every slot."""
        if not self.supports_tree:
            raise ValueError(f"{type(self).__name__} puts forced tokens between grid tokens: no draft trees yet")
        ids = self._to_model_ids(tokens)  # [B, W]
        if self.cfg:
            ids, first = torch.cat([ids, ids], 0), torch.cat([first, first], 0)  # [R, W], [R]
        ids, at_prompt = self._at_prompt_end(ids, first)
        base = self._seq_index(first)  # [R] cache slot of x_first
        slots = base[:, None] + torch.arange(ids.shape[1], device=ids.device)[None, :]
        visible = tree_visibility(base, ancestor, self.cache.capacity, self._key_valid)
        hidden = self._run_rows(self._inputs_static(ids, at_prompt), slots, visible,
                                base[:, None] + depth.to(ids.device)[None, :])
        logits = self._head(hidden)
        if self.cfg:
            return logits[: self.batch], logits[self.batch :]
        return logits, None

    def keep_path(self, first: torch.Tensor, path: torch.Tensor) -> None:
        """Move the accepted path's keys and values into place: slot first_b + k <- slot first_b + path[b, k]
        (path [B, L] window slots by depth; -1 keeps slot k)."""
        if self.cfg:
            first, path = torch.cat([first, first], 0), torch.cat([path, path], 0)
        depth = torch.arange(path.shape[1], device=path.device)[None, :]
        base = self._seq_index(first)[:, None]
        source = base + torch.where(path >= 0, path, depth)
        for layer in self.cache.layers:
            move_rows(layer.keys, base + depth, source)
            move_rows(layer.values, base + depth, source)

    def _at_prompt_end(self, ids: torch.Tensor, first: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(ids with the prompt's final token in slot 0 of rows at first = -1, that slot [R, W] bool)."""
        slot0 = torch.arange(ids.shape[1], device=ids.device)[None, :] == 0
        at_prompt = slot0 & (first[:, None] == -1)
        return torch.where(at_prompt, self._last_ids[:, None], ids), at_prompt

    def _window_static(self, ids: torch.Tensor, first: torch.Tensor):
        """(model inputs with T = _static_span(W) positions, their cache slots [R, T], the output slot [R, W] that
        predicts each grid token or None when it is the input's own slot)."""
        ids, at_prompt = self._at_prompt_end(ids, first)
        slots = self.prompt_len + first[:, None] + torch.arange(ids.shape[1], device=ids.device)[None, :]
        return self._inputs_static(ids, at_prompt), slots, None

    def _inputs_static(self, ids: torch.Tensor, at_prompt: torch.Tensor) -> dict:
        return {"input_ids": ids}

    def _static_span(self, window: int) -> int:
        """Cache slots one static forward of ``window`` grid inputs writes."""
        return window

    def _tree_span(self, window: int) -> int:
        """Cache slots one forward_tree of ``window`` inputs writes."""
        return window

    # defaults for adapters whose grid tokens map to a contiguous id range and need no forced tokens
    def _window(self, ids: torch.Tensor, first: int):
        return {"input_ids": ids}, None

    def decode(self, tokens: torch.Tensor) -> Optional[torch.Tensor]:
        return None
