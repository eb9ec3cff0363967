"""Local checkpoints of the three model families as ``csd`` command models (nothing is downloaded).

* ``llamagen``: ``weights`` = a released class-conditional GPT ``.pt`` (``c2i_B_256.pt``), ``config`` = its upstream
  name (``GPT-B``) or a JSON file of ModelArgs fields (optionally with ``"vq_config"`` and ``"downsample"``),
  ``image_size`` = its resolution (read from a ``_256``/``_384`` in the file name when not given), ``vq`` =
  ``vq_ds16_c2i.pt`` for pixels. Prompts are ImageNet class ids. (Text-conditional LlamaGen needs T5 caption
  features: use the Python API, ``load_llamagen`` + ``generate(prompt_embeds=...)``.)
* ``lumina-mgpt``: ``weights`` = a Lumina-mGPT checkpoint folder (config.json, safetensors, tokenizer files),
  ``size`` = image size in pixels, ``768`` or ``WxH`` (default 768). Prompts are text.
* ``janus-pro``: ``weights`` = a Janus(-Pro) folder: deepseek-ai's original release (``deepseek-ai/Janus-Pro-7B``,
  config.json model_type "multi_modality", read by :func:`csd_kernels.models.load_janus_pro`) or the
  transformers-format conversion (``deepseek-community/Janus-Pro-7B``); the format is read from config.json.
  Prompts are text, in deepseek-ai/Janus' SFT format (:func:`csd_kernels.models.janus_prompt`).

* ``emu3``: ``weights`` = a transformers-format Emu3 folder (``BAAI/Emu3-Gen-hf``: config.json, safetensors,
  tokenizer files), ``size`` = image size in pixels, ``720`` or ``WxH`` (multiples of 8; default 720). Prompts are
  text; BAAI's positive suffix is appended and its negative prompt drives CFG (:mod:`csd_kernels.models.emu3`).

``device`` defaults to the GPU when one is visible; ``dtype`` to bfloat16 on a GPU and float32 on the CPU.
"""

from __future__ import annotations

import json
import os
import pickle
import re
from typing import Optional

import torch

from . import ZooModel

__all__ = ["llamagen", "lumina_mgpt", "janus_pro", "emu3"]

_DTYPES = {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16,
           "float32": torch.float32, "fp32": torch.float32}


def _placement(device: Optional[torch.device], dtype: Optional[str]) -> tuple[torch.device, torch.dtype]:
    device = device or torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if dtype is None:
        return device, torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype not in _DTYPES:
        raise ValueError(f"--dtype {dtype}: choose from {', '.join(_DTYPES)}")
    return device, _DTYPES[dtype]


def _require(path: Optional[str], flag: str, kind: str) -> str:
    if path is None:
        raise ValueError(f"{flag} is required: the path of the {kind}")
    exists = os.path.isdir(path) if kind.endswith("folder") else os.path.isfile(path)
    if not exists:
        what = "folder" if kind.endswith("folder") else "file"
        raise ValueError(f"{flag} {path}: no such {what} (expected the {kind})")
    return path


def _unused(name: str, **options) -> None:
    given = sorted(k for k, v in options.items() if v is not None)
    if given:
        raise ValueError(f"--model {name} takes no {', '.join('--' + k.replace('_', '-') for k in given)}")


def _dtype_kwarg(dtype: torch.dtype) -> dict:
    """from_pretrained's dtype keyword: ``dtype`` from transformers 4.56 on, ``torch_dtype`` before."""
    import transformers

    major, minor = (int(part) for part in transformers.__version__.split(".")[:2])
    return {"dtype" if (major, minor) >= (4, 56) else "torch_dtype": dtype}


def _left_pad(rows: list[list[int]], pad: int, device: torch.device) -> dict:
    width = max(len(r) for r in rows)
    ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows], dtype=torch.long, device=device)
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], dtype=torch.long, device=device)
    return {"input_ids": ids, "attention_mask": mask}


def _file_errors() -> tuple:
    """What reading a file that is not a checkpoint raises (torch's unpickler, safetensors, transformers)."""
    errors = (ValueError, OSError, RuntimeError, KeyError, EOFError, TypeError, IndexError, AttributeError,
              pickle.UnpicklingError)
    try:
        from safetensors import SafetensorError
    except ImportError:
        return errors
    return errors + (SafetensorError,)


