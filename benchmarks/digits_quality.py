"""AR sample quality of the digits model, by the package's classifier and by two independently built checks.

    python benchmarks/digits_quality.py [--per-class 45] [--seeds 0,1,2] [--cfg 3.0] [--weights DIR]
                                        [--out docs/img/digits_quality.json]

Generates ``--per-class`` AR images of every class per seed with ``csd_kernels.generate(mode="ar")`` at the
zoo entry's defaults (temperature 1, no top-k) and measures them three ways:

* the package's classifier (``zoo/digits/quality.py``: logistic regression on 8x8 pixels): accuracy per class and
  the Fréchet distance of its logit features to the real digits of its train split, next to the same distance for
  the held-out real digits (its test split, 450 images, the same size as the generated set at 45 per class);
* a small CNN trained here on the same train split (different features and model family): accuracy per class and
  a Fréchet distance in its 64-dim penultimate features, next to the held-out real digits';
* a 5-nearest-neighbour classifier on the raw pixels of the train split (no learned features at all).

Also the distance of every image to its nearest train-split digit (pixels, 0..16 scale), for generated and for
held-out real digits, and to its nearest digit among all 1797 the model was trained on (for a real digit: the nearest
other one): generated digits much closer than real ones would mean the model copies its data.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from csd_kernels import generate
from csd_kernels.zoo.digits import NUM_CLASSES, prompt_ids, quality

CNN_SEED, CNN_EPOCHS = 0, 40


class SmallCNN(nn.Module):
    """8x8 grey digit -> 10 logits; ``features`` is the 64-dim penultimate layer used for the Fréchet distance."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(),
                                  nn.MaxPool2d(2), nn.Flatten(), nn.Linear(32 * 16, 64), nn.ReLU())
        self.head = nn.Linear(64, NUM_CLASSES)

    def features(self, x8: np.ndarray) -> torch.Tensor:
        return self.conv(torch.as_tensor(x8, dtype=torch.float32).reshape(-1, 1, 8, 8) / 16.0)

    def forward(self, x8):
        return self.head(self.features(x8))


