"""The scenes world: procedural RGB canvases of 1-3 coloured shapes on a dark background, and their prompts.

A scene is exact and unlimited: ``sample_scene(rng)`` draws one, ``render(scene)`` paints it (deterministic: the
noise texture is seeded by the scene itself), ``parse_prompt`` / ``format_prompt`` convert the attribute prompt to and
from text. Objects sit centred in distinct cells of the canvas's 3x3 grid, so their attributes can be read back
from pixels alone (:mod:`.checker`).

Backgrounds: ``flat`` (one dark colour), ``gradient`` (vertical), ``noise`` (i.i.d. per pixel: a token's patch does
not depend on its neighbours), and two textures whose patches do, as in the backgrounds of real images: ``clouds``
(fractal value noise mixing two dark tints) and ``waves`` (warped bands of random period, orientation and phase),
both with fine pixel noise on top. Every background stays dark and unsaturated (each channel <= ``BG_MAX``, channel
spread <= ``BG_SPREAD``), so objects are found by colour alone.

Prompt grammar: objects separated by ";", each ``COLOUR SHAPE CELL``, and an optional ``on BACKGROUND``,
e.g. ``"red circle top-left; blue square center; on clouds"``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import numpy as np

from ...fileio.inputs import quote

CANVAS = 96  # pixels per side
CELL = CANVAS // 3
COLOURS = {
    "red": (220, 40, 40), "green": (40, 180, 60), "blue": (40, 80, 220), "yellow": (240, 210, 40),
    "magenta": (200, 50, 200), "cyan": (40, 200, 210), "white": (240, 240, 240), "orange": (245, 140, 30),
}
SHAPES = ("circle", "square", "triangle")
CELLS = ("top-left", "top", "top-right", "left", "center", "right", "bottom-left", "bottom", "bottom-right")
BACKGROUNDS = ("flat", "gradient", "noise", "clouds", "waves")
TEXTURES = ("clouds", "waves")  # the backgrounds whose tokens depend on their neighbours
BG_MAX = 110  # no background channel above this ...
BG_SPREAD = 40  # ... nor a pixel's channels further apart than this
SIZE_RANGE = (0.4, 0.8)  # diameter or side, as a fraction of the cell's width
MAX_OBJECTS = 3
# The textures: (period px, amplitude in grey levels) per octave of the clouds' value noise; the waves' period range,
# amplitude range and the strength (radians) and scale (px) of the noise that warps their phase; fine pixel noise.
CLOUD_OCTAVES = ((24.0, 14.0), (12.0, 12.0), (6.0, 10.0))
CLOUD_FINE_SIGMA = 9.0
WAVE_PERIOD = (10.0, 28.0)
WAVE_AMPLITUDE = (14.0, 22.0)
WAVE_WARP, WAVE_WARP_PERIOD = 3.0, 8.0
WAVE_FINE_SIGMA = 11.0

__all__ = ["CANVAS", "CELL", "COLOURS", "SHAPES", "CELLS", "BACKGROUNDS", "TEXTURES", "BG_MAX", "BG_SPREAD",
           "SIZE_RANGE", "MAX_OBJECTS", "Obj", "Scene", "Prompt", "sample_scene", "render", "shape_mask",
           "parse_prompt", "format_prompt", "random_prompts"]


@dataclass(frozen=True)
class Obj:
    colour: str
    shape: str
    cell: int  # 0..8, row-major over the 3x3 grid
    size: float = 0.6  # fraction of the cell's width; not part of the prompt

    def key(self) -> tuple[str, str, int]:
        return (self.colour, self.shape, self.cell)


@dataclass(frozen=True)
class Prompt:
    """What a prompt fixes: the objects (sorted by cell) and the background kind (None: any)."""

    objects: tuple[tuple[str, str, int], ...]
    background: str | None = None


@dataclass(frozen=True)
class Scene:
    objects: tuple[Obj, ...]
    background: str
    bg_colours: tuple[tuple[int, int, int], ...]  # flat, noise, waves: 1 colour; gradient: top, bottom; clouds: 2 tints
    texture_seed: int = 0
    extra: dict = field(default_factory=dict, compare=False)

    def prompt(self, with_background: bool = True) -> Prompt:
        return Prompt(tuple(sorted((o.key() for o in self.objects), key=lambda k: k[2])),
                      self.background if with_background else None)


def _dark_colour(rng: np.random.Generator, low: int, high: int) -> tuple[int, int, int]:
    """A dark, unsaturated colour: a grey level with a small tint."""
    v = rng.integers(low, high + 1)
    tint = rng.integers(-8, 9, size=3)
    return tuple(int(c) for c in np.clip(v + tint, 0, 255))


def _background_colours(kind: str, rng: np.random.Generator) -> tuple[tuple[int, int, int], ...]:
    if kind == "flat":
        return (_dark_colour(rng, 15, 70),)
    if kind == "gradient":
        top, bottom = _dark_colour(rng, 10, 40), _dark_colour(rng, 50, 85)
        return (top, bottom) if rng.random() < 0.5 else (bottom, top)
    if kind == "clouds":
        return (_dark_colour(rng, 25, 50), _dark_colour(rng, 45, 70))
    return (_dark_colour(rng, 30, 60),)


def sample_scene(rng: np.random.Generator, num_objects: int | None = None, background: str | None = None) -> Scene:
    """A random scene: 1-3 objects in distinct cells, each colour, shape and size uniform; a background kind."""
    n = int(rng.integers(1, MAX_OBJECTS + 1)) if num_objects is None else int(num_objects)
    if not 1 <= n <= MAX_OBJECTS:
        raise ValueError(f"num_objects must be in 1..{MAX_OBJECTS}, got {num_objects}")
    cells = sorted(int(c) for c in rng.choice(9, size=n, replace=False))
    colours = list(COLOURS)
    objs = tuple(Obj(colours[int(rng.integers(8))], SHAPES[int(rng.integers(3))], c,
                     float(rng.uniform(*SIZE_RANGE))) for c in cells)
    kind = BACKGROUNDS[int(rng.integers(len(BACKGROUNDS)))] if background is None else background
    return Scene(objs, kind, _background_colours(kind, rng), int(rng.integers(2**31)))


def scene_for(prompt: Prompt, rng: np.random.Generator) -> Scene:
    """A scene with exactly the prompt's objects (random sizes) and background (random when the prompt has none)."""
    objs = tuple(Obj(c, s, cell, float(rng.uniform(*SIZE_RANGE))) for c, s, cell in prompt.objects)
    kind = prompt.background or BACKGROUNDS[int(rng.integers(len(BACKGROUNDS)))]
    return Scene(objs, kind, _background_colours(kind, rng), int(rng.integers(2**31)))


