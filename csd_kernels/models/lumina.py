"""Lumina-mGPT layout on transformers' ``ChameleonForConditionalGeneration``.

Sequence after the text prompt: ``[image_start, size_h, size_w]`` (the image prefix, appended by the adapter),
then the H rows of image codes, each followed by a row-end token, then ``image_end``. Image codes are the contiguous
id range ``image_token_range = (start, end)`` of the text vocabulary (grid id c <-> model id start + c). Row-end
tokens are forced: the adapter inserts them into the model input and never lets the loop draft them, and maps
grid index k to sequence index P + k + k // W. Chameleon's ``forward`` masks image ids out of its logits, so the
adapter takes hidden states from the base model and applies ``lm_head`` rows ``start:end`` itself.

The unconditional CFG rows are the image prefix alone (left-padded), as in Lumina-mGPT's image-start-triggered CFG.
Defaults are Lumina-mGPT's token ids, as its FlexARItemProcessor writes them: image codes are the BPE ids 4..8195,
image start ``<racm3:break>`` = 8197, image end ``<eoss>`` = 8196, row end ``<reserved08799>`` = 8803, and the size
token ``<reserved{8800 + n}>`` = 8804 + n where n counts 32-pixel patches, i.e. half the token grid (a 48×48 grid at
768 px gives 8828, 8828). Pass your own ids for other checkpoints or tiny test models. A pixel decoder receives grid
ids c = BPE id − 4; Chameleon's VQ model wants codebook indices, i.e.
``model.model.vocabulary_mapping.bpe2img`` applied to c + 4.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import torch
import torch.nn.functional as F

from .base import CachedImageLM
from .protocol import to_uint8_images

__all__ = ["LuminaMGPT"]


class LuminaMGPT(CachedImageLM):
    def __init__(self, model, grid: tuple[int, int] = (48, 48), *, image_token_range: tuple[int, int] = (4, 8196),
                 row_end_token_id: int = 8803, image_start_token_id: int = 8197, image_end_token_id: int = 8196,
                 size_token_offset: int = 8804, image_prefix_ids: Optional[Sequence[int]] = None,
                 decode: Optional[Callable[[torch.Tensor], torch.Tensor]] = None):
        self.model = model
        start, end = int(image_token_range[0]), int(image_token_range[1])
        if not 0 <= start < end <= model.lm_head.out_features:
            raise ValueError(f"image_token_range {image_token_range} is not inside the vocabulary")
        super().__init__(model.model, grid, end - start, cache_config=model.config)
        self.image_start = start
        self.row_end_token_id = int(row_end_token_id)
        self.image_end_token_id = int(image_end_token_id)
        if image_prefix_ids is None:
            if self.grid[0] % 2 or self.grid[1] % 2:
                raise ValueError(f"Lumina-mGPT size tokens count pairs of grid tokens: grid {self.grid} must be even "
                                 "(or pass image_prefix_ids)")
            image_prefix_ids = (image_start_token_id, size_token_offset + self.grid[0] // 2,
                                size_token_offset + self.grid[1] // 2)
        self.image_prefix_ids = [int(t) for t in image_prefix_ids]
        self._decode = decode

    def _prompt_rows(self, input_ids, attention_mask, cfg):
        batch, length = input_ids.shape
        prefix = torch.tensor(self.image_prefix_ids, dtype=input_ids.dtype, device=input_ids.device).expand(batch, -1)
        cond = torch.cat([input_ids, prefix], 1)  # [B, S + 3]
        ones = torch.ones_like(prefix)
        cond_mask = torch.cat([attention_mask if attention_mask is not None else torch.ones_like(input_ids), ones], 1)
        if not cfg:
            return cond, (cond_mask if attention_mask is not None else None)
        pad = torch.zeros_like(input_ids)
        uncond = torch.cat([pad, prefix], 1)  # left-padded: only the image prefix is attended
        uncond_mask = torch.cat([pad, ones], 1)
        return torch.cat([cond, uncond], 0), torch.cat([cond_mask, uncond_mask], 0)

    def _to_model_ids(self, tokens):
        return tokens + self.image_start

    def _seq_index(self, k):
        return self.prompt_len + k + (k // self.grid[1] if k >= 0 else 0)

    def _window(self, ids, first):
        # ids [R, L] model ids of x_first .. x_{first+L-1}; a row end follows every x_k with k % W == W - 1
        rows, length = ids.shape
        width = self.grid[1]
        k = torch.arange(first, first + length, device=ids.device)  # [L]
        row_end = ((k >= 0) & (k % width == width - 1)).to(torch.int64)  # [L]
        # number of row ends among x_first .. x_{first+L-1}, on the host from ints (no device sync)
        ends = (first + length) // width - max(first, 0) // width
        slot = torch.arange(length, device=ids.device) + row_end.cumsum(0) - row_end  # [L] sequence slot of x_k
        seq = torch.full((rows, length + ends), self.row_end_token_id, dtype=ids.dtype, device=ids.device)
        seq[:, slot] = ids  # [R, T]
        keep = None if ends == 0 else slot + row_end  # output slot that predicts x_{k+1}
        return {"input_ids": seq}, keep

    def _head(self, hidden):
        head = self.model.lm_head
        start, end = self.image_start, self.image_start + self.vocab_size
        bias = None if head.bias is None else head.bias[start:end]
        return F.linear(hidden, head.weight[start:end], bias)  # [R, L, V]

    def image_sequence(self, tokens):
        batch = tokens.shape[0]
        height, width = self.grid
        rows = (tokens + self.image_start).reshape(batch, height, width)
        row_end = torch.full((batch, height, 1), self.row_end_token_id, dtype=rows.dtype, device=rows.device)
        body = torch.cat([rows, row_end], 2).reshape(batch, -1)
        prefix = torch.tensor(self.image_prefix_ids, dtype=rows.dtype, device=rows.device).expand(batch, -1)
        end = torch.full((batch, 1), self.image_end_token_id, dtype=rows.dtype, device=rows.device)
        return torch.cat([prefix, body, end], 1)

    @torch.no_grad()
    def decode(self, tokens):
        if self._decode is None:
            return None
        return to_uint8_images(self._decode(tokens))
