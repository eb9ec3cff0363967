"""The acceptance rules: one table, written once, and every rule's exact law.

* The table (config/acceptance.py) is what the compiled kernels, the op's schemas, the Triton launchers,
  GenerationConfig and the modes read: the C++ enum's order and parameter counts, the schemas' argument lists
  (backends/spec.py), the config fields, one mode per rule.
* Each rule's a(y) equals a plain-loop transcription of its definition (reference/rules.py's docstring) on small
  vocabularies; the sampler's output law, taken exactly over a fine grid of u_sample, is q·a + (1 − Σq·a)·r with r
  the rule's resampling law; the distortion the op returns is ½Σ|out − p| of that law (0 for strict).
* The compiled backends emit that law (χ² with N = 40,000 rows over V = 7, fixed seeds, passing at p > 1e-3; the
  power statement of tests/test_statistics.py holds: a shift of 0.01 in TVD between two tokens of probability ≈ 0.14
  is detected with probability > 0.99; each relaxed rule's law is also rejected against p, so the relaxation acts).
* Every backend that runs here reproduces reference.verify for every rule: tokens exactly, the statistics to 1e-4.
"""

from __future__ import annotations

import inspect
import math
import re
from pathlib import Path

import pytest
import torch
from scipy.stats import chisquare

import csd_kernels as ck
from csd_kernels import reference as ref
from csd_kernels import testing
from csd_kernels.backends.spec import CHOICES, SETTINGS, TREE_ARGS, VERIFY_ARGS, VerifyArgs
from csd_kernels.config.acceptance import PARAMS, RULES, default_lantern_k, rule_named
from csd_kernels.config.generation import GenerationConfig
from csd_kernels.config.modes import MODE_TABLE
from csd_kernels.config.rules import ArgumentError

BACKENDS = [name for name in ck.available_backends("cpu") if name != "triton"]  # the interpreter: test_triton_kernel
RELAXED = [r.name for r in RULES if not r.lossless]
# parameters under which each rule's relaxation acts on the small laws below
PARAMS_OF = {"strict": {}, "csd": dict(entropy_coef=0.05, tvd_threshold=1.0),
             "gsd": dict(group_rank=2, group_delta=0.15),
             "arsample": {}, "lantern": dict(lantern_delta=0.1), "lantern++": dict(lantern_lambda=2.0)}


def _neighbours(vocab: int, k: int, seed: int = 0) -> torch.Tensor:
    return ref.codebook_neighbours(torch.randn(vocab, 2, generator=torch.Generator().manual_seed(seed)), k)


# ----------------------------------------------------------------------------------------------------------------------
# one table
# ----------------------------------------------------------------------------------------------------------------------
def test_the_compiled_enum_is_the_table():
    """csrc/include/rules.h's enum, by code: the same names in the same order, the same parameter counts and the
    facts the kernels switch on (lossless, residual_qa, the distortion gathered only on request)."""
    ext = pytest.importorskip("csd_kernels._C")
    assert ext.rule_table() == [(r.code, r.name, len(r.params), r.lossless, r.residual_qa, r.distortion_gathers)
                                for r in RULES]


def _schema(op) -> list:
    return [(a.name, str(a.type)) for a in op._schema.arguments]


def _spec(spec) -> list:
    return [(a.name, a.type.replace("float[]", "List[float]").replace("int[]", "List[int]")) for a in spec]


def _schema_of(op) -> list:
    return [(n, t.replace("Optional[Tensor]", "Tensor?")) for n, t in _schema(op)]


def test_the_op_schemas_are_the_argument_spec():
    import csd_kernels.ops  # noqa: F401  (registers the ops)

    assert _schema_of(torch.ops.csd_kernels.verify.default) == _spec(VERIFY_ARGS) + [("backend", "str")]
    assert _schema_of(torch.ops.csd_kernels.verify_tree.default) == _spec(TREE_ARGS) + [("backend", "str")]
    if hasattr(torch.ops.csd_kernels, "verify_rows"):
        assert _schema_of(torch.ops.csd_kernels.verify_rows.default) == _spec(VERIFY_ARGS)
        assert _schema_of(torch.ops.csd_kernels.verify_tree_rows.default) == _spec(TREE_ARGS)


