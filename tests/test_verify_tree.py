"""The public tree op ck.verify_tree: every backend equal to reference.verify_tree (tokens and path exactly, floats to
~1e-5), bad input named, status bits, torch.library registration (opcheck, fake shapes, torch.compile)."""

from __future__ import annotations

import importlib

import pytest
import torch
from torch.library import opcheck

import csd_kernels as ck
from csd_kernels import reference as ref
from csd_kernels.backends.compiled import has_tree
from csd_kernels.backends.spec import OpSettings, TreeArgs
from csd_kernels.ops import verify_tree as tree_ops
from csd_kernels.ops.checks import check_rule

pytestmark = pytest.mark.usefixtures("one_thread")


def _triton_tree_imports() -> bool:
    try:
        importlib.import_module("csd_kernels.backends.triton.verify_tree")
    except Exception:  # noqa: BLE001 - not merged yet, or triton missing
        return False
    return True


_SKIPS = {
    "cpu": (not has_tree(), "csd_kernels._C has no verify_tree_rows (rebuild the extension)"),
    "triton": (not _triton_tree_imports(), "csd_kernels.backends.triton.verify_tree does not import (no triton)"),
    "cuda": (not torch.cuda.is_available() or not has_tree(), "needs a GPU and the CUDA build"),
}
def _skip(name: str):
    if name not in _SKIPS:
        return ()
    condition, reason = _SKIPS[name]
    return pytest.mark.skipif(condition, reason=reason)


BACKENDS = [pytest.param(name, marks=_skip(name))
            for name in ("torch", "cpu", "triton", "cuda")]
FAST = 20_000  # B·S·V above which the Triton interpreter is too slow for a unit test


def _device(backend: str) -> torch.device:
    return torch.device("cuda" if backend in ("cuda",) or (backend == "triton" and torch.cuda.is_available())
                        else "cpu")


def _tree_inputs(K, D, W, B, V, seed=0, sharp=2.0, dtype=torch.float32, cfg=False, missing=0.0, sibling=False,
                 uniform_tokens=False):
    """Logits whose candidates are likely under p (so walks go deep and residuals get used), q a noisy p;
    uniform_tokens: candidates uniformly at random instead (siblings then often differ from the main draft)."""
    layout = ref.tree_layout(K, D, W)
    g = torch.Generator().manual_seed(seed)
    logits = sharp * torch.randn(B, W, V, generator=g)
    p = torch.softmax(logits, -1)
    parents = torch.cat([torch.zeros(1, dtype=torch.int64), layout.parent[1:]])
    weights = torch.ones(B * W, V) if uniform_tokens else p[:, parents].reshape(-1, V)
    tokens = torch.multinomial(weights, 1, generator=g).reshape(B, W)
    tokens[:, 0] = 0
    if missing:
        tokens[torch.rand(B, W, generator=g) < missing] = -1
    main_logits = logits[:, layout.main[:-1]]
    q = torch.softmax(main_logits + 0.7 * torch.randn(main_logits.shape, generator=g), -1)
    inputs = dict(target_logits=logits.to(dtype), node_tokens=tokens, draft_probs=q, layout=layout)
    if cfg:
        inputs["uncond_logits"] = (sharp * torch.randn(B, W, V, generator=g)).to(dtype)
    if sibling:
        inputs["sibling_probs"] = torch.softmax(main_logits + 1.5 * torch.randn(main_logits.shape, generator=g), -1)
    return inputs


