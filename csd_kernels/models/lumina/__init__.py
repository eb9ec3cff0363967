"""Lumina-mGPT: the adapter over transformers' ChameleonForConditionalGeneration (adapter.py) and the strict loader of
Alpha-VLLM's checkpoints (checkpoint.py, imported when a folder is loaded)."""

from .adapter import DEFAULT_GRID, LUMINA_DEFAULTS, LuminaMGPT, load_lumina_mgpt, lumina_grid, lumina_prompt

__all__ = ["DEFAULT_GRID", "LUMINA_DEFAULTS", "LuminaMGPT", "load_lumina_mgpt", "lumina_grid", "lumina_prompt"]
