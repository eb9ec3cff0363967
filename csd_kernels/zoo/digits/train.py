"""Fit the patch codebook and train the class-conditional digits GPT.

    python -m csd_kernels.zoo.digits.train --out DIR [--steps 6000] [--seed 0] [--soft-draws 64] [--threads 2]

Writes ``codebook.safetensors``, ``model.safetensors`` (float16, the exponential moving
average of the weights), ``config.json``, ``train_log.json`` and ``samples.png`` to ``DIR``.
Deterministic for a fixed seed (codebook k-means, data order, texture noise, class dropout
and init are all seeded).

Without shifts (the default) every image's target — the distribution of codes the texture
noise sends each patch to — is computed once, from ``soft_draws`` noise draws, and reused.
Shifting by even one pixel moves the data off the real digits' distribution (the shifted
digits' own Fréchet distance to the real ones is 2.5x that of held-out real digits), so
``shift`` is off by default.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from .model import CODEBOOK_FILE, DEFAULT_CFG, NUM_CLASSES, build_lm, sample_ar, save_lm
from .tokenizer import DEFAULT_NOISE, TOKENS_PER_IMAGE, PatchCodebook, digits_dataset

DEFAULTS = dict(steps=6000, batch_size=32, lr=2e-3, warmup=50, weight_decay=0.05, class_dropout=0.1, shift=0,
                soft_draws=64, ema=0.999)


def random_shift(images: torch.Tensor, max_shift: int, g: torch.Generator) -> torch.Tensor:
    """Shift each [32, 32] image by an integer (dy, dx) in [-max_shift, max_shift] with zero fill."""
    if max_shift <= 0:
        return images
    n, h, w = images.shape
    pad = F.pad(images, (max_shift,) * 4)
    d = torch.randint(0, 2 * max_shift + 1, (n, 2), generator=g)
    out = torch.empty_like(images)
    for i in range(n):
        dy, dx = int(d[i, 0]), int(d[i, 1])
        out[i] = pad[i, dy : dy + h, dx : dx + w]
    return out


def lr_at(step: int, steps: int, lr: float, warmup: int) -> float:
    if step < warmup:
        return lr * (step + 1) / warmup
    t = (step - warmup) / max(1, steps - warmup)
    return lr * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * min(1.0, t))))


def evaluate_samples(lm, codebook, n_per_class: int = 5, cfg_scales=(DEFAULT_CFG,), seed: int = 0,
                     log=lambda *a: None) -> dict:
    """Plain AR samples per class at each cfg: ``samples`` (classifier accuracy and Fréchet distance vs the
    train-split digits) and ``_sample_images`` ([N, 32, 32], class-major), both keyed ``cfg<scale>``."""
    from . import quality

    classes = torch.arange(NUM_CLASSES).repeat_interleave(n_per_class)
    ref = quality.real_features(split="train")
    samples, images = {}, {}
    for s in cfg_scales:
        t0 = time.time()
        key = f"cfg{s:g}"
        images[key] = codebook.decode(sample_ar(lm, classes, cfg_scale=s, temperature=1.0, seed=seed))
        samples[key] = dict(
            class_accuracy=quality.class_accuracy(images[key], classes),
            frechet=quality.frechet_distance(quality.features(images[key]), ref),
            seconds=round(time.time() - t0, 2),
            n=int(classes.numel()),
        )
        log(f"samples {key}: class accuracy {samples[key]['class_accuracy']:.3f}  "
            f"frechet {samples[key]['frechet']:.2f}  ({samples[key]['n']} samples, {samples[key]['seconds']:.1f}s)")
    return {"samples": samples, "_sample_images": images}


def save_grid(images: torch.Tensor, path, ncol: int) -> None:
    from PIL import Image

    from .tokenizer import to_uint8

    n = images.shape[0]
    nrow = (n + ncol - 1) // ncol
    canvas = torch.zeros(nrow * 34, ncol * 34, dtype=torch.uint8)
    u = to_uint8(images)
    for i in range(n):
        r, c = divmod(i, ncol)
        canvas[r * 34 + 1 : r * 34 + 33, c * 34 + 1 : c * 34 + 33] = u[i]
    Image.fromarray(canvas.numpy()).resize((ncol * 34 * 2, nrow * 34 * 2), Image.NEAREST).save(path)


def precompute_targets(codebook: PatchCodebook, images: torch.Tensor, draws: int, noise: float, seed: int,
                       chunk: int = 128) -> torch.Tensor:
    """uint8 [N, 256, K]: in how many of ``draws`` texture-noise draws each patch lands on each code.

    ``counts / draws`` is :meth:`PatchCodebook.code_distribution` of every image, computed once (exact in uint8).
    """
    if not 1 <= draws <= 255:
        raise ValueError(f"soft_draws must be in 1..255 to precompute targets, got {draws}")
    counts = torch.empty(images.shape[0], TOKENS_PER_IMAGE, codebook.num_codes, dtype=torch.uint8)
    for i, s in enumerate(range(0, images.shape[0], chunk)):
        dist = codebook.code_distribution(images[s : s + chunk], draws=draws, noise=noise, seed=seed + i)
        counts[s : s + chunk] = (dist * draws).round_().to(torch.uint8)
    return counts


def make_optimizer(lm, lr: float, weight_decay: float) -> torch.optim.AdamW:
    decay = [p for p in lm.parameters() if p.ndim >= 2]
    no_decay = [p for p in lm.parameters() if p.ndim < 2]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=lr, betas=(0.9, 0.95),
    )


def update_ema(ema_lm, lm, decay: float, step: int) -> None:
    """``ema <- ema + (1 - d) (w - ema)`` with ``d = min(decay, (1 + step) / (10 + step))`` (a short warm-up)."""
    d = min(decay, (1.0 + step) / (10.0 + step))
    with torch.no_grad():
        torch._foreach_lerp_(list(ema_lm.parameters()), list(lm.parameters()), 1.0 - d)


def soft_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of [B, T, V] logits against [B, T, K] code distributions (K <= V image codes)."""
    logp = torch.log_softmax(logits, dim=-1)[..., : target.shape[-1]]
    return -(target * logp).sum(-1).mean()