def train_cnn(x8: np.ndarray, labels: np.ndarray) -> SmallCNN:
    """Adam on the train split (raw and 8->32->8 round-tripped, as the package classifier), seeded."""
    torch.manual_seed(CNN_SEED)
    net = SmallCNN()
    opt = torch.optim.Adam(net.parameters(), lr=3e-3)
    x = torch.as_tensor(np.concatenate([x8, quality._round_trip8(x8)]), dtype=torch.float32)
    y = torch.as_tensor(np.concatenate([labels, labels]))
    g = torch.Generator().manual_seed(CNN_SEED)
    for _ in range(CNN_EPOCHS):
        for idx in torch.randperm(len(x), generator=g).split(64):
            loss = F.cross_entropy(net(x[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
    return net.eval()


def per_class_accuracy(pred: np.ndarray, labels: np.ndarray) -> list[float]:
    return [float((pred[labels == c] == c).mean()) for c in range(NUM_CLASSES)]


class Judges:
    """The three measures, fitted once on the train split of ``quality``'s fixed 75/25 split."""

    def __init__(self):
        from sklearn.neighbors import KNeighborsClassifier

        x_tr, x_te, y_tr, y_te = quality.data_split()
        self.train8, self.heldout8, self.heldout_labels = quality._round_trip8(x_tr), quality._round_trip8(x_te), y_te
        self.all8 = np.concatenate([self.train8, self.heldout8])
        self.cnn = train_cnn(x_tr, y_tr)
        self.knn = KNeighborsClassifier(n_neighbors=5).fit(self.train8, y_tr)
        with torch.no_grad():
            self.cnn_train = self.cnn.features(self.train8).numpy()
        self.clf_train = quality._features8(self.train8)

    def measure(self, x8: np.ndarray, labels: np.ndarray, in_dataset: bool = False) -> dict:
        """The measures of images [N, 64]; ``in_dataset``: they are among the 1797 digits (skip each one itself)."""
        with torch.no_grad():
            cnn_features = self.cnn.features(x8)
            cnn_pred = self.cnn.head(cnn_features).argmax(1).numpy()
        dist = torch.cdist(torch.as_tensor(x8), torch.as_tensor(self.all8))  # all8 = train8, then held-out
        nearest = dist[:, : len(self.train8)].min(1).values.numpy()
        nearest_any = dist.topk(2, dim=1, largest=False).values[:, 1 if in_dataset else 0].numpy()
        return {
            "package_accuracy": per_class_accuracy(quality.classifier().predict(x8), labels),
            "package_frechet": quality.frechet_distance(quality._features8(x8), self.clf_train),
            "cnn_accuracy": per_class_accuracy(cnn_pred, labels),
            "cnn_frechet": quality.frechet_distance(cnn_features.numpy(), self.cnn_train),
            "knn_accuracy": per_class_accuracy(self.knn.predict(x8), labels),
            "nearest_train_distance": float(nearest.mean()),
            "nearest_dataset_distance": float(nearest_any.mean()),
        }


def ar_images8(entry, per_class: int, seed: int, cfg_scale: float | None) -> tuple[np.ndarray, np.ndarray]:
    """``per_class`` AR images of every class (8x8, 0..16 scale) and their labels."""
    labels = np.repeat(np.arange(NUM_CLASSES), per_class)
    kwargs = dict(entry.defaults, **({} if cfg_scale is None else {"cfg_scale": cfg_scale}))
    out = generate(entry.model, prompt_ids(labels.tolist()), mode="ar", seed=seed * len(labels), **kwargs)
    images = out.images[..., 0].float() / 255.0  # [N, 32, 32]
    return quality.downsample_to_8x8(images), labels


def summarise(runs: list[dict]) -> dict:
    """Mean and spread (std over seeds) of every measure; per-class lists also averaged over classes."""
    out = {}
    for key in runs[0]:
        values = np.array([r[key] for r in runs], dtype=np.float64)
        if values.ndim == 2:  # per class
            out[key + "_per_class"] = values.mean(0).round(4).tolist()
            values = values.mean(1)
        out[key] = {"mean": float(values.mean()), "std": float(values.std())}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-class", type=int, default=45)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--cfg", type=float, default=None, help="cfg scale (default: the zoo entry's)")
    parser.add_argument("--weights", default=None, help="a trained weights folder instead of the shipped one")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default="docs/img/digits_quality.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.weights:  # point the zoo at another weights folder (the zoo reads model.WEIGHTS_DIR when it loads)
        from pathlib import Path

        from csd_kernels.zoo.digits import model

        model.WEIGHTS_DIR = Path(args.weights).resolve()
    from csd_kernels import zoo

    begin = time.perf_counter()
    entry = zoo.load("digits")
    judges = Judges()
    heldout = judges.measure(judges.heldout8, judges.heldout_labels, in_dataset=True)
    seeds = [int(s) for s in args.seeds.split(",")]
    runs = [judges.measure(*ar_images8(entry, args.per_class, seed, args.cfg)) for seed in seeds]
    report = {"cfg_scale": args.cfg or entry.defaults.get("cfg_scale"), "per_class": args.per_class,
              "seeds": args.seeds, "weights": args.weights or "shipped", "ar": summarise(runs),
              "heldout_real": summarise([heldout]), "seconds": round(time.perf_counter() - begin, 1)}
    print(format_report(report))
    if args.out:
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)


def format_report(report: dict) -> str:
    ar, real = report["ar"], report["heldout_real"]
    pm = lambda r, k: f"{r[k]['mean']:.3f} ± {r[k]['std']:.3f}"  # noqa: E731
    lines = [f"AR at cfg {report['cfg_scale']}, {report['per_class']} per class, seeds {report['seeds']} "
             f"({report['seconds']} s); held-out real digits for reference"]
    for key in ("package_accuracy", "cnn_accuracy", "knn_accuracy"):
        lines.append(f"{key:24s} AR {pm(ar, key)}   real {real[key]['mean']:.3f}   per class (AR) "
                     + " ".join(f"{v:.2f}" for v in ar[key + '_per_class']))
    for key in ("package_frechet", "cnn_frechet", "nearest_train_distance", "nearest_dataset_distance"):
        lines.append(f"{key:24s} AR {pm(ar, key)}   real {real[key]['mean']:.3f}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
