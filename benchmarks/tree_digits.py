"""Draft trees on the shipped digits model (CPU): passes and wall time per image, sjd+maximal against
sjd+maximal+tree, both on the static loop (B = 1, the zoo defaults, temperature 1).

    python benchmarks/tree_digits.py [--images 3] [--trees 2x2,2x3,3x2,3x3,4x2,4x3] [--windows 16,32,64] [--out F.json]

Every setting generates the same images (digits 0, 1, 2, .. with seeds 0, 1, 2, ..) after one warm-up image. Tokens
fed per pass is W for both (the tree replaces main-chain slots by siblings; reported per setting). Ratios within one
run only: the CPU is shared. The tree's verification is the fused op ck.verify_tree on the default backend (the C++
CPU kernel here; CSD_KERNELS_BACKEND=torch runs the reference walk instead).
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np


def run(entry, images: int, **kw) -> dict:
    from csd_kernels import generate

    generate(entry.model, **entry.prompt_inputs(["0"]), seed=999, **kw)  # warm-up
    passes, begin = [], time.perf_counter()
    for i in range(images):
        out = generate(entry.model, **entry.prompt_inputs([str(i % 10)]), seed=i, **kw)
        passes.append(out.forward_passes)
    wall = (time.perf_counter() - begin) / images
    return dict(passes_per_image=float(np.mean(passes)), s_per_image=wall, ms_per_pass=1e3 * wall / np.mean(passes))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=3)
    parser.add_argument("--trees", default="2x2,2x3,3x2,3x3,4x2,4x3")
    parser.add_argument("--windows", default="16,32,64")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    import torch

    from csd_kernels import zoo

    torch.set_num_threads(1)
    entry = zoo.load("digits")
    base = {**entry.defaults, "mode": "sjd", "coupling": "maximal", "static": True}
    total = entry.model.grid[0] * entry.model.grid[1]
    results = {"ar_passes_per_image": total}
    for window in [int(w) for w in args.windows.split(",")]:
        chain = run(entry, args.images, window=window, **base)
        chain["tokens_per_pass"] = window
        results[f"W{window}/chain"] = chain
        print(f"W={window:3d} chain      {chain['passes_per_image']:6.1f} passes "
              f"({total / chain['passes_per_image']:4.2f}x fewer than ar)  {chain['s_per_image']:6.2f} s/image  "
              f"{chain['ms_per_pass']:6.1f} ms/pass", flush=True)
        for tree in args.trees.split(","):
            k, d = (int(v) for v in tree.split("x"))
            if (k**d - 1) // max(k - 1, 1) > window - 1:
                continue
            res = run(entry, args.images, window=window, tree=(k, d), **base)
            res["tokens_per_pass"] = window  # root + main chain + siblings
            res["passes_vs_chain"] = res["passes_per_image"] / chain["passes_per_image"]
            res["ms_per_pass_vs_chain"] = res["ms_per_pass"] / chain["ms_per_pass"]
            results[f"W{window}/K{k}D{d}"] = res
            print(f"W={window:3d} tree {k}x{d}   {res['passes_per_image']:6.1f} passes "
                  f"({total / res['passes_per_image']:4.2f}x fewer than ar)  {res['s_per_image']:6.2f} s/image  "
                  f"{res['ms_per_pass']:6.1f} ms/pass  "
                  f"passes {res['passes_vs_chain']:4.2f}x, ms/pass {res['ms_per_pass_vs_chain']:4.2f}x of the chain",
                  flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
