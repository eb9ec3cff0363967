"""Every backend against the reference (float32 maths, the same Philox stream), over the issue's shape grid."""

import pytest
import torch

import csd_kernels as ck
from csd_kernels import reference as ref
from csd_kernels import testing

# The torch backend *is* the reference (tested in test_reference.py and test_statistics.py): the others are held to it.
BACKENDS = [name for name in ck.available_backends("cpu") if name != "torch"]
# Tolerances for the per-position statistics, by logits dtype: all backends compute in float32 after loading, so
# the gap is float32 reduction order, not the storage dtype.
TOLERANCES = {torch.float32: (1e-4, 1e-5), torch.bfloat16: (1e-4, 1e-5), torch.float16: (1e-4, 1e-5)}


def _case(batch, length, vocab, dtype, strided, seed, with_probs=True, cfg=True):
    """(logits, uncond, probs, drafts) of testing.make_case; strided: the halves of an interleaved CFG batch."""
    case = testing.make_case(batch, length, vocab, dtype=dtype, cfg=cfg, q="dense" if with_probs else None,
                             strided=strided, scale=3.0, seed=seed)
    drafts = case["draft_tokens"] if vocab > 1 else torch.zeros(batch, length, dtype=torch.long)
    return case["target_logits"], case["uncond_logits"], case["draft_probs"], drafts


def _assert_matches(got, expected, dtype):
    rtol, atol = TOLERANCES[dtype]
    testing.compare(got, expected, rtol=rtol, atol=atol)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("length", [1, 5, 16])
@pytest.mark.parametrize("vocab", [1, 7, 1000, 16384])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("strided", [False, True])
def test_backend_matches_reference(backend, batch, length, vocab, dtype, strided):
    seed = hash((batch, length, vocab, str(dtype), strided)) % 1000
    logits, uncond, probs, drafts = _case(batch, length, vocab, dtype, strided, seed)
    start = torch.arange(batch) % 2
    drafts[:, 0] = drafts[:, 0].clamp(min=0)  # committed positions (< start) need their token
    kwargs = dict(uncond_logits=uncond, cfg_scale=2.5, temperature=0.9, rule="csd", seed=seed, offset=3,
                  start=start, positions=torch.arange(batch) * 100)
    _assert_matches(ck.verify(logits, drafts, probs, backend=backend, **kwargs),
                    ck.verify(logits, drafts, probs, backend="torch", **kwargs), dtype)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "options",
    [
        dict(rule="strict"),
        dict(rule="csd", coupling="maximal"),
        dict(rule="csd", coupling="gumbel"),
        dict(rule="csd", top_k=10),
        dict(rule="strict", top_k=1),
        dict(rule="csd", temperature=0.0),
        dict(rule="csd", temperature=0.0, coupling="gumbel"),
        dict(rule="csd", entropy_coef=0.0, tvd_threshold=1.0),
        dict(rule="csd", seed=torch.tensor([5, 2**40, 2**63 + 9 - 2**64], dtype=torch.int64)),
        dict(rule="csd", offset=torch.tensor([0, 7, 2**62 + 3], dtype=torch.int64)),
        dict(rule="csd", coupling="maximal", offset=torch.tensor([2**40, 1, 2**32], dtype=torch.int64),
             seed=torch.tensor([5, 6, 7], dtype=torch.int64)),
    ],
)
@pytest.mark.parametrize("q_kind", ["one-hot", "full", "uniform"])
def test_backend_options_match_reference(backend, options, q_kind):
    logits, uncond, probs, drafts = _case(3, 6, 64, torch.float32, False, 11, cfg=True)
    if q_kind == "one-hot":
        probs = None
    elif q_kind == "uniform":  # all strides 0: a uniform q is never materialised
        probs = torch.full((1, 1, 1), 1 / 64).expand(3, 6, 64)
    start = torch.tensor([0, 2, 6])
    drafts = torch.where(torch.arange(6) < start[:, None], drafts.clamp(min=0), drafts)  # committed need tokens
    kwargs = dict(uncond_logits=uncond, cfg_scale=3.0, seed=1, offset=2**40, start=start,
                  positions=torch.tensor([0, 2**32 - 3, 7]))
    kwargs.update(options)
    _assert_matches(ck.verify(logits, drafts, probs, backend=backend, **kwargs),
                    ck.verify(logits, drafts, probs, backend="torch", **kwargs), torch.float32)


@pytest.mark.parametrize("backend", ck.available_backends("cpu"))
def test_decisions_are_exactly_u_below_a(backend):
    """For the Philox uniforms of each position, accepted ⟺ u_accept < a(x), with a(x) as reported."""
    batch, length, vocab = 6, 8, 50
    logits, uncond, probs, drafts = _case(batch, length, vocab, torch.float32, False, 5)
    drafts = drafts.clamp(min=0)
    positions = torch.arange(batch) * 17
    res = ck.verify(logits, drafts, probs, uncond_logits=uncond, cfg_scale=2.0, seed=21, offset=4, positions=positions,
                    backend=backend)
    u_accept, _ = ref.step_uniforms(torch.tensor([21]), torch.tensor([4]), positions, length)
    accepted = u_accept < res.accept_prob
    for b, n in enumerate(res.accept_len.tolist()):
        assert accepted[b, :n].all()
        if n < length:
            assert not accepted[b, n]


# (not triton: 65k interpreted programs are too slow)
@pytest.mark.parametrize("backend", [name for name in BACKENDS if name != "triton"])
def test_many_random_rows_agree_across_backends(backend):
    """Float rounding may split a rare tie between backends: demand ≥ 99.9% identical rows over 4,096 rows."""
    batch, length, vocab = 256, 16, 1000
    logits, uncond, probs, drafts = _case(batch, length, vocab, torch.bfloat16, True, 99)
    agree = 0
    for offset in range(4):
        kwargs = dict(uncond_logits=uncond, cfg_scale=5.0, seed=offset, offset=offset,
                      coupling=ref.COUPLINGS[offset % 3])
        got = ck.verify(logits, drafts, probs, backend=backend, **kwargs)
        expected = ck.verify(logits, drafts, probs, backend="torch", **kwargs)
        same = (got.tokens == expected.tokens).all(-1) & (got.accept_len == expected.accept_len)
        agree += int(same.sum())
    assert agree >= 0.999 * 4 * batch


@pytest.mark.parametrize("backend", ck.available_backends("cpu"))
def test_strided_per_row_seed_and_offset(backend):
    """Per-row seeds/offsets given as strided views (a column of a state table) draw the same streams as copies."""
    logits, uncond, probs, drafts = _case(4, 6, 64, torch.float32, False, 3)
    state = torch.tensor([[11, 0], [12, 5], [13, 2**33], [14, 9]], dtype=torch.int64)
    kwargs = dict(uncond_logits=uncond, cfg_scale=2.0, positions=torch.tensor([0, 4, 9, 1]))
    strided = ck.verify(logits, drafts, probs, seed=state[:, 0], offset=state[:, 1], backend=backend, **kwargs)
    assert state[:, 1].stride(0) == 2
    copied = ck.verify(logits, drafts, probs, seed=state[:, 0].clone(), offset=state[:, 1].clone(), backend="torch",
                       **kwargs)
    _assert_matches(strided, copied, torch.float32)
