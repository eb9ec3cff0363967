"""One frontier of every acceptance rule on the scenes model — `csd sweep`'s code (csd_kernels.bench.frontier.sweep)
over each rule's parameter grid, written as PREFIX.json / .csv / .png and PREFIX-rules.png (a curve per rule):

- the lossless references: ar and sjd+maximal;
- csd+maximal over λ ∈ {0.25, 0.5, 1} × τ ∈ {0.65, 1};
- gsd (independent drafts) over k ∈ {4, 12, 32} × δ ∈ {0.15, 0.3};
- arsample+maximal over its scale c ∈ {4.5, 9, 18} (offset 0.05) and offset s0 ∈ {0.2} (c = 9);
- lantern+maximal over δ ∈ {0.05, 0.1, 0.2, 0.4} and lantern++/maximal over λ ∈ {2, 5, 10, 20}, each at its default
  k for the model's codebook (config.acceptance.default_lantern_k; the tables of 2026-12 ran k 1000 and 10).

    python benchmarks/frontier_rules.py [--images 96] [--seeds 1] [--workers 2] [--out docs/img/scenes_rules]
    python benchmarks/frontier_rules.py --smoke --images 4 --out out/rules_smoke    # one point per rule
    python benchmarks/frontier_rules.py --new-rules --out docs/img/scenes_rules_textures
    python benchmarks/frontier_rules.py --combine docs/img/scenes_frontier.json docs/img/scenes_rules_textures.json \
        --out docs/img/scenes_rules_all      # one table and plot of two runs on the same prompts and seeds

``--new-rules``: ar and the three rules new to the op, each at its default and at its most relaxed point of the grid
above (arsample c 4.5, lantern δ 0.4, lantern++ λ 20) — the figures of ar, sjd, csd and gsd on the same prompts and
seeds are benchmarks/frontier_scenes.py's (docs/img/scenes_frontier.json); the full grid costs several CPU hours here.

``--rest``: ar, gsd over its grid (its default is in frontier_scenes.py's run) and the rules' points --new-rules leaves
out; ``--combine`` of the three runs is the whole grid:

    python benchmarks/frontier_rules.py --rest --out docs/img/scenes_rules_rest
    python benchmarks/frontier_rules.py --combine docs/img/scenes_frontier.json docs/img/scenes_rules_textures.json \
        docs/img/scenes_rules_rest.json --out docs/img/scenes_rules_all

``--weights DIR`` takes another trained scenes model (e.g. a retrained world); the JSON records which.
"""
import argparse
import json

from csd_kernels.bench import frontier, frontier_plot
from csd_kernels.zoo import measurement_prompts

LAMBDAS, TAUS = (0.25, 0.5, 1.0), (0.65, 1.0)
GSD_GRID = [(k, delta) for k in (4, 12, 32) for delta in (0.15, 0.3)]
RULE_GRIDS = {
    "arsample": [{"arsample_scale": c} for c in (4.5, 9.0, 18.0)] + [{"arsample_offset": 0.2}],
    "lantern": [{"lantern_delta": d} for d in (0.05, 0.1, 0.2, 0.4)],
    "lantern++": [{"lantern_lambda": lam} for lam in (2.0, 5.0, 10.0, 20.0)],
}


NEW_RULES = {"arsample": [{}, {"arsample_scale": 4.5}], "lantern": [{}, {"lantern_delta": 0.4}],
             "lantern++": [{}, {"lantern_lambda": 20.0}]}


def rest_of_grid(vocab: int) -> list:
    """ar, gsd over GSD_GRID but its default (frontier_scenes.py runs that) and each rule's points of RULE_GRIDS that
    --new-rules leaves out: with those two runs and frontier_scenes.py's, the whole grid on the same prompts."""
    gsd = [s for s in frontier.settings((), (), (), trees=(), sjd_couplings=(), gsd=GSD_GRID) if s.mode == "gsd"]
    done = {s.label for s in frontier.rule_settings(NEW_RULES, vocab)}
    rules = [s for s in frontier.rule_settings(RULE_GRIDS, vocab) if s.label not in done]
    return [frontier.Setting("ar", "ar"), *gsd[1:], *rules]