def shape_mask(shape: str, size_px: float, cy: float, cx: float, canvas: int = CANVAS) -> np.ndarray:
    """bool [canvas, canvas]: the pixels whose centres fall inside the shape (diameter or side ``size_px``)."""
    y, x = np.mgrid[0:canvas, 0:canvas] + 0.5
    r = size_px / 2
    if shape == "circle":
        return (y - cy) ** 2 + (x - cx) ** 2 <= r * r
    if shape == "square":
        return (np.abs(y - cy) <= r) & (np.abs(x - cx) <= r)
    if shape == "triangle":  # equilateral, apex up, its bounding box centred on (cy, cx)
        h = size_px * math.sqrt(3) / 2
        top, bottom = cy - h / 2, cy + h / 2
        half = (y - top) / h * r  # half-width at height y
        return (y >= top) & (y <= bottom) & (np.abs(x - cx) <= half)
    raise ValueError(f"shape must be one of {SHAPES}, got {shape!r}")


def _value_noise(rng: np.random.Generator, period: float) -> np.ndarray:
    """[CANVAS, CANVAS] smooth noise of unit scale: random values on a lattice of spacing ``period`` px (randomly
    offset, so it does not line up with the token grid), interpolated with smoothstep weights."""
    n = int(math.ceil(CANVAS / period)) + 2
    lattice = rng.uniform(-1.0, 1.0, size=(n, n))
    off = rng.uniform(0.0, period, size=2)
    coords = [(np.arange(CANVAS) + 0.5 + o) / period for o in off]
    (i0, f0), (i1, f1) = ((np.floor(c).astype(int), c - np.floor(c)) for c in coords)
    wy, wx = (f * f * (3.0 - 2.0 * f) for f in (f0, f1))
    top = lattice[i0][:, i1] * (1 - wx) + lattice[i0][:, i1 + 1] * wx
    bottom = lattice[i0 + 1][:, i1] * (1 - wx) + lattice[i0 + 1][:, i1 + 1] * wx
    return top * (1 - wy)[:, None] + bottom * wy[:, None]


