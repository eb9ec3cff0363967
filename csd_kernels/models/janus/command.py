"""``csd --model janus-pro``: ``weights`` = a Janus(-Pro) folder: deepseek-ai's original release
(``deepseek-ai/Janus-Pro-7B``, config.json model_type "multi_modality", read by :func:`.checkpoint.load_janus_pro`) or
the transformers-format conversion (``deepseek-community/Janus-Pro-7B``); the format is read from config.json.
Prompts are text, in deepseek-ai/Janus' SFT format (:func:`.adapter.janus_prompt`)."""

from __future__ import annotations

import torch

from ..loading import loading, placement, refuse_options, require_path
from ..registry import ZooModel
from .adapter import JANUS_DEFAULTS, JanusAdapter, janus_prompt
from .checkpoint import is_janus_original, janus_tokenizer, load_janus_pro

__all__ = ["load"]


def load(device=None, *, weights=None, dtype=None, **options) -> ZooModel:
    refuse_options("janus-pro", **options)
    require_path(weights, "--weights", "Janus-Pro checkpoint folder")
    device, torch_dtype = placement(device, dtype)
    original = loading("--weights", weights, "Janus-Pro checkpoint folder", lambda: is_janus_original(weights))
    read = (lambda: load_janus_pro(weights, dtype=torch_dtype, device=device)) if original else \
        (lambda: _transformers_format(weights, torch_dtype, device))
    model = loading("--weights", weights, "Janus-Pro checkpoint folder", read)
    tokenizer = loading("--weights", weights, "Janus-Pro folder (tokenizer files)", lambda: janus_tokenizer(weights))
    adapter = JanusAdapter(model)

    def parse(prompts: list[str]) -> dict:
        return {k: v.to(device) for k, v in janus_prompt(tokenizer, [str(p) for p in prompts]).items()}

    return ZooModel("janus-pro", adapter, parse, defaults=JANUS_DEFAULTS, prompt_help="a text prompt")


def _dtype_kwarg(dtype: torch.dtype) -> dict:
    """from_pretrained's dtype keyword: ``dtype`` from transformers 4.56 on, ``torch_dtype`` before."""
    import transformers

    major, minor = (int(part) for part in transformers.__version__.split(".")[:2])
    return {"dtype" if (major, minor) >= (4, 56) else "torch_dtype": dtype}


def _transformers_format(weights: str, dtype: torch.dtype, device: torch.device):
    """A transformers-format Janus folder; refused when any weight would be left randomly initialised."""
    from transformers import JanusForConditionalGeneration

    model, info = JanusForConditionalGeneration.from_pretrained(weights, output_loading_info=True,
                                                                **_dtype_kwarg(dtype))
    if info.get("missing_keys"):
        missing = sorted(info["missing_keys"])
        raise ValueError(f"not a complete Janus checkpoint: missing tensors {missing[:12]}"
                         + (f" and {len(missing) - 12} more" if len(missing) > 12 else ""))
    return model.to(device).eval()
