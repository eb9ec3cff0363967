"""Prompt adherence from pixels alone: find the objects of a scene image and name their colour, shape and cell.

``read_scene(image)`` segments the pixels close to one of the eight object colours (the backgrounds are dark and
unsaturated, far from every one of them), keeps the connected components of at least ``MIN_AREA`` pixels, and names
each: its colour by majority, its shape by the best overlap (IoU) with an ideal circle, square or triangle fitted to
its bounding box, its cell by the box's centre. An image adheres to a prompt when the objects found are exactly the
prompt's. ``background_kind`` reads the background the same way (texture, then vertical trend).

The Fréchet distance compares generated scenes with rendered scenes of the same prompts in a fixed feature space:
8x8-pooled pixels projected on the principal axes of rendered scenes (seeded; :func:`features`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from ..frechet import frechet_distance
from .world import CANVAS, CELL, COLOURS, SHAPES, Prompt, parse_prompt, render, sample_scene, scene_for, shape_mask

MIN_AREA = 30  # pixels: the smallest object (a triangle of side 12.8) covers ~70
COLOUR_RADIUS = 80.0  # RGB distance to a palette colour within which a pixel is an object's
_PALETTE = np.array(list(COLOURS.values()), np.float64)
_NAMES = list(COLOURS)

__all__ = ["Found", "read_scene", "object_mask", "adheres", "adherence", "background_kind", "features",
           "frechet_distance", "scene_quality"]


@dataclass(frozen=True)
class Found:
    colour: str
    shape: str
    cell: int
    area: int
    iou: float  # overlap with the ideal shape it was named after

    def key(self) -> tuple[str, str, int]:
        return (self.colour, self.shape, self.cell)


def _check_image(image) -> np.ndarray:
    a = np.asarray(image)
    if a.shape != (CANVAS, CANVAS, 3):
        raise ValueError(f"a scenes image is [{CANVAS}, {CANVAS}, 3] RGB, got shape {list(a.shape)}")
    return a.astype(np.float64) if a.dtype == np.uint8 else np.clip(a.astype(np.float64), 0, 255)


def _name_shape(mask: np.ndarray) -> tuple[str, float]:
    ys, xs = np.nonzero(mask)
    y0, y1, x0, x1 = ys.min(), ys.max() + 1, xs.min(), xs.max() + 1
    cy, cx = (y0 + y1) / 2, (x0 + x1) / 2
    h, w = y1 - y0, x1 - x0
    sizes = {"circle": (h + w) / 2, "square": (h + w) / 2, "triangle": float(w)}
    best, best_iou = SHAPES[0], -1.0
    for shape in SHAPES:
        ideal = shape_mask(shape, sizes[shape], cy, cx)
        iou = (mask & ideal).sum() / max(1, (mask | ideal).sum())
        if iou > best_iou:
            best, best_iou = shape, float(iou)
    return best, best_iou


def _segments(image) -> tuple[np.ndarray, int, np.ndarray]:
    """(labels [H, W], count, nearest palette colour [H, W]) of the 8-connected components of object-coloured pixels."""
    from scipy import ndimage

    px = _check_image(image)
    dist = np.linalg.norm(px[:, :, None, :] - _PALETTE[None, None], axis=-1)  # [H, W, 8]
    nearest, object_px = dist.argmin(-1), dist.min(-1) < COLOUR_RADIUS
    labels, n = ndimage.label(object_px, structure=np.ones((3, 3), bool))
    return labels, n, nearest


def object_mask(image) -> np.ndarray:
    """bool [96, 96]: the pixels of the objects :func:`read_scene` finds (components of at least MIN_AREA pixels)."""
    labels, n, _ = _segments(image)
    kept = np.bincount(labels.ravel(), minlength=n + 1) >= MIN_AREA
    kept[0] = False  # label 0: no object colour
    return kept[labels]


def read_scene(image) -> list[Found]:
    """The objects of one image [96, 96, 3] (uint8 or floats in 0..255), in reading order of their cells."""
    labels, n, nearest = _segments(image)
    found = []
    for i in range(1, n + 1):
        mask = labels == i
        area = int(mask.sum())
        if area < MIN_AREA:
            continue
        colour = _NAMES[int(np.bincount(nearest[mask], minlength=len(_NAMES)).argmax())]
        shape, iou = _name_shape(mask)
        ys, xs = np.nonzero(mask)
        cy, cx = (ys.min() + ys.max() + 1) / 2, (xs.min() + xs.max() + 1) / 2
        cell = int(min(cy // CELL, 2) * 3 + min(cx // CELL, 2))
        found.append(Found(colour, shape, cell, area, iou))
    return sorted(found, key=lambda f: f.cell)


def _prompt(prompt) -> Prompt:
    return prompt if isinstance(prompt, Prompt) else parse_prompt(prompt)


def adheres(image, prompt) -> bool:
    """True when the objects found in ``image`` are exactly the prompt's (colour, shape, cell), no more, no fewer."""
    return sorted(f.key() for f in read_scene(image)) == sorted(_prompt(prompt).objects)


def adherence(images, prompts) -> float:
    """The fraction of images that adhere to their prompts."""
    hits = _adhering(images, prompts)
    return float(np.mean(hits)) if hits else float("nan")


def _adhering(images, prompts) -> list[bool]:
    """Whether each image adheres to its prompt."""
    if len(images) != len(prompts):
        raise ValueError(f"{len(images)} images for {len(prompts)} prompts")
    return [adheres(im, p) for im, p in zip(images, prompts)]


