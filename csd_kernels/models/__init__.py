"""Model adapters for :func:`csd_kernels.generate` (see :mod:`.protocol`): one folder per family (janus/, lumina/,
emu3/, llamagen/, image_gpt/) with its adapter, checkpoint loader and ``csd --model`` loader (command.py), each
entered once in registry.py (which get_adapter, the zoo and the command read), over what they share: protocol.py,
base.py (the cached-LM adapter), cache.py (the per-row static KV cache), checkpoint.py (strict loading), loading.py
(the command-line loaders' checks), row_end.py (the forced row-end layout of Lumina-mGPT and Emu3).

Importing this package imports no torch (the csd command reads registry.py's names and help before it imports
torch): the names below load from their family's folder on first use."""

from .._lazy import lazy_package
from .registry import FAMILIES, get_adapter

__all__ = ["EMU3_DEFAULTS", "FAMILIES", "Emu3Adapter", "ImageAdapter", "ImageGPT", "JANUS_DEFAULTS", "JanusAdapter",
           "LUMINA_DEFAULTS", "LlamaGenAdapter", "LuminaMGPT", "StaticImageAdapter", "emu3_grid", "emu3_prompt",
           "get_adapter", "is_adapter", "janus_prompt", "load_emu3", "load_janus_pro", "load_llamagen",
           "load_lumina_mgpt", "lumina_grid", "lumina_prompt"]
lazy_package(__name__, {
    **dict.fromkeys(("EMU3_DEFAULTS", "Emu3Adapter", "emu3_grid", "emu3_prompt", "load_emu3"), ".emu3"),
    "ImageGPT": ".image_gpt",
    **dict.fromkeys(("JANUS_DEFAULTS", "JanusAdapter", "janus_prompt", "load_janus_pro"), ".janus"),
    **dict.fromkeys(("LlamaGenAdapter", "load_llamagen"), ".llamagen"),
    **dict.fromkeys(("LUMINA_DEFAULTS", "LuminaMGPT", "load_lumina_mgpt", "lumina_grid", "lumina_prompt"), ".lumina"),
    **dict.fromkeys(("ImageAdapter", "StaticImageAdapter", "is_adapter"), ".protocol"),
})
