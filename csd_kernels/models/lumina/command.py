"""``csd --model lumina-mgpt``: ``weights`` = a Lumina-mGPT checkpoint folder (config.json, safetensors, tokenizer
files), ``size`` = image size in pixels, ``768`` or ``WxH`` (default 768). Prompts are text."""

from __future__ import annotations

from ..loading import left_pad, loading, pixel_size, placement, refuse_options, require_path
from ..registry import ZooModel
from .adapter import load_lumina_mgpt, lumina_grid, lumina_prompt

__all__ = ["load"]


def load(device=None, *, weights=None, size=None, dtype=None, **options) -> ZooModel:
    from transformers import AutoTokenizer

    refuse_options("lumina-mgpt", **options)
    require_path(weights, "--weights", "Lumina-mGPT checkpoint folder")
    width, height = pixel_size(size, 768)
    grid = loading("--size", f"{width}x{height}", "Lumina-mGPT size", lambda: lumina_grid(width, height))
    device, torch_dtype = placement(device, dtype)
    adapter = loading("--weights", weights, "Lumina-mGPT checkpoint folder",
                      lambda: load_lumina_mgpt(weights, grid=grid, dtype=torch_dtype, device=device))
    tokenizer = loading("--weights", weights, "folder with Lumina-mGPT's tokenizer files",
                        lambda: AutoTokenizer.from_pretrained(weights))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0

    def parse(prompts: list[str]) -> dict:
        return left_pad([lumina_prompt(tokenizer, str(p), width, height) for p in prompts], pad, device)

    return ZooModel("lumina-mgpt", adapter, parse, defaults=adapter.defaults, prompt_help="a text prompt")