def test_the_ops_take_at_most_twelve_arguments():
    assert len(VERIFY_ARGS) <= 12 and len(TREE_ARGS) <= 12


def _enum(text: str, name: str) -> list:
    """The enumerators of C++ ``enum name : int { ... }`` in ``text``, in order."""
    body = re.search(rf"enum {name} : int {{(.*?)}};", text, re.S).group(1)
    return [item.strip() for item in body.replace("\n", " ").split(",") if item.strip()]


def _cpp_name(prefix: str, name: str) -> str:
    return prefix + "".join(part.capitalize() for part in name.split("_"))


def test_the_compiled_record_index_is_the_spec():
    """csrc/settings.h reads the record by index: its enums are spec.py's SETTINGS and CHOICES, in order."""
    text = (Path(__file__).parent.parent / "csrc" / "settings.h").read_text()
    assert _enum(text, "SettingIndex") == [_cpp_name("kSet", n) for n in SETTINGS] + ["kSetRuleParams"]
    assert _enum(text, "ChoiceIndex") == [_cpp_name("kCho", n) for n in CHOICES] + ["kChoCount"]


def test_the_triton_launchers_take_the_spec():
    pytest.importorskip("triton")
    from csd_kernels.backends.triton.verify import verify_triton
    from csd_kernels.backends.triton.verify_tree import verify_tree_triton

    assert list(inspect.signature(verify_triton).parameters) == ["a", "packed_outputs"]
    assert inspect.signature(verify_triton).parameters["a"].annotation in (VerifyArgs, "VerifyArgs")
    assert list(inspect.signature(verify_tree_triton).parameters) == ["a"]


def test_generation_config_has_each_rule_parameter_once():
    for name, param in PARAMS.items():
        info = GenerationConfig.field_info(name)
        defaults = {r.param(name).default for r in RULES if name in r.param_names()}
        assert info["default"] == (param.default if len(defaults) == 1 else None), name
        assert info["rule"].kind == param.check.kind and (info["rule"].low, info["rule"].high) == (
            param.check.low, param.check.high), name


def test_one_speculative_mode_per_rule():
    by_rule = {}
    for mode in MODE_TABLE.values():
        if mode.rule is not None and mode.window:
            by_rule.setdefault(mode.rule, []).append(mode.name)
    assert by_rule == {r.name: ["sjd" if r.name == "strict" else r.name] for r in RULES}
    assert not MODE_TABLE["gsd"].coupling and not MODE_TABLE["gsd"].tree  # its residual is not the strict one


# ----------------------------------------------------------------------------------------------------------------------
# the op's checks, by the table
# ----------------------------------------------------------------------------------------------------------------------
def _small():
    logits = torch.randn(1, 2, 6, generator=torch.Generator().manual_seed(0))
    return logits, torch.tensor([[1, 2]])


def test_bad_rules_and_parameters_are_named():
    logits, drafts = _small()
    with pytest.raises(ValueError, match="rule='nope': expected one of strict, csd, gsd, arsample, lantern, lantern"):
        ck.verify(logits, drafts, rule="nope")
    with pytest.raises(ArgumentError, match=r"lantern_delta=2: expected a finite number in \[0, 1\]"):
        ck.verify(logits, drafts, rule="lantern", neighbours=_neighbours(6, 3), lantern_delta=2)
    with pytest.raises(ArgumentError, match="group_rank=0"):
        ck.verify(logits, drafts, rule="gsd", group_rank=0)
    with pytest.raises(ArgumentError, match="arsample_scale=0"):
        ck.verify(logits, drafts, rule="arsample", arsample_scale=0)
    with pytest.raises(TypeError, match="lantern_detla"):
        ck.verify(logits, drafts, rule="lantern", lantern_detla=0.1)
    with pytest.raises(ValueError, match="needs neighbours="):
        ck.verify(logits, drafts, rule="lantern++")
    with pytest.raises(ValueError, match=r"neighbours must be an integer tensor \[V, k\] = \[6, k\]"):
        ck.verify(logits, drafts, rule="lantern", neighbours=torch.zeros(5, 2, dtype=torch.int64))
    with pytest.raises(ValueError, match="lantern_k=4 exceeds the neighbour table's width 3"):
        ck.verify(logits, drafts, rule="lantern", neighbours=_neighbours(6, 3), lantern_k=4)
    with pytest.raises(ValueError, match="maximal"):
        ck.verify(logits, drafts, rule="gsd", coupling="maximal")
    ck.verify(logits, drafts, rule="strict", lantern_delta=0.5, group_rank=3)  # other rules' parameters are ignored


