"""The scenes test-bed: the world, the adherence checker, the tokenizer round trip, the prompt grammar, the model."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from csd_kernels.zoo.scenes import checker, world
from csd_kernels.zoo.scenes.model import (
    EMPTY_TOKEN_ID,
    NULL_TOKEN_ID,
    NUM_CODES,
    PROMPT_LEN,
    load_tokenizer,
    object_cells,
    prompt_ids,
)
from csd_kernels.zoo.scenes.tokenizer import TOKENS_PER_IMAGE

torch.set_num_threads(1)


def scenes(n: int, seed: int) -> list[world.Scene]:
    rng = np.random.default_rng(seed)
    return [world.sample_scene(rng) for _ in range(n)]


# ----------------------------------------------------------------------------- the world
def test_render_is_deterministic_from_the_seed():
    a = [world.render(s) for s in scenes(20, seed=3)]
    b = [world.render(s) for s in scenes(20, seed=3)]
    c = [world.render(s) for s in scenes(20, seed=4)]
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c))
    assert a[0].shape == (96, 96, 3) and a[0].dtype == np.uint8


def test_scene_mix_covers_the_world():
    s = scenes(600, seed=0)
    counts = np.bincount([len(x.objects) for x in s], minlength=4)[1:]
    assert counts.min() > 150  # 1, 2 and 3 objects uniformly (200 each expected)
    objs = [o for x in s for o in x.objects]
    assert {o.colour for o in objs} == set(world.COLOURS) and {o.shape for o in objs} == set(world.SHAPES)
    assert {o.cell for o in objs} == set(range(9)) and {x.background for x in s} == set(world.BACKGROUNDS)
    assert all(len({o.cell for o in x.objects}) == len(x.objects) for x in s)  # one object per cell
    sizes = np.array([o.size for o in objs])
    assert world.SIZE_RANGE[0] <= sizes.min() and sizes.max() <= world.SIZE_RANGE[1]


def test_objects_stay_inside_their_cells():
    for s in scenes(100, seed=1):
        for o in s.objects:
            row, col = divmod(o.cell, 3)
            mask = world.shape_mask(o.shape, o.size * world.CELL, (row + 0.5) * world.CELL, (col + 0.5) * world.CELL)
            ys, xs = np.nonzero(mask)
            assert ys.min() >= row * world.CELL and ys.max() < (row + 1) * world.CELL
            assert xs.min() >= col * world.CELL and xs.max() < (col + 1) * world.CELL


def test_backgrounds_are_dark_and_unsaturated():
    for s in scenes(100, seed=2):
        bg = world.render(dataclasses.replace(s, objects=())).astype(float)
        assert bg.mean() < 90 and np.abs(bg - bg.mean(-1, keepdims=True)).mean() < 10
        if s.background in world.TEXTURES:
            assert bg.max() <= world.BG_MAX and (bg.max(-1) - bg.min(-1)).max() <= world.BG_SPREAD + 1  # + rounding


def _patch_means(kind: str, n: int = 12) -> np.ndarray:
    rng = np.random.default_rng(17)
    scenes = [dataclasses.replace(world.sample_scene(rng, background=kind), objects=()) for _ in range(n)]
    grey = [world.render(scene).astype(float).mean(-1) for scene in scenes]
    return np.stack(grey).reshape(n, 24, 4, 24, 4).mean((2, 4))  # [n, 24, 24]: one value per token's patch


@pytest.mark.parametrize("kind", ["noise", *world.TEXTURES])
def test_texture_patches_depend_on_their_neighbours_and_noise_patches_do_not(kind):
    # The point of clouds and waves: a token's patch is predictable from the patches before it (as in real images),
    # while the noise background is i.i.d. per pixel. R^2 of a least-squares prediction of each 4x4-patch mean from
    # its two left and two upper neighbours and the upper-left one, pooled over images (each centred).
    m = _patch_means(kind)
    m = m - m.mean((1, 2), keepdims=True)
    y = m[:, 2:, 2:].ravel()
    x = np.stack([m[:, 2:, 1:-1], m[:, 2:, :-2], m[:, 1:-1, 2:], m[:, :-2, 2:], m[:, 1:-1, 1:-1]], -1).reshape(-1, 5)
    coef = np.linalg.lstsq(x, y, rcond=None)[0]
    r2 = 1 - (y - x @ coef).var() / y.var()
    assert (r2 > 0.25) if kind in world.TEXTURES else (r2 < 0.05), r2  # clouds 0.86, waves 0.34, noise 0.001


def test_textures_are_random_per_image_and_fixed_by_the_seed():
    rng = np.random.default_rng(5)
    for kind in world.TEXTURES:
        a, b = (world.sample_scene(rng, background=kind) for _ in range(2))
        assert np.array_equal(world.render(a), world.render(dataclasses.replace(a)))
        assert np.abs(world.render(a).astype(int) - world.render(dataclasses.replace(b, objects=a.objects))).mean() > 5


# ----------------------------------------------------------------------------- the prompt grammar
def test_prompt_round_trip_and_cell_order():
    p = world.parse_prompt("blue square center; Red circle top-left ; on noise")
    assert p.objects == (("red", "circle", 0), ("blue", "square", 4)) and p.background == "noise"
    assert world.parse_prompt(world.format_prompt(p)) == p
    assert world.parse_prompt("white triangle bottom-right").background is None


@pytest.mark.parametrize("text, message", [
    ("", "COLOUR SHAPE CELL"),
    ("purple circle top", "colour 'purple' is not one of"),
    ("red hexagon top", "shape 'hexagon' is not one of"),
    ("red circle middle", "cell 'middle' is not one of"),
    ("red circle top; blue square top", "one object per cell"),
    ("red circle top; on grass", "background 'grass' is not one of"),
    ("red circle top; on flat; on noise", "background is given twice"),
    ("on flat", "1 to 3 objects"),
    ("a b c; d e f; g h i; j k l", "colour 'a'"),
    ("red circle top; blue circle left; green circle right; white circle center", "1 to 3 objects"),
    ("red circle", "is not 'COLOUR SHAPE CELL'"),
])
def test_prompt_errors_name_the_fault(text, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")) as e:
        world.parse_prompt(text)
    assert "\n" not in str(e.value)


def test_prompt_tokens_put_each_object_at_its_cell():
    ids = prompt_ids(["red circle top-left; blue square center; on noise", "white triangle bottom-right"])
    assert ids.shape == (2, PROMPT_LEN)
    assert (ids >= NUM_CODES).all() and (ids != NULL_TOKEN_ID).all()
    cells = ids[:, 1:] != EMPTY_TOKEN_ID
    assert cells[0].nonzero().flatten().tolist() == [0, 4] and cells[1].nonzero().flatten().tolist() == [8]
    assert torch.equal(object_cells(ids), cells)
    assert len({int(ids[0, 1]), int(ids[0, 5]), int(ids[1, 9])}) == 3  # three different objects, three tokens
    assert ids[0, 0] != ids[1, 0]  # 'noise' vs no background
    assert not object_cells(torch.full((1, PROMPT_LEN), NULL_TOKEN_ID)).any()
    with pytest.raises(ValueError, match="colour 'pink'"):
        prompt_ids(["pink circle top"])


def test_every_object_has_its_own_token():
    tokens = {prompt_ids([f"{c} {s} center"])[0, 5].item() for c in world.COLOURS for s in world.SHAPES}
    assert len(tokens) == len(world.COLOURS) * len(world.SHAPES)
    assert all(NUM_CODES < t < EMPTY_TOKEN_ID for t in tokens)


# ----------------------------------------------------------------------------- the checker
def test_checker_reads_every_rendered_scene_exactly():
    for s in scenes(150, seed=11):
        found = checker.read_scene(world.render(s))
        assert sorted(f.key() for f in found) == sorted(o.key() for o in s.objects), s
        assert checker.adheres(world.render(s), s.prompt())
    assert checker.adherence([world.render(s) for s in scenes(50, 12)], [s.prompt() for s in scenes(50, 12)]) == 1.0


def test_checker_reads_the_background_kind():
    s = scenes(150, seed=13)
    right = np.mean([checker.background_kind(world.render(x)) == x.background for x in s])
    assert right >= 0.98  # a gradient of nearly equal end colours reads as flat


def _planted(s: world.Scene, how: str, rng: np.random.Generator) -> world.Scene:
    objs = list(s.objects)
    free = [c for c in range(9) if c not in {o.cell for o in objs}]
    if how == "colour":
        other = [c for c in world.COLOURS if c != objs[0].colour]
        objs[0] = dataclasses.replace(objs[0], colour=other[int(rng.integers(len(other)))])
    elif how == "shape":
        other = [c for c in world.SHAPES if c != objs[0].shape]
        objs[0] = dataclasses.replace(objs[0], shape=other[int(rng.integers(len(other)))])
    elif how == "moved":
        objs[0] = dataclasses.replace(objs[0], cell=free[int(rng.integers(len(free)))])
    elif how == "missing":
        objs = objs[1:]
    elif how == "extra":
        objs.append(world.Obj("white", "circle", free[0], 0.6))
    elif how == "swapped":  # two objects trade colours
        a, b = objs[0], objs[1]
        objs[0], objs[1] = dataclasses.replace(a, colour=b.colour), dataclasses.replace(b, colour=a.colour)
    return dataclasses.replace(s, objects=tuple(objs))


@pytest.mark.parametrize("how", ["colour", "shape", "moved", "missing", "extra", "swapped"])
def test_checker_rejects_planted_wrong_images(how):
    rng = np.random.default_rng(5)
    cases = [s for s in scenes(200, seed=17) if len(s.objects) >= 2 and
             (how != "swapped" or s.objects[0].colour != s.objects[1].colour)][:30]
    for s in cases:
        wrong = world.render(_planted(s, how, rng))
        assert not checker.adheres(wrong, s.prompt()), (how, s)


def test_checker_refuses_a_wrong_image_shape():
    with pytest.raises(ValueError, match=r"\[96, 96, 3\]"):
        checker.read_scene(np.zeros((32, 32, 3), np.uint8))


def test_frechet_separates_scenes_from_other_scenes():
    prompts = [s.prompt() for s in scenes(120, seed=21)]
    a = checker.features(checker.rendered_like(prompts, seed=1))
    b = checker.features(checker.rendered_like(prompts, seed=2))
    flat = [world.render(dataclasses.replace(s, background="flat", bg_colours=((40, 40, 40),)))
            for s in scenes(120, seed=21)]
    same, other = checker.frechet_distance(a, b), checker.frechet_distance(a, checker.features(flat))
    assert same < 0.5 * other


def test_scene_quality_states_the_noise_of_each_measure():
    """Each measure's standard error over the images: a share's from its 0/1 values (two of four images adhere: 0.5
    ± sqrt(1/3)/2), the Fréchet distance's by a bootstrap over the images (zero for identical images)."""
    prompts = [s.prompt() for s in scenes(4, seed=5)]
    images = checker.rendered_like(prompts, seed=1)
    wrong = [prompts[0], prompts[1], prompts[3], prompts[2]]  # the last two images under each other's prompts
    quality = checker.scene_quality(images, wrong)
    assert quality["adherence"] == 0.5 and quality["adherence_se"] == pytest.approx(np.sqrt(1 / 3) / 2)
    assert quality["frechet_se"] > 0
    same = checker.scene_quality([images[0]] * 4, [prompts[0]] * 4)
    assert same["adherence_se"] == 0.0 and same["frechet_se"] == pytest.approx(0.0, abs=1e-9)


