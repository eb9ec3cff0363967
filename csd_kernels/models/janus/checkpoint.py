"""deepseek-ai's original Janus / Janus-Pro release -> transformers' ``JanusForConditionalGeneration``, in memory.

The checkpoints people download (deepseek-ai/Janus-Pro-7B, -1B, Janus-1.3B) are saved by deepseek-ai/Janus'
``MultiModalityCausalLM``: config.json with ``model_type: "multi_modality"`` and five ``{cls, model_type, params}``
sub-configs plus ``language_config``; weights as ``pytorch_model-0000x-of-0000n.bin`` + index, one
``pytorch_model.bin`` or ``model.safetensors``, under deepseek's key names. What the loader does, and why:

* config: ``language_config`` builds a Llama exactly as deepseek's ``LlamaConfig(**language_config)`` does, so a
  missing field takes transformers 4.x's Llama default (hidden 4096, intermediate 11008, 32 layers, 32 heads,
  rms_norm_eps 1e-6, rope_theta 10000, vocabulary 32000). deepseek builds its VQ (``VQ-16``) and SigLIP tower
  (``siglip_large_patch16_384``) from fixed presets whatever the config's params say; the loader reads their widths,
  depths and patch size from the tensors (the SigLIP head count, which no shape shows, from the preset: 16), the
  SigLIP input size from ``vision_config.params.image_size``, and the two aligners' depth and width from their
  params (``depth`` -> ``depth`` / ``num_hidden_layers``). ``tie_word_embeddings`` is off: deepseek's language model
  has its own ``lm_head`` (transformers 5's Janus ties by default). One dtype for the whole model.
* tensors (every one used or ignored by name): ``language_model.model.*`` -> ``model.language_model.*``;
  ``language_model.lm_head`` -> ``lm_head``; ``gen_embed`` -> ``model.generation_embeddings``;
  ``gen_aligner.layers.0`` / ``.layers.2k`` -> ``model.generation_aligner.fc1`` / ``.hidden_layers.{k-1}`` (the odd
  layers are GELUs); ``gen_head.output_mlp_projector`` / ``.vision_head`` -> ``model.generation_head.proj_out`` /
  ``.vision_head``; ``gen_vision_model.*`` -> ``model.vqmodel.*`` with ``{encoder,decoder}.conv_blocks.i.{res.j,
  attn.j, downsample, upsample}`` -> ``{down,up}.i.{block.j, attn.j, downsample, upsample}`` (both list the decoder's
  levels top first) and ``mid.0/1/2`` -> ``mid.block_1/attn_1/block_2``; ``vision_model.vision_tower.*`` (timm's
  ViT) -> ``model.vision_model.*`` with ``attn.qkv`` split in three along dim 0 into q/k/v, ``pos_embed`` [1, N, D]
  -> ``position_embedding.weight`` [N, D], ``norm`` -> ``post_layernorm``; ``aligner.layers.0/2k`` ->
  ``model.aligner.fc1/hidden_layers.{k-1}``.
* ignored by name: ``vision_model.vision_tower.attn_pool.*`` (timm's attention-pool head: deepseek builds the tower
  with ``ignore_head=True`` and never runs it), ``gen_vision_model.quantize.codebook_used`` (a training-usage
  counter), ``*.rotary_emb.inv_freq`` (recomputed).

Anything else — a missing tensor, an unknown one, a shape no rule converts, an unknown config field or class —
raises one ValueError naming each key and shape. The model is built on the meta device and every parameter assigned
from the checkpoint: nothing is left randomly initialised.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import Optional, Union

import torch

from ..checkpoint import (
    GENERIC_FIELDS,
    MAX_LISTED,
    folder_config,
    indexed_shards,
    log_ignored,
    raise_problems,
    read_json,
)

__all__ = ["is_janus_original", "janus_original_config", "janus_tokenizer", "load_janus_pro"]

log = logging.getLogger(__name__)

# transformers 4.x LlamaConfig defaults: what deepseek's LlamaConfig(**language_config) fills in
LLAMA_DEFAULTS = dict(vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                      num_attention_heads=32, num_key_value_heads=None, hidden_act="silu", max_position_embeddings=2048,
                      rms_norm_eps=1e-6, rope_theta=10000.0, attention_bias=False, mlp_bias=False)
_LLAMA_PASSED = tuple(LLAMA_DEFAULTS) + ("bos_token_id", "eos_token_id", "pad_token_id", "attention_dropout")
_LLAMA_IGNORED = {"initializer_range", "use_cache", "torch_dtype", "dtype", "model_type", "seq_length", "head_dim",
                  "rope_scaling", "pretraining_tp", "tie_word_embeddings"}  # the last four are checked below
# SigLIP presets of deepseek's siglip_vit.py: heads (the one number no tensor shape shows)
SIGLIP_HEADS = {"siglip_large_patch16_384": 16, "siglip_so400m_patch14_384": 16, "siglip_so400m_patch14_224": 16}
_CLASSES = {"vision_config": "CLIPVisionTower", "aligner_config": "MlpProjector", "gen_vision_config": "VQ-16",
            "gen_aligner_config": "MlpProjector", "gen_head_config": "vision_head"}
_TOP_FIELDS = set(_CLASSES) | {"language_config", "torch_dtype", "dtype"}
_IGNORED_TENSORS = (
    (re.compile(r"vision_model\.vision_tower\.attn_pool\."), "timm's attention-pool head, never run (ignore_head)"),
    (re.compile(r"gen_vision_model\.quantize\.codebook_used$"), "the VQ's training-usage counter"),
    (re.compile(r".*\.rotary_emb\.inv_freq$"), "RoPE frequencies, recomputed from the RoPE base"),
)
_SINGLE_FILES = ("model.safetensors", "pytorch_model.bin")
_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")



def is_janus_original(path: Union[str, os.PathLike]) -> bool:
    """True when ``path`` holds deepseek-ai's original release (config.json model_type "multi_modality")."""
    config = Path(path) / "config.json"
    return config.is_file() and read_json(config).get("model_type") == "multi_modality"


