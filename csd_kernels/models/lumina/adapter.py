"""Lumina-mGPT layout on transformers' ``ChameleonForConditionalGeneration``.

Sequence after the text prompt: ``[image_start, size_h, size_w]`` (the image prefix, appended by the adapter),
then the H rows of image codes, each followed by a row-end token, then ``image_end``. Image codes are the contiguous
id range ``image_token_range = (start, end)`` of the text vocabulary (grid id c <-> model id start + c). Row-end
tokens are forced: the adapter inserts them into the model input and never lets the loop draft them, and maps
grid index k to sequence index P + k + k // W. Chameleon's ``forward`` masks image ids out of its logits, so the
adapter takes hidden states from the base model and applies ``lm_head`` rows ``start:end`` itself.

Defaults are Lumina-mGPT's token ids, as its FlexARItemProcessor writes them: image codes are the BPE ids 4..8195,
image start ``<racm3:break>`` = 8197, image end ``<eoss>`` = 8196, row end ``<reserved08799>`` = 8803, and the size
token ``<reserved{8800 + n}>`` = 8804 + n where n counts 32-pixel patches, i.e. half the token grid (a 48×48 grid at
768 px gives 8828, 8828). Pass your own ids for other checkpoints or tiny test models. A pixel decoder receives grid
ids c = BPE id − 4; Chameleon's VQ model wants codebook indices, i.e.
``model.model.vocabulary_mapping.bpe2img`` applied to c + 4.

What the loop's verify sees is what Lumina-mGPT's inference solver (``inference_solver.py``) samples from:

* CFG: its ``LLMImageStartTriggeredUnbatchedClassifierFreeGuidanceLogitsProcessor`` starts once the two size tokens
  follow the image start; the unconditional context is ``input_ids[:, image_start_index:]`` (the image prefix and
  the image so far, no text, no BOS) with an all-ones mask and its own cache, so positions count from 0 at the image
  start. The adapter's unconditional rows are the image prefix alone, left-padded and masked, with position ids
  counted from the first real token: the same context. Logits mix as ``u + s·(c − u)`` in float32, as upstream's.
* ``MultiModalLogitsProcessor`` masks every id outside 4..8195 (= ``image_token_range``) at image positions and
  forces the row end after each W codes and the image end after H rows: the adapter scores the image rows of
  ``lm_head`` only and inserts the forced tokens.
* ``InterleavedTopKLogitsWarper``: top-k (``image_top_k``, 2000) over those image logits, then temperature: the
  loop's ``top_k`` over the same 8192 logits (ties at the k-th value kept, as upstream's ``scores < kth``).
* One difference: upstream lets the model sample ``<racm3:break>`` and the size tokens (text top-k 10) after the
  prompt, where the adapter appends them for the grid you ask; a trained model emits exactly these for a prompt
  that names the size.
"""

from __future__ import annotations

import os
from typing import Callable, Optional, Sequence, Union

import torch
import torch.nn.functional as F

from ...config.generation import GenerationConfig
from ..protocol import to_uint8_images
from ..row_end import RowEndLayout

__all__ = ["DEFAULT_GRID", "LUMINA_DEFAULTS", "LuminaMGPT", "load_lumina_mgpt", "lumina_grid", "lumina_prompt"]

# Sampling defaults of the family, for generate(**LUMINA_DEFAULTS): image top-k 2000 and CFG 3.0 are the setting of
# the SJD and GSD papers' Lumina-mGPT experiments (and of inference_solver.create_logits_processor's defaults);
# Lumina-mGPT's own README suggests cfg 4.0 (top-k 2000, temperature 1.0).
LUMINA_DEFAULTS = GenerationConfig(top_k=2000, cfg_scale=3.0, temperature=1.0)
# Lumina-mGPT-7B-768: 768 px / 16 px per token. Other sizes: lumina_grid(width, height).
DEFAULT_GRID = (48, 48)
PATCH_PIXELS = 32  # a size token counts 32-pixel patches = 2 x 2 tokens of 16 pixels
# Lumina-mGPT's question template (generate_examples/generate.py, demos) and its conversation turn separator
# (data/convertsation.py: Conversation.sep_token), appended to the human turn; the assistant turn is left open.
PROMPT_TEMPLATE = "Generate an image of {width}x{height} according to the following prompt:\n{text}"
TURN_SEPARATOR = "<reserved08706>"
IMAGE_PLACEHOLDER = "<|image|>"  # FlexARItemProcessor's media symbol: it would expect an input image


