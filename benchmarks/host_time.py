"""Host time of one eager ``ck.verify`` call on the Triton backend: the Python path, with the launches stubbed.

Without a GPU (``--stub``, the default here): Triton gets a stand-in driver (an sm_90 target, stream 0) and every
compile yields a stub kernel whose launch does nothing, so a call runs ALL of its host code — argument checks,
allocations, the path plan, Triton's argument binder and cache lookup (or the direct launcher), the launch call —
except the C launcher's own argument packing and the driver call. Tensors live on the CPU (their allocations stand in
for the CUDA caching allocator's). With a GPU (``--cuda``): real launches on CUDA tensors, ``validate=False``, no
synchronisation inside the timed loop (the launches queue; host time only).

Reports the median and the 10th percentile over ``--calls`` calls (after warm-up) per case, in µs, as JSON lines and
a table (on a loaded machine the 10th percentile is the steadier figure).
``--compare DIR``: the same benchmark alternately in this tree and in another checkout DIR (``--rounds`` processes
each, interleaved, so that both see the same load), then the median over the rounds of each round's median and p10.
Usage: python benchmarks/host_time.py [--cuda] [--calls 1000] [--out DIR] [--compare DIR [--rounds 4]]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

CASES = [  # (name, B, L, V, kwargs of verify)
    ("csd cfg q", 1, 16, 16384, dict(cfg=True, q=True, rule="csd")),
    ("strict", 4, 16, 16384, dict(cfg=False, q=False, rule="strict")),
    ("top-k", 1, 16, 16384, dict(cfg=True, q=True, rule="csd", top_k=1000)),
]


def _install_stub_driver():
    """A Triton driver that compiles nothing and launches nothing (see the module docstring)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.runtime import jit

    class _StubKernel:
        function = None
        packed_metadata = None
        launches = 0
        record = None  # a list to append each launch's arguments to (tests)

        def run(self, *args):  # the launcher: grid, stream, function, metadata, hooks, *kernel args
            _StubKernel.launches += 1
            if _StubKernel.record is not None:
                _StubKernel.record.append(args)

        def launch_metadata(self, grid, stream, *args):
            return None

    class _StubDriver:
        def get_current_device(self):
            return 0

        def get_current_stream(self, device=None):
            return 0

        def get_current_target(self):
            return GPUTarget("cuda", 90, 32)

        def get_active_torch_device(self):
            import torch

            return torch.device("cpu")

        def is_active(self):
            return True

    def _stub_compile(self, key, signature, device, constexprs, options, attrs, warmup):
        kernel = self.device_caches[device][0][key] = _StubKernel()
        return kernel

    triton.runtime.driver.set_active(_StubDriver())
    jit.JITFunction._do_compile = _stub_compile
    return _StubKernel


def _inputs(batch, length, vocab, device, cfg, q, **_):
    import torch

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(batch, length, vocab, generator=g).to(device=device, dtype=torch.bfloat16)
    uncond = torch.randn(batch, length, vocab, generator=g).to(device=device, dtype=torch.bfloat16) if cfg else None
    probs = torch.softmax(torch.randn(batch, length, vocab, generator=g), -1).to(device) if q else None
    drafts = torch.randint(0, vocab, (batch, length), generator=g).to(device)
    return logits, drafts, probs, uncond


def _time_case(ck, device, batch, length, vocab, options, calls):
    logits, drafts, probs, uncond = _inputs(batch, length, vocab, device, **options)
    kwargs = dict(uncond_logits=uncond, cfg_scale=3.0 if uncond is not None else 1.0, rule=options["rule"],
                  top_k=options.get("top_k"), return_probs=True, backend="triton", validate=False)
    step = 0

    def call():
        nonlocal step
        step += 1
        ck.verify(logits, drafts, probs, seed=7, offset=step, **kwargs)

    for _ in range(20):
        call()
    if device == "cuda":
        import torch

        torch.cuda.synchronize()  # compiled and idle before timing; the timed calls never wait for the GPU
    times = []
    for _ in range(calls):
        begin = time.perf_counter_ns()
        call()
        times.append(time.perf_counter_ns() - begin)
    if device == "cuda":
        torch.cuda.synchronize()
    times.sort()
    return statistics.median(times) / 1e3, times[len(times) // 10] / 1e3


def _compare(other: Path, rounds: int, calls: int, cuda: bool) -> int:
    """Interleaved runs of this script in ``other`` (before) and in this tree (after); prints one table."""
    trees = {"before": other.resolve(), "after": Path(__file__).resolve().parent.parent}
    rows: dict = {name: {} for name in trees}
    for round_ in range(rounds):
        for name in (("before", "after") if round_ % 2 == 0 else ("after", "before")):
            command = [sys.executable, "benchmarks/host_time.py", "--calls", str(calls)] + (["--cuda"] if cuda else [])
            env = {**os.environ, "PYTHONPATH": str(trees[name])}
            out = subprocess.run(command, cwd=trees[name], env=env, capture_output=True, text=True, check=True).stdout
            for row in (json.loads(line) for line in out.splitlines() if line.startswith("{")):
                rows[name].setdefault(row["case"], []).append((row["median_us"], row["p10_us"]))
    print(f"{'case':<12} {'before: median':>15} {'p10':>6} {'after: median':>14} {'p10':>6}   (µs; median of {rounds} "
          f"interleaved runs of {calls} calls)")
    for case, before in rows["before"].items():
        after = rows["after"][case]
        cells = [round(statistics.median(r[i] for r in runs), 1) for runs in (before, after) for i in (0, 1)]
        print(f"{case:<12} {cells[0]:>15} {cells[1]:>6} {cells[2]:>14} {cells[3]:>6}")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cuda", action="store_true", help="real launches on a GPU instead of the stub driver")
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--compare", type=Path, default=None, help="another checkout to run interleaved (before)")
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args(argv)
    if args.compare:
        return _compare(args.compare, args.rounds, args.calls, args.cuda)
    if not args.cuda:
        os.environ["TRITON_INTERPRET"] = "0"
        stub = _install_stub_driver()
    import torch

    torch.set_num_threads(1)
    import csd_kernels as ck
    from csd_kernels.backends.triton import verify as triton_verify

    device = "cuda" if args.cuda else "cpu"
    if not args.cuda:  # the stub driver stands in for CUDA: let the triton backend take CPU tensors
        triton_verify.is_available = lambda _device: (True, "")
    rows = []
    for name, batch, length, vocab, options in CASES:
        median, best = _time_case(ck, device, batch, length, vocab, options, args.calls)
        rows.append(dict(case=name, B=batch, L=length, V=vocab, median_us=round(median, 1), p10_us=round(best, 1),
                         device="cuda" if args.cuda else "stub", calls=args.calls))
        print(json.dumps(rows[-1]), flush=True)
    if not args.cuda:
        print(f"(stub launches: {stub.launches})", file=sys.stderr)
    print(f"\n{'case':<12} {'B':>3} {'L':>3} {'V':>6} {'median µs':>10} {'p10 µs':>8}")
    for r in rows:
        print(f"{r['case']:<12} {r['B']:>3} {r['L']:>3} {r['V']:>6} {r['median_us']:>10} {r['p10_us']:>8}")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "host_time.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