def grid(vocab: int, smoke: bool, new_rules: bool = False, rest: bool = False) -> list:
    """The settings (``vocab``: the model's codebook size): the full grids, (smoke) each rule at one point,
    (new_rules) ar and NEW_RULES, or (rest) rest_of_grid()."""
    if rest:
        return rest_of_grid(vocab)
    if new_rules:
        return [frontier.Setting("ar", "ar")] + frontier.rule_settings(NEW_RULES, vocab)
    if smoke:
        return frontier.settings((0.5,), (0.65,), ("maximal",), trees=(), sjd_couplings=("maximal",),
                                 rules={rule: points[:1] for rule, points in RULE_GRIDS.items()}, vocab=vocab)
    return frontier.settings(LAMBDAS, TAUS, ("maximal",), trees=(), sjd_couplings=("maximal",), gsd=GSD_GRID,
                             rules=RULE_GRIDS, vocab=vocab)


def combine(paths: list[str]) -> dict:
    """One result of runs on the same prompts and seeds (their ar rows must agree): every setting of each, the
    answers recomputed over all of them."""
    runs = [json.load(open(path)) for path in paths]
    for run in runs[1:]:
        ar, first = run["results"]["ar"], runs[0]["results"]["ar"]
        same_ar = all(ar[k] == first[k] for k in ("passes", "adherence", "frechet"))
        if (run["images"], run["seeds"]) != (runs[0]["images"], runs[0]["seeds"]) or not same_ar:
            raise SystemExit("--combine: the runs differ in their prompts, seeds or ar row (passes and quality)")
    result = {**runs[0], "results": {}, "settings": {}, "per_seed": [], "seconds": sum(r["seconds"] for r in runs)}
    for run in runs:
        result["results"].update(run["results"])
        result["settings"].update(run["settings"])
        result["per_seed"] += [r for r in run["per_seed"] if r["label"] not in {p["label"] for p in result["per_seed"]}]
    grid = {label: frontier.Setting(**{**s, "tree": tuple(s["tree"]) if s.get("tree") else None,
                                       "params": tuple(tuple(p) for p in s.get("params") or ())})
            for label, s in result["settings"].items()}
    spread = frontier_plot.spread_of(result["seeds"])
    result.update(frontier.answers(result["results"], grid, frontier.measures_of(result), spread=spread))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=96)
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--weights", default=None, help="a trained scenes model's folder (default: the shipped one)")
    parser.add_argument("--smoke", action="store_true", help="each rule at one point of its grid")
    parser.add_argument("--new-rules", action="store_true", help="ar and the new rules at two points each")
    parser.add_argument("--rest", action="store_true", help="ar, gsd's grid and the rules' points --new-rules leaves")
    parser.add_argument("--combine", nargs="+", metavar="JSON", help="merge earlier runs instead of running")
    parser.add_argument("--out", default="docs/img/scenes_rules", help="output prefix")
    args = parser.parse_args()
    if args.combine:
        result = combine(args.combine)
        print(frontier.format_table(result, labels=list(result["results"])))
        print("\n".join(frontier.summary_lines(result)))
        for path in frontier.save(result, args.out).values():
            print("wrote", path)
        return
    prompts = measurement_prompts("scenes", images=args.images)
    result = frontier.sweep("scenes", seeds=tuple(range(args.seeds)), workers=args.workers,
                            grid=grid(frontier.model_vocab("scenes", weights=args.weights), args.smoke,
                                      args.new_rules, args.rest), prompts=prompts,
                            options=dict(weights=args.weights))
    print(frontier.format_table(result, labels=list(result["results"])))
    print("\n".join(frontier.summary_lines(result)))
    for path in frontier.save(result, args.out).values():
        print("wrote", path)


if __name__ == "__main__":
    main()
