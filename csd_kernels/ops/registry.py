"""Which backend runs an op: what is available for a device, in which order, and why not (verify's choice; verify_tree's
is the same among the backends that have a tree verification).

Auto order: on CUDA tensors the fused Triton kernel, then the CUDA extension, then PyTorch; on CPU tensors the C++
extension, then PyTorch, then Triton's interpreter (only when ``TRITON_INTERPRET=1`` was set before import: it is
correct but slow, so it is never preferred). ``CSD_KERNELS_BACKEND`` overrides the automatic choice.
"""

from __future__ import annotations

import functools
import importlib
import os
from typing import Optional

import torch

from ..backends.compiled import compiled_extension, has_tree, load_error

__all__ = ["BACKENDS", "ENV_BACKEND", "backend_status", "available_backends", "select_backend", "select_tree_backend",
           "tree_support"]

BACKENDS = ("triton", "cuda", "cpu", "torch")
_AUTO_ORDER = {"cuda": ("triton", "cuda", "torch"), "cpu": ("cpu", "torch", "triton")}
ENV_BACKEND = "CSD_KERNELS_BACKEND"


@functools.lru_cache(maxsize=None)
def _import(module: str):
    """The module, or the exception raised while importing it (cached: imports are not retried)."""
    try:
        return importlib.import_module(module)
    except Exception as exc:  # noqa: BLE001 - any import failure means "not available", with the reason kept
        return exc


def backend_status(name: str, device: torch.device) -> tuple[bool, str]:
    """(can run, reason if not) for backend ``name`` on tensors of ``device``."""
    device = torch.device(device)
    if name not in BACKENDS:
        raise ValueError(f"backend={name!r} is not one of {BACKENDS}")
    if name == "torch":
        return True, ""
    if name == "triton":
        module = _import("csd_kernels.backends.triton.verify")
        if isinstance(module, Exception):
            return False, f"triton could not be imported ({module}); install it with `pip install triton`"
        return module.is_available(device)
    extension = compiled_extension()
    if extension is None:
        return False, (
            f"the C++ extension csd_kernels._C is not built ({load_error()}); build it with "
            "`pip install --no-build-isolation -e .` in the repository"
        )
    if name == "cpu":
        if device.type != "cpu":
            return False, f"the 'cpu' backend runs on CPU tensors, these are on {device}"
        return True, ""
    # name == "cuda"
    if device.type != "cuda":
        return False, f"the 'cuda' backend runs on CUDA tensors, these are on {device}"
    if not extension.has_cuda():
        return False, (
            "csd_kernels._C was built without CUDA; rebuild with a CUDA build of torch and nvcc on the PATH "
            "(CSD_KERNELS_CUDA=1 pip install --no-build-isolation -e .)"
        )
    return True, ""


def available_backends(device: Optional[torch.device | str] = None) -> list[str]:
    """Backends that can run here, in the order ``backend=None`` tries them.

    With no device: those for CUDA tensors (when a GPU is visible) followed by the rest of those for CPU tensors.
    """
    devices = [torch.device(device)] if device is not None else (
        [torch.device("cuda"), torch.device("cpu")] if torch.cuda.is_available() else [torch.device("cpu")]
    )
    names: list[str] = []
    for dev in devices:
        for name in _AUTO_ORDER.get(dev.type, ("torch",)):
            if name not in names and backend_status(name, dev)[0]:
                names.append(name)
    return names


@functools.lru_cache(maxsize=None)  # what can run does not change within a process (imports are cached too)
def _first_available(device_type: str, index) -> str:
    return available_backends(torch.device(device_type, index) if index is not None else torch.device(device_type))[0]


@torch.compiler.assume_constant_result  # evaluated eagerly under torch.compile: imports are not traceable
def select_backend(requested: Optional[str], device: torch.device) -> str:
    """The backend to run on ``device``: the requested one, else $CSD_KERNELS_BACKEND, else the first available."""
    source = "backend"
    if requested is None and os.environ.get(ENV_BACKEND):
        requested, source = os.environ[ENV_BACKEND], ENV_BACKEND
    if requested is None:
        return _first_available(device.type, device.index)
    return _checked(requested, source, device)


@functools.lru_cache(maxsize=None)  # success only (a refusal raises, so it is asked again): asked on every call
def _checked(requested: str, source: str, device: torch.device) -> str:
    if requested not in BACKENDS:
        raise ValueError(f"{source}={requested!r} is not one of {BACKENDS}")
    ok, reason = backend_status(requested, device)
    if not ok:
        raise RuntimeError(f"{source}={requested!r} cannot run here: {reason}")
    return requested


# ----------------------------------------------------------------------------------------------------------------------
# verify_tree: verify's choice, limited to the backends that have a tree verification here
# ----------------------------------------------------------------------------------------------------------------------
def tree_support(name: str) -> tuple[bool, str]:
    """(has a tree verification, reason if not) for backend ``name`` (whether it can run at all: backend_status)."""
    if name in ("cpu", "cuda") and not has_tree():
        return False, ("csd_kernels._C has no verify_tree_rows (built before the tree op); rebuild it with "
                       "`pip install --no-build-isolation -e .`")
    if name == "triton":
        try:
            import csd_kernels.backends.triton.verify_tree  # noqa: F401
        except Exception as exc:  # noqa: BLE001 - any import failure means "not available", with the reason kept
            return False, f"csd_kernels.backends.triton.verify_tree could not be imported ({exc})"
    return True, ""


@functools.lru_cache(maxsize=None)
def _first_tree_backend(device: torch.device) -> str:
    return next(name for name in available_backends(device) + ["torch"] if tree_support(name)[0])


@torch.compiler.assume_constant_result  # evaluated eagerly under torch.compile: imports are not traceable
def select_tree_backend(requested: Optional[str], device: torch.device) -> str:
    """The backend that verifies trees on ``device``: as select_backend, among those with a tree verification."""
    if requested is None and not os.environ.get(ENV_BACKEND):
        return _first_tree_backend(device)
    chosen = select_backend(requested, device)
    ok, reason = tree_support(chosen)
    if not ok:
        raise RuntimeError(f"backend={chosen!r} cannot verify trees here: {reason}")
    return chosen
