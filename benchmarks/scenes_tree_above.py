"""Draft trees with 2-D candidates against the chain on the scenes model (issue 46): the static chain, the 2x2 tree
with its sibling drawn from q, and the 2x2 tree whose sibling is the committed token one grid row up
(decoding/tree.py, ``above_law``), all with fresh drafts from the row above (draft_init="above") for the main chain,
on the texture prompts and seeds of the frontier (csd_kernels.bench.frontier.run_setting: batches of 16 rows,
seed 0), for sjd+maximal and csd+maximal (λ 0.5, τ 0.65).

Each job appends one record to ``OUT.jsonl`` as it finishes (a cut run keeps what it measured); the table gives the
passes per image ± standard error, × fewer than ar (576 tokens) and the paired difference to the same mode's chain
(each image's passes minus the chain's on the same prompt and seed, mean ± se).

    OMP_NUM_THREADS=1 python benchmarks/scenes_tree_above.py [--images 96] [--modes sjd,csd] [--window 16]
        [--out docs/img/trees_above_scenes_w16]
    python benchmarks/scenes_tree_above.py --report docs/img/trees_above_scenes_w16.jsonl
"""
import argparse
import json
import time

import numpy as np

from csd_kernels.bench import frontier
from csd_kernels.zoo import measurement_prompts

AR_PASSES = 576
SIBLINGS = ("chain", "tree2x2-q", "tree2x2-above")


def _setting(mode: str, window: int, tree) -> frontier.Setting:
    relaxed = dict(entropy_coef=0.5, tvd_threshold=0.65) if mode == "csd" else {}
    label = "sjd+maximal" if mode == "sjd" else "csd+maximal λ=0.5 τ=0.65"
    return frontier.Setting(label, mode, "maximal", static=True, tree=tree, window=window,
                            params=(("draft_init", "above"),), **relaxed)


class SiblingCounter:
    """While active, counts on the tree loop's iterations (active rows only): the sibling tests (at a level 2..D whose
    parent was accepted, the main candidate rejected and a sibling present) and the accepted siblings, split by the
    sibling's law (one-hot from above, or q). Wraps the loop's _sibling_probs (where the window's active rows are
    known) and verify_tree."""

    def __init__(self, tree_module):
        self.module, self.counts = tree_module, dict(q_tests=0, q_accepted=0, above_tests=0, above_accepted=0)

    def __enter__(self):
        import torch

        module, counts, seen = self.module, self.counts, {}
        laws, verify = module._sibling_probs, module.verify_tree

        def sibling_probs(run, state, win, layout, main, q):
            seen["active"] = win.active
            return laws(run, state, win, layout, main, q)

        def verify_tree(cond, nodes, q, layout, **kw):
            res = verify(cond, nodes, q, layout, **kw)
            law = kw["sibling_probs"]
            children, rank = layout.children.to(nodes.device), layout.rank.to(nodes.device)
            for level in range(2, layout.depth_limit + 1):
                parent = res.path[:, level - 1]
                sibling = children[parent.clamp(min=0), 1]
                present = (parent >= 0) & (sibling >= 0) & (nodes.gather(1, sibling.clamp(min=0)[:, None])[:, 0] >= 0)
                node = res.path[:, level]
                tested = seen["active"] & present & ((node < 0) | (rank[node.clamp(min=0)] > 0))
                accepted = tested & (node >= 0)
                above = torch.zeros_like(tested) if law is None else (law[:, level - 1] != q[:, level - 1]).any(-1)
                for name, where in (("q", ~above), ("above", above)):
                    counts[f"{name}_tests"] += int((tested & where).sum())
                    counts[f"{name}_accepted"] += int((accepted & where).sum())
            return res

        module._sibling_probs, module.verify_tree = sibling_probs, verify_tree
        self.restore = laws, verify
        return self

    def __exit__(self, *exc):
        self.module._sibling_probs, self.module.verify_tree = self.restore


def _job(mode: str, siblings: str, window: int, prompts: list) -> dict:
    """One (mode, siblings) on every prompt; "sibling from q" runs the tree loop with its 2-D sibling law switched
    off (the loop as before: siblings drawn from and tested against q)."""
    import torch

    import csd_kernels.decoding.tree as tree_module

    torch.set_num_threads(1)
    setting = _setting(mode, window, None if siblings == "chain" else (2, 2))
    original = tree_module._sibling_probs
    if siblings == "tree2x2-q":
        tree_module._sibling_probs = lambda *args, **kwargs: None
    try:
        begin = time.perf_counter()
        with SiblingCounter(tree_module) as counter:
            record = frontier.run_setting("scenes", setting, 0, prompts)
    finally:
        tree_module._sibling_probs = original
    return dict(setting=setting.label, mode=mode, siblings=siblings, window=window, images=len(prompts),
                seconds=time.perf_counter() - begin, **counter.counts, **record)


def report(path: str) -> str:
    records = [json.loads(line) for line in open(path)]
    chain = {r["mode"]: np.asarray(r["row_passes"]) for r in records if r["siblings"] == "chain"}
    lines = [f"{'mode':4s} {'siblings':30s} {'images':>6s} {'passes':>15s} {'× fewer':>8s} "
             f"{'paired vs chain':>24s} {'wall s':>7s}  siblings accepted / tested (from q; from above)"]
    for r in sorted(records, key=lambda r: (r["mode"] != "sjd", SIBLINGS.index(r["siblings"]))):
        passes = np.asarray(r["row_passes"])
        se = passes.std(ddof=1) / np.sqrt(len(passes))
        diff = ""
        base = chain.get(r["mode"])
        if r["siblings"] != "chain" and base is not None and len(base) == len(passes):
            d = passes - base
            diff = f"{d.mean():+.1f} ± {d.std(ddof=1) / np.sqrt(len(d)):.1f} ({d.mean() / base.mean():+.1%})"
        lines.append(f"{r['mode']:4s} {r['siblings']:30s} {len(passes):6d} {passes.mean():7.1f} ± {se:4.1f} "
                     f"{AR_PASSES / passes.mean():7.2f}× {diff:>24s} {r['seconds']:7.0f}  "
                     f"{_rate(r, 'q')}; {_rate(r, 'above')}")
    return "\n".join(lines)


def _rate(record: dict, law: str) -> str:
    tests, accepted = record.get(f"{law}_tests", 0), record.get(f"{law}_accepted", 0)
    return f"{accepted}/{tests}" + (f" ({accepted / tests:.0%})" if tests else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=96)
    parser.add_argument("--modes", default="sjd,csd")
    parser.add_argument("--siblings", default=",".join(SIBLINGS), help="comma-separated, of " + " | ".join(SIBLINGS))
    parser.add_argument("--window", type=int, default=16)
    parser.add_argument("--out", default="docs/img/trees_above_scenes_w16")
    parser.add_argument("--report", default=None, help="print the table of this jsonl and stop")
    args = parser.parse_args()
    if args.report:
        print(report(args.report))
        return
    prompts = measurement_prompts("scenes", images=args.images)
    out = args.out + ".jsonl"
    for mode in args.modes.split(","):
        for siblings in args.siblings.split(","):
            record = _job(mode, siblings, args.window, prompts)
            with open(out, "a") as f:
                f.write(json.dumps(record) + "\n")
            print(f"{mode} {siblings}: {record['passes']:.1f} passes/image, {record['seconds']:.0f} s", flush=True)
    print(report(out))


if __name__ == "__main__":
    main()
