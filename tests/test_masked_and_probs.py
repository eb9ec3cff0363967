"""−inf masks, target probabilities, top-p / min-p and the input checks of verify, on every backend.

Every backend is held to reference.verify (float32) with testing.compare; the Triton backend runs through its
interpreter on CPU, with the plan forced onto each of its three paths (small vocabularies, several blocks per row).
Exact laws and χ² tests run on the torch and C++ backends (the fast ones).
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
from scipy.stats import chisquare  # noqa: E402

import csd_kernels as ck  # noqa: E402
from csd_kernels import reference as ref  # noqa: E402
from csd_kernels.ops.registry import available_backends  # noqa: E402
from csd_kernels.testing import compare, make_case, reference_result, rule_inputs  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy's inf − inf inside Triton's interpreter

RUNNABLE = available_backends("cpu")
# Triton's interpreter runs every block op in numpy: its cases are fewer and smaller (few programs, few options).
FAST = [b for b in ("torch", "cpu") if b in RUNNABLE]
TRITON_PATHS = ["triton-split", "triton-register", "triton-chunked"] if "triton" in RUNNABLE else []
NINF = float("-inf")


def _forced_plan(path: str, vocab: int):
    from csd_kernels.backends.triton import verify as tv

    if path == "register":
        block = max(16, 1 << (vocab - 1).bit_length())
        return tv.Plan("register", block, tv.register_num_warps(block))
    block = max(16, (1 << max(1, vocab // 3).bit_length()) // 2)  # three or four blocks per row
    return tv.Plan(path, block, 4)


def run(backend: str, **kwargs) -> ref.VerifyResult:
    """verify on ``backend``; "triton-<path>" forces the Triton plan onto that path."""
    kwargs.setdefault("validate", False)
    if not backend.startswith("triton-"):
        return ck.verify(backend=backend, **kwargs)
    from csd_kernels.backends.triton import verify as tv

    target = kwargs.get("target_logits") if kwargs.get("target_logits") is not None else kwargs["target_probs"]
    plan = _forced_plan(backend.split("-")[1], target.shape[-1])
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tv, "plan", lambda *a, **k: plan)
        return ck.verify(backend="triton", **kwargs)


def masked_case(batch, length, vocab, *, seed=0, fraction=0.3, **case_kw) -> dict:
    """make_case with about ``fraction`` of the cond logits and half that of the uncond logits set to −inf."""
    case = make_case(batch, length, vocab, seed=seed, **case_kw)
    g = torch.Generator().manual_seed(seed + 1)
    cond = case["target_logits"]
    case["target_logits"] = cond.masked_fill(torch.rand(cond.shape, generator=g) < fraction, NINF)
    if case["uncond_logits"] is not None:
        uncond = case["uncond_logits"]
        case["uncond_logits"] = uncond.masked_fill(torch.rand(uncond.shape, generator=g) < fraction / 2, NINF)
    return case


def probs_case(batch, length, vocab, *, seed=0, zeros=0.3, **case_kw) -> dict:
    """make_case with target_probs (a softmax with about ``zeros`` of the entries set to 0, renormalised)."""
    case = make_case(batch, length, vocab, seed=seed, cfg=False, **case_kw)
    g = torch.Generator().manual_seed(seed + 1)
    w = torch.softmax(case.pop("target_logits").float(), -1)
    w = w.masked_fill(torch.rand(w.shape, generator=g) < zeros, 0.0)
    w[..., 0] += (w.sum(-1) == 0).float()
    case.update(target_probs=w / w.sum(-1, keepdim=True), uncond_logits=None)
    return case


def interpreted(backend: str) -> bool:
    return backend.startswith("triton-")


def check_against_reference(backend, case, **options):
    expected = reference_result({**case, "target_logits": case.get("target_logits")}, **options)
    got = run(backend, **case, **options)
    compare(got, expected)
    return got, expected


# ----------------------------------------------------------------------------------------------------------------------
# The reference's definitions, by hand
# ----------------------------------------------------------------------------------------------------------------------
def test_mixed_logits_mask_instead_of_nan():
    c = torch.tensor([[1.0, NINF, 2.0, NINF, float("nan"), float("inf")]])
    u = torch.tensor([[0.0, 1.0, NINF, NINF, NINF, 0.0]])
    z = ref.mixed_logits(c, u, cfg_scale=3.0)
    assert z[0, :4].tolist() == [3.0, NINF, NINF, NINF]  # −inf in either half masks; two −inf give −inf, not NaN
    assert torch.isnan(z[0, 4:]).all()  # NaN and +inf stay bad input, even next to a −inf
    assert ref.mixed_logits(torch.tensor([[NINF, 1.0]]), torch.tensor([[0.0, 0.0]]), cfg_scale=0.0)[0, 0] == NINF


def test_top_p_and_min_p_thresholds_keep_ties():
    z = torch.tensor([[2.0, 0.0, 2.0, 1.0, 1.0, NINF, 0.0]])
    e = torch.exp(z - 2.0)
    mass = lambda keep: float(e[0, keep].sum() / e.sum())  # noqa: E731
    kept = lambda t: torch.isfinite(t)[0].tolist()  # noqa: E731
    top2 = [True, False, True, False, False, False, False]
    top4 = [True, False, True, True, True, False, False]
    assert kept(ref.restrict_top_p(z, 0.3)) == top2  # the first 2 already holds 0.3: its tie (the other 2) is kept
    assert kept(ref.restrict_top_p(z, mass([0, 2]))) == top2  # exactly the mass of the top pair
    assert kept(ref.restrict_top_p(z, mass([0, 2]) + 1e-4)) == top4  # one 1 more is needed: both 1s are kept
    assert kept(ref.restrict_top_p(z, 1.0)) == [True, True, True, True, True, False, True]
    assert kept(ref.restrict_min_p(z, float(torch.exp(torch.tensor(-1.0))))) == top4  # p ≥ min_p·max p, ties kept
    assert kept(ref.restrict_min_p(z, 0.5)) == top2


def test_support_and_acceptance_of_a_masked_draft():
    logits = torch.tensor([[[0.0, NINF, 0.0, 0.0]]])
    target = ref.target_distribution(logits, None, 1.0, 1.0, None, torch.float32)
    assert target.support[0, 0].tolist() == [True, False, True, True] and target.p[0, 0, 1] == 0
    res = ref.verify(logits, torch.tensor([[1]]), torch.full((1, 1, 4), 0.25), rule="csd", entropy_coef=100.0,
                     tvd_threshold=1.0, start=torch.zeros(1), positions=torch.zeros(1), seed=torch.tensor([0]),
                     offset=torch.tensor([0]))
    assert res.accept_prob.item() == 0 and res.accept_len.item() == 0 and res.tokens.item() != 1


# ----------------------------------------------------------------------------------------------------------------------
# Every backend against the reference
# ----------------------------------------------------------------------------------------------------------------------
OPTIONS = [
    dict(),
    dict(coupling="maximal", cfg_scale=3.0),
    dict(coupling="gumbel", rule="strict"),
    dict(temperature=0.0, coupling="gumbel"),
    dict(top_k=5, coupling="gumbel"),
    dict(top_p=0.8),
    dict(min_p=0.05, coupling="maximal"),
    dict(top_k=20, top_p=0.6, min_p=0.01, coupling="gumbel"),
]
WHOLE_ROW = ("top_k", "top_p", "min_p")  # restrictions the Triton plan never splits


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()) or "plain")
@pytest.mark.parametrize("q", ["jacobi", None])  # jacobi: q near p, the csd gate open
@pytest.mark.parametrize("backend", FAST + TRITON_PATHS)
def test_masked_logits_match_reference(backend, q, options):
    if backend == "triton-split" and any(k in options for k in WHOLE_ROW):
        pytest.skip("the plan sends top-k / top-p / min-p to the per-position paths")
    if interpreted(backend) and q is None and options not in (OPTIONS[0], OPTIONS[5]):
        pytest.skip("the interpreter runs one-hot drafts with the plain and top-p options only")
    options = {"cfg_scale": 2.0, **options}
    case = masked_case(2, 3, 33, q=q, favourite=0.3) if backend in FAST else masked_case(1, 2, 40, q=q, favourite=0.5)
    check_against_reference(backend, case, **options)


@pytest.mark.parametrize("vocab", [33, 1023, 1024, 1025, 4097])
@pytest.mark.parametrize("backend", FAST)
def test_tile_boundary_vocabularies(backend, vocab):
    case = masked_case(2, 4, vocab, q="sparse", favourite=0.2, seed=vocab)
    for options in (dict(), dict(top_p=0.9, coupling="gumbel"), dict(min_p=0.02, top_k=100, coupling="maximal")):
        check_against_reference(backend, case, cfg_scale=2.0, **options)


@pytest.mark.parametrize("backend", FAST)
def test_large_vocabulary(backend):
    case = masked_case(1, 2, 32001, q="dense", favourite=0.5, seed=5)
    check_against_reference(backend, case, cfg_scale=2.0, top_p=0.9, min_p=0.001, coupling="gumbel")


@pytest.mark.parametrize("backend", FAST + TRITON_PATHS)
def test_top_p_and_min_p_ties_match_reference(backend):
    if backend == "triton-split":
        pytest.skip("the plan sends top-p / min-p to the per-position paths")
    shape = (1, 3, 30) if interpreted(backend) else (3, 4, 30)
    case = make_case(*shape, int_logits=True, favourite=0.4, seed=3)  # many exact ties, ±0
    for options in (dict(top_p=0.5), dict(top_p=0.95, top_k=8, coupling="gumbel"), dict(min_p=0.3),
                    dict(min_p=float(torch.exp(torch.tensor(-1.0))), coupling="maximal")):
        check_against_reference(backend, case, cfg_scale=2.0, **options)


@pytest.mark.parametrize("coupling", ref.COUPLINGS)
@pytest.mark.parametrize("q", ["dense", "uniform", None])
@pytest.mark.parametrize("backend", FAST + [p for p in TRITON_PATHS if p != "triton-split"])
def test_target_probs_match_reference(backend, q, coupling):
    shape = (1, 2, 37) if interpreted(backend) else (2, 3, 37)
    check_against_reference(backend, probs_case(*shape, q=q, favourite=0.3), coupling=coupling)


@pytest.mark.parametrize("backend", FAST + TRITON_PATHS)
def test_bad_rows_are_flagged_like_the_reference(backend):
    case = make_case(4, 3, 20, q="dense", seed=2)
    cond, uncond, q = case["target_logits"].clone(), case["uncond_logits"].clone(), case["draft_probs"].clone()
    cond[0, 1, 3] = float("nan")
    uncond[1, 0, 4] = float("inf")
    cond[1, 0, 4] = NINF  # +inf next to a −inf mask is still bad input
    cond[2, 2] = NINF  # no finite logit
    q[3, 1] *= 0.5  # a q row summing to 0.5
    case.update(target_logits=cond, uncond_logits=uncond, draft_probs=q)
    got, _ = check_against_reference(backend, case, cfg_scale=2.0)
    assert got.status.tolist() == [ref.STATUS_BAD_LOGITS] * 3 + [ref.STATUS_BAD_DRAFT_PROBS]


@pytest.mark.parametrize("backend", FAST + TRITON_PATHS)
def test_q_rows_count_only_where_a_draft_is_tested(backend):
    """At an undrafted position (draft −1) the q row decides nothing, so whatever it holds — a zero row (how
    FlashInfer's / vLLM's bonus slot is padded), half a distribution, a NaN, a negative entry — the row is not
    reported and its tokens and decisions are those of a valid q row there (its tvd is ½, the zero vector's). A bad q
    row where a draft is tested is still reported and refused."""
    case = make_case(5, 3, 20, q="dense", seed=5, favourite=0.5)
    drafts = case["draft_tokens"].clone()
    drafts[:, :2] = drafts[:, :2].clamp(min=0)
    drafts[:, 2] = -1  # the bonus slot
    valid_q = case["draft_probs"]
    q = valid_q.clone()
    q[0, 2] = 0.0
    q[1, 2] *= 0.5
    q[2, 2, 3] = float("nan")
    q[3, 2, 4] = -0.1
    q[4, 1] *= 0.5  # a tested draft's q row: still bad
    case.update(draft_tokens=drafts, draft_probs=q)
    got, _ = check_against_reference(backend, case, cfg_scale=2.0)
    assert got.status.tolist() == [0, 0, 0, 0, ref.STATUS_BAD_DRAFT_PROBS]
    torch.testing.assert_close(got.tvd[:4, 2], torch.full((4,), 0.5))
    same = run(backend, **{**case, "draft_probs": valid_q}, cfg_scale=2.0)
    for name in ("tokens", "accept_len", "accept_prob", "distortion"):
        assert torch.equal(getattr(got, name)[:4], getattr(same, name)[:4]), name
    rows = {k: (v[:4] if isinstance(v, torch.Tensor) and v.shape[0] == 5 else v) for k, v in case.items()}
    run(backend, **rows, cfg_scale=2.0, validate=True)  # no error
    with pytest.raises(ValueError, match=r"draft_probs must be finite, non-negative and sum to 1.*rows \[4\]"):
        run(backend, **case, cfg_scale=2.0, validate=True)


# ----------------------------------------------------------------------------------------------------------------------
# Laws and properties
# ----------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("coupling", ref.COUPLINGS)
@pytest.mark.parametrize("backend", FAST + TRITON_PATHS)
def test_masked_vocabulary_is_the_sliced_vocabulary(backend, coupling):
    """−inf on the tail [V', V) gives the distribution, statistics and tokens of the vocabulary [0, V')."""
    kept, vocab = 23, 40
    batch, length = (1, 3) if interpreted(backend) else (2, 4)
    case = make_case(batch, length, vocab, q="dense", favourite=0.4, seed=7)
    sliced = make_case(batch, length, kept, q="dense", seed=7)
    for name in ("target_logits", "uncond_logits"):
        sliced[name] = case[name][..., :kept].contiguous()
        case[name] = torch.cat([sliced[name], torch.full((batch, length, vocab - kept), NINF)], -1)
    sliced["draft_probs"] = torch.softmax(torch.randn(batch, length, kept), -1)
    case["draft_probs"] = torch.cat([sliced["draft_probs"], torch.zeros(batch, length, vocab - kept)], -1)
    sliced["draft_tokens"] = case["draft_tokens"] = case["draft_tokens"].clamp(-1, kept - 1)
    for name in ("start", "positions", "seed", "offset"):
        sliced[name] = case[name]
    full = run(backend, **case, cfg_scale=2.0, coupling=coupling)
    small = run(backend, **sliced, cfg_scale=2.0, coupling=coupling)
    assert torch.equal(full.tokens, small.tokens) and torch.equal(full.accept_len, small.accept_len)
    assert (full.probs[..., kept:] == 0).all()
    torch.testing.assert_close(full.probs[..., :kept], small.probs, rtol=1e-5, atol=1e-7)
    for name in ("entropy", "tvd", "accept_prob", "distortion"):
        torch.testing.assert_close(getattr(full, name), getattr(small, name), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backend", FAST + TRITON_PATHS)
def test_masked_drafts_are_always_rejected(backend):
    """A draft whose logit is −inf (or that top-k cuts) is rejected under the csd rule with a huge λ and the gate
    open, and never drawn."""
    vocab, rows = 16, 4 if interpreted(backend) else 64
    logits = torch.zeros(rows, 1, vocab)
    logits[..., 5] = NINF
    drafts = torch.full((rows, 1), 5)
    q = torch.full((rows, 1, vocab), 1.0 / vocab)
    res = run(backend, target_logits=logits, draft_tokens=drafts, draft_probs=q, rule="csd", entropy_coef=50.0,
              tvd_threshold=1.0, seed=3)
    assert (res.accept_prob == 0).all() and (res.accept_len == 0).all() and (res.tokens != 5).all()
    if backend != "triton-split":
        logits = torch.arange(vocab, dtype=torch.float32).expand(rows, 1, vocab).contiguous()
        res = run(backend, target_logits=logits, draft_tokens=torch.full((rows, 1), 2), draft_probs=q, rule="csd",
                  entropy_coef=50.0, tvd_threshold=1.0, top_k=4, seed=3)
        assert (res.accept_prob == 0).all() and (res.accept_len == 0).all() and (res.tokens >= vocab - 4).all()


@pytest.mark.parametrize("rule", ref.RULES)
@pytest.mark.parametrize("backend", FAST + TRITON_PATHS)
def test_disjoint_supports_reject_everything(backend, rule):
    if rule == "gsd" and backend in ("triton-split", "triton-chunked"):
        pytest.skip("Triton runs gsd on the register path only (its row sorted in one program)")
    batch, length, vocab = (3, 2, 20) if interpreted(backend) else (32, 3, 20)
    logits = torch.randn(batch, length, vocab).masked_fill(torch.arange(vocab) >= 10, NINF)  # p on [0, 10)
    q = torch.softmax(torch.randn(batch, length, vocab), -1).masked_fill(torch.arange(vocab) < 10, 0.0)
    q = q / q.sum(-1, keepdim=True)  # q on [10, 20)
    drafts = torch.multinomial(q.reshape(-1, vocab), 1).reshape(batch, length)
    res = run(backend, target_logits=logits, draft_tokens=drafts, draft_probs=q, rule=rule, tvd_threshold=1.0,
              entropy_coef=10.0, seed=1, **rule_inputs(rule, vocab))
    assert (res.accept_len == 0).all() and (res.tokens < 10).all()
    assert (res.distortion == 0).all() and torch.allclose(res.tvd, torch.ones_like(res.tvd))


@pytest.mark.parametrize("backend", FAST + [p for p in TRITON_PATHS if p != "triton-split"])
def test_a_residual_with_one_nonzero_entry_draws_it(backend):
    p = torch.tensor([0.5, 0.5, 0.0, 0.0, 0.0])
    q = torch.tensor([0.5, 0.25, 0.25, 0.0, 0.0])  # max(p − q, 0) is nonzero at token 1 only
    batch = 4 if interpreted(backend) else 64
    res = run(backend, target_probs=p.expand(batch, 1, 5).contiguous(), draft_tokens=torch.full((batch, 1), 2),
              draft_probs=q.expand(batch, 1, 5), rule="strict", seed=11)
    assert (res.accept_len == 0).all() and (res.tokens == 1).all()


@pytest.mark.parametrize("coupling", ref.COUPLINGS)
@pytest.mark.parametrize("backend", FAST + TRITON_PATHS)
def test_a_one_hot_target_gives_exactly_the_target_tokens(backend, coupling):
    if interpreted(backend) and coupling == "maximal":
        pytest.skip("the interpreter runs the independent and gumbel couplings only")
    batch, length, vocab = (2, 3, 30) if interpreted(backend) else (8, 5, 30)
    target = torch.randint(0, vocab, (batch, length))
    one_hot = torch.nn.functional.one_hot(target, vocab).float()
    drafts = torch.where(torch.rand(batch, length) < 0.5, target, torch.randint(0, vocab, (batch, length)))
    q = torch.softmax(torch.randn(batch, length, vocab), -1)
    inputs = [dict(target_logits=torch.zeros(batch, length, vocab).masked_fill(one_hot == 0, NINF))]
    if backend != "triton-split":
        inputs.append(dict(target_probs=one_hot))
    for target_input in inputs:
        for draft_probs in (None,) if interpreted(backend) else (None, q):
            res = run(backend, **target_input, draft_tokens=drafts, draft_probs=draft_probs, coupling=coupling,
                      rule="csd", entropy_coef=10.0, seed=2)
            assert torch.equal(res.tokens, target)
            first_miss = torch.where(drafts != target, torch.arange(length), length).min(-1).values
            assert torch.equal(res.accept_len.long(), first_miss)


@pytest.mark.parametrize("backend", FAST)
def test_seeded_calls_are_deterministic(backend):
    case = masked_case(4, 6, 300, q="dense")
    options = dict(cfg_scale=2.0, top_p=0.9, min_p=0.01, coupling="gumbel")
    first, again = run(backend, **case, **options), run(backend, **case, **options)
    assert torch.equal(first.tokens, again.tokens) and torch.equal(first.accept_len, again.accept_len)
    other = run(backend, **{**case, "seed": case["seed"] + 1}, **options)
    assert not torch.equal(first.tokens, other.tokens)


def emitted_law_pvalue(backend, options, batch=6000, vocab=12):
    """χ² p-value of the tokens emitted at one verified position (strict rule, drafts from q) against the reference
    p. Row b gets its own stream (one shared seed keys rows by index)."""
    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(vocab, generator=g) * 1.5).masked_fill(torch.arange(vocab) % 5 == 3, NINF)
    q = torch.softmax(torch.randn(vocab, generator=g), -1)
    drafts = torch.multinomial(q, batch, replacement=True, generator=g).reshape(batch, 1)
    res = run(backend, target_logits=logits.expand(batch, 1, vocab), draft_tokens=drafts,
              draft_probs=q.expand(batch, 1, vocab), rule="strict", seed=9, **options)
    p = ref.target_distribution(logits.reshape(1, 1, vocab), None, 1.0, 1.0, options.get("top_k"), torch.float64,
                                options.get("top_p"), options.get("min_p")).p[0, 0]
    counts = torch.bincount(res.tokens[:, 0], minlength=vocab).double()
    assert (counts[p == 0] == 0).all(), "a token outside the support was emitted"
    support = p > 0
    return chisquare(counts[support].numpy(), (p[support] / p[support].sum() * batch).numpy()).pvalue


@pytest.mark.parametrize("options", [dict(), dict(top_p=0.8), dict(min_p=0.1, top_k=6)],
                         ids=["plain", "top_p", "min_p"])
@pytest.mark.parametrize("backend", FAST)
def test_emitted_law_matches_the_target(backend, options):
    """6000 draws over the 3 to 10 tokens of the support: a law that moves 0.03 of probability from one token to
    another fails with power ≥ 0.95 (non-central χ², worst pair of tokens); the false-alarm rate is 1e-3."""
    assert emitted_law_pvalue(backend, options) > 1e-3


# ----------------------------------------------------------------------------------------------------------------------
# Input checks
# ----------------------------------------------------------------------------------------------------------------------
def _small():
    return torch.randn(2, 3, 5), torch.zeros(2, 3, dtype=torch.int64)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (lambda lg, d: dict(target_logits=lg, target_probs=torch.softmax(lg, -1), draft_tokens=d), "exactly one"),
        (lambda lg, d: dict(draft_tokens=d), "exactly one"),
        (lambda lg, d: dict(target_probs=torch.softmax(lg, -1).half(), draft_tokens=d), "target_probs must be"),
        (lambda lg, d: dict(target_probs=torch.softmax(lg, -1)[:, :2], draft_tokens=d), "draft_tokens must have"),
        (lambda lg, d: dict(target_probs=torch.softmax(lg, -1), draft_tokens=d, temperature=0.5), "temperature"),
        (lambda lg, d: dict(target_probs=torch.softmax(lg, -1), draft_tokens=d, top_p=0.5), "top_p"),
        (lambda lg, d: dict(target_logits=lg, draft_tokens=d, top_p=0.0), "top_p"),
        (lambda lg, d: dict(target_logits=lg, draft_tokens=d, top_p=1.5), "top_p"),
        (lambda lg, d: dict(target_logits=lg, draft_tokens=d, min_p=-0.1), "min_p"),
        (lambda lg, d: dict(target_logits=lg, draft_tokens=d, min_p=float("nan")), "min_p"),
        (lambda lg, d: dict(target_logits=lg, draft_tokens=d, top_k=0), "top_k"),
        (lambda lg, d: dict(target_logits=lg, draft_tokens=d, top_k=2.0), "top_k"),
        (lambda lg, d: dict(target_logits=lg, draft_tokens=d, seed=1.5), "seed"),
        (lambda lg, d: dict(target_logits=lg, draft_tokens=d, seed=-1), "seed"),
        (lambda lg, d: dict(target_logits=lg, draft_tokens=d, seed=2**64), "seed"),
        (lambda lg, d: dict(target_logits=lg, draft_tokens=d, offset=2**63), "offset"),
        (lambda lg, d: dict(target_logits=lg, draft_tokens=d, start=4), "start"),
        (lambda lg, d: dict(target_logits=lg, draft_tokens=d, start=-1), "start"),
        (lambda lg, d: dict(target_logits=lg, draft_tokens=d, start=torch.tensor([0, 4])), "start"),
        (lambda lg, d: dict(target_logits=lg, draft_tokens=d, positions=-2), "positions"),
        (lambda lg, d: dict(target_logits=lg, draft_tokens=d, positions=2**63), "positions"),
    ],
)
def test_bad_arguments_name_themselves(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ck.verify(**kwargs(*_small()), backend="torch")


@pytest.mark.parametrize("backend", FAST + (["triton-register"] if TRITON_PATHS else []))
def test_bad_values_raise_with_validate(backend):
    logits, drafts = _small()
    probs = torch.softmax(logits, -1)
    cases = [
        (dict(target_logits=logits.masked_fill(torch.arange(5) < 5, NINF)), "no finite logit"),
        (dict(target_logits=logits.index_put((torch.tensor([1]), torch.tensor([2]), torch.tensor([0])),
                                             torch.tensor(float("nan")))), r"NaN or \+Inf"),
        (dict(target_probs=probs * 1.01), "target_probs must be finite, non-negative and sum to 1"),
        (dict(target_probs=(probs - 0.3).clamp(min=-0.01)), "target_probs must be"),
        (dict(target_logits=logits, draft_probs=probs * 0.5), "draft_probs must be finite, non-negative and sum"),
        (dict(target_logits=logits, draft_probs=probs.masked_fill(torch.arange(5) == 0, -1e-3)), "draft_probs"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ValueError, match=message):
            run(backend, draft_tokens=drafts, validate=True, **kwargs)
    res = run(backend, target_probs=probs * (1 + 5e-4), draft_tokens=drafts, validate=True)  # within the tolerance:
    torch.testing.assert_close(res.probs, probs, rtol=1e-6, atol=1e-7)  # renormalised


@pytest.mark.parametrize("backend", FAST + (["triton-split"] if TRITON_PATHS else []))
def test_int32_and_int64_draft_tokens_agree(backend):
    case = make_case(3, 4, 20, q="dense", seed=4)
    as_int64 = run(backend, **case, cfg_scale=2.0)
    as_int32 = run(backend, **{**case, "draft_tokens": case["draft_tokens"].to(torch.int32)}, cfg_scale=2.0)
    assert torch.equal(as_int64.tokens, as_int32.tokens) and torch.equal(as_int64.accept_len, as_int32.accept_len)
