"""The Triton backend: verify.py (the launcher of the verify kernels and its plan), verify_tree.py, drafts.py (the
decoding loop's draft tokens), launch.py (a launch without Triton's per-call binder), report.py (sm_90 registers and
spills without a GPU); kernels/ holds the ``@triton.jit`` code. Importing this package does not import triton."""
