"""The public op: argument errors, status reporting, torch.library registration, dispatch (fuzzing:
test_verify_fuzz.py)."""

import pytest
import torch
from torch.library import opcheck

import csd_kernels as ck
from csd_kernels import reference as ref
from csd_kernels import testing
from csd_kernels.config.acceptance import rule_named

BACKENDS = ck.available_backends("cpu")
FAST_BACKENDS = [name for name in BACKENDS if name != "triton"]  # the interpreter runs one program at a time


def _inputs(batch=2, length=3, vocab=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, length, vocab, generator=g), torch.randint(0, vocab, (batch, length), generator=g)


# ---------------------------------------------------------------------------------------------------------------------
# Bad input: a ValueError that names the argument
# ---------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs, argument",
    [
        (dict(temperature=-0.1), "temperature"),
        (dict(temperature=float("nan")), "temperature"),
        (dict(top_k=0), "top_k"),
        (dict(top_k=2.5), "top_k"),
        (dict(tvd_threshold=1.5), "tvd_threshold"),
        (dict(tvd_threshold=-0.1), "tvd_threshold"),
        (dict(entropy_coef=-1.0), "entropy_coef"),
        (dict(entropy_coef=float("inf")), "entropy_coef"),
        (dict(rule="fast"), "rule"),
        (dict(coupling="best"), "coupling"),
        (dict(cfg_scale=5.0), "cfg_scale"),
        (dict(seed=-1), "seed"),
        (dict(seed=1 << 63), "seed"),  # a seed is an int64 >= 0 (as in generate and the CLI)
        (dict(seed=torch.tensor([1, 2, 3])), "seed"),
        (dict(offset=1 << 63), "offset"),
        (dict(offset=torch.tensor([1.0])), "offset"),
        (dict(start=torch.tensor([0, 1, 2])), "start"),
        (dict(start=torch.tensor([0.0, 1.0])), "start"),
        (dict(positions="0"), "positions"),
        (dict(start=torch.tensor([-1, 0])), "start"),
        (dict(uncond_logits=torch.randn(2, 3, 4)), "uncond_logits"),
        (dict(uncond_logits=torch.randn(2, 3, 5).double()), "uncond_logits"),
        (dict(backend="tpu"), "backend"),
    ],
)
def test_bad_arguments_raise_value_errors_naming_them(kwargs, argument):
    logits, drafts = _inputs()
    with pytest.raises(ValueError, match=argument):
        ck.verify(logits, drafts, **kwargs)


@pytest.mark.parametrize(
    "logits, drafts, probs, argument",
    [
        (torch.randn(2, 3), torch.zeros(2, 3, dtype=torch.long), None, "target_logits"),
        (torch.randn(2, 3, 5).double(), torch.zeros(2, 3, dtype=torch.long), None, "target_logits"),
        (torch.randn(2, 0, 5), torch.zeros(2, 0, dtype=torch.long), None, "target_logits"),
        (torch.randn(2, 3, 5), torch.zeros(2, 4, dtype=torch.long), None, "draft_tokens"),
        (torch.randn(2, 3, 5), torch.zeros(2, 3), None, "draft_tokens"),
        (torch.randn(2, 3, 5), torch.zeros(2, 3, dtype=torch.long), torch.rand(2, 3, 4), "draft_probs"),
        (torch.randn(2, 3, 5), torch.zeros(2, 3, dtype=torch.long), torch.rand(2, 3, 5).half(), "draft_probs"),
    ],
)
def test_bad_shapes_and_dtypes(logits, drafts, probs, argument):
    with pytest.raises(ValueError, match=argument):
        ck.verify(logits, drafts, probs)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])  # -inf masks a token: tests/test_masked_and_probs.py
@pytest.mark.parametrize("where", ["target_logits", "uncond_logits"])
def test_non_finite_logits_are_reported_and_never_give_out_of_range_tokens(backend, bad, where):
    logits, drafts = _inputs(batch=3)
    uncond = torch.zeros_like(logits)
    (logits if where == "target_logits" else uncond)[1, 1, 2] = bad
    kwargs = dict(uncond_logits=uncond, cfg_scale=2.0, backend=backend)
    with pytest.raises(ValueError, match=r"NaN or \+Inf"):
        ck.verify(logits, drafts, **kwargs)
    res = ck.verify(logits, drafts, validate=False, **kwargs)
    assert res.status.tolist() == [0, ref.STATUS_BAD_LOGITS, 0]
    assert ((res.tokens >= 0) & (res.tokens < 5)).all()
    assert res.accept_len[1] <= 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_draft_values_are_reported(backend):
    logits, drafts = _inputs()
    out_of_range = drafts.clone()
    out_of_range[0, 1] = 5
    with pytest.raises(ValueError, match=r"draft_tokens must lie in \[-1, V\)"):
        ck.verify(logits, out_of_range, backend=backend)
    res = ck.verify(logits, out_of_range, backend=backend, validate=False)
    assert res.status.tolist() == [ref.STATUS_BAD_DRAFT_TOKEN, 0] and ((res.tokens >= 0) & (res.tokens < 5)).all()
    probs = torch.softmax(torch.randn(2, 3, 5), -1)
    probs[1, 0, 0] = -0.5
    with pytest.raises(ValueError, match="draft_probs must be finite, non-negative and sum to 1"):
        ck.verify(logits, drafts, probs, backend=backend)
    missing = drafts.clone()
    missing[1, 0] = -1
    with pytest.raises(ValueError, match="committed position"):
        ck.verify(logits, missing, start=torch.tensor([0, 2]), backend=backend)


