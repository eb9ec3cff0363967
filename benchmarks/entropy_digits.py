"""Where the digits model's entropy comes from: the tokenizer's texture noise vs the model's own uncertainty.

    python benchmarks/entropy_digits.py [--num 6] [--draws 256] [--out docs/img/digits_entropy_real.png]

For ``--num`` real digits (one per class from 0 up, from the classifier's held-out split) it shows, per token:

1. the digit (32x32, as the model sees it after decoding its codes);
2. the tokenizer's own entropy H(code | clean patch): how many codes the texture noise spreads a patch over,
   estimated from ``--draws`` encodings (``PatchCodebook.code_distribution``).  This does not involve the model;
3. the model's next-token entropy, teacher-forced on the digit encoded by the codebook (one encoding, guided at the
   zoo entry's cfg scale, temperature 1: the p the decoding loop verifies against);
4. their difference (the model's uncertainty beyond the tokenizer's noise).

Prints the means over all ``--num`` digits for background (clean patch max < 0.05) and stroke (max > 0.3) tokens.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from csd_kernels.zoo.digits import (
    GRID,
    NULL_TOKEN_ID,
    cfg_logits,
    load_codebook,
    load_lm,
    prompt_ids,
    quality,
    upsample,
)


def real_digits(num: int) -> tuple[torch.Tensor, np.ndarray]:
    """``num`` held-out real digits (classes 0, 1, 2, ... in turn) at 32x32."""
    _, x_te, _, y_te = quality.data_split()
    picks = [int(np.flatnonzero(y_te == c % 10)[c // 10]) for c in range(num)]
    return upsample(x_te[picks]), y_te[picks]


def entropy(p: torch.Tensor) -> torch.Tensor:
    return -(p * torch.log(p.clamp(min=1e-30))).sum(-1)


@torch.no_grad()
def model_entropy(lm, codes: torch.Tensor, labels, cfg_scale: float) -> torch.Tensor:
    """[N, 256] entropy (nats) of the guided next-token distribution, teacher-forced on ``codes``."""
    cond = torch.cat([prompt_ids(labels), codes[:, :-1]], 1)
    uncond = torch.cat([torch.full_like(cond[:, :1], NULL_TOKEN_ID), codes[:, :-1]], 1)
    logits = lm(input_ids=torch.cat([cond, uncond])).logits
    guided = cfg_logits(logits[: len(codes)], logits[len(codes):], cfg_scale)
    return entropy(torch.softmax(guided, -1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num", type=int, default=6)
    parser.add_argument("--draws", type=int, default=256)
    parser.add_argument("--out", default="docs/img/digits_entropy_real.png")
    args = parser.parse_args()
    from csd_kernels import zoo

    cfg_scale = zoo.load("digits").defaults["cfg_scale"]
    codebook, lm = load_codebook(), load_lm()
    images, labels = real_digits(args.num)
    tokenizer_h = entropy(codebook.code_distribution(images, draws=args.draws, seed=1))  # [N, 256]
    codes = codebook.encode(images)
    model_h = model_entropy(lm, codes, labels.tolist(), cfg_scale)
    patch_max = images.reshape(-1, GRID[0], 2, GRID[1], 2).amax(dim=(2, 4)).reshape(len(images), -1)
    for name, mask in (("background", patch_max < 0.05), ("stroke", patch_max > 0.3), ("all", patch_max >= 0)):
        print(f"{name:10s} tokenizer {tokenizer_h[mask].mean():.2f} nats   model {model_h[mask].mean():.2f} nats   "
              f"({mask.float().mean():.0%} of tokens)")
    plot(codebook.decode(codes), tokenizer_h, model_h, labels, cfg_scale, args.out)


def plot(images, tokenizer_h, model_h, labels, cfg_scale: float, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(images)
    fig, axes = plt.subplots(4, n, figsize=(1.9 * n + 1.2, 8.2), squeeze=False)
    vmax = float(max(tokenizer_h.max(), model_h.max()))
    rows = [("encoded digit", images, dict(cmap="gray", vmin=0, vmax=1)),
            ("tokenizer\nH(code | patch)", tokenizer_h.reshape(n, *GRID), dict(cmap="magma", vmin=0, vmax=vmax)),
            (f"model, cfg {cfg_scale:g}\nH(p)", model_h.reshape(n, *GRID), dict(cmap="magma", vmin=0, vmax=vmax)),
            ("model − tokenizer", (model_h - tokenizer_h).reshape(n, *GRID), dict(cmap="coolwarm", vmin=-3, vmax=3))]
    for r, (name, data, style) in enumerate(rows):
        for i in range(n):
            im = axes[r, i].imshow(data[i].numpy(), **style)
            axes[r, i].set_xticks([])
            axes[r, i].set_yticks([])
            if r == 0:
                axes[r, i].set_title(f"class {labels[i]}", fontsize=9)
        axes[r, 0].set_ylabel(name, fontsize=9)
        fig.colorbar(im, ax=axes[r, :].tolist(), shrink=0.9, label="nats" if r else None)
    fig.suptitle("real held-out digits: the tokenizer's noise entropy vs the model's next-token entropy", fontsize=10)
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    main()
