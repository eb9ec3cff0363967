"""The speed–quality frontier of a zoo model: every decoding mode, CSD over a λ × τ grid, GSD over its group (k, δ),
every other acceptance rule over a grid of its parameters (``rule_grids``: ARsample's constants, LANTERN's δ,
LANTERN++'s λ), draft trees, mean ± spread over seeds.

``csd sweep`` (and ``benchmarks/frontier_digits.py``) run :func:`sweep`. Every setting generates the same prompts
(digits: each class ``per_class`` times; scenes: a fixed prompt mix, :func:`csd_kernels.zoo.measurement_prompts`) with
the same row seeds, in batches of :data:`BATCH`; per seed it records forward passes per image (each row's own count),
forward passes per batch, the mean per-image distortion, wall seconds per image and the zoo model's quality measures
(``ZooModel.measures``: name, label, which way is better); the summary holds mean and standard deviation over the
seeds. The model's ceiling (digits: held-out real images of the same prompts; scenes: rendered scenes through the
tokenizer and back), measured the same way, is ``heldout``.

Result layout (``sweep(...)``, also the JSON): ``results[label][metric] = {"mean", "std"}``, ``per_seed`` (one record
per setting and seed), ``heldout[metric]``, ``measures`` (the model's, as dicts), ``ceiling`` (what ``heldout``
measured), ``pareto`` (labels), ``fast_inside_ar_band`` (labels), ``fewest_inside_ar_band``, ``best_lossless``,
``csd_vs_gsd``.
"""

from __future__ import annotations

import csv
import multiprocessing
import os
import time
from dataclasses import asdict, dataclass

import numpy as np

from ..config.acceptance import GRID_RULES, PARAMS, default_lantern_k, rule_named
from ..config.generation import DEFAULT_COUPLING, run_label
from ..config.modes import MODE_TABLE, exact_distortion
from ..constants import DEFAULT_GROUP_DELTA, DEFAULT_GROUP_RANK
from ..decoding.validation import TREE_MODES
from ..fileio.outputs import Output
from ..zoo import Measure
from .frontier_plot import spread_of

LAMBDAS = (0.0, 0.05, 0.1, 0.25, 0.5, 1.0)
TAUS = (0.3, 0.65, 1.0)
SJD_COUPLINGS = ("independent", "maximal", "gumbel")
CSD_COUPLINGS = ("independent", "maximal")
TREES = ((2, 2), (3, 2))  # (K, D) of the draft-tree settings (generate(tree=...), the static loop; docs/trees.md)
BATCH = 16
SPEEDUP_TARGET = 3.0
SPEED_METRICS = ("passes", "batch_passes", "distortion")  # then the model's measures, then wall_per_image


@dataclass(frozen=True)
class Setting:
    label: str
    mode: str
    coupling: str | None = None
    entropy_coef: float | None = None  # csd only
    tvd_threshold: float | None = None  # csd only
    tree: tuple[int, int] | None = None  # (K, D): a draft tree in every window (the static loop)
    static: bool = False  # the static loop (every row its own window); a tree implies it
    group_rank: int | None = None  # gsd only: the group (k, δ); None: generate()'s defaults
    group_delta: float | None = None
    params: tuple = ()  # the other rules' parameters, (name, value) pairs (config/acceptance.py's names)
    window: int | None = None  # None: the model's default window

    @property
    def lossless(self) -> bool:
        return self.mode in ("ar", "sjd") or (self.mode == "csd" and self.entropy_coef == 0.0)

    @property
    def rule(self) -> str | None:
        """The acceptance rule the setting verifies with (config/modes.py), None for jd."""
        return MODE_TABLE[self.mode].rule

    def generate_kwargs(self) -> dict:
        kwargs = dict(mode=self.mode, coupling=self.coupling)
        if self.mode == "csd":
            kwargs.update(entropy_coef=self.entropy_coef, tvd_threshold=self.tvd_threshold)
        kwargs.update(self.params)
        kwargs.update(exact_distortion(self.mode))  # the distortion axis, exact
        if self.static or self.tree is not None:
            kwargs["static"] = True
        if self.tree is not None:
            kwargs["tree"] = self.tree
        if self.group_rank is not None:
            kwargs.update(group_rank=self.group_rank, group_delta=self.group_delta)
        if self.window is not None:
            kwargs["window"] = self.window
        return kwargs


