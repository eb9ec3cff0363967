"""Any causal LM over a codebook of image tokens (the digits model of the zoo among them): adapter.py."""

from .adapter import ImageGPT

__all__ = ["ImageGPT"]
