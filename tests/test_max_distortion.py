"""max_distortion: a cap on the distortion a relaxed rule may spend at one position (ops.verify, ops.verify_tree,
generate). Above the cap a position is decided by the strict test, so its law is p; at or below it, the rule's.

The exact laws come from test_rules' enumeration (every draft, the inverse-CDF draw on a grid of u); the backends
are held to the reference on windows where the cap splits the positions; the loop's law with the cap at 0 is ar's.
"""

from __future__ import annotations

import math

import pytest
import torch
from test_rules import _full_params, _neighbours, _pair, exact_law, naive_law
from test_verify_tree import BACKENDS as TREE_BACKENDS
from test_verify_tree import INFORMED_RULES, _assert_same, _device, _on, _reference, _tree_inputs

import csd_kernels as ck
from csd_kernels import reference as ref
from csd_kernels import testing
from csd_kernels.config.acceptance import RULES

RELAXED = [r.name for r in RULES if not r.lossless]
CPU_BACKENDS = [name for name in ck.available_backends("cpu") if name != "triton"]  # triton: test_triton_kernel


@pytest.mark.parametrize("rule", RELAXED)
def test_the_cap_gives_p_above_it_and_the_rule_s_law_below(rule):
    """V = 6: the rule's distortion D at the position; a cap of D/2 (and of 0) emits p exactly with distortion 0, a
    cap of 2·D the rule's own law with distortion D."""
    vocab = 6
    p, q = _pair(vocab, 11)
    nb = _neighbours(vocab, 3, 11)
    params = _full_params(rule, vocab)
    out, d = naive_law(rule, p.tolist(), q.tolist(), params, nb.tolist())
    assert d > 0.01  # the rule moves the law here: both halves below have teeth
    tol = 2 * vocab / (1 << 12)
    for cap in (0.0, d / 2):
        law, dist = exact_law(rule, p, q, nb, params, 1 << 12, max_distortion=cap)
        assert law.tolist() == pytest.approx(p.tolist(), abs=tol) and dist == [0.0] * vocab
    law, dist = exact_law(rule, p, q, nb, params, 1 << 12, max_distortion=2 * d)
    assert law.tolist() == pytest.approx(out, abs=tol)
    assert dist == pytest.approx([d] * vocab, rel=2 ** -23)  # the op returns float32


def _split_case(rule: str, vocab: int = 400, batch: int = 3, length: int = 12):
    """A window, its options and a cap at the median of the rule's distortion there: about half the drafted
    positions above it."""
    case = testing.make_case(batch, length, vocab, cfg=True, q="jacobi", favourite=0.3, seed=7)
    nb = _neighbours(vocab, 16, 3)
    options = dict(cfg_scale=1.5, rule=rule, coupling="gumbel" if rule == "gsd" else "maximal",
                   **_full_params(rule, vocab))
    free = testing.reference_result(case, neighbours=nb, gather_distortion=True, **options)
    drafted = case["draft_tokens"] >= 0
    return case, nb, options, _median_cap(free.distortion[drafted]), free


def _median_cap(distortion: torch.Tensor) -> float:
    """Midway between the two middle values: no backend's rounding puts a position on the other side of it."""
    ordered = distortion.sort().values
    half = len(ordered) // 2
    return float(ordered[half - 1] + ordered[half]) / 2


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("rule", RELAXED)
def test_every_backend_equals_the_reference_under_a_cap(backend, rule):
    case, nb, options, cap, free = _split_case(rule)
    want = testing.reference_result(case, neighbours=nb, max_distortion=cap, **options)
    got = ck.verify(**case, neighbours=nb, backend=backend, validate=False, max_distortion=cap, **options)
    testing.compare(got, want)
    drafted = case["draft_tokens"] >= 0
    above = drafted & (free.distortion > cap)
    assert above.any() and (drafted & ~above & (free.distortion > 0)).any()  # the cap splits the positions
    own = ck.verify(**case, neighbours=nb, backend=backend, validate=False, gather_distortion=True, **options)
    assert (got.distortion[above] == 0).all() and torch.equal(got.distortion[~above], own.distortion[~above])
    strict = testing.reference_result(case, neighbours=nb, **dict(options, rule="strict",
                                                                    **{"coupling": options["coupling"]}))
    torch.testing.assert_close(got.accept_prob[above], strict.accept_prob[above])  # above the cap: the strict test


def test_a_cap_of_one_changes_nothing_and_none_is_no_cap():
    case, nb, options, _cap, free = _split_case("csd")
    for cap in (1.0, None, math.inf):
        got = ck.verify(**case, neighbours=nb, validate=False, max_distortion=cap, backend="torch", **options)
        assert torch.equal(got.tokens, free.tokens) and torch.equal(got.distortion, free.distortion)


@pytest.mark.parametrize("rule", ["lantern", "gsd"])
def test_a_cap_computes_the_distortion_of_the_rules_that_gather(rule):
    case, nb, options, cap, _free = _split_case(rule)
    got = ck.verify(**case, neighbours=nb, validate=False, max_distortion=cap, backend="torch", **options)
    assert torch.isfinite(got.distortion).all()


@pytest.mark.parametrize("bad", [-0.1, float("nan"), "0.1", True])
def test_a_bad_cap_is_refused_naming_it(bad):
    case, nb, options, _cap, _free = _split_case("csd", vocab=20, batch=1, length=2)
    with pytest.raises(ValueError, match="max_distortion must be None"):
        ck.verify(**case, neighbours=nb, max_distortion=bad, **options)
    with pytest.raises(ck.ArgumentError if hasattr(ck, "ArgumentError") else ValueError, match="max_distortion"):
        ck.GenerationConfig(max_distortion=bad)