# ----------------------------------------------------------------------------------------------------------------------
# tensors: files -> {name: tensor} (memory-mapped .bin, lazily read safetensors)
# ----------------------------------------------------------------------------------------------------------------------
def _weight_files(path: Path) -> list:
    for index in _INDEXES:
        if (path / index).is_file():
            return indexed_shards(path, index)
    for single in _SINGLE_FILES:
        if (path / single).is_file():
            return [path / single]
    raise ValueError(f"{path}: no {', '.join(_SINGLE_FILES + _INDEXES)}")


def _read_tensors(path: Path) -> dict:
    """name -> tensor for every tensor of every file (.bin memory-mapped; nothing copied yet)."""
    from safetensors.torch import load_file

    stored: dict = {}
    for file in _weight_files(path):
        try:
            if file.suffix == ".safetensors":
                tensors = load_file(str(file))
            else:
                tensors = torch.load(file, map_location="cpu", weights_only=True, mmap=True)
        except Exception as exc:  # a truncated or foreign file: one line naming it
            raise ValueError(f"{file}: cannot read tensors ({type(exc).__name__}: {str(exc).splitlines()[0]})") from exc
        if not isinstance(tensors, dict) or not all(isinstance(t, torch.Tensor) for t in tensors.values()):
            raise ValueError(f"{file}: not a state dict of tensors")
        twice = sorted(set(tensors) & set(stored))
        if twice:
            raise ValueError(f"{path}: tensors stored twice: {twice[:MAX_LISTED]}")
        stored.update(tensors)
    return stored


# ----------------------------------------------------------------------------------------------------------------------
# config.json -> JanusConfig
# ----------------------------------------------------------------------------------------------------------------------
def _params(raw: dict, key: str, where: Path) -> dict:
    sub = raw.get(key)
    if not isinstance(sub, dict):
        raise ValueError(f"{where}: no {key} (not deepseek-ai's Janus layout)")
    if sub.get("cls") != _CLASSES[key]:
        raise ValueError(f"{where}: {key}.cls {sub.get('cls')!r} is not {_CLASSES[key]!r}, the only class deepseek's "
                         "Janus releases use for it")
    params = sub.get("params") or {}
    if key.endswith("aligner_config") and params.get("projector_type", "mlp_gelu") != "mlp_gelu":
        raise ValueError(f"{where}: {key}.params.projector_type {params.get('projector_type')!r} (only mlp_gelu)")
    return params


