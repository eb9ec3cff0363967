"""What each subcommand of the ``csd`` command does (its parser: parser.py; main: entry.py).

    csd generate --model digits --prompt 7 --mode csd --num 16 --seed 0 --out out/
    csd generate --model llamagen --weights c2i_B_256.pt --config GPT-B --vq vq_ds16_c2i.pt --prompt 207
    csd generate --model lumina-mgpt --weights DIR --prompt "a red fox in the snow"
    csd generate --model janus-pro --weights DIR --prompt "a red fox in the snow"
    csd generate --model emu3 --weights DIR --prompt "a red fox in the snow"
    csd compare  --model digits --prompt 7 --num 64
    csd bench
    csd run      --model digits --prompts prompts.txt --modes ar,sjd,csd --out DIR   (also under torchrun)
"""

from __future__ import annotations

import json
import os
import time
from typing import Optional

import numpy as np
import torch

from .. import __version__, zoo
from ..bench.frontier import summarise
from ..config.acceptance import GRID_RULES
from ..decoding import DEFAULT_COUPLING, GenerationConfig, generate
from ..decoding.validation import check, check_backend, check_device, check_generate, check_tree, row_seeds
from ..ops.registry import select_backend
from ..runner.usage import (
    UsageError,
    as_flags,
    check_out,
    claim_generate_dir,
    clear_generate_files,
    writable_dir,
)
from .parser import GENERATION_FLAGS

# The rows of `csd compare`: (label, mode, coupling).
COMPARE_RUNS = [
    ("ar", "ar", None),
    ("sjd", "sjd", "independent"),
    ("sjd+maximal", "sjd", "maximal"),
    ("sjd+gumbel", "sjd", "gumbel"),
    ("gsd", "gsd", None),
    ("csd", "csd", "independent"),
    ("csd+maximal", "csd", "maximal"),
    ("csd+gumbel", "csd", "gumbel"),
    # one more row per other relaxed rule (config/modes.py), its mode with the default coupling
    *((f"{mode}+maximal", mode, "maximal") for mode in GRID_RULES),
]
_MODEL_OPTIONS = ("weights", "config", "vq", "image_size", "size", "dtype")  # zoo.load keywords, one flag each


# ----------------------------------------------------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------------------------------------------------
def model_options(args) -> dict:
    return {name: getattr(args, name, None) for name in _MODEL_OPTIONS}


def _load(args):
    """The model of --model and its options; every failure is one line (UsageError)."""
    try:
        return zoo.load(args.model, device=getattr(args, "device", None), **model_options(args))
    except (ValueError, OSError) as exc:
        raise UsageError(str(exc)) from exc


def _device(args) -> torch.device:
    """--device checked (default: the GPU when one is visible)."""
    device = getattr(args, "device", None)
    return check_device(device) if device is not None else torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _check_flags(args) -> None:
    """The flags of a sampling command that need torch, checked before any model is loaded or file written (the
    others: parser.check_flags)."""
    tree = getattr(args, "tree", None)
    if tree is not None:  # (csd generate) the window fit again in generate(), with the model's default window
        check_tree(tree, args.mode, args.window or GenerationConfig().window, args.coupling, static=True)
    check_backend(args.backend, _device(args))


def _settings_used(kwargs: dict, mode: str, coupling, device) -> dict:
    """Every setting of a run stats.json records (GenerationConfig's fields with recorded=True), defaults filled in:
    GenerationConfig's < the model's < the flags."""
    settings = GenerationConfig(**kwargs).as_dict(GenerationConfig.names(recorded=True))
    settings["coupling"] = check_generate(mode, coupling) or DEFAULT_COUPLING
    settings["backend"] = settings["backend"] or select_backend(None, torch.device(device))
    return settings


def _prompt_inputs(entry, prompt: str, num: int) -> dict:
    try:
        return entry.prompt_inputs([prompt] * num)
    except ValueError as exc:
        raise UsageError(f"--prompt: {exc}") from exc


def _generate_kwargs(args, entry) -> dict:
    """The model's defaults with the generation flags given: generate() keywords (those that differ from the
    defaults)."""
    given = {name: getattr(args, name) for name in GENERATION_FLAGS if getattr(args, name, None) is not None}
    return dict(entry.defaults.replace(**given))


