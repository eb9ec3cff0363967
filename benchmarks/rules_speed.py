"""CPU wall time of each acceptance rule's verify against the strict rule's, on the C++ CPU backend.

    OMP_NUM_THREADS=1 python benchmarks/rules_speed.py [--repeats 15] [--out FILE.json]

Shapes (B, L, V) = (1, 16, 16384) and (8, 16, 16384): fp32 logits with CFG (scale 5), q a noisy copy of p, the drafts
drawn from q, independent coupling, the probabilities returned (as the loop calls it). Each rule at its table
defaults (config/acceptance.py); lantern and lantern++ with a neighbour table of a random codebook [V, 8] (k = 1000
and 10 columns), and gsd and lantern once more with ``gather_distortion=True`` (their exact distortion: gsd sorts
every position's row, lantern gathers k per token).
Every rule runs once per repeat, in turn (a change in the machine's load hits all alike), each timed call after an
untimed one of the same rule (so no rule pays for the caches its predecessor filled); the table gives the median
milliseconds per call and its ratio to strict's, the same for the fastest call (less exposed to a shared machine's
load), and the mean accepted length. Every position is verified whatever the rule accepts. Ratios within one run are
the figure; the milliseconds move with the machine.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

import csd_kernels as ck
from csd_kernels.config.acceptance import RULES

VOCAB, WINDOW, CFG = 16384, 16, 5.0
BATCHES = (1, 8)


def inputs(batch: int, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    cond, uncond = (torch.randn(batch, WINDOW, VOCAB, generator=g) for _ in range(2))
    p = torch.softmax(uncond + CFG * (cond - uncond), -1)
    q = torch.softmax(torch.log(p.clamp(min=1e-30)) + 1.5 * torch.randn(p.shape, generator=g), -1)
    drafts = torch.multinomial(q.reshape(-1, VOCAB), 1, generator=g).reshape(batch, WINDOW)
    return dict(target_logits=cond, uncond_logits=uncond, draft_tokens=drafts, draft_probs=q, cfg_scale=CFG,
                seed=1, coupling="independent")


def calls(neighbours: torch.Tensor) -> dict:
    """{label: verify keywords} of every rule (at its defaults), and lantern's gathered distortion."""
    out = {}
    for rule in RULES:
        extra = dict(neighbours=neighbours) if rule.needs_neighbours else {}
        out[rule.name] = dict(rule=rule.name, **extra)
    out["gsd +distortion"] = dict(rule="gsd", gather_distortion=True)
    out["lantern +distortion"] = dict(rule="lantern", neighbours=neighbours, gather_distortion=True)
    return out


def measure(repeats: int, backend: str) -> list[dict]:
    g = torch.Generator().manual_seed(7)
    neighbours = ck.codebook_neighbours(torch.randn(VOCAB, 8, generator=g), 1000)
    rows = []
    for batch in BATCHES:
        x = inputs(batch)
        runs = calls(neighbours)
        times = {label: [] for label in runs}
        accepted = {label: float(ck.verify(**x, **kw, backend=backend).accept_len.float().mean())  # and warm-up
                    for label, kw in runs.items()}
        for _ in range(repeats):
            for label, kw in runs.items():
                ck.verify(**x, **kw, backend=backend)  # untimed: the caches hold this call's data, not the last's
                start = time.perf_counter()
                ck.verify(**x, **kw, backend=backend)
                times[label].append(time.perf_counter() - start)
        median = {k: 1e3 * sorted(v)[len(v) // 2] for k, v in times.items()}
        best = {k: 1e3 * min(v) for k, v in times.items()}
        for label, ms in median.items():
            rows.append(dict(B=batch, L=WINDOW, V=VOCAB, rule=label, ms=ms, vs_strict=ms / median["strict"],
                             min_ms=best[label], min_vs_strict=best[label] / best["strict"],
                             mean_accept_len=accepted[label]))
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--backend", default="cpu")
    parser.add_argument("--out", help="write the rows as JSON here")
    args = parser.parse_args(argv)
    rows = measure(args.repeats, args.backend)
    print(f"{'B':>2} {'rule':<20} {'median ms':>9} {'/ strict':>9} {'min ms':>9} {'/ strict':>9} {'accepted':>9}")
    for r in rows:
        print(f"{r['B']:>2} {r['rule']:<20} {r['ms']:>9.2f} {r['vs_strict']:>9.2f} {r['min_ms']:>9.2f} "
              f"{r['min_vs_strict']:>9.2f} {r['mean_accept_len']:>9.2f}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(threads=torch.get_num_threads(), backend=args.backend, repeats=args.repeats, rows=rows), f,
                      indent=1)


if __name__ == "__main__":
    main()
