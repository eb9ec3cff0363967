"""The static loop on this CPU: digits wall time per image, and the loops' host time per iteration at a
Janus-Pro-7B shape on the meta device (no compute at all: the host's share of a GPU iteration).

    python benchmarks/static_loop_cpu.py [--images 4] [--modes ar,csd] [--skip-compile] [--out FILE.json]

1. Digits (the shipped model, its zoo defaults, B = 1): seconds per image of ``static=False`` (today's loop),
   ``static=True`` and ``static=True, compile=True`` (inductor), after one warm-up image per setting (its time, the
   compile included, is reported as ``first_call_s``); the pass counts of the three are equal by construction and
   reported as a check.
2. Meta device, Janus-Pro-7B shape (loop_shapes.py), bf16, CFG 5: host milliseconds per iteration of each loop with
   verify's fake implementation (the kernels' launch cost is not included), over the first iterations after two
   warm-up ones: the per-row loop with a fixed accept length of 3 per iteration (its sync is replaced), the static
   loop's iteration called directly. Meta kernels are shape functions, many of them in Python: per op they cost more
   host time than a CUDA launch, so read the ratio of the loops, not the milliseconds.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode

LOOPS = {"eager": dict(), "static": dict(static=True), "static+compile": dict(static=True, compile=True)}


def digits_wall(images: int, modes: list[str], skip_compile: bool) -> dict:
    """Per mode: one warm-up image per loop (first_call_s), then the images with the loops interleaved (image i by
    every loop in turn, so that a change in the machine's load hits all loops alike). Wall seconds and this
    process's CPU seconds (one thread: the work, whatever else runs on the machine) per image."""
    from csd_kernels import generate, zoo

    entry = zoo.load("digits")
    loops = {k: v for k, v in LOOPS.items() if not (skip_compile and v.get("compile"))}
    results = {}
    for mode in modes:
        settings = {loop: {**entry.defaults, "mode": mode, **extra} for loop, extra in loops.items()}
        first = {}
        for loop, kw in settings.items():
            begin = time.perf_counter()
            generate(entry.model, **entry.prompt_inputs(["0"]), seed=999, **kw)
            first[loop] = time.perf_counter() - begin
        wall, cpu, passes = dict.fromkeys(loops, 0.0), dict.fromkeys(loops, 0.0), {loop: [] for loop in loops}
        for i in range(images):
            for loop, kw in settings.items():
                begin, begin_cpu = time.perf_counter(), time.process_time()
                out = generate(entry.model, **entry.prompt_inputs([str(i % 10)]), seed=i, **kw)
                wall[loop] += time.perf_counter() - begin
                cpu[loop] += time.process_time() - begin_cpu
                passes[loop].append(out.forward_passes)
        for loop in loops:
            row = dict(s_per_image=wall[loop] / images, cpu_s_per_image=cpu[loop] / images,
                       passes_per_image=float(np.mean(passes[loop])), first_call_s=first[loop],
                       cpu_speedup_vs_eager=cpu["eager"] / cpu[loop], wall_speedup_vs_eager=wall["eager"] / wall[loop])
            row["cpu_ms_per_iteration"] = 1e3 * row["cpu_s_per_image"] / row["passes_per_image"]
            results[f"{mode}/{loop}"] = row
            print(f"digits {mode:4s} {loop:15s} wall {row['s_per_image']:6.3f} s/image "
                  f"({row['wall_speedup_vs_eager']:4.2f}x)  cpu {row['cpu_s_per_image']:6.3f} s/image "
                  f"({row['cpu_speedup_vs_eager']:4.2f}x)  "
                  f"{row['passes_per_image']:6.1f} passes  {row['cpu_ms_per_iteration']:6.2f} cpu ms/iteration  "
                  f"first call {row['first_call_s']:6.1f} s", flush=True)
    return results


def _fake_verify():
    """verify's fake implementation for every backend (the meta device runs no kernel)."""
    from csd_kernels.ops import verify as ops

    for name in list(ops._BACKEND_FUNCTIONS):
        ops._BACKEND_FUNCTIONS[name] = ops.fake_backend


def meta_host_time(batches: list[int], modes: list[str], iterations: int = 5, layers: int = 30) -> dict:
    """Host ms per iteration of each loop; ``layers`` < 30 cuts the model (a quick run: tests, the GPU check's dry
    run)."""
    from csd_kernels.ops import verify as ops

    backends = dict(ops._BACKEND_FUNCTIONS)
    try:
        return _meta_host_time(batches, modes, iterations, layers)
    finally:
        ops._BACKEND_FUNCTIONS.update(backends)  # verify's real backends again


def _meta_host_time(batches: list[int], modes: list[str], iterations: int, layers: int) -> dict:
    import loop_shapes

    from csd_kernels import generate
    from csd_kernels.decoding import eager as eager_module
    from csd_kernels.decoding import static as static_module
    from csd_kernels.decoding.state import EagerState

    _fake_verify()
    model = loop_shapes.janus_pro_7b("meta", layers=layers)
    results = {}

    def eager_read(state, committed, run, m, end, active):  # a fixed accept length instead of the sync
        new = [min(m + min(3, end - m - 1) + 1, min(c + run.window, run.total)) if a else c
               for c, a in zip(state.counts, active)]
        state.accepted.append([b - a for a, b in zip(state.counts, new)])
        state.counts = new

    class Stop(Exception):
        pass

    timed = {}

    def static_run(loop, bar=None):
        for _ in range(3):
            loop._step()
        begin = time.perf_counter()
        for _ in range(iterations):  # the flags' copy (one more op per iteration) cannot leave meta
            loop._step()
        timed["static"] = (time.perf_counter() - begin) / iterations
        with _OpCount() as count:
            loop._step()
        timed["static_ops"] = count.ops
        raise Stop

    calls, op_counts = [], []

    def eager_done(state, total):  # the per-row loop: 2 warm-up iterations, then ``iterations`` timed ones
        calls.append(time.perf_counter())
        op_counts.append(_OpCount.active.ops if _OpCount.active is not None else 0)
        return len(calls) > 2 + iterations

    for batch in batches:
        ids = loop_shapes.janus_prompt(batch, "meta")
        for mode in modes:
            kw = dict(mode=mode, window=16, cfg_scale=5.0, seed=0)
            originals = eager_module.read_counts, static_module.StaticLoop.run, EagerState.done
            eager_module.read_counts, static_module.StaticLoop.run, EagerState.done = eager_read, static_run, eager_done
            try:
                with _OpCount():
                    calls.clear(), op_counts.clear()
                    generate(model, ids, **kw)
                eager_ops = (op_counts[-1] - op_counts[2]) / iterations
                calls.clear(), op_counts.clear()
                generate(model, ids, **kw)
                try:
                    generate(model, ids, static=True, **kw)
                except Stop:
                    pass
            finally:
                eager_module.read_counts, static_module.StaticLoop.run, EagerState.done = originals
            eager_ms = 1e3 * (calls[-1] - calls[2]) / iterations
            static_ms = 1e3 * timed["static"]
            results[f"B{batch}/{mode}"] = dict(
                eager_ms_per_iteration=eager_ms, static_ms_per_iteration=static_ms,
                eager_over_static=eager_ms / static_ms, eager_ops_per_iteration=eager_ops,
                static_ops_per_iteration=timed["static_ops"])
            print(f"meta Janus-Pro-7B B={batch} {mode:4s} host ms/iteration: eager {eager_ms:6.2f}  static "
                  f"{static_ms:6.2f}  ({eager_ms / static_ms:4.2f}x); aten ops/iteration: eager {eager_ops:.0f}  "
                  f"static {timed['static_ops']}", flush=True)
    return results


class _OpCount(TorchDispatchMode):
    """Counts aten calls inside a ``with`` block (the host work a GPU iteration launches, kernel by kernel)."""

    active = None

    def __enter__(self):
        self.ops = 0
        _OpCount.active = self
        return super().__enter__()

    def __exit__(self, *exc):
        _OpCount.active = None
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        return func(*args, **(kwargs or {}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=4)
    parser.add_argument("--modes", default="ar,csd")
    parser.add_argument("--batches", default="1,8", help="meta-device batch sizes")
    parser.add_argument("--skip-compile", action="store_true")
    parser.add_argument("--skip-digits", action="store_true")
    parser.add_argument("--skip-meta", action="store_true")
    parser.add_argument("--layers", type=int, default=30, help="meta: the model's layers (fewer: a quick run)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    modes = args.modes.split(",")
    report = {"threads": args.threads, "torch": torch.__version__}
    if not args.skip_digits:
        report["digits"] = digits_wall(args.images, modes, args.skip_compile)
    if not args.skip_meta:
        report["meta_janus_pro_7b"] = meta_host_time([int(b) for b in args.batches.split(",")], modes,
                                                      layers=args.layers)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
