"""Fresh drafts from the grid row above (generate(draft_init="above" / "above-p"), decoding/step.py's from_above):
which slot gets which draft and q, the store of p one row back, and the loop's law, which must stay AR's (CPU, tiny
random-config models built here; no downloads)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import build_tiny_llama
from scipy.stats import chi2_contingency

from csd_kernels.decoding import COUPLINGS, generate
from csd_kernels.decoding.state import State
from csd_kernels.decoding.step import Settings, draft, draft_probs, keep_p_rows, window
from csd_kernels.models import ImageGPT

pytestmark = pytest.mark.usefixtures("one_thread")


# ----------------------------------------------------------------------------------------------------------------------
# the drafts of one window, by hand
# ----------------------------------------------------------------------------------------------------------------------
WIDTH, VOCAB = 3, 7


def _one_row(draft_init: str) -> tuple:
    """One row on a grid 3 wide: n = 4 committed tokens (seq k at k), window [4, 11) of 7 slots; the slots at 4 and 5
    hold drafts sampled last time (tokens 4, 5; q one-hot at 2 and 5). Fresh slots: 6 (committed above: 3), 7, 8,
    9 (above: the window's own 4, 5, 6); 10 is the last slot (no draft). p_rows is one-hot at token 6 - column."""
    run = Settings(mode="sjd", window=7, total=12, width=WIDTH, vocab=VOCAB, draft_init=draft_init,
                   coupling="maximal", backend=None, seeds=torch.tensor([3]), need_q=True, sampling={},
                   rule={})
    state = State(**State.tensors(1, 12, 7, VOCAB, True, "cpu", run.p_columns))
    state.seq[0, :4] = torch.tensor([0, 1, 2, 3])
    state.seq[0, 4:6] = torch.tensor([4, 5])
    state.n[0], state.drafted[0] = 4, 6  # grid positions 4 and 5 hold sampled drafts
    if state.p_rows is not None:
        state.p_rows[0] = torch.nn.functional.one_hot(torch.tensor([6, 5, 4]), VOCAB).float()
    win = window(state, state.n.clone(), 7, torch.tensor([True]), run)
    stored = torch.full((1, 7, VOCAB), 1.0 / VOCAB)
    stored[0, :2] = torch.nn.functional.one_hot(torch.tensor([2, 5]), VOCAB).float()
    return state, win, run, stored


def test_the_window_s_slots_are_what_the_example_says():
    _, win, _, _ = _one_row("uniform")
    assert win.sampled[0].tolist() == [True, True, False, False, False, False, False]
    assert win.fresh[0].tolist() == [False, False, True, True, True, True, False]


def test_the_token_above_down_the_window():
    """"above": a fresh slot takes the committed token above, or the draft above in the window (sampled or itself
    from above), row by row; q one-hot at it."""
    state, win, run, stored = _one_row("above")
    drafted = draft(state, win, run, stored)
    assert drafted.tokens[0, :6].tolist() == [4, 5, 3, 4, 5, 3]  # 6 <- 3 (committed), 7 <- 4, 8 <- 5, 9 <- 6 <- 3
    assert drafted.above[0].tolist() == [False, False, True, True, True, True, False]
    q = draft_probs(win, drafted, run, stored)
    assert torch.equal(q[0, 2:6].argmax(-1), torch.tensor([3, 4, 5, 3])) and torch.equal(q[0, 2:6].max(-1)[0],
                                                                                       torch.ones(4))


def test_a_draw_from_p_above_down_the_window():
    """"above-p": q of a fresh slot is p_rows at its column (committed above) or the q of the draft above; the token
    a draw from it (one-hot here, so the draw is known)."""
    state, win, run, stored = _one_row("above-p")
    drafted = draft(state, win, run, stored)
    q = draft_probs(win, drafted, run, stored)
    # 6 is column 0 (p_rows: 6); 7 <- q at 4 (2); 8 <- q at 5 (5); 9 <- q at 6 (6)
    assert torch.equal(q[0, 2:6].argmax(-1), torch.tensor([6, 2, 5, 6]))
    assert drafted.tokens[0, 2:6].tolist() == [6, 2, 5, 6]
    assert torch.equal(q[0, :2], stored[0, :2])  # sampled slots keep their q


def test_a_fresh_slot_below_a_uniform_draft_stays_uniform():
    """A slot whose slot above holds a uniform fresh draft (the grid's first row here) is not 'from above'."""
    run = Settings(mode="sjd", window=6, total=12, width=WIDTH, vocab=VOCAB, draft_init="above", coupling="maximal",
                   backend=None, seeds=torch.tensor([3]), need_q=True, sampling={}, rule={})
    state = State(**State.tensors(1, 12, 6, VOCAB, True, "cpu"))
    win = window(state, state.n.clone(), 6, torch.tensor([True]), run)
    drafted = draft(state, win, run, None)
    assert not drafted.above.any()
    assert torch.equal(draft_probs(win, drafted, run, None)[0, :5], torch.full((5, VOCAB), 1.0 / VOCAB))


def test_p_rows_keeps_each_column_s_last_committed_p():
    """A window committing 7 tokens from n = 2 on a grid 3 wide writes columns 2, 0, 1 twice: the later one stays;
    positions not committed (>= new_n) and a row that committed nothing leave p_rows alone."""
    run = Settings(mode="sjd", window=9, total=30, width=WIDTH, vocab=VOCAB, draft_init="above-p",
                   coupling="maximal", backend=None, seeds=torch.tensor([3, 4]), need_q=True, sampling={}, rule={})
    state = State(**State.tensors(2, 30, 9, VOCAB, True, "cpu", run.p_columns))
    state.n[:] = 2
    state.p_rows.fill_(-1.0)
    win = window(state, state.n.clone(), 9, torch.tensor([True, True]), run)
    probs = torch.arange(9.0)[None, :, None].expand(2, 9, VOCAB).clone()  # slot i holds the value i
    keep_p_rows(state.p_rows, win, state.n, torch.tensor([9, 2]), probs)
    # row 0: positions 2 .. 8 committed (slots 0 .. 6): column c's last is the largest g <= 8 with g % 3 == c
    assert state.p_rows[0, :, 0].tolist() == [4.0, 5.0, 6.0]  # g = 6, 7, 8 -> slots 4, 5, 6
    assert state.p_rows[1, :, 0].tolist() == [-1.0, -1.0, -1.0]


# ----------------------------------------------------------------------------------------------------------------------
# the loops agree, batches too
# ----------------------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def image_gpt(tiny_llama):
    """3 x 4 grid over 16 codes: a window of 6 reaches a row further down."""
    return ImageGPT(tiny_llama, image_token_range=(0, 16), grid=(3, 4), null_token_id=23)


@pytest.mark.parametrize("draft_init", ["above", "above-p"])
def test_greedy_equals_ar(image_gpt, draft_init):
    prompt = torch.tensor([[16], [17]])
    ar = generate(image_gpt, prompt, mode="ar", temperature=0, cfg_scale=2.0)
    for mode in ("sjd", "csd"):
        out = generate(image_gpt, prompt, mode=mode, window=6, temperature=0, cfg_scale=2.0, draft_init=draft_init)
        assert torch.equal(out.tokens, ar.tokens), mode


@pytest.mark.parametrize("mode, coupling", [("sjd", "maximal"), ("csd", "independent"), ("sjd", "gumbel")])
def test_batched_rows_equal_rows_alone_with_p_above(image_gpt, mode, coupling):
    """A row's p store and draws are its own: batched (rows at different n, eager windows past the next row) as
    alone."""
    prompt, seeds = torch.tensor([[16], [17], [18]]), [11, 7, 3]
    kw = dict(mode=mode, coupling=coupling, window=6, cfg_scale=2.0, draft_init="above-p")
    batched = generate(image_gpt, prompt, seed=seeds, **kw)
    for b in range(3):
        alone = generate(image_gpt, prompt[b:b + 1], seed=[seeds[b]], **kw)
        assert torch.equal(batched.tokens[b], alone.tokens[0]), b
        assert [a[b] for a in batched.accepted if a[b] > 0] == [a[0] for a in alone.accepted], b


def test_p_above_changes_the_drafts(image_gpt):
    """The three draft_inits are three different streams of drafts (same seeds: the same law, other passes)."""
    kw = dict(mode="sjd", window=6, cfg_scale=2.0, seed=list(range(32)))
    prompt = torch.tensor([[16]] * 32)
    accepted = [generate(image_gpt, prompt, draft_init=d, **kw).accepted for d in ("uniform", "above", "above-p")]
    assert accepted[0] != accepted[1] != accepted[2] != accepted[0]


# ----------------------------------------------------------------------------------------------------------------------
# lossless: the joint law of sjd's tokens is AR's with drafts from above, eager and static, chain and tree
# ----------------------------------------------------------------------------------------------------------------------
SAMPLES = 30000
CODES, GRID = 4, (3, 2)  # 4^6 = 4096 joint outcomes; a column pair (above, below) has 16


@pytest.fixture(scope="module")
def grid_model():
    """4 image codes (ids 0..3), class token 8, null 9; a 3 x 2 grid: a window of 4 holds two rows below the
    committed one, so drafts come from committed tokens above and from drafts above in the window."""
    return ImageGPT(build_tiny_llama(10, seed=3, init=0.15), image_token_range=(0, CODES), grid=GRID, null_token_id=9)


def _codes(model, seed: int, **kw) -> np.ndarray:
    out = generate(model, torch.full((SAMPLES, 1), 8), cfg_scale=1.5, temperature=1.0,
                   seed=torch.arange(SAMPLES) + seed, **kw)
    return (out.tokens * (CODES ** torch.arange(out.tokens.shape[1]))).sum(1).numpy()


@pytest.fixture(scope="module")
def ar_law(grid_model):
    return _codes(grid_model, 10**6, mode="ar")


def _p_value(a: np.ndarray, b: np.ndarray, cells: int) -> float:
    ca, cb = np.bincount(a, minlength=cells), np.bincount(b, minlength=cells)
    small = (ca + cb) < 10
    table = np.stack([np.append(ca[~small], ca[small].sum()), np.append(cb[~small], cb[small].sum())])
    return float(chi2_contingency(table[:, table.sum(0) > 0])[1])


def _same_law_p(a: np.ndarray, b: np.ndarray) -> float:
    """Two-sample χ² on the joint outcome (cells with a pooled count < 10 merged), on every position and on every
    vertical pair (a token and the one above it: what drafts from above could bias). Power: n = 30000 per sample; a
    TVD shift of 0.03 between two cells of probability 0.25 of one position has noncentrality 15000·2·0.03²/0.25 =
    108 on 3 df: power > 0.999 at α = 1e-3."""
    tokens = GRID[0] * GRID[1]
    digit = [lambda x, k=k: (x // CODES**k) % CODES for k in range(tokens)]
    p = [_p_value(a, b, CODES**tokens)] + [_p_value(d(a), d(b), CODES) for d in digit]
    p += [_p_value(digit[k](a) * CODES + digit[k + GRID[1]](a), digit[k](b) * CODES + digit[k + GRID[1]](b), CODES**2)
          for k in range(tokens - GRID[1])]
    return min(p)


@pytest.mark.parametrize("draft_init", ["above", "above-p"])
@pytest.mark.parametrize("coupling", COUPLINGS)
@pytest.mark.parametrize("static", [False, True])
def test_sjd_is_lossless_with_drafts_from_above(grid_model, ar_law, coupling, draft_init, static):
    codes = _codes(grid_model, 0, mode="sjd", coupling=coupling, window=4, static=static, draft_init=draft_init)
    assert _same_law_p(ar_law, codes) > 1e-3


@pytest.mark.parametrize("tree, window", [((2, 2), 4), ((3, 2), 6)])
def test_sjd_tree_is_lossless_with_p_above(grid_model, ar_law, tree, window):
    codes = _codes(grid_model, 0, mode="sjd", window=window, static=True, tree=tree, draft_init="above-p")
    assert _same_law_p(ar_law, codes) > 1e-3


def test_csd_with_the_gate_shut_is_lossless_with_p_above(grid_model, ar_law):
    """λ = 0: csd's test is the strict one whatever q is, so informed drafts keep it exact."""
    codes = _codes(grid_model, 0, mode="csd", entropy_coef=0.0, window=4, draft_init="above-p")
    assert _same_law_p(ar_law, codes) > 1e-3


def test_the_law_test_catches_a_draft_not_drawn_from_its_q(grid_model, ar_law, monkeypatch):
    """Power on this model: q = p above but the token the one above (not a draw from q) is caught."""
    import csd_kernels.decoding.step as step

    monkeypatch.setattr(step, "inverse_cdf_sample", lambda q, u: q.argmax(-1))
    codes = _codes(grid_model, 0, mode="sjd", coupling="maximal", window=4, draft_init="above-p")
    assert _same_law_p(ar_law, codes) < 1e-6


@pytest.mark.parametrize("static", [False, True])
def test_lumina_sjd_is_lossless_with_p_above(tiny_chameleon, static):
    """A family with a forced row end after every grid row (tests/conftest.py's tiny Chameleon, 4 image codes on a
    2 x 2 grid): the loop's columns are the grid's, so the position above is the grid token one row up whatever
    the row ends; the law stays AR's (the same χ² on the 256 joint outcomes, each position and each column pair)."""
    from csd_kernels.models import LuminaMGPT

    adapter = LuminaMGPT(tiny_chameleon, grid=(2, 2), image_token_range=(8, 12), row_end_token_id=41,
                         image_start_token_id=42, image_end_token_id=43, size_token_offset=44)
    prompt = torch.tensor([[1, 5, 6]]).expand(SAMPLES, -1)

    def codes(seed: int, **kw) -> np.ndarray:
        out = generate(adapter, prompt, cfg_scale=1.0, temperature=0.7, seed=torch.arange(SAMPLES) + seed, **kw)
        return (out.tokens * (4 ** torch.arange(4))).sum(1).numpy()

    ar, sjd = codes(10**6, mode="ar"), codes(0, mode="sjd", window=4, static=static, draft_init="above-p")
    digit = [lambda x, k=k: (x // 4**k) % 4 for k in range(4)]
    p = [_p_value(ar, sjd, 256)] + [_p_value(d(ar), d(sjd), 4) for d in digit]
    p += [_p_value(digit[k](ar) * 4 + digit[k + 2](ar), digit[k](sjd) * 4 + digit[k + 2](sjd), 16) for k in range(2)]
    assert min(p) > 1e-3


def test_the_law_test_catches_a_draw_by_the_acceptance_lane(grid_model, ar_law, monkeypatch):
    """Why lane 3: a draw from p above by the step's acceptance uniform (lane 0) correlates the draft with its own
    test, and the law moves (p ~ 1e-75 here); the shipped lane is independent of it."""
    import csd_kernels.decoding.step as step
    from csd_kernels import reference as ref

    monkeypatch.setattr(step, "draft_uniforms", lambda seed, offset, positions, length:
                        ref.step_uniforms(seed, offset, positions, length)[0])
    codes = _codes(grid_model, 0, mode="sjd", coupling="maximal", window=4, draft_init="above-p")
    assert _same_law_p(ar_law, codes) < 1e-6
