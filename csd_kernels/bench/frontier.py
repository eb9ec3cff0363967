"""The speed–quality frontier of a zoo model: every decoding mode, CSD over a λ × τ grid, draft trees, mean ± spread
over seeds.

``csd sweep`` (and ``benchmarks/frontier_digits.py``) run :func:`sweep`. Every setting generates the same prompts
(each class ``per_class`` times) with the same row seeds, in batches of :data:`BATCH`; per seed it records forward
passes per image (each row's own count), forward passes per batch, the mean per-image distortion, wall seconds per
image and the zoo's quality measure; the summary holds mean and standard deviation over the seeds. The held-out real
images of the same prompts, measured the same way, are the ceiling (``heldout``).

Result layout (``sweep(...)``, also the JSON): ``results[label][metric] = {"mean", "std"}``, ``per_seed`` (one record
per setting and seed), ``heldout[metric]``, ``pareto`` (labels), ``fast_inside_ar_band`` (labels), ``best_lossless``.
"""

from __future__ import annotations

import csv
import json
import os
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass

import numpy as np

from ..decoding.validation import TREE_MODES

LAMBDAS = (0.0, 0.05, 0.1, 0.25, 0.5, 1.0)
TAUS = (0.3, 0.65, 1.0)
CSD_COUPLINGS = ("independent", "maximal")
TREES = ((2, 2), (3, 2))  # (K, D) of the draft-tree settings (generate(tree=...), the static loop; docs/trees.md)
BATCH = 16
SPEEDUP_TARGET = 3.0
METRICS = ("passes", "batch_passes", "distortion", "accuracy", "frechet", "wall_per_image")


@dataclass(frozen=True)
class Setting:
    label: str
    mode: str
    coupling: str | None = None
    entropy_coef: float | None = None  # csd only
    tvd_threshold: float | None = None  # csd only
    tree: tuple[int, int] | None = None  # (K, D): a draft tree in every window (the static loop)
    static: bool = False  # the static loop (every row its own window); a tree implies it

    @property
    def lossless(self) -> bool:
        return self.mode in ("ar", "sjd") or (self.mode == "csd" and self.entropy_coef == 0.0)

    def generate_kwargs(self) -> dict:
        kwargs = dict(mode=self.mode, coupling=self.coupling)
        if self.mode == "csd":
            kwargs.update(entropy_coef=self.entropy_coef, tvd_threshold=self.tvd_threshold)
        if self.static or self.tree is not None:
            kwargs["static"] = True
        if self.tree is not None:
            kwargs["tree"] = self.tree
        return kwargs


def settings(lambdas=LAMBDAS, taus=TAUS, couplings=CSD_COUPLINGS, trees=TREES,
             tree_modes=TREE_MODES) -> list[Setting]:
    """ar, sjd (independent / maximal / gumbel next drafts), gsd, csd over couplings × λ × τ, then with trees the
    chain sjd+maximal in the static loop (the trees' loop: the like-for-like reference) and for each tree (K, D):
    sjd+maximal+tree and (csd in tree_modes, maximal in couplings) csd+maximal+tree over λ × τ."""
    fixed = [Setting("ar", "ar"), Setting("sjd", "sjd", "independent"), Setting("sjd+maximal", "sjd", "maximal"),
             Setting("sjd+gumbel", "sjd", "gumbel"), Setting("gsd", "gsd")]
    csd = [Setting(f"csd{'' if c == 'independent' else '+' + c} λ={lam:g} τ={tau:g}", "csd", c, lam, tau)
           for c in couplings for lam in lambdas for tau in taus]
    tree_sjd = [Setting(f"sjd+maximal+tree {k}x{d}", "sjd", "maximal", tree=(k, d))
                for k, d in trees if "sjd" in tree_modes]
    if trees:
        tree_sjd.insert(0, Setting("sjd+maximal static", "sjd", "maximal", static=True))
    tree_csd = [Setting(f"csd+maximal+tree {k}x{d} λ={lam:g} τ={tau:g}", "csd", "maximal", lam, tau, (k, d))
                for k, d in trees for lam in lambdas for tau in taus if "csd" in tree_modes and "maximal" in couplings]
    return fixed + csd + tree_sjd + tree_csd


