"""LlamaGen-style class-conditional GPT over :mod:`tokenizer` codes (a tiny ``LlamaForCausalLM``).

Vocabulary
----------
* ``[0, NUM_CODES)``           image codes (16x16 grid, raster order)
* ``CLASS_TOKEN_OFFSET + c``   class token of digit ``c`` (0..9)
* ``NULL_TOKEN_ID``            the "null" class used for classifier-free guidance

A sequence is ``[class_token, code_0, ..., code_255]`` (prompt length 1).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from ...models.protocol import cache_kwarg, crop_cache  # one definition of the cache helpers
from ..llama_io import CONFIG_FILE, MODEL_FILE, build_llama, llama_config, load_llama, save_llama
from .prompts import NUM_CLASSES
from .tokenizer import GRID, TOKENS_PER_IMAGE, PatchCodebook

NUM_CODES = 512
CLASS_TOKEN_OFFSET = NUM_CODES
NULL_TOKEN_ID = NUM_CODES + NUM_CLASSES
VOCAB_SIZE = NUM_CODES + NUM_CLASSES + 1
PROMPT_LEN = 1
SEQ_LEN = PROMPT_LEN + TOKENS_PER_IMAGE  # 257

DEFAULT_CFG = 1.0  # the shipped guidance scale: the model's own distribution (README, "The shipped model")
WEIGHTS_DIR = Path(__file__).resolve().parent / "weights"
CODEBOOK_FILE = "codebook.safetensors"

# the shipped architecture
ARCH = dict(hidden_size=128, intermediate_size=352, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4)

__all__ = [
    "MODEL_FILE", "CONFIG_FILE", "NUM_CODES", "NUM_CLASSES", "CLASS_TOKEN_OFFSET", "NULL_TOKEN_ID", "VOCAB_SIZE",
    "GRID", "PROMPT_LEN",
    "SEQ_LEN", "WEIGHTS_DIR", "build_config", "build_lm", "load_lm", "save_lm", "load_codebook", "prompt_ids",
    "cache_kwarg", "crop_cache", "cfg_logits", "sample_ar",
]


def build_config(num_codes: int = NUM_CODES, attn_implementation: str = "sdpa", **arch):
    return llama_config(num_codes + NUM_CLASSES + 1, 512, attn_implementation, **{**ARCH, **arch})


def build_lm(seed: int = 0, num_codes: int = NUM_CODES, attn_implementation: str = "sdpa", **arch):
    """Randomly initialised LM with the shipped architecture (deterministic for ``seed``)."""
    return build_llama(num_codes + NUM_CLASSES + 1, 512, seed, attn_implementation, **{**ARCH, **arch})


def save_lm(lm, weights_dir: str | os.PathLike, dtype: torch.dtype = torch.float16) -> None:
    """Write ``config.json`` + ``model.safetensors`` (weights stored in ``dtype``)."""
    save_llama(lm, weights_dir, dtype)


_SHIPPED = "--model digits: the shipped weights,"  # what a damaged shipped file's error names


def load_lm(weights_dir: str | os.PathLike | None = None, attn_implementation: str = "sdpa", dtype=torch.float32):
    """Load the shipped (or a trained) LM in eval mode. Purely local; never touches the network."""
    return load_llama(WEIGHTS_DIR if weights_dir is None else weights_dir, "digits", attn_implementation, dtype,
                      flag=_SHIPPED if weights_dir is None else "--weights")


def load_codebook(weights_dir: str | os.PathLike | None = None) -> PatchCodebook:
    d = Path(weights_dir) if weights_dir is not None else WEIGHTS_DIR
    return PatchCodebook.load(d / CODEBOOK_FILE, _SHIPPED if weights_dir is None else "--weights")


def prompt_ids(classes, device=None) -> torch.Tensor:
    """Class ids (list/Tensor of ints in 0..9) -> LongTensor [B, 1] of class tokens."""
    c = torch.as_tensor(classes).reshape(-1)
    if c.is_floating_point() or c.dtype == torch.bool:
        raise ValueError(f"classes must be integers, got dtype {c.dtype}")
    c = c.long()
    if c.numel() == 0:
        raise ValueError("classes must not be empty")
    if int(c.min()) < 0 or int(c.max()) >= NUM_CLASSES:
        raise ValueError(f"classes must be in 0..{NUM_CLASSES - 1}, got {c.tolist()}")
    out = (c + CLASS_TOKEN_OFFSET)[:, None]
    return out.to(device) if device is not None else out


def cfg_logits(cond: torch.Tensor, uncond: torch.Tensor | None, cfg_scale: float, num_codes: int = NUM_CODES):
    """Guided logits over image codes only: ``u + s * (c - u)`` (``s == 1`` -> conditional logits)."""
    cond = cond[..., :num_codes].float()
    if uncond is None or cfg_scale == 1.0:
        return cond
    uncond = uncond[..., :num_codes].float()
    return uncond + cfg_scale * (cond - uncond)


@torch.no_grad()
def sample_ar(
    lm,
    classes,
    cfg_scale: float = DEFAULT_CFG,
    temperature: float = 1.0,
    seed: int = 0,
    top_k: int | None = None,
    num_codes: int | None = None,
    return_entropy: bool = False,
):
    """Plain token-by-token AR sampling with CFG and a ``DynamicCache`` (the reference sampler).

    Returns LongTensor [B, 256] of code ids (and, with ``return_entropy``, the per-position
    entropy in nats [B, 256] of the guided, temperature-scaled distribution that was sampled).
    ``temperature == 0`` means greedy. Deterministic for a fixed ``seed``.
    """
    from transformers import DynamicCache

    if num_codes is None:
        num_codes = lm.config.vocab_size - NUM_CLASSES - 1
    device = next(lm.parameters()).device
    cond_ids = prompt_ids(classes, device=device)
    b = cond_ids.shape[0]
    use_cfg = cfg_scale != 1.0
    ids = torch.cat([cond_ids, torch.full_like(cond_ids, num_codes + NUM_CLASSES)]) if use_cfg else cond_ids
    g = torch.Generator(device=device).manual_seed(int(seed))
    cache = DynamicCache()
    out = torch.empty(b, TOKENS_PER_IMAGE, dtype=torch.long, device=device)
    ents = torch.empty(b, TOKENS_PER_IMAGE, device=device) if return_entropy else None
    kw = cache_kwarg(lm)
    inp = ids
    for t in range(TOKENS_PER_IMAGE):
        logits = lm(input_ids=inp, use_cache=True, logits_to_keep=1, **{kw: cache}).logits[:, -1]
        lg = cfg_logits(logits[:b], logits[b:] if use_cfg else None, cfg_scale, num_codes)
        if temperature > 0:
            lg = lg / temperature
        if top_k is not None and top_k < lg.shape[-1]:
            kth = lg.topk(top_k, dim=-1).values[:, -1:]
            lg = lg.masked_fill(lg < kth, float("-inf"))
        logp = torch.log_softmax(lg, dim=-1)
        if return_entropy:
            p = logp.exp()
            ents[:, t] = -(p * torch.nan_to_num(logp, neginf=0.0)).sum(-1)
        if temperature > 0:
            nxt = torch.multinomial(logp.exp(), 1, generator=g)[:, 0]
        else:
            nxt = lg.argmax(-1)
        out[:, t] = nxt
        inp = torch.cat([nxt, nxt])[:, None] if use_cfg else nxt[:, None]
    return (out, ents) if return_entropy else out
