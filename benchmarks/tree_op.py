"""CPU wall time of one tree verification, reference.verify_tree (the torch backend) against the C++ kernel.

    OMP_NUM_THREADS=1 python benchmarks/tree_op.py [--repeats 15] [--out FILE.json]

Janus-like shape: V = 16384, a window of W = 32 slots, bf16 logits with CFG (scale 5), trees (K, D) in {(2, 2), (3, 3)}
and B in {1, 4}. q is a noisy copy of the target at each level and every node's candidate is drawn from its level's q
(as the loop drafts them), which gives accept lengths of a few nodes (the mean is printed, and the C++ time per
visited node). Both backends run on one thread, interleaved per
repeat (a change in the machine's load hits both alike); the table gives the median milliseconds per call and their
ratio. The reference computes p at every slot; the kernel only at the nodes its walk visits.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

import csd_kernels as ck
from csd_kernels import reference as ref

VOCAB, WINDOW, CFG = 16384, 32, 5.0
TREES, BATCHES = ((2, 2), (3, 3)), (1, 4)


def inputs(branching: int, depth: int, batch: int, seed: int = 0) -> dict:
    layout = ref.tree_layout(branching, depth, WINDOW)
    g = torch.Generator().manual_seed(seed)
    cond, uncond = (torch.randn(batch, WINDOW, VOCAB, generator=g) for _ in range(2))
    p = torch.softmax(uncond + CFG * (cond - uncond), -1)
    main = torch.log(p[:, layout.main[:-1]].clamp(min=1e-30))
    q = torch.softmax(main + 1.5 * torch.randn(main.shape, generator=g), -1)
    level = (layout.depth - 1).clamp(min=0)
    tokens = torch.multinomial(q[:, level].reshape(-1, VOCAB), 1, generator=g).reshape(batch, WINDOW)
    return dict(target_logits=cond.bfloat16(), uncond_logits=uncond.bfloat16(), node_tokens=tokens, draft_probs=q,
                layout=layout, cfg_scale=CFG, seed=torch.tensor([1]), offset=torch.tensor([0]))


def measure(repeats: int) -> list[dict]:
    rows = []
    for branching, depth in TREES:
        for batch in BATCHES:
            x = inputs(branching, depth, batch)
            times = {"torch": [], "cpu": []}
            for backend in times:  # warm-up, and the two agree
                out = ck.verify_tree(**x, backend=backend)
            for _ in range(repeats):
                for backend in times:
                    start = time.perf_counter()
                    ck.verify_tree(**x, backend=backend)
                    times[backend].append(time.perf_counter() - start)
            median = {k: 1e3 * sorted(v)[len(v) // 2] for k, v in times.items()}
            rows.append(dict(K=branching, D=depth, B=batch, reference_ms=median["torch"], cpp_ms=median["cpu"],
                             speedup=median["torch"] / median["cpu"],
                             mean_accept_len=float(out.accept_len.float().mean()),
                             cpp_us_per_node=1e3 * median["cpu"] / float((out.accept_len + 1).sum())))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--out", help="write the rows as JSON here")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = measure(args.repeats)
    print(f"V = {VOCAB}, W = {WINDOW}, bf16 + CFG {CFG:g}, one thread, median of {args.repeats}")
    print("| (K, D) | B | reference ms | C++ ms | speed-up | mean accept len | C++ µs per visited node |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| ({r['K']}, {r['D']}) | {r['B']} | {r['reference_ms']:.1f} | {r['cpp_ms']:.2f} | "
              f"{r['speedup']:.0f}x | {r['mean_accept_len']:.2f} | {r['cpp_us_per_node']:.0f} |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
