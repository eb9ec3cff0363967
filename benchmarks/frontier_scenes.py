"""The scenes frontier of docs/measurements.md — `csd sweep`'s code (csd_kernels.bench.frontier.sweep) on smaller grids
than the command's fixed one (which adds sjd independent / gumbel and costs 2x the CPU here):

- the main grid: ar, sjd+maximal, gsd (its defaults) and csd+maximal over λ ∈ {0.25, 0.5, 1} × τ ∈ {0.65, 1};
- ``--gsd``: ar and gsd over k ∈ {4, 12, 32} × δ ∈ {0.15, 0.3} (the same prompts and seeds: its ar row repeats the
  main grid's).

    python benchmarks/frontier_scenes.py [--images 96] [--gsd] [--out docs/img/scenes_frontier(_gsd)]
"""
import argparse

from csd_kernels.bench import frontier
from csd_kernels.zoo import measurement_prompts

GSD_GRID = [(k, delta) for k in (4, 12, 32) for delta in (0.15, 0.3)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=96)
    parser.add_argument("--gsd", action="store_true", help="the gsd k × δ grid instead of the main one")
    parser.add_argument("--out", default=None, help="output stem (default docs/img/scenes_frontier, _gsd with --gsd)")
    args = parser.parse_args()
    if args.gsd:
        grid = frontier.settings((), (), trees=(), sjd_couplings=(), gsd=GSD_GRID)
    else:
        grid = frontier.settings((0.25, 0.5, 1.0), (0.65, 1.0), ("maximal",), trees=(), sjd_couplings=("maximal",))
    out = args.out or "docs/img/scenes_frontier" + ("_gsd" if args.gsd else "")
    prompts = measurement_prompts("scenes", images=args.images)
    result = frontier.sweep("scenes", seeds=(0,), workers=2, grid=grid, prompts=prompts)
    print(frontier.format_table(result, labels=list(result["results"])))
    print("\n".join(frontier.summary_lines(result)))
    for path in frontier.save(result, out).values():
        print("wrote", path)


if __name__ == "__main__":
    main()