def test_codebook_neighbours_is_nearest_first_without_itself():
    codebook = torch.tensor([[0.0], [1.0], [3.0], [3.5], [10.0]])
    table = ck.codebook_neighbours(codebook, 2)
    assert table.tolist() == [[1, 2], [0, 2], [3, 1], [2, 1], [3, 2]]
    with pytest.raises(ValueError, match=r"k must be an int in \[1, V - 1\] = \[1, 4\]"):
        ck.codebook_neighbours(codebook, 5)
    with pytest.raises(ValueError, match="codebook must be a floating-point tensor"):
        ck.codebook_neighbours(torch.zeros(5, 2, dtype=torch.int64), 2)


# ----------------------------------------------------------------------------------------------------------------------
# exact laws on small vocabularies
# ----------------------------------------------------------------------------------------------------------------------
def naive_a(rule: str, p: list, q: list, y: int, params: dict, neighbours=None) -> float:
    """a(y) transcribed from reference/rules.py's docstring, in plain Python (float64)."""
    if q[y] <= 0 or p[y] <= 0:
        return 0.0
    ratio = p[y] / q[y]
    h = -sum(x * math.log(x) for x in p if x > 0)
    if rule == "csd":
        tvd = 0.5 * sum(abs(a - b) for a, b in zip(p, q))
        return min(1.0, ratio + params["entropy_coef"] * h if tvd < params["tvd_threshold"] else ratio)
    if rule == "arsample":
        s = min(1.0, max(0.0, h / params["arsample_scale"] + params["arsample_offset"]))
        return 1.0 if s == 0 else min(1.0, min(1.0, ratio) / s)
    if rule in ("lantern", "lantern++"):
        limit = params["lantern_delta"] if rule == "lantern" else (params["lantern_lambda"] - 1) * p[y]
        c = best = 0.0
        for v in neighbours[y][:params["lantern_k"]]:
            c += p[v]
            if c > limit:
                break
            best = c
        return min(1.0, (p[y] + best) / q[y])
    if rule == "gsd":
        order = sorted(range(len(p)), key=lambda v: (-p[v], v))
        r = order.index(y)
        group = [v for i, v in enumerate(order)
                 if abs(i - r) <= params["group_rank"] and abs(p[v] - p[y]) <= params["group_delta"]]
        mass_q = sum(q[v] for v in group)
        return min(1.0, sum(p[v] for v in group) / mass_q) if mass_q > 0 else 0.0
    return min(1.0, ratio)


def naive_law(rule: str, p: list, q: list, params: dict, neighbours=None) -> tuple:
    """(out, distortion): out = q·a + (1 − Σq·a)·norm(max(p − q·a, 0)), ½Σ|out − p|."""
    qa = [q[y] * naive_a(rule, p, q, y, params, neighbours) for y in range(len(p))]
    residual = [max(a - b, 0.0) for a, b in zip(p, qa)]
    total = sum(residual)
    residual = [r / total for r in residual] if total > 0 else list(p)
    rejected = 1 - sum(qa)
    out = [a + rejected * r for a, r in zip(qa, residual)]
    return out, 0.5 * sum(abs(a - b) for a, b in zip(out, p))


def _pair(vocab: int, seed: int) -> tuple:
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(1.5 * torch.randn(vocab, generator=g, dtype=torch.float64), -1)
    q = torch.softmax(1.5 * torch.randn(vocab, generator=g, dtype=torch.float64), -1)
    return p, q