def rule_settings(rule_grids: dict, vocab: int | None = None) -> list[Setting]:
    """For each rule of ``rule_grids`` ({rule: [{param: value}, ...]}, the other rules than strict, csd and gsd) one
    setting per point of its grid, in its mode with the default coupling, labelled by the table (e.g.
    "lantern+maximal δ=0.1 k=32"; a parameter the point leaves out takes its default; a lantern rule's default k
    depends on the codebook, so a point without lantern_k needs ``vocab``, the model's codebook size)."""
    out = []
    for rule, points in rule_grids.items():
        spec, mode = rule_named(rule), MODE_TABLE[rule]
        coupling = DEFAULT_COUPLING if mode.coupling else None
        for point in points:
            values = {p.name: point.get(p.name, p.default) for p in spec.params}
            if spec.needs_neighbours and "lantern_k" not in point:
                if vocab is None:
                    raise ValueError(f"{rule}: its default lantern_k depends on the codebook; pass vocab=")
                values["lantern_k"] = default_lantern_k(rule, vocab)
            label = " ".join([_label(rule, coupling or "independent"), *spec.label.format(**values).split(" ")[1:]])
            out.append(Setting(label, rule, coupling, params=tuple(sorted(point.items()))))
    return out


def model_vocab(model: str, **options) -> int:
    """The codebook size of a zoo model (loads it): what rule_settings labels a lantern rule's default k by."""
    from ..models import get_adapter
    from ..zoo import load

    return get_adapter(load(model, **options).model).vocab_size


def grid_points(values: dict) -> list[dict]:
    """Every combination of {param: (values...)}: [{param: value}, ...] (one empty point without values)."""
    points = [{}]
    for name, choices in values.items():
        points = [dict(point, **{name: v}) for point in points for v in choices]
    return points


def rule_grids(values: dict) -> dict:
    """{param: (values...)} of any rules' parameters -> {rule: points}: each rule with a swept parameter, over the
    product of its swept parameters (the others at their defaults). csd and gsd have their own grids (settings)."""
    grids = {}
    for name in values:
        if name not in PARAMS:
            raise ValueError(f"{name}: not a rule parameter (one of {', '.join(PARAMS)})")
    for rule in GRID_RULES:
        mine = {name: v for name, v in values.items() if name in rule_named(rule).param_names()}
        if mine and set(mine) != {"lantern_k"}:
            grids[rule] = grid_points(mine)
    return grids


def settings(lambdas=LAMBDAS, taus=TAUS, couplings=CSD_COUPLINGS, trees=TREES,
             tree_modes=TREE_MODES, gsd=(), sjd_couplings=SJD_COUPLINGS, windows=(),
             rules: dict | None = None, vocab: int | None = None) -> list[Setting]:
    """ar, sjd (each next-draft coupling of ``sjd_couplings``: independent / maximal / gumbel), gsd (its defaults,
    then each (k, δ) of ``gsd`` but those), csd over couplings × λ × τ, each rule of ``rules`` over its grid
    (rule_settings), then with trees the chain sjd+maximal in the
    static loop (the trees' loop: the like-for-like reference) and for each tree (K, D): sjd+maximal+tree and (csd in
    tree_modes, maximal in couplings) csd+maximal+tree over λ × τ. Each window of ``windows`` repeats the sjd and
    csd chain settings at that window (labels " W32"; the others run at the model's default window)."""
    fixed = [Setting("ar", "ar"), *(Setting(_label("sjd", c), "sjd", c) for c in sjd_couplings), Setting("gsd", "gsd")]
    fixed += [Setting(f"gsd k={k} δ={delta:g}", "gsd", group_rank=k, group_delta=delta) for k, delta in gsd
              if (k, delta) != (DEFAULT_GROUP_RANK, DEFAULT_GROUP_DELTA)]
    csd = [Setting(f"{_label('csd', c)} λ={lam:g} τ={tau:g}", "csd", c, lam, tau)
           for c in couplings for lam in lambdas for tau in taus]
    csd += [Setting(f"{s.label} W{w}", s.mode, s.coupling, s.entropy_coef, s.tvd_threshold, window=w)
            for w in windows for s in fixed[1:1 + len(sjd_couplings)] + csd]
    csd += rule_settings(rules or {}, vocab)
    tree_sjd = [Setting(f"sjd+maximal+tree {k}x{d}", "sjd", "maximal", tree=(k, d))
                for k, d in trees if "sjd" in tree_modes]
    if trees:
        tree_sjd.insert(0, Setting("sjd+maximal static", "sjd", "maximal", static=True))
    tree_csd = [Setting(f"csd+maximal+tree {k}x{d} λ={lam:g} τ={tau:g}", "csd", "maximal", lam, tau, (k, d))
                for k, d in trees for lam in lambdas for tau in taus if "csd" in tree_modes and "maximal" in couplings]
    return fixed + csd + tree_sjd + tree_csd


