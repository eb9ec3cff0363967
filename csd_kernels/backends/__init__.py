"""How each backend computes the maths of :mod:`csd_kernels.reference`: triton/ (the Triton kernels and their
launchers) and compiled.py (the callers of the C++ / CUDA extension ``csd_kernels._C``). Nothing here checks
arguments: the ops (:mod:`csd_kernels.ops`) did."""
