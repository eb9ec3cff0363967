"""The settings of :func:`csd_kernels.generate`, torch-free: generation.py (:class:`GenerationConfig`, every setting
once, and the checks derived from it), rules.py (what a setting accepts). Below models (a family's defaults are a
GenerationConfig) and decoding; the command line builds its flags from it before it imports torch."""

from .generation import GenerationConfig
from .rules import ArgumentError

__all__ = ["ArgumentError", "GenerationConfig"]
