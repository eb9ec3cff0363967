"""Forward passes and seconds per image on the scenes model (CPU, 576 tokens per image): every mode, B = 1 and B = 8,
the default loop and the fast path (``static=True, compile=True``).

    python benchmarks/scenes_speed.py [--weights DIR] [--images 16] [--batches 1,8] [--loops eager,static+compile]
                                      [--windows 16,32,64] [--trees 2x2,3x2] [--tree-window 32]
                                      [--out docs/img/scenes_speed.json]

Settings: ar; sjd+maximal at each of --windows; csd at the paper's defaults (λ 0.5, τ 0.65, W 16, the maximal
coupling); gsd at its defaults (k 12, δ 0.15, W 16); sjd+maximal with each draft tree of --trees at --tree-window
(benchmarks/scenes_trees.py finds the best (K, D)). A tree runs in the static loop only: its "eager" row is
``static=True`` without compile. Prompts: the fixed mix (1-3 objects, zoo.scenes.random_prompts(N, seed 0)); call
i of every setting generates the same prompts with seed i·B (row b: + b).

Timing as benchmarks/static_loop_cpu.py: one warm-up call per setting, loop and batch size first (its time, the
compile included, is ``first_call_*``), then the calls interleaved — call i by every setting and loop in turn, so a
change in the machine's load hits all alike. Wall seconds and this process's CPU seconds (one torch thread: the work,
whatever else runs on the machine) per image; CPU milliseconds per forward pass. Pass counts are deterministic.
"""

from __future__ import annotations

import argparse

import numpy as np
import scenes_common as common
import torch

from csd_kernels.zoo.scenes.tokenizer import TOKENS_PER_IMAGE

LOOPS = {"eager": {}, "static": dict(static=True), "static+compile": dict(static=True, compile=True)}


def settings(windows: list[int], trees: list[tuple[int, int]], tree_window: int) -> list[tuple[str, dict]]:
    rows = [("ar", dict(mode="ar"))]
    rows += [(f"sjd+maximal W{w}", dict(mode="sjd", coupling="maximal", window=w)) for w in windows]
    rows += [("csd λ0.5 τ0.65 W16", dict(mode="csd", coupling="maximal", entropy_coef=0.5, tvd_threshold=0.65,
                                         window=16)),
             ("gsd k12 δ0.15 W16", dict(mode="gsd", window=16, group_rank=12, group_delta=0.15))]
    rows += [(f"sjd+maximal+tree {k}x{d} W{tree_window}", dict(mode="sjd", coupling="maximal", window=tree_window,
                                                               tree=(k, d))) for k, d in trees]
    return rows


def loops_of(kwargs: dict, loops: list[str]) -> dict:
    """The loops a setting runs in: a tree's "eager" is the static loop without compile (its only other loop)."""
    named = {("static" if kwargs.get("tree") and loop == "eager" else loop) for loop in loops}
    return {loop: LOOPS[loop] for loop in LOOPS if loop in named}


def measure(entry, batch: int, images: int, runs: list[tuple[str, dict]], loops: list[str]) -> dict:
    calls = -(-images // batch)
    mix = common.prompts(calls * batch + batch)
    warm, mix = mix[:batch], mix[batch:]
    plan = [(label, loop, {**kwargs, **extra}) for label, kwargs in runs for loop, extra in loops_of(kwargs,
                                                                                                     loops).items()]
    rows = {}
    for label, loop, kwargs in plan:
        _, wall, cpu = common.timed(entry, warm, 999, **kwargs)
        rows[(label, loop)] = dict(first_call_s=wall, first_call_cpu_s=cpu, wall=0.0, cpu=0.0, passes=[], calls=[])
        print(f"B={batch} {label:32s} {loop:15s} first call {wall:7.1f} s ({cpu:7.1f} CPU s)", flush=True)
    for i in range(calls):
        for label, loop, kwargs in plan:
            out, wall, cpu = common.timed(entry, mix[i * batch:(i + 1) * batch], i * batch, **kwargs)
            row = rows[(label, loop)]
            row["wall"] += wall
            row["cpu"] += cpu
            row["passes"] += out.passes_per_row().tolist()
            row["calls"].append(out.forward_passes)
    result = {}
    for (label, loop), row in rows.items():
        n = calls * batch
        result[f"B{batch}/{label}/{loop}"] = dict(
            batch=batch, setting=label, loop=loop, images=n, passes_per_image=float(np.mean(row["passes"])),
            forward_calls_per_call=float(np.mean(row["calls"])), s_per_image=row["wall"] / n,
            cpu_s_per_image=row["cpu"] / n, cpu_ms_per_pass=1e3 * row["cpu"] / sum(row["calls"]),
            first_call_s=row["first_call_s"], first_call_cpu_s=row["first_call_cpu_s"])
    return result


def format_table(results: dict) -> str:
    lines = ["| B | setting | loop | passes / image | x fewer than ar | s / image | CPU s / image | CPU ms / pass | "
             "first call s |", "|---|---|---|---|---|---|---|---|---|"]
    for r in results.values():  # ar: one pass per token
        lines.append(f"| {r['batch']} | {r['setting']} | {r['loop']} | {r['passes_per_image']:.1f} | "
                     f"{TOKENS_PER_IMAGE / r['passes_per_image']:.2f} | {r['s_per_image']:.3f} | "
                     f"{r['cpu_s_per_image']:.3f} | {r['cpu_ms_per_pass']:.2f} | {r['first_call_s']:.1f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common.add_common(parser, images=16, out="docs/img/scenes_speed.json")
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--loops", default="eager,static+compile", help="any of " + ", ".join(LOOPS))
    parser.add_argument("--windows", default="16,32,64", help="sjd+maximal windows")
    parser.add_argument("--trees", default="2x2,3x2", help="KxD draft trees, comma-separated, or none")
    parser.add_argument("--tree-window", dest="tree_window", type=int, default=32)
    parser.add_argument("--only", default=None, help="comma-separated setting labels to run (default: all)")
    args = parser.parse_args()
    # every (setting, batch) recompiles the same static step: dynamo's default limit (8) ends the run part-way
    torch._dynamo.config.recompile_limit = 256
    entry = common.load(args)
    trees = [] if args.trees == "none" else [tuple(int(v) for v in t.split("x")) for t in args.trees.split(",")]
    runs = settings([int(w) for w in args.windows.split(",")], trees, args.tree_window)
    if args.only:
        runs = [(label, kwargs) for label, kwargs in runs if label in args.only.split(",")]
    results = {}
    for batch in (int(b) for b in args.batches.split(",")):
        results.update(measure(entry, batch, args.images, runs, args.loops.split(",")))
    print(format_table(results))
    fixed = sum(r["first_call_cpu_s"] for r in results.values())
    per_image = sum(r["cpu_s_per_image"] for r in results.values())
    print(common.estimate(per_image, fixed, args.images, args.full_images))
    common.write({**common.machine(args), "images": args.images, "results": results, "table": format_table(results)},
                 args.out)


if __name__ == "__main__":
    main()
