"""The ``csd`` command (also ``python -m csd_kernels``).

    csd generate --model digits --prompt 7 --mode csd --num 16 --seed 0 --out out/
    csd generate --model llamagen --weights c2i_B_256.pt --config GPT-B --vq vq_ds16_c2i.pt --prompt 207
    csd generate --model lumina-mgpt --weights DIR --prompt "a red fox in the snow"
    csd generate --model janus-pro --weights DIR --prompt "a red fox in the snow"
    csd compare  --model digits --prompt 7 --num 64
    csd bench
    csd run      --model digits --prompts prompts.txt --modes ar,sjd,csd --out DIR   (also under torchrun)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Optional

import numpy as np
import torch

from . import zoo
from .decoding import COUPLINGS, DRAFT_INITS, MODES, generate
from .frontier import summarise
from .usage import UsageError, writable_dir

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


def _save_maps(out, path: str, columns: int) -> None:
    """Entropy and acceptance maps of every image side by side, colour-mapped, one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 5))
    for ax, (title, maps, cmap) in zip(axes, [("entropy of p (nats)", out.entropy_map, "magma"),
                                              ("acceptance probability a(x)", out.accept_map, "viridis")]):
        maps = maps.float().cpu().numpy()[..., None]
        mosaic = _tile(maps, columns)[..., 0].astype(np.float32)
        shown = ax.imshow(np.where(_tile(np.zeros_like(maps), columns)[..., 0] == 255, np.nan, mosaic), cmap=cmap)
        ax.set_title(title)
        ax.axis("off")
        fig.colorbar(shown, ax=ax, fraction=0.046)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ----------------------------------------------------------------------------------------------------------------------
