"""AR sample quality of a scenes model: adherence, background accuracy and Fréchet distance per cfg scale.

    python -m csd_kernels.zoo.scenes.evaluate [--weights DIR] [--cfg 1,2,3,5] [--images 200] [--seed 0]
                                             [--backgrounds clouds,waves] [--out FILE.json] [--grid FILE.png]

Plain AR (``csd_kernels.generate(mode="ar")``, temperature 1) over a fixed prompt mix (``world.random_prompts``:
1-3 objects uniformly, every attribute uniform, the background named: any kind, or the ``--backgrounds`` in turn), in
batches of 16, with the adherence per background kind; the ceiling row is the same prompts rendered and passed
through the tokenizer and back.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import time

import numpy as np
import torch

from ...fileio.outputs import OutputError
from . import checker
from .world import parse_prompt, random_prompts

BATCH = 16


def ar_images(entry, prompts: list[str], cfg: float, seed: int, top_k: int | None = None) -> np.ndarray:
    """uint8 [N, 96, 96, 3]: one AR sample per prompt of the zoo model ``entry``, row seeds ``seed + i``."""
    from ...decoding import generate

    images = []
    for start in range(0, len(prompts), BATCH):
        chunk = prompts[start:start + BATCH]
        out = generate(entry.model, **entry.prompt_inputs(chunk), mode="ar", cfg_scale=cfg, top_k=top_k,
                       seed=seed + start)
        images.append(out.images.numpy())
    return np.concatenate(images)


def evaluate(weights_dir=None, cfgs=(1.0, 2.0, 3.0, 5.0), images: int = 200, seed: int = 0, top_k: int | None = None,
             backgrounds: tuple[str, ...] | None = None,
             log=lambda *a: print(*a, flush=True)) -> tuple[dict, dict]:
    """({"cfg<s>": quality, "ceiling": quality}, {"cfg<s>": images}) for ``images`` prompts of the fixed mix."""
    from ... import zoo

    entry = zoo.load("scenes", weights=weights_dir)
    prompts = random_prompts(images, seed=seed + 1, backgrounds=backgrounds)
    results, samples = {}, {}
    for cfg in cfgs:
        t0 = time.time()
        samples[f"cfg{cfg:g}"] = ar_images(entry, prompts, cfg, seed, top_k)
        q = checker.scene_quality(samples[f"cfg{cfg:g}"], prompts, seed)
        results[f"cfg{cfg:g}"] = {**q, "by_background": by_background(samples[f"cfg{cfg:g}"], prompts),
                                  "seconds": round(time.time() - t0, 1), "images": images}
        log(f"cfg {cfg:g}: {results[f'cfg{cfg:g}']}")
    results["ceiling"] = entry.heldout_quality(prompts, seed)
    log(f"ceiling (rendered -> tokenizer -> back): {results['ceiling']}")
    return results, samples


def by_background(images: np.ndarray, prompts: list[str]) -> dict:
    """{kind: {"adherence", "images"}} over the prompts naming each background kind."""
    kinds = [parse_prompt(p).background for p in prompts]
    return {k: {"adherence": checker.adherence([im for im, kk in zip(images, kinds) if kk == k],
                                               [p for p, kk in zip(prompts, kinds) if kk == k]),
                "images": kinds.count(k)} for k in dict.fromkeys(kinds) if k}


def save_grid(images: np.ndarray, path, ncol: int = 8) -> None:
    from PIL import Image

    ncol = min(ncol, len(images))
    blank = np.zeros_like(images[0])  # fills the last row
    padded = list(images) + [blank] * (-len(images) % ncol)
    rows = [np.concatenate(padded[r:r + ncol], axis=1) for r in range(0, len(padded), ncol)]
    Image.fromarray(np.concatenate(rows, axis=0)).save(path, format="PNG")


def write_outputs(results: dict, samples: np.ndarray, out: str | None, grid: str | None) -> list[str]:
    """--out (the JSON) and --grid (the PNG), all or none: each folder's files are put in place once both are
    written (a failure leaves the earlier ones as they were); returns the paths written."""
    from ...fileio.outputs import Output

    wanted = [(path, kind) for path, kind in ((out, "json"), (grid, "png")) if path]
    with contextlib.ExitStack() as stack:
        outputs = {folder: stack.enter_context(Output(folder))
                   for folder in sorted({os.path.dirname(os.path.abspath(path)) for path, _ in wanted})}
        for path, kind in wanted:
            output = outputs[os.path.dirname(os.path.abspath(path))]
            if kind == "json":
                output.write(os.path.basename(path), json.dumps(results, indent=1))
            else:
                save_grid(samples, output.path(os.path.basename(path)))
    return [path for path, _ in wanted]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m csd_kernels.zoo.scenes.evaluate", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--weights", default=None, help="a trained scenes folder (default: the shipped weights)")
    ap.add_argument("--cfg", default="1,2,3,5")
    ap.add_argument("--images", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--top-k", type=int, default=None, help="sample from the k most likely codes (default: all)")
    ap.add_argument("--backgrounds", default=None,
                    help="comma-separated background kinds to cycle through (default: each drawn from all)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    ap.add_argument("--grid", default=None, help="write the first 32 samples of the first cfg as a PNG here")
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    cfgs = tuple(float(v) for v in a.cfg.split(","))
    backgrounds = tuple(a.backgrounds.split(",")) if a.backgrounds else None
    results, samples = evaluate(a.weights, cfgs, a.images, a.seed, a.top_k, backgrounds)
    try:
        for path in write_outputs(results, samples[f"cfg{cfgs[0]:g}"][:32], a.out, a.grid):
            print(f"wrote {path}")
    except OutputError as exc:
        raise SystemExit(f"{ap.prog}: error: {exc}") from None


if __name__ == "__main__":
    main()
