"""The compiled kernels (csd_kernels._C, torch.ops.csd_kernels.verify_rows) against csd_kernels.reference.

Build first:  pip install --no-build-isolation -e .   (compiles csd_kernels._C; about a minute)

* Philox4x32-10 and the two streams are bit-identical to the reference (seeds/offsets >= 2^32, per-row seeds,
  positions wrapping mod 2^32).
* verify_rows (CPU here; CUDA when built with CUDA and a GPU is present) reproduces reference.verify(float32):
  accept_len / tokens / status exactly (over many random rows a tiny fraction of float tie splits is tolerated),
  the float outputs to rtol 1e-4, atol 1e-5.
"""

from __future__ import annotations

import itertools

import pytest
import torch

try:
    import csd_kernels._C as _C  # noqa: F401  (registers torch.ops.csd_kernels)
except ImportError as exc:  # pragma: no cover - depends on the build
    pytest.skip(
        f"csd_kernels._C is not built ({exc}); build it with `pip install --no-build-isolation -e .`",
        allow_module_level=True,
    )

from csd_kernels import reference as ref
from csd_kernels import testing

RULES = {name: code for code, name in enumerate(ref.RULES) if name in ("strict", "csd")}  # the rest: test_rules.py
COUPLINGS = {name: code for code, name in enumerate(ref.COUPLINGS)}
DEVICES = ["cpu"] + (["cuda"] if _C.has_cuda() and torch.cuda.is_available() else [])
Q_KINDS = {"full": "dense", "stride0_rows": "row"}  # this module's names for testing.make_case's q kinds


def make_case(B, L, V, *, q="full", cfg=False, per_row_seed=False, **kw):
    """testing.make_case with about half the drafts the target's favourite (rows accept a few positions)."""
    return testing.make_case(B, L, V, q=Q_KINDS.get(q, q), cfg=cfg, seed_rows=per_row_seed,
                             favourite=0.5 if q == "full" else 0.7, **kw)


def _options(cfg=1.0, T=1.0, top_k=None, rule="csd", lam=0.5, tau=0.65, nd="independent", return_probs=True):
    return dict(cfg_scale=cfg, temperature=T, top_k=top_k, rule=rule, entropy_coef=lam, tvd_threshold=tau,
                coupling=nd, return_probs=return_probs)


def call_op(target_logits, draft_tokens, draft_probs, uncond_logits, start, positions, seed, offset, **kw):
    """torch.ops.csd_kernels.verify_rows on a case, as a VerifyResult."""
    o = _options(**kw)
    case = dict(target_logits=target_logits, draft_tokens=draft_tokens, draft_probs=draft_probs,
                uncond_logits=uncond_logits, start=start, positions=positions, seed=seed, offset=offset)
    out = torch.ops.csd_kernels.verify_rows(*testing.backend_args(case, **o))
    result = ref.VerifyResult(*out)
    result.probs = result.probs if o["return_probs"] else None
    return result


def call_ref(**case_and_options):
    names = ("target_logits", "draft_tokens", "draft_probs", "uncond_logits", "start", "positions", "seed", "offset")
    case = {k: case_and_options.pop(k) for k in names}
    return testing.reference_result(case, **_options(**case_and_options))


compare = testing.compare


