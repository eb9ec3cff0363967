"""``csd --model emu3``: ``weights`` = a transformers-format Emu3 folder (``BAAI/Emu3-Gen-hf``: config.json,
safetensors, tokenizer files), ``size`` = image size in pixels, ``720`` or ``WxH`` (multiples of 8; default 720).
Prompts are text; BAAI's positive suffix is appended and its negative prompt drives CFG (:mod:`.adapter`)."""

from __future__ import annotations

from ..loading import loading, pixel_size, placement, refuse_options, require_path
from ..registry import ZooModel
from .adapter import DEFAULT_SIZE, EMU3_NEGATIVE_PROMPT, EMU3_POSITIVE_SUFFIX, emu3_grid, emu3_prompt, load_emu3

__all__ = ["load"]


def load(device=None, *, weights=None, size=None, dtype=None, **options) -> ZooModel:
    from transformers import AutoTokenizer

    refuse_options("emu3", **options)
    require_path(weights, "--weights", "Emu3 checkpoint folder")
    width, height = pixel_size(size, DEFAULT_SIZE)
    grid = loading("--size", f"{width}x{height}", "Emu3 size", lambda: emu3_grid(width, height))
    device, torch_dtype = placement(device, dtype)
    tokenizer = loading("--weights", weights, "folder with Emu3's tokenizer files",
                        lambda: AutoTokenizer.from_pretrained(weights))
    negative = tokenizer(EMU3_NEGATIVE_PROMPT)["input_ids"]
    adapter = loading("--weights", weights, "Emu3 checkpoint folder", lambda: load_emu3(
        weights, grid=grid, negative_prompt_ids=negative, dtype=torch_dtype, device=device))

    def parse(prompts: list[str]) -> dict:
        inputs = emu3_prompt(tokenizer, [str(p) + EMU3_POSITIVE_SUFFIX for p in prompts], grid)
        return {k: v.to(device) for k, v in inputs.items()}

    return ZooModel("emu3", adapter, parse, defaults=adapter.defaults, prompt_help="a text prompt")
