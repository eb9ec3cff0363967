"""The maths itself: csd_kernels.reference, which every backend is held against."""

import math

import pytest
import torch

from csd_kernels import reference as ref

MASK32 = 0xFFFFFFFF


def _random_pair(vocab, generator, sharpness=1.0):
    p = torch.softmax(sharpness * torch.randn(vocab, generator=generator, dtype=torch.float64), -1)
    q = torch.softmax(sharpness * torch.randn(vocab, generator=generator, dtype=torch.float64), -1)
    return p, q


# ---------------------------------------------------------------------------------------------------------------------
# Philox and the uniforms
# ---------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "counter, key, expected",
    [  # Random123's known-answer vectors for philox4x32-10
        ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
        ((MASK32,) * 4, (MASK32, MASK32), (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
        ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
         (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
    ],
)
def test_philox_known_answers(counter, key, expected):
    assert tuple(int(w) for w in ref.philox4x32(*counter, *key)) == expected


def test_uniforms_lie_strictly_inside_the_unit_interval_and_are_exact():
    bits = torch.tensor([0, 511, 512, MASK32], dtype=torch.int64)
    u = ref.uniform_from_bits(bits)
    assert u.dtype == torch.float32
    assert u.tolist() == [0.5 * 2**-23, 0.5 * 2**-23, 1.5 * 2**-23, 1 - 0.5 * 2**-23]
    assert (u > 0).all() and (u < 1).all()


def test_streams_are_keyed_as_documented():
    positions = torch.tensor([0, 10], dtype=torch.int64)
    seed, offset = torch.tensor([7], dtype=torch.int64), torch.tensor([(3 << 32) + 5], dtype=torch.int64)
    u_accept, u_sample = ref.step_uniforms(seed, offset, positions, 4)
    words = ref.philox4x32(12, 1, 5, 3, 7, 0)  # row 1, window position 2 -> absolute position 12
    assert u_accept[1, 2] == ref.uniform_from_bits(words[0]) and u_sample[1, 2] == ref.uniform_from_bits(words[1])
    gumbel = ref.gumbel_uniforms(seed, positions, 4, 9)
    words = ref.philox4x32(6 >> 2, 12, 1, ref.GUMBEL_STREAM_TAG, 7, 0)
    assert gumbel[1, 2, 6] == ref.uniform_from_bits(words[6 & 3])


def test_per_row_seeds_do_not_depend_on_the_row_index():
    seeds = torch.tensor([11, 22, 33], dtype=torch.int64)
    positions = torch.tensor([4, 0, 9], dtype=torch.int64)
    offset = torch.tensor([2], dtype=torch.int64)
    batched = ref.step_uniforms(seeds, offset, positions, 5)
    alone = ref.step_uniforms(seeds[2:], offset, positions[2:], 5)
    assert torch.equal(batched[0][2], alone[0][0]) and torch.equal(batched[1][2], alone[1][0])
    assert torch.equal(ref.random_draft_tokens(seeds, offset, positions, 5, 100)[2],
                       ref.random_draft_tokens(seeds[2:], offset, positions[2:], 5, 100)[0])


def test_per_row_offsets_equal_each_row_alone():
    seeds = torch.tensor([11, 22, 33], dtype=torch.int64)
    positions = torch.tensor([4, 0, 9], dtype=torch.int64)
    offsets = torch.tensor([0, 5, (3 << 32) + 2], dtype=torch.int64)
    batched = ref.step_uniforms(seeds, offsets, positions, 5)
    drafts = ref.random_draft_tokens(seeds, offsets, positions, 5, 100)
    for b in range(3):
        alone = ref.step_uniforms(seeds[b : b + 1], offsets[b : b + 1], positions[b : b + 1], 5)
        assert torch.equal(batched[0][b], alone[0][0]) and torch.equal(batched[1][b], alone[1][0])
        alone = ref.random_draft_tokens(seeds[b : b + 1], offsets[b : b + 1], positions[b : b + 1], 5, 100)
        assert torch.equal(drafts[b], alone[0])
    # a shared offset is the same as that offset repeated per row
    shared = ref.step_uniforms(seeds, offsets[1:2], positions, 5)
    assert torch.equal(shared[0], ref.step_uniforms(seeds, offsets[1:2].expand(3).clone(), positions, 5)[0])
    # the whole verification step: row b with per-row offsets equals row b alone with its offset
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 20, generator=gen)
    draft = torch.randint(0, 20, (3, 5), generator=gen)
    q = torch.softmax(torch.randn(3, 5, 20, generator=gen), -1)
    start = torch.tensor([0, 1, 2])
    kw = dict(rule="csd", coupling="maximal")
    out = ref.verify(logits, draft, q, start=start, positions=positions, seed=seeds, offset=offsets, **kw)
    for b in range(3):
        sl = slice(b, b + 1)
        one = ref.verify(logits[sl], draft[sl], q[sl], start=start[sl], positions=positions[sl], seed=seeds[sl],
                       offset=offsets[sl], **kw)
        assert torch.equal(out.tokens[b], one.tokens[0]) and out.accept_len[b] == one.accept_len[0]
    assert torch.equal(ref.gumbel_uniforms(seeds, positions, 5, 8)[2],
                       ref.gumbel_uniforms(seeds[2:], positions[2:], 5, 8)[0])


def test_random_draft_tokens_are_uniform():
    from scipy.stats import chisquare

    vocab, n = 10, 20000
    tokens = ref.random_draft_tokens(torch.tensor([5]), torch.tensor([0]), torch.arange(n, dtype=torch.int64), 1, vocab)
    counts = torch.bincount(tokens.flatten(), minlength=vocab)
    assert chisquare(counts.numpy()).pvalue > 1e-3


# ---------------------------------------------------------------------------------------------------------------------
# Target distribution and statistics
# ---------------------------------------------------------------------------------------------------------------------
def test_cfg_temperature_and_top_k_with_ties():
    cond = torch.tensor([[1.0, 3.0, 3.0, 0.0, -1.0]])
    uncond = torch.tensor([[0.0, 1.0, 1.0, 2.0, 0.0]])
    z = ref.mixed_logits(cond, uncond, cfg_scale=2.0, temperature=0.5, compute_dtype=torch.float64)
    assert torch.allclose(z, ((uncond + 2.0 * (cond - uncond)) / 0.5).double())
    kept = ref.restrict_top_k(z, 2)  # z = [4, 10, 10, -4, -4]: both tied maxima kept
    assert torch.isinf(kept).tolist() == [[True, False, False, True, True]]
    assert torch.isinf(ref.restrict_top_k(z, 3)).tolist() == [[False, False, False, True, True]]
    greedy = ref.target_probs(torch.tensor([[0.0, 2.0, 2.0]]), temperature=0)
    assert greedy.tolist() == [[0.0, 1.0, 0.0]]


def test_entropy_and_total_variation_values():
    p = torch.tensor([0.5, 0.5, 0.0], dtype=torch.float64)
    q = torch.tensor([0.0, 0.5, 0.5], dtype=torch.float64)
    assert ref.entropy(p).item() == pytest.approx(math.log(2))
    assert ref.entropy(torch.full((16384,), 1 / 16384, dtype=torch.float64)).item() == pytest.approx(math.log(16384))
    assert ref.total_variation(p, q).item() == pytest.approx(0.5)


def test_acceptance_rules():
    # four positions of a two-token vocabulary; the draft is token 0 with p(x), q(x) as listed
    p_x, q_x = torch.tensor([0.1, 0.1, 0.3, 0.2]), torch.tensor([0.4, 0.4, 0.0, 0.1])
    p, q = torch.stack([p_x, 1 - p_x], -1), torch.stack([q_x, 1 - q_x], -1)
    h, tvd = torch.tensor([1.0, 1.0, 5.0, 1.0]), torch.tensor([0.5, 0.9, 0.1, 0.1])
    x = torch.zeros(4, 1, dtype=torch.int64)
    strict = ref.Acceptance("strict", p, q).at(x)[:, 0]
    assert strict.tolist() == pytest.approx([0.25, 0.25, 0.0, 1.0])
    relaxed = ref.Acceptance("csd", p, q, h=h, tvd=tvd, entropy_coef=0.5, tvd_threshold=0.65).at(x)[:, 0]
    # gate open: 0.25 + 0.5·1; gate closed (TVD 0.9 ≥ τ): strict; q(x) = 0: rejected, never divided by zero
    assert relaxed.tolist() == pytest.approx([0.75, 0.25, 0.0, 1.0])


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("rule", ["strict", "csd"])
def test_optimal_residual_of_strict_and_csd_is_the_plain_residual(seed, rule):
    g = torch.Generator().manual_seed(seed)
    p, q = _random_pair(50, g, sharpness=2.0)
    qa = ref.accepted_mass(rule, p, q, entropy_coef=0.05, tvd_threshold=1.0)
    plain = (p - q).clamp(min=0)
    assert torch.allclose(ref.optimal_residual(p, qa), plain / plain.sum(), atol=1e-12)


@pytest.mark.parametrize("seed", range(5))
def test_closed_form_distortion_equals_the_output_distribution_gap(seed):
    g = torch.Generator().manual_seed(seed)
    p, q = _random_pair(50, g, sharpness=2.0)
    for rule, coef in (("strict", 0.5), ("csd", 0.01), ("csd", 0.1), ("csd", 10.0)):
        qa = ref.accepted_mass(rule, p, q, entropy_coef=coef, tvd_threshold=1.0)
        out = ref.output_distribution(p, q, qa, ref.optimal_residual(p, qa))
        assert out.sum().item() == pytest.approx(1.0)
        gap = 0.5 * (out - p).abs().sum()
        assert ref.closed_form_distortion(p, q, qa).item() == pytest.approx(gap.item(), abs=1e-12)
        if rule == "strict":
            assert gap.item() < 1e-12


@pytest.mark.parametrize("seed", range(5))
def test_optimal_residual_minimises_distortion_for_any_acceptance_rule(seed):
    g = torch.Generator().manual_seed(seed)
    p, q = _random_pair(20, g)
    qa = q * torch.rand(20, generator=g, dtype=torch.float64)  # an arbitrary acceptance rule a(y) in [0, 1]
    best = 0.5 * (ref.output_distribution(p, q, qa, ref.optimal_residual(p, qa)) - p).abs().sum()
    for _ in range(50):
        other = torch.softmax(3 * torch.randn(20, generator=g, dtype=torch.float64), -1)
        assert best <= 0.5 * (ref.output_distribution(p, q, qa, other) - p).abs().sum() + 1e-12
    plain = (p - q).clamp(min=0)
    assert best <= 0.5 * (ref.output_distribution(p, q, qa, plain / plain.sum()) - p).abs().sum() + 1e-12


def test_inverse_cdf_never_picks_a_zero_weight():
    weights = torch.tensor([0.0, 0.2, 0.0, 0.3, 0.0])
    u = torch.tensor([1e-7, 0.39, 0.41, 1 - 2**-24])
    assert ref.inverse_cdf_sample(weights.expand(4, 5), u).tolist() == [1, 1, 3, 3]


# ---------------------------------------------------------------------------------------------------------------------
# The whole step, with fixed uniforms
# ---------------------------------------------------------------------------------------------------------------------
def _step(logits, drafts, probs=None, uniforms=None, **kwargs):
    batch = logits.shape[0]
    zeros = torch.zeros(batch, dtype=torch.int64)
    kwargs.setdefault("start", zeros)
    return ref.verify(logits, drafts, probs, positions=zeros, seed=torch.tensor([0]), offset=torch.tensor([0]),
                      uniforms=uniforms, **kwargs)


def test_decisions_follow_the_fixed_uniforms_exactly():
    logits = torch.log(torch.tensor([[[0.6, 0.3, 0.1]] * 4], dtype=torch.float64))
    drafts = torch.tensor([[0, 1, 2, -1]])
    u_sample = torch.full((1, 4), 0.5)
    a = [0.6, 0.3, 0.1, 0.0]  # one-hot drafts, strict: a(x) = p(x); position 3 has no draft
    for u1 in (0.29, 0.31):
        out = _step(logits.float(), drafts, uniforms=(torch.tensor([[0.59, u1, 0.09, 0.5]]), u_sample), rule="strict")
        expected = 3 if u1 < a[1] else 1
        assert out.accept_len.item() == expected
        assert out.tokens[0, :expected].tolist() == drafts[0, :expected].tolist()
        assert out.accept_prob[0].tolist() == pytest.approx(a, rel=1e-5)


def test_start_takes_committed_positions_as_accepted():
    logits = torch.zeros(2, 4, 5)
    drafts = torch.tensor([[3, 1, 2, 4], [0, 0, 0, 0]])
    never = (torch.full((2, 4), 1 - 2**-24), torch.full((2, 4), 0.5))  # a(x) = 0.2 < u: every draft rejected
    out = _step(logits, drafts, uniforms=never, rule="strict", start=torch.tensor([2, 0]))
    assert out.accept_len.tolist() == [2, 0]
    assert out.tokens[0, :2].tolist() == [3, 1]
    beyond = _step(logits, drafts, uniforms=never, rule="strict", start=torch.tensor([9, 4]))
    assert beyond.accept_len.tolist() == [4, 4] and torch.equal(beyond.tokens, drafts)


def test_csd_accepts_flat_regions_wholesale():
    vocab = 16384
    flat = torch.zeros(1, 1, vocab)
    uniform_q = torch.full((1, 1, 1), 1.0 / vocab).expand(1, 1, vocab)
    last = (torch.full((1, 1), 1 - 2**-24), torch.full((1, 1), 0.5))
    out = _step(flat, torch.tensor([[123]]), uniform_q, uniforms=last, rule="csd")
    assert out.entropy.item() == pytest.approx(math.log(vocab), rel=1e-5)
    assert out.accept_prob.item() == 1.0 and out.accept_len.item() == 1
    assert out.distortion.item() == pytest.approx(0.0, abs=1e-5)  # p = q: relaxing costs nothing here


def test_greedy_everywhere_at_temperature_zero():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 6, 11, generator=g)
    drafts = torch.full((3, 6), -1)
    for coupling in ref.COUPLINGS:
        out = _step(logits, drafts, temperature=0.0, coupling=coupling)
        assert torch.equal(out.tokens, logits.argmax(-1))
        assert (out.entropy == 0).all()