def _language_config(language: dict, where: Path) -> dict:
    unknown = sorted(set(language) - set(_LLAMA_PASSED) - _LLAMA_IGNORED - GENERIC_FIELDS)
    if unknown:
        raise ValueError(f"{where}: unknown language_config fields {unknown}")
    if language.get("rope_scaling") is not None:
        raise ValueError(f"{where}: language_config.rope_scaling {language['rope_scaling']} is not supported")
    if language.get("pretraining_tp", 1) != 1 or language.get("tie_word_embeddings"):
        raise ValueError(f"{where}: language_config pretraining_tp != 1 / tie_word_embeddings are not supported")
    fields = dict(LLAMA_DEFAULTS, **{k: language[k] for k in _LLAMA_PASSED if k in language})
    if fields["num_key_value_heads"] is None:
        fields["num_key_value_heads"] = fields["num_attention_heads"]
    head_dim = fields["hidden_size"] // fields["num_attention_heads"]
    if language.get("head_dim", head_dim) != head_dim:
        raise ValueError(f"{where}: language_config.head_dim {language['head_dim']} != hidden_size / heads")
    return dict(fields, tie_word_embeddings=False)


def _count(stored: dict, prefix: str) -> int:
    found = {int(m.group(1)) for n in stored if (m := re.match(re.escape(prefix) + r"(\d+)\.", n))}
    return max(found) + 1 if found else 0


def _shape(stored: dict, name: str, where: Path) -> tuple:
    if name not in stored:
        raise ValueError(f"{where}: missing tensors: {name} (it gives the model's shape)")
    return tuple(stored[name].shape)


