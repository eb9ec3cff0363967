"""LlamaGen-style class-conditional GPT over :mod:`tokenizer` codes (a tiny ``LlamaForCausalLM``).

Vocabulary
----------
* ``[0, NUM_CODES)``           image codes (16x16 grid, raster order)
* ``CLASS_TOKEN_OFFSET + c``   class token of digit ``c`` (0..9)
* ``NULL_TOKEN_ID``            the "null" class used for classifier-free guidance

A sequence is ``[class_token, code_0, ..., code_255]`` (prompt length 1).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from ...models.protocol import cache_kwarg, crop_cache  # one definition of the cache helpers
from .tokenizer import GRID, TOKENS_PER_IMAGE, PatchCodebook

NUM_CODES = 512
NUM_CLASSES = 10
CLASS_TOKEN_OFFSET = NUM_CODES
NULL_TOKEN_ID = NUM_CODES + NUM_CLASSES
VOCAB_SIZE = NUM_CODES + NUM_CLASSES + 1
PROMPT_LEN = 1
SEQ_LEN = PROMPT_LEN + TOKENS_PER_IMAGE  # 257

DEFAULT_CFG = 1.0  # the shipped guidance scale: the model's own distribution (README, "The shipped model")
WEIGHTS_DIR = Path(__file__).resolve().parent / "weights"
MODEL_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
CODEBOOK_FILE = "codebook.safetensors"

# the shipped architecture
ARCH = dict(hidden_size=128, intermediate_size=352, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4)

__all__ = [
    "NUM_CODES", "NUM_CLASSES", "CLASS_TOKEN_OFFSET", "NULL_TOKEN_ID", "VOCAB_SIZE", "GRID", "PROMPT_LEN",
    "SEQ_LEN", "WEIGHTS_DIR", "build_config", "build_lm", "load_lm", "save_lm", "load_codebook", "prompt_ids",
    "cache_kwarg", "crop_cache", "cfg_logits", "sample_ar",
]


def build_config(num_codes: int = NUM_CODES, attn_implementation: str = "sdpa", **arch):
    from transformers import LlamaConfig

    a = dict(ARCH)
    a.update(arch)
    return LlamaConfig(
        vocab_size=num_codes + NUM_CLASSES + 1,
        max_position_embeddings=512,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        attention_dropout=0.0,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
        use_cache=True,
        attn_implementation=attn_implementation,
        **a,
    )


def build_lm(seed: int = 0, num_codes: int = NUM_CODES, attn_implementation: str = "sdpa", **arch):
    """Randomly initialised LM with the shipped architecture (deterministic for ``seed``)."""
    from transformers import LlamaForCausalLM

    cfg = build_config(num_codes=num_codes, attn_implementation=attn_implementation, **arch)
    state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        lm = LlamaForCausalLM(cfg)
    finally:
        torch.random.set_rng_state(state)
    return lm


def save_lm(lm, weights_dir: str | os.PathLike, dtype: torch.dtype = torch.float16) -> None:
    """Write ``config.json`` + ``model.safetensors`` (weights stored in ``dtype``)."""
    from safetensors.torch import save_file

    d = Path(weights_dir)
    d.mkdir(parents=True, exist_ok=True)
    cfg = lm.config.to_dict()
    (d / CONFIG_FILE).write_text(json.dumps(cfg, indent=2, sort_keys=True, default=str))
    sd = {k: v.detach().to(dtype).contiguous().cpu() for k, v in lm.state_dict().items()}
    save_file(sd, str(d / MODEL_FILE), metadata={"format": "pt", "stored_dtype": str(dtype)})


def load_lm(weights_dir: str | os.PathLike | None = None, attn_implementation: str = "sdpa", dtype=torch.float32):
    """Load the shipped (or a trained) LM in eval mode. Purely local; never touches the network."""
    from safetensors.torch import load_file
    from transformers import LlamaConfig, LlamaForCausalLM

    d = Path(weights_dir) if weights_dir is not None else WEIGHTS_DIR
    cfg_path, w_path = d / CONFIG_FILE, d / MODEL_FILE
    if not cfg_path.is_file() or not w_path.is_file():
        raise FileNotFoundError(f"no trained digits LM in {d} (expected {CONFIG_FILE} and {MODEL_FILE})")
    cfg_dict = json.loads(cfg_path.read_text())
    for k in ("_attn_implementation", "attn_implementation", "transformers_version", "architectures"):
        cfg_dict.pop(k, None)
    cfg = LlamaConfig(**cfg_dict, attn_implementation=attn_implementation)
    lm = LlamaForCausalLM(cfg)
    sd = {k: v.to(dtype) for k, v in load_file(str(w_path)).items()}
    missing, unexpected = lm.load_state_dict(sd, strict=False)
    missing = [k for k in missing if not k.endswith("rotary_emb.inv_freq")]
    if missing or unexpected:
        raise RuntimeError(f"weights in {w_path} do not match the config: missing={missing}, unexpected={unexpected}")
    return lm.to(dtype).eval()


def load_codebook(weights_dir: str | os.PathLike | None = None) -> PatchCodebook:
    d = Path(weights_dir) if weights_dir is not None else WEIGHTS_DIR
    return PatchCodebook.load(d / CODEBOOK_FILE)


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