def _full_params(rule: str, vocab: int) -> dict:
    params = ref.rule_parameters(rule, PARAMS_OF[rule])
    if rule.startswith("lantern"):
        params["lantern_k"] = min(params["lantern_k"], 3)
    return params


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("rule", [r.name for r in RULES])
def test_each_rule_is_its_definition(rule, seed):
    vocab = 8
    p, q = _pair(vocab, seed)
    nb = _neighbours(vocab, 3, seed)
    params = _full_params(rule, vocab)
    got = ref.Acceptance(rule, p, q, neighbours=nb, **params).at(torch.arange(vocab))
    want = [naive_a(rule, p.tolist(), q.tolist(), y, params, nb.tolist()) for y in range(vocab)]
    assert got.tolist() == pytest.approx(want, abs=1e-12)


def exact_law(rule: str, p, q, nb, params, m: int, **options):
    """(the law the reference emits at one position, the distortion it returns at each draft x), every draft x of
    q enumerated: accept with the op's a(x), else the token drawn at each of m midpoints of u_sample (exact to 1/m per
    token). ``options``: more keywords of ref.verify (gather_distortion, max_distortion)."""
    vocab = p.numel()
    logits = torch.log(p)[None, None].expand(m, 1, vocab)
    grid = ((torch.arange(m, dtype=torch.float64) + 0.5) / m)[:, None]
    law = torch.zeros(vocab, dtype=torch.float64)
    distortions = []
    for x in range(vocab):
        res = ref.verify(logits, torch.full((m, 1), x), q[None, None].expand(m, 1, vocab), rule=rule, neighbours=nb,
                         start=torch.zeros(m, dtype=torch.int64), positions=torch.zeros(m, dtype=torch.int64),
                         seed=torch.tensor([0]), offset=torch.tensor([0]), compute_dtype=torch.float64,
                         uniforms=(torch.ones(m, 1), grid), **options, **params)  # u_a = 1: reject
        a = float(res.accept_prob[0, 0])
        resampled = torch.bincount(res.tokens[:, 0], minlength=vocab).double() / m
        law += float(q[x]) * (a * torch.nn.functional.one_hot(torch.tensor(x), vocab) + (1 - a) * resampled)
        distortions.append(float(res.distortion[0, 0]))
    return law, distortions


@pytest.mark.parametrize("rule", [r.name for r in RULES])
def test_the_sampler_emits_the_rule_s_law_exactly(rule):
    """One window position over V = 6, every draft x enumerated: accept with the op's a(x), else the token drawn at
    each of M midpoints of u_sample (the law of the inverse-CDF draw, exact to 1/M per token): the emitted law is
    naive_law's, and the distortion the op returns is its ½Σ|out − p|."""
    vocab, m = 6, 1 << 13
    p, q = _pair(vocab, 11)
    nb = _neighbours(vocab, 3, 11)
    params = _full_params(rule, vocab)
    law, distortions = exact_law(rule, p, q, nb, params, m, gather_distortion=True)
    out, distortion = naive_law(rule, p.tolist(), q.tolist(), params, nb.tolist())
    assert law.tolist() == pytest.approx(out, abs=2 * vocab / m)
    assert distortions == pytest.approx([distortion] * vocab, rel=2 ** -23)  # the op returns float32
    if rule == "strict":
        assert distortion < 1e-12
    else:
        assert distortion > 0.01  # the relaxation moves the law: the comparison has teeth


def test_lantern_distortion_is_nan_unless_gathered_and_zero_without_a_draft():
    logits, _ = _small()
    drafts = torch.tensor([[1, -1]])
    for backend in BACKENDS:
        res = ck.verify(logits, drafts, rule="lantern", neighbours=_neighbours(6, 3), backend=backend)
        assert math.isnan(res.distortion[0, 0]) and res.distortion[0, 1] == 0
        res = ck.verify(logits, drafts, rule="lantern", neighbours=_neighbours(6, 3), gather_distortion=True,
                        backend=backend)
        assert math.isfinite(res.distortion[0, 0])


