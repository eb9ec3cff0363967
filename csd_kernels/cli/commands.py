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

import os
import sys
import textwrap
import time
from typing import Optional

import numpy as np
import torch

from .. import __version__, zoo
from ..bench.frontier import progress_line, summarise
from ..config.acceptance import GRID_RULES
from ..config.generation import run_label
from ..config.modes import COUPLED_MODES, exact_distortion
from ..constants import COUPLINGS
from ..decoding import DEFAULT_COUPLING, GenerationConfig, generate
from ..decoding.validation import check, check_backend, check_device, check_generate, check_tree, row_seeds
from ..fileio.inputs import shorten
from ..fileio.outputs import Output
from ..fileio.signals import if_stopped
from ..models import get_adapter
from ..ops.registry import select_backend
from ..runner.summary import unmeasured_note
from ..runner.usage import GENERATE_FILES, UsageError, as_flags, check_out, claim_generate_dir
from .parser import GENERATION_FLAGS, sweep_lists

# The rows of `csd compare`: (label, mode, coupling); sjd and csd once per coupling, each label naming it; then one
# row per other relaxed rule (config/acceptance.GRID_RULES), its mode with the default coupling.
COMPARE_RUNS = [(run_label(mode, coupling), mode, coupling)
                for mode, couplings in (("ar", (None,)), ("sjd", COUPLINGS), ("gsd", (None,)), ("csd", COUPLINGS))
                for coupling in couplings] + [(run_label(mode), mode, None) for mode in GRID_RULES]
MIN_GRID_WIDTH = 480  # pixels: a few images are scaled up to this, so a title fits above them
FONT_SIZE = 16  # pixels, of the titles and labels of grid.png and compare.png
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


def _check_model_flags(args, entry, modes) -> None:
    """The flags only the loaded model can judge (--lantern-k against its neighbour table), before any file is
    written."""
    try:
        zoo.check_lantern_k(entry, modes, getattr(args, "lantern_k", None))
    except ValueError as exc:
        raise UsageError(str(exc)) from exc


def _say_progress(line: str) -> None:
    """A line of progress of a long command, on stderr (the table goes to stdout), even with --quiet."""
    print(line, file=sys.stderr, flush=True)


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
    image.save(path, format="PNG")


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}{'' if number == 1 else 's'}"


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


def _grid_columns(count: int) -> int:
    """Columns of a grid of ``count`` images: a square, or one row of a few (no empty half)."""
    return count if count <= 4 else int(np.ceil(np.sqrt(count)))


def _font(size: int):
    from PIL import ImageFont

    try:
        return ImageFont.load_default(size=size)
    except (TypeError, ImportError, OSError):  # Pillow < 10.1 or without FreeType: the small bitmap font
        return ImageFont.load_default()


def _wrap(draw, text: str, font, width: float) -> list[str]:
    """``text`` in lines no wider than ``width`` pixels (a word longer than that on a line of its own)."""
    lines = []
    for word in text.split():
        if lines and draw.textlength(f"{lines[-1]} {word}", font=font) <= width:
            lines[-1] += f" {word}"
        else:
            lines.append(word)
    return lines or [""]