def janus_original_config(raw: dict, stored: dict, where: Union[str, Path] = "config.json"):
    """deepseek's config.json (dict) + the checkpoint's tensors (only shapes are read) -> ``JanusConfig``."""
    from transformers import JanusConfig, LlamaConfig

    where = Path(where)
    if raw.get("model_type") != "multi_modality":
        raise ValueError(f"{where}: model_type {raw.get('model_type')!r} is not deepseek's 'multi_modality'")
    unknown = sorted(set(raw) - _TOP_FIELDS - GENERIC_FIELDS)
    if unknown:
        raise ValueError(f"{where}: unknown config fields {unknown}")
    vision, aligner = _params(raw, "vision_config", where), _params(raw, "aligner_config", where)
    _params(raw, "gen_vision_config", where)  # its params are not read by deepseek's code either (VQ-16 preset)
    gen_aligner, gen_head = _params(raw, "gen_aligner_config", where), _params(raw, "gen_head_config", where)
    text = LlamaConfig(**_language_config(raw.get("language_config") or {}, where))

    model_name = vision.get("model_name", "siglip_large_patch16_384")
    if model_name not in SIGLIP_HEADS:
        raise ValueError(f"{where}: vision_config.params.model_name {model_name!r} is not one of deepseek's SigLIP "
                         f"presets {sorted(SIGLIP_HEADS)}")
    tower = "vision_model.vision_tower."
    width, channels, patch, _ = _shape(stored, tower + "patch_embed.proj.weight", where)
    image_size = int(vision.get("image_size", 336))  # CLIPVisionTower's default
    mlp = _shape(stored, tower + "blocks.0.mlp.fc1.weight", where)[0]
    vision_config = dict(hidden_size=width, num_hidden_layers=_count(stored, tower + "blocks."),
                         num_attention_heads=SIGLIP_HEADS[model_name], num_channels=channels, image_size=image_size,
                         patch_size=patch, mlp_ratio=mlp / width, hidden_act="gelu", layer_norm_eps=1e-6,
                         attention_bias=True, use_qk_norm=False, projection_dim=int(aligner.get("n_embed", width)),
                         depth=int(aligner.get("depth", 1)), num_image_tokens=(image_size // patch) ** 2)

    vq = "gen_vision_model."
    base, in_channels = _shape(stored, vq + "encoder.conv_in.weight", where)[:2]
    levels = _count(stored, vq + "encoder.conv_blocks.")
    multipliers = [_shape(stored, f"{vq}encoder.conv_blocks.{i}.res.0.conv1.weight", where)[0] // base
                   for i in range(levels)]
    codes, embed_dim = _shape(stored, vq + "quantize.embedding.weight", where)
    if int(gen_aligner.get("n_embed", 0)) != int(gen_head.get("image_token_embed", 0)):
        raise ValueError(f"{where}: gen_aligner n_embed {gen_aligner.get('n_embed')} != gen_head image_token_embed "
                         f"{gen_head.get('image_token_embed')} (transformers' Janus has one width for both)")
    vq_config = dict(embed_dim=embed_dim, num_embeddings=codes, latent_channels=_shape(
        stored, vq + "encoder.conv_out.weight", where)[0], in_channels=in_channels, base_channels=base,
        channel_multiplier=multipliers, num_res_blocks=_count(stored, vq + "encoder.conv_blocks.0.res."),
        out_channels=_shape(stored, vq + "decoder.conv_out.weight", where)[0],
        projection_dim=int(gen_aligner.get("n_embed", 0)), num_hidden_layers=int(gen_aligner.get("depth", 1)),
        hidden_act="gelu", image_token_embed_dim=int(gen_head.get("n_embed", 0)))
    return JanusConfig(text_config=text, vision_config=vision_config, vq_config=vq_config, tie_word_embeddings=False)


# ----------------------------------------------------------------------------------------------------------------------
# key map
# ----------------------------------------------------------------------------------------------------------------------
_RENAMES = (
    (r"language_model\.model\.(.+)", r"model.language_model.\1"),
    (r"language_model\.lm_head\.(.+)", r"lm_head.\1"),
    (r"gen_embed\.(.+)", r"model.generation_embeddings.\1"),
    (r"gen_head\.output_mlp_projector\.(.+)", r"model.generation_head.proj_out.\1"),
    (r"gen_head\.vision_head\.(.+)", r"model.generation_head.vision_head.\1"),
    (r"gen_vision_model\.encoder\.conv_blocks\.(\d+)\.res\.(.+)", r"model.vqmodel.encoder.down.\1.block.\2"),
    (r"gen_vision_model\.encoder\.conv_blocks\.(\d+)\.(attn\..+|downsample\..+)", r"model.vqmodel.encoder.down.\1.\2"),
    (r"gen_vision_model\.decoder\.conv_blocks\.(\d+)\.res\.(.+)", r"model.vqmodel.decoder.up.\1.block.\2"),
    (r"gen_vision_model\.decoder\.conv_blocks\.(\d+)\.(attn\..+|upsample\..+)", r"model.vqmodel.decoder.up.\1.\2"),
    (r"gen_vision_model\.(encoder|decoder)\.mid\.0\.(.+)", r"model.vqmodel.\1.mid.block_1.\2"),
    (r"gen_vision_model\.(encoder|decoder)\.mid\.1\.(.+)", r"model.vqmodel.\1.mid.attn_1.\2"),
    (r"gen_vision_model\.(encoder|decoder)\.mid\.2\.(.+)", r"model.vqmodel.\1.mid.block_2.\2"),
    (r"gen_vision_model\.(.+)", r"model.vqmodel.\1"),
    (r"vision_model\.vision_tower\.patch_embed\.proj\.(.+)", r"model.vision_model.embeddings.patch_embedding.\1"),
    (r"vision_model\.vision_tower\.blocks\.(\d+)\.norm(1|2)\.(.+)",
     r"model.vision_model.encoder.layers.\1.layer_norm\2.\3"),
    (r"vision_model\.vision_tower\.blocks\.(\d+)\.attn\.proj\.(.+)",
     r"model.vision_model.encoder.layers.\1.self_attn.projection_layer.\2"),
    (r"vision_model\.vision_tower\.blocks\.(\d+)\.mlp\.(fc1|fc2)\.(.+)",
     r"model.vision_model.encoder.layers.\1.mlp.\2.\3"),
    (r"vision_model\.vision_tower\.norm\.(.+)", r"model.vision_model.post_layernorm.\1"),
)
_QKV = re.compile(r"vision_model\.vision_tower\.blocks\.(\d+)\.attn\.qkv\.(weight|bias)$")
_POS = "vision_model.vision_tower.pos_embed"
_MLP_LAYER = re.compile(r"(gen_aligner|aligner)\.layers\.(\d+)\.(weight|bias)$")


def _targets(name: str, tensor: torch.Tensor) -> Optional[list]:
    """[(transformers name, tensor)] for one stored tensor, or None when no rule knows the name."""
    if name == _POS:
        return [("model.vision_model.embeddings.position_embedding.weight", tensor.reshape(tensor.shape[-2:]))
                if tensor.dim() == 3 and tensor.shape[0] == 1 else ("model.vision_model.embeddings.position_embedding"
                                                                    ".weight", tensor)]
    if match := _QKV.match(name):
        prefix = f"model.vision_model.encoder.layers.{match.group(1)}.self_attn."
        if tensor.shape[0] % 3:
            return [(prefix + "qkv_proj." + match.group(2), tensor)]  # reported as a shape no rule converts
        return [(f"{prefix}{p}_proj.{match.group(2)}", part) for p, part in zip("qkv", tensor.chunk(3, 0))]
    if match := _MLP_LAYER.match(name):
        module = "generation_aligner" if match.group(1) == "gen_aligner" else "aligner"
        index = int(match.group(2))
        if index % 2:
            return None  # the GELUs hold no tensors
        layer = "fc1" if index == 0 else f"hidden_layers.{index // 2 - 1}"
        return [(f"model.{module}.{layer}.{match.group(3)}", tensor)]
    for pattern, replacement in _RENAMES:
        if re.fullmatch(pattern, name):
            return [(re.sub(pattern, replacement, name), tensor)]
    return None


def _ignored_reason(name: str) -> Optional[str]:
    return next((reason for pattern, reason in _IGNORED_TENSORS if pattern.match(name)), None)


def _convert(stored: dict, expected: dict, where: Path) -> dict:
    """target name -> tensor for every expected tensor; one ValueError listing every problem."""
    state, unknown, bad_shape, ignored, misfit = {}, [], [], {}, set()
    for name in sorted(stored):
        tensor = stored[name]
        reason = _ignored_reason(name)
        if reason is not None:
            ignored.setdefault(reason, []).append(name)
            continue
        targets = _targets(name, tensor)
        if targets is None or any(t not in expected for t, _ in targets):
            unknown.append(f"{name} {list(tensor.shape)}")
            continue
        wrong = [f"{t} {list(expected[t])}" for t, part in targets if tuple(part.shape) != expected[t]]
        if wrong:
            bad_shape.append(f"{name} {list(tensor.shape)} (expected {', '.join(wrong)})")
            misfit.update(t for t, _ in targets)  # reported here, not again as missing
            continue
        state.update(targets)
    missing = [f"{n} {list(expected[n])}" for n in sorted(expected) if n not in state and n not in misfit]
    raise_problems(where, "deepseek-ai Janus", missing, unknown, bad_shape)
    log_ignored(log, where, ignored)
    return state


# ----------------------------------------------------------------------------------------------------------------------
# the model
# ----------------------------------------------------------------------------------------------------------------------
def _default_dtype(raw: dict, stored: dict) -> torch.dtype:
    language = raw.get("language_config") or {}
    for name in (raw.get("torch_dtype"), raw.get("dtype"), language.get("torch_dtype"), language.get("dtype")):
        if isinstance(name, str) and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
    floating = [t.dtype for t in stored.values() if t.dtype.is_floating_point]
    return floating[0] if floating else torch.float32


def janus_tokenizer(path: Union[str, os.PathLike]):
    """The tokenizer of a Janus folder (either format). deepseek's config.json is no transformers config: it is kept
    away from AutoTokenizer, which would otherwise read it and warn about a model of type multi_modality."""
    from transformers import AutoTokenizer, PretrainedConfig

    if is_janus_original(path):
        return AutoTokenizer.from_pretrained(str(path), config=PretrainedConfig())
    return AutoTokenizer.from_pretrained(str(path))


def _token_ids(path: Path) -> dict:
    """BOS, pad, begin-of-image and image-placeholder ids from the folder's tokenizer and processor_config.json, as
    deepseek's VLChatProcessor reads them (tags looked up in the vocabulary); {} without tokenizer files."""
    if not any((path / f).is_file() for f in ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")):
        return {}
    tokenizer = janus_tokenizer(path)
    processor = read_json(path / "processor_config.json") if (path / "processor_config.json").is_file() else {}
    vocab = tokenizer.get_vocab()
    pad = vocab.get(processor.get("pad_tag", "<｜▁pad▁｜>"), tokenizer.pad_token_id)
    ids = {"bos": tokenizer.bos_token_id, "pad": pad,
           "boi": vocab.get(processor.get("image_start_tag", "<begin_of_image>")),
           "image": vocab.get(processor.get("image_tag", "<image_placeholder>"))}
    return {k: v for k, v in ids.items() if v is not None}


def _rebuild_buffers(model, device: torch.device) -> None:
    """Buffers computed at construction (not in any checkpoint): RoPE frequencies in float32, SigLIP position ids."""
    language = model.model.language_model
    language.rotary_emb = type(language.rotary_emb)(config=model.config.text_config).to(device)
    embeddings = model.model.vision_model.embeddings
    embeddings.position_ids = torch.arange(embeddings.num_positions, device=device).expand((1, -1))


def load_janus_pro(path: Union[str, os.PathLike], *, dtype: Optional[torch.dtype] = None,
                   device: Union[str, torch.device, None] = None):
    """A deepseek-ai Janus / Janus-Pro release folder (config.json model_type "multi_modality") -> transformers'
    ``JanusForConditionalGeneration`` in eval mode, nothing converted on disk.

    dtype: None = the checkpoint's ``torch_dtype`` (bfloat16 in the releases); device: None = CPU. When the folder
    has deepseek's tokenizer files, ``generation_config`` carries its BOS, pad and begin-of-image ids, so that
    ``JanusAdapter(model)`` builds deepseek's CFG rows. ValueError, naming keys and shapes, for anything else."""
    from transformers import JanusForConditionalGeneration

    path = Path(path)
    raw = folder_config(path, "Janus-Pro", "config.json + weights")
    if raw.get("model_type") != "multi_modality":
        raise ValueError(f"{path / 'config.json'}: model_type {raw.get('model_type')!r} is not deepseek's "
                         "'multi_modality' (a transformers-format folder loads with from_pretrained)")
    stored = _read_tensors(path)
    config = janus_original_config(raw, stored, path / "config.json")
    with torch.device("meta"):
        model = JanusForConditionalGeneration(config)
    expected = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    state = _convert(stored, expected, path)
    device = torch.device(device if device is not None else "cpu")
    dtype = dtype or _default_dtype(raw, stored)
    model.load_state_dict({k: v.to(device=device, dtype=dtype) for k, v in state.items()}, strict=True, assign=True)
    _rebuild_buffers(model, device)
    left = [n for n, t in list(model.named_parameters()) + list(model.named_buffers()) if t.is_meta]
    if left:  # a transformers change that adds state this loader does not fill
        raise RuntimeError(f"tensors left unloaded on the meta device: {left}")
    ids = _token_ids(path)
    generation = model.generation_config
    generation.bos_token_id = ids.get("bos", generation.bos_token_id)
    generation.pad_token_id = ids.get("pad", generation.pad_token_id)
    if "boi" in ids:
        kwargs = getattr(generation, "generation_kwargs", None) or {}
        generation.generation_kwargs = dict(kwargs, boi_token_id=ids["boi"])
    if "image" in ids:
        model.config.image_token_id = ids["image"]
    return model.eval()
