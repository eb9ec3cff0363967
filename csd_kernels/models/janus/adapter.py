"""Janus / Janus-Pro image generation on transformers' ``JanusForConditionalGeneration``.

Layout as in transformers' own ``generate(generation_mode="image")``: the prompt (ending with the begin-of-image
token) is embedded with the text embeddings; the unconditional CFG rows are the prompt with every token that is
neither BOS nor BOI replaced by the pad token (same length, same attention mask); image tokens are embedded with
``generation_embeddings`` + ``generation_aligner`` and scored by ``generation_head``; pixels via
``decode_image_tokens``. The grid is sqrt(num_image_tokens) squared (24 x 24 for the released models).
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from ...config.generation import GenerationConfig
from ..base import CachedImageLM
from ..protocol import to_uint8_images

__all__ = ["JanusAdapter", "janus_prompt", "JANUS_PRO_ROLES", "JANUS_ROLES", "JANUS_DEFAULTS"]

# The conversation roles of deepseek-ai/Janus' "deepseek" SFT template: Janus-Pro's README uses the tagged roles,
# Janus-1.3B's generation_inference.py the plain ones.
JANUS_PRO_ROLES = ("<|User|>", "<|Assistant|>")
JANUS_ROLES = ("User", "Assistant")
# How deepseek-ai/Janus (generation_inference.py) and the CSD authors run text-to-image: cfg_weight 5, temperature 1,
# no top-k (transformers' generation config may carry top_k for sampling; it is not what they run).
JANUS_DEFAULTS = GenerationConfig(cfg_scale=5.0, temperature=1.0, top_k=None)


def janus_prompt(processor, text, *, roles=JANUS_PRO_ROLES) -> dict:
    """``input_ids`` and ``attention_mask`` [B, S] (left-padded) of Janus' text-to-image prompt for ``text``
    (a string or a list of strings), as deepseek-ai/Janus builds it: the SFT template with an empty system prompt,
    the user turn, an empty assistant turn, then the image-start tag, tokenized with BOS::

        <BOS><|User|>: {text}\n\n<|Assistant|>:<begin_of_image>

    ``processor``: transformers' ``JanusProcessor`` or its tokenizer. Use ``roles=JANUS_ROLES`` for Janus-1.3B.
    Pass the result to :func:`csd_kernels.generate` as ``generate(model, **janus_prompt(processor, text))``.
    """
    texts = [text] if isinstance(text, str) else list(text)
    tokenizer = getattr(processor, "tokenizer", processor)
    boi = getattr(processor, "image_start_token", None) or getattr(tokenizer, "boi_token", None) or "<begin_of_image>"
    rows = [tokenizer.encode(f"{roles[0]}: {t.strip()}\n\n{roles[1]}:{boi}") for t in texts]  # BOS added
    width = max(len(r) for r in rows)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    input_ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows], dtype=torch.long)
    attention_mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], dtype=torch.long)
    return {"input_ids": input_ids, "attention_mask": attention_mask}


class JanusAdapter(CachedImageLM):
    def __init__(self, model, *, bos_token_id: Optional[int] = None, boi_token_id: Optional[int] = None,
                 pad_token_id: Optional[int] = None):
        self.model = model
        inner = model.model
        num_tokens = int(inner.vision_model.config.num_image_tokens)
        side = math.isqrt(num_tokens)
        if side * side != num_tokens:
            raise ValueError(f"Janus num_image_tokens={num_tokens} is not a square grid")
        super().__init__(inner.language_model, (side, side), inner.generation_head.vision_head.out_features,
                         cache_config=model.config.text_config)
        gen = getattr(model, "generation_config", None)
        text = model.config.text_config
        gen_kwargs = (getattr(gen, "generation_kwargs", None) or {}) if gen is not None else {}

        def first_set(*values):
            return next((v for v in values if v is not None), None)

        self.bos_token_id = first_set(bos_token_id, getattr(gen, "bos_token_id", None), text.bos_token_id)
        self.boi_token_id = first_set(boi_token_id, gen_kwargs.get("boi_token_id"))
        self.pad_token_id = first_set(pad_token_id, getattr(gen, "pad_token_id", None), text.pad_token_id)

    def _prompt_rows(self, input_ids, attention_mask, cfg):
        if not cfg:
            return input_ids, attention_mask
        if self.pad_token_id is None:
            raise ValueError("Janus CFG needs a pad token id (generation_config.pad_token_id or pad_token_id=)")
        keep = torch.zeros_like(input_ids, dtype=torch.bool)
        if self.bos_token_id is not None:
            keep |= input_ids == self.bos_token_id
        if self.boi_token_id is not None:
            keep |= input_ids == self.boi_token_id
        uncond = torch.where(keep, input_ids, torch.full_like(input_ids, self.pad_token_id))
        mask = None if attention_mask is None else torch.cat([attention_mask, attention_mask], 0)
        return torch.cat([input_ids, uncond], 0), mask

    def _to_model_ids(self, tokens):
        return tokens

    def _window(self, ids, first):
        # ids [R, L]: image token ids; when first == -1 slot 0 is the prompt's final (text) token
        if first == -1:
            text = self.model.get_input_embeddings()(ids[:, :1])  # [R, 1, D]
            image = self.model.prepare_embeddings_for_image_generation(ids[:, 1:])  # [R, L-1, D]
            embeds = torch.cat([text, image.to(text.dtype)], 1)
        else:
            embeds = self.model.prepare_embeddings_for_image_generation(ids)
        return {"inputs_embeds": embeds}, None

    def _inputs_static(self, ids, at_prompt):
        # the prompt's final token takes the text embedding, image tokens the generation embedding (both computed,
        # one chosen per slot: the same shapes whether or not a row is at the prompt's end)
        text = self.model.get_input_embeddings()(torch.where(at_prompt, ids, 0))  # [R, W, D]
        image = self.model.prepare_embeddings_for_image_generation(torch.where(at_prompt, 0, ids)).to(text.dtype)
        return {"inputs_embeds": torch.where(at_prompt[..., None], text, image)}

    def _head(self, hidden):
        return self.model.model.generation_head(hidden)  # [R, L, V]

    def image_sequence(self, tokens):
        return tokens

    def codebook(self) -> Optional[torch.Tensor]:
        """[V, 8] the VQ's codebook as its decoder looks codes up (l2-normalised rows), or None without a VQ."""
        quantize = getattr(getattr(self.model.model, "vqmodel", None), "quantize", None)
        weight = getattr(getattr(quantize, "embedding", None), "weight", None)
        if weight is None or weight.shape[0] < self.vocab_size:
            return None
        return torch.nn.functional.normalize(weight[:self.vocab_size].detach().float(), p=2, dim=-1)

    @torch.no_grad()
    def decode(self, tokens):
        return to_uint8_images(self.model.decode_image_tokens(tokens.to(self.device)))
