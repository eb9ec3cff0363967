"""Released LlamaGen checkpoints -> :class:`LlamaGenAdapter`: configs, state-dict unwrapping, strict key checks.

Every parameter of the model must come from the checkpoint with its exact shape; a missing, unexpected or misshapen
key is a ValueError that lists them (nothing is ever left at its random initialisation). The only keys accepted
without a parameter to fill: ``freqs_cis`` in a GPT checkpoint (older upstream revisions stored the RoPE table;
upstream's own loaders pop it) and, in a VQ checkpoint, the encoder side (:data:`vq.ENCODER_PREFIXES`).
"""

from __future__ import annotations

import argparse
import os
import pickle
from dataclasses import asdict
from typing import Mapping, Optional, Union

import torch

from .adapter import LlamaGenAdapter
from .gpt import CAPTION_TOKENS, PRESETS, ModelArgs, Transformer
from .vq import ENCODER_PREFIXES, VQ_PRESETS, VQArgs, VQDecoder

__all__ = ["gpt_args", "load_llamagen", "load_state_dict", "read_state_dict", "vq_args"]

# where released checkpoints keep the weights (DDP, DeepSpeed, Lightning-style), in upstream sample_c2i.py's order;
# FSDP consolidated checkpoints are the bare state dict
WRAPPER_KEYS = ("model", "module", "state_dict")
# upstream ModelArgs fields that only matter for training: accepted in a config dict and ignored
GPT_TRAINING_FIELDS = ("initializer_range", "token_dropout_p", "attn_dropout_p", "resid_dropout_p", "ffn_dropout_p",
                       "drop_path_rate", "max_batch_size", "max_seq_len")
VQ_TRAINING_FIELDS = ("codebook_show_usage", "commit_loss_beta", "entropy_loss_ratio", "dropout_p")
_LISTED = 12  # offending keys listed per kind in an error

Checkpoint = Union[str, os.PathLike, Mapping[str, object]]


# ----------------------------------------------------------------------------------------------------------------------
# configs
# ----------------------------------------------------------------------------------------------------------------------
def _fields_from(config, presets: dict, args_type, training_fields: tuple, what: str) -> dict:
    if isinstance(config, str):
        if config not in presets:
            raise ValueError(f"unknown {what} preset {config!r}; expected one of {tuple(presets)} or a dict of "
                             f"{args_type.__name__} fields")
        return dict(presets[config])
    if isinstance(config, args_type):
        return asdict(config)
    if isinstance(config, Mapping):
        unknown = sorted(set(config) - set(args_type.field_names()) - set(training_fields))
        if unknown:
            raise ValueError(f"unknown {what} config fields {unknown}; {args_type.__name__} has "
                             f"{list(args_type.field_names())}")
        return {k: v for k, v in config.items() if k not in training_fields}
    raise ValueError(f"{what} config must be a preset name, a dict or a {args_type.__name__}, "
                     f"got {type(config).__name__}")


