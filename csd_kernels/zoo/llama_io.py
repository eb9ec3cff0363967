"""Build, save and load the zoo's small ``LlamaForCausalLM`` models (digits, scenes): config + safetensors, local."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from ..fileio.inputs import InputError, check_finite, check_folder, check_safetensors, read_json, shorten

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
               model_class=None, flag: str = "--weights"):
    """Load a model written by :func:`save_llama` (as ``model_class``, default ``LlamaForCausalLM``), in eval mode;
    every tensor must match the config. A missing or damaged file (config.json that is not JSON, a truncated
    safetensors file, tensors of another model) is an :class:`~csd_kernels.fileio.inputs.InputError` naming ``flag``
    and the file, raised before anything is built."""
    from safetensors.torch import load_file
    from transformers import LlamaConfig, LlamaForCausalLM

    d = Path(weights_dir)
    check_folder(str(d), flag, f"a {what} model folder ({CONFIG_FILE} and {MODEL_FILE})", (CONFIG_FILE, MODEL_FILE))
    cfg_path, w_path = str(d / CONFIG_FILE), str(d / MODEL_FILE)
    cfg_dict = read_json(cfg_path, flag, "a JSON object of LlamaConfig fields")
    header = check_safetensors(w_path, flag)
    for k in ("_attn_implementation", "attn_implementation", "transformers_version", "architectures"):
        cfg_dict.pop(k, None)
    try:
        lm = (model_class or LlamaForCausalLM)(LlamaConfig(**cfg_dict, attn_implementation=attn_implementation))
    except (TypeError, ValueError, KeyError, AttributeError) as exc:
        raise InputError(flag, cfg_path, f"not a config of a {what} model ({shorten(exc)})") from exc
    missing = [k for k in lm.state_dict() if k not in header and not k.endswith("rotary_emb.inv_freq")]
    unexpected = [k for k in header if k not in lm.state_dict()]
    if missing or unexpected:
        example = (missing + unexpected)[0]
        raise InputError(flag, w_path, f"tensors of another model than its {CONFIG_FILE} describes ({len(missing)} "
                                       f"missing, {len(unexpected)} unexpected, e.g. {example})")
    sd = check_finite(load_file(w_path), flag, w_path)
    try:
        sd = {k: v.to(dtype) for k, v in sd.items()}
        lm.load_state_dict(sd, strict=False)
    except (RuntimeError, OSError) as exc:  # (shapes of another config)
        raise InputError(flag, w_path, f"tensors that do not fit its {CONFIG_FILE} ({shorten(exc)})") from exc
    return lm.to(dtype).eval()