def batches(images: torch.Tensor, labels: torch.Tensor, steps: int, batch_size: int, shift: int,
            class_dropout: float, num_codes: int, g: torch.Generator):
    """Per step: (epoch, idx [B], images [B, 32, 32] shifted, prompt tokens [B] with class dropout to NULL).

    Deterministic for ``g``: a fresh permutation each epoch, then per batch the shifts and the dropout draws.
    """
    n = images.shape[0]
    perm, pos, epoch = torch.randperm(n, generator=g), 0, 0
    for _ in range(steps):
        if pos + batch_size > n:
            perm, pos, epoch = torch.randperm(n, generator=g), 0, epoch + 1
        idx = perm[pos : pos + batch_size]
        pos += batch_size
        x = random_shift(images[idx], shift, g)
        drop = torch.rand(idx.shape[0], generator=g) < class_dropout
        yield epoch, idx, x, torch.where(drop, num_codes + NUM_CLASSES, labels[idx] + num_codes)


def check_settings(soft_draws: int, ema: float, shift: int) -> None:
    if soft_draws < 0:
        raise ValueError(f"soft_draws must be >= 0 (0: train on one drawn code), got {soft_draws}")
    if soft_draws > 255 and not shift:  # before the codebook fit, not after it, in precompute_targets
        raise ValueError(f"soft_draws must be in 1..255 to precompute targets (shift 0), got {soft_draws}")
    if not 0.0 <= ema < 1.0:
        raise ValueError(f"ema must be in [0, 1) (0: no moving average), got {ema}")
    if shift < 0:
        raise ValueError(f"shift must be >= 0 pixels, got {shift}")


def prepare_data(subset, codebook, num_codes: int, seed: int, noise: float, soft_draws: int, shift: int, log):
    """The digits, the codebook (fitted here unless given) and the precomputed targets (None when they are drawn
    per step: with shifts, or with ``soft_draws`` 0), with the seconds the codebook and the targets took."""
    images, labels = digits_dataset()
    if subset is not None:
        images, labels = images[:subset], labels[:subset]
    t0 = time.time()
    if codebook is None:
        codebook = PatchCodebook.fit(images, num_codes=num_codes, seed=seed, noise=noise)
    elif codebook.num_codes != num_codes:
        raise ValueError(f"codebook has {codebook.num_codes} codes, expected {num_codes}")
    t_codebook = time.time() - t0
    log(f"codebook: {num_codes} codes fitted in {t_codebook:.1f}s")
    t0 = time.time()
    fixed = precompute_targets(codebook, images, soft_draws, noise, (seed + 1) * 1_000_003) \
        if soft_draws and not shift else None
    t_targets = time.time() - t0
    if fixed is not None:
        log(f"targets: {soft_draws} noise draws per patch, precomputed in {t_targets:.1f}s")
    return images, labels, codebook, fixed, t_codebook, t_targets