CASES = {  # id: (K, D, W, B, V, input options, op options)
    "chain-strict": (1, 3, 6, 3, 30, {}, {}),
    "k2d2-strict": (2, 2, 8, 3, 50, dict(missing=0.15), {}),
    "k3d3-csd": (3, 3, 16, 2, 1000, {}, dict(rule="csd")),
    "k2d3-cfg-temp-siblings": (2, 3, 12, 4, 300, dict(cfg=True, sibling=True),
                               dict(rule="csd", cfg_scale=3.0, temperature=0.7)),
    "k3d3-topk-16384": (3, 3, 32, 2, 16384, {}, dict(top_k=100, rule="strict")),
    "k2d2-topp-minp-bf16-16384": (2, 2, 32, 1, 16384, dict(dtype=torch.bfloat16, sharp=4.0),
                                  dict(top_p=0.9, min_p=0.05, rule="csd")),
    "k3d2-greedy": (3, 2, 8, 3, 64, {}, dict(temperature=0.0)),
    "k4d2-f16-cfg-missing-csd": (4, 2, 16, 2, 200, dict(dtype=torch.float16, cfg=True, missing=0.2),
                                 dict(rule="csd", cfg_scale=2.0, entropy_coef=0.8, tvd_threshold=0.9)),
    "k2d2-small-all": (2, 2, 6, 2, 9, dict(sibling=True), dict(top_k=5, top_p=0.8, min_p=0.1, temperature=1.3)),
    # every other rule on the main draft (gsd: its groups sort the node's row; not on triton)
    "k3d2-gsd": (3, 2, 8, 3, 200, dict(sibling=True), dict(rule="gsd", group_rank=4, group_delta=0.1)),
    "k2d3-arsample-cfg": (2, 3, 12, 2, 300, dict(cfg=True), dict(rule="arsample", cfg_scale=2.0)),
    "k3d2-lantern-gathered": (3, 2, 8, 2, 200, dict(missing=0.1),
                              dict(rule="lantern", lantern_delta=0.2, gather_distortion=True)),
    "k2d2-lantern++-topk": (2, 2, 6, 3, 200, {}, dict(rule="lantern++", lantern_lambda=3.0, top_k=30)),
}
_NEIGHBOURS = ref.codebook_neighbours(torch.randn(200, 3, generator=torch.Generator().manual_seed(0)), 20)


def _assert_same(got: ref.TreeResult, want: ref.TreeResult) -> None:
    for field in ("accept_len", "path", "tokens", "status"):
        assert torch.equal(getattr(got, field).cpu(), getattr(want, field)), field
    for field in ("accept_prob", "entropy", "tvd", "distortion"):
        # equal_nan: lantern's distortion without gather_distortion is NaN, on every backend alike
        torch.testing.assert_close(getattr(got, field).cpu(), getattr(want, field), rtol=1e-5, atol=1e-5,
                                   equal_nan=field == "distortion", msg=lambda m, f=field: f"{f}: {m}")


def _reference(inputs: dict, seed, offset, **options) -> ref.TreeResult:
    return ref.verify_tree(inputs["target_logits"], inputs["node_tokens"], inputs["draft_probs"], inputs["layout"],
                           uncond_logits=inputs.get("uncond_logits"), sibling_probs=inputs.get("sibling_probs"),
                           seed=seed, offset=offset, **options)


def _on(inputs: dict, device: torch.device) -> dict:
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", list(CASES))
def test_backend_equals_reference(backend, case):
    K, D, W, B, V, input_options, options = CASES[case]
    if backend == "triton" and B * W * V > FAST and not torch.cuda.is_available():
        pytest.skip("too large for the Triton interpreter")
    if backend == "triton" and options.get("rule") == "gsd":
        pytest.skip("triton verifies no gsd trees (test_triton_tree.py: the error names the backends that do)")
    if options.get("rule", "").startswith("lantern"):
        options = dict(options, neighbours=_NEIGHBOURS.to(_device(backend)))
    inputs = _tree_inputs(K, D, W, B, V, **input_options)
    seed, offset = torch.arange(B, dtype=torch.int64) + 11, torch.tensor([3])
    want = _reference(inputs, seed, offset, **{k: (v.cpu() if k == "neighbours" else v) for k, v in options.items()})
    device = _device(backend)
    got = ck.verify_tree(**_on(inputs, device), seed=seed.to(device), offset=offset.to(device), backend=backend,
                         **options)
    _assert_same(got, want)
    assert got.accept_len.dtype == torch.int64 and got.status.dtype == torch.int32


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("options", [dict(rule="strict"), dict(rule="csd", entropy_coef=0.1, tvd_threshold=1.0)],
                         ids=["strict", "csd-gate-open"])
