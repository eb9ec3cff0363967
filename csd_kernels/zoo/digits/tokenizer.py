"""Vector-quantised 2x2 patch tokenizer for scikit-learn's ``load_digits``.

Images are the 8x8 digits (grey levels 0..16) scaled to [0, 1] and bilinearly
upsampled to 32x32.  Each image is cut into 2x2 patches, giving a 16x16 token
grid (256 tokens, raster order).  A k-means codebook maps each 4-dim patch to a
code id.

Real VQ image tokenizers map flat regions to *many* near-identical codes, which
makes an AR model's next-token distribution high-entropy there.  To reproduce
that, fitting and encoding perturb the patches with low-amplitude Gaussian noise
(a deterministic "texture" drawn from a seeded generator).  Each code stores two
vectors: ``centroids`` (in the noisy space, used for nearest-neighbour
assignment) and ``values`` (the mean *clean* patch assigned to the code, used by
``decode``), so decoding returns a clean image.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

IMAGE_SIZE = 32
PATCH = 2
GRID = (IMAGE_SIZE // PATCH, IMAGE_SIZE // PATCH)  # (16, 16)
TOKENS_PER_IMAGE = GRID[0] * GRID[1]  # 256
PATCH_DIM = PATCH * PATCH
DEFAULT_NOISE = 0.04  # std of the texture noise, image scale [0, 1]


def digits_dataset() -> tuple[torch.Tensor, torch.Tensor]:
    """Return (images32 float32 [1797, 32, 32] in [0, 1], labels long [1797])."""
    from sklearn.datasets import load_digits

    d = load_digits()
    return upsample(d.images), torch.from_numpy(d.target.astype(np.int64))


def upsample(digits8) -> torch.Tensor:
    """8x8 digits in the 0..16 scale of ``load_digits`` ([N, 64] or [N, 8, 8]) -> float32 [N, 32, 32] in [0, 1]."""
    x = torch.as_tensor(np.asarray(digits8, dtype=np.float32)).reshape(-1, 1, 8, 8) / 16.0
    x32 = F.interpolate(x, size=(IMAGE_SIZE, IMAGE_SIZE), mode="bilinear", align_corners=False)[:, 0]
    return x32.clamp_(0.0, 1.0).contiguous()


def to_uint8(images: torch.Tensor) -> torch.Tensor:
    """Float images in [0, 1] -> uint8 in [0, 255] (same shape)."""
    images = torch.as_tensor(images)
    return (images.detach().float().clamp(0.0, 1.0) * 255.0).round().to(torch.uint8)


def _check_images(images: torch.Tensor) -> torch.Tensor:
    if not isinstance(images, torch.Tensor):
        images = torch.as_tensor(np.asarray(images))
    if images.ndim != 3 or tuple(images.shape[1:]) != (IMAGE_SIZE, IMAGE_SIZE):
        raise ValueError(f"expected images of shape [N, {IMAGE_SIZE}, {IMAGE_SIZE}], got {tuple(images.shape)}")
    if not images.is_floating_point():
        raise ValueError(f"expected float images in [0, 1], got dtype {images.dtype}")
    return images.detach().float().cpu()


def images_to_patches(images: torch.Tensor) -> torch.Tensor:
    """[N, 32, 32] -> [N, 256, 4] (raster order over the 16x16 grid)."""
    n = images.shape[0]
    p = images.reshape(n, GRID[0], PATCH, GRID[1], PATCH).permute(0, 1, 3, 2, 4)
    return p.reshape(n, TOKENS_PER_IMAGE, PATCH_DIM)


def patches_to_images(patches: torch.Tensor) -> torch.Tensor:
    """[N, 256, 4] -> [N, 32, 32]."""
    n = patches.shape[0]
    p = patches.reshape(n, GRID[0], GRID[1], PATCH, PATCH).permute(0, 1, 3, 2, 4)
    return p.reshape(n, IMAGE_SIZE, IMAGE_SIZE)


def texture_noise(shape, amplitude: float, seed: int) -> torch.Tensor:
    """Deterministic Gaussian texture noise (std ``amplitude``) from a seeded CPU generator."""
    if amplitude <= 0:
        return torch.zeros(shape)
    g = torch.Generator().manual_seed(int(seed))
    return torch.randn(shape, generator=g) * float(amplitude)


def _nearest(x: torch.Tensor, centroids: torch.Tensor, chunk: int = 65536) -> torch.Tensor:
    """Index of the nearest centroid (squared L2) for each row of x [M, D]."""
    c2 = (centroids * centroids).sum(1)
    out = torch.empty(x.shape[0], dtype=torch.long)
    for s in range(0, x.shape[0], chunk):
        xb = x[s : s + chunk]
        d = c2[None, :] - 2.0 * xb @ centroids.T  # |x|^2 constant per row
        out[s : s + chunk] = d.argmin(1)
    return out


def kmeans(x: torch.Tensor, k: int, seed: int = 0, iters: int = 25) -> torch.Tensor:
    """Deterministic k-means++ / Lloyd k-means in torch (float64 for stable sums). Returns [k, D]."""
    x = x.double()
    g = torch.Generator().manual_seed(int(seed))
    m = x.shape[0]
    if m < k:
        raise ValueError(f"need at least {k} points for k-means, got {m}")
    cent = torch.empty(k, x.shape[1], dtype=torch.float64)
    cent[0] = x[torch.randint(m, (1,), generator=g)]
    d2 = ((x - cent[0]) ** 2).sum(1)
    for i in range(1, k):
        probs = d2 / d2.sum() if d2.sum() > 0 else torch.full_like(d2, 1.0 / m)
        j = torch.multinomial(probs, 1, generator=g)
        cent[i] = x[j]
        d2 = torch.minimum(d2, ((x - cent[i]) ** 2).sum(1))
    for _ in range(iters):
        a = _nearest(x, cent)
        sums = torch.zeros_like(cent).index_add_(0, a, x)
        counts = torch.bincount(a, minlength=k).double()
        empty = counts == 0
        new = sums / counts.clamp(min=1)[:, None]
        if empty.any():  # re-seed empty clusters deterministically at the worst-fit points
            dist = ((x - cent[a]) ** 2).sum(1)
            far = torch.argsort(dist, descending=True)[: int(empty.sum())]
            new[empty] = x[far]
        shift = (new - cent).abs().max().item()
        cent = new
        if shift < 1e-7:
            break
    return cent.float()


@dataclass
class PatchCodebook:
    centroids: torch.Tensor  # [K, 4] noisy-space centroids (assignment)
    values: torch.Tensor  # [K, 4] clean patch value per code (decoding), in [0, 1]
    noise: float = DEFAULT_NOISE  # texture amplitude used by encode() by default

    @property
    def num_codes(self) -> int:
        return int(self.centroids.shape[0])

    # ------------------------------------------------------------------ fit
    @classmethod
    def fit(
        cls,
        images: torch.Tensor,
        num_codes: int = 512,
        seed: int = 0,
        noise: float = DEFAULT_NOISE,
        max_points: int = 120_000,
        iters: int = 25,
    ) -> "PatchCodebook":
        """Fit the codebook on (noise-perturbed) 2x2 patches of ``images`` [N, 32, 32]."""
        images = _check_images(images)
        if num_codes < 2:
            raise ValueError("num_codes must be >= 2")
        clean = images_to_patches(images).reshape(-1, PATCH_DIM)
        noisy = images_to_patches(images + texture_noise(images.shape, noise, seed + 1)).reshape(-1, PATCH_DIM)
        g = torch.Generator().manual_seed(int(seed))
        if noisy.shape[0] > max_points:
            sub = torch.randperm(noisy.shape[0], generator=g)[:max_points]
        else:
            sub = torch.arange(noisy.shape[0])
        cent = kmeans(noisy[sub], num_codes, seed=seed, iters=iters)
        # clean decode value = mean clean patch of everything assigned to the code
        a = _nearest(noisy, cent)
        sums = torch.zeros(num_codes, PATCH_DIM, dtype=torch.float64).index_add_(0, a, clean.double())
        counts = torch.bincount(a, minlength=num_codes).double()
        values = torch.where(counts[:, None] > 0, sums / counts.clamp(min=1)[:, None], cent.double().clamp(0, 1))
        return cls(centroids=cent.contiguous(), values=values.float().clamp(0, 1).contiguous(), noise=float(noise))

    # ------------------------------------------------------- encode/decode
    def encode(self, images: torch.Tensor, noise: float | None = None, seed: int = 0) -> torch.Tensor:
        """[N, 32, 32] float in [0, 1] -> LongTensor [N, 256] (raster order).

        ``noise`` (default: the codebook's texture amplitude) perturbs the patches
        with deterministic seeded noise before nearest-code assignment, as in
        training; pass ``noise=0`` for a plain nearest-code quantisation.
        Deterministic for fixed (images, noise, seed).
        """
        images = _check_images(images)
        amp = self.noise if noise is None else float(noise)
        x = images + texture_noise(images.shape, amp, seed)
        p = images_to_patches(x).reshape(-1, PATCH_DIM)
        return _nearest(p, self.centroids).reshape(images.shape[0], TOKENS_PER_IMAGE)

    def code_distribution(self, images: torch.Tensor, draws: int = 16, noise: float | None = None,
                          seed: int = 0) -> torch.Tensor:
        """Monte-Carlo estimate of P(code | clean patch) under the texture noise: float [N, 256, K], rows sum to 1.

        ``encode`` draws one code from this distribution per patch; averaging ``draws`` independent encodings gives
        an unbiased estimate of it.  Training on it as a soft target has the same expected gradient as training on
        encoded codes, with far less variance (one encoding is one sample of ~100 equally likely background codes).
        """
        images = _check_images(images)
        if draws < 1:
            raise ValueError(f"draws must be >= 1, got {draws}")
        amp = self.noise if noise is None else float(noise)
        counts = torch.zeros(images.shape[0] * TOKENS_PER_IMAGE, self.num_codes)
        ones = torch.ones(counts.shape[0], 1)
        for k in range(draws):
            noisy = images + texture_noise(images.shape, amp, seed * draws + k)
            codes = _nearest(images_to_patches(noisy).reshape(-1, PATCH_DIM), self.centroids)
            counts.scatter_add_(1, codes[:, None], ones)
        return (counts / draws).reshape(images.shape[0], TOKENS_PER_IMAGE, self.num_codes)

    def decode(self, tokens: torch.Tensor) -> torch.Tensor:
        """LongTensor [N, 256] -> clean images float [N, 32, 32] in [0, 1]."""
        tokens = torch.as_tensor(tokens)
        if tokens.ndim == 1 and tokens.shape[0] == TOKENS_PER_IMAGE:
            raise ValueError(f"expected tokens of shape [N, {TOKENS_PER_IMAGE}], got a 1-D tensor; use tokens[None]")
        if tokens.ndim != 2 or tokens.shape[1] != TOKENS_PER_IMAGE:
            raise ValueError(f"expected tokens of shape [N, {TOKENS_PER_IMAGE}], got {tuple(tokens.shape)}")
        if tokens.is_floating_point() or tokens.dtype == torch.bool:
            raise ValueError(f"expected integer token ids, got dtype {tokens.dtype}")
        tokens = tokens.long().cpu()
        if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= self.num_codes):
            raise ValueError(
                f"token ids must be in [0, {self.num_codes}), got range [{int(tokens.min())}, {int(tokens.max())}]"
            )
        return patches_to_images(self.values[tokens]).clamp(0.0, 1.0)

    # ------------------------------------------------------------ save/load
    def save(self, path: str | os.PathLike) -> None:
        from safetensors.torch import save_file

        save_file(
            {"centroids": self.centroids.float().contiguous(), "values": self.values.float().contiguous()},
            str(path),
            metadata={"noise": repr(float(self.noise)), "format": "csd_kernels.PatchCodebook/1"},
        )

    @classmethod
    def load(cls, path: str | os.PathLike, flag: str = "--weights") -> "PatchCodebook":
        from safetensors import safe_open

        from ...fileio.inputs import check_finite, check_safetensors

        check_safetensors(str(path), flag)  # (a damaged file: one line naming it, before safetensors reads it)
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            cent = f.get_tensor("centroids").float()
            values = f.get_tensor("values").float()
        check_finite({"centroids": cent, "values": values}, flag, str(path))
        if cent.ndim != 2 or cent.shape != values.shape or cent.shape[1] != PATCH_DIM:
            raise ValueError(f"malformed codebook file {path}: centroids {tuple(cent.shape)}, "
                             f"values {tuple(values.shape)}")
        return cls(centroids=cent, values=values, noise=float(meta.get("noise", DEFAULT_NOISE)))
