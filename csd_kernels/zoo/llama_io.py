"""Build, save and load the zoo's small ``LlamaForCausalLM`` models (digits, scenes): config + safetensors, local."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

MODEL_FILE = "model.safetensors"
CONFIG_FILE = "config.json"

__all__ = ["MODEL_FILE", "CONFIG_FILE", "build_llama", "save_llama", "load_llama"]


def llama_config(vocab_size: int, max_positions: int, attn_implementation: str = "sdpa", **arch):
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=vocab_size, max_position_embeddings=max_positions, rms_norm_eps=1e-5,
                       tie_word_embeddings=False, attention_dropout=0.0, bos_token_id=None, eos_token_id=None,
                       pad_token_id=None, use_cache=True, attn_implementation=attn_implementation, **arch)


def build_llama(vocab_size: int, max_positions: int, seed: int = 0, attn_implementation: str = "sdpa",
                model_class=None, **arch):
    """A randomly initialised ``LlamaForCausalLM`` (or ``model_class``, a subclass), deterministic for ``seed`` (the
    global RNG is left as it was)."""
    from transformers import LlamaForCausalLM

    cfg = llama_config(vocab_size, max_positions, attn_implementation, **arch)
    state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        return (model_class or LlamaForCausalLM)(cfg)
    finally:
        torch.random.set_rng_state(state)


def save_llama(lm, weights_dir: str | os.PathLike, dtype: torch.dtype = torch.float16) -> None:
    """Write ``config.json`` + ``model.safetensors`` (weights stored in ``dtype``)."""
    from safetensors.torch import save_file

    d = Path(weights_dir)
    d.mkdir(parents=True, exist_ok=True)
    (d / CONFIG_FILE).write_text(json.dumps(lm.config.to_dict(), indent=2, sort_keys=True, default=str))
    sd = {k: v.detach().to(dtype).contiguous().cpu() for k, v in lm.state_dict().items()}
    save_file(sd, str(d / MODEL_FILE), metadata={"format": "pt", "stored_dtype": str(dtype)})


def load_llama(weights_dir: str | os.PathLike, what: str, attn_implementation: str = "sdpa", dtype=torch.float32,
               model_class=None):
    """Load a model written by :func:`save_llama` (as ``model_class``, default ``LlamaForCausalLM``), in eval mode;
    every tensor must match the config."""
    from safetensors.torch import load_file
    from transformers import LlamaConfig, LlamaForCausalLM

    d = Path(weights_dir)
    cfg_path, w_path = d / CONFIG_FILE, d / MODEL_FILE
    if not cfg_path.is_file() or not w_path.is_file():
        raise FileNotFoundError(f"no trained {what} LM in {d} (expected {CONFIG_FILE} and {MODEL_FILE})")
    cfg_dict = json.loads(cfg_path.read_text())
    for k in ("_attn_implementation", "attn_implementation", "transformers_version", "architectures"):
        cfg_dict.pop(k, None)
    lm = (model_class or LlamaForCausalLM)(LlamaConfig(**cfg_dict, attn_implementation=attn_implementation))
    sd = {k: v.to(dtype) for k, v in load_file(str(w_path)).items()}
    missing, unexpected = lm.load_state_dict(sd, strict=False)
    missing = [k for k in missing if not k.endswith("rotary_emb.inv_freq")]
    if missing or unexpected:
        raise RuntimeError(f"weights in {w_path} do not match the config: missing={missing}, unexpected={unexpected}")
    return lm.to(dtype).eval()
