"""What the scenes benchmarks share (benchmarks/scenes_speed.py, scenes_content.py, scenes_trees.py): the model, the
fixed prompt mix, one timed generate() call, the machine's record, and the full run's CPU estimate."""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from datetime import date

import torch


def add_common(parser: argparse.ArgumentParser, images: int, out: str) -> None:
    parser.add_argument("--weights", default=None,
                        help="a trained scenes model folder (default: the shipped weights)")
    parser.add_argument("--images", type=int, default=images, help=f"images per setting (default: {images})")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default: 1)")
    parser.add_argument("--full-images", dest="full_images", type=int, default=None,
                        help="print the CPU time this benchmark would take at this many images (from this run)")
    parser.add_argument("--out", default=out, help=f"results JSON (default: {out})")


def load(args):
    """The scenes zoo entry (``--weights`` or the shipped weights), with torch on ``--threads`` threads."""
    from csd_kernels import zoo

    torch.set_num_threads(args.threads)
    return zoo.load("scenes", **({"weights": args.weights} if args.weights else {}))


def prompts(n: int) -> list[str]:
    """The fixed prompt mix: 1-3 objects uniformly, every attribute uniform, a background named (seed 0)."""
    from csd_kernels.zoo.scenes import random_prompts

    return random_prompts(n, seed=0)


def timed(entry, chunk: list[str], seed: int, **kwargs):
    """One generate() call: (output, wall seconds, this process's CPU seconds)."""
    from csd_kernels import generate

    begin, begin_cpu = time.perf_counter(), time.process_time()
    out = generate(entry.model, **entry.prompt_inputs(chunk), seed=seed, **{**entry.defaults, **kwargs})
    return out, time.perf_counter() - begin, time.process_time() - begin_cpu


def machine(args) -> dict:
    """What a result was measured on and with: the date, the command line, the CPU's load and threads."""
    import sys

    return {"date": date.today().isoformat(), "command": " ".join(["python", *sys.argv]),
            "weights": os.path.abspath(args.weights) if args.weights else "shipped", "threads": args.threads,
            "torch": torch.__version__, "cpu": platform.processor() or platform.machine(),
            "load_average": os.getloadavg()}


def write(report: dict, path: str) -> None:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        json.dump(report, f, indent=1)
    print(f"wrote {path}")


def estimate(cpu_per_image: float, fixed_cpu: float, images: int, full: int | None) -> str:
    """One line: this run's CPU seconds and the full run's, scaling the per-image part (the fixed part: warm-ups,
    compiles) from ``images`` to ``full`` images."""
    now = fixed_cpu + cpu_per_image * images
    line = f"CPU time of this run: {now / 60:.1f} min ({images} images per setting)"
    if full:
        line += f"; at --images {full}: {(fixed_cpu + cpu_per_image * full) / 60:.0f} min of CPU (1 thread)"
    return line
