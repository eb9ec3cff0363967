"""The :class:`~csd_kernels.models.ImageAdapter` of a native LlamaGen GPT (and optional VQ decoder).

Prompts, as upstream ``autoregressive/models/generate.py`` builds them:

* c2i: ``input_ids`` [B, 1] class ids; the CFG unconditional rows use the null class ``num_classes``;
* t2i: ``prompt_embeds`` [B, 120, caption_dim] caption features (e.g. FLAN-T5-XL, run by the caller) and their
  ``attention_mask`` [B, 120]. As upstream's ``sample_t2i.py``, padded caption rows are zeroed and the padded
  positions are hidden from every query but their own; upstream left-pads (:func:`left_pad_captions`). The CFG
  unconditional rows are the learned ``uncond_embedding`` under the same mask.

Grid id k is codebook id k; input x_k sits at sequence position cls_token_num + k (x_{-1} is the last condition
position). ``decode`` runs the VQ decoder and converts to uint8 as upstream saves its samples.
"""

from __future__ import annotations

from typing import Optional

import torch

from ...config.generation import GenerationConfig
from ..cache import chain_visibility, move_rows, tree_visibility
from .gpt import KVCache, RowKVCache, Transformer
from .vq import VQDecoder, to_uint8_like_save_image

__all__ = ["C2I_DEFAULTS", "T2I_DEFAULTS", "LlamaGenAdapter", "left_pad_captions"]

# generate() keywords of upstream's sampling scripts (their top_p = 1.0 is no filtering)
C2I_DEFAULTS = GenerationConfig(cfg_scale=4.0, top_k=2000, temperature=1.0)  # autoregressive/sample/sample_c2i.py
T2I_DEFAULTS = GenerationConfig(cfg_scale=7.5, top_k=1000, temperature=1.0)  # autoregressive/sample/sample_t2i.py