# ----------------------------------------------------------------------------- the tokenizer
@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer()


def test_tokenizer_round_trip_keeps_adherence(tokenizer):
    s = scenes(200, seed=31)
    images = np.stack([world.render(x) for x in s])
    codes = tokenizer.encode(images)
    assert codes.shape == (200, TOKENS_PER_IMAGE) and tokenizer.num_codes == NUM_CODES >= 4096
    back = tokenizer.decode(codes).numpy()
    assert checker.adherence(back, [x.prompt() for x in s]) >= 0.97
    assert np.mean([checker.background_kind(b) == x.background for b, x in zip(back, s)]) >= 0.95


def test_tokenizer_spreads_noise_and_not_flat_backgrounds(tokenizer):
    rng = np.random.default_rng(41)
    noise = world.render(world.sample_scene(rng, background="noise"))
    flat = world.render(world.sample_scene(rng, background="flat"))
    # the texture spreads over hundreds of codes (the entropy of real low-detail regions), a flat colour over a few
    assert tokenizer.encode(noise[None]).unique().numel() > 150
    assert tokenizer.encode(flat[None]).unique().numel() < 40


def test_tokenizer_refuses_bad_input(tokenizer):
    with pytest.raises(ValueError, match="images must be"):
        tokenizer.encode(np.zeros((1, 64, 64, 3), np.uint8))
    with pytest.raises(ValueError, match="codes in 0..4095"):
        tokenizer.decode(torch.full((1, TOKENS_PER_IMAGE), 4096))


