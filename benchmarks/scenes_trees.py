"""Draft trees against the chain on the scenes model (CPU, B = 1, 576 tokens): passes and milliseconds per pass per
(K, D) at each window, and why a tree pays or does not — where the chain stops, and how often a sibling is accepted.

    python benchmarks/scenes_trees.py [--weights DIR] [--images 8] [--trees 2x2,2x3,3x2,3x3,4x2,4x3]
                                      [--windows 16,32,64] [--out docs/img/scenes_trees.json]

sjd+maximal on the static loop (the trees' loop; the zoo defaults) against sjd+maximal+tree (K, D), every setting on
the same prompts of the fixed mix (zoo.scenes.random_prompts(N, seed 0)) with seeds 0, 1, .. after one warm-up image;
tokens fed per pass is W for both (the siblings replace main-chain slots). As benchmarks/tree_digits.py, plus:

* where the walk stops: per iteration the accepted drafts (the level of the stop is that + 1), from ``out.accepted``
  for the chain and from the tree op's accept_len for a tree; the share of iterations that stop at the first draft
  (level 1, where a (K, D) tree never branches) and at level 2;
* sibling acceptance: at each level 2..D where the walk tested siblings (the main candidate rejected there), how
  often one was accepted (the tree op's path: a node of rank > 0), recorded by wrapping the loop's verify_tree.
"""

from __future__ import annotations

import argparse

import numpy as np
import scenes_common as common

from csd_kernels.zoo.scenes.tokenizer import TOKENS_PER_IMAGE


class SiblingLog:
    """Wraps csd_kernels.decoding.tree.verify_tree while active: per iteration (B = 1) the accepted drafts and
    the rank of each accepted node."""

    def __init__(self):
        import csd_kernels.decoding.tree as tree_module

        self.module, self.original, self.rows = tree_module, tree_module.verify_tree, []

    def __enter__(self):
        def logged(cond, nodes, q, layout, **kwargs):
            res = self.original(cond, nodes, q, layout, **kwargs)
            accepted = int(res.accept_len[0])
            ranks = layout.rank.to(res.path.device)[res.path[0, 1:accepted + 1]].tolist()
            self.rows.append((accepted, ranks, layout.depth_limit))
            return res

        self.module.verify_tree = logged
        return self

    def __exit__(self, *exc):
        self.module.verify_tree = self.original


def stops(accepted: list[int]) -> dict:
    """Where the walk stops: the share at level 1 (no draft accepted), level 2, and the mean accepted drafts."""
    a = np.asarray(accepted)
    return {"iterations": int(a.size), "stop_level_1": float((a == 0).mean()), "stop_level_2": float((a == 1).mean()),
            "mean_accepted_drafts": float(a.mean())}


def siblings(rows: list[tuple[int, list[int], int]]) -> dict:
    """At levels 2..D: tests (the main candidate rejected with siblings there) and accepted siblings."""
    tested = accepted = 0
    for length, ranks, depth in rows:
        for level in range(2, depth + 1):
            took_sibling = level <= length and ranks[level - 1] > 0
            tested += took_sibling or level == length + 1
            accepted += took_sibling
    return {"sibling_tests": tested, "siblings_accepted": accepted,
            "sibling_accept_rate": accepted / tested if tested else float("nan")}


def run(entry, mix: list[str], **kwargs) -> dict:
    common.timed(entry, mix[:1], 999, **kwargs)  # warm-up
    passes, wall, cpu, accepted = [], 0.0, 0.0, []
    log = SiblingLog()
    with log:
        for i, prompt in enumerate(mix):
            out, seconds, cpu_seconds = common.timed(entry, [prompt], i, **kwargs)
            passes.append(out.forward_passes)
            wall, cpu = wall + seconds, cpu + cpu_seconds
            committed = np.asarray(out.accepted).reshape(-1)  # B = 1: tokens committed per pass
            accepted += (committed[committed > 0] - 1).tolist()  # = accepted drafts + the emitted token
    res = dict(passes_per_image=float(np.mean(passes)), s_per_image=wall / len(mix), cpu_s_per_image=cpu / len(mix),
               cpu_ms_per_pass=1e3 * cpu / sum(passes))
    if kwargs.get("tree"):  # the tree op's own count: a row-end commit can cut the chain's, not the walk's
        res.update(stops([length for length, _, _ in log.rows]), **siblings(log.rows))
    else:
        res.update(stops(accepted))
    return res


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common.add_common(parser, images=8, out="docs/img/scenes_trees.json")
    parser.add_argument("--trees", default="2x2,2x3,3x2,3x3,4x2,4x3")
    parser.add_argument("--windows", default="16,32,64")
    args = parser.parse_args()
    entry = common.load(args)
    mix = common.prompts(args.images)
    base = {"mode": "sjd", "coupling": "maximal", "static": True}
    results, fixed_cpu, per_image = {}, 0.0, 0.0
    for window in (int(w) for w in args.windows.split(",")):
        chain = run(entry, mix, window=window, **base)
        results[f"W{window}/chain"] = chain
        per_image += chain["cpu_s_per_image"]
        print(f"W={window:3d} chain    {chain['passes_per_image']:6.1f} passes  {chain['cpu_ms_per_pass']:6.1f} CPU "
              f"ms/pass  stops at level 1: {chain['stop_level_1']:.0%}, level 2: {chain['stop_level_2']:.0%}",
              flush=True)
        for tree in args.trees.split(","):
            k, d = (int(v) for v in tree.split("x"))
            if (k**d - 1) // max(k - 1, 1) > window - 1:  # the tree's draft nodes must fit in the window
                continue
            res = run(entry, mix, window=window, tree=(k, d), **base)
            res.update(passes_vs_chain=res["passes_per_image"] / chain["passes_per_image"],
                       ms_per_pass_vs_chain=res["cpu_ms_per_pass"] / chain["cpu_ms_per_pass"])
            results[f"W{window}/K{k}D{d}"] = res
            per_image += res["cpu_s_per_image"]
            print(f"W={window:3d} tree {k}x{d} {res['passes_per_image']:6.1f} passes  {res['cpu_ms_per_pass']:6.1f} "
                  f"CPU ms/pass  passes {res['passes_vs_chain']:4.2f}x, ms/pass {res['ms_per_pass_vs_chain']:4.2f}x "
                  f"of the chain  stops at level 1: {res['stop_level_1']:.0%}  siblings accepted "
                  f"{res['siblings_accepted']}/{res['sibling_tests']}", flush=True)
    fixed_cpu = per_image  # the warm-up image of every setting
    print(common.estimate(per_image, fixed_cpu, args.images, args.full_images))
    common.write({**common.machine(args), "images": args.images, "ar_passes_per_image": TOKENS_PER_IMAGE,
                  "results": results}, args.out)


if __name__ == "__main__":
    main()