# commands
# ----------------------------------------------------------------------------------------------------------------------
def cmd_generate(args) -> dict:
    out_dir = writable_dir(args.out)
    entry = _load(args)
    inputs = _prompt_inputs(entry, args.prompt, args.num)
    kwargs = _generate_kwargs(args, entry)
    begin = time.perf_counter()
    out = generate(entry.model, **inputs, mode=args.mode, coupling=args.coupling, seed=args.seed,
                   progress=not args.quiet, **kwargs)
    wall = time.perf_counter() - begin
    columns = int(np.ceil(np.sqrt(args.num)))
    _write_images(out, out_dir, columns)
    _save_maps(out, os.path.join(out_dir, "maps.png"), columns)
    per_row = out.passes_per_row()
    tokens = out.tokens.shape[1]
    stats = {
        "model": args.model, "prompt": args.prompt, "mode": args.mode, "num": args.num, "seed": args.seed,
        "parameters": dict(kwargs, coupling=args.coupling),
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


def _write_images(out, out_dir: str, columns: int) -> None:
    """img_NNN.png and grid.png; without a pixel decoder, tokens.json (the image part in the model's own layout)."""
    if out.images is None:
        with open(os.path.join(out_dir, "tokens.json"), "w") as f:
            json.dump(out.sequences.cpu().tolist(), f)
        print(f"no pixel decoder for this model: wrote the image tokens to {os.path.join(out_dir, 'tokens.json')}")
        return
    images = out.images.cpu().numpy()
    for index, image in enumerate(images):
        _save_png(image, os.path.join(out_dir, f"img_{index:03d}.png"))
    _save_png(_tile(images, columns), os.path.join(out_dir, "grid.png"), scale=4)


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
            if entry.quality is not None:
                record.update(entry.quality(out.tokens, prompts))
            per_seed.append(record)
            if seed == seeds[0]:
                samples[label] = out.images.cpu().numpy() if out.images is not None else None
        results[label] = summarise(per_seed)
    base = results[runs[0][0]]["passes"]["mean"]
    for label in results:
        results[label]["speedup"] = base / results[label]["passes"]["mean"]
    return {"results": results, "samples": samples}


def format_compare(results: dict) -> str:
    has_quality = "accuracy" in next(iter(results.values()))
    width = max(12, *(len(label) for label in results))
    header = f"{'run':{width}} {'passes/img':>14} {'speed-up':>8} {'wall s':>12} {'distortion':>10}"
    if has_quality:
        header += f" {'accuracy':>13} {'Fréchet':>13}"
    lines = [header, "-" * len(header)]
    pm = lambda r, key, fmt: f"{format(r[key]['mean'], fmt)}±{format(r[key]['std'], fmt)}"  # noqa: E731
    for label, r in results.items():
        line = (f"{label:{width}} {pm(r, 'passes', '.1f'):>14} {r['speedup']:7.2f}x {pm(r, 'wall', '.2f'):>12} "
                f"{r['distortion']['mean']:10.4f}")
        if has_quality:
            line += f" {pm(r, 'accuracy', '.3f'):>13} {pm(r, 'frechet', '.2f'):>13}"
        lines.append(line)
    return "\n".join(lines)


def cmd_compare(args) -> dict:
    out_dir = writable_dir(args.out)
    entry = _load(args)
    _prompt_inputs(entry, args.prompt, 1)  # a bad prompt fails before any work
    seeds = list(range(args.seeds))
    report = run_compare(entry, [args.prompt] * args.num, seeds, generate_kwargs=_generate_kwargs(args, entry),
                         progress=not args.quiet)
    table = format_compare(report["results"])
    print(table)
    samples = report.pop("samples")
    shown = min(args.num, 8)
    if all(images is not None for images in samples.values()):
        rows = np.concatenate([images[:shown] for images in samples.values()])
        _save_png(_tile(rows, shown), os.path.join(out_dir, "compare.png"), scale=4)
    report.update(model=args.model, prompt=args.prompt, num=args.num, seeds=seeds,
                  rows_of_compare_png=list(samples), table=table)
    with open(os.path.join(out_dir, "compare.json"), "w") as f:
        json.dump(report, f, indent=2)
    return report


def cmd_bench(args) -> list:
    """The pytest-benchmark cases of csd_kernels.bench_cases; the table, CSV and plot come from their JSON."""
    import importlib.util

    from . import bench

    out_dir = writable_dir(args.out)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda: no GPU is visible to torch")
    if importlib.util.find_spec("pytest_benchmark") is None:
        raise UsageError("csd bench runs pytest-benchmark: pip install 'csd-kernels[test]'")
    name = torch.cuda.get_device_name() if args.device == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    rows = bench.run(device=args.device, backends=args.backends, quick=args.quick,
                     json_path=os.path.join(out_dir, "benchmark.json"))
    print(bench.format_table(rows))
    for path in bench.save(rows, out_dir, name).values():
        print(f"wrote {path}")
    return rows


def _floats(text: str, flag: str) -> tuple:
    try:
        return tuple(float(v) for v in text.split(","))
    except ValueError:
        raise UsageError(f"{flag}: expected comma-separated numbers, got {text!r}") from None


def cmd_sweep(args) -> dict:
    """The speed-quality frontier (csd_kernels.frontier): every mode, csd over --lambdas x --taus x --couplings."""
    from . import frontier

    if args.model not in zoo.MODEL_NAMES:
        raise UsageError(f"--model {args.model!r}: unknown model; choose from {', '.join(zoo.MODEL_NAMES)}")
    if args.model != "digits":
        raise UsageError(f"--model {args.model}: csd sweep needs a quality measure; only digits has one")
    couplings = tuple(args.couplings.split(","))
    bad = [c for c in couplings if c not in COUPLINGS]
    if bad or args.per_class < 1 or args.seeds < 1 or args.workers < 1:
        raise UsageError(f"--couplings: unknown coupling {bad[0]!r}; choose from {', '.join(COUPLINGS)}" if bad else
                         "--per-class, --seeds and --workers must be >= 1")
    writable_dir(os.path.dirname(args.out) or ".")
    grid = frontier.settings(_floats(args.lambdas, "--lambdas"), _floats(args.taus, "--taus"), couplings)
    result = frontier.sweep(args.model, per_class=args.per_class, seeds=tuple(range(args.seeds)),
                            workers=args.workers, grid=grid)
    print(frontier.format_table(result))
    print("\n".join(frontier.summary_lines(result)))
    for path in frontier.save(result, args.out).values():
        print(f"wrote {path}")
    return result


def cmd_run(args) -> Optional[dict]:
    from .runner import run

    generate_kwargs = {name: getattr(args, name, None) for name in _GENERATE_OPTIONS}
    return run(args.model, args.prompts, args.modes, args.out, seed=args.seed, batch_size=args.batch_size,
               coupling=args.coupling, generate_kwargs=generate_kwargs, quiet=args.quiet,
               num_threads=args.num_threads, model_options=model_options(args))


# ----------------------------------------------------------------------------------------------------------------------
# argument parsing
# ----------------------------------------------------------------------------------------------------------------------
def add_model_options(parser: argparse.ArgumentParser, device: bool = True) -> None:
    """--model and the local checkpoint it runs (see csd_kernels.zoo.checkpoints)."""
    parser.add_argument("--model", default="digits", help=f"one of {', '.join(zoo.MODEL_NAMES)} (default: digits)")
    parser.add_argument("--weights", help="llamagen: the GPT .pt; lumina-mgpt / janus-pro: the checkpoint folder")
    parser.add_argument("--config", help="llamagen: the upstream model name (GPT-B, GPT-L, GPT-XL, ...) or a JSON file "
                                         "of its ModelArgs fields")
    parser.add_argument("--vq", help="llamagen: the VQ checkpoint (vq_ds16_c2i.pt), for pixels")
    parser.add_argument("--image-size", dest="image_size", type=int,
                        help="llamagen: the checkpoint's resolution (default: read from a _256/_384 in its name)")
    parser.add_argument("--size", help="lumina-mgpt: image size in pixels, 768 or WIDTHxHEIGHT (default 768)")
    parser.add_argument("--dtype", help="bfloat16 / float16 / float32 (default: bfloat16 on a GPU, float32 on a CPU)")
    if device:
        parser.add_argument("--device", help="cuda, cuda:1, cpu (default: the GPU when one is visible)")


def add_generation_options(parser: argparse.ArgumentParser) -> None:
    """The generate() settings every command takes; unset ones fall back to the model's defaults."""
    parser.add_argument("--window", type=int, help="Jacobi window (default 16)")
    parser.add_argument("--cfg-scale", dest="cfg_scale", type=float, help="classifier-free guidance scale")
    parser.add_argument("--temperature", type=float)
    parser.add_argument("--top-k", dest="top_k", type=int)
    parser.add_argument("--top-p", dest="top_p", type=float, help="nucleus sampling: keep the smallest set of most "
                        "likely tokens with this much probability, in (0, 1] (default: off)")
    parser.add_argument("--min-p", dest="min_p", type=float, help="keep tokens with p >= min_p * max p, in [0, 1] "
                        "(default: off)")
    parser.add_argument("--entropy-coef", dest="entropy_coef", type=float, help="CSD λ (default 0.5)")
    parser.add_argument("--tvd-threshold", dest="tvd_threshold", type=float, help="CSD τ (default 0.65)")
    parser.add_argument("--draft-init", dest="draft_init", choices=DRAFT_INITS)
    parser.add_argument("--backend", help="verify backend (default: the best available)")


def _add_sampling(parser: argparse.ArgumentParser) -> None:
    add_model_options(parser)
    parser.add_argument("--prompt", required=True, help="the prompt (digits, llamagen: a class id; others: text)")
    parser.add_argument("--num", type=int, default=16, help="images per run (default 16)")
    add_generation_options(parser)
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="csd", description="Content-aware speculative decoding of AR image models.")
    commands = parser.add_subparsers(dest="command", required=True)

    gen = commands.add_parser("generate", help="generate images, write PNGs, maps and stats.json")
    _add_sampling(gen)
    gen.add_argument("--mode", default="csd", choices=MODES)
    gen.add_argument("--coupling", choices=sorted(COUPLINGS),
                     help="next drafts of sjd/csd (default: the lossless-tested choice)")
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--out", default="out")
    gen.set_defaults(handler=cmd_generate)

    cmp = commands.add_parser("compare", help="ar, sjd, gsd and csd on the same prompts and seeds: speed and quality")
    _add_sampling(cmp)
    cmp.add_argument("--seeds", type=int, default=3, help="repeats with different seeds, for the spread (default 3)")
    cmp.add_argument("--out", default="out/compare")
    cmp.set_defaults(handler=cmd_compare, num=64)

    bench = commands.add_parser("bench", help="microbenchmarks of the verify op on every available backend")
    bench.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    bench.add_argument("--backends", nargs="*", help="default: every available backend (not Triton's interpreter)")
    bench.add_argument("--quick", action="store_true", help="two shapes instead of six")
    bench.add_argument("--out", default="benchmarks/results")
    bench.set_defaults(handler=cmd_bench)

    sweep = commands.add_parser("sweep", help="the speed-quality frontier: every mode, csd over a grid of lambda x tau "
                                              "x coupling, mean and spread over seeds (JSON, CSV, plot)")
    sweep.add_argument("--model", default="digits", help="a zoo model with a quality measure (default: digits)")
    sweep.add_argument("--per-class", dest="per_class", type=int, default=8, help="images per class per seed (8)")
    sweep.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1 (default 3)")
    sweep.add_argument("--lambdas", default="0,0.05,0.1,0.25,0.5,1", help="csd entropy_coef values")
    sweep.add_argument("--taus", default="0.3,0.65,1", help="csd tvd_threshold values")
    sweep.add_argument("--couplings", default="independent,maximal", help="csd couplings")
    sweep.add_argument("--workers", type=int, default=2, help="processes, one torch thread each (default 2)")
    sweep.add_argument("--out", default="out/sweep/frontier", help="path prefix of the .json, .csv and .png")
    sweep.set_defaults(handler=cmd_sweep)

    run = commands.add_parser("run", help="sharded, resumable generation of a prompts file over modes "
                                          "(torchrun --nproc-per-node N -m csd_kernels run ...)")
    _add_run_arguments(run)
    run.set_defaults(handler=cmd_run)
    return parser


def _add_run_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_options(parser, device=False)  # each rank runs on its own device
    parser.add_argument("--prompts", required=True, help="prompts file: one prompt per line (digits: a class id 0..9)")
    parser.add_argument("--modes", default="ar,sjd,csd", help="comma-separated modes (default ar,sjd,csd)")
    parser.add_argument("--out", required=True, help="output folder (rerun the same command to resume)")
    parser.add_argument("--seed", type=int, default=0, help="global seed (default 0)")
    parser.add_argument("--batch-size", dest="batch_size", type=int, default=16,
                        help="images per generate() call on each rank (default 16; does not change the images)")
    parser.add_argument("--coupling", choices=sorted(COUPLINGS),
                        help="next drafts of sjd/csd (default: the lossless-tested choice)")
    add_generation_options(parser)
    parser.add_argument("--num-threads", dest="num_threads", type=int,
                        help="torch threads per process (default: CPU cores / processes on this node)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar or table")


def main(argv: Optional[list[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        args.handler(args)
    except UsageError as exc:
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