def _loading(flag: str, path: str, kind: str, load):
    """load(), with any failure as one ValueError line naming the flag and the path."""
    try:
        return load()
    except _file_errors() as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if isinstance(exc, ValueError) and not isinstance(exc, UnicodeDecodeError):  # our loaders' own messages
            raise ValueError(f"{flag} {path}: {reason}") from exc
        raise ValueError(f"{flag} {path}: not a {kind} ({reason})") from exc


def _llamagen_config(config: Optional[str]) -> tuple:
    """(GPT config, load_llamagen keywords) from a preset name or a JSON file of ModelArgs fields."""
    if config is None:
        raise ValueError("--config is required for llamagen: the upstream model name, e.g. GPT-B for c2i_B_256.pt")
    if not config.endswith(".json"):
        return config, {}
    _require(config, "--config", "JSON file of LlamaGen ModelArgs fields")
    try:
        with open(config, encoding="utf-8") as f:
            fields = json.load(f)
    except (OSError, ValueError) as exc:
        raise ValueError(f"--config {config}: not a JSON file of ModelArgs fields ({exc})") from exc
    if not isinstance(fields, dict):
        raise ValueError(f"--config {config}: expected a JSON object of ModelArgs fields")
    extra = {key: fields.pop(key) for key in ("vq_config", "downsample") if key in fields}
    return fields, extra


def _lumina_size(size) -> tuple[int, int]:
    """(width, height) from 768 or "768x512"."""
    text = "768" if size is None else str(size)
    parts = text.lower().split("x")
    try:
        width, height = (int(parts[0]), int(parts[0])) if len(parts) == 1 else (int(parts[0]), int(parts[1]))
    except ValueError:
        raise ValueError(f"--size {text}: give pixels as 768 or WIDTHxHEIGHT") from None
    return width, height


def llamagen(device=None, *, weights=None, config=None, vq=None, image_size=None, dtype=None, **options) -> ZooModel:
    from ..models import load_llamagen

    _unused("llamagen", **options)
    _require(weights, "--weights", "LlamaGen GPT checkpoint (.pt)")
    if vq is not None:
        _require(vq, "--vq", "LlamaGen VQ checkpoint (.pt)")
    gpt_config, extra = _llamagen_config(config)
    if image_size is None:
        found = re.search(r"_(\d{3,4})(?=\D*$)", os.path.basename(weights))
        if found is None:
            raise ValueError(f"--image-size is required: {os.path.basename(weights)} does not name its resolution")
        image_size = int(found.group(1))
    device, torch_dtype = _placement(device, dtype)
    adapter = _loading("--weights", weights, "LlamaGen checkpoint", lambda: load_llamagen(
        weights, gpt_config, image_size=int(image_size), vq=vq, dtype=torch_dtype, device=device, **extra))
    if adapter.args.model_type != "c2i":
        raise ValueError("--model llamagen runs class-conditional checkpoints; text-conditional ones need T5 caption "
                         "features (Python API: load_llamagen + generate(prompt_embeds=...))")
    classes = adapter.args.num_classes

    def parse(prompts: list[str]) -> dict:
        ids = []
        for prompt in prompts:
            text = str(prompt).strip()
            if not text.isdigit() or not 0 <= int(text) < classes:
                raise ValueError(f"prompt {prompt!r}: LlamaGen c2i takes a class id 0..{classes - 1}")
            ids.append([int(text)])
        return {"input_ids": torch.tensor(ids, dtype=torch.long, device=device)}

    return ZooModel("llamagen", adapter, parse, defaults=dict(adapter.defaults),
                    prompt_help=f"an ImageNet class id 0..{classes - 1}")


