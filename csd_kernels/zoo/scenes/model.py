"""The scenes GPT: a LlamaGen-style ``LlamaForCausalLM`` over :mod:`.tokenizer` codes, prompted by attribute tokens.

Vocabulary (K = the codebook's size)
------------------------------------
* ``[0, K)``               image codes (24x24 grid, raster order)
* ``K + 0..3``             background: flat, gradient, noise, any (the prompt names none)
* ``K + 4..11``            colours, ``K + 12..14`` shapes, ``K + 15..23`` cells
* ``EMPTY = K + 24``       an unused object slot; ``NULL = K + 25``: the unconditional (CFG) prompt token

A prompt is ``PROMPT_LEN = 10`` tokens: the background, then three object slots (colour, shape, cell), filled in
cell order, the unused ones ``EMPTY``. The unconditional prompt is ten ``NULL`` tokens (what ``ImageGPT`` builds).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from ..llama_io import build_llama, load_llama, save_llama
from .tokenizer import GRID, TOKENS_PER_IMAGE, PatchTokenizer
from .world import BACKGROUNDS, CELLS, COLOURS, MAX_OBJECTS, SHAPES, Prompt, parse_prompt

NUM_CODES = 4096
BG_ANY = len(BACKGROUNDS)
_BG, _COLOUR = 0, len(BACKGROUNDS) + 1
_SHAPE = _COLOUR + len(COLOURS)
_CELL = _SHAPE + len(SHAPES)
_EMPTY = _CELL + len(CELLS)
_NULL = _EMPTY + 1
NUM_PROMPT_TOKENS = _NULL + 1
PROMPT_LEN = 1 + 3 * MAX_OBJECTS
SEQ_LEN = PROMPT_LEN + TOKENS_PER_IMAGE
EMPTY_TOKEN_ID = NUM_CODES + _EMPTY
NULL_TOKEN_ID = NUM_CODES + _NULL
VOCAB_SIZE = NUM_CODES + NUM_PROMPT_TOKENS

WEIGHTS_DIR = Path(__file__).resolve().parent / "weights"
TOKENIZER_FILE = "tokenizer.safetensors"
ARCH = dict(hidden_size=160, intermediate_size=448, num_hidden_layers=4, num_attention_heads=5, num_key_value_heads=5)
MAX_POSITIONS = 640

__all__ = ["NUM_CODES", "PROMPT_LEN", "SEQ_LEN", "NULL_TOKEN_ID", "EMPTY_TOKEN_ID", "VOCAB_SIZE", "GRID", "ARCH",
           "WEIGHTS_DIR", "TOKENIZER_FILE", "build_lm", "save_lm", "load_lm", "load_tokenizer", "prompt_tokens",
           "prompt_ids"]


def build_lm(seed: int = 0, **arch):
    """The randomly initialised scenes GPT (deterministic for ``seed``)."""
    return build_llama(VOCAB_SIZE, MAX_POSITIONS, seed, **{**ARCH, **arch})


def save_lm(lm, weights_dir: str | os.PathLike) -> None:
    save_llama(lm, weights_dir)


def load_lm(weights_dir: str | os.PathLike | None = None, dtype=torch.float32):
    """The shipped (or a trained) scenes GPT in eval mode; purely local."""
    return load_llama(WEIGHTS_DIR if weights_dir is None else weights_dir, "scenes", dtype=dtype)


def load_tokenizer(weights_dir: str | os.PathLike | None = None) -> PatchTokenizer:
    return PatchTokenizer.load(Path(WEIGHTS_DIR if weights_dir is None else weights_dir) / TOKENIZER_FILE)


def prompt_tokens(prompt: Prompt) -> list[int]:
    """The ten prompt tokens of one parsed prompt."""
    bg = BG_ANY if prompt.background is None else BACKGROUNDS.index(prompt.background)
    out = [NUM_CODES + _BG + bg]
    colours = list(COLOURS)
    for colour, shape, cell in prompt.objects:
        out += [NUM_CODES + _COLOUR + colours.index(colour), NUM_CODES + _SHAPE + SHAPES.index(shape),
                NUM_CODES + _CELL + cell]
    return out + [EMPTY_TOKEN_ID] * (PROMPT_LEN - len(out))


def prompt_ids(prompts, device=None) -> torch.Tensor:
    """Prompt texts (or parsed ``Prompt``s) -> LongTensor [B, 10]; ValueError naming a prompt outside the grammar."""
    if isinstance(prompts, (str, Prompt)):
        prompts = [prompts]
    if len(prompts) == 0:
        raise ValueError("prompts must not be empty")
    rows = [prompt_tokens(p if isinstance(p, Prompt) else parse_prompt(p)) for p in prompts]
    return torch.tensor(rows, dtype=torch.long, device=device)
