"""csd on draft trees: the relaxed test on the main draft only, the residual norm(max(p − q, 0)) for the siblings.

Exact: at a node with K candidates (the main draft from q, the siblings from q or another sibling_q without
replacement), every candidate set and every outcome of reference.tree_walk, enumerated, gives the emitted token
exactly chain csd's law q·a + (1 − Σq·a)·norm(max(p − q, 0)); verify_tree's distortion at the path nodes is the
closed form of that law. The loop: generate(mode="csd", tree=(K, D)) runs in the static loop by default, is greedy-
exact, is sjd+tree token for token with λ = 0, and the law of its first iteration's tokens is chain csd's (χ²)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from scipy.stats import chi2

from csd_kernels import reference as ref

pytestmark = pytest.mark.usefixtures("one_thread")

V = 5
# the target at the node, the main draft's q and a sibling_q: p > q on three tokens, so the residual the siblings are
# tested against is not a point mass (a point mass hides how the siblings are tested)
P = torch.tensor([0.35, 0.3, 0.2, 0.1, 0.05], dtype=torch.float64)
Q = torch.tensor([0.1, 0.15, 0.15, 0.3, 0.3], dtype=torch.float64)
S = torch.tensor([0.3, 0.1, 0.25, 0.15, 0.2], dtype=torch.float64)


def _chain_csd_law(p, q, entropy_coef, tvd_threshold):
    """Chain csd's output law at one position: q·a + (1 − Σ q·a)·norm(max(p − q, 0)), and its q·a."""
    q_times_a = ref.accepted_mass("csd", p, q, entropy_coef=entropy_coef, tvd_threshold=tvd_threshold)
    residual = (p - q).clamp(min=0)
    residual = torch.where(residual.sum() > 0, residual / residual.sum(), p)
    return ref.output_distribution(p, q, q_times_a, residual), q_times_a


def _candidate_sets(q, sibling_q, k: int) -> list:
    """[(candidates, probability)]: x_0 ~ q, x_1 .. x_{k-1} from sibling_q without x_0, without replacement."""
    sets = []
    for xs in itertools.permutations(range(q.numel()), k):
        prob, left = float(q[xs[0]]), 1.0 - float(sibling_q[xs[0]])
        for x in xs[1:]:
            prob *= float(sibling_q[x]) / left
            left -= float(sibling_q[x])
        sets.append((xs, prob))
    return sets


def _node_law(p, q, sibling_q, k: int, rule: str, entropy_coef: float, tvd_threshold: float, monkeypatch,
              **rule_params):
    """The exact law of the token reference.tree_walk emits at a node with k candidates (slot 1 of tree (k, 2); the
    root's one child is accepted with a = 1).

    One batch row per candidate set and outcome j (candidate j accepted: u_accept 1.0 for the ranks before it, 0.0
    for it; j = k: all rejected). a_j is the walk's accept_prob; the law the walk draws the correction from is its
    inverse_cdf_sample's weights, recorded."""
    layout = ref.tree_layout(k, 2, ref.tree_nodes(k, 2) + 1)
    kids = layout.children[1].tolist()  # the node's children by rank
    sets = _candidate_sets(q, sibling_q if sibling_q is not None else q, k)
    rows = [(xs, prob, j) for xs, prob in sets for j in range(k + 1)]
    batch, slots = len(rows), layout.parent.numel()
    tokens = torch.zeros(batch, slots, dtype=torch.int64)
    u_accept = torch.ones(batch, slots, dtype=torch.float64)
    u_accept[:, 1] = 0.0
    for b, (xs, _, j) in enumerate(rows):
        tokens[b, kids] = torch.tensor(xs)
        if j < k:
            u_accept[b, kids[j]] = 0.0
    root_q = torch.full_like(p, 1.0 / p.numel())
    p_slots = torch.stack([root_q, p] + [root_q] * (slots - 2))[None].expand(batch, -1, -1)
    qs = torch.stack([root_q, q])[None].expand(batch, -1, -1)
    sib = None if sibling_q is None else torch.stack([root_q, sibling_q])[None].expand(batch, -1, -1)
    drawn_from, sample = [], ref.inverse_cdf_sample

    def recording(weights, u):
        drawn_from.append(weights)
        return sample(weights, u)

    monkeypatch.setattr(ref.tree, "inverse_cdf_sample", recording)  # the name tree_walk calls
    walk = ref.tree_walk(p_slots, tokens, qs, layout, u_accept, torch.full_like(u_accept, 0.5), rule=rule,
                         entropy_coef=entropy_coef, tvd_threshold=tvd_threshold, sibling_q=sib, **rule_params)
    monkeypatch.undo()
    assert (walk.path[:, 1] == 1).all()
    residual = drawn_from[-1] / drawn_from[-1].sum(-1, keepdim=True)
    a = walk.accept_prob[:, 1].reshape(len(sets), k + 1)[:, :k]  # a_j of candidate j, given the earlier rejected
    law = torch.zeros_like(p)
    for i, (xs, prob) in enumerate(sets):
        reach = prob
        for j in range(k):
            law[xs[j]] += reach * a[i, j]
            reach = reach * (1 - a[i, j])
        law += reach * residual[i * (k + 1) + k]
    return law


