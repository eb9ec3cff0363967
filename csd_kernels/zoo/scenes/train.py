"""Fit the scenes tokenizer and train the scenes GPT on freshly rendered scenes, resumably.

    python -m csd_kernels.zoo.scenes.train --out DIR [--steps 8000] [--batch-size 8] [--seed 0] [--threads 2]

Every step renders a new batch (the world is unlimited), so there is no data set and no over-fitting; the batch of
step s depends on (seed, s) only, so a run resumed from its checkpoint (written every ``--checkpoint-every`` steps to
DIR/checkpoint.pt; rerun the same command) continues with exactly the data it would have seen. Writes
``tokenizer.safetensors``, ``model.safetensors`` (float16, the moving average of the weights), ``config.json`` and
``train_log.json`` (loss per step, wall time per phase) to DIR; ``evaluate`` adds AR adherence per cfg.
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import math
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from .model import NULL_TOKEN_ID, NUM_CODES, PROMPT_LEN, TOKENIZER_FILE, build_lm, object_cells, prompt_tokens, save_lm
from .tokenizer import GRID, TOKENS_PER_IMAGE, PatchTokenizer
from .world import render, sample_scene

DEFAULTS = dict(steps=8000, batch_size=8, lr=1e-3, warmup=200, weight_decay=0.05, prompt_dropout=0.1,
                background_dropout=0.3, object_weight=3.0, ema=0.999, checkpoint_every=200)


def lr_at(step: int, steps: int, lr: float, warmup: int) -> float:
    if step < warmup:
        return lr * (step + 1) / warmup
    t = (step - warmup) / max(1, steps - warmup)
    return lr * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * min(1.0, t))))


def batch(tokenizer: PatchTokenizer, step: int, size: int, seed: int, prompt_dropout: float,
          background_dropout: float) -> torch.Tensor:
    """LongTensor [size, 586]: prompt tokens then image codes of ``size`` fresh scenes; a function of (seed, step)."""
    rng = np.random.default_rng([seed, step])
    scenes = [sample_scene(rng) for _ in range(size)]
    codes = tokenizer.encode(np.stack([render(s) for s in scenes]))
    rows = []
    for s in scenes:
        if rng.random() < prompt_dropout:
            rows.append([NULL_TOKEN_ID] * PROMPT_LEN)
        else:
            rows.append(prompt_tokens(s.prompt(with_background=rng.random() >= background_dropout)))
    return torch.cat([torch.tensor(rows), codes], dim=1)


def cell_of_token() -> torch.Tensor:
    """long [576]: the 3x3-grid cell of every image token."""
    t = torch.arange(TOKENS_PER_IMAGE)
    row, col = t // GRID[1], t % GRID[1]
    return (row * 3 // GRID[0]) * 3 + col * 3 // GRID[1]


def step_loss(lm, seq: torch.Tensor, object_weight: float = DEFAULTS["object_weight"], bf16: bool = True):
    """Cross-entropy of the image codes given everything before them, over the codebook only; positions in a cell
    the prompt puts an object in weigh ``object_weight`` (a function of the prompt and the position only, not of the
    target: each position's optimum, the model's conditional, is unchanged). ``bf16``: matrix products in bfloat16
    (float32 weights and loss), 2.5x faster on a CPU with AVX-512 BF16."""
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        hidden = lm.model(input_ids=seq[:, :-1], use_cache=False).last_hidden_state[:, PROMPT_LEN - 1:]
        logits = F.linear(hidden, lm.lm_head.weight[:NUM_CODES])
    ce = F.cross_entropy(logits.float().reshape(-1, NUM_CODES), seq[:, PROMPT_LEN:].reshape(-1), reduction="none")
    weight = 1.0 + (object_weight - 1.0) * object_cells(seq[:, :PROMPT_LEN])[:, cell_of_token()].float()
    return (ce * weight.reshape(-1)).sum() / weight.sum()


def make_optimizer(lm, lr: float, weight_decay: float) -> torch.optim.AdamW:
    decay = [p for p in lm.parameters() if p.ndim >= 2]
    rest = [p for p in lm.parameters() if p.ndim < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                              {"params": rest, "weight_decay": 0.0}], lr=lr, betas=(0.9, 0.95))


def fit_tokenizer(out: Path, seed: int, log) -> tuple[PatchTokenizer, float]:
    path = out / TOKENIZER_FILE
    if path.is_file():
        return PatchTokenizer.load(path), 0.0
    t0 = time.time()
    tok = PatchTokenizer.fit(num_codes=NUM_CODES, seed=seed, log=log)
    tok.save(path)
    log(f"tokenizer: {NUM_CODES} codes fitted in {time.time() - t0:.0f} s")
    return PatchTokenizer.load(path), time.time() - t0  # the stored (float16) codebook is the one trained on


def train(out_dir, steps: int = DEFAULTS["steps"], batch_size: int = DEFAULTS["batch_size"], seed: int = 0,
          lr: float = DEFAULTS["lr"], threads: int | None = 2, log_every: int = 50, verbose: bool = True,
          checkpoint_every: int = DEFAULTS["checkpoint_every"], snapshot_every: int = 500,
          arch: dict | None = None) -> dict:
    """Train (or resume) into ``out_dir``; returns the training log. See the module docstring."""
    if threads:
        torch.set_num_threads(threads)
    log = functools.partial(print, flush=True) if verbose else (lambda *a, **k: None)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer, t_tok = fit_tokenizer(out, seed, log)
    lm = build_lm(seed=seed, **(arch or {})).train()
    ema_lm = copy.deepcopy(lm).eval().requires_grad_(False)
    opt = make_optimizer(lm, lr, DEFAULTS["weight_decay"])
    state = dict(step=0, losses=[], train_seconds=0.0, tokenizer_seconds=t_tok, steps=steps, batch_size=batch_size,
                 seed=seed, lr=lr, arch={**(arch or {})}, defaults=DEFAULTS)
    ckpt = out / "checkpoint.pt"
    if ckpt.is_file():
        saved = torch.load(ckpt, weights_only=False)
        lm.load_state_dict(saved["lm"])
        ema_lm.load_state_dict(saved["ema"])
        opt.load_state_dict(saved["opt"])
        state = saved["state"]
        if state["batch_size"] != batch_size or state["seed"] != seed:
            raise ValueError(f"{ckpt} is a run of batch_size={state['batch_size']}, seed={state['seed']}: "
                             "resume it with the same settings")
        if state["steps"] != steps:  # the learning-rate schedule continues towards the new end
            state.setdefault("schedule_changes", []).append({"at_step": state["step"], "steps": steps})
            state["steps"] = steps
        log(f"resumed at step {state['step']} of {steps}")
    n_params = sum(p.numel() for p in lm.parameters())
    log(f"model: {n_params / 1e6:.2f} M parameters")
    t_resume = time.time() - state["train_seconds"]
    for step in range(state["step"], steps):
        for grp in opt.param_groups:
            grp["lr"] = lr_at(step, steps, lr, DEFAULTS["warmup"])
        seq = batch(tokenizer, step, batch_size, seed, DEFAULTS["prompt_dropout"], DEFAULTS["background_dropout"])
        loss = step_loss(lm, seq)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(lm.parameters(), 1.0)
        opt.step()
        d = min(DEFAULTS["ema"], (1.0 + step) / (10.0 + step))
        with torch.no_grad():
            torch._foreach_lerp_(list(ema_lm.parameters()), list(lm.parameters()), 1.0 - d)
        state["losses"].append(round(float(loss.detach()), 4))
        state["step"], state["train_seconds"] = step + 1, time.time() - t_resume
        if log_every and (step % log_every == 0 or step == steps - 1):
            k = min(len(state["losses"]), log_every)
            log(f"step {step:5d}  loss {sum(state['losses'][-k:]) / k:.4f}  {state['train_seconds']:.0f} s")
        if (step + 1) % checkpoint_every == 0 or step + 1 == steps:
            torch.save(dict(lm=lm.state_dict(), ema=ema_lm.state_dict(), opt=opt.state_dict(), state=state),
                       ckpt.with_suffix(".tmp"))
            ckpt.with_suffix(".tmp").replace(ckpt)
            save_lm(ema_lm, out)
            if (step + 1) % snapshot_every == 0:  # the learning curve: adherence of these is measured later
                save_lm(ema_lm, out / "snapshots" / f"step{step + 1}")
            write_log(out, state, n_params)
    return state


def write_log(out: Path, state: dict, n_params: int) -> None:
    losses = state["losses"]
    meta = {k: v for k, v in state.items() if k != "losses"}
    meta["n_params"] = n_params
    meta["loss_every_50"] = [round(sum(losses[i:i + 50]) / len(losses[i:i + 50]), 4)
                             for i in range(0, len(losses), 50)]
    meta["losses"] = losses
    (out / "train_log.json").write_text(json.dumps(meta, indent=1))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m csd_kernels.zoo.scenes.train", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="output directory (resumes from its checkpoint.pt)")
    ap.add_argument("--steps", type=int, default=DEFAULTS["steps"])
    ap.add_argument("--batch-size", type=int, default=DEFAULTS["batch_size"])
    ap.add_argument("--lr", type=float, default=DEFAULTS["lr"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args(argv)
    train(a.out, steps=a.steps, batch_size=a.batch_size, seed=a.seed, lr=a.lr, threads=a.threads)


if __name__ == "__main__":
    main()
