"""Emu3 image generation on transformers' ``Emu3ForConditionalGeneration`` (BAAI/Emu3-Gen-hf).

What the loop's verify sees is what transformers' own Emu3 image generation samples from (the recipe of its Emu3
docs and of BAAI's image_generation.py):

* prompt: the text followed by ``<|image start|>{H}*{W}<|image token|>`` (``Emu3Processor(...,
  return_for_image_generation=True)``); H x W image tokens, 8 pixels a token (the processor's ``downsample_ratio``).
* layout after the prompt: H rows of W visual tokens, each row followed by the end-of-line token ``<|extra_200|>``,
  then ``<|extra_201|>`` (end of frame), ``<|image end|>`` and EOS. transformers forces these with a
  ``prefix_allowed_tokens_fn`` that allows only visual tokens elsewhere; the adapter inserts the forced tokens
  itself (as for Lumina-mGPT's row ends), never lets the loop draft them, and scores only the visual rows of
  ``lm_head``. Visual tokens are the vocabulary entries ``<|visual token NNNNNN|>``: grid id c is the BPE id of
  code c (``vocabulary_mapping.img2bpe``).
* CFG (``UnbatchedClassifierFreeGuidanceLogitsProcessor`` with ``negative_prompt_ids``): the unconditional context is
  the negative prompt alone (no image prefix), followed by the image so far, positions counted from its first
  token; without a negative prompt, the prompt's last token alone. transformers mixes log-softmaxes over the whole
  vocabulary, ``u + s·(c − u)`` of log-probabilities; over the visual tokens that is the loop's raw-logit mix plus a
  constant per position, so the restricted distributions (and greedy choices) are the same.
"""

from __future__ import annotations

import os
from typing import Optional, Sequence, Union

import torch
import torch.nn.functional as F

from ...config.generation import GenerationConfig
from ..protocol import to_uint8_images
from ..row_end import RowEndLayout

__all__ = ["EMU3_DEFAULTS", "EMU3_NEGATIVE_PROMPT", "EMU3_POSITIVE_SUFFIX", "Emu3Adapter", "emu3_grid", "emu3_prompt",
           "adapter_of", "load_emu3"]

# BAAI's Emu3-Gen recipe (baaivision/Emu3 README, BAAI/Emu3 space image_generation.py): classifier-free guidance 3.0
# with the negative prompt below, sampling with top-k 2048, temperature 1; the prompt gets the positive suffix.
EMU3_DEFAULTS = GenerationConfig(cfg_scale=3.0, top_k=2048, temperature=1.0)
EMU3_POSITIVE_SUFFIX = " masterpiece, film grained, best quality."
EMU3_NEGATIVE_PROMPT = ("lowres, bad anatomy, bad hands, text, error, missing fingers, extra digit, fewer digits, "
                        "cropped, worst quality, low quality, normal quality, jpeg artifacts, signature, watermark, "
                        "username, blurry.")
PIXELS_PER_TOKEN = 8  # Emu3Processor.downsample_ratio
DEFAULT_SIZE = 720  # the processor's default image_area 518400 = 720 x 720: a 90 x 90 grid
_EOL, _EOF, _EOI = "<|extra_200|>", "<|extra_201|>", "<|image end|>"


