"""csd_kernels.integrations.vllm against vLLM's own test cases, replayed without importing vLLM.

The cases are those of vLLM's tests/v1/sample/test_rejection_sampler.py (read at commit 004fce2d of
vllm-project/vllm, whose rejection_sample signature is the one of the vLLM 0.33.0 wheel): the greedy tables
(perfect match, early mismatch, several sequences, one token, no drafts, several mismatches, the parametrised
table), seeded determinism, the distribution test, top-k / top-p masks and the placeholder draft. vLLM feeds
rejection_sample the logits after its processors (temperature, top-k / top-p as -inf): the replays give those.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from csd_kernels.integrations import vllm as adapter
from csd_kernels.integrations.vllm import PLACEHOLDER_TOKEN_ID, rejection_sample


def _spec(spec_tokens: list, device="cpu"):
    """SpecDecodeMetadata.make_dummy's fields: flat int32 drafts, counts, inclusive cumulative int32 counts."""
    counts = [len(t) for t in spec_tokens]
    flat = torch.tensor(sum(spec_tokens, []), dtype=torch.int32, device=device)
    cu = torch.tensor(counts, dtype=torch.int32).cumsum(0, dtype=torch.int32).to(device)
    return flat, counts, max(counts), cu


def _logits(output_tokens: list, vocab_size: int = 100, override: int = None) -> torch.Tensor:
    """vLLM's create_logits_tensor: -100 everywhere, 100 at each position's target token (last one: the bonus)."""
    rows = [t for tokens in output_tokens for t in tokens[:-1]]
    logits = torch.full((len(rows), vocab_size), -100.0)
    logits[torch.arange(len(rows)), torch.tensor(rows, dtype=torch.long)] = 100.0
    if override:
        logits[:, override] = 99.0
    return logits


def _metadata(all_greedy: bool, temperature=None, generators=None):
    return SimpleNamespace(all_greedy=all_greedy, all_random=not all_greedy, generators=generators or {},
                           temperature=None if all_greedy else temperature)


def _greedy(spec_tokens, output_tokens, **kw):
    flat, counts, width, cu = _spec(spec_tokens)
    logits = _logits(output_tokens)
    bonus = torch.tensor([[t[-1]] for t in output_tokens])
    return rejection_sample(flat, counts, width, cu, None, logits, bonus, _metadata(True), **kw)


# ---------------------------------------------------------------------------------------------- greedy tables
GREEDY_TABLE = [  # (spec_tokens, output_tokens, expected): vLLM's greedy tests, in their order
    ([[1, 2, 3]], [[1, 2, 3, 4]], [[1, 2, 3, 4]]),  # test_perfect_match
    ([[1, 2, 3]], [[1, 5, 3, 4]], [[1, 5, -1, -1]]),  # test_early_mismatch
    ([[1, 2], [3]], [[1, 2, 5], [3, 4]], [[1, 2, 5], [3, 4, -1]]),  # test_multiple_sequences
    ([[1]], [[1, 2]], [[1, 2]]),  # test_single_token_sequence
    ([[]], [[5]], [[5]]),  # test_empty_sequence
    ([[1, 2, 3], [4, 5, 6]], [[1, 2, 7, 6], [4, 8, 6, 9]], [[1, 2, 7, -1], [4, 8, -1, -1]]),  # multiple mismatches
    ([[1, 2]], [[1, 2, 3]], [[1, 2, 3]]),  # test_parametrized_cases: perfect match with bonus
    ([[1]], [[2, 3]], [[2, -1]]),  # first mismatch
    ([[1, 2], [3, 4]], [[1, 5, 6], [3, 4, 7]], [[1, 5, -1], [3, 4, 7]]),  # mixed matches
]


@pytest.mark.parametrize("spec_tokens, output_tokens, expected", GREEDY_TABLE)
def test_vllm_greedy_tables(spec_tokens, output_tokens, expected):
    out = _greedy(spec_tokens, output_tokens)
    assert out.dtype == torch.int32
    assert out.tolist() == expected


