"""The ``csd`` command (also ``python -m csd_kernels``).

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

import argparse
import inspect
import json
import os
import sys
import time
from typing import Optional

import numpy as np
import torch

from .. import __version__, zoo
from ..bench.frontier import summarise
from ..decoding import COUPLINGS, DEFAULT_COUPLING, DRAFT_INITS, MODES, generate
from ..decoding.validation import (
    RULES,
    ArgumentError,
    check,
    check_backend,
    check_device,
    check_generate,
    check_tree,
    row_seeds,
)
from ..ops.registry import BACKENDS, select_backend
from ..runner.usage import (
    UsageError,
    as_flags,
    check_out,
    claim_generate_dir,
    clear_generate_files,
    flag_error,
    writable_dir,
)

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
]
_CLI_EXTRAS = ("transformers", "safetensors", "tqdm", "PIL", "matplotlib", "sklearn")  # setup.py's [cli] extra
_MODEL_OPTIONS = ("weights", "config", "vq", "image_size", "size", "dtype")  # zoo.load keywords, one flag each
# generate() keywords taken from the command line; unset ones fall back to the model's defaults
_GENERATE_OPTIONS = ("window", "cfg_scale", "temperature", "top_k", "top_p", "min_p", "entropy_coef", "tvd_threshold",
                     "draft_init", "backend")
# generate() keywords that are no setting of a run (the inputs, and what does not change the images)
_NOT_SETTINGS = ("prompt_embeds", "attention_mask", "mode", "seed", "progress", "sync_timings")


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
    """The flags of a sampling command, checked by the API's own rules before any model is loaded or file written."""
    given = {name: getattr(args, name, None) for name in _GENERATE_OPTIONS}
    backend = given.pop("backend")
    check_generate(getattr(args, "mode", "csd"), getattr(args, "coupling", None),
                   **{name: value for name, value in given.items() if value is not None})
    tree = getattr(args, "tree", None)
    if tree is not None:  # (csd generate) the window fit again in generate(), with the model's default window
        check_tree(tree, args.mode, given["window"] or _GENERATE_DEFAULTS["window"], args.coupling, static=True)
    check("num", args.num)
    check("image_size", args.image_size)
    check_backend(backend, _device(args))


def _settings_used(kwargs: dict, mode: str, coupling, device) -> dict:
    """Every generate() setting of a run, defaults filled in: generate()'s < the model's < the flags."""
    params = inspect.signature(generate).parameters
    settings = {name: p.default for name, p in params.items() if p.kind is p.KEYWORD_ONLY and name not in _NOT_SETTINGS}
    settings.update(kwargs)
    settings["coupling"] = check_generate(mode, coupling) or DEFAULT_COUPLING
    settings["backend"] = settings["backend"] or select_backend(None, torch.device(device))
    return settings


def _prompt_inputs(entry, prompt: str, num: int) -> dict:
    try:
        return entry.prompt_inputs([prompt] * num)
    except ValueError as exc:
        raise UsageError(f"--prompt: {exc}") from exc


def _generate_kwargs(args, entry) -> dict:
    kwargs = dict(entry.defaults)
    for name in _GENERATE_OPTIONS:
        value = getattr(args, name, None)
        if value is not None:
            kwargs[name] = value
    return kwargs


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
    row_seeds(check("seed", args.seed), args.num)
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


def cmd_compare(args) -> dict:
    _check_flags(args)
    check("seeds", args.seeds)
    check_out(args.out)
    entry = _load(args)
    _prompt_inputs(entry, args.prompt, 1)  # a bad prompt fails before any work
    if args.num < 2 and entry.quality is not None:
        raise UsageError("--num: compare needs at least 2 images per run (the Fréchet distance is of a set)")
    seeds = list(range(args.seeds))
    report = run_compare(entry, [args.prompt] * args.num, seeds, generate_kwargs=_generate_kwargs(args, entry),
                         progress=not args.quiet)
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
            trees.append(check_tree((branching, depth), "sjd", _GENERATE_DEFAULTS["window"], "maximal", static=True))
    return tuple(trees)