# ----------------------------------------------------------------------------------------------------------------------
# the law the compiled backends emit (χ²)
# ----------------------------------------------------------------------------------------------------------------------
N, V7 = 40000, 7
# no group edge, lantern bound or prefix sum lies within float32 rounding of another (gsd δ = 0.15, lantern δ = 0.1,
# lantern++ bound p(x)): the op computes in float32, naive_law in float64
P7 = torch.tensor([0.301, 0.203, 0.147, 0.152, 0.103, 0.057, 0.037], dtype=torch.float64)
Q7 = torch.tensor([0.10, 0.25, 0.20, 0.05, 0.15, 0.15, 0.10], dtype=torch.float64)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("rule", RELAXED)
def test_each_backend_emits_the_rule_s_law(backend, rule):
    nb = _neighbours(V7, 3, 5)
    params = _full_params(rule, V7)
    out, distortion = naive_law(rule, P7.tolist(), Q7.tolist(), params, nb.tolist())
    drafts = torch.multinomial(Q7.float(), N, replacement=True, generator=torch.Generator().manual_seed(1))
    res = ck.verify(torch.log(P7).float().expand(N, 1, V7), drafts[:, None], Q7.float().reshape(1, 1, V7).expand(
        N, 1, V7), rule=rule, neighbours=nb, gather_distortion=True, seed=1, backend=backend, **params)
    counts = torch.bincount(res.tokens[:, 0], minlength=V7).double().numpy()
    assert chisquare(counts, (torch.tensor(out) * N).numpy()).pvalue > 1e-3
    assert chisquare(counts, (P7 * N).numpy()).pvalue < 1e-12  # the law is not p: the test above has power
    assert res.distortion[:, 0].tolist() == pytest.approx([distortion] * N, rel=1e-4)