@pytest.mark.parametrize("rule", ["strict", "csd"])
def test_greedy_rows_are_the_argmax_under_every_rule(rule):
    """Temperature 0 makes p one-hot: H = 0 and TVD(p, q) = 1 where a draft differs, so csd's bonus never applies."""
    out = _greedy([[1, 2, 3], [4, 5, 6]], [[1, 2, 7, 6], [4, 8, 6, 9]], rule=rule)
    assert out.tolist() == [[1, 2, 7, -1], [4, 8, -1, -1]]


def test_vllm_bad_words_and_allowed_token_ids_cases():
    """vLLM's test_bad_words and test_allowed_token_ids: the logits after its processors (-inf on the banned or
    disallowed tokens; create_logits_tensor's override token 15 at 99), vLLM's expected tokens."""
    logits = _logits([[1, 2, 3, 4], [1, 15, 3, 4], [1, 2, 3, 4]], override=15)
    logits[1, 2] = logits[7, 2] = float("-inf")  # bad word [2] after the prefix [..., 1] in requests 0 and 2
    flat, counts, width, cu = _spec([[1, 2, 3], [1, 15, 3], [1, 2, 3]])
    out = rejection_sample(flat, counts, width, cu, None, logits, torch.tensor([[4], [4], [4]]), _metadata(True))
    assert out.tolist() == [[1, 15, -1, -1], [1, 15, 3, 4], [1, 15, -1, -1]]

    logits = _logits([[1, 2, 10, 5], [10, 5, 10, 5], [7, 10, 12, 5]], override=15)
    for request, banned in ((0, range(0, 5)), (2, range(2, 7))):  # create_allowed_token_ids: even requests only
        logits[3 * request:3 * request + 3, list(banned)] = float("-inf")
    flat, counts, width, cu = _spec([[1, 2, 10], [10, 5, 3], [7, 10, 12]])
    out = rejection_sample(flat, counts, width, cu, None, logits, torch.tensor([[5], [5], [5]]), _metadata(True))
    assert out.tolist() == [[15, -1, -1, -1], [10, 5, 10, -1], [7, 10, 12, 5]]


# ---------------------------------------------------------------------------------------------- random rows
@pytest.mark.parametrize("k", [1, 3, 5])
@pytest.mark.parametrize("batch_size", [1, 4, 8])
@pytest.mark.parametrize("frac_seeded", [0.0, 0.5])
def test_vllm_deterministic_when_seeded(k, batch_size, frac_seeded):
    """vLLM's test_deterministic_when_seeded (vocab 1000, 20 repetitions): rows with a generator repeat exactly."""
    torch.manual_seed(k * 100 + batch_size)
    vocab, reps = 1000, 20
    target_logits = torch.rand(batch_size * k, vocab)
    bonus = torch.randint(0, vocab, (batch_size, 1))
    drafts = torch.randint(0, vocab, (batch_size, k))
    seeded = torch.rand(batch_size) <= frac_seeded
    results = []
    for _ in range(reps):
        generators = {i: torch.Generator().manual_seed(i) for i in range(batch_size) if seeded[i]}
        flat, counts, width, cu = _spec(drafts.tolist())
        results.append(rejection_sample(flat, counts, width, cu, None, target_logits, bonus,
                                        _metadata(False, torch.ones(batch_size), generators)))
    for i in range(batch_size):
        if seeded[i]:
            assert all(torch.equal(r[i], results[0][i]) for r in results[1:])
    if not seeded.any() and batch_size * k >= 8:
        assert any(not torch.equal(r, results[0]) for r in results[1:])  # unseeded rows do vary


