"""The direct Triton launch (csd_kernels.backends.triton.launch) passes the launcher exactly what Triton's own path
passes.

Runs in a subprocess with Triton's interpreter off and the stub driver of benchmarks/host_time.py (an sm_90 target
whose launches record their arguments): the first call of a shape goes through Triton's binder, the second through
the cached kernel; both must hand the launcher the same arguments (tensors compared by dtype and shape, the
workspace by identity). A misaligned input must not reuse a kernel specialized for aligned pointers.
"""

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")
ROOT = Path(__file__).resolve().parent.parent

SCRIPT = r"""
import os, sys
os.environ["TRITON_INTERPRET"] = "0"
sys.path.insert(0, "benchmarks")
import host_time
stub = host_time._install_stub_driver()
import torch
import csd_kernels as ck
from csd_kernels.backends.triton import verify as triton_verify
triton_verify.is_available = lambda device: (True, "")
from triton.runtime import jit
binder_runs = []
_run = jit.JITFunction.run
def counted_run(self, *args, **kwargs):
    binder_runs.append(self)
    return _run(self, *args, **kwargs)
jit.JITFunction.run = counted_run

def describe(args):
    return [(a.dtype, tuple(a.shape), a.stride()) if isinstance(a, torch.Tensor) else a for a in args]

def calls(kwargs, logits, drafts, q):
    stub.record = []
    seed, offset = torch.tensor([5]), torch.tensor([2])
    runs = []
    for _ in range(2):
        binder_runs.clear()
        ck.verify(logits, drafts, q, seed=seed, offset=offset, backend="triton", validate=False, **kwargs)
        runs.append(len(binder_runs))
    assert runs == [2, 0], runs  # the first call binds both launches, the second launches directly
    first, second = stub.record[: len(stub.record) // 2], stub.record[len(stub.record) // 2:]
    assert len(first) == len(second) == 2, len(stub.record)
    for a, b in zip(first, second):
        assert a[:3] == b[:3] and a[3] == b[3], (a[:4], b[:4])  # grid, stream
        assert describe(a[9:]) == describe(b[9:]), (describe(a[9:]), describe(b[9:]))
    return stub.record

g = torch.Generator().manual_seed(0)
for vocab, kwargs in [(300, dict(rule="csd")), (300, dict(top_k=5, coupling="gumbel")), (70000, dict(top_k=3)),
                      (300, dict(top_p=0.9, temperature=0.7, rule="strict")), (300, dict(temperature=0))]:
    logits = torch.randn(2, 4, vocab, generator=g)
    q = torch.softmax(torch.randn(2, 4, vocab, generator=g), -1)
    drafts = torch.randint(0, vocab, (2, 4), generator=g)
    calls(kwargs, logits, drafts, q)
    keys = len(triton_verify._WORKSPACES)
    misaligned = torch.randn(2 * 4 * vocab + 1, generator=g)[1:].reshape(2, 4, vocab)  # 4 bytes off
    calls(kwargs, misaligned, drafts, q)
    assert len(triton_verify._WORKSPACES) > keys, "a misaligned input reused an aligned specialization"
print("ok")
"""


def test_direct_launch_passes_what_tritons_binder_passes():
    result = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True, text=True, timeout=300,
                            env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr[-3000:]


WORDS_SCRIPT = SCRIPT.split("def describe")[0] + r"""
signatures = []
_compile = jit.JITFunction._do_compile
def recording(self, key, signature, *args, **kwargs):
    signatures.append(signature)
    return _compile(self, key, signature, *args, **kwargs)
jit.JITFunction._do_compile = recording
g = torch.Generator().manual_seed(0)
for kwargs in [dict(rule="csd"), dict(top_k=5, coupling="gumbel")]:
    logits, drafts = torch.randn(2, 4, 300, generator=g), torch.randint(0, 300, (2, 4), generator=g)
    runs = []
    for seed, offset in [(1, 1), (16, 2), (7, 3), (2**40, 2**40), (2**63 - 1, 2**41)]:
        binder_runs.clear()
        stub.record = []
        ck.verify(logits, drafts, None, seed=seed, offset=offset, backend="triton", validate=False, **kwargs)
        runs.append(len(binder_runs))
        ints = [a for args in stub.record for a in args[9:] if type(a) is int]  # the launches' integer arguments
        assert seed in ints and offset in ints, (seed, offset, ints)
    # 1 and 16 are not specialized on; a value past int32 is typed i64: its own kernel, reused by every i64 value
    assert runs[1:3] == [0, 0] and runs[3] > 0 and runs[4] == 0, runs
    for signature in signatures:
        for name in ("seed_ptr", "offset_ptr"):
            assert signature.get(name, "i64") in ("i32", "i64"), signature
print("ok")
"""


def test_int_seed_and_offset_are_kernel_arguments_never_specialized_on():
    """An eager call's int seed / offset reach the kernels as arguments (no fill kernels): the direct launch may
    reuse a kernel compiled for another value only if Triton specialized on neither value (1 would become a constant,
    a multiple of 16 a hint) and the value's type (i32 or i64) is in the launch key."""
    result = subprocess.run([sys.executable, "-c", WORDS_SCRIPT], cwd=ROOT, capture_output=True, text=True,
                            timeout=300, env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr[-3000:]


def test_a_replaced_plan_gets_its_own_workspace(monkeypatch):
    """The workspace cache is keyed by the plan too: forcing a path (as tests/test_triton_kernel.py does) after a call
    of the same shape must run that path, not the cached one."""
    from csd_kernels import testing
    from csd_kernels.backends.triton import verify as tv

    if not tv.is_available("cpu")[0]:
        pytest.skip("the triton interpreter is off")
    case = testing.make_case(1, 2, 64, cfg=False, q="dense", seed=0)
    args = testing.backend_args(case, rule="strict", return_probs=False)
    launched = []
    launch = tv.launch
    monkeypatch.setattr(tv, "launch", lambda kernel, *a, **k: (launched.append(kernel), launch(kernel, *a, **k)))
    tv.verify_triton(args)
    assert launched[0] is tv.split.split_stats_kernel
    launched.clear()
    monkeypatch.setattr(tv, "plan", lambda *a, **k: tv.Plan("register", 64, 4))
    tv.verify_triton(args)
    assert launched[0] is tv.register.position_kernel
