"""Lumina-mGPT checkpoints (as Alpha-VLLM releases them) -> transformers' ``ChameleonForConditionalGeneration``.

Lumina-mGPT saves its checkpoints with its own Chameleon fork (``ChameleonXLLMXForConditionalGeneration`` over
``lumina_mgpt/model/chameleon/modeling_chameleon.py``, written against transformers 4.44): config.json with
``model_type: "chameleon"``, safetensors shards (+ ``model.safetensors.index.json``). Key names are transformers'
Chameleon key names; what differs, and the rule applied here:

* q/k-norm (``model.layers.N.self_attn.{q,k}_norm.{weight,bias}``): Lumina-mGPT stores ``[model_parallel_size,
  head_dim]`` (one gain/bias row per model-parallel shard of the original Chameleon training) and its
  ``ChameleonLayerNorm.repeat_param`` repeat-interleaves the rows over the heads of each shard at run time
  (``num_heads // mp`` for q, ``num_key_value_heads // mp`` for k). transformers' Chameleon holds
  ``[num_heads, head_dim]`` / ``[num_key_value_heads, head_dim]`` and applies row h to head h, so each row is
  repeat-interleaved once here: ``[w0, w0, w1, w1]`` for 4 heads over 2 shards, never the tiling ``[w0, w1, w0, w1]``
  (transformers' own convert_chameleon_weights_to_hf.py builds the same ``repeat_interleave(n_heads // num_shards)``
  from Meta's per-shard checkpoints). A norm already stored per head is taken as is.
* config ``rope_theta`` (+ ``rope_scaling``): transformers 5 takes the RoPE base in ``rope_parameters``. Only
  ``rope_scaling: null`` (every release) is converted; a scaled RoPE is refused.
* config ``model_parallel_size``: used for the q/k-norm rule above (heads must split evenly over the shards).
* ``model.vqmodel.*`` tensors (Chameleon's VQ-GAN *encoder*, for image inputs): ignored by name. The releases carry
  none (Lumina-mGPT's finetune solver deletes ``model.vqmodel`` before training and saving) and its inference solver
  tokenizes images with Meta's separate VQ-GAN; generation never runs it. The loaded model has no ``vqmodel``
  (rather than a randomly initialised one): pass pixels through Meta's VQ-GAN, not ``pixel_values``.
* ``*.rotary_emb.inv_freq`` tensors (older transformers saved them): ignored, recomputed from the RoPE base.
* config ``dropout`` (the release: 0.05) is Lumina-mGPT's residual dropout in its decoder layers, active only in
  training; ``z_loss_weight`` weighs a training loss; ``mask_image_logits`` (false in the release) masks image ids
  out of Lumina-mGPT's ``forward`` logits. All three are ignored: the model is returned in eval mode and the
  adapter takes the image rows of ``lm_head`` from hidden states itself, which is what Lumina-mGPT's own solver sees
  with the release's ``mask_image_logits: false``.
* swin norm, attention/MLP biases, qk-norm placement (before RoPE, statistics over head_dim, eps 1e-5), the
  untied ``lm_head``: the same in both implementations; fields pass through. ``tie_word_embeddings: true`` is
  refused (no release ties).
* config ``vq_config`` describes the VQ-GAN encoder that is not loaded; ignored.

Every tensor of the checkpoint is used or ignored by name with a reason; anything else (a missing tensor, an unknown
tensor, a shape that no rule converts, an unknown config field, a foreign architecture) raises one ValueError that
names each key and shape. Nothing is left randomly initialised: the model is built on the meta device and every
parameter is assigned from the checkpoint.
"""

from __future__ import annotations

import inspect
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

import torch

from ..checkpoint import GENERIC_FIELDS, folder_config, indexed_shards, log_ignored, raise_problems

__all__ = ["LUMINA_ARCHITECTURES", "load_lumina_chameleon", "lumina_chameleon_config", "move_chameleon"]

log = logging.getLogger(__name__)