def _label(mode: str, coupling: str) -> str:
    """A setting's name: the mode and its next drafts' coupling (sjd+independent, csd+maximal): config's run_label."""
    return run_label(mode, coupling)


# ------------------------------------------------------------------------------------------------------- running
def _init_worker() -> None:
    import signal

    import torch

    torch.set_num_threads(1)  # one thread per process: the workers share the cores
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group: the parent stops them
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def run_setting(model_name: str, setting: Setting, seed: int, prompts: list[str], options: dict | None = None) -> dict:
    """One setting, one seed: ``prompts`` in batches of BATCH rows; row b of the batch starting at ``start`` has
    seed ``seed * len(prompts) + start`` (+ b inside generate), so every setting sees the same streams."""
    import torch

    from .. import zoo
    from ..decoding import generate

    entry = zoo.load(model_name, **(options or {}))
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
    noise = {f"{m.name}_se": quality[f"{m.name}_se"] for m in entry.measures if f"{m.name}_se" in quality}
    return {"passes": float(np.mean(row_passes)), "batch_passes": float(np.mean(batch_passes)),
            "distortion": float(np.mean(distortion)), **{m.name: quality[m.name] for m in entry.measures},
            "wall_per_image": wall / len(prompts),
            "passes_se": float(np.std(row_passes, ddof=1) / np.sqrt(len(row_passes))), **noise,
            "row_passes": [float(x) for x in row_passes]}


def _run_job(job: tuple) -> dict:
    return run_setting(*job)


def progress_line(done: int, total: int, label: str, passes: float, seconds: float) -> str:
    """The line a long measurement prints as each run finishes: how far it is, what finished, how fast it was."""
    return f"[{done}/{total}] {label}: {passes:.1f} passes/image, {seconds:.0f} s so far"