# ------------------------------------------------------------------------------------------------------- running
def _init_worker() -> None:
    import torch

    torch.set_num_threads(1)  # one thread per process: the workers share the cores


def run_setting(model_name: str, setting: Setting, seed: int, prompts: list[str]) -> dict:
    """One setting, one seed: ``prompts`` in batches of BATCH rows; row b of the batch starting at ``start`` has
    seed ``seed * len(prompts) + start`` (+ b inside generate), so every setting sees the same streams."""
    import torch

    from .. import zoo
    from ..decoding import generate

    entry = zoo.load(model_name)
    tokens, row_passes, batch_passes, distortion = [], [], [], []
    begin = time.perf_counter()
    for start in range(0, len(prompts), BATCH):
        chunk = prompts[start:start + BATCH]
        out = generate(entry.model, **entry.prompt_inputs(chunk), seed=seed * len(prompts) + start,
                       **{**entry.defaults, **setting.generate_kwargs()})
        tokens.append(out.tokens)
        row_passes.extend(out.passes_per_row().tolist())
        batch_passes.append(out.forward_passes)
        distortion.extend(out.distortion_per_row().tolist())
    wall = time.perf_counter() - begin
    quality = entry.quality(torch.cat(tokens), prompts)
    return {"passes": float(np.mean(row_passes)), "batch_passes": float(np.mean(batch_passes)),
            "distortion": float(np.mean(distortion)), "accuracy": quality["accuracy"],
            "frechet": quality["frechet"], "wall_per_image": wall / len(prompts)}


def sweep(model_name: str = "digits", per_class: int = 8, seeds=(0, 1, 2), workers: int = 2,
          grid: list[Setting] | None = None, classes=tuple(str(c) for c in range(10))) -> dict:
    """Runs every setting of ``grid`` (default :func:`settings`) for every seed on each of ``classes`` (prompts)
    ``per_class`` times; returns the result layout above."""
    from .. import zoo

    entry = zoo.load(model_name)
    if entry.quality is None:
        raise ValueError(f"--model {model_name}: no quality measure, nothing to trade speed against")
    grid = settings() if grid is None else grid
    if "ar" not in {s.label for s in grid}:
        raise ValueError("the grid needs the setting 'ar': the band every other setting is measured against")
    prompts = [c for c in classes for _ in range(per_class)]
    jobs = [(s, seed) for s in grid for seed in seeds]
    begin = time.perf_counter()
    with ProcessPoolExecutor(workers, initializer=_init_worker) as pool:
        done = list(pool.map(run_setting, [model_name] * len(jobs), *zip(*jobs), [prompts] * len(jobs)))
    by_label = {s.label: s for s in grid}
    rows = {label: summarise([r for (s, _), r in zip(jobs, done) if s.label == label]) for label in by_label}
    heldout = summarise([entry.heldout_quality(prompts, seed) for seed in seeds]) if entry.heldout_quality else None
    return {"model": model_name, "per_class": per_class, "seeds": list(seeds), "batch": BATCH,
            "seconds": round(time.perf_counter() - begin, 1), "workers": workers,
            "settings": {k: asdict(v) for k, v in by_label.items()}, "results": rows, "heldout": heldout,
            "per_seed": [dict(label=s.label, seed=seed, **r) for (s, seed), r in zip(jobs, done)],
            **answers(rows, by_label)}


# ------------------------------------------------------------------------------------------------------ analysis
def summarise(records: list[dict]) -> dict:
    """{metric: {"mean", "std"}} over records (one per seed) that share their keys."""
    return {key: {"mean": float(np.mean([r[key] for r in records])), "std": float(np.std([r[key] for r in records]))}
            for key in records[0]}


def inside_band(row: dict, ar: dict) -> bool:
    """Quality inside ar's spread: accuracy >= ar's mean - std and Fréchet <= ar's mean + std (over seeds)."""
    return (row["accuracy"]["mean"] >= ar["accuracy"]["mean"] - ar["accuracy"]["std"]
            and row["frechet"]["mean"] <= ar["frechet"]["mean"] + ar["frechet"]["std"])


