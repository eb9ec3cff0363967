"""csd-kernels: fused kernels for Content-aware Speculative Decoding of autoregressive image generators.

Layers, each importing only those below it: reference/ (the maths, once) <- backends/ (Triton, the compiled
extension) <- ops/ (the public ops: checks, custom ops, backend choice) <- decoding/ (ck.generate) over models/ (the
adapters) <- zoo/, cli/, runner/, bench/ (the csd command and its tools). See docs/development.md, "Layout"."""

from .decoding import GenerateOutput, generate
from .ops.interop import chain_speculative_sampling, rejection_sample
from .ops.registry import available_backends
from .ops.verify import VerifyResult, verify
from .ops.verify_tree import TreeResult, verify_tree

__all__ = ["available_backends", "chain_speculative_sampling", "generate", "GenerateOutput", "rejection_sample",
           "verify", "VerifyResult", "verify_tree", "TreeResult"]
__version__ = "0.1.0"
