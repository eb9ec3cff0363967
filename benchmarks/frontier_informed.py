"""Every mode at its defaults on both shipped models, before and after issue 45's ``informed`` mask (a uniform fresh
draft is verified by the strict test under every rule; docs/op.md) — `csd sweep`'s code
(csd_kernels.bench.frontier.sweep) on the same prompts and seeds:

- ar, sjd+maximal (lossless), gsd, csd+maximal (λ 0.5 τ 0.65 and the gate wide open, τ 1), arsample+maximal,
  lantern+maximal, lantern+++maximal (each rule's defaults).

    python benchmarks/frontier_informed.py --model digits --per-class 2 --out docs/img/informed_digits_after
    python benchmarks/frontier_informed.py --model scenes --images 16 --out docs/img/informed_scenes_after

(the "before" runs: the same commands in a checkout of c3a7874; docs/measurements.md has both tables)

Writes PREFIX.json / .csv / .png (frontier.save) and prints the table.
"""
import argparse

from csd_kernels.bench import frontier
from csd_kernels.zoo import measurement_prompts


def grid(model: str) -> list:
    """ar, sjd+maximal, gsd and csd (two τ), then each other rule at its defaults (frontier.rule_settings)."""
    fixed = frontier.settings((0.5,), (0.65, 1.0), ("maximal",), trees=(), sjd_couplings=("maximal",))
    return fixed + frontier.rule_settings({"arsample": [{}], "lantern": [{}], "lantern++": [{}]},
                                          frontier.model_vocab(model))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=("digits", "scenes"), default="digits")
    parser.add_argument("--per-class", type=int, default=None, help="digits: images per class")
    parser.add_argument("--images", type=int, default=None, help="scenes: prompts")
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--out", required=True, help="output prefix")
    args = parser.parse_args()
    prompts = measurement_prompts(args.model, per_class=args.per_class, images=args.images)
    result = frontier.sweep(args.model, seeds=tuple(range(args.seeds)), workers=args.workers, grid=grid(args.model),
                            prompts=prompts)
    print(frontier.format_table(result, labels=list(result["results"])))
    for path in frontier.save(result, args.out).values():
        print("wrote", path)


if __name__ == "__main__":
    main()
