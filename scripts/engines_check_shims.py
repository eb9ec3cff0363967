"""pytest plugin for scripts/engines_check.sh (not CI): runs an engine's own test files on a CPU, with or without
csd_kernels' function swapped in.

Always: vLLM's platform, unresolved on a machine without a GPU, gets device_type "cpu" (vLLM's tests put their tensors
there) and vLLM's Triton kernels run under TRITON_INTERPRET=1 (set by the script before triton is imported).
CSD_SHIM_CUDA=1: the CPU shims for tests written for CUDA (vLLM's MRV2 tests skip without it): torch.cuda.is_available()
answers True and a TorchFunctionMode maps device "cuda" to "cpu" in factory calls and .to() / .cuda().
CSD_SWAP=vllm: loads csd_kernels' plugin through vLLM's own loader (CSD_KERNELS_VLLM set by the script) and rebinds
``rejection_sample`` in every collected test module that imported vLLM's by name.
Every test's report gets a property ``csd_calls``: how many calls reached csd_kernels' adapters (0: never reaches ours).
"""

from __future__ import annotations

import functools
import os

import pytest
import torch
from torch.overrides import TorchFunctionMode

_CALLS = {"n": 0}


class _CudaToCpu(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if _is_cuda(kwargs.get("device")):
            kwargs["device"] = "cpu"
        name = getattr(func, "__name__", "")
        if name == "cuda":
            return args[0]
        if name == "to":
            args = tuple("cpu" if _is_cuda(a) else a for a in args)
        return func(*args, **kwargs)


def _is_cuda(device) -> bool:
    return (isinstance(device, str) and device.startswith("cuda")) or \
        (isinstance(device, torch.device) and device.type == "cuda")


if os.environ.get("CSD_SHIM_CUDA") == "1":
    torch.cuda.is_available = lambda: True
    torch.cuda.synchronize = lambda *a, **k: None
    _CudaToCpu().__enter__()


def pytest_configure(config):
    """vLLM's CUDA wheel on a machine without a GPU resolves no platform (device_type ""): its tests' tensors go on the
    CPU. (vLLM's own Triton kernels do not launch there, not even under TRITON_INTERPRET=1: its launch helper takes
    the interpreter's kernels for plain functions.)"""
    from vllm.platforms import current_platform

    if not current_platform.device_type:
        current_platform.device_type = "cpu"



def _counting(function):
    @functools.wraps(function)  # the plugin checks the signature of ours
    def counted(*args, **kwargs):
        _CALLS["n"] += 1
        return function(*args, **kwargs)
    return counted


def pytest_collection_modifyitems(session, config, items):
    if os.environ.get("CSD_SWAP") != "vllm":
        return
    from vllm.plugins import load_general_plugins

    from csd_kernels.integrations import vllm as v1
    from csd_kernels.integrations import vllm_mrv2

    v1.rejection_sample = _counting(v1.rejection_sample)
    vllm_mrv2.rejection_sample = _counting(vllm_mrv2.rejection_sample)
    load_general_plugins()
    import importlib

    swapped = {}
    for name in (v1.V1_MODULE,) + vllm_mrv2.MRV2_MODULES:
        function = importlib.import_module(name).rejection_sample
        assert hasattr(function, "csd_kernels_original"), f"the plugin did not rebind {name}"
        swapped[id(function.csd_kernels_original)] = function
    for module in {item.module for item in items if getattr(item, "module", None) is not None}:
        current = getattr(module, "rejection_sample", None)
        if current is not None and id(current) in swapped:
            module.rejection_sample = swapped[id(current)]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    if call.when == "setup":
        _CALLS["n"] = 0
    outcome = yield
    if call.when == "call" or (call.when == "setup" and outcome.get_result().failed):
        outcome.get_result().user_properties.append(("csd_calls", _CALLS["n"]))
