"""The scenes frontier of docs/measurements.md: ar, sjd+maximal, gsd (its defaults) and csd+maximal over
λ ∈ {0.25, 0.5, 1} × τ ∈ {0.65, 1} — `csd sweep`'s code (csd_kernels.bench.frontier.sweep) on a smaller grid than the
command's fixed one (which adds sjd independent / gumbel and costs 2x the CPU here).

    python benchmarks/frontier_scenes.py [IMAGES (default 96)] [OUT (default docs/img/scenes_frontier)]
"""
import sys

from csd_kernels.bench import frontier
from csd_kernels.zoo import measurement_prompts


def main() -> None:
    images = int(sys.argv[1]) if len(sys.argv) > 1 else 96
    out = sys.argv[2] if len(sys.argv) > 2 else "docs/img/scenes_frontier"
    grid = frontier.settings((0.25, 0.5, 1.0), (0.65, 1.0), ("maximal",), trees=(), sjd_couplings=("maximal",))
    prompts = measurement_prompts("scenes", images=images)
    result = frontier.sweep("scenes", seeds=(0,), workers=2, grid=grid, prompts=prompts)
    print(frontier.format_table(result, labels=list(result["results"])))
    print("\n".join(frontier.summary_lines(result)))
    for path in frontier.save(result, out).values():
        print("wrote", path)


if __name__ == "__main__":
    main()