def step_loss(lm, codebook, x, prompt, idx, fixed, step: int, seed: int, noise: float, soft_draws: int):
    """The loss of one batch: codes of ``x`` with the texture re-drawn (the context), scored against the fixed
    targets, per-step soft targets or the drawn codes themselves."""
    codes = codebook.encode(x, noise=noise, seed=seed * 1_000_003 + step)
    seq = torch.cat([prompt[:, None], codes], dim=1)  # [B, 257]
    logits = lm(input_ids=seq[:, :-1], use_cache=False).logits.float()  # [B, 256, V]
    if fixed is not None:
        return soft_loss(logits, fixed[idx].float() / soft_draws)
    if soft_draws:
        return soft_loss(logits, codebook.code_distribution(x, draws=soft_draws, noise=noise,
                                                            seed=(seed + 1) * 1_000_003 + step))
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), seq[:, 1:].reshape(-1))


def optimise(lm, ema_lm, batches_, codebook, fixed, steps: int, seed: int, lr: float, warmup: int,
             weight_decay: float, noise: float, soft_draws: int, ema: float, log_every: int, log) -> list[float]:
    """The training loop: AdamW with warm-up and cosine decay, gradient clipping at 1, the moving average after
    every step. Returns the loss of every step."""
    opt = make_optimizer(lm, lr, weight_decay)
    losses: list[float] = []
    t_loop = time.time()
    for step, (epoch, idx, x, prompt) in enumerate(batches_):
        for grp in opt.param_groups:
            grp["lr"] = lr_at(step, steps, lr, warmup)
        loss = step_loss(lm, codebook, x, prompt, idx, fixed, step, seed, noise, soft_draws)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(lm.parameters(), 1.0)
        opt.step()
        if ema_lm is not None:
            update_ema(ema_lm, lm, ema, step)
        losses.append(float(loss.detach()))
        if log_every and (step % log_every == 0 or step == steps - 1):
            k = min(len(losses), log_every)
            log(f"step {step:5d}  epoch {epoch:3d}  loss {sum(losses[-k:]) / k:.4f}  "
                f"lr {lr_at(step, steps, lr, warmup):.2e}  {time.time() - t_loop:.0f}s")
    return losses


def train(
    out_dir=None,
    steps: int = DEFAULTS["steps"],
    seed: int = 0,
    num_codes: int = 512,
    batch_size: int = DEFAULTS["batch_size"],
    lr: float = DEFAULTS["lr"],
    warmup: int = DEFAULTS["warmup"],
    weight_decay: float = DEFAULTS["weight_decay"],
    class_dropout: float = DEFAULTS["class_dropout"],
    shift: int = DEFAULTS["shift"],
    noise: float = DEFAULT_NOISE,
    soft_draws: int = DEFAULTS["soft_draws"],
    ema: float = DEFAULTS["ema"],
    subset: int | None = None,
    codebook: PatchCodebook | None = None,
    arch: dict | None = None,
    threads: int | None = 2,
    log_every: int = 50,
    eval_per_class: int = 5,
    eval_cfg_scales=(DEFAULT_CFG,),
    verbose: bool = True,
) -> dict:
    """Train the digits GPT. Returns a dict with ``losses`` (per step), ``lm`` (the EMA weights when ``ema > 0``,
    else the trained ones), ``raw_lm`` (the trained weights), ``codebook``, timings and (if ``eval_per_class > 0``)
    sample-quality figures. Writes artefacts to ``out_dir`` when given."""
    check_settings(soft_draws, ema, shift)
    if threads:
        torch.set_num_threads(threads)
    log = print if verbose else (lambda *a, **k: None)
    t_start = time.time()
    images, labels, codebook, fixed, t_codebook, t_targets = prepare_data(subset, codebook, num_codes, seed, noise,
                                                                          soft_draws, shift, log)
    lm = build_lm(seed=seed, num_codes=num_codes, **(arch or {}))
    lm.train()
    ema_lm = copy.deepcopy(lm).eval().requires_grad_(False) if ema else None
    n_params = sum(p.numel() for p in lm.parameters())
    log(f"model: {n_params / 1e6:.2f}M params, {lm.config.num_hidden_layers} layers, hidden {lm.config.hidden_size}")
    g = torch.Generator().manual_seed(seed + 12345)
    t_loop = time.time()
    losses = optimise(lm, ema_lm, batches(images, labels, steps, batch_size, shift, class_dropout, num_codes, g),
                      codebook, fixed, steps, seed, lr, warmup, weight_decay, noise, soft_draws, ema, log_every, log)
    t_train = time.time() - t_loop
    raw_lm, lm = lm.eval(), (ema_lm if ema_lm is not None else lm.eval())
    tail = losses[-min(50, len(losses)):]
    result = dict(
        losses=losses, final_loss=sum(tail) / len(tail), steps=steps, batch_size=batch_size, seed=seed,
        num_codes=num_codes, n_params=n_params, codebook_seconds=t_codebook, targets_seconds=t_targets,
        train_seconds=t_train, lm=lm, raw_lm=raw_lm, codebook=codebook,
    )
    if eval_per_class > 0:
        result.update(evaluate_samples(lm, codebook, eval_per_class, eval_cfg_scales, seed, log))
    result["total_seconds"] = time.time() - t_start
    if out_dir is not None:
        hyper = dict(lr=lr, warmup=warmup, weight_decay=weight_decay, class_dropout=class_dropout, shift=shift,
                     noise=noise, soft_draws=soft_draws, ema=ema, subset=subset, arch=arch)
        write_artefacts(Path(out_dir), result, hyper, eval_per_class)
        log(f"wrote {out_dir}")
    log(f"total {result['total_seconds']:.1f}s (codebook {t_codebook:.1f}s, targets {t_targets:.1f}s, "
        f"training {t_train:.1f}s), final loss {result['final_loss']:.4f}")
    return result


