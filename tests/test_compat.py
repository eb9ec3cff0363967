"""FlashInfer's and vLLM's conventions (csd_kernels.ops.interop): layout, counts, exact cases, the emitted law, errors.

The χ² tests draw N = 40,000 independent rows over V = 7 tokens and pass when the p-value exceeds 1e-3. Power: a
law shifted from p by a TVD of 0.01 between two tokens of probability ≈ 0.15 gives a non-centrality N·Σδ²/p ≈ 53 on
6 degrees of freedom, detected with probability > 0.99 at that level (the lossy CSD rule, a wrong residual or a
bonus row taken from the wrong position are all much further off).
"""

import pytest
import torch
from scipy.stats import chisquare

import csd_kernels as ck

BACKENDS = ck.available_backends("cpu")
FAST_BACKENDS = [name for name in BACKENDS if name != "triton"]  # the interpreter runs one program at a time
N, V, ALPHA = 40000, 7, 1e-3
P = torch.tensor([0.30, 0.20, 0.15, 0.15, 0.10, 0.06, 0.04])
Q = torch.tensor([0.10, 0.25, 0.20, 0.05, 0.15, 0.15, 0.10])


def _random_case(batch, n, vocab, seed):
    g = torch.Generator().manual_seed(seed)
    draft_probs = torch.softmax(2 * torch.randn(batch, n, vocab, generator=g), -1)
    target_probs = torch.softmax(2 * torch.randn(batch, n + 1, vocab, generator=g), -1)
    drafts = torch.multinomial(draft_probs.reshape(-1, vocab), 1, generator=g).reshape(batch, n)
    return draft_probs, drafts.to(torch.int32), target_probs


def _one_hot(tokens, vocab):
    return torch.nn.functional.one_hot(tokens.long(), vocab).float()


# ---------------------------------------------------------------------------------------------------------------------
# FlashInfer: layout and counts
# ---------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_layout_emitted_plus_one_tokens_then_placeholders(backend):
    draft_probs, drafts, target_probs = _random_case(6, 4, 16, seed=1)
    out, accepted, emitted = ck.chain_speculative_sampling(draft_probs, drafts, target_probs, seed=5, backend=backend)
    assert out.dtype == torch.int32 and out.shape == (6, 5)
    assert emitted.dtype == accepted.dtype == torch.int32 and emitted.shape == accepted.shape == (6,)
    window = torch.arange(5)
    assert torch.equal(out != -1, window[None, :] <= emitted[:, None].long())
    assert ((out[out >= 0] < 16)).all()
    assert torch.equal(out[:, :4][window[None, :4] < emitted[:, None]], drafts[window[None, :4] < emitted[:, None]])
    assert ((emitted <= accepted) & (accepted <= 4)).all()
    assert len(set(emitted.tolist())) > 1  # the case exercises more than one chain length


def test_flashinfer_docstring_example():
    """FlashInfer's own example: draft 2 is accepted (q(2) = 0.3 < p(2) = 0.6), draft 1 has p = 0 and is rejected, the
    residual max(p − q, 0) at that position is one-hot at 0."""
    draft_probs = torch.tensor([[[0.1, 0.2, 0.3, 0.4], [0.2, 0.3, 0.4, 0.1]]])
    drafts = torch.tensor([[2, 1]], dtype=torch.int32)
    target_probs = torch.tensor([[[0.0, 0.1, 0.6, 0.3], [1.0, 0.0, 0.0, 0.0], [0.7, 0.1, 0.1, 0.1]]])
    out, accepted, emitted = ck.chain_speculative_sampling(draft_probs, drafts, target_probs, seed=0)
    assert out.tolist() == [[2, 0, -1]] and accepted.tolist() == [1] and emitted.tolist() == [1]