# ----------------------------------------------------------------------------------------------------------------------
# trees: the main draft of a node whose distortion is above the cap is tested strictly
# ----------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", TREE_BACKENDS)
@pytest.mark.parametrize("rule", list(INFORMED_RULES))
def test_trees_under_a_cap_equal_the_reference(backend, rule):
    """A cap of 0: the reference's walk is the strict walk exactly, with zero distortion. A cap at the median of the
    path nodes' distortion: it splits them, and every backend equals the reference."""
    if backend == "triton" and rule == "gsd":
        pytest.skip("triton verifies no gsd trees")
    rows = 8 if backend == "triton" else 32
    inputs = _tree_inputs(2, 3, 12, rows, 40, seed=7, sharp=1.0, uniform_tokens=True)
    options = dict(rule=rule, **INFORMED_RULES[rule])
    if rule.startswith("lantern"):
        nb = ref.codebook_neighbours(torch.randn(40, 3, generator=torch.Generator().manual_seed(2)), 39)
        options.update(neighbours=nb, lantern_k=16)
    seed, offset = torch.tensor([9]), torch.tensor([1])
    free = _reference(inputs, seed, offset, gather_distortion=True, **options)
    if backend == "torch":
        strict = _reference(inputs, seed, offset)
        capped = _reference(inputs, seed, offset, max_distortion=0.0, **options)
        for field in ("accept_len", "path", "tokens", "accept_prob"):
            assert torch.equal(getattr(capped, field), getattr(strict, field)), field
        assert (capped.distortion == 0).all() and (free.distortion > 0).any()
    cap = float(free.distortion[free.distortion > 0].median())
    want = _reference(inputs, seed, offset, max_distortion=cap, **options)
    assert (want.distortion > 0).any() and not torch.equal(want.accept_prob, free.accept_prob)  # the cap splits
    device = _device(backend)
    options = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in options.items()}
    got = ck.verify_tree(**_on(inputs, device), seed=seed.to(device), offset=offset.to(device), backend=backend,
                         max_distortion=cap, **options)
    _assert_same(got, want)


# ----------------------------------------------------------------------------------------------------------------------
# the loop
# ----------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["csd", "arsample", "gsd"])
@pytest.mark.parametrize("loop", [dict(static=False), dict(static=True), dict(tree=(2, 2))], ids=["eager", "static",
                                                                                               "tree"])
def test_a_cap_of_zero_makes_a_relaxed_mode_sjd_token_for_token(mode, loop):
    """max_distortion=0 decides every position with a positive distortion strictly, and where the distortion is 0
    the rule's a(x) is min(1, p/q) (a ≥ min(1, p/q) with q·a ≤ p): the same seeds give sjd's tokens and passes. The
    uncapped mode differs (the comparison has teeth)."""
    from test_tree_csd import PROMPTS, _tiny

    if mode == "gsd" and "tree" in loop:
        pytest.skip("gsd runs no trees")
    model = _tiny(codes=16)
    coupling = "independent" if mode == "gsd" else "maximal"
    kw = dict(window=6, cfg_scale=2.0, seed=[4, 9, 2], coupling=None if mode == "gsd" else coupling, **loop)
    sjd = ck.generate(model, PROMPTS, mode="sjd", **dict(kw, coupling=coupling))
    capped = ck.generate(model, PROMPTS, mode=mode, max_distortion=0.0, **kw)
    free = ck.generate(model, PROMPTS, mode=mode, **kw)
    assert torch.equal(capped.tokens, sjd.tokens) and capped.forward_passes == sjd.forward_passes
    assert (capped.distortion_map == 0).all()
    assert not torch.equal(free.tokens, sjd.tokens)


# ----------------------------------------------------------------------------------------------------------------------
# Triton: every path (the interpreter on a CPU)
# ----------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("path", ["register", "chunked", "split"])
@pytest.mark.parametrize("rule", RELAXED)
def test_every_triton_path_equals_the_reference_under_a_cap(rule, path):
    """A cap at the median of the window's distortion, with an informed mask: the path equals reference.verify;
    above the cap the strict rule's a(x) and zero distortion."""
    triton_kernel = pytest.importorskip("test_triton_kernel")
    if rule == "gsd" and path != "register":
        pytest.skip("gsd runs on the register path")
    vocab = 100
    case = triton_kernel.make_case(3, 6, vocab, q="jacobi", gen_seed=4)
    nb = ref.codebook_neighbours(torch.randn(vocab, 3, generator=torch.Generator().manual_seed(1)), 12)
    mask = torch.rand(3, 6, generator=torch.Generator().manual_seed(2)) < 0.8
    options = dict(path=path, rule=rule, neighbours=nb, tvd_threshold=1.0, informed=mask)
    free, _ = triton_kernel.run_both(case, gather_distortion=True, **options)
    drafted = (case["draft_tokens"] >= 0) & mask
    cap = _median_cap(free.distortion[drafted])
    got, expected = triton_kernel.run_both(case, max_distortion=cap, **options)
    triton_kernel.check(got, expected, vocab)
    above = drafted & (free.distortion > cap)
    assert above.any() and (got.distortion[above] == 0).all()
    strict, _ = triton_kernel.run_both(case, **dict(options, rule="strict"))
    torch.testing.assert_close(got.accept_prob[above], strict.accept_prob[above])
