"""Emu3: the adapter over transformers' Emu3ForConditionalGeneration and its loader (adapter.py)."""

from .adapter import (
    EMU3_DEFAULTS,
    EMU3_NEGATIVE_PROMPT,
    EMU3_POSITIVE_SUFFIX,
    Emu3Adapter,
    emu3_grid,
    emu3_prompt,
    load_emu3,
)

__all__ = ["EMU3_DEFAULTS", "EMU3_NEGATIVE_PROMPT", "EMU3_POSITIVE_SUFFIX", "Emu3Adapter", "emu3_grid", "emu3_prompt",
           "load_emu3"]