def test_a_seeded_request_does_not_depend_on_its_place_in_the_batch():
    torch.manual_seed(0)
    logits, drafts = torch.randn(6, 50), [[1, 2, 3], [4, 5, 6]]
    flat, counts, width, cu = _spec(drafts)
    both = rejection_sample(flat, counts, width, cu, None, logits, torch.tensor([[7], [8]]),
                            _metadata(False, torch.ones(2), {1: torch.Generator().manual_seed(3)}))
    flat, counts, width, cu = _spec(drafts[1:])
    alone = rejection_sample(flat, counts, width, cu, None, logits[3:], torch.tensor([[8]]),
                             _metadata(False, torch.ones(1), {0: torch.Generator().manual_seed(3)}))
    assert torch.equal(both[1], alone[0])


def _estimate_pdf(draft_probs, target_logits, k, vocab, samples, seed=0):
    """vLLM's estimate_rejection_sampling_pdf: `samples` requests of k drafts from draft_probs, the histogram of
    the first k output columns (the -1 placeholders fall outside the range)."""
    torch.manual_seed(seed)
    q = draft_probs.reshape(1, 1, vocab).repeat(samples, k, 1)
    drafts = torch.multinomial(q[:, 0, :], num_samples=k, replacement=True).reshape(samples, k)
    flat, counts, width, cu = _spec(drafts.tolist())
    out = rejection_sample(flat, counts, width, cu, q.view(samples * k, vocab),
                           target_logits.reshape(1, vocab).repeat(samples * k, 1),
                           torch.zeros(samples, 1, dtype=torch.int64), _metadata(False, torch.ones(samples)))
    return out, torch.histogram(out[:, :-1].flatten().float(), bins=vocab, range=(0, vocab), density=True).hist


def test_vllm_rejection_sampling_approximates_target_distribution():
    """vLLM's test: as the sample grows, the distance to the target shrinks >20x more than to random references."""
    torch.manual_seed(0)
    vocab, k = 10, 2
    draft_probs = F.softmax(torch.rand(vocab), dim=-1)
    target_logits = torch.rand(vocab)
    target_probs = F.softmax(target_logits, dim=-1)
    reference = F.softmax(torch.rand(100, vocab), dim=-1)
    to_target, to_reference = [], []
    for samples in (10, 100, 1_000, 10_000, 100_000):
        _, pdf = _estimate_pdf(draft_probs, target_logits, k, vocab, samples)
        to_reference.append(torch.dist(reference, pdf).item() / reference.shape[0])
        to_target.append(torch.dist(target_probs, pdf).item())
    assert to_target[0] / to_target[-1] > 20 * (to_reference[0] / to_reference[-1])


@pytest.mark.parametrize("rule", ["strict", "csd"])
def test_first_output_token_has_the_rules_law_chi2(rule):
    """The exact law of the first emitted token (drafts from q, one per request): p under strict (vLLM's law);
    under csd out = q·a + (1 − Σq·a)·r with a = min(1, p/q + λH) where TVD(p, q) < τ and r = norm(max(p − q, 0)).
    40 000 requests, chi-square with 9 df at alpha 1e-4 (critical 33.7); the csd law is 0.09+ away from p in L1,
    which puts the strict law's chi-square near 300 here: either law is told from the other."""
    from scipy.stats import chi2

    torch.manual_seed(1)
    vocab, samples = 10, 40_000
    q = F.softmax(torch.randn(vocab), -1)
    logits = torch.randn(vocab) * 0.3
    p = F.softmax(logits, -1)
    h, tvd = -(p * p.log()).sum(), 0.5 * (p - q).abs().sum()
    a = torch.clamp(p / q + (0.5 * h if (rule == "csd" and tvd < 0.65) else 0.0), max=1.0)
    residual = (p - q).clamp(min=0)
    law = (q * a + (1 - (q * a).sum()) * residual / residual.sum()).double()
    assert torch.allclose(law, p.double(), atol=1e-6) if rule == "strict" else (law - p).abs().sum() > 0.09
    drafts = torch.multinomial(q.repeat(samples, 1), 1, generator=torch.Generator().manual_seed(2))
    flat, num, width, cu = _spec(drafts.tolist())
    torch.manual_seed(3)  # the requests' Philox seeds come from the default generator
    out = rejection_sample(flat, num, width, cu, q.repeat(samples, 1), logits.repeat(samples, 1),
                           torch.zeros(samples, 1, dtype=torch.int64), _metadata(False, torch.ones(samples)), rule=rule)
    counts = torch.bincount(out[:, 0].long(), minlength=vocab).double()
    stat = ((counts - samples * law) ** 2 / (samples * law)).sum().item()
    assert stat < chi2.ppf(1 - 1e-4, vocab - 1), stat