def lumina_mgpt(device=None, *, weights=None, size=None, dtype=None, **options) -> ZooModel:
    from transformers import AutoTokenizer

    from ..models import load_lumina_mgpt, lumina_grid, lumina_prompt

    _unused("lumina-mgpt", **options)
    _require(weights, "--weights", "Lumina-mGPT checkpoint folder")
    width, height = _lumina_size(size)
    grid = _loading("--size", f"{width}x{height}", "Lumina-mGPT size", lambda: lumina_grid(width, height))
    device, torch_dtype = _placement(device, dtype)
    adapter = _loading("--weights", weights, "Lumina-mGPT checkpoint folder",
                       lambda: load_lumina_mgpt(weights, grid=grid, dtype=torch_dtype, device=device))
    tokenizer = _loading("--weights", weights, "folder with Lumina-mGPT's tokenizer files",
                         lambda: AutoTokenizer.from_pretrained(weights))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0

    def parse(prompts: list[str]) -> dict:
        return _left_pad([lumina_prompt(tokenizer, str(p), width, height) for p in prompts], pad, device)

    return ZooModel("lumina-mgpt", adapter, parse, defaults=dict(adapter.defaults), prompt_help="a text prompt")


def janus_pro(device=None, *, weights=None, dtype=None, **options) -> ZooModel:
    from ..models import JANUS_DEFAULTS, JanusAdapter, janus_prompt
    from ..models.janus.checkpoint import is_janus_original, janus_tokenizer, load_janus_pro

    _unused("janus-pro", **options)
    _require(weights, "--weights", "Janus-Pro checkpoint folder")
    device, torch_dtype = _placement(device, dtype)
    original = _loading("--weights", weights, "Janus-Pro checkpoint folder", lambda: is_janus_original(weights))
    load = (lambda: load_janus_pro(weights, dtype=torch_dtype, device=device)) if original else \
        (lambda: _janus_transformers(weights, torch_dtype, device))
    model = _loading("--weights", weights, "Janus-Pro checkpoint folder", load)
    tokenizer = _loading("--weights", weights, "Janus-Pro folder (tokenizer files)",
                         lambda: janus_tokenizer(weights))
    adapter = JanusAdapter(model)

    def parse(prompts: list[str]) -> dict:
        return {k: v.to(device) for k, v in janus_prompt(tokenizer, [str(p) for p in prompts]).items()}

    return ZooModel("janus-pro", adapter, parse, defaults=dict(JANUS_DEFAULTS), prompt_help="a text prompt")


def _janus_transformers(weights: str, dtype: torch.dtype, device: torch.device):
    """A transformers-format Janus folder; refused when any weight would be left randomly initialised."""
    from transformers import JanusForConditionalGeneration

    model, info = JanusForConditionalGeneration.from_pretrained(weights, output_loading_info=True,
                                                                **_dtype_kwarg(dtype))
    if info.get("missing_keys"):
        missing = sorted(info["missing_keys"])
        raise ValueError(f"not a complete Janus checkpoint: missing tensors {missing[:12]}"
                         + (f" and {len(missing) - 12} more" if len(missing) > 12 else ""))
    return model.to(device).eval()


def emu3(device=None, *, weights=None, size=None, dtype=None, **options) -> ZooModel:
    from transformers import AutoTokenizer

    from ..models.emu3 import adapter as family

    _unused("emu3", **options)
    _require(weights, "--weights", "Emu3 checkpoint folder")
    width, height = _lumina_size(family.DEFAULT_SIZE if size is None else size)
    grid = _loading("--size", f"{width}x{height}", "Emu3 size", lambda: family.emu3_grid(width, height))
    device, torch_dtype = _placement(device, dtype)
    tokenizer = _loading("--weights", weights, "folder with Emu3's tokenizer files",
                         lambda: AutoTokenizer.from_pretrained(weights))
    negative = tokenizer(family.EMU3_NEGATIVE_PROMPT)["input_ids"]
    adapter = _loading("--weights", weights, "Emu3 checkpoint folder", lambda: family.load_emu3(
        weights, grid=grid, negative_prompt_ids=negative, dtype=torch_dtype, device=device))

    def parse(prompts: list[str]) -> dict:
        inputs = family.emu3_prompt(tokenizer, [str(p) + family.EMU3_POSITIVE_SUFFIX for p in prompts], grid)
        return {k: v.to(device) for k, v in inputs.items()}

    return ZooModel("emu3", adapter, parse, defaults=dict(adapter.defaults), prompt_help="a text prompt")
