"""The summary of a run: per mode, forward passes per image (mean, spread), speed-up against ar, wall time,
distortion and — for models with quality measures — each measure (digits: accuracy, Fréchet distance); and its table."""

from __future__ import annotations

from dataclasses import asdict

import numpy as np
import torch

from ..config.generation import run_label

__all__ = ["summarize", "format_table", "spread", "unmeasured_note"]


def spread(values) -> dict:
    values = np.asarray(values, dtype=np.float64)
    return {"mean": float(values.mean()), "std": float(values.std()), "min": float(values.min()),
            "max": float(values.max())}


def summarize(gathered, modes, prompts, entry, manifest, tokens_per_image, world_size, batch_size, wall) -> dict:
    records = [r for part in gathered for r in part["records"]]
    by_mode = {mode: sorted((r for r in records if r["mode"] == mode), key=lambda r: r["index"]) for mode in modes}
    per_mode = {}
    for mode, rows in by_mode.items():
        if not rows:
            continue
        stats = {"images": len(rows),
                 "forward_passes_per_image": spread([r["forward_passes"] for r in rows]),
                 "wall_seconds": float(sum(r["wall_seconds"] for r in rows)),
                 "wall_seconds_per_image": float(np.mean([r["wall_seconds"] for r in rows])),
                 "mean_distortion": float(np.mean([r["mean_distortion"] for r in rows]))}
        if entry.quality is not None:
            tokens = torch.tensor([r["tokens"] for r in rows], dtype=torch.int64)
            try:
                measured = entry.quality(tokens, [r["prompt"] for r in rows])
                stats.update({k: float(v) for k, v in measured.items() if v is not None})  # no distance of one image
            except ValueError as exc:
                stats["quality_error"] = str(exc)
        per_mode[mode] = stats
    # speed-up vs ar: the measured ar passes when ar ran, else AR's exact count (one pass per token)
    ar_passes = per_mode["ar"]["forward_passes_per_image"]["mean"] if "ar" in per_mode else float(tokens_per_image)
    for stats in per_mode.values():
        stats["speedup_vs_ar"] = ar_passes / stats["forward_passes_per_image"]["mean"]
    summary = {
        "model": manifest["model"], "modes": list(modes), "num_prompts": len(prompts), "seed": manifest["seed"],
        "generate": manifest["generate"], "coupling": manifest["coupling"], "tree": manifest.get("tree"),
        "world_size": world_size, "batch_size": batch_size, "tokens_per_image": tokens_per_image,
        "images": len(records), "expected_images": len(prompts) * len(modes),
        "generated_this_run": sum(p["generated"] for p in gathered),
        "skipped_complete": sum(p["skipped"] for p in gathered),
        "redone_corrupt_or_partial": sum(p["redone"] for p in gathered),
        "wall_seconds": wall, "per_mode": per_mode, "measures": [asdict(m) for m in entry.measures],
        "per_rank": [{"rank": p["rank"], "images": len(p["records"]), "generated": p["generated"]} for p in gathered],
    }
    summary["table"] = format_table(summary)
    return summary


def unmeasured_note(labels: list[str]) -> str:
    """What a '-' in a table of runs means (the measures ``labels`` had no value: e.g. a background accuracy where no
    prompt names a background, a Fréchet distance of one image)."""
    return f"-: no value of {', '.join(labels)} for these images and prompts"


def format_table(summary: dict) -> str:
    """One row per mode, named as compare and sweep name runs (sjd and csd with the run's coupling); a measure a mode
    has no value for is a '-'."""
    per_mode = summary["per_mode"]
    measures = summary["measures"]  # the model's quality measures (zoo.Measure as dicts), shown where one was measured
    if not any(m["name"] in s for m in measures for s in per_mode.values()):
        measures = []
    labels = {mode: run_label(mode, summary.get("coupling")) for mode in per_mode}
    width = max(6, *map(len, labels.values()))
    header = (f"{'mode':{width}} {'images':>7} {'passes/img':>16} {'speed-up':>9} {'wall s':>9} {'s/img':>8} "
              f"{'distortion':>10}")
    header += "".join(f" {m['label']:>10}" for m in measures)
    lines = [header, "-" * len(header)]
    for mode, s in per_mode.items():
        passes = s["forward_passes_per_image"]
        line = (f"{labels[mode]:{width}} {s['images']:7d} {passes['mean']:9.1f}±{passes['std']:<6.1f} "
                f"{s['speedup_vs_ar']:8.2f}x {s['wall_seconds']:9.2f} {s['wall_seconds_per_image']:8.3f} "
                f"{s['mean_distortion']:10.4f}")
        line += "".join(f" {format(s[m['name']], m['fmt']) if m['name'] in s else '-':>10}" for m in measures)
        lines.append(line)
    missing = [m["label"] for m in measures if any(m["name"] not in s for s in per_mode.values())]
    if missing:
        lines.append(unmeasured_note(missing))
    lines.append(f"({summary['world_size']} process(es); wall s = generation seconds summed over ranks; speed-up = "
                 f"ar passes / passes per image)")
    return "\n".join(lines)