@pytest.mark.parametrize("sibling", [False, True], ids=["q", "sibling-q"])
def test_walks_use_residuals_and_deep_paths(backend, options, sibling):
    """Candidates uniformly at random on V = 6: main drafts are often rejected, so siblings are tested against the
    residuals (and, under csd with its gate open, must stay strict) — over the rows the walks accept siblings, stop at
    the root and go deeper than the tree, so the agreement has power on the residual updates."""
    rows = 24 if backend == "triton" and not torch.cuda.is_available() else 96
    inputs = _tree_inputs(3, 3, 16, rows, 6, seed=3, sharp=2.5, uniform_tokens=True, sibling=sibling)
    device = _device(backend)
    got = ck.verify_tree(**_on(inputs, device), seed=5, offset=0, backend=backend, **options)
    want = _reference(inputs, torch.tensor([5]), torch.tensor([0]), **options)
    _assert_same(got, want)
    rank = inputs["layout"].rank[want.path.clamp(min=0)] * (want.path >= 0)
    assert (rank >= 1).any(), "no sibling was accepted: the residual path is untested"
    lengths = want.accept_len.tolist()
    assert 0 in lengths and max(lengths) >= 3, "walks should stop at the root and go past the tree's depth"


INFORMED_RULES = {"csd": dict(entropy_coef=0.5, tvd_threshold=1.0), "gsd": dict(group_rank=4, group_delta=0.3),
                  "arsample": {}, "lantern": dict(lantern_delta=0.3), "lantern++": dict(lantern_lambda=4.0)}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("rule", list(INFORMED_RULES))
def test_uninformed_main_drafts_are_tested_strictly(backend, rule):
    """``informed`` (issue 45, as verify's): a level whose main draft was drawn without information is tested by the
    strict rule and spends no distortion. Every level uninformed: the reference's walk is the strict one exactly
    (tokens, path, accept_prob) with zero distortion, and differs from the relaxed walk (the rule acts on these
    inputs); a mixed mask: every backend equals the reference. Planted: the reference's tree_walk ignoring ``informed``
    turns every case red (the torch cases' strict equality, the cpu and triton kernels' equality to it)."""
    if backend == "triton" and rule == "gsd":
        pytest.skip("triton verifies no gsd trees")
    rows = 8 if backend == "triton" and not torch.cuda.is_available() else 32
    inputs = _tree_inputs(2, 3, 12, rows, 40, seed=7, sharp=1.0, uniform_tokens=True)
    levels = inputs["layout"].levels
    options = dict(rule=rule, gather_distortion=True, **INFORMED_RULES[rule])
    if rule.startswith("lantern"):
        nb = ref.codebook_neighbours(torch.randn(40, 3, generator=torch.Generator().manual_seed(2)), 39)
        options.update(neighbours=nb, lantern_k=16)
    seed, offset = torch.tensor([9]), torch.tensor([1])
    if backend == "torch":
        none = torch.zeros(rows, levels, dtype=torch.bool)
        uninformed = _reference(inputs, seed, offset, informed=none, **options)
        strict = _reference(inputs, seed, offset)
        relaxed = _reference(inputs, seed, offset, **options)
        for field in ("accept_len", "path", "tokens", "accept_prob"):
            assert torch.equal(getattr(uninformed, field), getattr(strict, field)), field
        assert (uninformed.distortion == 0).all() and (relaxed.distortion > 0).any()
        assert not torch.equal(relaxed.accept_prob, strict.accept_prob)
    mixed = torch.rand(rows, levels, generator=torch.Generator().manual_seed(4)) < 0.5
    want = _reference(inputs, seed, offset, informed=mixed, **options)
    device = _device(backend)
    options = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in options.items()}
    got = ck.verify_tree(**_on(inputs, device), seed=seed.to(device), offset=offset.to(device), backend=backend,
                         informed=mixed.to(device), **options)
    _assert_same(got, want)


