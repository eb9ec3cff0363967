"""The scenes GPT: a small Llama over :mod:`.tokenizer` codes, prompted by one token per cell of the 3x3 grid.

Vocabulary (K = the codebook's size)
------------------------------------
* ``[0, K)``               image codes (24x24 grid, raster order)
* ``K + 0..3``             background: flat, gradient, noise, any (the prompt names none)
* ``K + 4..27``            an object: colour x shape (8 x 3), in the order of ``world.COLOURS`` then ``world.SHAPES``
* ``EMPTY = K + 28``       an empty cell; ``NULL = K + 29``: the unconditional (CFG) prompt token

A prompt is ``PROMPT_LEN = 10`` tokens: the background, then the nine cells in reading order. The unconditional
prompt is ten ``NULL`` tokens (what ``ImageGPT`` builds). Because a cell's token sits at a fixed prompt position, an
image position finds what its cell holds by attending to one fixed place.

The network is ``transformers``' Llama with a learned absolute position embedding added to the token embeddings
(:class:`PositionalLlamaForCausalLM`): RoPE alone leaves a small model to derive a position's grid cell from
relative rotations, which it did not learn within the CPU budget (the model's README).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from transformers import LlamaForCausalLM, LlamaModel

from ..llama_io import build_llama, load_llama, save_llama
from .tokenizer import GRID, TOKENS_PER_IMAGE, PatchTokenizer
from .world import BACKGROUNDS, COLOURS, SHAPES, Prompt, parse_prompt

NUM_CODES = 4096
BG_ANY = len(BACKGROUNDS)
_OBJECT = len(BACKGROUNDS) + 1
_EMPTY = _OBJECT + len(COLOURS) * len(SHAPES)
_NULL = _EMPTY + 1
PROMPT_LEN = 1 + 9
SEQ_LEN = PROMPT_LEN + TOKENS_PER_IMAGE
EMPTY_TOKEN_ID = NUM_CODES + _EMPTY
NULL_TOKEN_ID = NUM_CODES + _NULL
VOCAB_SIZE = NUM_CODES + _NULL + 1

WEIGHTS_DIR = Path(__file__).resolve().parent / "weights"
TOKENIZER_FILE = "tokenizer.safetensors"
ARCH = dict(hidden_size=160, intermediate_size=448, num_hidden_layers=4, num_attention_heads=5, num_key_value_heads=5)
MAX_POSITIONS = 640

__all__ = ["NUM_CODES", "PROMPT_LEN", "SEQ_LEN", "NULL_TOKEN_ID", "EMPTY_TOKEN_ID", "VOCAB_SIZE", "GRID", "ARCH",
           "WEIGHTS_DIR", "TOKENIZER_FILE", "PositionalLlamaForCausalLM", "build_lm", "save_lm", "load_lm",
           "load_tokenizer", "prompt_tokens", "prompt_ids"]


class PositionalLlamaModel(LlamaModel):
    """``LlamaModel`` whose input is the token embedding plus a learned embedding of its position id."""

    def __init__(self, config):
        super().__init__(config)
        self.embed_positions = torch.nn.Embedding(config.max_position_embeddings, config.hidden_size)

    def forward(self, input_ids=None, position_ids=None, inputs_embeds=None, **kwargs):
        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids)
        if position_ids is None:  # as LlamaModel counts them: after what the cache holds
            cache = kwargs.get("cache", kwargs.get("past_key_values"))
            start = cache.get_seq_length() if cache is not None else 0
            position_ids = (torch.arange(inputs_embeds.shape[1], device=inputs_embeds.device) + start)[None]
        # The static loop feeds a window past the image's last token (slots whose outputs it never reads): up to
        # prompt + grid + window - 1; the learned table ends at the last real position, so those share its row.
        last = self.embed_positions.num_embeddings - 1
        inputs_embeds = inputs_embeds + self.embed_positions(position_ids.clamp(max=last))
        return super().forward(inputs_embeds=inputs_embeds, position_ids=position_ids, **kwargs)


class PositionalLlamaForCausalLM(LlamaForCausalLM):
    def __init__(self, config):
        super().__init__(config)
        self.model = PositionalLlamaModel(config)
        self.post_init()


def build_lm(seed: int = 0, **arch):
    """The randomly initialised scenes GPT (deterministic for ``seed``)."""
    return build_llama(VOCAB_SIZE, MAX_POSITIONS, seed, model_class=PositionalLlamaForCausalLM, **{**ARCH, **arch})


def save_lm(lm, weights_dir: str | os.PathLike) -> None:
    save_llama(lm, weights_dir)


def load_lm(weights_dir: str | os.PathLike | None = None, dtype=torch.float32, flag: str = "--weights"):
    """The shipped (or a trained) scenes GPT in eval mode; purely local. A damaged file: InputError naming ``flag``."""
    return load_llama(WEIGHTS_DIR if weights_dir is None else weights_dir, "scenes", dtype=dtype,
                      model_class=PositionalLlamaForCausalLM, flag=flag)


def load_tokenizer(weights_dir: str | os.PathLike | None = None, flag: str = "--weights") -> PatchTokenizer:
    return PatchTokenizer.load(Path(WEIGHTS_DIR if weights_dir is None else weights_dir) / TOKENIZER_FILE, flag)


def prompt_tokens(prompt: Prompt) -> list[int]:
    """The ten prompt tokens of one parsed prompt: the background, then each cell's object or EMPTY."""
    bg = BG_ANY if prompt.background is None else BACKGROUNDS.index(prompt.background)
    cells = [EMPTY_TOKEN_ID] * 9
    colours = list(COLOURS)
    for colour, shape, cell in prompt.objects:
        cells[cell] = NUM_CODES + _OBJECT + colours.index(colour) * len(SHAPES) + SHAPES.index(shape)
    return [NUM_CODES + bg] + cells


def prompt_ids(prompts, device=None) -> torch.Tensor:
    """Prompt texts (or parsed ``Prompt``s) -> LongTensor [B, 10]; ValueError naming a prompt outside the grammar."""
    if isinstance(prompts, (str, Prompt)):
        prompts = [prompts]
    if len(prompts) == 0:
        raise ValueError("prompts must not be empty")
    rows = [prompt_tokens(p if isinstance(p, Prompt) else parse_prompt(p)) for p in prompts]
    return torch.tensor(rows, dtype=torch.long, device=device)


def object_cells(ids: torch.Tensor) -> torch.Tensor:
    """bool [B, 9]: the cells a prompt [B, 10] puts an object in (none for the unconditional prompt)."""
    cells = ids[:, 1:]
    return (cells >= NUM_CODES + _OBJECT) & (cells < EMPTY_TOKEN_ID)