def background_kind(image) -> str:
    """One of world.BACKGROUNDS, from the pixels away from every object: fine texture (the mean step between
    neighbouring pixels) or not; if not, a vertical trend (gradient) or none (flat); if so, structure at the scale of
    4x4 patches (none: noise) and, where there is, whether its values pile up at two extremes as a sine's do (waves)
    or in the middle as a sum of noises' do (clouds)."""
    from scipy import ndimage

    px = _check_image(image)
    dist = np.linalg.norm(px[:, :, None, :] - _PALETTE[None, None], axis=-1).min(-1)
    bg = ~ndimage.binary_dilation(dist < COLOUR_RADIUS, iterations=3)
    grey = px.mean(-1)
    pair = bg[:, 1:] & bg[:, :-1]
    texture = np.abs(np.diff(grey, axis=1))[pair].mean() if pair.any() else 0.0
    if texture <= FINE_TEXTURE:
        return "gradient" if abs(_vertical_trend(grey, bg)) > 12.0 else "flat"
    filled = np.where(bg, grey, grey[bg].mean() if bg.any() else 0.0)
    blocks = filled.reshape(24, 4, 24, 4).mean((1, 3))
    whole = bg.reshape(24, 4, 24, 4).all((1, 3))
    if whole.sum() < 2 or blocks[whole].std() <= PATCH_STRUCTURE:
        return "noise"
    return "waves" if _band_kurtosis(filled, bg) < WAVE_KURTOSIS else "clouds"


FINE_TEXTURE = 4.0  # mean |step| between neighbouring grey pixels: flat and gradient 0, the textures 9-16
PATCH_STRUCTURE = 5.2  # std of 4x4-patch means: noise 3.1-3.8, clouds and waves above 6.7 (rendered scenes)
WAVE_KURTOSIS = 2.15  # of the band-passed grey: waves (a sine, however warped) 1.7-2.0, clouds 2.3-3.4 (rendered)


def _vertical_trend(grey: np.ndarray, bg: np.ndarray) -> float:
    rows = np.array([grey[r][bg[r]].mean() if bg[r].any() else np.nan for r in range(CANVAS)])
    ok = ~np.isnan(rows)
    return float(np.polyfit(np.arange(CANVAS)[ok], rows[ok], 1)[0] * CANVAS) if ok.sum() > 2 else 0.0


def _band_kurtosis(grey: np.ndarray, bg: np.ndarray) -> float:
    """Kurtosis of the background's grey level between the pixel noise and the large scale (blurred by 1.5 px, minus
    its blur by 8 px): a sine's values pile up at its two extremes (kurtosis 1.5), a sum of noises' in the middle
    (3)."""
    from scipy import ndimage

    band = ndimage.gaussian_filter(grey, 1.5) - ndimage.gaussian_filter(grey, 8.0)
    inner = ndimage.binary_erosion(bg, iterations=3)
    if inner.sum() < 16:
        return float("inf")
    v = band[inner] - band[inner].mean()
    return float((v ** 4).mean() / max((v ** 2).mean() ** 2, 1e-12))


def _pool(images) -> np.ndarray:
    a = np.stack([_check_image(im) for im in images]) / 255.0  # [N, 96, 96, 3]
    return a.reshape(len(a), 12, 8, 12, 8, 3).mean((2, 4)).reshape(len(a), -1)


@functools.lru_cache(maxsize=1)
def _basis(n: int = 2000, dims: int = 48, seed: int = 7) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = _pool([render(sample_scene(rng)) for _ in range(n)])
    mean = x.mean(0)
    _, _, vt = np.linalg.svd(x - mean, full_matrices=False)
    return mean, vt[:dims]


def features(images) -> np.ndarray:
    """[N, 48]: 8x8-pooled pixels on the first 48 principal axes of 2000 rendered scenes (seed 7)."""
    mean, axes = _basis()
    return (_pool(images) - mean) @ axes.T


def rendered_like(prompts, seed: int) -> list[np.ndarray]:
    """Rendered scenes of the same prompts (fresh sizes and backgrounds where the prompt leaves them open)."""
    rng = np.random.default_rng(seed)
    return [render(scene_for(_prompt(p), rng)) for p in prompts]


def scene_quality(images, prompts, seed: int = 0) -> dict:
    """Adherence, background accuracy (where the prompt names one) and the Fréchet distance to rendered scenes of
    the same prompts (None for fewer than 2 images); each with its standard error over the images (``NAME_se``:
    of a share, from its images' 0/1 values; of the Fréchet distance, a bootstrap over the generated images)."""
    parsed = [_prompt(p) for p in prompts]
    hits = _adhering(images, parsed)
    named = [background_kind(im) == p.background for im, p in zip(images, parsed) if p.background]
    out = {"adherence": float(np.mean(hits)) if hits else float("nan"), "adherence_se": _share_se(hits),
           "background_accuracy": float(np.mean(named)) if named else None, "frechet": None}
    if named:
        out["background_accuracy_se"] = _share_se(named)
    if len(images) >= 2:
        ours, rendered = features(images), features(rendered_like(parsed, seed))
        out["frechet"] = frechet_distance(ours, rendered)
        out["frechet_se"] = _bootstrap_frechet_se(ours, rendered, seed)
    return out


def _share_se(hits) -> float:
    n = len(hits)
    return float(np.std(hits, ddof=1) / np.sqrt(n)) if n >= 2 else float("nan")


def _bootstrap_frechet_se(ours: np.ndarray, rendered: np.ndarray, seed: int, draws: int = 32) -> float:
    """The spread of the distance over resamples of the generated images (the rendered reference held fixed)."""
    rng = np.random.default_rng(seed)
    n = len(ours)
    return float(np.std([frechet_distance(ours[rng.integers(0, n, n)], rendered) for _ in range(draws)], ddof=1))
