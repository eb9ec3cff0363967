"""csd_kernels.generate: the decoding loop (CPU, tiny random-config models built here; no downloads)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import build_tiny_llama
from scipy.stats import chi2_contingency

from csd_kernels.config.modes import exact_distortion
from csd_kernels.decoding import COUPLINGS, MODES, generate
from csd_kernels.models import ImageGPT

# tiny matmuls: thread hand-off costs more than the work on a shared 2-core machine
pytestmark = pytest.mark.usefixtures("one_thread")


PROMPTS = torch.tensor([[16], [17], [18]])  # three different class tokens of tiny_llama


@pytest.fixture(scope="module")
def image_gpt(tiny_llama):
    """4 x 5 grid over 16 codes: rows of different length, windows that straddle grid rows; a codebook [16, 4] for
    the lantern modes."""
    codebook = torch.randn(16, 4, generator=torch.Generator().manual_seed(0))
    return ImageGPT(tiny_llama, image_token_range=(0, 16), grid=(4, 5), null_token_id=23, codebook=codebook)


# ----------------------------------------------------------------------------------------------------------------------
# greedy: every mode is AR
# ----------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("draft_init", ["uniform", "above", "above-p"])
def test_greedy_every_mode_equals_ar(image_gpt, draft_init):
    ar = generate(image_gpt, PROMPTS, mode="ar", temperature=0, cfg_scale=2.0)
    assert ar.forward_passes == 20
    for mode in MODES:
        out = generate(image_gpt, PROMPTS, mode=mode, window=6, temperature=0, cfg_scale=2.0, draft_init=draft_init,
                       seed=5)
        assert torch.equal(out.tokens, ar.tokens), mode
        assert out.forward_passes <= ar.forward_passes


# ----------------------------------------------------------------------------------------------------------------------
# lossless: joint law of the tokens under sjd / jd equals that under ar
# ----------------------------------------------------------------------------------------------------------------------
LOSSLESS_SAMPLES = 30000


def _codes(lm_codes: ImageGPT, mode, seed, **kw):
    """[n] joint outcome index of the 3 tokens (0 .. 511) of LOSSLESS_SAMPLES independent rows (one batch)."""
    prompt = torch.full((LOSSLESS_SAMPLES, 1), 8)
    seeds = torch.arange(LOSSLESS_SAMPLES) + seed
    out = generate(lm_codes, prompt, mode=mode, window=3, cfg_scale=1.5, temperature=1.0, seed=seeds, **kw)
    t = out.tokens
    return (t[:, 0] * 64 + t[:, 1] * 8 + t[:, 2]).numpy(), out


def _two_sample_p(a: np.ndarray, b: np.ndarray, cells: int) -> float:
    """Two-sample chi-square p-value; cells with a pooled count < 10 are merged into one."""
    ca, cb = np.bincount(a, minlength=cells), np.bincount(b, minlength=cells)
    small = (ca + cb) < 10
    table = np.stack([np.append(ca[~small], ca[small].sum()), np.append(cb[~small], cb[small].sum())])
    table = table[:, table.sum(0) > 0]
    return float(chi2_contingency(table)[1])


@pytest.fixture(scope="module")
def lossless_model():
    # 8 image codes (ids 0..7), class token 8, null 9; a 1 x 3 grid; a mild init so p is neither flat nor one-hot
    lm = build_tiny_llama(10, seed=3, init=0.15)
    return ImageGPT(lm, image_token_range=(0, 8), grid=(1, 3), null_token_id=9)


@pytest.fixture(scope="module")
def ar_samples(lossless_model):
    return _codes(lossless_model, "ar", seed=10**6)[0]


def _check_same_law(ar: np.ndarray, other: np.ndarray) -> list[float]:
    # Power: n = 30000 per sample. A 5% shift (TVD 0.05) of one token's marginal, e.g. 0.05 moved between two cells of
    # probability 0.125, has noncentrality n/2 * sum(delta^2 / p) = 15000 * 2 * 0.0025 / 0.125 = 600 on 7 df: power
    # > 0.999 at alpha = 1e-3. The joint test (512 cells, pooled) is a further check; the lossy controls below show it
    # detects real losses on this model.
    p_joint = _two_sample_p(ar, other, 512)
    p_marg = [_two_sample_p((ar // 8**k) % 8, (other // 8**k) % 8, 8) for k in range(3)]
    return [p_joint] + p_marg


@pytest.mark.parametrize("coupling", COUPLINGS)
def test_sjd_is_lossless(lossless_model, ar_samples, coupling):
    codes, out = _codes(lossless_model, "sjd", seed=0, coupling=coupling)
    assert out.forward_passes < 3 + 1  # all three tokens in one or a few passes: drafts matter here
    assert min(_check_same_law(ar_samples, codes)) > 1e-3


def test_jd_is_lossless_with_fresh_samples(lossless_model, ar_samples):
    # a draft is committed only when it equals a fresh sample from p at its position, so jd is lossless even at T > 0
    codes, _ = _codes(lossless_model, "jd", seed=0)
    assert min(_check_same_law(ar_samples, codes)) > 1e-3


@pytest.mark.parametrize("mode, kw", [("csd", dict(entropy_coef=2.0, tvd_threshold=1.0)),
                                      ("gsd", dict(group_delta=1.0))])
def test_lossy_modes_are_detected(lossless_model, ar_samples, mode, kw):
    """The power check: relaxed acceptance on the same model is caught by the same test."""
    codes, out = _codes(lossless_model, mode, seed=0, **kw, **exact_distortion(mode))
    assert min(_check_same_law(ar_samples, codes)) < 1e-6
    assert float(out.distortion_map.max()) > 0


def test_greedy_jd_equals_ar_on_lossless_model(lossless_model):
    prompt = torch.full((4, 1), 8)
    ar = generate(lossless_model, prompt, mode="ar", temperature=0, cfg_scale=1.5)
    jd = generate(lossless_model, prompt, mode="jd", temperature=0, cfg_scale=1.5, window=3)
    assert torch.equal(ar.tokens, jd.tokens)


# ----------------------------------------------------------------------------------------------------------------------
# csd / maps / counting
# ----------------------------------------------------------------------------------------------------------------------
def test_csd_passes_and_maps(image_gpt):
    ar = generate(image_gpt, PROMPTS, mode="ar", cfg_scale=2.0, seed=1)
    csd = generate(image_gpt, PROMPTS, mode="csd", window=8, cfg_scale=2.0, seed=1)
    sjd = generate(image_gpt, PROMPTS, mode="sjd", window=8, cfg_scale=2.0, seed=1)
    assert csd.forward_passes <= ar.forward_passes
    for out in (ar, csd, sjd):
        for name in ("entropy_map", "accept_map", "distortion_map", "tvd_map"):
            assert getattr(out, name).shape == (3, 4, 5), name
        assert out.tokens.shape == (3, 20) and out.tokens.dtype == torch.int64
        assert int(out.tokens.min()) >= 0 and int(out.tokens.max()) < 16
        assert sum(sum(a) for a in out.accepted) == 3 * 20
        assert len(out.accepted) == out.forward_passes
        assert bool((out.entropy_map >= 0).all())
    assert float(sjd.distortion_map.abs().max()) == 0.0
    assert float(ar.distortion_map.abs().max()) == 0.0
    # csd is strict where the TVD gate is closed (or there was no draft)
    closed = ~(csd.tvd_map < 0.65)
    assert float(csd.distortion_map[closed].abs().max()) == 0.0
    assert set(csd.timings) >= {"model", "verify", "rest"}
    # each row's mean distortion per token, from its own 4 x 5 map
    assert csd.distortion_per_row().shape == (3,) and float(csd.distortion_per_row().max()) > 0
    np.testing.assert_allclose(csd.distortion_per_row(), [float(csd.distortion_map[b].sum()) / 20 for b in range(3)],
                               rtol=1e-6)


@pytest.mark.parametrize("loop", [dict(static=False), dict(static=True), dict(tree=(2, 2))], ids=["eager", "static",
                                                                                                  "tree"])
def test_entropy_map_is_p_at_each_committed_token(image_gpt, loop):
    """The commit the three loops share writes each token's stats once, at its place: entropy_map equals H(p) given
    the committed prefix, recomputed here by one teacher-forced call on the output (T = 1, no CFG). (The eager-static
    comparisons cannot see a bug there: both loops would carry it.)"""
    out = generate(image_gpt, PROMPTS, mode="csd", window=6, cfg_scale=1.0, seed=3, **loop)
    image_gpt.prefill(PROMPTS, None, False)
    cond, _ = image_gpt.forward(torch.cat([PROMPTS, out.tokens[:, :-1]], 1), -1)
    p = torch.softmax(cond.double(), -1)
    entropy = -(p * p.log()).sum(-1)  # [B, H*W]
    torch.testing.assert_close(out.entropy_map.flatten(1).double(), entropy, rtol=1e-4, atol=1e-5)


def test_jd_distortion_is_unknown_and_counts_as_zero(image_gpt):
    jd = generate(image_gpt, PROMPTS, mode="jd", window=8, cfg_scale=2.0, seed=1)
    assert bool(jd.distortion_map.isnan().any())
    np.testing.assert_array_equal(jd.distortion_per_row(), np.zeros(3))


def test_lantern_distortion_is_nan_unless_gathered(image_gpt):
    """Without gather_distortion the op leaves lantern's distortion NaN (not computed): so does the per-row mean,
    never a silent 0; with it, the exact distortion is a positive number."""
    kw = dict(mode="lantern", window=8, cfg_scale=2.0, seed=1, lantern_delta=0.3)
    assert np.isnan(generate(image_gpt, PROMPTS, **kw).distortion_per_row()).all()
    gathered = generate(image_gpt, PROMPTS, gather_distortion=True, **kw).distortion_per_row()
    assert np.isfinite(gathered).all() and (gathered > 0).any()


@pytest.mark.parametrize("mode", MODES)
def test_forward_passes_counts_model_calls(image_gpt, forward_counter, mode):
    counter = forward_counter(image_gpt.backbone)
    out = generate(image_gpt, PROMPTS, mode=mode, window=6, cfg_scale=2.0, seed=2)
    assert counter.calls == out.forward_passes + out.prefill_passes
    assert out.prefill_passes == 0  # one-token prompt: nothing to prefill, it is the first window's input
    prompt = torch.tensor([[16, 17, 18]])
    counter.calls = 0
    out = generate(image_gpt, prompt, mode=mode, window=6, cfg_scale=2.0, seed=2)
    assert out.prefill_passes == 1 and counter.calls == out.forward_passes + 1


# ----------------------------------------------------------------------------------------------------------------------
# batch invariance
# ----------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode, coupling, draft_init", [
    ("ar", None, "uniform"), ("jd", None, "uniform"), ("sjd", "independent", "uniform"), ("sjd", "maximal", "uniform"),
    ("sjd", "gumbel", "above"), ("gsd", None, "uniform"), ("csd", None, "above"),
])
def test_batched_rows_equal_rows_alone(image_gpt, mode, coupling, draft_init):
    seeds = [11, 7, 3]
    kw = dict(mode=mode, window=5, cfg_scale=2.0, temperature=1.0, coupling=coupling, draft_init=draft_init)
    batched = generate(image_gpt, PROMPTS, seed=seeds, **kw)
    alone = [generate(image_gpt, PROMPTS[b : b + 1], seed=[seeds[b]], **kw) for b in range(3)]
    for b in range(3):
        assert torch.equal(batched.tokens[b], alone[b].tokens[0]), b
        per_pass = [a[b] for a in batched.accepted if a[b] > 0]
        assert per_pass == [a[0] for a in alone[b].accepted], b
        torch.testing.assert_close(batched.entropy_map[b], alone[b].entropy_map[0], rtol=1e-4, atol=1e-5)
    assert batched.forward_passes == max(a.forward_passes for a in alone)
    # an int seed s means row b gets s + b
    assert torch.equal(generate(image_gpt, PROMPTS, seed=3, **kw).tokens[2],
                       generate(image_gpt, PROMPTS[2:], seed=5, **kw).tokens[0])


@pytest.mark.parametrize("mode, temperature", [("sjd", 1.0), ("csd", 1.0), ("gsd", 1.0), ("jd", 0.0)])
def test_max_lead_does_not_change_tokens(image_gpt, mode, temperature):
    """Rows that pause (max_lead) keep their state and per-row offsets: tokens are identical for every max_lead."""

    def run(max_lead):
        return generate(image_gpt, PROMPTS, seed=[4, 9, 2], mode=mode, window=4, cfg_scale=2.0,
                        temperature=temperature, max_lead=max_lead)

    outs = {lead: run(lead) for lead in (0, 1, 4, None, 10**6)}
    base = outs[10**6]
    for lead, out in outs.items():
        assert torch.equal(out.tokens, base.tokens), lead
        for b in range(3):
            assert [a[b] for a in out.accepted if a[b] > 0] == [a[b] for a in base.accepted if a[b] > 0], (lead, b)
        torch.testing.assert_close(out.entropy_map, base.entropy_map, rtol=1e-4, atol=1e-5)
        assert out.forward_passes == len(out.accepted) >= base.forward_passes
    assert outs[0].forward_passes > base.forward_passes  # rows did pause
    with pytest.raises(ValueError, match="max_lead"):
        generate(image_gpt, PROMPTS, max_lead=-1)


def test_max_lead_bounds_the_forward_length(image_gpt):
    from csd_kernels.models import get_adapter

    adapter = get_adapter(image_gpt)
    lengths = []
    forward = adapter.forward

    def counting_forward(inputs, position):
        lengths.append(inputs.shape[1])
        return forward(inputs, position)

    adapter.forward = counting_forward
    try:
        out = generate(adapter, PROMPTS, seed=[4, 9, 2], mode="sjd", window=3, cfg_scale=2.0, max_lead=1)
    finally:
        adapter.forward = forward
    assert len(lengths) == out.forward_passes and max(lengths) <= 1 + 3


def test_progress_bar_runs(image_gpt):
    out = generate(image_gpt, PROMPTS[:1], mode="csd", window=4, progress=True, seed=0)
    assert out.tokens.shape == (1, 20)


# ----------------------------------------------------------------------------------------------------------------------
# bad input
# ----------------------------------------------------------------------------------------------------------------------
def test_bad_input_raises(image_gpt, tiny_llama):
    with pytest.raises(ValueError, match="empty"):
        generate(image_gpt, torch.zeros(1, 0, dtype=torch.long))
    with pytest.raises(ValueError, match="empty"):
        generate(image_gpt, torch.zeros(0, 1, dtype=torch.long))
    with pytest.raises(ValueError, match="window"):
        generate(image_gpt, PROMPTS, window=0)
    with pytest.raises(ValueError, match="mode"):
        generate(image_gpt, PROMPTS, mode="medusa")
    with pytest.raises(ValueError, match="coupling"):
        generate(image_gpt, PROMPTS, mode="sjd", coupling="optimal")
    with pytest.raises(ValueError, match="draft_init"):
        generate(image_gpt, PROMPTS, draft_init="left")
    with pytest.raises(ValueError, match="seed"):
        generate(image_gpt, PROMPTS, seed=[1, 2])
    with pytest.raises(ValueError, match="no csd_kernels adapter"):
        generate(tiny_llama, PROMPTS)  # a bare causal LM: grid and image ids unknown
    with pytest.raises(ValueError, match="no csd_kernels adapter"):
        generate(torch.nn.Linear(2, 2), PROMPTS)


def test_top_k_one_is_greedy(image_gpt):
    greedy = generate(image_gpt, PROMPTS, mode="ar", temperature=0, cfg_scale=2.0)
    for mode in ("sjd", "csd", "gsd"):
        out = generate(image_gpt, PROMPTS, mode=mode, window=6, temperature=1.0, top_k=1, cfg_scale=2.0, seed=9)
        assert torch.equal(out.tokens, greedy.tokens), mode