def test_float64_and_float32_agree():
    g = torch.Generator().manual_seed(1)
    logits = 3 * torch.randn(4, 8, 300, generator=g)
    probs = torch.softmax(3 * torch.randn(4, 8, 300, generator=g), -1)
    drafts = torch.multinomial(probs.reshape(-1, 300), 1, generator=g).reshape(4, 8)
    out32 = _step(logits, drafts, probs, rule="csd")
    out64 = _step(logits, drafts, probs, rule="csd", compute_dtype=torch.float64)
    assert torch.equal(out32.tokens, out64.tokens) and torch.equal(out32.accept_len, out64.accept_len)
    for name in ("entropy", "tvd", "accept_prob", "distortion"):
        assert torch.allclose(getattr(out32, name), getattr(out64, name), rtol=1e-4, atol=1e-5), name


@pytest.mark.parametrize("coupling", ref.COUPLINGS)
def test_reference_creates_no_tensor_off_the_inputs_device(coupling):
    """On the meta device any tensor made on the CPU (a Python int turned into a tensor) fails to combine."""
    meta = dict(device="meta")
    batch, length, vocab = 2, 3, 7
    out = ref.verify(torch.randn(batch, length, vocab, **meta), torch.zeros(batch, length, dtype=torch.int64, **meta),
                   torch.rand(batch, length, vocab, **meta), uncond_logits=torch.randn(batch, length, vocab, **meta),
                   cfg_scale=2.0, top_k=3, coupling=coupling, start=torch.zeros(batch, dtype=torch.int64, **meta),
                   positions=torch.zeros(batch, dtype=torch.int64, **meta),
                   seed=torch.zeros(1, dtype=torch.int64, **meta),
                   offset=torch.zeros(1, dtype=torch.int64, **meta))
    assert out.tokens.device.type == "meta"