def gpt_args(config, *, image_size: Optional[int] = None, downsample: int = 16, **fields) -> ModelArgs:
    """ModelArgs from a preset name ("GPT-B", ...), a dict of fields or a ModelArgs, with ``fields`` overriding.

    image_size / downsample set block_size = (image_size // downsample)² (the checkpoint does not record it).
    cls_token_num defaults to upstream's sampling scripts: 1 for c2i, 120 for t2i.
    """
    args = _fields_from(config, PRESETS, ModelArgs, GPT_TRAINING_FIELDS, "LlamaGen GPT")
    args.update(_fields_from(fields, PRESETS, ModelArgs, (), "LlamaGen GPT"))
    if image_size is not None:
        if image_size % downsample:
            raise ValueError(f"image_size={image_size} is not a multiple of downsample={downsample}")
        block = (image_size // downsample) ** 2
        if args.get("block_size", block) != block:
            raise ValueError(f"block_size={args['block_size']} contradicts image_size={image_size} / "
                             f"downsample={downsample} ({block} tokens)")
        args["block_size"] = block
    elif "block_size" not in args:
        raise ValueError("LlamaGen checkpoints do not record their resolution: pass image_size= (e.g. 256 for "
                         "c2i_B_256.pt) or block_size in the config")
    args.setdefault("cls_token_num", CAPTION_TOKENS if args.get("model_type") == "t2i" else 1)
    return ModelArgs(**args)


def vq_args(config) -> VQArgs:
    """VQArgs from "VQ-16" / "VQ-8", a dict of fields (upstream's loss fields accepted and ignored) or a VQArgs."""
    return VQArgs(**_fields_from(config, VQ_PRESETS, VQArgs, VQ_TRAINING_FIELDS, "LlamaGen VQ"))


# ----------------------------------------------------------------------------------------------------------------------
# state dicts
# ----------------------------------------------------------------------------------------------------------------------
def _torch_load(path) -> object:
    try:
        # training checkpoints also pickle their argparse arguments next to the weights
        with torch.serialization.safe_globals([argparse.Namespace]):
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise ValueError(f"{path}: torch.load(weights_only=True) refused the file ({exc}). If you trust it, load it "
                         "with torch.load(..., weights_only=False) and pass the dict") from exc


def read_state_dict(checkpoint: Checkpoint) -> dict[str, torch.Tensor]:
    """A path or a loaded checkpoint -> its state dict: under "model", "module" or "state_dict", or bare."""
    source = checkpoint
    if isinstance(checkpoint, (str, os.PathLike)):
        checkpoint = _torch_load(checkpoint)
    if not isinstance(checkpoint, Mapping):
        raise ValueError(f"{source!r} holds a {type(checkpoint).__name__}, not a checkpoint dict")
    for key in WRAPPER_KEYS:
        if isinstance(checkpoint.get(key), Mapping):
            checkpoint = checkpoint[key]
            break
    not_tensors = sorted(k for k, v in checkpoint.items() if not isinstance(v, torch.Tensor))
    if not_tensors:
        raise ValueError(f"not a state dict (no {' / '.join(WRAPPER_KEYS)} entry, and these entries are not tensors: "
                         f"{_listing(not_tensors)})")
    return dict(checkpoint)


def _listing(items: list) -> str:
    shown = ", ".join(str(i) for i in items[:_LISTED])
    return shown + (f", ... ({len(items) - _LISTED} more)" if len(items) > _LISTED else "")


def _shape_errors(expected: Mapping[str, torch.Tensor], state: Mapping[str, torch.Tensor],
                  skip: tuple[str, ...]) -> list[str]:
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(k for k in set(state) - set(expected) if not k.startswith(skip))
    wrong = sorted(f"{k}: checkpoint {tuple(state[k].shape)} vs model {tuple(expected[k].shape)}"
                   for k in set(expected) & set(state) if tuple(state[k].shape) != tuple(expected[k].shape))
    problems = []
    if missing:
        problems.append(f"missing keys ({len(missing)}): {_listing(missing)}")
    if unexpected:
        problems.append(f"unexpected keys ({len(unexpected)}): {_listing(unexpected)}")
    if wrong:
        problems.append(f"wrong shapes ({len(wrong)}): {_listing(wrong)}")
    return problems


def load_state_dict(module: torch.nn.Module, state: Mapping[str, torch.Tensor], what: str,
                    skip: tuple[str, ...] = (), hint: str = "") -> None:
    """Copy ``state`` into every parameter and persistent buffer of ``module``, or raise a ValueError naming the
    missing, unexpected (unless in/prefixed by ``skip``) and misshapen keys."""
    expected = module.state_dict()
    problems = _shape_errors(expected, state, skip)
    if problems:
        raise ValueError(f"{what} checkpoint does not match the config: " + "; ".join(problems) + hint)
    module.load_state_dict({k: state[k] for k in expected}, strict=True)


def _gpt_hint(args: ModelArgs, state: Mapping[str, torch.Tensor]) -> str:
    has_caption = any(k.startswith("cls_embedding.cap_proj.") for k in state)
    has_classes = "cls_embedding.embedding_table.weight" in state
    if args.model_type == "c2i" and has_caption and not has_classes:
        return ". The weights are text-conditional: pass model_type='t2i'"
    if args.model_type == "t2i" and has_classes and not has_caption:
        return ". The weights are class-conditional: pass model_type='c2i'"
    return ""


def _check_freqs_cis(args: ModelArgs, state: Mapping[str, torch.Tensor]) -> None:
    if "freqs_cis" not in state:
        return
    expected = (args.max_seq_len, args.head_dim // 2, 2)
    if tuple(state["freqs_cis"].shape) != expected:
        raise ValueError(f"LlamaGen GPT checkpoint: freqs_cis {tuple(state['freqs_cis'].shape)} vs {expected} for "
                         f"cls_token_num={args.cls_token_num}, grid {args.grid}x{args.grid}: check image_size")


def _empty(build, device) -> torch.nn.Module:
    """The module with uninitialised storage on ``device`` (no random init of weights the checkpoint replaces)."""
    with torch.device("meta"):
        module = build()
    return module.to_empty(device=device)


def load_gpt(checkpoint: Checkpoint, args: ModelArgs, device="cpu") -> Transformer:
    state = read_state_dict(checkpoint)
    _check_freqs_cis(args, state)
    model = _empty(lambda: Transformer(args), device)
    load_state_dict(model, state, "LlamaGen GPT", skip=("freqs_cis",), hint=_gpt_hint(args, state))
    return model


def load_vq(checkpoint: Checkpoint, args: VQArgs, device="cpu") -> VQDecoder:
    model = _empty(lambda: VQDecoder(args), device)
    load_state_dict(model, read_state_dict(checkpoint), "LlamaGen VQ", skip=ENCODER_PREFIXES)
    return model


# ----------------------------------------------------------------------------------------------------------------------
# the public entry point
# ----------------------------------------------------------------------------------------------------------------------
def load_llamagen(checkpoint: Checkpoint, config, *, image_size: Optional[int] = None, downsample: int = 16,
                  vq: Optional[Checkpoint] = None, vq_config="VQ-16", dtype: Optional[torch.dtype] = None,
                  device=None, **fields) -> LlamaGenAdapter:
    """A released LlamaGen GPT (and optionally its VQ decoder) as an adapter :func:`csd_kernels.generate` drives.

    checkpoint: a ``.pt`` path or a loaded dict (weights under "model", "module", "state_dict", or bare).
    config: "GPT-B" / "GPT-L" / "GPT-XL" / "GPT-XXL" / "GPT-XXXL" / "GPT-1B" / "GPT-3B" / "GPT-7B", a dict of
    ModelArgs fields or a ModelArgs; ``fields`` override it (e.g. ``model_type="t2i"``, ``num_classes=...``).
    image_size / downsample: the resolution the checkpoint was trained at (grid = image_size // downsample).
    vq / vq_config: the VQ checkpoint (``vq_ds16_c2i.pt``) and its preset or fields; without it there are no pixels.
    dtype: of the GPT (default float32; upstream samples in bfloat16); the VQ decoder runs in float32 as upstream.
    """
    device = torch.device(device or "cpu")
    args = gpt_args(config, image_size=image_size, downsample=downsample, **fields)
    gpt = load_gpt(checkpoint, args, device).to(dtype=dtype or torch.float32).eval()
    decoder = None
    if vq is not None:
        v_args = vq_args(vq_config)
        if v_args.codebook_size != args.vocab_size:
            raise ValueError(f"VQ codebook_size={v_args.codebook_size} != GPT vocab_size={args.vocab_size}")
        if v_args.downsample != downsample:
            raise ValueError(f"the VQ decoder upsamples {v_args.downsample}x but downsample={downsample}")
        decoder = load_vq(vq, v_args, device).eval()
    return LlamaGenAdapter(gpt, vq=decoder)