def _fine_noise(rng: np.random.Generator, sigma: float) -> np.ndarray:
    """[CANVAS, CANVAS, 3]: grey pixel noise plus a small per-channel tint, i.i.d. per pixel."""
    return rng.normal(0.0, sigma, size=(CANVAS, CANVAS, 1)) + rng.normal(0.0, 2.0, size=(CANVAS, CANVAS, 3))


def _clouds(scene: Scene, rng: np.random.Generator) -> np.ndarray:
    field = sum(a * _value_noise(rng, period) for period, a in CLOUD_OCTAVES)
    a, b = (np.array(c, np.float64) for c in scene.bg_colours)
    mix = np.clip(0.5 + _value_noise(rng, CLOUD_OCTAVES[0][0]), 0.0, 1.0)[:, :, None]
    return a + (b - a) * mix + field[:, :, None] + _fine_noise(rng, CLOUD_FINE_SIGMA)


def _waves(scene: Scene, rng: np.random.Generator) -> np.ndarray:
    y, x = np.mgrid[0:CANVAS, 0:CANVAS] + 0.5
    period = rng.uniform(*WAVE_PERIOD)
    angle = rng.uniform(0.0, math.pi)
    phase = 2 * math.pi * (x * math.cos(angle) + y * math.sin(angle)) / period + rng.uniform(0.0, 2 * math.pi)
    phase = phase + WAVE_WARP * _value_noise(rng, WAVE_WARP_PERIOD)
    grey = rng.uniform(*WAVE_AMPLITUDE) * np.sin(phase)
    return np.array(scene.bg_colours[0], np.float64) + grey[:, :, None] + _fine_noise(rng, WAVE_FINE_SIGMA)


def _within_bounds(img: np.ndarray) -> np.ndarray:
    """Pull each pixel's channels towards their mean so they spread by at most BG_SPREAD, then clip to BG_MAX."""
    mean = img.mean(-1, keepdims=True)
    spread = img.max(-1, keepdims=True) - img.min(-1, keepdims=True)
    img = mean + (img - mean) * np.minimum(1.0, BG_SPREAD / np.maximum(spread, 1e-9))
    return np.clip(img, 0.0, BG_MAX)


def _background(scene: Scene) -> np.ndarray:
    shape = (CANVAS, CANVAS, 3)
    if scene.background == "flat":
        return np.broadcast_to(np.array(scene.bg_colours[0], np.float64), shape).copy()
    if scene.background == "gradient":
        t = (np.arange(CANVAS) + 0.5)[:, None, None] / CANVAS
        top, bottom = (np.array(c, np.float64) for c in scene.bg_colours)
        return np.broadcast_to(top + (bottom - top) * t, shape).copy()
    rng = np.random.default_rng(scene.texture_seed)
    if scene.background == "clouds":
        return _within_bounds(_clouds(scene, rng))
    if scene.background == "waves":
        return _within_bounds(_waves(scene, rng))
    grey = rng.normal(0.0, 14.0, size=(CANVAS, CANVAS, 1))
    tint = rng.normal(0.0, 3.0, size=shape)
    return np.array(scene.bg_colours[0], np.float64) + grey + tint


