"""csd-kernels: fused kernels for Content-aware Speculative Decoding of autoregressive image generators.

Layers, each importing only those below it: reference/ (the maths, once) <- backends/ (Triton, the compiled
extension) <- ops/ (the public ops: checks, custom ops, backend choice) <- decoding/ (ck.generate) over models/ (the
adapters) <- zoo/, cli/, runner/, bench/ (the csd command and its tools). See docs/development.md, "Layout"."""

from ._lazy import lazy_package

__all__ = ["available_backends", "chain_speculative_sampling", "codebook_neighbours", "generate", "GenerateOutput",
           "GenerationConfig", "rejection_sample", "verify", "VerifyResult", "verify_tree", "TreeResult"]
__version__ = "0.1.0"
# The names load on first use, so that the csd command answers --help, --version and bad flags before torch loads.
# The custom ops (torch.ops.csd_kernels.*) are registered when their op module loads: the first use of verify /
# verify_tree / the interop functions, or ``import csd_kernels.ops``.
lazy_package(__name__, {
    **dict.fromkeys(("GenerateOutput", "generate"), ".decoding.generate"),
    "GenerationConfig": ".config.generation",
    **dict.fromkeys(("chain_speculative_sampling", "rejection_sample"), ".ops.interop"),
    "available_backends": ".ops.registry",
    "codebook_neighbours": ".ops.neighbours",
    **dict.fromkeys(("VerifyResult", "verify"), ".ops.verify"),
    **dict.fromkeys(("TreeResult", "verify_tree"), ".ops.verify_tree"),
})