def left_pad_captions(embeds: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded caption features [B, T, C] and mask [B, T] (a T5 tokenizer's output) -> left-padded, as
    upstream's sample_t2i.py does before generating (its default)."""
    valid = mask.sum(-1)  # [B]
    length = mask.shape[1]
    index = (torch.arange(length, device=mask.device)[None, :] + valid[:, None]) % length  # [B, T] roll by valid
    rolled = embeds.gather(1, index[..., None].expand_as(embeds))
    return rolled, mask.flip(-1)


class LlamaGenAdapter:
    def __init__(self, model: Transformer, vq: Optional[VQDecoder] = None):
        self.model = model
        self.vq = vq
        self._codebook: Optional[torch.Tensor] = None
        self.args = model.args
        self.grid = (self.args.grid, self.args.grid)
        self.vocab_size = self.args.vocab_size
        self.defaults = C2I_DEFAULTS if self.args.model_type == "c2i" else T2I_DEFAULTS
        self.cache: Optional[KVCache] = None
        self.key_valid: Optional[torch.Tensor] = None  # [R, cls + grid²] False at padded caption positions
        self.last: Optional[torch.Tensor] = None  # [R, 1, D] embedding of the last condition position (x_{-1})
        self.batch = 0
        self.cfg = False
        self._static_window: Optional[int] = None  # static_cache(): the next prefill allocates a RowKVCache

    @property
    def device(self) -> torch.device:
        return self.model.tok_embeddings.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.tok_embeddings.weight.dtype

    # ------------------------------------------------------------------------------------------------------------------
    # prompts
    # ------------------------------------------------------------------------------------------------------------------
    @torch.no_grad()
    def prefill(self, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor], cfg: bool) -> int:
        """c2i: class ids [B, 1] -> 0 model calls (the class token is the prompt's final token)."""
        if self.args.model_type != "c2i":
            raise ValueError("a LlamaGen t2i model takes caption features: generate(model, prompt_embeds=[B, 120, "
                             f"{self.args.caption_dim}], attention_mask=[B, 120])")
        if input_ids.ndim != 2 or input_ids.shape[1] != 1:
            raise ValueError(f"LlamaGen c2i takes one class id per row: input_ids [B, 1], got {tuple(input_ids.shape)}")
        if attention_mask is not None and not bool((attention_mask == 1).all()):
            raise ValueError("LlamaGen c2i prompts are one class id: there is nothing to pad")
        labels = input_ids[:, 0].to(self.device)  # [B]
        if not bool(((labels >= 0) & (labels < self.args.num_classes)).all()):
            raise ValueError(f"class ids must be in 0..{self.args.num_classes - 1}, got {labels.tolist()}")
        if cfg:
            if self.args.class_rows == self.args.num_classes:
                raise ValueError("this checkpoint has no null class (class_dropout_prob = 0): use cfg_scale=1")
            labels = torch.cat([labels, torch.full_like(labels, self.args.num_classes)])  # [2B]: cond; uncond
        return self._start(self.model.embed_condition(labels), None, len(input_ids), cfg)

    @torch.no_grad()
    def prefill_embeds(self, prompt_embeds: torch.Tensor, attention_mask: Optional[torch.Tensor], cfg: bool) -> int:
        """t2i: caption features [B, 120, caption_dim] (+ mask [B, 120]) -> 1 model call (the first 119 positions)."""
        args = self.args
        if args.model_type != "t2i":
            raise ValueError("a LlamaGen c2i model takes class ids: generate(model, input_ids=[B, 1])")
        expected = (args.cls_token_num, args.caption_dim)
        if prompt_embeds.ndim != 3 or tuple(prompt_embeds.shape[1:]) != expected:
            raise ValueError(f"prompt_embeds must be [B, {expected[0]}, {expected[1]}], "
                             f"got {tuple(prompt_embeds.shape)}")
        batch = prompt_embeds.shape[0]
        if attention_mask is None:
            attention_mask = torch.ones(batch, args.cls_token_num, dtype=torch.long)
        if tuple(attention_mask.shape) != (batch, args.cls_token_num):
            raise ValueError(f"attention_mask must be [{batch}, {args.cls_token_num}], "
                             f"got {tuple(attention_mask.shape)}")
        mask = attention_mask.to(self.device)
        caption = prompt_embeds.to(self.device, self.dtype) * mask[..., None].to(self.dtype)  # padded rows zeroed
        if cfg:
            uncond = self.model.cls_embedding.uncond_embedding.to(self.dtype).expand_as(caption)
            caption, mask = torch.cat([caption, uncond]), torch.cat([mask, mask])  # [2B, ...]: cond; uncond
        key_valid = torch.ones(len(mask), args.max_seq_len, dtype=torch.bool, device=self.device)
        key_valid[:, : args.cls_token_num] = mask != 0
        return self._start(self.model.embed_condition(caption), key_valid, batch, cfg)

    def _start(self, cond: torch.Tensor, key_valid: Optional[torch.Tensor], batch: int, cfg: bool) -> int:
        """cond [R, cls, D]: run all but the last condition position into a fresh cache."""
        self.batch, self.cfg = batch, cfg
        self.key_valid = key_valid
        self.last = cond[:, -1:]
        window, self._static_window = self._static_window, None  # a static_cache() request holds for one prefill
        if window is not None:
            return self._start_static(cond, window)
        self.cache = KVCache(self.args, len(cond), self.dtype, self.device)
        if cond.shape[1] == 1:
            return 0
        self.model(cond[:, :-1], 0, self.cache, key_valid)
        return 1

    # ------------------------------------------------------------------------------------------------------------------
    # the static form
    # ------------------------------------------------------------------------------------------------------------------
    def static_cache(self, window: int, tree=None) -> None:
        """The next prefill (only) allocates a per-row static cache with room for ``window`` inputs past the grid
        (a tree's inputs take one slot each: ``tree`` changes nothing here)."""
        self._static_window = int(window)

    def _start_static(self, cond: torch.Tensor, window: int) -> int:
        rows, cls = len(cond), self.args.cls_token_num
        capacity = self.args.max_seq_len + window
        self.cache = RowKVCache(self.args, rows, capacity, self.dtype, self.device)
        if self.key_valid is not None:  # padded caption slots stay hidden; the rest of the cache is real
            self.key_valid = torch.cat([self.key_valid, self.key_valid.new_ones(rows, window)], 1)
        if cls == 1:
            return 0
        positions = torch.arange(cls - 1, device=self.device)[None, :].expand(rows, -1)
        self._rows(cond[:, :-1], positions)
        return 1

    def _rows(self, embeds: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        visible = chain_visibility(positions, self.cache.capacity, self.key_valid)
        return self.model.forward_rows(embeds, positions, self.cache, visible)

    @torch.no_grad()
    def forward_static(self, tokens: torch.Tensor, first: torch.Tensor):
        """tokens [B, W] = x_{first_b} .. per row, first [B] -> (cond [B, W, V], uncond [B, W, V] | None)."""
        if self.cfg:
            tokens, first = torch.cat([tokens, tokens]), torch.cat([first, first])  # [R, W], [R]
        embeds = self.model.tok_embeddings(tokens)  # [R, W, D]
        slot0 = torch.arange(tokens.shape[1], device=tokens.device)[None, :, None] == 0
        embeds = torch.where(slot0 & (first[:, None, None] == -1), self.last, embeds)  # x_{-1}: the condition
        positions = self.args.cls_token_num + first[:, None] + torch.arange(tokens.shape[1], device=tokens.device)
        logits = self._rows(embeds, positions)  # [R, W, V]
        if self.cfg:
            return logits[: self.batch], logits[self.batch :]
        return logits, None

    supports_tree = True

    @torch.no_grad()
    def forward_tree(self, tokens: torch.Tensor, first: torch.Tensor, depth: torch.Tensor, ancestor: torch.Tensor):
        """A draft tree (see CachedImageLM.forward_tree): slot s at position first_b + depth[s], cache slot first_b + s,
        seeing the committed prefix and its ancestors -> (cond [B, W, V], uncond [B, W, V] | None)."""
        if self.cfg:
            tokens, first = torch.cat([tokens, tokens]), torch.cat([first, first])  # [R, W], [R]
        embeds = self.model.tok_embeddings(tokens)  # [R, W, D]
        slot0 = torch.arange(tokens.shape[1], device=tokens.device)[None, :, None] == 0
        embeds = torch.where(slot0 & (first[:, None, None] == -1), self.last, embeds)  # x_{-1}: the condition
        base = self.args.cls_token_num + first  # [R]
        slots = base[:, None] + torch.arange(tokens.shape[1], device=tokens.device)
        visible = tree_visibility(base, ancestor, self.cache.capacity, self.key_valid)
        logits = self.model.forward_rows(embeds, base[:, None] + depth.to(tokens.device)[None, :], self.cache,
                                         visible, slots)
        if self.cfg:
            return logits[: self.batch], logits[self.batch :]
        return logits, None

    def keep_path(self, first: torch.Tensor, path: torch.Tensor) -> None:
        """Slot first_b + k <- slot first_b + path[b, k] in every layer (path -1 keeps slot k)."""
        if self.cfg:
            first, path = torch.cat([first, first]), torch.cat([path, path])
        depth = torch.arange(path.shape[1], device=path.device)[None, :]
        base = (self.args.cls_token_num + first)[:, None]
        source = base + torch.where(path >= 0, path, depth)
        for store in (self.cache.keys, self.cache.values):
            for layer in store:
                move_rows(layer, base + depth, source)

    # ------------------------------------------------------------------------------------------------------------------
    # the protocol's decoding steps
    # ------------------------------------------------------------------------------------------------------------------
    @torch.no_grad()
    def forward(self, tokens: torch.Tensor, first: int):
        """tokens [B, L] = x_first .. x_{first+L-1} -> (cond [B, L, V], uncond [B, L, V] | None)."""
        ids = tokens.to(self.device)
        if self.cfg:
            ids = torch.cat([ids, ids])  # [2B, L]: the unconditional rows see the same image tokens
        embeds = self.model.tok_embeddings(ids)  # [R, L, D]
        if first == -1:
            embeds = torch.cat([self.last, embeds[:, 1:]], 1)
        logits = self.model(embeds, self.args.cls_token_num + first, self.cache, self.key_valid)  # [R, L, V]
        if self.cfg:
            return logits[: self.batch], logits[self.batch :]
        return logits, None

    def crop(self, first: int) -> None:
        self.cache.crop(self.args.cls_token_num + first)

    def image_sequence(self, tokens: torch.Tensor) -> torch.Tensor:
        return tokens  # grid ids are codebook ids

    @torch.no_grad()
    def codebook(self) -> Optional[torch.Tensor]:
        """[V, 8] the VQ's codebook as its decoder looks codes up (l2-normalised rows when trained so), or None
        without a VQ."""
        if self.vq is None:
            return None
        if self._codebook is None:
            self._codebook = self.vq.quantize.lookup(torch.arange(self.vocab_size, device=self.vq.quantize.embedding
                                                                  .weight.device)).detach().float()
        return self._codebook

    def decode(self, tokens: torch.Tensor) -> Optional[torch.Tensor]:
        if self.vq is None:
            return None
        images = self.vq.decode_code(tokens.to(self.vq.post_quant_conv.weight.device), self.grid)  # [B, 3, H, W]
        return to_uint8_like_save_image(images)