def test_mismatched_devices_are_named():
    logits, drafts = _inputs()
    with pytest.raises(ValueError, match="draft_tokens is on meta"):
        ck.verify(logits, drafts.to("meta"))


# ---------------------------------------------------------------------------------------------------------------------
# Dispatch
# ---------------------------------------------------------------------------------------------------------------------
def test_available_backends_lists_runnable_ones_in_auto_order():
    assert BACKENDS[-1] in ("torch", "triton") and "torch" in BACKENDS
    logits, drafts = _inputs()
    auto = ck.verify(logits, drafts, seed=4).tokens
    assert torch.equal(auto, ck.verify(logits, drafts, seed=4, backend=BACKENDS[0]).tokens)


def test_unavailable_backend_says_how_to_get_it(monkeypatch):
    logits, drafts = _inputs()
    with pytest.raises(RuntimeError, match="cuda"):
        ck.verify(logits, drafts, backend="cuda")
    monkeypatch.setenv("CSD_KERNELS_BACKEND", "cuda")
    with pytest.raises(RuntimeError, match="CSD_KERNELS_BACKEND"):
        ck.verify(logits, drafts)
    monkeypatch.setenv("CSD_KERNELS_BACKEND", "torch")
    assert ck.verify(logits, drafts).tokens.shape == (2, 3)


# ---------------------------------------------------------------------------------------------------------------------
# torch.library: opcheck and torch.compile
# ---------------------------------------------------------------------------------------------------------------------
def _op_args(backend, with_probs, rule="csd"):
    logits, drafts = _inputs(batch=2, length=4, vocab=9)
    drafts[0, 2] = -1
    probs = torch.full((1, 1, 1), 1 / 9).expand(2, 4, 9) if with_probs else None
    zeros = torch.zeros(2, dtype=torch.int64)
    case = dict(target_logits=logits, draft_tokens=drafts, draft_probs=probs, uncond_logits=torch.randn(2, 4, 9),
                start=zeros, positions=zeros, seed=torch.tensor([3]), offset=torch.tensor([1]))
    lantern = rule.startswith("lantern")
    neighbours = torch.randint(0, 9, (9, 3), generator=torch.Generator().manual_seed(0)) if lantern else None
    # the distortion gathered where it is on request: NaN (not computed) never compares equal between eager and
    # traced calls
    args = testing.backend_args(case, cfg_scale=3.0, temperature=0.7, top_k=5, top_p=0.9, min_p=0.05, rule=rule,
                                neighbours=neighbours, gather_distortion=rule_named(rule).distortion_gathers,
                                coupling="maximal" if rule != "gsd" else "gumbel")
    return (*args, backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("with_probs", [False, True])
def test_opcheck(backend, with_probs):
    opcheck(torch.ops.csd_kernels.verify.default, _op_args(backend, with_probs))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("rule", [r for r in ref.RULES if r not in ("strict", "csd")])
def test_opcheck_every_rule(backend, rule):
    opcheck(torch.ops.csd_kernels.verify.default, _op_args(backend, True, rule))


@pytest.mark.skipif("cpu" not in BACKENDS, reason="the C++ extension is not built")
def test_opcheck_compiled_op():
    opcheck(torch.ops.csd_kernels.verify_rows.default, _op_args("cpu", True)[:-1])


@pytest.mark.parametrize("backend", FAST_BACKENDS)
def test_torch_compile_fullgraph(backend):
    logits, drafts = _inputs(batch=3, length=4, vocab=11)

    def step(logits, drafts):
        res = ck.verify(logits, drafts, seed=torch.tensor([7]), offset=torch.tensor([2]), rule="csd", validate=False,
                        backend=backend)
        return res.accept_len, res.tokens, res.entropy

    compiled = torch.compile(step, fullgraph=True)
    for got, expected in zip(compiled(logits, drafts), step(logits, drafts)):
        assert torch.equal(got, expected)