# config.json "architectures" accepted: Lumina-mGPT's class, and its fork's plain Chameleon class (Alpha-VLLM's
# Chameleon_7B_mGPT / Chameleon_34B_mGPT starting points are saved by it with the same per-shard norms).
LUMINA_ARCHITECTURES = ("ChameleonXLLMXForConditionalGeneration", "ChameleonForConditionalGeneration")

# config fields passed to transformers' ChameleonConfig unchanged
_PASSED_FIELDS = (
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "hidden_act", "max_position_embeddings", "rms_norm_eps", "attention_bias",
    "attention_dropout", "mlp_bias", "swin_norm", "model_parallel_size", "bos_token_id", "eos_token_id",
    "pad_token_id", "vocabulary_map", "tie_word_embeddings",
)
_ROPE_FIELDS = ("rope_theta", "rope_scaling")
_IGNORED_FIELDS = {
    "dropout": "Lumina-mGPT's residual dropout, active in training only (the model is loaded in eval mode)",
    "z_loss_weight": "a training loss weight",
    "mask_image_logits": "masks image ids out of Lumina-mGPT's forward(); the adapter reads lm_head's image rows",
    "vq_config": "describes the VQ-GAN encoder, which is not loaded",
    "initializer_range": "weight-init scale; every weight comes from the checkpoint",
    "use_cache": "the adapter passes its own cache",
    "torch_dtype": "only the default of dtype=",
    "dtype": "only the default of dtype=",
}

_IGNORED_TENSORS = (
    (re.compile(r"model\.vqmodel\."), "Chameleon's VQ-GAN encoder for image inputs; generation never runs it"),
    (re.compile(r".*\.rotary_emb\.inv_freq$"), "RoPE frequencies, recomputed from the RoPE base"),
)
_QK_NORM = re.compile(r"model\.layers\.\d+\.self_attn\.(q|k)_norm\.(weight|bias)$")
_INDEX = "model.safetensors.index.json"
_SINGLE = "model.safetensors"


# ----------------------------------------------------------------------------------------------------------------------
# config.json
# ----------------------------------------------------------------------------------------------------------------------

def _check_architecture(config: dict, where: Path) -> None:
    if config.get("model_type") != "chameleon":
        raise ValueError(f"{where}: model_type {config.get('model_type')!r} is not a Lumina-mGPT checkpoint "
                         "(expected 'chameleon')")
    architectures = config.get("architectures") or []
    if not any(a in LUMINA_ARCHITECTURES for a in architectures):
        raise ValueError(f"{where}: architectures {architectures} are not Lumina-mGPT's "
                         f"(expected one of {list(LUMINA_ARCHITECTURES)})")


def _rope_kwargs(config: dict, where: Path) -> dict:
    """rope_theta/rope_scaling -> the RoPE keyword of the installed transformers' ChameleonConfig."""
    from transformers import ChameleonConfig

    if config.get("rope_scaling") is not None:
        raise ValueError(f"{where}: rope_scaling {config['rope_scaling']} is not supported (Lumina-mGPT releases use "
                         "none; a scaled RoPE would need its own conversion and check)")
    theta = float(config.get("rope_theta", 10000.0))
    if "rope_parameters" in inspect.signature(ChameleonConfig.__init__).parameters:  # transformers >= 5
        return {"rope_parameters": {"rope_type": "default", "rope_theta": theta}}
    return {"rope_theta": theta}