# ----------------------------------------------------------------------------- the shipped model
@pytest.fixture(scope="module")
def entry():
    from csd_kernels import zoo

    return zoo.load("scenes")


PROMPTS = ["red circle top-left; blue square center; on noise", "yellow triangle bottom-right; on flat"]


@pytest.mark.parametrize("mode", ["ar", "jd", "sjd", "gsd", "csd"])
def test_the_shipped_model_generates_576_tokens_in_every_mode(entry, mode):
    from csd_kernels import generate

    out = generate(entry.model, **entry.prompt_inputs(PROMPTS[:1]), mode=mode, seed=0, **entry.defaults)
    assert out.tokens.shape == (1, TOKENS_PER_IMAGE) and int(out.tokens.max()) < NUM_CODES
    assert out.forward_passes <= TOKENS_PER_IMAGE
    assert entry.model.decode(out.tokens).shape == (1, 96, 96, 3)


def test_the_static_loop_runs_a_wide_window_past_the_learned_positions(entry):
    """The static loop feeds W slots from each row's n, past the image's last token near the end: prompt 10 + 576 +
    W 64 > the 640 learned positions. It completes, with the eager loop's tokens and passes (B = 1)."""
    from csd_kernels import generate

    kw = dict(**entry.prompt_inputs(PROMPTS[:1]), mode="sjd", window=64, seed=0, **entry.defaults)
    eager, static = generate(entry.model, **kw), generate(entry.model, static=True, **kw)
    assert torch.equal(static.tokens, eager.tokens) and static.forward_passes == eager.forward_passes