def sweep(model_name: str = "digits", per_class: int = 8, seeds=(0, 1, 2), workers: int = 2,
          grid: list[Setting] | None = None, classes=tuple(str(c) for c in range(10)), prompts=None,
          options: dict | None = None, progress=None) -> dict:
    """Runs every setting of ``grid`` (default :func:`settings`) for every seed on ``prompts`` (default: each of
    ``classes`` ``per_class`` times) with the model ``zoo.load(model_name, **options)``; returns the result layout
    above. ``progress``: called with one line per setting as its last seed finishes (:func:`progress_line`)."""
    from .. import zoo

    options = {k: v for k, v in (options or {}).items() if v is not None}
    entry = zoo.load(model_name, **options)
    if entry.quality is None or not entry.measures:
        raise ValueError(f"--model {model_name}: no quality measure, nothing to trade speed against")
    grid = settings() if grid is None else grid
    if "ar" not in {s.label for s in grid}:
        raise ValueError("the grid needs the setting 'ar': the band every other setting is measured against")
    given = prompts is not None
    prompts = list(prompts) if given else [c for c in classes for _ in range(per_class)]
    if len(prompts) < 2:
        raise ValueError(f"{len(prompts)} prompt(s): a sweep needs 2 images or more (the Fréchet distance is of a set)")
    jobs = [(s, seed) for s in grid for seed in seeds]
    begin = time.perf_counter()
    heldout = None  # first: what it caches (the model, a feature basis) the forked workers inherit
    if entry.heldout_quality:
        heldout = summarise([{m.name: entry.heldout_quality(prompts, seed)[m.name] for m in entry.measures}
                             for seed in seeds])
    with multiprocessing.Pool(workers, initializer=_init_worker) as pool:  # leaving it stops the workers, on a
        # failure or a signal too (the workers ignore SIGINT: this process answers it)
        done = []
        for record in pool.imap(_run_job, [(model_name, s, seed, prompts, options) for s, seed in jobs]):
            done.append(record)
            setting = jobs[len(done) - 1][0]
            if progress is not None and (len(done) == len(jobs) or jobs[len(done)][0] is not setting):
                mine = [r for (s, _), r in zip(jobs, done) if s is setting]
                progress(progress_line(len(done) // len(seeds), len(grid), setting.label,
                                       float(np.mean([r["passes"] for r in mine])), time.perf_counter() - begin))
    by_label = {s.label: s for s in grid}
    rows = {label: summarise([r for (s, _), r in zip(jobs, done) if s.label == label]) for label in by_label}
    return {"model": model_name, "model_options": zoo.describe_options(options),
            "per_class": None if given else per_class, "images": len(prompts), "seeds": list(seeds),
            "batch": min(BATCH, len(prompts)),
            "seconds": round(time.perf_counter() - begin, 1), "workers": workers,
            "measures": [asdict(m) for m in entry.measures], "ceiling": entry.ceiling_label,
            "settings": {k: asdict(v) for k, v in by_label.items()}, "results": rows, "heldout": heldout,
            "per_seed": [dict(label=s.label, seed=seed, **r) for (s, seed), r in zip(jobs, done)],
            **answers(rows, by_label, entry.measures, spread=spread_of(seeds))}


# ------------------------------------------------------------------------------------------------------ analysis
def summarise(records: list[dict]) -> dict:
    """{metric: {"mean", "std"}} over records (one per seed) that share their keys, with "se" (the standard error
    of the mean over the images of every seed) where a record carries ``metric_se``; lists (each row's passes) stay
    in the per-seed records."""
    out = {}
    for key in records[0]:
        if key.endswith("_se") or isinstance(records[0][key], list):
            continue
        values = [r[key] for r in records]
        out[key] = {"mean": float(np.mean(values)), "std": float(np.std(values))}
        if f"{key}_se" in records[0]:
            out[key]["se"] = float(np.sqrt(sum(r[f"{key}_se"] ** 2 for r in records)) / len(records))
    return out


def inside_band(row: dict, ar: dict, measures, spread: str = "std") -> bool:
    """Quality inside ar's band on every measure: >= ar's mean - its spread where higher is better, <= ar's mean +
    its spread where lower is. ``spread``: "std" over seeds, or "se" (one seed: the standard error over the images,
    where the measure has one)."""
    width = {m.name: ar[m.name].get(spread, ar[m.name]["std"]) for m in measures}
    return all(row[m.name]["mean"] >= ar[m.name]["mean"] - width[m.name] if m.higher_is_better
               else row[m.name]["mean"] <= ar[m.name]["mean"] + width[m.name] for m in measures)


def _cost(r: dict, measures) -> np.ndarray:
    """(passes, then each measure signed so that lower is better) by the means."""
    return np.array([r["passes"]["mean"]] + [-r[m.name]["mean"] if m.higher_is_better else r[m.name]["mean"]
                                             for m in measures])


def _dominates(a: np.ndarray, b: np.ndarray) -> bool:
    return bool(np.all(a <= b) and np.any(a < b))


def pareto(rows: dict, measures) -> list[str]:
    """Labels not dominated in (fewer passes, better on every measure) by their means."""
    key = {label: _cost(r, measures) for label, r in rows.items()}
    front = [a for a in rows if not any(_dominates(key[b], key[a]) for b in rows)]
    return sorted(front, key=lambda label: rows[label]["passes"]["mean"])


