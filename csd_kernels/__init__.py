"""csd-kernels: fused kernels for Content-aware Speculative Decoding of autoregressive image generators."""

from .decoding import GenerateOutput, generate
from .dispatch import available_backends
from .ops import VerifyResult, verify

__all__ = ["available_backends", "generate", "GenerateOutput", "verify", "VerifyResult"]
__version__ = "0.1.0"
