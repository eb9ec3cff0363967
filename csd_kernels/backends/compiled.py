"""The callers of the compiled extension ``csd_kernels._C`` (python/bindings.cpp: the C++ CPU kernels and, when built
with CUDA, the CUDA ones; csrc/). They check nothing (the ops did) and keep the positional contract of the ops'
backend functions (backends/spec.py)."""

from __future__ import annotations

import functools
import importlib
from typing import Optional

import torch

from .spec import TREE_ARGS, TreeArgs, VerifyArgs, compiled_names

__all__ = ["compiled_extension", "load_error", "has_tree", "verify_rows", "verify_tree_rows", "random_draft_tokens",
           "tree_candidates"]


@functools.lru_cache(maxsize=None)
def _load():
    """csd_kernels._C, or the exception raised while importing it (cached: the import is not retried)."""
    try:
        return importlib.import_module("csd_kernels._C")
    except Exception as exc:  # noqa: BLE001 - any import failure means "not available", with the reason kept
        return exc


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


_TREE_COMPILED = compiled_names(TREE_ARGS)


def verify_tree_rows(args: TreeArgs) -> tuple:
    """``csd_kernels::verify_tree_rows`` on ops.verify_tree's arguments (those of the spec its schema has)."""
    fields = args._asdict()
    return tuple(torch.ops.csd_kernels.verify_tree_rows(*(fields[name] for name in _TREE_COMPILED)))


def random_draft_tokens(seed, offset, positions, length: int, vocab: int) -> torch.Tensor:
    """[B, L] int64 fresh draft tokens (reference.random_draft_tokens) from the C++ kernel."""
    return compiled_extension().random_draft_tokens(seed, offset, positions, length, vocab)


def tree_candidates(seed, offset, main_tokens, q, branching: int, first: int) -> torch.Tensor:
    """[B, P, K] int64 sibling candidates (reference.tree_candidates) from the C++ kernel."""
    return compiled_extension().tree_candidates(seed, offset, main_tokens, q, branching, first)