def _verify_tree_distortion(p, q, sibling_q, k: int, entropy_coef: float, tvd_threshold: float) -> float:
    """verify_tree's distortion at the node of _node_law (float32 logits log p; the root's child accepted)."""
    layout = ref.tree_layout(k, 2, ref.tree_nodes(k, 2) + 1)
    slots = layout.parent.numel()
    root_q = torch.full_like(p, 1.0 / p.numel())
    logits = torch.log(torch.stack([root_q, p] + [root_q] * (slots - 2)))[None].float()
    tokens = (torch.arange(slots) % p.numel())[None]
    sib = None if sibling_q is None else torch.stack([root_q, sibling_q])[None]
    res = ref.verify_tree(logits, tokens, torch.stack([root_q, q])[None], layout, rule="csd",
                          entropy_coef=entropy_coef, tvd_threshold=tvd_threshold, sibling_probs=sib,
                          seed=torch.tensor([0]), offset=torch.tensor([0]))
    assert int(res.path[0, 1]) == 1
    return float(res.distortion[0, 1])


# (λ, τ): the relaxation applies (τ = 1 > TVD), strongly; TVD >= τ, so it does not; λ = 0
RELAXED = [(0.5, 1.0), (3.0, 1.0)]
NOT_RELAXED = [(0.5, 0.5 * float(ref.total_variation(P, Q))), (0.0, 1.0)]


@pytest.mark.parametrize("k", [2, 3])
@pytest.mark.parametrize("sibling_q", [None, S], ids=["siblings_from_q", "siblings_from_sibling_q"])
@pytest.mark.parametrize("entropy_coef, tvd_threshold", RELAXED + NOT_RELAXED)
def test_csd_node_law_is_chain_csd(k, sibling_q, entropy_coef, tvd_threshold, monkeypatch):
    law = _node_law(P, Q, sibling_q, k, "csd", entropy_coef, tvd_threshold, monkeypatch)
    chain, q_times_a = _chain_csd_law(P, Q, entropy_coef, tvd_threshold)
    torch.testing.assert_close(law, chain, rtol=0, atol=1e-12)
    distortion = float(ref.closed_form_distortion(P, Q, q_times_a))
    assert abs(0.5 * float((law - P).abs().sum()) - distortion) < 1e-12
    assert abs(_verify_tree_distortion(P, Q, sibling_q, k, entropy_coef, tvd_threshold) - distortion) < 1e-6
    if (entropy_coef, tvd_threshold) in RELAXED:
        assert distortion > 0.02  # the relaxation moves the law: the comparison above has teeth
    else:
        torch.testing.assert_close(law, P, rtol=0, atol=1e-12)  # λ = 0 or TVD >= τ: lossless, as sjd


