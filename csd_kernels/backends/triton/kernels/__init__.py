"""The ``@triton.jit`` kernels of the Triton backend (common.py: Philox, the shared device functions, the epilogue)."""