@pytest.mark.parametrize("top_k", [1, 5, 99])
def test_vllm_top_k(top_k):
    """vLLM's test_top_k: 100 requests x 3 drafts, uniform logits + 0.1 on the top-k; after vLLM's top-k (-inf
    elsewhere) every emitted draft-position token is in the top-k."""
    torch.manual_seed(top_k)
    vocab, batch, k = 100, 100, 3
    top = torch.stack([torch.randperm(vocab)[:top_k] for _ in range(batch * k)])
    logits = torch.zeros(batch * k, vocab)
    logits.scatter_(1, top, 0.1)
    masked = logits.masked_fill(logits < logits.topk(top_k, -1).values[:, -1:], float("-inf"))
    _check_masked(masked, top, batch, k, vocab)


@pytest.mark.parametrize("top_p", [0.5, 0.9, 0.99])
def test_vllm_top_p(top_p):
    torch.manual_seed(int(top_p * 100))
    vocab, batch, k = 100, 100, 3
    logits = torch.randn(batch * k, vocab)
    sorted_logits, order = logits.sort(-1)
    mask = sorted_logits.softmax(-1).cumsum(-1) <= 1 - top_p
    mask[:, -1] = False
    allowed = [order[i][~mask[i]].tolist() for i in range(batch * k)]
    masked = logits.clone()
    for i in range(batch * k):
        banned = sorted(set(range(vocab)) - set(allowed[i]))
        masked[i, banned] = float("-inf")
    _check_masked(masked, allowed, batch, k, vocab)


def _check_masked(target_logits, allowed, batch, k, vocab):
    q = F.softmax(torch.rand(batch * k, vocab), -1)
    drafts = torch.multinomial(q, 1).reshape(batch, k)
    flat, counts, width, cu = _spec(drafts.tolist())
    out = rejection_sample(flat, counts, width, cu, q, target_logits, torch.zeros(batch, 1, dtype=torch.int64),
                           _metadata(False, torch.ones(batch)))
    for i, token in enumerate(out[:, :-1].flatten().tolist()):
        if token != PLACEHOLDER_TOKEN_ID:
            assert token in list(allowed[i]), (i, token)


def test_vllm_placeholder_draft_token_rejected_random():
    vocab = 100
    flat, counts, width, cu = _spec([[1, vocab - 1, PLACEHOLDER_TOKEN_ID]])
    logits = _logits([[1, vocab - 1, 7, 9]], vocab)
    out = rejection_sample(flat, counts, width, cu, None, logits, torch.tensor([[9]]),
                           _metadata(False, torch.ones(1), {0: torch.Generator().manual_seed(0)}))
    assert out[0, :2].tolist() == [1, vocab - 1] and 0 <= int(out[0, 2]) < vocab and int(out[0, 3]) == -1


def test_mixed_batch_greedy_and_random_rows_and_ragged_counts():
    """Greedy rows (temperature 0) take the argmax path, random rows the sampled one, in one call; a request with no
    drafts gets its bonus token; max_spec_len wider than the drafts pads with -1."""
    logits = _logits([[1, 2, 9], [4, 8]])
    flat, counts, _, cu = _spec([[1, 2], [], [4]])
    logits = torch.cat([logits[:2], logits[2:]])
    out = rejection_sample(flat, counts, 4, cu, None, logits, torch.tensor([[9], [6], [5]]),
                           SimpleNamespace(all_greedy=False, all_random=False, generators={},
                                           temperature=torch.tensor([0.0, 1.0, 1.0])))
    assert out.tolist() == [[1, 2, 9, -1, -1], [6, -1, -1, -1, -1], [4, 5, -1, -1, -1]]