def rule_fronts(rows: dict, grid: dict, measures) -> dict:
    """{rule: its settings on its own Pareto front, by passes} for every relaxed rule the grid holds: the curve of
    that rule in the frontier plot."""
    fronts = {}
    for label, setting in grid.items():
        if setting.rule not in (None, "strict") and setting.tree is None:
            fronts.setdefault(setting.rule, []).append(label)
    return {rule: pareto({label: rows[label] for label in labels}, measures) for rule, labels in fronts.items()}


def csd_vs_gsd(rows: dict, grid: dict, measures) -> dict:
    """The paper's claim, csd beats gsd at equal passes, by dominance of the means: for each gsd setting the csd
    settings with no more passes and no worse quality on every measure (better somewhere), and for each csd setting
    on csd's own Pareto front the gsd settings that dominate it."""
    key = {label: _cost(r, measures) for label, r in rows.items()}
    csd = [label for label in rows if grid[label].mode == "csd"]
    gsd = [label for label in rows if grid[label].mode == "gsd"]
    front = pareto({label: rows[label] for label in csd}, measures) if csd else []
    return {"gsd_dominated_by": {g: [c for c in csd if _dominates(key[c], key[g])] for g in gsd},
            "csd_front_dominated_by": {c: [g for g in gsd if _dominates(key[g], key[c])] for c in front}}


def answers(rows: dict, grid: dict, measures, spread: str = "std") -> dict:
    """The Pareto set, the settings >= SPEEDUP_TARGET fewer passes than ar inside ar's band, the one with the fewest
    passes inside it, the best lossless, csd against gsd."""
    ar = rows["ar"]
    band = sorted((label for label, r in rows.items() if label != "ar" and inside_band(r, ar, measures, spread)),
                  key=lambda label: rows[label]["passes"]["mean"])
    fast = [label for label in band if ar["passes"]["mean"] / rows[label]["passes"]["mean"] >= SPEEDUP_TARGET]
    lossless = [label for label in rows if grid[label].lossless and label != "ar"]
    return {"pareto": pareto(rows, measures), "fast_inside_ar_band": fast,
            "fewest_inside_ar_band": band[0] if band else None,
            "best_lossless": min(lossless, key=lambda label: rows[label]["passes"]["mean"]) if lossless else None,
            "csd_vs_gsd": csd_vs_gsd(rows, grid, measures), "rule_fronts": rule_fronts(rows, grid, measures)}


# ------------------------------------------------------------------------------------------------------- outputs
def measures_of(result: dict) -> list[Measure]:
    """The model's quality measures a result was measured with."""
    return [Measure(**m) for m in result["measures"]]


def cited(result: dict) -> list[str]:
    """The rows a frontier table shows: ar (the reference), the Pareto set, and every setting the summary lines
    name (the fewest passes inside ar's band, the best lossless), in order of passes."""
    rows = result["results"]
    named = ["ar", *result["pareto"], result.get("fewest_inside_ar_band"), result.get("best_lossless")]
    return sorted({label for label in named if label in rows}, key=lambda label: rows[label]["passes"]["mean"])


def _batch_header(result: dict) -> str:
    """"passes / batch of N", or "of up to N" when the last batch is smaller."""
    batch = result.get("batch", BATCH)
    return f"passes / batch of {'' if result.get('images', batch) % batch == 0 else 'up to '}{batch}"


def format_table(result: dict, labels: list[str] | None = None) -> str:
    """Markdown table of ``labels`` (default: :func:`cited`: ar, the Pareto set and the settings the summary lines
    name), then the model's ceiling (held-out real images); mean ± std over the seeds, or with one seed ± the
    standard error over the images where the measure has one."""
    rows, measures = result["results"], measures_of(result)
    ar_passes = rows["ar"]["passes"]["mean"]
    spread = spread_of(result.get("seeds", ()))
    pm = lambda r, k, f: f"{format(r[k]['mean'], f)} ± {format(r[k].get(spread, r[k]['std']), f)}"  # noqa: E731
    lines = [f"| setting | passes / image | speed-up | {_batch_header(result)} | distortion / token | "
             + " | ".join(m.label for m in measures) + " |", "|---|---|---|---|---|" + "---|" * len(measures)]
    for label in labels if labels is not None else cited(result):
        r = rows[label]
        lines.append(f"| {label} | {pm(r, 'passes', '.1f')} | {ar_passes / r['passes']['mean']:.2f}x | "
                     f"{pm(r, 'batch_passes', '.1f')} | {pm(r, 'distortion', '.4f')} | "
                     + " | ".join(pm(r, m.name, m.fmt) for m in measures) + " |")
    if result.get("heldout"):
        h = result["heldout"]
        lines.append(f"| {result['ceiling']} | | | | | " + " | ".join(pm(h, m.name, m.fmt) for m in measures) + " |")
    return "\n".join(lines)


