"""``import csd_kernels`` imports no torch, and its public names cost about ``import torch``: the heavy optional
modules (torch._dynamo and triton with it, transformers, matplotlib) load only when used, which each test checks in
a fresh interpreter by the modules loaded, not by a timing (benchmarks/import_cost.py measures the seconds)."""

import functools
import json
import os
import subprocess
import sys

import torch

from csd_kernels.ops.registry import constant_under_compile

HEAVY = ("torch._dynamo", "triton", "transformers", "matplotlib")


@functools.lru_cache(maxsize=None)  # each statement runs once per session (an interpreter costs seconds)
def _modules_after(statement: str) -> frozenset:
    """sys.modules of a fresh interpreter after ``statement`` (this process's environment, so the same package)."""
    code = f"import json, sys\n{statement}\nprint(json.dumps(sorted(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                            env=dict(os.environ))
    assert result.returncode == 0, result.stderr[-3000:]
    return frozenset(json.loads(result.stdout.splitlines()[-1]))


def test_a_bare_import_loads_no_torch():
    """``import csd_kernels`` resolves its public names on first use (so that ``csd --version`` needs no torch)."""
    loaded = _modules_after("import csd_kernels\nassert 'verify' in dir(csd_kernels)")
    assert sorted(name for name in ("torch", *HEAVY) if name in loaded) == []


def test_importing_the_ops_registers_them_without_heavy_modules():
    loaded = _modules_after("import torch, csd_kernels.ops\n"
                            "assert hasattr(torch.ops.csd_kernels, 'verify') and hasattr(torch.ops.csd_kernels,"
                            " 'verify_tree')")
    assert sorted(name for name in HEAVY if name in loaded) == []


def test_public_names_work_without_heavy_modules():
    """The public API resolves (and ck.verify runs on the CPU) without loading any of them."""
    loaded = _modules_after(
        "import torch, csd_kernels as ck\n"
        "from csd_kernels import (available_backends, chain_speculative_sampling, generate, rejection_sample, verify,"
        " verify_tree)\n"
        "import csd_kernels.models, csd_kernels.zoo\n"
        "from csd_kernels.models import get_adapter, load_janus_pro, load_llamagen\n"
        "from csd_kernels.zoo import load\n"
        "logits = torch.randn(2, 4, 50)\n"
        "ck.verify(logits, torch.randint(0, 50, (2, 4)), torch.softmax(torch.randn(2, 4, 50), -1), seed=1,"
        " backend='torch')\n"
    )
    assert sorted(name for name in HEAVY if name in loaded) == []


def test_import_loads_nothing_beyond_torch_but_the_standard_library():
    """A new third-party import at the top of any module on the path (scipy, PIL, ...) shows up here."""
    extra = (_modules_after("import torch, csd_kernels\nfor name in csd_kernels.__all__: getattr(csd_kernels, name)")
             - _modules_after("import torch"))
    third_party = sorted(name for name in extra
                         if name.split(".")[0] not in sys.stdlib_module_names and name.split(".")[0] != "csd_kernels")
    assert third_party == []


def test_constant_under_compile_marks_as_torch_does():
    """constant_under_compile stands in for torch.compiler.assume_constant_result (which imports torch._dynamo):
    both must leave a function marked the same way, or torch.compile would trace the backend choice's imports."""
    def ours():
        return 1

    def torchs():
        return 1

    assert constant_under_compile(ours) is ours
    assert torch.compiler.assume_constant_result(torchs) is torchs
    assert vars(ours) == vars(torchs) != {}