def test_bad_input_raises_naming_the_argument():
    flat, counts, width, cu = _spec([[1, 2]])
    logits, bonus, meta = torch.randn(2, 10), torch.tensor([[3]]), _metadata(True)
    cases = [
        (dict(draft_token_ids=flat.float()), "draft_token_ids"),
        (dict(num_draft_tokens=[3]), "num_draft_tokens sums to 3"),
        (dict(max_spec_len=1), "max_spec_len"),
        (dict(target_logits=torch.randn(3, 10)), "target_logits"),
        (dict(draft_probs=torch.rand(2, 9)), "draft_probs"),
        (dict(bonus_token_ids=torch.tensor([[3], [4]])), "bonus_token_ids"),
    ]
    base = dict(draft_token_ids=flat, num_draft_tokens=counts, max_spec_len=width, cu_num_draft_tokens=cu,
                draft_probs=None, target_logits=logits, bonus_token_ids=bonus, sampling_metadata=meta)
    for change, message in cases:
        with pytest.raises(ValueError, match=message):
            rejection_sample(**{**base, **change})
    with pytest.raises(ValueError, match="NaN"):
        rejection_sample(**{**base, "target_logits": torch.full((2, 10), float("nan"))})
    with pytest.raises(NotImplementedError, match="synthetic"):
        rejection_sample(**base, synthetic_mode=True)
    with pytest.raises(ValueError, match="rule"):
        rejection_sample(**base, rule="no-such-rule")


# ---------------------------------------------------------------------------------------------- the plugin
def _fake_vllm(monkeypatch):
    """vLLM 0.33's modules (both runners) in sys.modules with recording functions of vLLM's signatures: V1's module
    and the calls that reached any of vLLM's functions."""
    from test_integration_vllm_mrv2 import _fake_vllm as fake_both

    modules, calls = fake_both(monkeypatch)
    return modules[adapter.V1_MODULE], calls


def test_the_plugin_is_off_unless_the_variable_names_a_rule(monkeypatch):
    module, _ = _fake_vllm(monkeypatch)
    original = module.rejection_sample
    for value in (None, "", "0", "off"):
        if value is None:
            monkeypatch.delenv(adapter.PLUGIN_ENV, raising=False)
        else:
            monkeypatch.setenv(adapter.PLUGIN_ENV, value)
        adapter.register()
        assert module.rejection_sample is original
    monkeypatch.setenv(adapter.PLUGIN_ENV, "csd")
    adapter.register()
    adapter.register()  # idempotent: vLLM may load plugins again in a process
    assert module.rejection_sample is not original and module.rejection_sample.csd_kernels_original is original


def test_the_plugin_serves_vllms_call_and_leaves_synthetic_and_fly_to_vllm(monkeypatch):
    module, calls = _fake_vllm(monkeypatch)
    monkeypatch.setenv(adapter.PLUGIN_ENV, "1")
    adapter.register()
    flat, counts, width, cu = _spec([[1, 2, 3]])
    vllm_keywords = dict(synthetic_mode=False, synthetic_conditional_rates=None, use_fp64_gumbel=False,
                         fly_window_size=None, fly_entropy_threshold=None, fly_entropy_top_k=3)
    out = module.rejection_sample(flat, counts, width, cu, None, _logits([[1, 5, 3, 4]]), torch.tensor([[4]]),
                                  _metadata(True), **vllm_keywords)
    assert out.tolist() == [[1, 5, -1, -1]] and calls == []
    assert module.rejection_sample(flat, counts, width, cu, None, None, None, None,
                                   **{**vllm_keywords, "fly_window_size": 2}) == "vllm's own"
    assert module.rejection_sample(flat, counts, width, cu, None, None, None, None,
                                   **{**vllm_keywords, "synthetic_mode": True}) == "vllm's own"
