"""Model adapters for :func:`csd_kernels.generate` (see :mod:`.protocol`): one folder per family (janus/, lumina/,
emu3/, llamagen/, image_gpt/) with its adapter and checkpoint loader, over what they share: protocol.py, base.py (the
cached-LM adapter), cache.py (the per-row static KV cache), checkpoint.py (strict loading), row_end.py (the forced
row-end layout of Lumina-mGPT and Emu3)."""

from __future__ import annotations

from .emu3 import EMU3_DEFAULTS, Emu3Adapter, emu3_grid, emu3_prompt, load_emu3
from .image_gpt import ImageGPT
from .janus import JANUS_DEFAULTS, JanusAdapter, janus_prompt, load_janus_pro
from .llamagen import LlamaGenAdapter, load_llamagen
from .llamagen.gpt import Transformer as _LlamaGenTransformer
from .lumina import LUMINA_DEFAULTS, LuminaMGPT, load_lumina_mgpt, lumina_grid, lumina_prompt
from .protocol import ImageAdapter, StaticImageAdapter, is_adapter

__all__ = ["EMU3_DEFAULTS", "Emu3Adapter", "ImageAdapter", "ImageGPT", "JANUS_DEFAULTS", "JanusAdapter",
           "LUMINA_DEFAULTS", "LlamaGenAdapter", "LuminaMGPT", "StaticImageAdapter", "emu3_grid", "emu3_prompt",
           "get_adapter", "is_adapter", "janus_prompt", "load_emu3", "load_janus_pro", "load_llamagen",
           "load_lumina_mgpt", "lumina_grid", "lumina_prompt"]


def get_adapter(model):
    """The adapter that drives ``model`` (an adapter is returned as is); ValueError when none can."""
    if is_adapter(model):
        return model
    name = type(model).__name__
    if name == "JanusForConditionalGeneration":
        return JanusAdapter(model)
    if name == "Emu3ForConditionalGeneration":
        raise ValueError("an Emu3ForConditionalGeneration needs its image grid: wrap it in "
                         "csd_kernels.models.Emu3Adapter(model, grid, negative_prompt_ids=...) or use load_emu3(path)")
    if name == "ChameleonForConditionalGeneration":
        return LuminaMGPT(model)
    if isinstance(model, _LlamaGenTransformer):
        return LlamaGenAdapter(model)
    raise ValueError(
        f"no csd_kernels adapter can drive a {name}: pass a JanusForConditionalGeneration, a "
        "ChameleonForConditionalGeneration (Lumina-mGPT layout, or csd_kernels.models.LuminaMGPT(model, ...)), "
        "a LlamaGen checkpoint loaded by csd_kernels.models.load_llamagen(...), "
        "a causal LM wrapped in csd_kernels.models.ImageGPT(lm, image_token_range=..., grid=..., null_token_id=...), "
        "or any object implementing csd_kernels.models.ImageAdapter"
    )
