"""What ``max_lead`` trades at large batch on the digits model: batch passes against the length of each forward.

    python benchmarks/max_lead_digits.py [--batch 64] [--seeds 0,1] [--out docs/img/digits_max_lead.json]

One call of ``--batch`` rows (the ten classes cycled) per seed at the zoo defaults (csd, λ 0.5, τ 0.65, maximal),
for max_lead = 256 (no bound), None (one window, the default), 8 and 0. A forward pre-hook on the decoder records
the number of positions of every forward call of the loop; reported per setting: forward calls per batch, mean
positions per forward, their sum (positions computed per row of the batch) and the passes each image needed on its
own, mean ± std over seeds.
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np
import torch

from csd_kernels.bench.frontier import summarise

LEADS = [("no bound (256)", 256), ("one window (default)", None), ("8", 8), ("0", 0)]


def forward_lengths(decoder) -> tuple[list, object]:
    """Record the sequence length of every decoder call; returns (the list it fills, the hook handle)."""
    lengths = []

    def hook(module, args, kwargs):
        x = kwargs.get("inputs_embeds")
        if x is None:
            x = kwargs.get("input_ids", args[0] if args else None)
        lengths.append(int(x.shape[1]))

    return lengths, decoder.register_forward_pre_hook(hook, with_kwargs=True)


def run(entry, batch: int, seeds: list[int]) -> dict:
    from csd_kernels import generate

    prompts = [str(c % 10) for c in range(batch)]
    lengths, handle = forward_lengths(entry.model.lm.get_decoder())
    results = {}
    try:
        for label, lead in LEADS:
            records = []
            for seed in seeds:
                lengths.clear()
                out = generate(entry.model, **entry.prompt_inputs(prompts), seed=seed * batch, max_lead=lead,
                               **entry.defaults)
                loop = lengths[-out.forward_passes:]  # the prefill call comes first
                records.append({"forward_calls": out.forward_passes, "positions_per_forward": float(np.mean(loop)),
                                "positions_per_row": float(np.sum(loop)),
                                "passes_per_image": float(out.passes_per_row().mean())})
            results[label] = summarise(records)
    finally:
        handle.remove()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default="docs/img/digits_max_lead.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from csd_kernels import zoo

    results = run(zoo.load("digits"), args.batch, [int(s) for s in args.seeds.split(",")])
    pm = lambda r, k: f"{r[k]['mean']:.1f} ± {r[k]['std']:.1f}"  # noqa: E731
    print(f"B = {args.batch}, seeds {args.seeds}")
    print(f"{'max_lead':22s} {'forward calls':>15s} {'positions/forward':>18s} {'positions/row':>15s} "
          f"{'passes/image':>13s}")
    for label, r in results.items():
        print(f"{label:22s} {pm(r, 'forward_calls'):>15s} {pm(r, 'positions_per_forward'):>18s} "
              f"{pm(r, 'positions_per_row'):>15s} {pm(r, 'passes_per_image'):>13s}")
    if args.out:
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        with open(args.out, "w") as f:
            json.dump({"batch": args.batch, "seeds": args.seeds, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
