"""The verify microbenchmarks as pytest-benchmark cases: per shape, the read-once floor, the CSD authors' loop and
every backend (with and without the probs output), so that every ratio comes from one run.

Run by ``csd bench`` and ``benchmarks/bench_verify.py`` (``pytest <this file> --benchmark-json=...``, settings in
the environment: CSD_BENCH_DEVICE, CSD_BENCH_BACKENDS (comma-separated), CSD_BENCH_QUICK=1 for two shapes,
CSD_BENCH_SHAPES="B,L,V;B,L,V" for others).
"""

from __future__ import annotations

import functools
import os

import pytest
import torch

from csd_kernels.bench import op as bench
from csd_kernels.ops.registry import available_backends
from csd_kernels.ops.verify import verify

DEVICE = torch.device(os.environ.get("CSD_BENCH_DEVICE", "cuda" if torch.cuda.is_available() else "cpu"))
SHAPES = bench.QUICK_SHAPES if os.environ.get("CSD_BENCH_QUICK") == "1" else bench.DEFAULT_SHAPES
if os.environ.get("CSD_BENCH_SHAPES"):
    SHAPES = [tuple(int(x) for x in shape.split(",")) for shape in os.environ["CSD_BENCH_SHAPES"].split(";")]
BACKENDS = [b for b in os.environ.get("CSD_BENCH_BACKENDS", "").split(",") if b] or [
    name for name in available_backends(DEVICE) if not (name == "triton" and DEVICE.type == "cpu")]
_IDS = [f"B{b}-L{length}-V{v}" for b, length, v in SHAPES]


@functools.lru_cache(maxsize=None)
def _inputs(shape):
    return bench.make_inputs(*shape, DEVICE)


def _synced(fn):
    def call():
        out = fn()
        if DEVICE.type == "cuda":
            torch.cuda.synchronize(DEVICE)
        return out
    return call


def _tag(benchmark, kind: str, shape, backend=None, probs=None) -> None:
    batch, length, vocab = shape
    benchmark.extra_info.update(kind=kind, batch=batch, length=length, vocab=vocab, backend=backend,
                                return_probs=probs, device=str(DEVICE))


@pytest.mark.parametrize("shape", SHAPES, ids=_IDS)
def test_read_once(benchmark, shape):
    cond, uncond, q, _ = _inputs(shape)
    _tag(benchmark, "read-once", shape)
    benchmark(_synced(lambda: (cond.sum(), uncond.sum(), q.sum())))


@pytest.mark.parametrize("shape", SHAPES, ids=_IDS)
def test_authors_loop(benchmark, shape):
    cond, uncond, q, drafts = _inputs(shape)
    _tag(benchmark, "authors-loop", shape)
    benchmark.pedantic(_synced(lambda: bench.authors_python_loop(cond, uncond, q, drafts)), rounds=3, warmup_rounds=1)


@pytest.mark.parametrize("probs", [True, False], ids=["probs", "noprobs"])
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("shape", SHAPES, ids=_IDS)
def test_verify(benchmark, shape, backend, probs):
    cond, uncond, q, drafts = _inputs(shape)
    _tag(benchmark, "verify", shape, backend, probs)
    benchmark(_synced(lambda: verify(cond, drafts, q, uncond_logits=uncond, cfg_scale=5.0, rule="csd", seed=0,
                                     return_probs=probs, backend=backend, validate=False)))