@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_logits_on_the_path_set_status(backend):
    inputs = _tree_inputs(2, 2, 8, 3, 20, seed=1)
    inputs["target_logits"][0, 0, 3] = float("nan")  # the root: always visited
    inputs["target_logits"][1, :, :] = float("-inf")  # no finite logit anywhere
    inputs["target_logits"][2, 7, 0] = float("inf")  # slot 7 (a sibling leaf): visited or not, as the reference says
    device = _device(backend)
    got = ck.verify_tree(**_on(inputs, device), seed=0, offset=1, backend=backend)
    want = _reference(inputs, torch.tensor([0]), torch.tensor([1]))
    _assert_same(got, want)
    assert got.status[:2].tolist() == [ref.STATUS_BAD_LOGITS] * 2
    assert ((got.tokens >= -1) & (got.tokens < 20)).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_draft_probs_are_zero_and_reported(backend):
    """A level of q (or of the sibling law) that is not a distribution is used as zero — nothing accepted there, the
    node emits from p — and reported; never used as is (an unnormalised q would accept with the wrong ratio)."""
    inputs = _tree_inputs(3, 2, 8, 4, 20, seed=4, sibling=True)
    bad = dict(inputs, draft_probs=inputs["draft_probs"].clone(), sibling_probs=inputs["sibling_probs"].clone())
    bad["draft_probs"][0, 0] *= 2.0  # sums to 2
    bad["draft_probs"][1, 1, 3] = -0.01  # a negative entry
    bad["sibling_probs"][2, 1, 5] = float("nan")
    clean = dict(bad, draft_probs=bad["draft_probs"].clone(), sibling_probs=bad["sibling_probs"].clone())
    clean["draft_probs"][0, 0] = 0.0
    clean["draft_probs"][1, 1] = 0.0
    clean["sibling_probs"][2, 1] = 0.0
    device = _device(backend)
    got = ck.verify_tree(**_on(bad, device), seed=3, offset=2, backend=backend)
    want = _reference(clean, torch.tensor([3]), torch.tensor([2]))
    _assert_same(got, want)
    assert [s & ref.STATUS_BAD_DRAFT_PROBS for s in got.status.tolist()] == [ref.STATUS_BAD_DRAFT_PROBS] * 3 + [0]
    assert got.accept_len[0] == 0  # level 1's q is zero: its main draft is never accepted


@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_node_tokens_are_missing_candidates_and_reported(backend):
    inputs = _tree_inputs(2, 2, 8, 2, 20, seed=2)
    bad = dict(inputs, node_tokens=inputs["node_tokens"].clone())
    bad["node_tokens"][0, 1] = 25  # out of range: treated as -1 (missing)
    bad["node_tokens"][1, 0] = -7  # slot 0 (the root) is not a candidate: ignored
    clean = dict(inputs, node_tokens=bad["node_tokens"].clone())
    clean["node_tokens"][0, 1] = -1
    device = _device(backend)
    got = ck.verify_tree(**_on(bad, device), seed=9, offset=0, backend=backend)
    want = _reference(clean, torch.tensor([9]), torch.tensor([0]))
    assert got.status.tolist() == [ref.STATUS_BAD_DRAFT_TOKEN | int(want.status[0]), int(want.status[1])]
    want.status = got.status.cpu()
    _assert_same(got, want)


# ----------------------------------------------------------------------------------------------------------------------
# Bad input: a ValueError that names the argument
# ----------------------------------------------------------------------------------------------------------------------
def _good():
    return _tree_inputs(2, 2, 8, 2, 10)


@pytest.mark.parametrize("change, argument", [
    (lambda x: x.update(target_logits=x["target_logits"][0]), "target_logits"),
    (lambda x: x.update(target_logits=x["target_logits"].double()), "target_logits"),
    (lambda x: x.update(node_tokens=x["node_tokens"].float()), "node_tokens"),
    (lambda x: x.update(node_tokens=x["node_tokens"][:, :5]), "node_tokens"),
    (lambda x: x.update(draft_probs=x["draft_probs"].double()), "draft_probs"),
    (lambda x: x.update(draft_probs=x["draft_probs"][:, :1]), "draft_probs"),
    (lambda x: x.update(sibling_probs=x["draft_probs"][:, :, :4]), "sibling_probs"),
    (lambda x: x.update(layout=ref.tree_layout(2, 2, 9)), "layout"),
    (lambda x: x.update(layout=(2, 2)), "layout"),
    (lambda x: x.update(uncond_logits=x["target_logits"].half()), "uncond_logits"),
    (lambda x: x.update(uncond_logits=x["target_logits"][:, :3]), "uncond_logits"),
    (lambda x: x.update(cfg_scale=3.0), "cfg_scale"),
    (lambda x: x.update(temperature=-1.0), "temperature"),
    (lambda x: x.update(top_k=0), "top_k"),
    (lambda x: x.update(top_p=0.0), "top_p"),
    (lambda x: x.update(min_p=1.5), "min_p"),
    (lambda x: x.update(rule="fast"), "rule"),
    (lambda x: x.update(entropy_coef=-0.1), "entropy_coef"),
    (lambda x: x.update(tvd_threshold=1.5), "tvd_threshold"),
    (lambda x: x.update(seed=-1), "seed"),
    (lambda x: x.update(seed=torch.tensor([1, 2, 3])), "seed"),
    (lambda x: x.update(offset=1 << 63), "offset"),
    (lambda x: x.update(backend="tpu"), "backend"),
    (lambda x: x.update(informed=torch.ones(2, 9, dtype=torch.bool)), r"informed must have shape \[B, M\]"),
    (lambda x: x.update(informed=torch.ones(2, 2)), "informed must be a bool tensor"),
])
def test_bad_arguments_raise_value_errors_naming_them(change, argument):
    kwargs = dict(_good(), seed=0, offset=0)
    change(kwargs)
    with pytest.raises(ValueError, match=argument):
        ck.verify_tree(**kwargs)


