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
"""

from __future__ import annotations

from typing import Optional

import torch

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
        self.rows = PaddedRows(mask)
        self.cache = new_dynamic_cache(self._cache_config)
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

    # defaults for adapters whose grid tokens map to a contiguous id range and need no forced tokens
    def _window(self, ids: torch.Tensor, first: int):
        return {"input_ids": ids}, None

    def decode(self, tokens: torch.Tensor) -> Optional[torch.Tensor]:
        return None