@pytest.mark.parametrize("backend", BACKENDS)
def test_one_hot_target_gives_exactly_the_target_tokens(backend):
    batch, n, vocab = 8, 5, 11
    draft_probs, drafts, _ = _random_case(batch, n, vocab, seed=2)
    target = torch.randint(0, vocab, (batch, n + 1), generator=torch.Generator().manual_seed(3))
    target[:, :n] = torch.where(torch.rand(batch, n, generator=torch.Generator().manual_seed(4)) < 0.7,
                                drafts.long(), target[:, :n])  # most drafts right, some wrong
    out, _, emitted = ck.chain_speculative_sampling(draft_probs, drafts, _one_hot(target, vocab), seed=7,
                                                    backend=backend)
    wrong = torch.cat([drafts.long() != target[:, :n], torch.ones(batch, 1, dtype=torch.bool)], 1)
    assert torch.equal(emitted.long(), wrong.long().argmax(1))  # the chain stops at the first wrong draft
    keep = torch.arange(n + 1)[None, :] <= emitted[:, None].long()
    assert torch.equal(out.long()[keep], target[keep])


@pytest.mark.parametrize("backend", BACKENDS)
def test_disjoint_supports_reject_everything(backend):
    batch, n, vocab = 16, 3, 10
    q = torch.zeros(batch, n, vocab)
    q[..., :5] = 0.2  # the draft lives on tokens 0..4, the target on 5..9
    p = torch.zeros(batch, n + 1, vocab)
    p[..., 5:] = torch.softmax(torch.randn(batch, n + 1, 5, generator=torch.Generator().manual_seed(0)), -1)
    drafts = torch.randint(0, 5, (batch, n), dtype=torch.int32, generator=torch.Generator().manual_seed(1))
    out, accepted, emitted = ck.chain_speculative_sampling(q, drafts, p, seed=3, backend=backend)
    assert emitted.tolist() == [0] * batch and accepted.tolist() == [0] * batch
    assert ((out[:, 0] >= 5) & (out[:, 0] < 10)).all() and (out[:, 1:] == -1).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_residual_with_one_nonzero_entry_draws_it(backend):
    q = torch.tensor([[[0.5, 0.5, 0.0, 0.0]]]).expand(4, 1, 4).contiguous()
    p = torch.tensor([[[0.0, 0.5, 0.5, 0.0], [0.25, 0.25, 0.25, 0.25]]]).expand(4, 2, 4).contiguous()
    drafts = torch.zeros(4, 1, dtype=torch.int32)  # p(0) = 0: always rejected; max(p − q, 0) = one-hot(2)
    out, _, emitted = ck.chain_speculative_sampling(q, drafts, p, seed=11, backend=backend)
    assert out.tolist() == [[2, -1]] * 4 and emitted.tolist() == [0] * 4


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_draft_of_zero_draft_probability_is_neither_accepted_nor_counted(backend):
    """Position 0 is rejected (p = 0 there); the draft at position 1 had q(x) = 0 although p(x) = 1: the op rejects
    such drafts (a = 0), and the accepted count must not mistake the residual draw of x for an acceptance."""
    q = torch.tensor([[[0.5, 0.5, 0.0], [0.5, 0.5, 0.0]]]).expand(8, 2, 3).contiguous()
    p = torch.tensor([[[0.0, 0.0, 1.0], [0.0, 0.0, 1.0], [1.0, 0.0, 0.0]]]).expand(8, 3, 3).contiguous()
    drafts = torch.tensor([[0, 2]], dtype=torch.int32).expand(8, 2)
    out, accepted, emitted = ck.chain_speculative_sampling(q, drafts, p, seed=0, backend=backend)
    assert out.tolist() == [[2, -1, -1]] * 8 and accepted.tolist() == emitted.tolist() == [0] * 8


