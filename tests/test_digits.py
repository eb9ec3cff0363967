"""Tests for csd_kernels.zoo.digits (CPU, each a few seconds)."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from csd_kernels.zoo.digits import model as M
from csd_kernels.zoo.digits import quality as Q
from csd_kernels.zoo.digits.tokenizer import PatchCodebook, digits_dataset, to_uint8

torch.set_num_threads(1)  # the CI box has 2 shared cores; 1 thread is faster under contention


@pytest.fixture(scope="module")
def data():
    return digits_dataset()


@pytest.fixture(scope="module")
def codebook():
    return M.load_codebook()


@pytest.fixture(scope="module")
def lm():
    return M.load_lm()


# ----------------------------------------------------------------------------- tokenizer
def test_dataset_shapes(data):
    x, y = data
    assert x.shape == (1797, 32, 32) and x.dtype == torch.float32
    assert y.shape == (1797,) and y.dtype == torch.long
    assert float(x.min()) >= 0.0 and float(x.max()) <= 1.0
    u = to_uint8(x[:3])
    assert u.dtype == torch.uint8 and u.shape == (3, 32, 32)


def test_round_trip(codebook, data):
    x = data[0][:300]
    tok = codebook.encode(x)
    assert tok.shape == (300, 256) and tok.dtype == torch.long
    assert int(tok.min()) >= 0 and int(tok.max()) < codebook.num_codes
    err = (codebook.decode(tok) - x).abs()
    # measured on the shipped codebook: with the training texture (noise 0.04) max 0.20, mean 0.021;
    # plain nearest-code quantisation (noise=0): max 0.10, mean 0.013
    assert float(err.mean()) < 0.03 and float(err.max()) < 0.3
    err0 = (codebook.decode(codebook.encode(x, noise=0.0)) - x).abs()
    assert float(err0.mean()) < 0.02 and float(err0.max()) < 0.15


def test_flat_background_maps_to_many_codes(codebook, data):
    x = data[0][:200]
    tok = codebook.encode(x)
    bg = x.reshape(200, 16, 2, 16, 2).amax(dim=(2, 4)).reshape(200, 256) < 0.01
    assert int(tok[bg].unique().numel()) >= 20  # the VQ "flat-region entropy"
    # ... but they decode to (almost) black: measured mean 0.002-0.01, max 0.126 (a few noisy edge codes)
    dec = codebook.decode(tok).reshape(200, 16, 2, 16, 2).permute(0, 1, 3, 2, 4).reshape(200, 256, 4)[bg]
    assert float(dec.mean()) < 0.02 and float(dec.max()) < 0.2


def test_encode_deterministic(codebook, data):
    x = data[0][:50]
    assert torch.equal(codebook.encode(x), codebook.encode(x))
    assert torch.equal(codebook.encode(x, seed=3), codebook.encode(x.clone(), seed=3))
    assert torch.equal(codebook.encode(x, noise=0.0), codebook.encode(x, noise=0.0, seed=7))
    assert not torch.equal(codebook.encode(x, seed=0), codebook.encode(x, seed=1))  # texture is re-drawable


def test_bad_inputs(codebook, data):
    with pytest.raises(ValueError):
        codebook.encode(torch.zeros(2, 28, 28))
    with pytest.raises(ValueError):
        codebook.encode(torch.zeros(32, 32))
    with pytest.raises(ValueError):
        codebook.encode(torch.zeros(2, 32, 32, dtype=torch.long))
    with pytest.raises(ValueError):
        codebook.decode(torch.full((1, 256), codebook.num_codes))
    with pytest.raises(ValueError):
        codebook.decode(torch.full((1, 256), -1))
    with pytest.raises(ValueError):
        codebook.decode(torch.zeros(1, 255, dtype=torch.long))
    with pytest.raises(ValueError):
        codebook.decode(torch.zeros(256, dtype=torch.long))


def test_code_distribution_is_what_encode_draws(codebook, data):
    x = data[0][:8]
    p = codebook.code_distribution(x, draws=16, seed=2)
    assert p.shape == (8, 256, codebook.num_codes)
    torch.testing.assert_close(p.sum(-1), torch.ones(8, 256))
    # the estimate is the frequency of the codes encode() picks with the texture seeds 2·16 .. 2·16 + 15
    one_hot = torch.nn.functional.one_hot(torch.stack([codebook.encode(x, seed=32 + k) for k in range(16)]),
                                          codebook.num_codes)
    torch.testing.assert_close(p, one_hot.float().mean(0))
    # background patches spread over many codes, all of which decode to (almost) black
    bg = x.reshape(8, 16, 2, 16, 2).amax(dim=(2, 4)).reshape(8, 256) < 0.01
    dark = codebook.values.amax(1) < 0.2
    assert float(p[bg][:, dark].sum(-1).min()) > 0.99
    assert float((p[bg] > 0).sum(-1).float().mean()) > 8  # 16 draws: mostly distinct codes


def test_fit_save_load(tmp_path, data):
    x = data[0][:40]
    a = PatchCodebook.fit(x, num_codes=32, seed=0, iters=5)
    b = PatchCodebook.fit(x, num_codes=32, seed=0, iters=5)
    assert torch.equal(a.centroids, b.centroids) and torch.equal(a.values, b.values)
    a.save(tmp_path / "cb.safetensors")
    c = PatchCodebook.load(tmp_path / "cb.safetensors")
    assert torch.equal(a.centroids, c.centroids) and c.noise == a.noise and c.num_codes == 32
    assert torch.equal(a.encode(x), c.encode(x))


# --------------------------------------------------------------------------------- model
def test_constants():
    assert M.NUM_CODES == 512 and M.NUM_CLASSES == 10 and M.GRID == (16, 16)
    assert M.CLASS_TOKEN_OFFSET == 512 and M.NULL_TOKEN_ID == 522 and M.VOCAB_SIZE == 523


def test_shipped_weights(lm, codebook):
    total = sum(os.path.getsize(M.WEIGHTS_DIR / f) for f in os.listdir(M.WEIGHTS_DIR))
    assert total <= 10 * 1024 * 1024  # the package ships at most 10 MB of weights
    assert codebook.num_codes == M.NUM_CODES
    assert lm.config.vocab_size == M.VOCAB_SIZE and not lm.training
    assert next(lm.parameters()).dtype == torch.float32
    ids = torch.cat([M.prompt_ids([3, 7]), torch.randint(0, M.NUM_CODES, (2, 20))], 1)
    with torch.no_grad():
        logits = lm(input_ids=ids).logits
    assert logits.shape == (2, 21, M.VOCAB_SIZE) and torch.isfinite(logits).all()


def test_kv_cache_matches_full_forward(lm):
    from transformers import DynamicCache

    ids = torch.cat([M.prompt_ids([1]), torch.randint(0, M.NUM_CODES, (1, 12))], 1)
    kw = M.cache_kwarg(lm)
    with torch.no_grad():
        full = lm(input_ids=ids).logits
        cache = DynamicCache()
        a = lm(input_ids=ids[:, :8], use_cache=True, **{kw: cache}).logits
        M.crop_cache(cache, 5)  # roll back, then re-feed (what speculative decoding does)
        assert cache.get_seq_length() == 5
        b = lm(input_ids=ids[:, 5:], use_cache=True, **{kw: cache}).logits
    torch.testing.assert_close(a, full[:, :8], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(b, full[:, 5:], atol=1e-4, rtol=1e-4)


def test_prompt_ids():
    assert M.prompt_ids([0, 9]).tolist() == [[512], [521]]
    assert M.prompt_ids(torch.tensor([4])).shape == (1, 1)
    for bad in ([10], [-1], [0.5]):
        with pytest.raises(ValueError):
            M.prompt_ids(bad)


def test_sample_ar_recognised(lm, codebook):
    classes = torch.arange(10).repeat(2)
    toks = M.sample_ar(lm, classes, cfg_scale=M.DEFAULT_CFG, temperature=1.0, seed=0)
    assert toks.shape == (20, 256) and toks.dtype == torch.long
    assert int(toks.min()) >= 0 and int(toks.max()) < M.NUM_CODES
    acc = Q.class_accuracy(codebook.decode(toks), classes)
    assert acc >= ACC_THRESHOLD, acc


# the shipped weights score 0.957 ± 0.004 at the default cfg (benchmarks/digits_quality.py, 1350 images);
# chance is 0.10.  20 images, so the threshold leaves room for sampling noise and cross-platform numerics.
ACC_THRESHOLD = 0.8


def test_sample_ar_deterministic(lm):
    a = M.sample_ar(lm, [2], cfg_scale=2.0, seed=11)
    b = M.sample_ar(lm, [2], cfg_scale=2.0, seed=11)
    assert torch.equal(a, b)


# ------------------------------------------------------------------------------ training
def test_short_training_loss_decreases(tmp_path, codebook):
    from csd_kernels.zoo.digits.train import train

    r = train(tmp_path, steps=30, subset=256, batch_size=8, warmup=5, soft_draws=8, codebook=codebook, eval_per_class=1,
              eval_cfg_scales=(M.DEFAULT_CFG, 2.0), log_every=0, verbose=False, threads=None)
    loss = r["losses"]
    assert len(loss) == 30 and all(np.isfinite(loss))
    assert np.mean(loss[-5:]) < np.mean(loss[:5]) - 0.1
    lm2 = M.load_lm(tmp_path)  # the written artefacts load back
    assert lm2.config.vocab_size == M.VOCAB_SIZE
    assert M.load_codebook(tmp_path).num_codes == M.NUM_CODES
    assert set(r["samples"]) == {f"cfg{M.DEFAULT_CFG:g}", "cfg2"} and r["samples"]["cfg2"]["n"] == 10
    assert (tmp_path / "samples.png").is_file()
    # what is written is the moving average, not the last step's weights
    written = dict(lm2.named_parameters())
    for name, p in r["lm"].named_parameters():
        torch.testing.assert_close(written[name], p.half().float())
    assert any(not torch.equal(p, q) for p, q in zip(r["lm"].parameters(), r["raw_lm"].parameters()))


@pytest.mark.parametrize("kwargs, match", [
    (dict(soft_draws=-1), "soft_draws must be >= 0"),
    (dict(soft_draws=256), "soft_draws must be in 1..255"),
    (dict(ema=1.0), "ema must be in"),
    (dict(ema=-0.1), "ema must be in"),
    (dict(shift=-1), "shift must be >= 0"),
])
def test_training_rejects_bad_settings(tmp_path, monkeypatch, kwargs, match):
    from csd_kernels.zoo.digits import train as T

    def no_fit(*args, **kw):
        raise AssertionError("a bad setting must be refused before the codebook is fitted")

    monkeypatch.setattr(T.PatchCodebook, "fit", no_fit)
    with pytest.raises(ValueError, match=match):
        T.train(tmp_path, steps=1, subset=8, eval_per_class=0, verbose=False, threads=None, **kwargs)


def test_precomputed_targets_equal_code_distribution(codebook, data):
    from csd_kernels.zoo.digits.train import precompute_targets

    x = data[0][:12]
    counts = precompute_targets(codebook, x, draws=8, noise=codebook.noise, seed=5, chunk=5)
    assert counts.dtype == torch.uint8 and counts.shape == (12, 256, codebook.num_codes)
    assert bool((counts.sum(-1) == 8).all())
    for i, s in enumerate(range(0, 12, 5)):  # chunk i draws its noise with seed 5 + i
        torch.testing.assert_close(counts[s : s + 5].float() / 8, codebook.code_distribution(x[s : s + 5], draws=8,
                                                                                             seed=5 + i))


def test_update_ema():
    from csd_kernels.zoo.digits.train import update_ema

    avg, cur = torch.nn.Linear(2, 1), torch.nn.Linear(2, 1)
    with torch.no_grad():
        avg.weight.fill_(0.0), cur.weight.fill_(1.0)
    update_ema(avg, cur, decay=0.9, step=1000)  # d = min(0.9, 1001 / 1010) = 0.9
    torch.testing.assert_close(avg.weight, torch.full((1, 2), 0.1))
    update_ema(avg, cur, decay=0.9, step=0)  # warm-up: d = 1 / 10
    torch.testing.assert_close(avg.weight, torch.full((1, 2), 0.1 + 0.9 * 0.9))


# ------------------------------------------------------------------------------- quality
def test_classifier_heldout_accuracy():
    assert Q.heldout_accuracy() >= 0.9
    assert Q.heldout_accuracy(round_trip=True) >= 0.9


def test_quality_on_real_images(data):
    x, y = data
    assert Q.downsample_to_8x8(x[:5]).shape == (5, 64)
    assert Q.class_accuracy(x[:300], y[:300]) >= 0.9
    assert Q.features(x[:5]).shape[0] == 5 and Q.features(x[:5]).shape[1] >= 10


def test_frechet_distance():
    a, b = Q.real_features(600, seed=1), Q.real_features(600, seed=2)
    real_real = Q.frechet_distance(a, b)
    noise = Q.features(torch.rand(600, 32, 32, generator=torch.Generator().manual_seed(0)))
    real_noise = Q.frechet_distance(a, noise)
    assert 0.0 <= real_real < 5.0  # measured ~1
    assert real_noise > 100.0 * max(real_real, 1.0)  # measured ~1000
    assert Q.frechet_distance(a, a) < 1e-6
    with pytest.raises(ValueError):
        Q.frechet_distance(a, a[:, :5])