def test_status_bits_are_one_definition():
    """reference.STATUS_* is the definition: the Triton kernels import it, the C++ extension must agree."""
    from csd_kernels.backends.compiled import compiled_extension

    expected = {"bad_logits": ref.STATUS_BAD_LOGITS, "bad_draft_token": ref.STATUS_BAD_DRAFT_TOKEN,
                "bad_draft_probs": ref.STATUS_BAD_DRAFT_PROBS,
                "missing_committed_token": ref.STATUS_MISSING_COMMITTED_TOKEN}
    assert sorted(expected.values()) == [1, 2, 4, 8]
    extension = compiled_extension()
    if extension is None:
        pytest.skip("the C++ extension is not built")
    assert extension.status_bits() == expected


def test_every_draft_token_implementation_is_the_reference():
    """csd_kernels.ops.drafts (C++ on the CPU, Triton on a GPU or under the interpreter) equals the reference bit for
    bit: shared and per-row seeds, per-row offsets >= 2^32, positions wrapping mod 2^32."""
    from csd_kernels.backends.triton import drafts as triton_drafts
    from csd_kernels.ops import drafts

    positions = torch.tensor([0, 2**32 - 2, 7, 123456789])
    for seed, offset in [(torch.tensor([3]), torch.tensor([2**40 + 1])),
                         (torch.tensor([1, 2**33, -5, 7]), torch.tensor([0, 5, 2**62, 1]))]:
        expected = ref.random_draft_tokens(seed, offset, positions, 6, 16384)
        assert torch.equal(drafts.random_draft_tokens(seed, offset, positions, 6, 16384), expected)
        assert torch.equal(triton_drafts.draft_tokens(seed, offset, positions, 6, 16384), expected)
        assert int(expected.min()) >= 0 and int(expected.max()) < 16384
