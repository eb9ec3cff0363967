"""csd-kernels: fused kernels for Content-aware Speculative Decoding of autoregressive image generators."""

from .compat import chain_speculative_sampling, rejection_sample
from .decoding import GenerateOutput, generate
from .dispatch import available_backends
from .ops import VerifyResult, verify
from .tree_ops import TreeResult, verify_tree

__all__ = ["available_backends", "chain_speculative_sampling", "generate", "GenerateOutput", "rejection_sample",
           "verify", "VerifyResult", "verify_tree", "TreeResult"]
__version__ = "0.1.0"
