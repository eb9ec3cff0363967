"""The scenes tokenizer: 4x4 RGB patches -> the nearest of K k-means codes; a 96x96 image is 24x24 = 576 tokens.

Encoding is deterministic (nearest code in RGB space); decoding paints each code's centroid. The codebook is fitted
by k-means (k-means++ seeding, Lloyd iterations, float32) on patches of rendered scenes, where patches that hold an
object's edge are over-sampled: they are few per image but carry every attribute the checker reads.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import torch

from .world import CANVAS, render, sample_scene

PATCH = 4
GRID = (CANVAS // PATCH, CANVAS // PATCH)  # 24 x 24
TOKENS_PER_IMAGE = GRID[0] * GRID[1]
PATCH_DIM = PATCH * PATCH * 3

__all__ = ["PATCH", "GRID", "TOKENS_PER_IMAGE", "PatchTokenizer", "images_to_patches", "patches_to_images",
           "kmeans"]


def images_to_patches(images: torch.Tensor) -> torch.Tensor:
    """[N, 96, 96, 3] -> [N, 576, 48] (raster order of patches; each patch row-major, RGB last)."""
    n = images.shape[0]
    x = images.reshape(n, GRID[0], PATCH, GRID[1], PATCH, 3).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(n, TOKENS_PER_IMAGE, PATCH_DIM)


def patches_to_images(patches: torch.Tensor) -> torch.Tensor:
    n = patches.shape[0]
    x = patches.reshape(n, GRID[0], GRID[1], PATCH, PATCH, 3).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(n, CANVAS, CANVAS, 3)


def _nearest(x: torch.Tensor, centroids: torch.Tensor, chunk: int = 32768) -> torch.Tensor:
    c2 = (centroids * centroids).sum(1)
    out = torch.empty(x.shape[0], dtype=torch.long)
    for s in range(0, x.shape[0], chunk):
        xs = x[s:s + chunk]
        out[s:s + chunk] = (c2[None] - 2 * xs @ centroids.T).argmin(1)
    return out


def kmeans(x: torch.Tensor, k: int, seed: int = 0, iters: int = 20, log=lambda *a: None) -> torch.Tensor:
    """k-means++ seeding then Lloyd iterations on [M, D] float32 points; deterministic for ``seed``. Returns [k, D]."""
    if x.shape[0] < k:
        raise ValueError(f"need at least {k} points for k-means, got {x.shape[0]}")
    g = torch.Generator().manual_seed(int(seed))
    cent = torch.empty(k, x.shape[1])
    cent[0] = x[torch.randint(x.shape[0], (1,), generator=g)]
    d2 = ((x - cent[0]) ** 2).sum(1)
    for i in range(1, k):
        cent[i] = x[torch.multinomial(d2 / d2.sum(), 1, generator=g)]
        d2 = torch.minimum(d2, ((x - cent[i]) ** 2).sum(1))
    for it in range(iters):
        a = _nearest(x, cent)
        counts = torch.bincount(a, minlength=k)
        new = torch.zeros_like(cent).index_add_(0, a, x) / counts.clamp(min=1)[:, None].float()
        empty = counts == 0
        if empty.any():  # re-seed empty clusters at the worst-fit points
            far = ((x - cent[a]) ** 2).sum(1).argsort(descending=True)[: int(empty.sum())]
            new[empty] = x[far]
        shift = float((new - cent).abs().max())
        cent = new
        log(f"k-means iteration {it}: max centroid shift {shift:.3f}, empty {int(empty.sum())}")
        if shift < 1e-3:
            break
    return cent


def _edge_weight(patches: torch.Tensor) -> torch.Tensor:
    """1 for plain patches, larger for patches that mix an object colour with the background (bright vs dark)."""
    bright = patches.reshape(*patches.shape[:-1], PATCH * PATCH, 3).amax(-1) > 150  # [.., 16]
    frac = bright.float().mean(-1)
    return torch.where((frac > 0) & (frac < 1), 8.0, 1.0)


@dataclass
class PatchTokenizer:
    centroids: torch.Tensor  # [K, 48] float32, pixel values 0..255

    @property
    def num_codes(self) -> int:
        return int(self.centroids.shape[0])

    @classmethod
    def fit(cls, num_codes: int = 4096, num_scenes: int = 1500, max_points: int = 200_000, seed: int = 0,
            iters: int = 15, log=lambda *a: None) -> "PatchTokenizer":
        """Fit on the patches of ``num_scenes`` rendered scenes (seeded), edge patches over-sampled 8:1."""
        rng = np.random.default_rng(seed)
        images = torch.from_numpy(np.stack([render(sample_scene(rng)) for _ in range(num_scenes)]))
        patches = images_to_patches(images.float()).reshape(-1, PATCH_DIM)
        g = torch.Generator().manual_seed(int(seed) + 1)
        idx = torch.multinomial(_edge_weight(patches), min(max_points, patches.shape[0]), replacement=False,
                                generator=g)
        return cls(kmeans(patches[idx], num_codes, seed=seed, iters=iters, log=log))

    def encode(self, images) -> torch.Tensor:
        """[N, 96, 96, 3] uint8 (or floats 0..255) -> LongTensor [N, 576]."""
        x = torch.as_tensor(np.asarray(images) if not torch.is_tensor(images) else images)
        if x.ndim != 4 or tuple(x.shape[1:]) != (CANVAS, CANVAS, 3):
            raise ValueError(f"images must be [N, {CANVAS}, {CANVAS}, 3], got {list(x.shape)}")
        p = images_to_patches(x.float())
        return _nearest(p.reshape(-1, PATCH_DIM), self.centroids).reshape(p.shape[0], TOKENS_PER_IMAGE)

    def decode(self, tokens: torch.Tensor) -> torch.Tensor:
        """LongTensor [N, 576] -> uint8 [N, 96, 96, 3]."""
        t = torch.as_tensor(tokens).long().cpu()
        if t.ndim != 2 or t.shape[1] != TOKENS_PER_IMAGE:
            raise ValueError(f"tokens must be [N, {TOKENS_PER_IMAGE}], got {list(t.shape)}")
        if t.numel() and (int(t.min()) < 0 or int(t.max()) >= self.num_codes):
            raise ValueError(f"tokens must be codes in 0..{self.num_codes - 1}")
        img = patches_to_images(self.centroids[t])
        return img.round().clamp(0, 255).to(torch.uint8)

    def save(self, path: str | os.PathLike) -> None:
        from safetensors.torch import save_file

        save_file({"centroids": self.centroids.to(torch.float16).contiguous()}, str(path))

    @classmethod
    def load(cls, path: str | os.PathLike, flag: str = "--weights") -> "PatchTokenizer":
        """The tokenizer saved at ``path``; InputError naming ``flag`` for a damaged file or one of another kind."""
        from safetensors.torch import load_file

        from ...fileio.inputs import InputError, check_finite, check_safetensors

        centroids = check_safetensors(str(path), flag).get("centroids")
        if centroids is None or len(centroids["shape"]) != 2 or centroids["shape"][1] != PATCH_DIM:
            raise InputError(flag, str(path), f"not a scenes tokenizer (expected a centroids tensor [K, {PATCH_DIM}])")
        return cls(check_finite(load_file(str(path)), flag, str(path))["centroids"].float())
