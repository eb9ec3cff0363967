"""The scenes frontier of docs/measurements.md on the texture prompts (clouds and waves in turn) — `csd sweep`'s code
(csd_kernels.bench.frontier.sweep), in two parts that `csd sweep` reproduces:

- ``--part chain`` (default): ar; sjd with independent / maximal / gumbel next drafts; gsd at its defaults;
  csd+maximal over λ ∈ {0.25, 0.5, 1} × τ ∈ {0.65, 1}; at W 16. = ``csd sweep --model scenes --images 96 --seeds 1
  --lambdas 0.25,0.5,1 --taus 0.65,1 --couplings maximal --trees none``
- ``--part more``: ar again (the band; it repeats part one's row), csd with independent next drafts at λ 0.5, τ 0.65;
  sjd+maximal and csd+maximal (λ 0.5, τ 0.65) at W 32; the static loop's chain and the 2x2 draft tree for sjd+maximal
  and csd+maximal (λ 0.5, τ 0.65).

One seed; the noise of each figure is its standard error over the images (``se`` in the JSON; the row passes of
every image are in ``per_seed`` for paired comparisons).

    python benchmarks/frontier_scenes.py [--images 96] [--part chain|more] [--out docs/img/scenes_frontier(_more)]
"""
import argparse

from csd_kernels.bench import frontier
from csd_kernels.zoo import measurement_prompts


def grid(part: str) -> list:
    if part == "chain":
        return frontier.settings((0.25, 0.5, 1.0), (0.65, 1.0), ("maximal",), trees=())
    ar = frontier.settings((), (), (), trees=(), sjd_couplings=())[:1]
    csd_independent = frontier.settings((0.5,), (0.65,), ("independent",), trees=(), sjd_couplings=())[2:]
    wide = frontier.settings((0.5,), (0.65,), ("maximal",), trees=(), sjd_couplings=("maximal",), windows=(32,))
    trees = frontier.settings((0.5,), (0.65,), ("maximal",), trees=((2, 2),), sjd_couplings=())
    return (ar + csd_independent + [s for s in wide if s.window == 32]
            + [s for s in trees if s.static or s.tree])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=96)
    parser.add_argument("--part", choices=("chain", "more"), default="chain")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", default=None, help="output stem (default docs/img/scenes_frontier, _more)")
    args = parser.parse_args()
    settings = grid(args.part)
    out = args.out or "docs/img/scenes_frontier" + ("_more" if args.part == "more" else "")
    prompts = measurement_prompts("scenes", images=args.images)
    result = frontier.sweep("scenes", seeds=(0,), workers=args.workers, grid=settings, prompts=prompts)
    print(frontier.format_table(result, labels=list(result["results"])))
    print("\n".join(frontier.summary_lines(result)))
    for path in frontier.save(result, out).values():
        print("wrote", path)


if __name__ == "__main__":
    main()