def pareto(rows: dict) -> list[str]:
    """Labels not dominated in (fewer passes, higher accuracy, lower Fréchet distance) by their means."""
    key = {label: np.array([r["passes"]["mean"], -r["accuracy"]["mean"], r["frechet"]["mean"]])
           for label, r in rows.items()}
    front = [a for a in rows if not any(np.all(key[b] <= key[a]) and np.any(key[b] < key[a]) for b in rows)]
    return sorted(front, key=lambda label: rows[label]["passes"]["mean"])


def answers(rows: dict, grid: dict) -> dict:
    """The Pareto set, the settings >= SPEEDUP_TARGET fewer passes than ar inside ar's band, the best lossless."""
    ar = rows["ar"]
    fast = [label for label, r in rows.items()
            if ar["passes"]["mean"] / r["passes"]["mean"] >= SPEEDUP_TARGET and inside_band(r, ar)]
    lossless = [label for label in rows if grid[label].lossless and label != "ar"]
    fast.sort(key=lambda label: rows[label]["passes"]["mean"])
    return {"pareto": pareto(rows), "fast_inside_ar_band": fast,
            "best_lossless": min(lossless, key=lambda label: rows[label]["passes"]["mean"]) if lossless else None}


# ------------------------------------------------------------------------------------------------------- outputs
def format_table(result: dict, labels: list[str] | None = None) -> str:
    """Markdown table of ``labels`` (default: the Pareto set), then the held-out real images."""
    rows = result["results"]
    ar_passes = rows["ar"]["passes"]["mean"]
    pm = lambda r, k, f: f"{format(r[k]['mean'], f)} ± {format(r[k]['std'], f)}"  # noqa: E731
    lines = ["| setting | passes / image | speed-up | passes / batch of 16 | distortion / token | accuracy | Fréchet |",
             "|---|---|---|---|---|---|---|"]
    for label in labels if labels is not None else result["pareto"]:
        r = rows[label]
        lines.append(f"| {label} | {pm(r, 'passes', '.1f')} | {ar_passes / r['passes']['mean']:.2f}x | "
                     f"{pm(r, 'batch_passes', '.1f')} | {pm(r, 'distortion', '.4f')} | {pm(r, 'accuracy', '.3f')} | "
                     f"{pm(r, 'frechet', '.2f')} |")
    if result.get("heldout"):
        h = result["heldout"]
        lines.append(f"| held-out real digits | | | | | {pm(h, 'accuracy', '.3f')} | {pm(h, 'frechet', '.2f')} |")
    return "\n".join(lines)


def summary_lines(result: dict) -> list[str]:
    rows, best = result["results"], result["best_lossless"]
    lines = [f">= {SPEEDUP_TARGET:g}x fewer passes than ar with quality inside ar's band: "
             + (", ".join(result["fast_inside_ar_band"]) or "none")]
    if best is not None:
        lines.append(f"best lossless: {best} ({rows[best]['passes']['mean']:.1f} passes per image, "
                     f"{rows['ar']['passes']['mean'] / rows[best]['passes']['mean']:.2f}x)")
    return lines


def write_csv(result: dict, path: str) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["label", "mode", "coupling", "entropy_coef", "tvd_threshold", "tree", "static"]
                        + [f"{k}_{s}" for k in METRICS for s in ("mean", "std")])
        for label, r in result["results"].items():
            s = result["settings"][label]
            tree = "" if s.get("tree") is None else "x".join(map(str, s["tree"]))
            setting = [label, s["mode"], s["coupling"] or "", _blank(s["entropy_coef"]), _blank(s["tvd_threshold"]),
                       tree, int(bool(s.get("static")) or bool(tree))]
            writer.writerow(setting + [f"{r[k][stat]:.6g}" for k in METRICS for stat in ("mean", "std")])


def _blank(value) -> str:
    return "" if value is None else f"{value:g}"


def save(result: dict, prefix: str) -> dict:
    """Writes PREFIX.json, PREFIX.csv and PREFIX.png; returns their paths."""
    os.makedirs(os.path.dirname(prefix) or ".", exist_ok=True)
    paths = {ext: f"{prefix}.{ext}" for ext in ("json", "csv", "png")}
    with open(paths["json"], "w") as f:
        json.dump({**result, "pareto_table": format_table(result)}, f, indent=1)
    write_csv(result, paths["csv"])
    from .frontier_plot import plot

    plot(result, paths["png"])
    return paths