def lumina_chameleon_config(config: dict, where: Union[str, Path] = "config.json"):
    """A Lumina-mGPT config.json (dict) -> transformers' ``ChameleonConfig``; ValueError on what cannot convert."""
    from transformers import ChameleonConfig

    where = Path(where)
    _check_architecture(config, where)
    known = set(_PASSED_FIELDS) | set(_ROPE_FIELDS) | set(_IGNORED_FIELDS) | GENERIC_FIELDS
    unknown = sorted(set(config) - known)
    if unknown:
        raise ValueError(f"{where}: unknown config fields {unknown}: not Lumina-mGPT's Chameleon, or a variant this "
                         "loader does not know how to convert")
    if config.get("tie_word_embeddings"):
        raise ValueError(f"{where}: tie_word_embeddings=true is not supported (Lumina-mGPT keeps lm_head separate)")
    kwargs = {name: config[name] for name in _PASSED_FIELDS if name in config}
    if kwargs.get("vocabulary_map") is None:
        kwargs["vocabulary_map"] = {}  # transformers' ChameleonModel needs a map; only image inputs use it
    heads, kv_heads = config.get("num_attention_heads", 32), config.get("num_key_value_heads", 32)
    shards = int(config.get("model_parallel_size", 1))
    if shards < 1 or heads % shards or kv_heads % shards:
        raise ValueError(f"{where}: model_parallel_size {shards} does not split num_attention_heads {heads} and "
                         f"num_key_value_heads {kv_heads} evenly")
    return ChameleonConfig(**kwargs, **_rope_kwargs(config, where))


# ----------------------------------------------------------------------------------------------------------------------
# tensors: scan (names, shapes, files) -> plan (rules) -> load
# ----------------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Stored:
    file: Path
    shape: tuple
    dtype: torch.dtype


def _safetensors_files(path: Path) -> list:
    if (path / _INDEX).is_file():
        return indexed_shards(path, _INDEX)
    if (path / _SINGLE).is_file():
        return [path / _SINGLE]
    others = sorted(p.name for p in path.iterdir() if p.suffix in (".bin", ".pt", ".pth", ".safetensors"))
    raise ValueError(f"{path}: no {_SINGLE} or {_INDEX}"
                     + (f" (found {others}; only safetensors checkpoints are read)" if others else ""))


_SAFETENSORS_DTYPES = {"BF16": "bfloat16", "F16": "float16", "F32": "float32", "F64": "float64"}


def _scan(path: Path) -> dict:
    """name -> _Stored for every tensor of every shard (headers only, nothing loaded)."""
    from safetensors import safe_open

    stored: dict = {}
    for file in _safetensors_files(path):
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():
                if name in stored:
                    raise ValueError(f"{path}: tensor {name} is stored twice ({stored[name].file.name}, {file.name})")
                piece = f.get_slice(name)
                dtype = getattr(torch, _SAFETENSORS_DTYPES.get(piece.get_dtype(), "float32"))
                stored[name] = _Stored(file, tuple(piece.get_shape()), dtype)
    return stored


def _ignored_reason(name: str) -> Optional[str]:
    for pattern, reason in _IGNORED_TENSORS:
        if pattern.match(name):
            return reason
    return None


def _qk_norm_repeats(name: str, shape: tuple, config) -> Optional[int]:
    """How often each stored row repeats (repeat_interleave) to give transformers' per-head norm, or None when the
    shape is neither Lumina-mGPT's [mp, head_dim] nor already per head."""
    match = _QK_NORM.match(name)
    head_dim = config.hidden_size // config.num_attention_heads
    heads = config.num_attention_heads if match.group(1) == "q" else config.num_key_value_heads
    shards = config.model_parallel_size
    if shape == (shards, head_dim):
        return heads // shards  # ChameleonLayerNorm.repeat_param: repeat_interleave(n_heads_per_mp, dim=0)
    if shape == (heads, head_dim):
        return 1  # already one row per head (transformers' layout)
    return None


def _plan(stored: dict, expected: dict, config, where: Path) -> dict:
    """target name -> (source name, repeats) for every expected tensor; ValueError listing every problem."""
    plan, unknown, bad_shape, ignored = {}, [], [], {}
    for name, item in sorted(stored.items()):
        reason = _ignored_reason(name)
        if reason is not None:
            ignored.setdefault(reason, []).append(name)
            continue
        if name not in expected:
            unknown.append(f"{name} {list(item.shape)}")
            continue
        repeats = _qk_norm_repeats(name, item.shape, config) if _QK_NORM.match(name) else 1
        target = tuple(expected[name])
        converted = None if repeats is None else (item.shape[0] * repeats, *item.shape[1:])
        if converted != target:
            head_dim = config.hidden_size // config.num_attention_heads
            want = (f"[{config.model_parallel_size}, {head_dim}] (a row per model-parallel shard) or {list(target)} "
                    "(a row per head)" if _QK_NORM.match(name) else f"{list(target)}")
            bad_shape.append(f"{name} {list(item.shape)} (expected {want})")
            continue
        plan[name] = (name, repeats)
    missing = [f"{n} {list(expected[n])}" for n in sorted(expected) if n not in stored]
    raise_problems(where, "Lumina-mGPT", missing, unknown, bad_shape)
    log_ignored(log, where, ignored)
    return plan