def lumina_grid(width: int, height: int) -> tuple[int, int]:
    """Pixels -> the token grid (H, W) Lumina-mGPT generates for them: 16 pixels a token, sizes in 32-pixel steps."""
    for name, value in (("width", width), ("height", height)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0 or value % PATCH_PIXELS:
            raise ValueError(f"{name} {value!r}: Lumina-mGPT sizes are positive multiples of {PATCH_PIXELS} pixels")
    return height // 16, width // 16


def lumina_prompt(tokenizer, text: str, width: int, height: int) -> list[int]:
    """Prompt ids for an image of width x height pixels, as Lumina-mGPT's FlexARInferenceSolver.generate builds them
    for qas = [[PROMPT_TEMPLATE, None]]: BOS (the tokenizer's, else its EOS), then the tokenized question followed by
    the turn separator <reserved08706> (id 8710 in Lumina-mGPT's tokenizer), no special tokens added.

    tokenizer: a transformers tokenizer of the checkpoint (Lumina-mGPT's tokenizer.json). Returns a list of ints;
    feed ``torch.tensor([ids])`` (several prompts: left-pad and pass ``attention_mask``)."""
    lumina_grid(width, height)
    if not isinstance(text, str):
        raise ValueError(f"text must be a str, got {type(text).__name__}")
    if IMAGE_PLACEHOLDER in text:
        raise ValueError(f"text contains {IMAGE_PLACEHOLDER!r}, Lumina-mGPT's image-input placeholder")
    bos = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
    separator = tokenizer.convert_tokens_to_ids(TURN_SEPARATOR)
    if bos is None or separator is None or separator == tokenizer.unk_token_id:
        raise ValueError(f"tokenizer has no BOS/EOS or no {TURN_SEPARATOR} token: not Lumina-mGPT's tokenizer")
    question = PROMPT_TEMPLATE.format(width=width, height=height, text=text)
    ids = tokenizer.encode(question + TURN_SEPARATOR, add_special_tokens=False, truncation=False)
    if not ids or ids[-1] != separator:
        raise ValueError(f"the tokenizer does not keep {TURN_SEPARATOR} as one token")
    return [int(bos)] + [int(i) for i in ids]


def load_lumina_mgpt(path_or_model, *, grid: Optional[tuple[int, int]] = None,
                     decode: Optional[Callable[[torch.Tensor], torch.Tensor]] = None,
                     dtype: Optional[torch.dtype] = None,
                     device: Union[str, torch.device, None] = None) -> LuminaMGPT:
    """A LuminaMGPT adapter over transformers' Chameleon, from a Lumina-mGPT checkpoint folder (config.json +
    safetensors, as Alpha-VLLM releases it; converted by :mod:`.checkpoint`) or an already-built
    ``ChameleonForConditionalGeneration`` (wrapped; moved when dtype/device are given).

    grid: (H, W) tokens; None = DEFAULT_GRID (48 x 48, Lumina-mGPT-7B-768). For another size use
    ``lumina_grid(width, height)`` with the width/height of ``lumina_prompt``. Defaults for generate(): ``.defaults``.
    """
    from .checkpoint import load_lumina_chameleon, move_chameleon

    if isinstance(path_or_model, (str, os.PathLike)):
        model = load_lumina_chameleon(path_or_model, dtype=dtype, device=device)
    elif type(path_or_model).__name__ == "ChameleonForConditionalGeneration":
        model = move_chameleon(path_or_model, dtype=dtype, device=device)
    else:
        raise ValueError(f"load_lumina_mgpt takes a checkpoint folder or a ChameleonForConditionalGeneration, got "
                         f"{type(path_or_model).__name__}")
    return LuminaMGPT(model.eval(), grid=DEFAULT_GRID if grid is None else grid, decode=decode)


class LuminaMGPT(RowEndLayout):
    def __init__(self, model, grid: tuple[int, int] = DEFAULT_GRID, *, image_token_range: tuple[int, int] = (4, 8196),
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
        self.defaults = LUMINA_DEFAULTS  # generate()'s config (see LUMINA_DEFAULTS)

    def _prompt_rows(self, input_ids, attention_mask, cfg):
        batch, length = input_ids.shape
        prefix = torch.tensor(self.image_prefix_ids, dtype=input_ids.dtype, device=input_ids.device).expand(batch, -1)
        cond = torch.cat([input_ids, prefix], 1)  # [B, S + 3]
        ones = torch.ones_like(prefix)
        cond_mask = torch.cat([attention_mask if attention_mask is not None else torch.ones_like(input_ids), ones], 1)
        if not cfg:
            return cond, (cond_mask if attention_mask is not None else None)
        # Lumina-mGPT's CFG context: the image from its start token on (no text, no BOS), positions from 0
        pad = torch.zeros_like(input_ids)
        uncond = torch.cat([pad, prefix], 1)  # left-padded: only the image prefix is attended
        uncond_mask = torch.cat([pad, ones], 1)
        return torch.cat([cond, uncond], 0), torch.cat([cond_mask, uncond_mask], 0)

    def _to_model_ids(self, tokens):
        return tokens + self.image_start

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

    def codebook(self) -> Optional[torch.Tensor]:
        """[V, C] the VQ codebook row of each grid id (BPE id c + start, through the model's
        ``vocabulary_mapping.bpe2img``), or None when the model has no VQ or the mapping misses a code."""
        base = getattr(self.model, "model", None)
        weight = getattr(getattr(getattr(getattr(base, "vqmodel", None), "quantize", None), "embedding", None),
                         "weight", None)
        mapping = getattr(getattr(base, "vocabulary_mapping", None), "bpe2img", None)
        if weight is None or mapping is None:
            return None
        rows = [mapping.get(self.image_start + c) for c in range(self.vocab_size)]
        if any(r is None or not 0 <= r < weight.shape[0] for r in rows):
            return None
        return weight[torch.tensor(rows, device=weight.device)].detach()

    @torch.no_grad()
    def decode(self, tokens):
        if self._decode is None:
            return None
        return to_uint8_images(self._decode(tokens))