def emu3_grid(width: int = DEFAULT_SIZE, height: int = DEFAULT_SIZE) -> tuple[int, int]:
    """Pixels -> the token grid (H, W): 8 pixels a token."""
    for name, value in (("width", width), ("height", height)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0 or value % PIXELS_PER_TOKEN:
            raise ValueError(f"{name} {value!r}: Emu3 sizes are positive multiples of {PIXELS_PER_TOKEN} pixels")
    return height // PIXELS_PER_TOKEN, width // PIXELS_PER_TOKEN


def _left_pad(rows: Sequence[Sequence[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.tensor([[pad] * (width - len(r)) + list(r) for r in rows], dtype=torch.long)
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], dtype=torch.long)
    return ids, mask


def emu3_prompt(processor, text, grid: tuple[int, int]) -> dict:
    """``input_ids`` / ``attention_mask`` [B, S] (left-padded) of Emu3's image-generation prompt for ``text`` (a
    string or a list): the text then ``<|image start|>{H}*{W}<|image token|>``, tokenized as ``Emu3Processor`` does
    with ``return_for_image_generation=True``. ``processor``: the ``Emu3Processor`` or its tokenizer."""
    tokenizer = getattr(processor, "tokenizer", processor)
    texts = [text] if isinstance(text, str) else list(text)
    boi = getattr(tokenizer, "boi_token", None) or "<|image start|>"
    wrapper = getattr(tokenizer, "image_wrapper_token", None) or "<|image token|>"
    rows = [tokenizer(f"{t}{boi}{grid[0]}*{grid[1]}{wrapper}")["input_ids"] for t in texts]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    ids, mask = _left_pad(rows, pad)
    return {"input_ids": ids, "attention_mask": mask}


def load_emu3(path: Union[str, os.PathLike], *, grid: Optional[tuple[int, int]] = None,
              negative_prompt_ids: Optional[Sequence[int]] = None, dtype: Optional[torch.dtype] = None,
              device: Union[str, torch.device, None] = None) -> "Emu3Adapter":
    """An Emu3Adapter from a local transformers-format Emu3 folder (``BAAI/Emu3-Gen-hf``: config.json model_type
    "emu3" + safetensors). grid: (H, W) tokens, None = 90 x 90 (720 px). ValueError for a folder that is not such a
    checkpoint or misses weights (nothing runs on random weights)."""
    import json

    from transformers import Emu3ForConditionalGeneration

    path = str(path)
    config_file = os.path.join(path, "config.json")
    if not os.path.isfile(config_file):
        raise ValueError(f"{path}: no config.json (pass a transformers-format Emu3 folder, e.g. BAAI/Emu3-Gen-hf)")
    with open(config_file, encoding="utf-8") as f:
        model_type = json.load(f).get("model_type")
    if model_type != "emu3":
        raise ValueError(f"{path}: model_type {model_type!r} is not transformers' 'emu3' (BAAI's original Emu3-Gen "
                         "release needs its remote code; use the converted BAAI/Emu3-Gen-hf)")
    kwargs = {} if dtype is None else {"dtype": dtype}
    model, info = Emu3ForConditionalGeneration.from_pretrained(path, output_loading_info=True, **kwargs)
    if info.get("missing_keys"):
        missing = sorted(info["missing_keys"])
        raise ValueError(f"{path}: not a complete Emu3 checkpoint: missing tensors {missing[:12]}")
    model = model.to(device or "cpu").eval()
    return Emu3Adapter(model, emu3_grid() if grid is None else grid, negative_prompt_ids=negative_prompt_ids)


def adapter_of(model):
    """get_adapter's answer for a bare Emu3ForConditionalGeneration: it cannot guess the image grid."""
    raise ValueError(f"an {type(model).__name__} needs its image grid: wrap it in "
                     "csd_kernels.models.Emu3Adapter(model, grid, negative_prompt_ids=...) or use load_emu3(path)")


class Emu3Adapter(RowEndLayout):  # the row-end layout of Lumina-mGPT
    """``negative_prompt_ids``: token ids of the CFG negative prompt (one prompt for every row), or None for
    transformers' default unconditional context (the prompt's last token)."""

    def __init__(self, model, grid: tuple[int, int], *, negative_prompt_ids: Optional[Sequence[int]] = None):
        self.model = model
        mapping = model.model.vocabulary_mapping
        codes = mapping.img2bpe  # code -> BPE id
        if sorted(codes) != list(range(len(codes))):
            raise ValueError("Emu3 vocabulary_map: the visual tokens do not number 0..V-1")
        bpe = torch.tensor([codes[c] for c in range(len(codes))], dtype=torch.long)
        super().__init__(model.model.text_model, grid, len(codes), cache_config=model.config.text_config)
        self._bpe = bpe
        self._contiguous = bool((bpe == bpe[0] + torch.arange(len(bpe))).all())
        vocab = model.config.vocabulary_map
        missing = [t for t in (_EOL, _EOF, _EOI) if t not in vocab]
        if missing:
            raise ValueError(f"Emu3 vocabulary_map has no {missing}")
        self.row_end_token_id, self.eof_token_id, self.eoi_token_id = vocab[_EOL], vocab[_EOF], vocab[_EOI]
        self.eos_token_id = model.config.text_config.eos_token_id
        self.pad_token_id = model.config.text_config.pad_token_id or 0
        self.negative_prompt_ids = None if negative_prompt_ids is None else [int(t) for t in negative_prompt_ids]
        self.defaults = EMU3_DEFAULTS

    def codebook(self) -> Optional[torch.Tensor]:
        """[V, C] the VQ's codebook (grid id c is code c), or None when the model has none."""
        quantize = getattr(getattr(self.model.model, "vqmodel", None), "quantize", None)
        weight = getattr(getattr(quantize, "embedding", None), "weight", None)
        return None if weight is None or weight.shape[0] < self.vocab_size else weight[:self.vocab_size].detach()

    def _prompt_rows(self, input_ids, attention_mask, cfg):
        mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask
        if not cfg:
            return input_ids, attention_mask
        batch = input_ids.shape[0]
        negative = [self.negative_prompt_ids] * batch if self.negative_prompt_ids is not None else \
            input_ids[:, -1:].tolist()  # transformers' default: the last prompt token alone
        uncond, uncond_mask = _left_pad(negative, self.pad_token_id)
        width = max(input_ids.shape[1], uncond.shape[1])

        def widen(ids, m, fill):
            extra = width - ids.shape[1]
            return (F.pad(ids, (extra, 0), value=fill), F.pad(m, (extra, 0), value=0))

        cond, cond_mask = widen(input_ids, mask, self.pad_token_id)
        uncond, uncond_mask = widen(uncond.to(input_ids.device), uncond_mask.to(input_ids.device), self.pad_token_id)
        return torch.cat([cond, uncond], 0), torch.cat([cond_mask, uncond_mask], 0)

    def _to_model_ids(self, tokens):
        if self._contiguous:
            return tokens + int(self._bpe[0])
        return self._bpe.to(tokens.device)[tokens]

    def _head(self, hidden):
        weight = self.model.lm_head.weight
        if self._contiguous:
            start = int(self._bpe[0])
            return F.linear(hidden, weight[start:start + self.vocab_size])  # [R, L, V]
        return F.linear(hidden, weight[self._bpe.to(weight.device)])

    def image_sequence(self, tokens):
        batch = tokens.shape[0]
        height, width = self.grid
        rows = self._to_model_ids(tokens).reshape(batch, height, width)
        row_end = torch.full((batch, height, 1), self.row_end_token_id, dtype=rows.dtype, device=rows.device)
        tail = torch.tensor([self.eof_token_id, self.eoi_token_id, self.eos_token_id], dtype=rows.dtype,
                            device=rows.device).expand(batch, -1)
        return torch.cat([torch.cat([rows, row_end], 2).reshape(batch, -1), tail], 1)

    @torch.no_grad()
    def decode(self, tokens):
        height, width = self.grid
        pixels = self.model.decode_image_tokens(image_tokens=self.image_sequence(tokens.to(self.device)),
                                                height=height, width=width)  # [B, 3, H_px, W_px] in [-1, 1]
        return to_uint8_images(pixels.permute(0, 2, 3, 1))