def render(scene: Scene) -> np.ndarray:
    """uint8 [CANVAS, CANVAS, 3]: the background, then each object filled with its colour."""
    img = _background(scene)
    for o in scene.objects:
        row, col = divmod(o.cell, 3)
        mask = shape_mask(o.shape, o.size * CELL, (row + 0.5) * CELL, (col + 0.5) * CELL)
        img[mask] = COLOURS[o.colour]
    return np.clip(np.rint(img), 0, 255).astype(np.uint8)


_OBJECT = re.compile(r"^\s*(\S+)\s+(\S+)\s+(\S+)\s*$")
_ON = re.compile(r"^\s*on\s+(\S+)\s*$")


def parse_prompt(text: str) -> Prompt:
    """``"red circle top-left; blue square center; on noise"`` -> Prompt; ValueError (one line) outside the grammar."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError("a scenes prompt is 'COLOUR SHAPE CELL' objects separated by ';', e.g. "
                         "'red circle top-left; blue square center; on noise'")
    objects, background = [], None
    for part in text.lower().split(";"):
        if not part.strip():
            continue
        on = _ON.match(part)
        if on:
            if background is not None:
                raise ValueError(f"prompt {quote(text)}: the background is given twice")
            if on.group(1) not in BACKGROUNDS:
                raise ValueError(f"prompt {quote(text)}: background {quote(on.group(1))} is not one of "
                                 f"{', '.join(BACKGROUNDS)}")
            background = on.group(1)
            continue
        m = _OBJECT.match(part)
        if not m:
            which = "it" if part.strip() == text.strip().lower() else quote(part.strip())
            raise ValueError(f"prompt {quote(text)}: {which} is not 'COLOUR SHAPE CELL' or 'on BACKGROUND'")
        colour, shape, cell = m.groups()
        for value, allowed, what in ((colour, COLOURS, "colour"), (shape, SHAPES, "shape"), (cell, CELLS, "cell")):
            if value not in allowed:
                raise ValueError(f"prompt {quote(text)}: {what} {quote(value)} is not one of {', '.join(allowed)}")
        objects.append((colour, shape, CELLS.index(cell)))
    if not 1 <= len(objects) <= MAX_OBJECTS:
        raise ValueError(f"prompt {quote(text)}: a scene has 1 to {MAX_OBJECTS} objects, got {len(objects)}")
    cells = [o[2] for o in objects]
    if len(set(cells)) != len(cells):
        raise ValueError(f"prompt {quote(text)}: one object per cell")
    return Prompt(tuple(sorted(objects, key=lambda o: o[2])), background)


def format_prompt(prompt: Prompt) -> str:
    text = "; ".join(f"{c} {s} {CELLS[cell]}" for c, s, cell in prompt.objects)
    return text + (f"; on {prompt.background}" if prompt.background else "")


def random_prompts(n: int, seed: int, with_background: bool = True,
                   backgrounds: tuple[str, ...] | None = None) -> list[str]:
    """``n`` prompt texts of a fixed mix (1-3 objects uniformly, every attribute uniform), deterministic in ``seed``;
    ``backgrounds``: the kinds to cycle through in turn (default: each drawn uniformly from BACKGROUNDS)."""
    for kind in backgrounds or ():
        if kind not in BACKGROUNDS:
            raise ValueError(f"background {kind!r} is not one of {', '.join(BACKGROUNDS)}")
    rng = np.random.default_rng(seed)
    return [format_prompt(sample_scene(rng, background=backgrounds[i % len(backgrounds)] if backgrounds else None)
                          .prompt(with_background)) for i in range(n)]