def _load_tensors(stored: dict, plan: dict, dtype: torch.dtype, device: torch.device) -> dict:
    from safetensors import safe_open

    by_file: dict = {}
    for target, (source, repeats) in plan.items():
        by_file.setdefault(stored[source].file, []).append((target, source, repeats))
    state = {}
    for file, items in by_file.items():
        with safe_open(str(file), framework="pt") as f:
            for target, source, repeats in items:
                tensor = f.get_tensor(source)
                if repeats > 1:
                    tensor = tensor.repeat_interleave(repeats, dim=0)  # [mp, head_dim] -> [heads, head_dim]
                state[target] = tensor.to(device=device, dtype=dtype)
    return state


# ----------------------------------------------------------------------------------------------------------------------
# the model
# ----------------------------------------------------------------------------------------------------------------------
def _default_dtype(config: dict, stored: dict) -> torch.dtype:
    name = config.get("torch_dtype") or config.get("dtype")
    if isinstance(name, str) and isinstance(getattr(torch, name, None), torch.dtype):
        return getattr(torch, name)
    floating = [s.dtype for s in stored.values() if s.dtype.is_floating_point]
    return floating[0] if floating else torch.float32


def _empty_model(config):
    """transformers' Chameleon on the meta device, without the VQ-GAN encoder (no random weights anywhere)."""
    from transformers import ChameleonForConditionalGeneration

    with torch.device("meta"):
        model = ChameleonForConditionalGeneration(config)
    del model.model.vqmodel
    return model


def _rebuild_rotary(model, device: torch.device) -> None:
    """RoPE frequencies are buffers computed at construction: rebuild them in float32 on device (after a meta
    construction, or after a cast, which would round them to the weights' dtype)."""
    rotary = model.model.rotary_emb
    model.model.rotary_emb = type(rotary)(config=model.config).to(device)


def move_chameleon(model, *, dtype: Optional[torch.dtype] = None, device: Union[str, torch.device, None] = None):
    """``model.to(device, dtype)`` for an already-built Chameleon, keeping its RoPE frequencies in float32."""
    if dtype is None and device is None:
        return model
    model = model.to(device=device, dtype=dtype)
    if dtype is not None:
        _rebuild_rotary(model, next(model.parameters()).device)
    return model


def load_lumina_chameleon(path: Union[str, os.PathLike], *, dtype: Optional[torch.dtype] = None,
                          device: Union[str, torch.device, None] = None):
    """A Lumina-mGPT checkpoint directory -> transformers' ``ChameleonForConditionalGeneration`` in eval mode.

    dtype: None = the checkpoint's ``torch_dtype`` (bfloat16 in the releases); device: None = CPU.
    ValueError, naming keys and shapes, for anything the rules of this module do not cover."""
    path = Path(path)
    raw = folder_config(path, "Lumina-mGPT", "config.json + safetensors")
    config = lumina_chameleon_config(raw, path / "config.json")
    stored = _scan(path)
    model = _empty_model(config)
    expected = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    plan = _plan(stored, expected, config, path)
    device = torch.device(device if device is not None else "cpu")
    state = _load_tensors(stored, plan, dtype or _default_dtype(raw, stored), device)
    model.load_state_dict(state, strict=True, assign=True)
    _rebuild_rotary(model, device)
    left = [n for n, t in list(model.named_parameters()) + list(model.named_buffers()) if t.is_meta]
    if left:  # a transformers change that adds state this loader does not fill
        raise RuntimeError(f"tensors left unloaded on the meta device: {left}")
    return model.eval()