# ----------------------------------------------------------------------------------------------------------------------
# every backend = the reference, every rule
# ----------------------------------------------------------------------------------------------------------------------
CASES = [  # (case options, op options)
    (dict(q="jacobi"), dict(coupling="maximal")),
    (dict(q="dense", seed_rows=True), dict(coupling="gumbel", temperature=0.8)),
    (dict(q=None, int_logits=True), dict(top_k=50)),
    (dict(q="uniform", dtype=torch.bfloat16), dict(top_p=0.9)),
    (dict(q="sparse", start=3, bad_tokens=True), dict(min_p=0.01)),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("rule", RELAXED)
@pytest.mark.parametrize("case_kw, op_kw", CASES)
def test_backend_equals_reference(backend, rule, case_kw, op_kw):
    if rule == "gsd" and op_kw.get("coupling") == "maximal":
        op_kw = dict(op_kw, coupling="independent")
    vocab = 1000
    case = testing.make_case(3, 16, vocab, cfg=True, favourite=0.4, seed=len(rule), **case_kw)
    nb = _neighbours(vocab, 24, 3)
    options = dict(cfg_scale=1.5, rule=rule, gather_distortion=True, **op_kw)
    got = ck.verify(**case, neighbours=nb, backend=backend, validate=False, **options)
    testing.compare(got, testing.reference_result(case, neighbours=nb, **options))


GSD_POINTS = [dict(group_rank=12, group_delta=0.15), dict(group_rank=1, group_delta=0.0),
              dict(group_rank=3, group_delta=1.0), dict(group_rank=64, group_delta=0.05),
              dict(group_rank=65, group_delta=0.3), dict(group_rank=5000, group_delta=0.2)]


@pytest.mark.skipif("cpu" not in BACKENDS, reason="the C++ extension is not built")
@pytest.mark.parametrize("point", GSD_POINTS, ids=lambda p: f"k{p['group_rank']}d{p['group_delta']}")
@pytest.mark.parametrize("case_kw, op_kw", CASES + [(dict(q="dense"), dict(temperature=0.0))])
def test_gsd_decides_without_the_sorted_row_as_with_it(point, case_kw, op_kw):
    """The CPU decides gsd from the draft's own group (its rank, window and k nearest keys; no sort) unless the
    distortion is asked for, and sorts only for the residual at a row's first rejection: the same tokens, accepted
    lengths and a(x) as with the whole row sorted at every position (k > 64: the sorted row either way)."""
    op_kw = dict(op_kw, coupling="independent") if op_kw.get("coupling") == "maximal" else op_kw
    case = testing.make_case(4, 16, 300, cfg=True, favourite=0.4, seed=point["group_rank"], **case_kw)
    options = dict(cfg_scale=1.5, rule="gsd", backend="cpu", validate=False, **point, **op_kw)
    fast, sorted_ = (ck.verify(**case, gather_distortion=g, **options) for g in (False, True))
    assert torch.equal(fast.tokens, sorted_.tokens) and torch.equal(fast.accept_len, sorted_.accept_len)
    torch.testing.assert_close(fast.accept_prob, sorted_.accept_prob, rtol=1e-6, atol=1e-9, equal_nan=True)
    assert fast.distortion.isnan().any() and (fast.distortion.isnan() | (fast.distortion == 0)).all()  # 0: no draft
    assert sorted_.distortion.isfinite().all()
    if case_kw.get("q") == "jacobi":  # the groups decide something here
        assert ((fast.accept_prob > 0) & (fast.accept_prob < 1)).sum() > 8


@pytest.mark.parametrize("backend", BACKENDS)
def test_many_random_rows_tolerate_rare_ties(backend):
    """Over many rows and every rule the integer outputs may differ only by float tie splits (<= 0.1% of rows)."""
    mismatches = rows = 0
    nb = _neighbours(257, 16, 4)
    for trial, rule in enumerate(RELAXED * 2):
        case = testing.make_case(64, 8, 257, q=("dense", "uniform", None)[trial % 3], cfg=bool(trial % 2),
                                 seed=2000 + trial, seed_rows=bool(trial % 3 == 0))
        options = dict(cfg_scale=1.3 if trial % 2 else 1.0, rule=rule, temperature=0.5 + 0.1 * trial,
                       coupling="gumbel")
        got = ck.verify(**case, neighbours=nb, backend=backend, validate=False, **options)
        mismatches += testing.compare(got, testing.reference_result(case, neighbours=nb, **options), exact=False)
        rows += 64
    assert mismatches <= max(1, rows // 1000), f"{mismatches} of {rows} rows differ"


def test_default_lantern_k_keeps_the_published_share_of_the_codebook():
    """LANTERN's k (1000; LANTERN++'s 10) were published for a 16384-code codebook; a default k keeps that share, so a
    small codebook does not make every code a neighbour (issue 45: k 1000 on digits' 512 codes lent any draft δ).
    The op and the reference take it when lantern_k is not given, capped at the table's width.
    Planted: with the published k as the default (min(1000, width)), the op's equality below goes red."""
    assert [default_lantern_k("lantern", v) for v in (16384, 4096, 512, 64, 2)] == [1000, 250, 32, 4, 1]
    assert [default_lantern_k("lantern++", v) for v in (16384, 4096, 512)] == [10, 3, 1]
    vocab = 64
    case = testing.make_case(8, 4, vocab, q="dense", seed=5)
    nb = ck.codebook_neighbours(torch.randn(vocab, 3, generator=torch.Generator().manual_seed(1)), vocab - 1)
    for rule, kw in (("lantern", dict(lantern_delta=0.3)), ("lantern++", dict(lantern_lambda=4.0))):
        default = ck.verify(**case, rule=rule, neighbours=nb, backend="torch", **kw)
        named = ck.verify(**case, rule=rule, neighbours=nb, backend="torch", lantern_k=default_lantern_k(rule, vocab),
                          **kw)
        widest = ck.verify(**case, rule=rule, neighbours=nb, backend="torch", lantern_k=vocab - 1, **kw)
        assert torch.equal(default.accept_prob, named.accept_prob), rule
        if rule == "lantern":  # the whole codebook lends more than 4 neighbours do
            assert not torch.equal(default.accept_prob, widest.accept_prob)
        acc = ref.Acceptance(rule, torch.full((vocab,), 1.0 / vocab), torch.full((vocab,), 1.0 / vocab), neighbours=nb,
                             **kw)
        assert acc.params["lantern_k"] == default_lantern_k(rule, vocab)


def test_rule_label_formats_its_parameters():
    assert rule_named("csd").label.format(**ref.rule_parameters("csd", {})) == "csd λ=0.5 τ=0.65"
    assert rule_named("lantern").label.format(**ref.rule_parameters("lantern", {})) == "lantern δ=0.1 k=1000"


# ----------------------------------------------------------------------------------------------------------------------
# informed: a draft drawn without information is decided by the strict test under every rule (docs/op.md)
# ----------------------------------------------------------------------------------------------------------------------
def _informed_case(rule: str, case_kw: dict, op_kw: dict) -> tuple:
    if rule == "gsd" and op_kw.get("coupling") == "maximal":
        op_kw = dict(op_kw, coupling="independent")
    case = testing.make_case(3, 16, 1000, cfg=True, favourite=0.4, seed=len(rule), **case_kw)
    return case, dict(cfg_scale=1.5, gather_distortion=True, neighbours=_neighbours(1000, 24, 3), validate=False,
                      **op_kw)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("rule", RELAXED)
@pytest.mark.parametrize("case_kw, op_kw", CASES)
def test_uninformed_slots_are_decided_strictly(backend, rule, case_kw, op_kw):
    """informed all False: every output equals the strict rule's bit for bit (distortion 0); all True: None's."""
    case, options = _informed_case(rule, case_kw, op_kw)
    shape = case["draft_tokens"].shape
    strict = ck.verify(**case, rule="strict", backend=backend, **options)
    none = ck.verify(**case, rule=rule, backend=backend, **options)
    for mask, expected in ((torch.zeros(shape, dtype=torch.bool), strict), (torch.ones(shape, dtype=torch.bool), none)):
        got = ck.verify(**case, rule=rule, informed=mask, backend=backend, **options)
        for field in ("accept_len", "tokens", "probs", "entropy", "tvd", "accept_prob", "distortion", "status"):
            assert torch.equal(getattr(got, field), getattr(expected, field)), field


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("rule", RELAXED)
@pytest.mark.parametrize("case_kw, op_kw", CASES)
def test_a_mixed_informed_mask_equals_the_reference(backend, rule, case_kw, op_kw):
    """Slot by slot: the rule where informed, strict where not (the reference decides both in one call)."""
    case, options = _informed_case(rule, case_kw, op_kw)
    mask = torch.rand(case["draft_tokens"].shape, generator=torch.Generator().manual_seed(7)) < 0.5
    got = ck.verify(**case, rule=rule, informed=mask, backend=backend, **options)
    del options["validate"]
    expected = testing.reference_result(case, rule=rule, informed=mask, **options)
    testing.compare(got, expected)
    assert (got.distortion[~mask] == 0).all()


def test_with_uniform_q_only_informed_guards_lantern():
    """The fault of issue 45: with q = 1/V, lantern's (p + c_m)/q accepts a draft whose neighbours hold more than
    1/V; informed=False gives back min(1, V·p(x))."""
    vocab = 64
    p = torch.softmax(torch.randn(vocab, generator=torch.Generator().manual_seed(3)) * 2, -1)
    nb = _neighbours(vocab, 16, 1)
    drafts = torch.arange(vocab)[:, None]  # every token once
    q = torch.full((vocab, 1, vocab), 1.0 / vocab)
    logits = torch.log(p).expand(vocab, 1, vocab)
    relaxed, guarded = (ck.verify(logits, drafts, q, rule="lantern", neighbours=nb, lantern_delta=0.1, lantern_k=16,
                                  informed=mask, gather_distortion=True, backend="torch")
                        for mask in (None, torch.zeros(vocab, 1, dtype=bool)))
    assert (relaxed.accept_prob[:, 0] == 1).float().mean() > 0.8  # 0.81 here, against 0.12 strictly
    assert relaxed.distortion.mean() > 0.5 and (guarded.distortion == 0).all()
    torch.testing.assert_close(guarded.accept_prob[:, 0], (vocab * p).clamp(max=1), rtol=1e-6, atol=0)


def test_informed_is_checked():
    logits, drafts = torch.zeros(2, 3, 5), torch.zeros(2, 3, dtype=torch.int64)
    for bad, words in ((torch.ones(2, 3), "informed must be a bool tensor [B, L]"),
                       (torch.ones(3, 2, dtype=torch.bool), "informed must have shape [B, L] = (2, 3), got (3, 2)"),
                       ([True], "informed must be a bool tensor")):
        with pytest.raises(ValueError, match=words.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
            ck.verify(logits, drafts, informed=bad, backend="torch")
    with pytest.raises(ValueError, match="informed is on meta but target_logits is on cpu"):
        ck.verify(logits, drafts, informed=torch.ones(2, 3, dtype=torch.bool, device="meta"), backend="torch")
