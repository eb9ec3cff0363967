"""The paper's content-aware claim, measured on the scenes model: the entropy of p and the draft's acceptance on
background tokens vs object tokens, for csd and sjd, and by background kind.

    python benchmarks/scenes_content.py [--weights DIR] [--images 200] [--modes sjd,csd] [--batch 8]
                                        [--out docs/img/scenes_content.json]

Every mode generates the same --images prompts of the fixed mix (1-3 objects, zoo.scenes.random_prompts(N, seed 0))
with the same seeds (call i: seed i·B), at the zoo defaults (cfg, W 16, csd λ 0.5 τ 0.65, the maximal coupling),
in the default loop. ``out.entropy_map`` (H(p) when the token was committed) and ``out.accept_map`` (the acceptance
probability of the draft there; 0 where the token was drawn without a draft) give each token's numbers;
``out.tvd_map`` and ``out.distortion_map`` the gate and what csd's relaxation cost there.

Where the objects are comes from the generated image's pixels alone (the adherence checker's segmentation,
``checker.object_mask``): a token (a 4x4 patch) is an *object* token when all 16 pixels are an object's, *edge*
when some are, *background* when none are. The background kind is read from the pixels too
(``checker.background_kind``). Per mode and class: the share of tokens, the mean entropy, acceptance probability a(x)
of the draft tested there (the token where a window's walk stopped counts its low a(x)), TVD and distortion; then
the same by background kind; then csd − sjd.
"""

from __future__ import annotations

import argparse

import numpy as np
import scenes_common as common

from csd_kernels.zoo.scenes import checker
from csd_kernels.zoo.scenes.tokenizer import GRID, PATCH

CLASSES = ("background", "edge", "object")
STATS = ("entropy", "accept", "tvd", "distortion")  # the maps


def token_classes(image: np.ndarray) -> np.ndarray:
    """int [24, 24]: 0 background, 1 edge, 2 object — the share of each patch's pixels that are an object's."""
    cover = checker.object_mask(image).reshape(GRID[0], PATCH, GRID[1], PATCH).mean((1, 3))
    return np.where(cover == 0, 0, np.where(cover == 1, 2, 1))


def token_records(out, images: np.ndarray) -> list[dict]:
    """Per image: its token classes, background kind and the four maps (numpy)."""
    maps = {"entropy": out.entropy_map, "accept": out.accept_map, "tvd": out.tvd_map,
            "distortion": out.distortion_map}
    maps = {k: v.float().cpu().numpy() for k, v in maps.items()}
    return [{"classes": token_classes(image), "kind": checker.background_kind(image),
             **{k: v[i] for k, v in maps.items()}} for i, image in enumerate(images)]


def summarise(records: list[dict]) -> dict:
    """{class: {share, entropy, accept, tvd, distortion}} over every token of ``records`` (TVD: where a draft was)."""
    out = {}
    cls = np.stack([r["classes"] for r in records])
    for index, name in enumerate(CLASSES):
        mask = cls == index
        row = {"share": float(mask.mean()), "tokens": int(mask.sum())}
        for stat in STATS:
            values = np.stack([r[stat] for r in records])[mask]
            row[stat] = float(np.nanmean(values)) if np.isfinite(values).any() else float("nan")
        out[name] = row
    return out


def measure(entry, modes: list[str], images: int, batch: int) -> tuple[dict, float]:
    mix = common.prompts(images)
    per_mode, cpu_total = {}, 0.0
    for mode in modes:
        records, cpu = [], 0.0
        for start in range(0, images, batch):
            out, _, seconds = common.timed(entry, mix[start:start + batch], start, mode=mode)
            cpu += seconds
            records += token_records(out, out.images.cpu().numpy())
        kinds = sorted({r["kind"] for r in records})
        per_mode[mode] = {"all": summarise(records), "cpu_s_per_image": cpu / images,
                          "by_background": {k: summarise([r for r in records if r["kind"] == k]) for k in kinds}}
        cpu_total += cpu
    return per_mode, cpu_total / images


def format_table(per_mode: dict) -> str:
    lines = ["| mode | background kind | tokens | share | H(p) nats | acceptance a(x) | TVD(p, q) | distortion |",
             "|---|---|---|---|---|---|---|---|"]
    for mode, res in per_mode.items():
        for kind, table in [("all", res["all"]), *res["by_background"].items()]:
            for name, r in table.items():
                lines.append(f"| {mode} | {kind} | {name} | {r['share']:.3f} | {r['entropy']:.2f} | "
                             f"{r['accept']:.3f} | {r['tvd']:.3f} | "
                             f"{r['distortion']:.4f} |")
    if {"csd", "sjd"} <= set(per_mode):
        lines += ["", "| csd − sjd | tokens | Δ acceptance | Δ H(p) |", "|---|---|---|---|"]
        for name in CLASSES:
            c, s = per_mode["csd"]["all"][name], per_mode["sjd"]["all"][name]
            lines.append(f"| all | {name} | {c['accept'] - s['accept']:+.3f} | {c['entropy'] - s['entropy']:+.2f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common.add_common(parser, images=200, out="docs/img/scenes_content.json")
    parser.add_argument("--modes", default="sjd,csd")
    parser.add_argument("--batch", type=int, default=8)
    args = parser.parse_args()
    entry = common.load(args)
    per_mode, cpu_per_image = measure(entry, args.modes.split(","), args.images, args.batch)
    table = format_table(per_mode)
    print(table)
    print(common.estimate(cpu_per_image, 0.0, args.images, args.full_images))
    common.write({**common.machine(args), "images": args.images, "batch": args.batch, "results": per_mode,
                  "table": table}, args.out)


if __name__ == "__main__":
    main()