def test_mismatched_devices_are_named():
    kwargs = dict(_good(), seed=0, offset=0)
    kwargs["draft_probs"] = kwargs["draft_probs"].to("meta")
    with pytest.raises(ValueError, match="draft_probs"):
        ck.verify_tree(**kwargs)


# ----------------------------------------------------------------------------------------------------------------------
# torch.library: opcheck, the fakes' shapes, torch.compile
# ----------------------------------------------------------------------------------------------------------------------
def _op_args(backend: str, sibling: bool = True) -> tuple:
    """The custom op's arguments (backends/spec.py's TREE_ARGS, then the backend) of a csd case with every option."""
    x = _tree_inputs(3, 2, 8, 2, 12, cfg=True, sibling=sibling, missing=0.1)
    layout = x["layout"]
    checked = check_rule("csd", dict(entropy_coef=0.5, tvd_threshold=0.65), None, 12, torch.device("cpu"))
    settings = OpSettings(cfg_scale=2.0, temperature=0.8, top_p=0.95, min_p=0.02, top_k=6, rule=checked.code,
                        branching=3, depth_limit=2, rule_params=checked.params)
    args = TreeArgs(target_logits=x["target_logits"], uncond_logits=x["uncond_logits"], node_tokens=x["node_tokens"],
                    draft_probs=x["draft_probs"], sibling_probs=x.get("sibling_probs"), neighbours=None,
                    children=layout.children, seed=torch.tensor([4, 5]), offset=torch.tensor([2]),
                    informed=torch.arange(2 * x["draft_probs"].shape[1]).reshape(2, -1) % 3 != 1,
                    settings=settings.floats(), choices=settings.ints())
    return (*args, backend)


@pytest.mark.parametrize("backend", [b for b in BACKENDS if b.values[0] in ("torch", "cpu")])
@pytest.mark.parametrize("sibling", [False, True])
def test_opcheck(backend, sibling):
    opcheck(torch.ops.csd_kernels.verify_tree.default, _op_args(backend, sibling))


@_skip("cpu")
def test_opcheck_compiled_op():
    opcheck(torch.ops.csd_kernels.verify_tree_rows.default, _op_args("cpu")[:-1])


def test_fake_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode

    args = _op_args("torch")
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fake = tuple(mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args)
        outputs = torch.ops.csd_kernels.verify_tree(*fake)
    levels = args[3].shape[1]
    assert [tuple(o.shape) for o in outputs] == [(2,)] + [(2, levels + 1)] * 6 + [(2,)]
    assert [o.dtype for o in outputs] == [torch.int64] * 3 + [torch.float32] * 4 + [torch.int32]


@pytest.mark.parametrize("backend", [b for b in BACKENDS if b.values[0] in ("torch", "cpu")])
def test_torch_compile_fullgraph(backend):
    x = _tree_inputs(2, 2, 8, 2, 30)

    def step(logits, tokens, probs):
        res = ck.verify_tree(logits, tokens, probs, x["layout"], seed=torch.tensor([7]), offset=torch.tensor([2]),
                             rule="csd", backend=backend)
        return res.accept_len, res.tokens, res.entropy

    compiled = torch.compile(step, fullgraph=True)
    args = (x["target_logits"], x["node_tokens"], x["draft_probs"])
    for got, expected in zip(compiled(*args), step(*args)):
        assert torch.equal(got, expected)


def test_exported_from_the_package():
    assert ck.verify_tree is tree_ops.verify_tree and ck.TreeResult is ref.TreeResult
