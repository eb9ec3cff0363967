"""The callers of the compiled extension ``csd_kernels._C`` (python/bindings.cpp: the C++ CPU kernels and, when built
with CUDA, the CUDA ones; csrc/). They check nothing (the ops did) and keep the positional contract of the ops'
backend functions (backends/spec.py)."""

from __future__ import annotations

import functools
import importlib
import importlib.util
import warnings
from typing import Optional

import torch

from . import build_flags as flags
from . import jit
from .spec import TreeArgs, VerifyArgs

__all__ = ["compiled_extension", "load_error", "BuildMismatchWarning", "mismatch_message", "has_tree", "verify_rows",
           "verify_tree_rows", "random_draft_tokens", "tree_candidates"]


@functools.lru_cache(maxsize=None)
def _load():
    """csd_kernels._C, or the exception raised while importing it (cached: the import is not retried)."""
    try:
        return _import_for_running_torch()
    except Exception as exc:  # noqa: BLE001 - any import failure means "not available", with the reason kept
        return exc


class BuildMismatchWarning(UserWarning):
    """csd_kernels._C was built for another torch (or C++ ABI) than the running one."""


def _import_for_running_torch():
    """csd_kernels._C when it was built for the running torch; else the JIT build (CSD_KERNELS_JIT=1) or, after one
    warning line, ImportError (the ops then use the Triton / torch backends). The record is read from the file
    before importing: a _C made for another torch can fail or crash while it loads."""
    spec = importlib.util.find_spec("csd_kernels._C")
    running = flags.build_info(torch)
    if spec is None:
        if jit.enabled():
            return jit.build(torch)
        raise ImportError("csd_kernels._C is not built")
    built = flags.read_build_info(spec.origin) or {}
    if all(str(built.get(key)) == str(value) for key, value in running.items()):
        return importlib.import_module("csd_kernels._C")
    if jit.enabled():
        return jit.build(torch)
    message = mismatch_message(built, running)
    warnings.warn(message, BuildMismatchWarning, stacklevel=2)
    raise ImportError(message)


def mismatch_message(built: dict, running: dict) -> str:
    def describe(info):
        if "torch" not in info:
            return "an unrecorded torch (a build older than the record)"
        return f"torch {info['torch']} (C++11 ABI {info.get('cxx11_abi')})"

    if all(str(built.get(key)) == str(running[key]) for key in ("torch", "cxx11_abi")):
        what = "built from another version of csd_kernels (its ops take other arguments)"
    else:
        what = f"built for {describe(built)}, running {describe(running)}"
    return (f"csd_kernels._C was {what}: using the Triton / torch backends; rebuild with `pip install "
            f"--no-build-isolation .` in this environment, or set {jit.ENV}=1 to compile it for this torch")


def compiled_extension():
    """csd_kernels._C, or None when the extension was not built."""
    module = _load()
    return None if isinstance(module, Exception) else module


def load_error() -> Optional[Exception]:
    """Why csd_kernels._C could not be imported (None when it was)."""
    module = _load()
    return module if isinstance(module, Exception) else None


def has_tree() -> bool:
    """The extension registers the tree verification (an extension built before the tree op does not)."""
    return compiled_extension() is not None and hasattr(torch.ops.csd_kernels, "verify_tree_rows")


def verify_rows(args: VerifyArgs) -> tuple:
    """``csd_kernels::verify_rows`` on ops.verify's arguments (its schema is the spec's): the 8 fields of
    VerifyResult."""
    return tuple(torch.ops.csd_kernels.verify_rows(*args))


def verify_tree_rows(args: TreeArgs) -> tuple:
    """``csd_kernels::verify_tree_rows`` on ops.verify_tree's arguments (its schema is the spec's)."""
    return tuple(torch.ops.csd_kernels.verify_tree_rows(*args))


def random_draft_tokens(seed, offset, positions, length: int, vocab: int) -> torch.Tensor:
    """[B, L] int64 fresh draft tokens (reference.random_draft_tokens) from the C++ kernel."""
    return compiled_extension().random_draft_tokens(seed, offset, positions, length, vocab)


def tree_candidates(seed, offset, main_tokens, q, branching: int, first: int) -> torch.Tensor:
    """[B, P, K] int64 sibling candidates (reference.tree_candidates) from the C++ kernel."""
    return compiled_extension().tree_candidates(seed, offset, main_tokens, q, branching, first)