def _gsd_grid(args) -> tuple:
    """--gsd-ranks x --gsd-deltas (one of them alone: with generate()'s default for the other); none: ()."""
    if not args.gsd_ranks and not args.gsd_deltas:
        return ()
    ranks = _floats(args.gsd_ranks, "--gsd-ranks", "group_rank", int) if args.gsd_ranks else (
        _GENERATE_DEFAULTS["group_rank"],)
    deltas = _floats(args.gsd_deltas, "--gsd-deltas", "group_delta") if args.gsd_deltas else (
        _GENERATE_DEFAULTS["group_delta"],)
    return tuple((k, delta) for k in ranks for delta in deltas)


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
    gsd over --gsd-ranks x --gsd-deltas, sjd+maximal with each of --trees."""
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
                             gsd=_gsd_grid(args))
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

    check("image_size", args.image_size)

    generate_kwargs = {name: getattr(args, name, None) for name in _GENERATE_OPTIONS}
    return run(args.model, args.prompts, args.modes, args.out, seed=args.seed, batch_size=args.batch_size,
               coupling=args.coupling, generate_kwargs=generate_kwargs, quiet=args.quiet,
               num_threads=args.num_threads, model_options=model_options(args), tree=args.tree)


# ----------------------------------------------------------------------------------------------------------------------
# argument parsing
# ----------------------------------------------------------------------------------------------------------------------
def _help(name: str, text: str, default) -> str:
    """Help of a checked flag: what it is, the accepted values (validation.RULES) and the default."""
    return f"{text}; {RULES[name].expected.removeprefix('None or ')} (default: {default})".replace("%", "%%")


def add_model_options(parser: argparse.ArgumentParser, device: bool = True) -> None:
    """--model and the local checkpoint it runs (see csd_kernels.zoo.checkpoints)."""
    parser.add_argument("--model", default="digits", help=f"one of {', '.join(zoo.MODEL_NAMES)} (default: digits)")
    parser.add_argument("--weights", help="llamagen: the GPT .pt; lumina-mgpt, janus-pro, emu3: the checkpoint folder "
                                          "(default: none; digits ships its weights)")
    parser.add_argument("--config", help="llamagen: the upstream model name (GPT-B, GPT-L, GPT-XL, ...) or a JSON file "
                                         "of its ModelArgs fields (default: none)")
    parser.add_argument("--vq", help="llamagen: the VQ checkpoint (vq_ds16_c2i.pt), for pixels (default: none, "
                                     "tokens only)")
    parser.add_argument("--image-size", dest="image_size", type=int,
                        help=_help("image_size", "llamagen: the checkpoint's resolution in pixels",
                                   "read from a _256/_384 in its name"))
    parser.add_argument("--size", help="lumina-mgpt: image size in pixels, 768 or WIDTHxHEIGHT (default: 768); "
                                       "emu3: the same, multiples of 8 (default: 720)")
    parser.add_argument("--dtype", help="bfloat16 / float16 / float32 (default: bfloat16 on a GPU, float32 on a CPU)")
    if device:
        parser.add_argument("--device", help="cpu, cuda or cuda:N (default: the GPU when one is visible, else cpu)")


_GENERATE_DEFAULTS = {name: p.default for name, p in inspect.signature(generate).parameters.items()}


def add_generation_options(parser: argparse.ArgumentParser) -> None:
    """The generate() settings every command takes; unset ones fall back to the model's defaults."""
    model = lambda name: f"the model's, else {_GENERATE_DEFAULTS[name]}"  # noqa: E731
    parser.add_argument("--window", type=int, help=_help("window", "Jacobi window: tokens drafted per pass",
                                                         model("window")))
    parser.add_argument("--cfg-scale", dest="cfg_scale", type=float,
                        help=_help("cfg_scale", "classifier-free guidance scale (1: no guidance)", model("cfg_scale")))
    parser.add_argument("--temperature", type=float, help=_help("temperature", "sampling temperature (0: greedy)",
                                                                model("temperature")))
    parser.add_argument("--top-k", dest="top_k", type=int,
                        help=_help("top_k", "sample from the k most likely tokens", "the model's, else all"))
    parser.add_argument("--top-p", dest="top_p", type=float,
                        help=_help("top_p", "nucleus sampling: the smallest set of most likely tokens holding this "
                                   "much probability", "off"))
    parser.add_argument("--min-p", dest="min_p", type=float,
                        help=_help("min_p", "keep tokens with p >= min_p * max p", "off"))
    parser.add_argument("--entropy-coef", dest="entropy_coef", type=float,
                        help=_help("entropy_coef", "CSD λ: acceptance bonus per nat of entropy", model("entropy_coef")))
    parser.add_argument("--tvd-threshold", dest="tvd_threshold", type=float,
                        help=_help("tvd_threshold", "CSD τ: the bonus applies where TVD(p, q) < τ",
                                   model("tvd_threshold")))
    parser.add_argument("--draft-init", dest="draft_init", choices=DRAFT_INITS,
                        help=f"fresh drafts: uniform, or the token above (default: {_GENERATE_DEFAULTS['draft_init']})")
    parser.add_argument("--backend", help=_help("backend", "verify backend; it must run on the device",
                                                "the best available"))