def _save_png(array: np.ndarray, path: str, scale: int = 1) -> None:
    from PIL import Image

    image = Image.fromarray(array)
    if scale > 1:
        image = image.resize((image.width * scale, image.height * scale), Image.NEAREST)
    image.save(path)


def _tile(images: np.ndarray, columns: int) -> np.ndarray:
    """[N, H, W, C] -> one [rows·(H+1), columns·(W+1), C] mosaic with 1-pixel gutters."""
    count, height, width, channels = images.shape
    rows = -(-count // columns)
    mosaic = np.full((rows * (height + 1) + 1, columns * (width + 1) + 1, channels), 255, dtype=np.uint8)
    for index, image in enumerate(images):
        r, c = divmod(index, columns)
        top, left = 1 + r * (height + 1), 1 + c * (width + 1)
        mosaic[top:top + height, left:left + width] = image
    return mosaic


def _font(size: int):
    from PIL import ImageFont

    try:
        return ImageFont.load_default(size=size)
    except (TypeError, ImportError, OSError):  # Pillow < 10.1 or without FreeType: the small bitmap font
        return ImageFont.load_default()


def _save_labelled(images: np.ndarray, columns: int, path: str, title: str, labels=(), scale: int = 4) -> None:
    """[N, H, W, C] uint8 tiled ``columns`` wide with a title above and, when given, a label left of each row."""
    from PIL import Image, ImageDraw

    grid = Image.fromarray(_tile(images, columns))
    grid = grid.resize((grid.width * scale, grid.height * scale), Image.NEAREST)
    font = _font(9 * scale)
    probe = ImageDraw.Draw(grid)
    margin = max(probe.textlength(label, font=font) for label in labels) + 4 * scale if labels else 0
    header = 14 * scale
    width = max(grid.width + margin, probe.textlength(title, font=font) + 4 * scale)
    canvas = Image.new(grid.mode, (int(width), grid.height + header), "white")
    canvas.paste(grid, (int(margin), header))
    draw = ImageDraw.Draw(canvas)
    draw.text((2 * scale, 2 * scale), title, fill="black", font=font)
    row_height = (images.shape[1] + 1) * scale
    for index, label in enumerate(labels):
        draw.text((2 * scale, header + scale + index * row_height + row_height // 2), label, fill="black",
                  font=font, anchor="lm")
    canvas.save(path)


def _save_maps(out, path: str, columns: int, title: str) -> None:
    """Entropy and acceptance maps of every image side by side, colour-mapped, one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 5))
    for ax, (name, maps, cmap) in zip(axes, [("entropy of p (nats)", out.entropy_map, "magma"),
                                             ("acceptance probability a(x)", out.accept_map, "viridis")]):
        maps = maps.float().cpu().numpy()[..., None]
        mosaic = _tile(maps, columns)[..., 0].astype(np.float32)
        shown = ax.imshow(np.where(_tile(np.zeros_like(maps), columns)[..., 0] == 255, np.nan, mosaic), cmap=cmap)
        ax.set_title(name)
        ax.axis("off")
        fig.colorbar(shown, ax=ax, fraction=0.046)
    fig.suptitle(f"{title}: one map per image, one cell per token, in the order of grid.png")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ----------------------------------------------------------------------------------------------------------------------
# commands
# ----------------------------------------------------------------------------------------------------------------------
def cmd_generate(args) -> dict:
    _check_flags(args)
    row_seeds(args.seed, args.num)
    claim_generate_dir(args.out)
    entry = _load(args)
    inputs = _prompt_inputs(entry, args.prompt, args.num)
    kwargs = _generate_kwargs(args, entry)
    if args.tree is not None:
        kwargs.update(tree=args.tree, static=True)  # trees run in the static loop
    begin = time.perf_counter()
    out = generate(entry.model, **inputs, mode=args.mode, coupling=args.coupling, seed=args.seed,
                   progress=not args.quiet, **kwargs)
    wall = time.perf_counter() - begin
    out_dir = writable_dir(args.out)
    removed = clear_generate_files(out_dir)  # only now: a failed run leaves the earlier one as it was
    if removed:
        print(f"replaced the {len(removed)} files of an earlier csd generate run in {out_dir}")
    columns = int(np.ceil(np.sqrt(args.num)))
    title = f"{args.mode}, prompt {args.prompt}, --seed {args.seed}: {args.num} images"
    _write_images(out, out_dir, columns, title)
    _save_maps(out, os.path.join(out_dir, "maps.png"), columns, title)
    per_row = out.passes_per_row()
    tokens = out.tokens.shape[1]
    stats = {
        "command": "csd generate", "version": __version__,
        "model": args.model, "model_options": zoo.describe_options(model_options(args)), "prompt": args.prompt,
        "mode": args.mode, "num": args.num, "seed": args.seed,
        "parameters": _settings_used(kwargs, args.mode, args.coupling, out.tokens.device),
        "forward_passes": out.forward_passes,
        "prefill_passes": out.prefill_passes,
        "forward_passes_per_image": float(per_row.mean()),
        "tokens_per_pass": tokens / float(per_row.mean()),
        "tokens_per_image": tokens,
        "wall_seconds": wall,
        "timings": out.timings,
        "mean_distortion": float(out.distortion_per_row().mean()),
        "mean_entropy": float(out.entropy_map.mean()),
    }
    if entry.quality is not None:
        stats["quality"] = entry.quality(out.tokens, [args.prompt] * args.num)
    with open(os.path.join(out_dir, "stats.json"), "w") as f:
        json.dump(stats, f, indent=2)
    print(f"{args.mode}: {args.num} images, {stats['forward_passes_per_image']:.1f} forward passes per image "
          f"({stats['tokens_per_pass']:.2f} tokens/pass), {wall:.2f} s -> {out_dir}")
    return stats


def _write_images(out, out_dir: str, columns: int, title: str) -> None:
    """img_NNN.png and grid.png; without a pixel decoder, tokens.json (the image part in the model's own layout)."""
    if out.images is None:
        with open(os.path.join(out_dir, "tokens.json"), "w") as f:
            json.dump(out.sequences.cpu().tolist(), f)
        print(f"no pixel decoder for this model: wrote the image tokens to {os.path.join(out_dir, 'tokens.json')}")
        return
    images = out.images.cpu().numpy()
    for index, image in enumerate(images):
        _save_png(image, os.path.join(out_dir, f"img_{index:03d}.png"))
    _save_labelled(images, columns, os.path.join(out_dir, "grid.png"), title)


def run_compare(entry, prompts: list[str], seeds: list[int], runs=COMPARE_RUNS, generate_kwargs=None,
                progress: bool = False) -> dict:
    """Every run of ``runs`` on the same prompts and seeds; per run, the mean and spread over seeds.

    Seed s gives row b the seed s·len(prompts) + b, so the repeats never share a random stream.
    """
    num = len(prompts)
    inputs = entry.prompt_inputs(prompts)
    generate_kwargs = dict(entry.defaults, **(generate_kwargs or {}))
    results, samples = {}, {}
    for label, mode, coupling in runs:
        per_seed = []
        for seed in seeds:
            begin = time.perf_counter()
            out = generate(entry.model, **inputs, mode=mode, coupling=coupling, seed=seed * num, progress=progress,
                           **generate_kwargs)
            record = {"passes": float(out.passes_per_row().mean()), "wall": time.perf_counter() - begin,
                      "distortion": float(out.distortion_per_row().mean())}
            if entry.quality is not None:  # a measure without a value here (no background named) is left out
                record.update({k: v for k, v in entry.quality(out.tokens, prompts).items() if v is not None})
            per_seed.append(record)
            if seed == seeds[0]:
                samples[label] = out.images.cpu().numpy() if out.images is not None else None
        results[label] = summarise(per_seed)
    base = results[runs[0][0]]["passes"]["mean"]
    for label in results:
        results[label]["speedup"] = base / results[label]["passes"]["mean"]
    return {"results": results, "samples": samples}


def format_compare(results: dict, measures=()) -> str:
    """The compare table: passes, speed-up, wall time, distortion, then the model's quality ``measures``."""
    width = max(12, *(len(label) for label in results))
    header = f"{'run':{width}} {'passes/img':>14} {'speed-up':>8} {'wall s':>12} {'distortion':>10}"
    header += "".join(f" {m.label:>13}" for m in measures)
    lines = [header, "-" * len(header)]
    pm = lambda r, key, fmt: f"{format(r[key]['mean'], fmt)}±{format(r[key]['std'], fmt)}"  # noqa: E731
    for label, r in results.items():
        line = (f"{label:{width}} {pm(r, 'passes', '.1f'):>14} {r['speedup']:7.2f}x {pm(r, 'wall', '.2f'):>12} "
                f"{r['distortion']['mean']:10.4f}")
        line += "".join(f" {pm(r, m.name, m.fmt) if m.name in r else '-':>13}" for m in measures)
        lines.append(line)
    return "\n".join(lines)


def _runnable(runs, model) -> list:
    """``runs`` without the modes whose rule needs a codebook the model lacks (lantern, lantern++)."""
    from ..config.acceptance import rule_named
    from ..config.modes import MODE_TABLE
    from ..models import get_adapter

    codebook = getattr(get_adapter(model), "codebook", None)
    has_codebook = callable(codebook) and codebook() is not None
    return [run for run in runs if has_codebook or MODE_TABLE[run[1]].rule is None
            or not rule_named(MODE_TABLE[run[1]].rule).needs_neighbours]


def cmd_compare(args) -> dict:
    _check_flags(args)
    check_out(args.out)
    entry = _load(args)
    _prompt_inputs(entry, args.prompt, 1)  # a bad prompt fails before any work
    if args.num < 2 and entry.quality is not None:
        raise UsageError("--num: compare needs at least 2 images per run (the Fréchet distance is of a set)")
    seeds = list(range(args.seeds))
    runs = _runnable(COMPARE_RUNS, entry.model)
    report = run_compare(entry, [args.prompt] * args.num, seeds, runs=runs,
                         generate_kwargs=_generate_kwargs(args, entry), progress=not args.quiet)
    table = format_compare(report["results"], entry.measures)
    print(table)
    samples = report.pop("samples")
    shown = min(args.num, 8)
    out_dir = writable_dir(args.out)
    if all(images is not None for images in samples.values()):
        _save_labelled(np.concatenate([images[:shown] for images in samples.values()]), shown,
                       os.path.join(out_dir, "compare.png"),
                       f"prompt {args.prompt}, first seed: one row per mode; each column is one prompt and seed",
                       labels=list(samples))
    report.update(model=args.model, prompt=args.prompt, num=args.num, seeds=seeds,
                  rows_of_compare_png=list(samples), table=table)
    with open(os.path.join(out_dir, "compare.json"), "w") as f:
        json.dump(report, f, indent=2)
    return report


def cmd_bench(args) -> list:
    """The pytest-benchmark cases of csd_kernels.bench.cases; the table, CSV and plot come from their JSON."""
    import importlib.util

    from ..bench import op as bench

    device = _device(args)
    for backend in args.backends or []:
        check_backend(backend, device, name="backends")
    check_out(args.out)
    if importlib.util.find_spec("pytest_benchmark") is None:
        raise UsageError("csd bench runs pytest-benchmark: pip install 'csd-kernels[test]'")
    out_dir = writable_dir(args.out)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    rows = bench.run(device=str(device), backends=args.backends, quick=args.quick,
                     json_path=os.path.join(out_dir, "benchmark.json"))
    print(bench.format_table(rows))
    for path in bench.save(rows, out_dir, name).values():
        print(f"wrote {path}")
    return rows


def _floats(text: str, flag: str, setting: str, kind=float) -> tuple:
    """Comma-separated values of generate()'s ``setting``, each checked by its rule (errors name ``flag``)."""
    try:
        values = tuple(kind(v) for v in text.split(","))
    except ValueError:
        raise UsageError(f"{flag}: expected comma-separated numbers, got {text!r}") from None
    with as_flags(**{setting: flag}):
        return tuple(check(setting, value) for value in values)


def _trees(text: str) -> tuple:
    """--trees: comma-separated KxD draft trees ("none": no tree settings), each checked by validation.check_tree
    as the tree settings run it (sjd, the maximal coupling, generate()'s default window)."""
    if text == "none":
        return ()
    trees = []
    for item in text.split(","):
        try:
            branching, depth = (int(part) for part in item.split("x"))
        except ValueError:
            raise UsageError(f"--trees: expected comma-separated KxD (e.g. 2x2,3x2) or none, got {text!r}") from None
        with as_flags(tree="--trees"):
            trees.append(check_tree((branching, depth), "sjd", GenerationConfig().window, "maximal", static=True))
    return tuple(trees)


def _gsd_grid(args) -> tuple:
    """--gsd-ranks x --gsd-deltas (one of them alone: with generate()'s default for the other); none: ()."""
    if not args.gsd_ranks and not args.gsd_deltas:
        return ()
    ranks = _floats(args.gsd_ranks, "--gsd-ranks", "group_rank", int) if args.gsd_ranks else (
        GenerationConfig().group_rank,)
    deltas = _floats(args.gsd_deltas, "--gsd-deltas", "group_delta") if args.gsd_deltas else (
        GenerationConfig().group_delta,)
    return tuple((k, delta) for k in ranks for delta in deltas)


def _rule_grids(args) -> dict:
    """--grid PARAM=V1,V2 (repeatable): {rule: points} of frontier.rule_grids, each value checked by its parameter's
    rule (config/acceptance.py)."""
    from ..bench import frontier
    from ..config.acceptance import PARAMS, rule_named

    swept = {p: None for rule in GRID_RULES for p in rule_named(rule).param_names()}  # in order, once
    values = {}
    for item in args.grid or ():
        name, _, text = item.partition("=")
        if name not in swept or not text:
            raise UsageError(f"--grid {item!r}: expected PARAM=V1,V2,... with PARAM one of {', '.join(swept)} (csd: "
                             "--lambdas/--taus, gsd: --gsd-ranks/--gsd-deltas)")
        kind = int if PARAMS[name].check.kind == "int" else float
        values[name] = _floats(text, f"--grid {name}", name, kind)
    return frontier.rule_grids(values)


def _sweep_prompts(args) -> list[str]:
    """The prompts of --model: --per-class (digits) or --images (scenes), each refused where it does not apply."""
    if args.model not in zoo.MODEL_NAMES:
        raise UsageError(f"--model {args.model!r}: unknown model; choose from {', '.join(zoo.MODEL_NAMES)}")
    if args.per_class is not None:
        check("per_class", args.per_class)
    if args.images is not None:
        check("images", args.images)
    try:
        prompts = zoo.measurement_prompts(args.model, args.per_class, args.images)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    if args.per_class is not None and args.per_class > zoo.digits_heldout_per_class():  # the ceiling: as many
        raise UsageError(f"--per-class {args.per_class}: expected an int in [1, {zoo.digits_heldout_per_class()}] "
                         "(held-out digits of the rarest class)")
    return prompts


def cmd_sweep(args) -> dict:
    """The speed-quality frontier (csd_kernels.bench.frontier): every mode, csd over --lambdas x --taus x --couplings,
    gsd over --gsd-ranks x --gsd-deltas, the other rules over their --grid, sjd+maximal with each of --trees."""
    from ..bench import frontier

    prompts = _sweep_prompts(args)
    couplings = tuple(args.couplings.split(","))
    with as_flags(coupling="--couplings"):
        for coupling in couplings:
            check("coupling", coupling)
    check("seeds", args.seeds)
    check("workers", args.workers)
    grid = frontier.settings(_floats(args.lambdas, "--lambdas", "entropy_coef"),
                             _floats(args.taus, "--taus", "tvd_threshold"), couplings, _trees(args.trees),
                             gsd=_gsd_grid(args), rules=_rule_grids(args))
    check_out(os.path.dirname(args.out) or ".")
    _load(args)  # a missing or foreign checkpoint is one line, before any work
    result = frontier.sweep(args.model, seeds=tuple(range(args.seeds)), workers=args.workers, grid=grid,
                            prompts=prompts, options={"weights": args.weights})
    print(frontier.format_table(result))
    print("\n".join(frontier.summary_lines(result)))
    for path in frontier.save(result, args.out).values():
        print(f"wrote {path}")
    return result


def cmd_run(args) -> Optional[dict]:
    from ..runner import run

    generate_kwargs = {name: getattr(args, name, None) for name in GENERATION_FLAGS}
    return run(args.model, args.prompts, args.modes, args.out, seed=args.seed, batch_size=args.batch_size,
               coupling=args.coupling, generate_kwargs=generate_kwargs, quiet=args.quiet,
               num_threads=args.num_threads, model_options=model_options(args), tree=args.tree)