@pytest.mark.parametrize("k", [2, 3])
@pytest.mark.parametrize("rule, params", [("gsd", dict(group_rank=1, group_delta=0.2)), ("arsample", {}),
                                          ("lantern", dict(lantern_delta=0.2, lantern_k=2)),
                                          ("lantern++", dict(lantern_lambda=3.0, lantern_k=2))])
def test_every_rule_s_node_law_is_its_chain_law(k, rule, params, monkeypatch):
    """Any rule on the main draft, rejected into the rule's resampling law (gsd: max(p − q·a, 0)), then strict RRS of
    the siblings: the emitted token has the chain law q·a + (1 − Σq·a)·r of that rule, exactly."""
    if rule.startswith("lantern"):
        params = dict(params, neighbours=torch.tensor([[1, 2], [0, 2], [1, 3], [4, 2], [3, 2]]))
    law = _node_law(P, Q, S, k, rule, 0.5, 0.65, monkeypatch, **params)
    acc = ref.Acceptance(rule, P, Q, **params)
    q_times_a, residual = acc.accepted_mass(), acc.residual()
    chain = ref.output_distribution(P, Q, q_times_a, residual / residual.sum())
    torch.testing.assert_close(law, chain, rtol=0, atol=1e-12)
    assert 0.5 * float((law - P).abs().sum()) > 0.01  # the relaxation moves the law: the comparison has teeth


@pytest.mark.parametrize("k", [2, 3])
def test_strict_node_law_is_p(k, monkeypatch):
    torch.testing.assert_close(_node_law(P, Q, S, k, "strict", 3.0, 1.0, monkeypatch), P, rtol=0, atol=1e-12)


# ----------------------------------------------------------------------------------------------------------------------
# verify_tree's statistics at the path nodes
# ----------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("rule", ["csd", "strict"])
@pytest.mark.parametrize("branching, depth, slots", [(2, 3, 10), (3, 2, 8)])
def test_verify_tree_distortion_is_the_closed_form_at_path_nodes(rule, branching, depth, slots):
    """H, TVD and csd's closed-form distortion of p at path[i] against the q of level i; 0 past the stop, 0
    distortion under the strict rule and where no main draft sits below the node."""
    layout = ref.tree_layout(branching, depth, slots)
    batch, levels = 256, layout.levels
    g = torch.Generator().manual_seed(4)
    logits = 1.5 * torch.randn(batch, slots, V, generator=g)
    q = torch.softmax(torch.randn(batch, levels, V, generator=g), -1)
    q[:, 0] = torch.softmax(logits[:, 0], -1) * 0.7 + 0.3 / V  # close to p at the root: the relaxation applies often
    tokens = torch.randint(0, V, (batch, slots), generator=g)
    tokens[:5, 2] = -1  # a missing main draft below slot 1: no distortion there
    res = ref.verify_tree(logits, tokens, q, layout, rule=rule, entropy_coef=0.5, tvd_threshold=0.5,
                          seed=torch.arange(batch), offset=torch.zeros(1, dtype=torch.int64))
    p = torch.softmax(logits.double(), -1)
    rows = torch.arange(batch)[:, None]
    node = res.path.clamp(min=0)
    p_at, q_at = p[rows, node], torch.cat([q, torch.zeros_like(q[:, :1])], 1).double()
    h, tvd = ref.entropy(p_at), ref.total_variation(p_at, q_at)
    below = layout.children[node, 0]
    has_draft = (below >= 0) & (tokens.gather(1, below.clamp(min=0)) >= 0)
    closed = ref.closed_form_distortion(p_at, q_at, ref.accepted_mass(rule, p_at, q_at, h=h, tvd=tvd, entropy_coef=0.5,
                                                                      tvd_threshold=0.5))
    on_path = res.path >= 0
    for got, want in [(res.entropy, h), (res.tvd, tvd), (res.distortion, torch.where(has_draft, closed, 0))]:
        torch.testing.assert_close(got.double(), torch.where(on_path, want, 0), rtol=1e-5, atol=1e-6)
    if rule == "csd":
        assert (res.distortion > 1e-3).float().mean() > 0.1  # the relaxation applied at many path nodes
    else:
        assert (res.distortion == 0).all()