def write_artefacts(out: Path, result: dict, hyperparameters: dict, eval_per_class: int) -> None:
    """The codebook, the (EMA) weights, train_log.json and, after an evaluation, samples.png (one row per class)."""
    out.mkdir(parents=True, exist_ok=True)
    result["codebook"].save(out / CODEBOOK_FILE)
    save_lm(result["lm"], out)
    losses = result["losses"]
    meta = {k: v for k, v in result.items() if k not in ("lm", "raw_lm", "codebook", "_sample_images")}
    meta["loss_every_50"] = [round(sum(losses[i:i + 50]) / len(losses[i:i + 50]), 4)
                             for i in range(0, len(losses), 50)]
    meta["losses"] = [round(v, 4) for v in losses]
    meta["hyperparameters"] = hyperparameters
    (out / "train_log.json").write_text(json.dumps(meta, indent=1))
    images = result.get("_sample_images")
    if images:  # at the shipped cfg when it was evaluated
        key = f"cfg{DEFAULT_CFG:g}"
        save_grid(images[key] if key in images else images[sorted(images)[-1]], out / "samples.png",
                  ncol=eval_per_class)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m csd_kernels.zoo.digits.train", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="output directory for the weights")
    ap.add_argument("--steps", type=int, default=DEFAULTS["steps"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--num-codes", type=int, default=512)
    ap.add_argument("--batch-size", type=int, default=DEFAULTS["batch_size"])
    ap.add_argument("--lr", type=float, default=DEFAULTS["lr"])
    ap.add_argument("--soft-draws", type=int, default=DEFAULTS["soft_draws"],
                    help="targets: the code distribution of each patch from this many noise draws (0: one code)")
    ap.add_argument("--shift", type=int, default=DEFAULTS["shift"], help="random shift augmentation, pixels")
    ap.add_argument("--ema", type=float, default=DEFAULTS["ema"], help="EMA decay of the shipped weights (0: off)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--eval-per-class", type=int, default=10)
    ap.add_argument("--eval-cfg", default="1,1.5,2,3", help="cfg scales of the samples evaluated at the end")
    a = ap.parse_args(argv)
    train(a.out, steps=a.steps, seed=a.seed, num_codes=a.num_codes, batch_size=a.batch_size, lr=a.lr,
          soft_draws=a.soft_draws, shift=a.shift, ema=a.ema, threads=a.threads, eval_per_class=a.eval_per_class,
          eval_cfg_scales=tuple(float(v) for v in a.eval_cfg.split(",")))


if __name__ == "__main__":
    main()