def _tree_flag(text: str) -> tuple:
    """--tree K,D -> (K, D) ints; their bounds and what they go with: validation.check_tree."""
    try:
        branching, depth = (int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected K,D: two ints, e.g. 3,2 (got {text!r})") from None
    return branching, depth


def _add_sampling(parser: argparse.ArgumentParser, num: int) -> None:
    add_model_options(parser)
    parser.add_argument("--prompt", required=True, help="the prompt (digits, llamagen: a class id; others: text)")
    parser.add_argument("--num", type=int, default=num, help=_help("num", "images per run", num))
    add_generation_options(parser)
    parser.add_argument("--quiet", action="store_true", help="no progress bar (default: shown)")


class _Parser(argparse.ArgumentParser):
    """An unparsable command line is one line too (argparse would print the usage first), exit status 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="csd", description="Content-aware speculative decoding of AR image models.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    gen = commands.add_parser("generate", help="generate images, write PNGs, maps and stats.json")
    _add_sampling(gen, num=16)
    gen.add_argument("--mode", default="csd", choices=MODES, help="decoding mode (default: csd)")
    gen.add_argument("--coupling", choices=sorted(COUPLINGS),
                     help=f"next drafts of sjd/csd (default: {DEFAULT_COUPLING}; other modes: independent)")
    gen.add_argument("--seed", type=int, default=0, help=_help("seed", "seed of image 0 (image b: seed + b)", 0))
    gen.add_argument("--tree", type=_tree_flag, metavar="K,D",
                     help="a lossless draft tree in every window (docs/trees.md): K candidates per position at the "
                          "first D positions, e.g. 3,2; K, D >= 1, (K^D - 1)/(K - 1) < the window; --mode sjd, "
                          "--coupling maximal (default: none, a chain)")
    gen.add_argument("--out", default="out", help="output folder: csd generate replaces the images of its earlier "
                                                  "runs there and refuses a folder with other files (default: out)")
    gen.set_defaults(handler=cmd_generate)

    cmp = commands.add_parser("compare", help="ar, sjd, gsd and csd on the same prompts and seeds: speed and quality")
    _add_sampling(cmp, num=64)
    cmp.add_argument("--seeds", type=int, default=3, help=_help("seeds", "repeats with different seeds, for the "
                                                                         "spread", 3))
    cmp.add_argument("--out", default="out/compare", help="output folder (default: out/compare)")
    cmp.set_defaults(handler=cmd_compare)

    bench = commands.add_parser("bench", help="microbenchmarks of the verify op on every available backend")
    bench.add_argument("--device", help="cpu, cuda or cuda:N (default: cuda when a GPU is visible, else cpu)")
    bench.add_argument("--backends", nargs="*", help=f"any of {', '.join(BACKENDS)} that run on the device "
                                                     "(default: every available backend, not Triton's interpreter)")
    bench.add_argument("--quick", action="store_true", help="two shapes instead of six (default: six)")
    bench.add_argument("--out", default="benchmarks/results", help="output folder (default: benchmarks/results)")
    bench.set_defaults(handler=cmd_bench)

    sweep = commands.add_parser("sweep", help="the speed-quality frontier: every mode, csd over a grid of lambda x tau "
                                              "x coupling, mean and spread over seeds (JSON, CSV, plot)")
    sweep.add_argument("--model", default="digits", help="a zoo model with quality measures: digits or scenes "
                                                         "(default: digits)")
    sweep.add_argument("--weights", help="scenes: a folder with a trained model (config.json, model.safetensors) "
                                         "instead of the shipped one (default: the shipped weights)")
    sweep.add_argument("--per-class", dest="per_class", type=int,
                       help=_help("per_class", "digits: images per class per seed", 8))
    sweep.add_argument("--images", type=int,
                       help=_help("images", "scenes: images per seed, from a fixed prompt mix (1-3 objects)", 64))
    sweep.add_argument("--seeds", type=int, default=3, help=_help("seeds", "seeds 0..N-1", 3))
    sweep.add_argument("--lambdas", default="0,0.05,0.1,0.25,0.5,1",
                       help="csd entropy_coef values, each >= 0 (default: 0,0.05,0.1,0.25,0.5,1)")
    sweep.add_argument("--taus", default="0.3,0.65,1", help="csd tvd_threshold values, each in [0, 1] "
                                                           "(default: 0.3,0.65,1)")
    sweep.add_argument("--couplings", default="independent,maximal",
                       help=f"csd couplings, any of {', '.join(COUPLINGS)} (default: independent,maximal)")
    sweep.add_argument("--trees", default="2x2,3x2", help="draft trees KxD of the sjd+maximal+tree settings, "
                       "comma-separated, or none (default: 2x2,3x2)")
    sweep.add_argument("--gsd-ranks", dest="gsd_ranks", default="",
                       help="gsd group_rank values k, each an int >= 1: gsd over k x --gsd-deltas besides gsd at its "
                            "defaults (default: none)")
    sweep.add_argument("--gsd-deltas", dest="gsd_deltas", default="",
                       help="gsd group_delta values, each >= 0 (default: none; with --gsd-ranks alone: "
                            f"{_GENERATE_DEFAULTS['group_delta']})")
    sweep.add_argument("--workers", type=int, default=2, help=_help("workers", "processes, one torch thread each", 2))
    sweep.add_argument("--out", default="out/sweep/frontier",
                       help="path prefix of the .json, .csv and .png (default: out/sweep/frontier)")
    sweep.set_defaults(handler=cmd_sweep)

    run = commands.add_parser("run", help="sharded, resumable generation of a prompts file over modes "
                                          "(torchrun --nproc-per-node N -m csd_kernels run ...)")
    _add_run_arguments(run)
    run.set_defaults(handler=cmd_run)
    return parser


def _add_run_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_options(parser, device=False)  # each rank runs on its own device
    parser.add_argument("--prompts", required=True, help="prompts file: one prompt per line (digits: a class id 0..9)")
    parser.add_argument("--modes", default="ar,sjd,csd", help=f"comma-separated modes, any of {', '.join(MODES)} "
                                                              "(default: ar,sjd,csd)")
    parser.add_argument("--out", required=True, help="output folder (rerun the same command to resume)")
    parser.add_argument("--seed", type=int, default=0, help=_help("seed", "global seed", 0))
    parser.add_argument("--batch-size", dest="batch_size", type=int, default=16,
                        help=_help("batch_size", "images per generate() call on each rank (does not change the "
                                                 "images)", 16))
    parser.add_argument("--coupling", choices=sorted(COUPLINGS),
                        help=f"next drafts of sjd/csd (default: {DEFAULT_COUPLING})")
    parser.add_argument("--tree", type=_tree_flag, metavar="K,D",
                        help="a lossless draft tree for the run's sjd items (docs/trees.md), e.g. 3,2; --modes must "
                             "hold sjd (default: none, a chain)")
    add_generation_options(parser)
    parser.add_argument("--num-threads", dest="num_threads", type=int,
                        help=_help("num_threads", "torch threads per process", "CPU cores / processes on this node"))
    parser.add_argument("--quiet", action="store_true", help="no progress bar or table (default: shown)")


def main(argv: Optional[list[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        args.handler(args)
    except (UsageError, ArgumentError) as exc:  # the API's ArgumentError names a keyword: say the flag
        exc = flag_error(exc) if isinstance(exc, ArgumentError) else exc
        print(f"csd {args.command}: error: {' '.join(str(exc).split())}", file=sys.stderr)  # one line
        return 2
    except ModuleNotFoundError as exc:
        if exc.name not in _CLI_EXTRAS:
            raise
        print(f"csd {args.command}: error: {exc.name} is not installed; the csd command needs the [cli] extra: "
              "pip install 'csd-kernels[cli]'", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