@pytest.mark.parametrize("vocab", [33, 1023, 1024, 1025, 4097, 32001])
def test_vocabularies_at_tile_boundaries(vocab):
    """The last and first tokens of the vocabulary are reached, and every backend emits the same tokens."""
    n = 2
    q = torch.full((1, n, vocab), 1.0 / vocab)
    p = torch.zeros(1, n + 1, vocab)
    p[0, 0, vocab - 1] = 1.0  # draft 0 rejected, the residual is the last token
    p[0, 1, 0], p[0, 2, vocab // 2] = 1.0, 1.0
    drafts = torch.tensor([[0, 0]], dtype=torch.int32)
    for backend in BACKENDS:
        out, _, _ = ck.chain_speculative_sampling(q, drafts, p, seed=1, backend=backend)
        assert out.tolist() == [[vocab - 1, -1, -1]], backend
    draft_probs, drafts, target_probs = _random_case(1, n, vocab, seed=vocab)
    outs = [ck.chain_speculative_sampling(draft_probs, drafts, target_probs, seed=2, backend=b)[0] for b in BACKENDS]
    assert all(torch.equal(outs[0], o) for o in outs[1:]), BACKENDS


def test_seeded_calls_are_deterministic_and_seeds_matter():
    args = _random_case(32, 4, 50, seed=4)
    first = ck.chain_speculative_sampling(*args, seed=9, offset=3)
    again = ck.chain_speculative_sampling(*args, seed=torch.tensor([9]), offset=torch.tensor([3]))
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    other = ck.chain_speculative_sampling(*args, seed=9, offset=4)
    assert not torch.equal(first[0], other[0])
    unseeded = [ck.chain_speculative_sampling(*args, generator=torch.Generator().manual_seed(s))[0] for s in (0, 0, 1)]
    assert torch.equal(unseeded[0], unseeded[1]) and not torch.equal(unseeded[0], unseeded[2])


def test_counts_are_added_in_place():
    args = _random_case(5, 3, 9, seed=6)
    out, accepted, emitted = ck.chain_speculative_sampling(*args, seed=1)
    acc_buf, emit_buf = torch.full((5,), 10, dtype=torch.int32), torch.full((5,), 20, dtype=torch.int32)
    _, acc2, emit2 = ck.chain_speculative_sampling(*args, acc_buf, emit_buf, seed=1)
    assert acc2 is acc_buf and emit2 is emit_buf
    assert torch.equal(acc_buf, accepted + 10) and torch.equal(emit_buf, emitted + 20)


# ---------------------------------------------------------------------------------------------------------------------
# The emitted law (lossless speculative sampling): χ² against the target
# ---------------------------------------------------------------------------------------------------------------------
def _stat_case(seed):
    n = 2
    q = Q.reshape(1, 1, V).expand(N, n, V)
    p = torch.stack([P, P.flip(0), torch.roll(P, 3)]).reshape(1, n + 1, V).expand(N, n + 1, V)
    drafts = torch.multinomial(Q, N * n, replacement=True, generator=torch.Generator().manual_seed(seed))
    return q, drafts.reshape(N, n).to(torch.int32), p


def _fits(tokens, law):
    counts = torch.bincount(tokens.long(), minlength=V).double()
    law = law.double() / law.double().sum()
    support = law > 0
    assert counts[~support].sum() == 0, "a token outside the law's support was emitted"
    return chisquare(counts[support].numpy(), (law[support] * len(tokens)).numpy()).pvalue


@pytest.mark.parametrize("backend", FAST_BACKENDS)
def test_emitted_tokens_follow_the_target(backend):
    q, drafts, p = _stat_case(seed=0)
    out, accepted, emitted = ck.chain_speculative_sampling(q, drafts, p, seed=0, backend=backend)
    assert _fits(out[:, 0], p[0, 0]) > ALPHA  # every row emits position 0
    assert _fits(out[:, 1][emitted >= 1], p[0, 1]) > ALPHA  # position 1, given that draft 0 was accepted
    assert _fits(out[:, 2][emitted == 2], p[0, 2]) > ALPHA  # the bonus token
    # accepted counts each draft on its own: its mean is Σ_i Σ_x q(x) min(1, p_i(x)/q(x)) = Σ_i Σ_x min(p_i, q)
    expected = sum(torch.minimum(p[0, i], Q).sum() for i in range(2)).item()
    var = sum((a := torch.minimum(p[0, i], Q).sum().item()) * (1 - a) for i in range(2))
    assert abs(accepted.double().mean().item() - expected) < 5 * (var / N) ** 0.5


def test_the_chi2_test_rejects_a_lossy_law():
    """The same test applied to CSD's relaxed rule (lossy by design) rejects: the χ² check has teeth."""
    q, drafts, p = _stat_case(seed=1)
    res = ck.verify(target_logits=torch.log(p[:, :1]), draft_tokens=drafts[:, :1].long(), draft_probs=q[:, :1],
                    rule="csd", tvd_threshold=1.0, entropy_coef=0.5, seed=1, backend=FAST_BACKENDS[0])
    assert _fits(res.tokens[:, 0], p[0, 0]) < ALPHA


# ---------------------------------------------------------------------------------------------------------------------
# vLLM: placeholder, greedy path, bonus token, recovered tokens, ragged rows
# ---------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_greedy_path_is_argmax_equality(backend):
    batch, n, vocab = 6, 4, 13
    logits = torch.randn(batch, n + 1, vocab, generator=torch.Generator().manual_seed(0))
    best = logits.argmax(-1)
    right = torch.tensor([0, 1, 2, 3, 4, 4])  # row b: the first `right[b]` drafts are the argmax
    drafts = torch.where(torch.arange(n)[None, :] < right[:, None], best[:, :n], (best[:, :n] + 1) % vocab)
    out = ck.rejection_sample(drafts, None, logits, temperature=0, seed=1, backend=backend)
    expected = torch.where(torch.arange(n + 1)[None, :] <= right[:, None], best, -1)
    assert torch.equal(out.long(), expected)


def test_bonus_tokens_replace_the_last_slot_of_fully_accepted_rows():
    logits = torch.randn(3, 3, 9, generator=torch.Generator().manual_seed(2))
    best = logits.argmax(-1)
    drafts = torch.stack([best[0, :2], torch.tensor([best[1, 0], (best[1, 1] + 1) % 9]),
                          torch.tensor([best[2, 0], -1])])  # all right; second wrong; ragged with one right draft
    bonus = torch.tensor([100, 101, 102])
    out = ck.rejection_sample(drafts, None, logits, temperature=0, bonus_token_ids=bonus, seed=0)
    assert out.tolist() == [[best[0, 0], best[0, 1], 100], [best[1, 0], best[1, 1], -1], [best[2, 0], 102, -1]]


@pytest.mark.parametrize("backend", FAST_BACKENDS)
def test_recovered_tokens_without_draft_probs_exclude_the_draft(backend):
    """n-gram drafts (no q): x is accepted with probability p(x); a recovered token is drawn from p without x."""
    logits = torch.log(P).reshape(1, 1, V).expand(N, 2, V)
    drafts = torch.zeros(N, 1, dtype=torch.int64)
    out = ck.rejection_sample(drafts, None, logits, seed=3, backend=backend)
    recovered = out[:, 0][out[:, 1] == -1]
    assert (recovered != 0).all()
    assert _fits(recovered, torch.cat([torch.zeros(1), P[1:] / P[1:].sum()])) > ALPHA
    assert _fits(out[:, 0], P) > ALPHA


def test_rejection_sample_matches_chain_speculative_sampling_on_probs():
    draft_probs, drafts, target_probs = _random_case(7, 3, 12, seed=8)
    out, _, _ = ck.chain_speculative_sampling(draft_probs, drafts, target_probs, seed=4)
    assert torch.equal(ck.rejection_sample(drafts, draft_probs, target_probs=target_probs, seed=4), out)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_zero_q_row_at_the_bonus_slot_is_taken(backend):
    """FlashInfer's n drafts + 1 bonus slot mapped onto an L = n + 1 window, q padded with a zero row there (it never
    decides): chain_speculative_sampling, rejection_sample and verify itself take it, with the tokens of the call
    without the padding."""
    draft_probs, drafts, target_probs = _random_case(6, 3, 16, seed=3)
    padded = torch.cat([draft_probs, torch.zeros(6, 1, 16)], 1)
    want = ck.chain_speculative_sampling(draft_probs, drafts, target_probs, seed=2, backend=backend)
    got = ck.chain_speculative_sampling(padded, drafts, target_probs, seed=2, backend=backend)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert torch.equal(ck.rejection_sample(drafts, padded, target_probs=target_probs, seed=2, backend=backend),
                       want[0])
    window = torch.cat([drafts, torch.full((6, 1), -1, dtype=drafts.dtype)], 1)
    res = ck.verify(target_probs=target_probs, draft_tokens=window, draft_probs=padded, rule="strict", seed=2,
                    backend=backend)
    assert res.status.tolist() == [0] * 6


@pytest.mark.parametrize("backend", BACKENDS)
def test_ragged_rows_with_zero_q_padding(backend):
    """vLLM's ragged batch as padded rows: drafts −1 after a row's last draft, and q rows of zeros there."""
    draft_probs, drafts, target_probs = _random_case(4, 3, 16, seed=4)
    drafts[1, 2:] = -1
    drafts[2, 1:] = -1
    drafts[3, :] = -1
    zero_padded = torch.where((drafts >= 0)[..., None], draft_probs, 0.0)
    want = ck.rejection_sample(drafts, draft_probs, target_probs=target_probs, seed=6, backend=backend)
    got = ck.rejection_sample(drafts, zero_padded, target_probs=target_probs, seed=6, backend=backend)
    assert torch.equal(got, want)
    assert (got[3, 1:] == -1).all() and got[3, 0] >= 0  # no drafts: one token from the target
    bad = zero_padded.clone()
    bad[0, 0] = 0.0  # a tested draft with a zero q row is still refused
    with pytest.raises(ValueError, match="draft_probs"):
        ck.rejection_sample(drafts, bad, target_probs=target_probs, seed=6, backend=backend)


# ---------------------------------------------------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------------------------------------------------
def _bad(name):
    draft_probs, drafts, target_probs = _random_case(2, 3, 6, seed=0)
    if name == "nan":
        target_probs[0, 1, 2] = float("nan")
    elif name == "inf":
        target_probs[1, 0, 0] = float("inf")
    elif name == "negative":
        target_probs[0, 0, 0] = -0.1
    elif name == "draft_negative":
        draft_probs[1, 0, 3] = -0.5
    elif name == "token":
        drafts[0, 0] = 6
    elif name == "target_shape":
        target_probs = target_probs[:, :3]
    elif name == "draft_shape":
        draft_probs = draft_probs[:, :, :5]
    elif name == "draft_ids_shape":
        drafts = drafts[0]
    return draft_probs, drafts, target_probs


@pytest.mark.parametrize("case, match", [
    ("nan", "target"), ("inf", "target"), ("negative", "target"), ("draft_negative", "draft_probs"),
    ("token", "draft_tokens"), ("target_shape", "target_probs"), ("draft_shape", "draft_probs"),
    ("draft_ids_shape", "draft_token_ids"),
])
def test_bad_input_raises_a_clear_error(case, match):
    with pytest.raises(ValueError, match=match):
        ck.chain_speculative_sampling(*_bad(case), seed=0)


def test_rejection_sample_wants_exactly_one_target():
    draft_probs, drafts, target_probs = _random_case(2, 3, 6, seed=0)
    with pytest.raises(ValueError, match="exactly one"):
        ck.rejection_sample(drafts, draft_probs, torch.log(target_probs), target_probs=target_probs)
    with pytest.raises(ValueError, match="exactly one"):
        ck.rejection_sample(drafts, draft_probs)
    with pytest.raises(ValueError, match="bonus_token_ids"):
        ck.rejection_sample(drafts, draft_probs, target_probs=target_probs, bonus_token_ids=torch.zeros(3))