# ----------------------------------------------------------------------------------------------------------------------
# the loop
# ----------------------------------------------------------------------------------------------------------------------
def _tiny(codes: int = 4, grid=(4, 5)):
    from conftest import build_tiny_llama

    from csd_kernels.models import ImageGPT

    return ImageGPT(build_tiny_llama(24, seed=1), image_token_range=(0, codes), grid=grid, null_token_id=23)


PROMPTS = torch.tensor([[16], [17], [18]])


@pytest.mark.parametrize("tree, window", [((2, 2), 4), ((3, 2), 6), ((2, 3), 8)])
def test_greedy_csd_tree_equals_ar(tree, window):
    from csd_kernels.decoding import generate

    model = _tiny()
    ar = generate(model, PROMPTS, mode="ar", temperature=0, cfg_scale=2.0)
    out = generate(model, PROMPTS, mode="csd", window=window, temperature=0, cfg_scale=2.0, tree=tree, seed=5)
    assert torch.equal(out.tokens, ar.tokens) and out.forward_passes < ar.forward_passes


def test_csd_tree_without_relaxation_is_sjd_tree_and_relaxed_has_distortion():
    """λ = 0: a = min(1, p/q) exactly, so with the same seeds csd + tree gives sjd + tree's tokens and passes (the
    same streams); λ > 0: other tokens, fewer passes, a nonzero distortion map (sjd's is zero)."""
    from csd_kernels.decoding import generate

    model = _tiny(codes=16)
    kw = dict(window=8, cfg_scale=2.0, tree=(3, 2), seed=[4, 9, 2])
    sjd = generate(model, PROMPTS, mode="sjd", **kw)
    plain = generate(model, PROMPTS, mode="csd", entropy_coef=0.0, **kw)
    assert torch.equal(plain.tokens, sjd.tokens) and plain.accepted == sjd.accepted
    assert (sjd.distortion_map == 0).all() and plain.distortion_map.abs().max() < 1e-6  # q·(p/q) rounds
    relaxed = generate(model, PROMPTS, mode="csd", entropy_coef=0.5, tvd_threshold=1.0, **kw)
    assert not torch.equal(relaxed.tokens, sjd.tokens) and relaxed.forward_passes < sjd.forward_passes
    assert (relaxed.distortion_map > 0).float().mean() > 0.3 and (relaxed.distortion_map >= 0).all()
    assert (relaxed.tvd_map > 0).all() and (relaxed.entropy_map > 0).all()


def test_tree_runs_the_static_loop_by_default(monkeypatch):
    import importlib

    from csd_kernels.decoding import generate

    generate_module = importlib.import_module("csd_kernels.decoding.generate")  # (the package.generate: the function)

    model = _tiny(codes=16)
    kw = dict(mode="csd", window=8, cfg_scale=2.0, tree=(2, 2), seed=3)
    calls = []
    step = generate_module.tree_step
    monkeypatch.setattr(generate_module, "tree_step", lambda *a, **k: calls.append(1) or step(*a, **k))
    default = generate(model, PROMPTS, **kw)
    assert len(calls) >= default.forward_passes > 0
    explicit = generate(model, PROMPTS, static=True, **kw)
    assert torch.equal(default.tokens, explicit.tokens) and default.accepted == explicit.accepted
    with pytest.raises(ValueError, match=r"tree=\(2, 2\).*static=False.*K=2, D=2, W=8"):
        generate(model, PROMPTS, static=False, **kw)