# ----------------------------------------------------------------------------------------------------------------------
# Philox
# ----------------------------------------------------------------------------------------------------------------------
def test_philox_known_answers():
    cases = [
        ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
        ((0xFFFFFFFF,) * 4, (0xFFFFFFFF, 0xFFFFFFFF), (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
        ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
         (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
    ]
    for ctr, key, want in cases:
        got = _C.philox4x32(*[torch.tensor([x]) for x in ctr + key])
        assert [int(t) for t in got] == list(want)


def test_philox_matches_reference_random():
    g = torch.Generator().manual_seed(1)
    args = [torch.randint(0, 2**32, (4096,), generator=g, dtype=torch.int64) for _ in range(6)]
    for a, b in zip(_C.philox4x32(*args), ref.philox4x32(*args)):
        assert torch.equal(a, b)


@pytest.mark.parametrize("per_row", [False, True])
def test_step_uniforms_bit_identical(per_row):
    B, L = 5, 9
    seeds = torch.tensor([0, 1, 2**32, 2**32 + 7, 2**63 - 1])[: (B if per_row else 1)]
    if not per_row:
        seeds = torch.tensor([2**40 + 12345])
    positions = torch.tensor([0, 2**32 - 3, 17, 2**33 + 5, -2])  # the second one wraps inside the window
    for offset in (0, 5, 2**32 - 1, 2**32, 2**62 + 3, [0, 2**32, 7, 2**62 + 3, 1]):  # the last: one per row
        off = torch.tensor(offset if isinstance(offset, list) else [offset])
        got = _C.step_uniforms(seeds, off, positions, L)
        want = ref.step_uniforms(seeds, off, positions, L)
        for a, b in zip(got, want):
            assert torch.equal(a.view(torch.int32), b.view(torch.int32))


@pytest.mark.parametrize("per_row", [False, True])
def test_random_draft_tokens_bit_identical(per_row):
    seeds = torch.tensor([5, 2**32 + 9, 2**61])[: (3 if per_row else 1)]
    positions = torch.tensor([0, 2**32 - 1, 12345])
    for vocab in (1, 7, 16384, 2**31 - 1):
        for offset in (0, 2**32 + 1, [3, 2**32 + 1, 0]):  # the last: one per row
            off = torch.tensor(offset if isinstance(offset, list) else [offset])
            assert torch.equal(_C.random_draft_tokens(seeds, off, positions, 6, vocab),
                               ref.random_draft_tokens(seeds, off, positions, 6, vocab))


@pytest.mark.parametrize("per_row", [False, True])
def test_gumbel_uniforms_bit_identical(per_row):
    B, L, V = 3, 4, 37
    seeds = torch.tensor([3, 2**32 + 1, 2**50])[: (B if per_row else 1)]
    positions = torch.tensor([0, 2**32 - 2, 99])
    got = _C.gumbel_uniforms(seeds, positions, L, V)
    want = ref.gumbel_uniforms(seeds, positions, L, V)
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))


# ----------------------------------------------------------------------------------------------------------------------
# verify_rows
# ----------------------------------------------------------------------------------------------------------------------
@pytest.fixture(params=DEVICES)
def device(request):
    return request.param


@pytest.mark.parametrize("B,L,V", [(1, 1, 1), (1, 5, 7), (3, 5, 1000), (3, 16, 7), (1, 16, 16384), (3, 1, 16384)])
@pytest.mark.parametrize("q", ["full", "uniform", None])
def test_shapes_and_drafts(device, B, L, V, q):
    case = make_case(B, L, V, q=q, cfg=True, seed=B * 100 + L + V, device=device)
    kw = dict(cfg=1.7)
    compare(call_op(**case, **kw), call_ref(**case, **kw))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("cfg", [False, True])
@pytest.mark.parametrize("strided", [False, True])
def test_dtypes_strides_cfg(device, dtype, cfg, strided):
    case = make_case(3, 5, 1000, dtype=dtype, cfg=cfg, strided=strided, seed=7, device=device)
    kw = dict(cfg=2.5 if cfg else 1.0, T=0.8)
    compare(call_op(**case, **kw), call_ref(**case, **kw))


@pytest.mark.parametrize("nd", list(COUPLINGS))
@pytest.mark.parametrize("rule", list(RULES))
@pytest.mark.parametrize("q", ["full", "uniform", "stride0_rows", None])
def test_modes_and_next_drafts(device, nd, rule, q):
    case = make_case(3, 16, 1000, q=q, cfg=True, seed=11, device=device, per_row_seed=(q == "full"))
    kw = dict(cfg=1.5, rule=rule, nd=nd, tau=0.9, lam=0.3)
    compare(call_op(**case, **kw), call_ref(**case, **kw))


@pytest.mark.parametrize("top_k", [1, 5, 999, 1000, 5000])
@pytest.mark.parametrize("nd", list(COUPLINGS))
def test_top_k(device, top_k, nd):
    case = make_case(3, 5, 1000, q="full", seed=13, device=device)
    kw = dict(top_k=top_k, nd=nd)
    compare(call_op(**case, **kw), call_ref(**case, **kw))


def test_top_k_ties(device):
    # heavy ties: logits on a coarse grid, the k-th value repeated
    case = make_case(3, 5, 64, q="full", seed=17, device=device)
    case["target_logits"] = (case["target_logits"] * 2).round() / 2
    for k in (1, 3, 10, 63):
        compare(call_op(**case, top_k=k), call_ref(**case, top_k=k))


@pytest.mark.parametrize("nd", list(COUPLINGS))
@pytest.mark.parametrize("q", ["full", None])
def test_greedy(device, nd, q):
    case = make_case(3, 5, 1000, q=q, seed=19, device=device)
    case["target_logits"] = case["target_logits"].round()  # ties in the argmax
    kw = dict(T=0.0, nd=nd, top_k=10)
    compare(call_op(**case, **kw), call_ref(**case, **kw))


@pytest.mark.parametrize("start", [1, 3, 16, 40])
def test_start_committed(device, start):
    case = make_case(3, 16, 1000, q="full", seed=23, start=start, device=device, bad_tokens=(start == 3))
    compare(call_op(**case), call_ref(**case))


@pytest.mark.parametrize("q", ["full", "uniform", None])
def test_bad_draft_tokens(device, q):
    """-1 (no draft) and out-of-range drafts; without draft_probs q is then the zero vector (TVD = sum p / 2)."""
    case = make_case(3, 6, 100, q=q, seed=29, device=device, bad_tokens=True)
    got = call_op(**case)
    compare(got, call_ref(**case))
    assert (got.status.cpu() & ref.STATUS_BAD_DRAFT_TOKEN).all()


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize("where", ["target", "uncond", "probs"])
def test_non_finite_rows(device, bad, where):
    case = make_case(3, 5, 100, q="full", cfg=True, seed=31)
    if where == "target":
        case["target_logits"][0, 2, 7] = bad
        case["target_logits"][2, 0, :] = bad
    elif where == "uncond":
        case["uncond_logits"][1, 3, 0] = bad
    else:
        case["draft_probs"] = case["draft_probs"].clone()
        case["draft_probs"][1, 1, 5] = bad
        case["draft_probs"][2, 3, 0] = -0.5
    case = {k: (v.to(device) if v is not None else None) for k, v in case.items()}
    kw = dict(cfg=1.5)
    got = call_op(**case, **kw)
    compare(got, call_ref(**case, **kw))
    toks = got.tokens.cpu()
    assert ((toks >= 0) & (toks < 100)).all()


def test_cfg_overflow_is_bad_logits():
    case = make_case(1, 3, 50, cfg=True, seed=37)
    case["target_logits"][0, 1, 3] = 3e38
    case["uncond_logits"][0, 1, 3] = -3e38
    got = call_op(**case, cfg=2.0)
    compare(got, call_ref(**case, cfg=2.0))
    assert int(got.status[0]) & ref.STATUS_BAD_LOGITS


def test_no_probs_output(device):
    case = make_case(3, 5, 1000, seed=41, device=device)
    got = call_op(**case, return_probs=False)
    compare(got, call_ref(**case, return_probs=False))


@pytest.mark.parametrize("isa", ["baseline", "avx2"])
@pytest.mark.parametrize("q", ["uniform", "full", None])
def test_every_cpu_isa_path_matches(isa, q):
    """The CPU kernel is compiled for AVX-512, AVX2+FMA and the baseline ISA; each copy must agree."""
    case = make_case(3, 16, 1001, q=q, cfg=True, seed=43, strided=True)
    for nd in COUPLINGS:
        _C._set_cpu_isa(isa)
        try:
            got = call_op(**case, nd=nd, cfg=1.5, top_k=(50 if nd == "maximal" else None))
        finally:
            _C._set_cpu_isa("auto")
        compare(got, call_ref(**case, nd=nd, cfg=1.5, top_k=(50 if nd == "maximal" else None)))


def test_many_random_rows_tolerate_rare_ties(device):
    """Over many rows the integer outputs may differ only by float tie splits (<= 0.1% of rows)."""
    g = torch.Generator().manual_seed(47)
    mismatches = rows = 0
    for trial, (q, nd, rule) in enumerate(itertools.product(["full", "uniform", None], list(COUPLINGS), list(RULES))):
        case = make_case(64, 8, 257, q=q, cfg=bool(trial % 2), seed=1000 + trial, device=device,
                         per_row_seed=bool(trial % 3 == 0))
        kw = dict(cfg=1.3, nd=nd, rule=rule, T=float(0.5 + torch.rand(1, generator=g)), tau=0.8)
        mismatches += compare(call_op(**case, **kw), call_ref(**case, **kw), exact=False)
        rows += 64
    assert mismatches <= max(1, rows // 1000), f"{mismatches} of {rows} rows differ"


def test_checks_have_clear_messages():
    case = make_case(1, 2, 10)
    with pytest.raises(RuntimeError, match="target_logits must be"):
        call_op(**{**case, "target_logits": case["target_logits"][0]})
    with pytest.raises(RuntimeError, match="draft_tokens"):
        call_op(**{**case, "draft_tokens": case["draft_tokens"].to(torch.int32)})
    with pytest.raises(RuntimeError, match="last-dim stride"):
        call_op(**{**case, "draft_probs": torch.rand(1, 2, 20)[:, :, ::2]})
    with pytest.raises(RuntimeError, match="seed"):
        call_op(**{**case, "seed": torch.tensor([1, 2, 3])})