def _save_labelled(images: np.ndarray, columns: int, path: str, title: str, labels=(),
                   scale: Optional[int] = None) -> None:
    """[N, H, W, C] uint8 tiled ``columns`` wide, each pixel ``scale`` x ``scale`` (None: the smallest scale that
    makes the grid MIN_GRID_WIDTH wide), the title wrapped above it and, when given, a label left of each row."""
    from PIL import Image, ImageDraw

    grid = Image.fromarray(_tile(images, columns))
    scale = scale or max(1, -(-MIN_GRID_WIDTH // grid.width))
    grid = grid.resize((grid.width * scale, grid.height * scale), Image.NEAREST)
    font = _font(FONT_SIZE)
    probe = ImageDraw.Draw(grid)
    margin = int(max(probe.textlength(label, font=font) for label in labels)) + FONT_SIZE if labels else 0
    lines = _wrap(probe, title, font, grid.width + margin - FONT_SIZE // 2)
    line_height = FONT_SIZE + FONT_SIZE // 4
    header = len(lines) * line_height + FONT_SIZE // 2
    canvas = Image.new(grid.mode, (grid.width + margin, grid.height + header), "white")
    canvas.paste(grid, (margin, header))
    draw = ImageDraw.Draw(canvas)
    for index, line in enumerate(lines):
        draw.text((FONT_SIZE // 4, FONT_SIZE // 4 + index * line_height), line, fill="black", font=font)
    row_height = (images.shape[1] + 1) * scale
    for index, label in enumerate(labels):
        draw.text((FONT_SIZE // 4, header + scale + index * row_height + row_height // 2), label, fill="black",
                  font=font, anchor="lm")
    canvas.save(path, format="PNG")


def _save_maps(out, path: str, columns: int, title: str) -> None:
    """Entropy and acceptance maps of every image side by side, colour-mapped, one PNG (:func:`maps_figure`)."""
    import matplotlib.pyplot as plt

    fig = maps_figure(out, columns, title)
    fig.savefig(path, dpi=120, format="png")
    plt.close(fig)


def maps_figure(out, columns: int, title: str):
    """The figure of maps.png: each colour bar as tall as its maps, the title wrapped inside the canvas."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from mpl_toolkits.axes_grid1 import make_axes_locatable

    panels = [("entropy of p (nats)", out.entropy_map, "magma"), ("acceptance probability a(x)", out.accept_map,
                                                                  "viridis")]
    mosaics = []
    for _, maps, _ in panels:
        maps = maps.float().cpu().numpy()[..., None]
        gutter = _tile(np.zeros_like(maps), columns)[..., 0] == 255
        mosaics.append(np.where(gutter, np.nan, _tile(maps, columns)[..., 0].astype(np.float32)))
    height, width = mosaics[0].shape
    panel_width = 4.6
    fig, axes = plt.subplots(1, 2, figsize=(2 * panel_width + 1.2, panel_width * height / width + 1.4))
    for ax, (name, _, cmap), mosaic in zip(axes, panels, mosaics):
        shown = ax.imshow(mosaic, cmap=cmap)
        ax.set_title(name, fontsize=10)
        ax.axis("off")
        bar = make_axes_locatable(ax).append_axes("right", size="4%", pad=0.08)
        fig.colorbar(shown, cax=bar)
    text = f"{title}: one map per image, one cell per token, in the order of grid.png"
    fig.suptitle(textwrap.fill(text, width=int(fig.get_figwidth() * 10)), fontsize=10)
    fig.tight_layout()
    return fig


# ----------------------------------------------------------------------------------------------------------------------
# commands
# ----------------------------------------------------------------------------------------------------------------------
def cmd_generate(args) -> dict:
    _check_flags(args)
    row_seeds(args.seed, args.num)
    claim_generate_dir(args.out)
    # all or nothing: a failure or a signal at any point leaves --out as it was
    with Output(args.out, replaces=GENERATE_FILES) as output:
        entry = _load(args)
        _check_model_flags(args, entry, [args.mode])
        inputs = _prompt_inputs(entry, args.prompt, args.num)
        kwargs = _generate_kwargs(args, entry)
        kwargs.update(exact_distortion(args.mode))  # stats.json and maps.png state the distortion
        if args.tree is not None:
            kwargs.update(tree=args.tree, static=True)  # trees run in the static loop
        begin = time.perf_counter()
        out = generate(entry.model, **inputs, mode=args.mode, coupling=args.coupling, seed=args.seed,
                       progress=not args.quiet, **kwargs)
        wall = time.perf_counter() - begin
        stats = _generate_stats(args, entry, kwargs, out, wall)
        label = run_label(args.mode, stats["parameters"]["coupling"])
        columns = _grid_columns(args.num)
        title = f"{label}, prompt {shorten(args.prompt)}, --seed {args.seed}: {_count(args.num, 'image')}"
        _write_images(out, output, columns, title)
        _save_maps(out, output.path("maps.png"), columns, title)
        output.write_json("stats.json", stats)
    print(f"{label}: {_count(args.num, 'image')}, {stats['forward_passes_per_image']:.1f} forward passes per image "
          f"({stats['tokens_per_pass']:.2f} tokens/pass), {wall:.2f} s")
    print(output.summary())
    return stats


def _generate_stats(args, entry, kwargs: dict, out, wall: float) -> dict:
    """stats.json of csd generate: the command, every setting used, the pass counts (explained under "notes"), the
    timings and the model's quality measures."""
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
        "notes": {
            "forward_passes": "decoding passes of the whole batch: one pass computes every row, and the batch runs "
                              "until its slowest image is complete",
            "forward_passes_per_image": "the mean over images of the passes in which each image committed tokens "
                                        "(its own count): at most forward_passes, less where a finished or paused "
                                        "image rode along in the batch's passes",
            "prefill_passes": "passes over the prompt before decoding (not in forward_passes)",
            "tokens_per_pass": "tokens_per_image / forward_passes_per_image",
        },
    }
    if entry.quality is not None:
        stats["quality"] = entry.quality(out.tokens, [args.prompt] * args.num)
    return stats


def _write_images(out, output: Output, columns: int, title: str) -> None:
    """img_NNN.png and grid.png; without a pixel decoder, tokens.json (the image part in the model's own layout)."""
    if out.images is None:
        output.write_json("tokens.json", out.sequences.cpu().tolist(), indent=None)
        print("no pixel decoder for this model: the image tokens go to tokens.json")
        return
    images = out.images.cpu().numpy()
    for index, image in enumerate(images):
        _save_png(image, output.path(f"img_{index:03d}.png"))
    _save_labelled(images, columns, output.path("grid.png"), title)


def run_compare(entry, prompts: list[str], seeds: list[int], runs=COMPARE_RUNS, generate_kwargs=None,
                progress: bool = False, report=None) -> dict:
    """Every run of ``runs`` on the same prompts and seeds; per run, the mean and spread over seeds. ``report``:
    called with one line per run as it finishes (frontier.progress_line), whatever ``progress`` (the bars) says.

    Seed s gives row b the seed s·len(prompts) + b, so the repeats never share a random stream.
    """
    num = len(prompts)
    inputs = entry.prompt_inputs(prompts)
    generate_kwargs = dict(entry.defaults, **(generate_kwargs or {}))
    results, samples = {}, {}
    started = time.perf_counter()
    for label, mode, coupling in runs:
        per_seed = []
        for seed in seeds:
            begin = time.perf_counter()
            out = generate(entry.model, **inputs, mode=mode, coupling=coupling, seed=seed * num, progress=progress,
                           **{**generate_kwargs, **exact_distortion(mode)})  # the table's distortion, exact
            record = {"passes": float(out.passes_per_row().mean()), "wall": time.perf_counter() - begin,
                      "distortion": float(out.distortion_per_row().mean())}
            if entry.quality is not None:  # a measure without a value here (no background named) is left out
                record.update({k: v for k, v in entry.quality(out.tokens, prompts).items() if v is not None})
            per_seed.append(record)
            if seed == seeds[0]:
                samples[label] = out.images.cpu().numpy() if out.images is not None else None
        results[label] = summarise(per_seed)
        if report is not None:
            report(progress_line(len(results), len(runs), label, results[label]["passes"]["mean"],
                                 time.perf_counter() - started))
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
    return "\n".join(lines + table_notes(results.values(), measures))


def table_notes(rows, measures) -> list[str]:
    """The lines under a table of runs: what a '-' means, and which coupling the coupled modes use by default."""
    missing = [m.label for m in measures if any(m.name not in r for r in rows)]
    notes = [unmeasured_note(missing)] if missing else []
    return notes + [f"{', '.join(COUPLED_MODES)} draw their next drafts with the {DEFAULT_COUPLING} coupling unless "
                    f"told otherwise (csd generate --mode csd runs csd+{DEFAULT_COUPLING})"]


def _runnable(runs, model) -> list:
    """``runs`` without the modes whose rule needs a codebook the model lacks (lantern, lantern++)."""
    from ..config.acceptance import rule_named
    from ..config.modes import MODE_TABLE
    codebook = getattr(get_adapter(model), "codebook", None)
    has_codebook = callable(codebook) and codebook() is not None
    return [run for run in runs if has_codebook or MODE_TABLE[run[1]].rule is None
            or not rule_named(MODE_TABLE[run[1]].rule).needs_neighbours]


def cmd_compare(args) -> dict:
    _check_flags(args)
    check_out(args.out)
    with Output(args.out) as output:  # (stopped before the end: --out as it was)
        entry = _load(args)
        _prompt_inputs(entry, args.prompt, 1)  # a bad prompt fails before any work
        runs = _runnable(COMPARE_RUNS, entry.model)
        _check_model_flags(args, entry, [mode for _, mode, _ in runs])
        seeds = list(range(args.seeds))
        report = run_compare(entry, [args.prompt] * args.num, seeds, runs=runs,
                             generate_kwargs=_generate_kwargs(args, entry), progress=not args.quiet,
                             report=_say_progress)
        table = format_compare(report["results"], entry.measures)
        print(table)
        samples = report.pop("samples")
        shown = min(args.num, 8)
        report.update(model=args.model, prompt=args.prompt, num=args.num, seeds=seeds,
                      rows_of_compare_png=list(samples), table=table)
        if all(images is not None for images in samples.values()):
            _save_labelled(np.concatenate([images[:shown] for images in samples.values()]), shown,
                           output.path("compare.png"), f"prompt {shorten(args.prompt)}, first seed: one row per run; "
                           "each column is one prompt and seed", labels=list(samples))
        output.write_json("compare.json", report)
    print(output.summary())
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
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    with Output(args.out) as output:
        rows = bench.run(device=str(device), backends=args.backends, quick=args.quick,
                         json_path=output.path("benchmark.json"))
        print(bench.format_table(rows))
        bench.save(rows, output, name)
    print(output.summary())
    return rows


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
    gsd over --gsd-ranks x --gsd-deltas, the other rules over their --grid, sjd+maximal with each of --trees, the
    chain again at each of --windows."""
    from ..bench import frontier

    prompts = _sweep_prompts(args)
    lambdas, taus, couplings, gsd, windows, grid_values = sweep_lists(args)  # (checked before torch: check_flags)
    trees, rules = _trees(args.trees), frontier.rule_grids(grid_values)  # (bad flags: before the model loads)
    check_out(os.path.dirname(args.out) or ".")
    entry = _load(args)  # a missing or foreign checkpoint is one line, before any work
    # (a lantern rule's default k, in the settings' labels, is the codebook's)
    grid = frontier.settings(lambdas, taus, couplings, trees, gsd=gsd, windows=windows, rules=rules,
                             vocab=get_adapter(entry.model).vocab_size)
    with if_stopped(f"nothing was written to {os.path.dirname(args.out) or '.'}"):
        print(f"csd sweep: {_count(len(grid), 'setting')} x {_count(args.seeds, 'seed')} on "
              f"{_count(len(prompts), 'image')} each, {_count(args.workers, 'worker')}", file=sys.stderr, flush=True)
        result = frontier.sweep(args.model, seeds=tuple(range(args.seeds)), workers=args.workers, grid=grid,
                                prompts=prompts, options={"weights": args.weights}, progress=_say_progress)
    print(frontier.format_table(result))
    print("\n".join(frontier.summary_lines(result)))
    paths = frontier.save(result, args.out)
    print(f"wrote {', '.join(paths.values())}")
    return result


def cmd_run(args) -> Optional[dict]:
    from ..runner import run

    generate_kwargs = {name: getattr(args, name, None) for name in GENERATION_FLAGS}
    return run(args.model, args.prompts, args.modes, args.out, seed=args.seed, batch_size=args.batch_size,
               coupling=args.coupling, generate_kwargs=generate_kwargs, quiet=args.quiet,
               num_threads=args.num_threads, model_options=model_options(args), tree=args.tree)
