"""Goodness-of-fit of what the op emits, with fixed seeds.

Each χ² test draws N = 40,000 independent rows over V = 7 tokens and passes when its p-value exceeds 1e-3. Power:
a shift of the emitted law by a TVD of 0.01 between two tokens of probability ≈ 0.14 gives a non-centrality of
N·Σδ²/p ≈ 57 on 6 degrees of freedom, detected with probability > 0.99 at that level; the tests that expect a
*different* law (csd with the gate open) check that the χ² against p does reject.
"""

import pytest
import torch
from scipy.stats import binomtest, chisquare

import csd_kernels as ck
from csd_kernels import reference as ref

N, V = 40000, 7
ALPHA = 1e-3
# The interpreter runs one program at a time: statistics at this size are for the compiled backends.
BACKENDS = [name for name in ck.available_backends("cpu") if name != "triton"]

P_LOGITS = torch.log(torch.tensor([0.30, 0.20, 0.15, 0.15, 0.10, 0.06, 0.04], dtype=torch.float64))
Q = torch.tensor([0.10, 0.25, 0.20, 0.05, 0.15, 0.15, 0.10], dtype=torch.float64)


def _p():
    return torch.softmax(P_LOGITS, -1)


def _drafts(q, n, seed):
    return torch.multinomial(q.float(), n, replacement=True, generator=torch.Generator().manual_seed(seed))


def _counts(tokens):
    return torch.bincount(tokens, minlength=V).double()


def _fits(tokens, law):
    return chisquare(_counts(tokens).numpy(), (law * len(tokens)).numpy()).pvalue


def _one_position(rule, backend, tvd_threshold=0.65, entropy_coef=0.5, seed=0):
    logits = P_LOGITS.float().expand(N, 1, V)
    q = Q.float().reshape(1, 1, V).expand(N, 1, V)  # stride 0: one q for every row
    drafts = _drafts(Q, N, seed).reshape(N, 1)
    return ck.verify(logits, drafts, q, rule=rule, tvd_threshold=tvd_threshold, entropy_coef=entropy_coef,
                     seed=seed, backend=backend)


def _analytic_out(rule, tvd_threshold, entropy_coef):
    p = _p()
    qa = ref.accepted_mass(rule, p, Q, entropy_coef=entropy_coef, tvd_threshold=tvd_threshold)
    return ref.output_distribution(p, Q, qa, ref.optimal_residual(p, qa)), ref.closed_form_distortion(p, Q, qa)


@pytest.mark.parametrize("backend", BACKENDS)
def test_strict_mode_reproduces_p(backend):
    res = _one_position("strict", backend)
    assert _fits(res.tokens[:, 0], _p()) > ALPHA
    assert torch.allclose(res.distortion, torch.zeros(()), atol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_csd_mode_with_the_gate_open_reproduces_the_analytic_output_law(backend):
    # TVD(p, Q) = 0.3 < τ: the relaxed rule applies; λ = 0.05 keeps the extra acceptance partial, so out ≠ p.
    out, distortion = _analytic_out("csd", 0.65, 0.05)
    assert distortion > 0.05
    res = _one_position("csd", backend, entropy_coef=0.05)
    assert _fits(res.tokens[:, 0], out) > ALPHA
    assert _fits(res.tokens[:, 0], _p()) < 1e-12  # the distortion is real and the test sees it
    assert torch.allclose(res.distortion[:, 0], distortion.float().expand(N), rtol=1e-4)


@pytest.mark.parametrize("backend", BACKENDS)
def test_csd_mode_with_the_gate_closed_is_lossless(backend):
    res = _one_position("csd", backend, tvd_threshold=0.2, entropy_coef=0.05)
    assert _fits(res.tokens[:, 0], _p()) > ALPHA
    assert torch.allclose(res.distortion, torch.zeros(()), atol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("coupling", ref.COUPLINGS)
def test_next_drafts_after_a_forced_rejection_are_distributed_as_p(backend, coupling):
    logits = P_LOGITS.float().expand(N, 2, V)
    q = Q.float().reshape(1, 1, V).expand(N, 2, V)
    drafts = torch.stack([torch.full((N,), -1), _drafts(Q, N, 1)], dim=1)  # no draft at 0: acceptance stops there
    res = ck.verify(logits, drafts, q, rule="csd", coupling=coupling, seed=3, backend=backend)
    assert (res.accept_len == 0).all()
    assert _fits(res.tokens[:, 0], _p()) > ALPHA
    assert _fits(res.tokens[:, 1], _p()) > ALPHA
    if coupling == "maximal":
        # Maximal coupling keeps the old draft exactly with probability Σ min(p, q) = 1 − TVD(p, q) = 0.7.
        kept = int((res.tokens[:, 1] == drafts[:, 1]).sum())
        assert binomtest(kept, N, float(torch.minimum(_p(), Q).sum())).pvalue > ALPHA


@pytest.mark.parametrize("backend", BACKENDS)
def test_gumbel_drafts_repeat_for_the_same_seed_row_position_and_p(backend):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(16, 4, 50, generator=g)
    positions = torch.arange(16) * 3
    runs = [
        ck.verify(logits, torch.full((16, 4), -1), None, coupling="gumbel", positions=positions, seed=9, offset=offset,
                  backend=backend).tokens[:, 1:]
        for offset in (0, 1, 12345)
    ]
    assert torch.equal(runs[0], runs[1]) and torch.equal(runs[0], runs[2])
    other_seed = ck.verify(logits, torch.full((16, 4), -1), coupling="gumbel", positions=positions, seed=10,
                           backend=backend)
    assert not torch.equal(other_seed.tokens[:, 1:], runs[0])


@pytest.mark.parametrize("backend", BACKENDS)
def test_same_seed_same_tokens_other_seed_or_offset_other_tokens(backend):
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(8, 16, 100, generator=g)
    drafts = torch.randint(0, 100, (8, 16), generator=g)
    run = lambda **kw: ck.verify(logits, drafts, rule="strict", backend=backend, **kw).tokens  # noqa: E731
    assert torch.equal(run(seed=5, offset=2), run(seed=5, offset=2))
    assert not torch.equal(run(seed=5, offset=2), run(seed=6, offset=2))
    assert not torch.equal(run(seed=5, offset=2), run(seed=5, offset=3))
