"""LlamaGen-style class/text-conditional GPT over an image codebook, on any transformers causal LM.

``ImageGPT(lm, image_token_range=(start, end), grid=(H, W), null_token_id=..., codebook=...)``: grid id c is model
id start + c;
the sequence is ``prompt + image tokens`` with no forced tokens; the unconditional CFG prompt replaces every prompt
token by ``null_token_id`` (LlamaGen's null class). The logits are the ``lm_head`` rows ``start:end`` applied to the
decoder's hidden states. ``decode`` (optional) maps grid ids [N, H*W] to images: uint8, or floats in
``pixel_range``; [N, h, w] (grey) or [N, h, w, 3]. ``codebook`` (optional): [V, D], each grid id's latent vector
(the lantern rules' neighbours come from it).

The digits model of :mod:`csd_kernels.zoo.digits` is ``ImageGPT(load_lm(), image_token_range=(0, NUM_CODES),
grid=GRID, null_token_id=NULL_TOKEN_ID, decode=load_codebook().decode)``.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch
import torch.nn.functional as F

from ..base import CachedImageLM

__all__ = ["ImageGPT"]


def _decoder_and_head(lm):
    decoder = lm.get_decoder() if hasattr(lm, "get_decoder") else None
    if decoder is None or decoder is lm:
        decoder = getattr(lm, "model", None)
    head = lm.get_output_embeddings() if hasattr(lm, "get_output_embeddings") else None
    if decoder is None or not isinstance(head, torch.nn.Linear):
        raise ValueError(f"ImageGPT needs a causal LM with a decoder and a linear lm_head, got {type(lm).__name__}")
    return decoder, head


class ImageGPT(CachedImageLM):
    def __init__(self, lm, image_token_range: tuple[int, int], grid: tuple[int, int],
                 null_token_id: Optional[int] = None, decode: Optional[Callable[[torch.Tensor], torch.Tensor]] = None,
                 pixel_range: tuple[float, float] = (0.0, 1.0), codebook: Optional[torch.Tensor] = None):
        decoder, head = _decoder_and_head(lm)
        start, end = int(image_token_range[0]), int(image_token_range[1])
        if not 0 <= start < end <= head.out_features:
            raise ValueError(f"image_token_range {image_token_range} is not inside the vocabulary "
                             f"({head.out_features})")
        super().__init__(decoder, grid, end - start, cache_config=getattr(lm, "config", None))
        self.lm, self.head = lm, head
        self.image_start = start
        self.null_token_id = null_token_id
        self._decode = decode
        self.pixel_range = pixel_range
        if codebook is not None and (codebook.dim() != 2 or codebook.shape[0] != end - start):
            raise ValueError(f"codebook must be [V, D] with V = {end - start} image tokens, got "
                             f"{tuple(codebook.shape)}")
        self._codebook = codebook

    def codebook(self) -> Optional[torch.Tensor]:
        """[V, D] each grid id's latent vector, or None (see the protocol)."""
        return self._codebook

    def _prompt_rows(self, input_ids, attention_mask, cfg):
        if not cfg:
            return input_ids, attention_mask
        if self.null_token_id is None:
            raise ValueError("cfg_scale != 1 needs ImageGPT(null_token_id=...) for the unconditional rows")
        uncond = torch.full_like(input_ids, self.null_token_id)
        mask = None if attention_mask is None else torch.cat([attention_mask, attention_mask], 0)
        return torch.cat([input_ids, uncond], 0), mask

    def _to_model_ids(self, tokens):
        return tokens + self.image_start

    def _head(self, hidden):
        start, end = self.image_start, self.image_start + self.vocab_size
        bias = None if self.head.bias is None else self.head.bias[start:end]
        return F.linear(hidden, self.head.weight[start:end], bias)  # [R, L, V]

    def image_sequence(self, tokens):
        return tokens + self.image_start

    @torch.no_grad()
    def decode(self, tokens):
        if self._decode is None:
            return None
        images = torch.as_tensor(self._decode(tokens))
        if images.dtype != torch.uint8:
            low, high = self.pixel_range
            images = ((images.float() - low) / (high - low)).clamp(0, 1).mul(255).round().to(torch.uint8)
        if images.ndim == 3:
            images = images[..., None].expand(*images.shape, 3)
        return images.contiguous()
