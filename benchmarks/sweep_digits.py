"""Tuning sweep of CSD on the shipped digits model: λ, τ, window and draft_init, one factor at a time.

    python benchmarks/sweep_digits.py [--num 50] [--seeds 3] [--out benchmarks/results/sweep_digits.json]

Every setting runs on the same prompts (the ten classes, cycled) and seeds; ar and sjd (lossless, default
coupling) are the baselines. Prints a table: forward passes per image, speed-up vs ar, mean distortion per token,
classifier accuracy and Fréchet distance, each as mean ± std over the seeds.
"""

import argparse
import json
import os

from csd_kernels import zoo
from csd_kernels.cli.commands import format_compare, run_compare

DEFAULT = dict(entropy_coef=0.5, tvd_threshold=0.65, window=16, draft_init="uniform")
SETTINGS = [
    ("csd (defaults)", {}),
    ("λ = 0.2", dict(entropy_coef=0.2)),
    ("λ = 0.1", dict(entropy_coef=0.1)),
    ("λ = 0.05", dict(entropy_coef=0.05)),
    ("λ = 0.02", dict(entropy_coef=0.02)),
    ("τ = 0.3", dict(tvd_threshold=0.3)),
    ("τ = 0.1", dict(tvd_threshold=0.1)),
    ("window 8", dict(window=8)),
    ("window 32", dict(window=32)),
    ("draft_init above", dict(draft_init="above")),
    ("λ = 0.05, above", dict(entropy_coef=0.05, draft_init="above")),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num", type=int, default=50, help="images per seed (the classes 0..9 cycled)")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--out", default="benchmarks/results/sweep_digits.json")
    args = parser.parse_args()
    entry = zoo.load("digits")
    prompts = [str(i % 10) for i in range(args.num)]
    seeds = list(range(args.seeds))
    results = run_compare(entry, prompts, seeds, runs=[("ar", "ar", None), ("sjd", "sjd", None)])["results"]
    for label, change in SETTINGS:
        settings = dict(DEFAULT, **change)
        report = run_compare(entry, prompts, seeds, runs=[(label, "csd", None)], generate_kwargs=settings)
        results[label] = report["results"][label]
        results[label]["settings"] = settings
    for label in results:  # one ar baseline for every row
        results[label]["speedup"] = results["ar"]["passes"]["mean"] / results[label]["passes"]["mean"]
    table = format_compare(results, entry.measures)
    print(table)
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"num": args.num, "seeds": seeds, "results": results, "table": table}, f, indent=2)


if __name__ == "__main__":
    main()