def summary_lines(result: dict) -> list[str]:
    rows, best, fewest = result["results"], result["best_lossless"], result["fewest_inside_ar_band"]
    speedup = lambda label: rows["ar"]["passes"]["mean"] / rows[label]["passes"]["mean"]  # noqa: E731
    lines = [f">= {SPEEDUP_TARGET:g}x fewer passes than ar with quality inside ar's band: "
             + (", ".join(result["fast_inside_ar_band"]) or "none")]
    if fewest is not None:
        lines.append(f"fewest passes inside ar's band: {fewest} ({rows[fewest]['passes']['mean']:.1f} passes per "
                     f"image, {speedup(fewest):.2f}x)")
    if best is not None:
        lines.append(f"best lossless: {best} ({rows[best]['passes']['mean']:.1f} passes per image, "
                     f"{speedup(best):.2f}x)")
    versus = result["csd_vs_gsd"]
    if versus["gsd_dominated_by"] and versus["csd_front_dominated_by"]:
        beaten = [g for g, by in versus["gsd_dominated_by"].items() if by]
        lost = [c for c, by in versus["csd_front_dominated_by"].items() if by]
        lines.append(f"csd vs gsd (no more passes, no worse on every measure): {len(beaten)} of "
                     f"{len(versus['gsd_dominated_by'])} gsd settings dominated by a csd setting; {len(lost)} of "
                     f"{len(versus['csd_front_dominated_by'])} on csd's front dominated by a gsd setting")
    return lines


def write_csv(result: dict, path: str) -> None:
    metrics = (*SPEED_METRICS, *(m.name for m in measures_of(result)), "wall_per_image")
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["label", "mode", "coupling", "entropy_coef", "tvd_threshold", "tree", "static", "group_rank",
                         "group_delta", "params"] + [f"{k}_{s}" for k in metrics for s in ("mean", "std")])
        for label, r in result["results"].items():
            s = result["settings"][label]
            tree = "" if s.get("tree") is None else "x".join(map(str, s["tree"]))
            setting = [label, s["mode"], s["coupling"] or "", _blank(s["entropy_coef"]), _blank(s["tvd_threshold"]),
                       tree, int(bool(s.get("static")) or bool(tree)), _blank(s.get("group_rank")),
                       _blank(s.get("group_delta")), ";".join(f"{k}={v:g}" for k, v in s.get("params") or ())]
            writer.writerow(setting + [f"{r[k][stat]:.6g}" for k in metrics for stat in ("mean", "std")])


def _blank(value) -> str:
    return "" if value is None else f"{value:g}"


def save(result: dict, prefix: str) -> dict:
    """Writes PREFIX.json, PREFIX.csv, PREFIX.png (every setting) and PREFIX-rules.png (a curve per rule), all or
    none (:class:`~csd_kernels.fileio.outputs.Output`: a failure leaves the earlier four as they were); returns their
    paths."""
    from .frontier_plot import plot, plot_rules

    folder, stem = os.path.split(prefix)
    with Output(folder or ".") as output:
        output.write_json(f"{stem}.json", {**result, "table": format_table(result)}, indent=1)
        write_csv(result, output.path(f"{stem}.csv"))
        plot(result, output.path(f"{stem}.png"))
        plot_rules(result, output.path(f"{stem}-rules.png"))
    return {**{ext: f"{prefix}.{ext}" for ext in ("json", "csv", "png")}, "rules": f"{prefix}-rules.png"}