@pytest.mark.parametrize("mode", ["ar", "jd", "gsd"])
def test_other_modes_refuse_trees_naming_k_d_w(mode):
    from csd_kernels.decoding import generate

    with pytest.raises(ValueError, match=rf"tree=\(2, 2\).*mode '{mode}'.*K=2, D=2, W=8"):
        generate(_tiny(), PROMPTS, mode=mode, window=8, tree=(2, 2))


# The loop's law. After the first iteration a position's q is a stale p (a random function of the history), so the
# loop's law is a mixture of csd laws, different for trees and chains (docs/trees.md); in the first iteration every
# q is 1/V (fresh drafts, draft_init="uniform"), so: token 0 has chain csd's law against 1/V at the prompt, and
# token 1, given token 0 was the accepted main draft (the row committed >= 2 tokens in pass 1), chain csd's law
# against 1/V at (prompt, token 0) — the node with K candidates, main and siblings drawn in the loop.
FIRST_SAMPLES = 20000
TEMPERATURE, LAMBDA, TAU = 1.0, 0.25, 1.0


def _first_iteration_p_value(model, tree, window) -> float:
    from csd_kernels.decoding import generate

    out = generate(model, torch.full((FIRST_SAMPLES, 1), 8), mode="csd", window=window, tree=tree, cfg_scale=1.0,
                   temperature=TEMPERATURE, entropy_coef=LAMBDA, tvd_threshold=TAU, seed=torch.arange(FIRST_SAMPLES),
                   draft_init="uniform")
    x0, x1 = out.tokens[:, 0], out.tokens[:, 1]
    both = torch.tensor(out.accepted[0]) >= 2
    with torch.no_grad():
        logits = model.lm(torch.cat([torch.full((4, 1), 8), torch.arange(4)[:, None]], 1)).logits[:, :, :4]
    p = torch.softmax(logits.double() / TEMPERATURE, -1)  # [x0, 2, V]: at the prompt (row 0 of each), after x0
    stat, df = _chi2(x0, p[0, 0])  # uniform first drafts are uninformed: the strict test, law p (docs/op.md)
    for x in range(4):
        s, d = _chi2(x1[both & (x0 == x)], p[x, 1])
        stat, df = stat + s, df + d
    return float(chi2.sf(stat, df))


def _chi2(samples: torch.Tensor, law: torch.Tensor) -> tuple[float, int]:
    counts = np.bincount(samples.numpy(), minlength=law.numel())
    expected = law.numpy() * len(samples)
    keep = expected > 0
    return float(((counts[keep] - expected[keep]) ** 2 / expected[keep]).sum()), int(keep.sum()) - 1


@pytest.fixture(scope="module")
def three_positions():
    """4 image codes (ids 0..3), class token 8, null 9 (tests/test_tree.py's LM) on a 1 x 3 grid: the two tokens
    tested here have drafts in the first window (a window's last position has none)."""
    from conftest import build_tiny_llama

    from csd_kernels.models import ImageGPT

    return ImageGPT(build_tiny_llama(10, seed=3, init=0.15), image_token_range=(0, 4), grid=(1, 3), null_token_id=9)


def test_first_iteration_law_is_p_for_uninformed_drafts(three_positions):
    """The first iteration's drafts are uniform (no row above on a 1 x 3 grid): uninformed, so the tree loop tests
    them strictly under csd too (verify_tree's ``informed``, issue 45) and the law is p. N = 20000 rows, 15 df
    (token 0: 3, token 1 given each token 0: 4 x 3). Power: the loop relaxing them (csd's law, total variation
    0.08 - 0.15 from p here: the planted ``informed=None`` in decoding/tree.py, p-value below 1e-6) and a rejected main
    draft's residual left out of the siblings' test are rejected at p < 1e-6. csd's relaxation of an informed
    main draft in the tree is held exactly by test_csd_node_law_is_chain_csd."""
    assert _first_iteration_p_value(three_positions, (3, 2), 6) > 1e-3