def test_greedy_csd_equals_greedy_ar_on_scenes(entry):
    from csd_kernels import generate

    kw = dict(**entry.prompt_inputs(PROMPTS), seed=0, temperature=0, cfg_scale=entry.defaults["cfg_scale"])
    ar, csd = generate(entry.model, mode="ar", **kw), generate(entry.model, mode="csd", **kw)
    assert torch.equal(ar.tokens, csd.tokens)
    assert csd.forward_passes < ar.forward_passes


LAW_ROWS = 2000


def _first_tokens(entry, mode, seed, **kw) -> torch.Tensor:
    """[LAW_ROWS, 3]: the first three tokens (top-k 8 each) of a noise-background prompt, one row per seed."""
    from csd_kernels import generate
    from csd_kernels.models import ImageGPT
    from csd_kernels.zoo.scenes.model import NULL_TOKEN_ID as null

    corner = ImageGPT(entry.model.lm, image_token_range=(0, NUM_CODES), grid=(1, 3), null_token_id=null)
    ids = prompt_ids(["white circle center; on noise"]).expand(LAW_ROWS, -1)
    return generate(corner, ids, mode=mode, window=3, top_k=8, seed=torch.arange(LAW_ROWS) + seed, **kw).tokens


def _joint(a: torch.Tensor, b: torch.Tensor):
    """The two samples' outcomes as indices: per position the rank of the code among those either sample shows
    (top-k 8 keeps ties, so a position may show a ninth), then the joint index; with the positions' sizes."""
    ranks, sizes = [], []
    for j in range(3):
        seen = torch.cat([a[:, j], b[:, j]]).unique()
        ranks.append((torch.searchsorted(seen, a[:, j]).numpy(), torch.searchsorted(seen, b[:, j]).numpy()))
        sizes.append(len(seen))
    joint = [(r0 * sizes[1] + r1) * sizes[2] + r2 for r0, r1, r2 in zip(*ranks)]
    return joint, ranks, sizes


def test_sjd_law_equals_ar_law_on_scenes(entry):
    """Two-sample chi-square on the joint law of the first three tokens and on each one's marginal (the test of
    tests/test_decoding.py, whose lossy controls show it catching real losses). Power: with 2000 rows a TVD of 0.05
    moved between two cells of probability 1/8 has noncentrality 40 on 7 df (power 0.97 at alpha 1e-3)."""
    from test_decoding import _two_sample_p

    ar = _first_tokens(entry, "ar", seed=10**6)
    (x, y), ranks, sizes = _joint(ar, _first_tokens(entry, "sjd", seed=0, coupling="maximal"))
    p = min(_two_sample_p(x, y, int(np.prod(sizes))), *(_two_sample_p(*r, n) for r, n in zip(ranks, sizes)))
    assert p > 1e-3


@pytest.mark.parametrize("count", [3, 8, 10])
def test_the_sample_grid_keeps_every_image_and_pads_the_last_row(count, tmp_path):
    from PIL import Image

    from csd_kernels.zoo.scenes.evaluate import save_grid

    images = np.stack([np.full((4, 5, 3), 10 + i, np.uint8) for i in range(count)])
    save_grid(images, tmp_path / "grid.png")
    grid = np.asarray(Image.open(tmp_path / "grid.png"))
    columns = min(8, count)
    assert grid.shape == (4 * -(-count // columns), 5 * columns, 3)
    tiles = [grid[r * 4:(r + 1) * 4, c * 5:(c + 1) * 5] for r in range(grid.shape[0] // 4) for c in range(columns)]
    assert [int(tile[0, 0, 0]) for tile in tiles] == [10 + i for i in range(count)] + [0] * (len(tiles) - count)
