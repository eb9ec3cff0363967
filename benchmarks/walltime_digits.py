"""Wall time next to forward passes on the digits model (CPU), and where the loop's own time ("rest") goes.

    python benchmarks/walltime_digits.py [--threads 1] [--seeds 0,1] [--out docs/img/digits_walltime.json]

Runs ar, sjd+maximal and csd (the zoo defaults: λ 0.5, τ 0.65, maximal coupling) at B = 1 (the ten classes, one
image per call) and B = 16 (the ten classes cycled, one call) per seed, and reports passes per image, forward calls
per call, wall seconds per call and per image, and ``out.timings`` (model / verify / rest) per loop iteration:
"rest" is the loop's own time, outside the model forward and the verify op.

Then profiles csd at B = 1 (ten images) with cProfile and lists the functions of the loop's own modules
(csd_kernels.decoding, .drafts, .models.protocol) by their own time, and torch calls made from those modules: the
"rest" by where it goes.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import time

import numpy as np
import torch

from csd_kernels.bench.frontier import summarise

RUNS = [("ar", dict(mode="ar")), ("sjd+maximal", dict(mode="sjd", coupling="maximal")), ("csd", dict(mode="csd"))]
LOOP_MODULES = (os.sep.join(("csd_kernels", "decoding")), os.sep.join(("csd_kernels", "ops", "drafts.py")),
                os.sep.join(("csd_kernels", "models", "protocol.py")))


def timed_runs(entry, batch: int, seeds: list[int]) -> dict:
    """label -> mean ± std over seeds of passes, wall and per-iteration timings at batch size ``batch``."""
    from csd_kernels import generate

    prompts = [str(c % 10) for c in range(10 if batch == 1 else batch)]
    chunks = [prompts[i:i + batch] for i in range(0, len(prompts), batch)]
    results = {}
    for label, kwargs in RUNS:
        records = []
        for seed in seeds:
            passes, calls, totals = [], [], {"model": 0.0, "verify": 0.0, "rest": 0.0}
            begin = time.perf_counter()
            for i, chunk in enumerate(chunks):
                out = generate(entry.model, **entry.prompt_inputs(chunk), seed=seed * 100 + i * batch,
                               **{**entry.defaults, **kwargs})
                passes.extend(out.passes_per_row().tolist())
                calls.append(out.forward_passes)
                for key in totals:
                    totals[key] += out.timings[key]
            wall = time.perf_counter() - begin
            iterations = sum(calls)
            records.append({"passes_per_image": float(np.mean(passes)), "passes_per_call": float(np.mean(calls)),
                            "wall_per_call": wall / len(chunks), "wall_per_image": wall / len(prompts),
                            **{f"{k}_ms_per_iteration": 1e3 * v / iterations for k, v in totals.items()},
                            "rest_over_model": totals["rest"] / totals["model"]})
        results[label] = summarise(records)
    return results


def profile_loop(entry, top: int = 20) -> dict:
    """cProfile of csd at B = 1, ten images: the loop modules' functions and the torch calls they make."""
    from csd_kernels import generate

    profiler = cProfile.Profile()
    iterations = 0
    profiler.enable()
    for c in range(10):
        iterations += generate(entry.model, **entry.prompt_inputs([str(c)]), seed=c, **entry.defaults).forward_passes
    profiler.disable()
    rows = []
    for (path, line, name), (_, calls, own, cumulative, callers) in pstats.Stats(profiler).stats.items():
        if path == "~":  # a builtin (torch op): count only the calls made from the loop's modules
            mine = [v for c, v in callers.items() if any(m in c[0] for m in LOOP_MODULES)]
            calls, own, cumulative = sum(v[1] for v in mine), sum(v[2] for v in mine), sum(v[3] for v in mine)
        elif not any(m in path for m in LOOP_MODULES):
            continue
        if calls:
            where = "builtin" if path == "~" else f"{path.split('csd_kernels' + os.sep)[-1]}:{line}"
            rows.append({"function": f"{name} ({where})", "calls": calls,
                         "own_ms_per_iteration": 1e3 * own / iterations,
                         "cumulative_ms_per_iteration": 1e3 * cumulative / iterations})
    rows.sort(key=lambda r: -r["own_ms_per_iteration"])
    return {"iterations": iterations, "functions": rows[:top]}


def format_report(report: dict) -> str:
    lines = [f"torch threads {report['threads']}, load average {report['load_average'][0]:.2f}", "",
             "| run | B | passes / image | forward calls / call | wall s / call | wall s / image | model ms / it | "
             "verify ms / it | rest ms / it | rest / model |", "|---|---|---|---|---|---|---|---|---|---|"]
    for key, batch in (("B1", 1), ("B16", 16)):
        for label, r in report[key].items():
            pm = lambda k, f: f"{format(r[k]['mean'], f)} ± {format(r[k]['std'], f)}"  # noqa: E731
            lines.append(f"| {label} | {batch} | {pm('passes_per_image', '.1f')} | {pm('passes_per_call', '.1f')} | "
                         f"{pm('wall_per_call', '.2f')} | {pm('wall_per_image', '.3f')} | "
                         f"{pm('model_ms_per_iteration', '.2f')} | {pm('verify_ms_per_iteration', '.3f')} | "
                         f"{pm('rest_ms_per_iteration', '.3f')} | {r['rest_over_model']['mean']:.0%} |")
    prof = report["profile"]
    lines += ["", f"cProfile, csd B = 1, ten images ({prof['iterations']} iterations): the loop's own functions "
              "and the torch calls made from them, by own time", "",
              "| function | calls | own ms / it | cumulative ms / it |", "|---|---|---|---|"]
    lines += [f"| {r['function']} | {r['calls']} | {r['own_ms_per_iteration']:.4f} | "
              f"{r['cumulative_ms_per_iteration']:.4f} |" for r in prof["functions"]]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--out", default="docs/img/digits_walltime.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from csd_kernels import zoo

    entry = zoo.load("digits")
    seeds = [int(s) for s in args.seeds.split(",")]
    timed_runs(entry, 1, [0])  # warm-up: the first calls pay for lazy imports and allocator growth
    report = {"threads": args.threads, "load_average": os.getloadavg(),
              "B1": timed_runs(entry, 1, seeds), "B16": timed_runs(entry, 16, seeds), "profile": profile_loop(entry)}
    print(format_report(report))
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
