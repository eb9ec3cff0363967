"""Draft trees with 2-D candidates (decoding/tree.py, ``above_law``): with fresh drafts from the row above and K = 2,
a level's sibling is the committed token one grid row up where it differs from the main draft (a one-hot sibling
law), drawn from and tested against that law (verify_tree's sibling_probs).

Exact: at a node, the main draft x_0 ~ q and the sibling from ``above_law`` (one-hot at the token above, or q
without x_0 where the token above is x_0), every candidate set and outcome of reference.tree_walk enumerated: the
emitted token has exactly p's law (strict), chain csd's law (csd). The loop: the law the siblings are drawn from is
the one verify_tree tests them against, at every call, and siblings from above occur; the tokens have ar's law (χ²,
weaker: it did not catch the loop passing no sibling_probs, which the law-equality test does)."""

from __future__ import annotations

import pytest
import torch

from csd_kernels import reference as ref
from csd_kernels.decoding import tree as tree_module

pytestmark = pytest.mark.usefixtures("one_thread")

V = 5
# the target at the node and the main draft's q (test_tree_csd.py's): p > q on three tokens, so the residual the
# sibling is tested against is not a point mass
P = torch.tensor([0.35, 0.3, 0.2, 0.1, 0.05], dtype=torch.float64)
Q = torch.tensor([0.1, 0.15, 0.15, 0.3, 0.3], dtype=torch.float64)


def _sets(q: torch.Tensor, above: int) -> list:
    """[(x_0, x_1, probability, sibling law)]: x_0 ~ q, the sibling law above_law gives for x_0 (the loop's function,
    one row per x_0), x_1 from it without x_0."""
    main = torch.arange(V)[:, None]  # [V, 1]: one row per main draft, one level
    known = torch.ones_like(main, dtype=torch.bool)
    law = tree_module.above_law(q.expand(V, 1, V), main, torch.full_like(main, above), known)
    sets = []
    for x0 in range(V):
        s = law[x0, 0].clone()
        s[x0] = 0
        for x1 in range(V):
            if s[x1] > 0:
                sets.append((x0, x1, float(q[x0]) * float(s[x1] / s.sum()), law[x0, 0]))
    return sets


def _node_law(p, q, above: int, monkeypatch, tested_against=None, **rule) -> torch.Tensor:
    """The exact law of the token reference.tree_walk emits at a node with the main draft and one sibling (slot 1 of
    tree (2, 2); the root's one child accepted with a = 1), the sibling drawn from above_law's law and tested against
    ``tested_against`` (default: that law, as the loop passes it). One batch row per candidate set and outcome j
    (candidate j accepted; j = 2: both rejected); a_j is the walk's accept_prob, the law of the correction its
    inverse_cdf_sample's weights (recorded)."""
    layout = ref.tree_layout(2, 2, ref.tree_nodes(2, 2) + 1)
    kids = layout.children[1].tolist()
    sets = _sets(q, above)
    rows = [(s, j) for s in sets for j in range(3)]
    batch, slots = len(rows), layout.parent.numel()
    tokens = torch.zeros(batch, slots, dtype=torch.int64)
    u_accept = torch.ones(batch, slots, dtype=torch.float64)
    u_accept[:, 1] = 0.0
    sibling_q = torch.empty(batch, 2, V, dtype=torch.float64)
    flat = torch.full_like(p, 1.0 / V)
    for b, ((x0, x1, _, law), j) in enumerate(rows):
        tokens[b, kids] = torch.tensor([x0, x1])
        if j < 2:
            u_accept[b, kids[j]] = 0.0
        sibling_q[b] = torch.stack([flat, law if tested_against is None else tested_against])
    p_slots = torch.stack([flat, p] + [flat] * (slots - 2))[None].expand(batch, -1, -1)
    qs = torch.stack([flat, q])[None].expand(batch, -1, -1)
    drawn_from, sample = [], ref.inverse_cdf_sample

    def recording(weights, u):
        drawn_from.append(weights)
        return sample(weights, u)

    monkeypatch.setattr(ref.tree, "inverse_cdf_sample", recording)
    walk = ref.tree_walk(p_slots, tokens, qs, layout, u_accept, torch.full_like(u_accept, 0.5), sibling_q=sibling_q,
                         **rule)
    monkeypatch.undo()
    assert (walk.path[:, 1] == 1).all()
    residual = drawn_from[-1] / drawn_from[-1].sum(-1, keepdim=True)
    a = walk.accept_prob[:, 1].reshape(len(sets), 3)[:, :2]
    law = torch.zeros_like(p)
    for i, (x0, x1, prob, _) in enumerate(sets):
        law[x0] += prob * a[i, 0]
        law[x1] += prob * (1 - a[i, 0]) * a[i, 1]
        law += prob * (1 - a[i, 0]) * (1 - a[i, 1]) * residual[i * 3 + 2]
    return law


def _chain_csd_law(p, q, entropy_coef, tvd_threshold) -> torch.Tensor:
    q_times_a = ref.accepted_mass("csd", p, q, entropy_coef=entropy_coef, tvd_threshold=tvd_threshold)
    residual = (p - q).clamp(min=0)
    return ref.output_distribution(p, q, q_times_a, residual / residual.sum())


@pytest.mark.parametrize("above", range(V))  # p > q (0, 1, 2: the residual has mass there) and p < q (3, 4)
def test_above_sibling_node_law_is_exact(above, monkeypatch):
    """Strict: the emitted token has law p to 1e-12, whichever token is above (the sibling law one-hot at it where
    x_0 differs, q where x_0 is it). Tested against q instead (the law the siblings were drawn from ignored): not p."""
    law = _node_law(P, Q, above, monkeypatch)
    torch.testing.assert_close(law, P, rtol=0, atol=1e-12)
    wrong = _node_law(P, Q, above, monkeypatch, tested_against=Q)
    assert float((wrong - P).abs().max()) > 0.01  # the enumeration has teeth


@pytest.mark.parametrize("above", [0, 3])
@pytest.mark.parametrize("entropy_coef, tvd_threshold", [(0.5, 1.0), (3.0, 1.0), (0.0, 1.0)])
def test_above_sibling_node_law_is_chain_csd(above, entropy_coef, tvd_threshold, monkeypatch):
    """csd relaxes the main draft only; the one-hot sibling, tested strictly against the residual, keeps the node's
    law chain csd's q·a + (1 − Σq·a)·norm(max(p − q, 0)) to 1e-12."""
    law = _node_law(P, Q, above, monkeypatch, rule="csd", entropy_coef=entropy_coef, tvd_threshold=tvd_threshold)
    torch.testing.assert_close(law, _chain_csd_law(P, Q, entropy_coef, tvd_threshold), rtol=0, atol=1e-12)


def test_above_law_is_one_hot_only_where_it_adds_a_candidate():
    """One-hot at the token above where it is committed (known), the level has a main draft, and the token differs
    from it; q elsewhere."""
    q = torch.softmax(torch.randn(1, 4, V, dtype=torch.float64), -1)
    main, token = torch.tensor([[1, 2, -1, 3]]), torch.tensor([[4, 2, 0, 0]])
    known = torch.tensor([[True, True, True, False]])
    law = tree_module.above_law(q, main, token, known)
    torch.testing.assert_close(law[0, 0], torch.nn.functional.one_hot(torch.tensor(4), V).double())
    torch.testing.assert_close(law[0, 1:], q[0, 1:], rtol=0, atol=0)


@pytest.mark.parametrize("backend", ["torch", "cpu"])
def test_candidates_from_a_one_hot_law_are_the_token_above(backend, monkeypatch):
    """The loop draws its siblings with ops.drafts.tree_candidates from the law: from a one-hot law (K = 2) the
    sibling is its token on every implementation; K = 3 leaves rank 2 missing (why the loop uses it at K = 2 only)."""
    from csd_kernels.ops import drafts

    if backend == "torch":
        monkeypatch.setattr(drafts, "_implementation", lambda device: "torch")
    law = torch.nn.functional.one_hot(torch.tensor([[3, 0, 2]]), 6).float()
    main = torch.tensor([[1, 4, 5]])
    seed, offset = torch.tensor([7]), torch.tensor([2])
    assert drafts.tree_candidates(seed, offset, main, law, 2, first=1).tolist() == [[[1, 3], [4, 0], [5, 2]]]
    assert drafts.tree_candidates(seed, offset, main, law, 3, first=1)[..., 2].eq(-1).all()


# ----------------------------------------------------------------------------------------------------------------------
# the loop
# ----------------------------------------------------------------------------------------------------------------------
LOOP_SAMPLES = 20000


@pytest.fixture(scope="module")
def two_rows():
    """4 image codes on a 2 x 2 grid (256 joint outcomes): positions 2 and 3 have a committed token above."""
    from conftest import build_tiny_llama

    from csd_kernels.models import ImageGPT

    return ImageGPT(build_tiny_llama(10, seed=3, init=0.15), image_token_range=(0, 4), grid=(2, 2), null_token_id=9)


class Calls:
    """Wraps the tree loop's tree_candidates and verify_tree: the law each level's siblings were drawn from and the
    one verify_tree tested them against (its sibling_probs, or draft_probs when None), per iteration."""

    def __init__(self, monkeypatch):
        self.drawn, self.tested, self.one_hot_siblings = [], [], 0
        draw, verify = tree_module.tree_candidates, tree_module.verify_tree

        def drawing(seed, offset, main, q, branching, first):
            self.drawn.append(q.clone())
            return draw(seed, offset, main, q, branching, first)

        def verifying(cond, nodes, q, layout, **kw):
            levels = slice(1, layout.depth_limit)  # the levels with siblings
            law = q if kw["sibling_probs"] is None else kw["sibling_probs"]
            self.tested.append(law[:, levels].clone())
            self.one_hot_siblings += int((law[:, levels] != q[:, levels]).any(-1).sum())
            return verify(cond, nodes, q, layout, **kw)

        monkeypatch.setattr(tree_module, "tree_candidates", drawing)
        monkeypatch.setattr(tree_module, "verify_tree", verifying)


def _codes(model, seed: int, samples: int = LOOP_SAMPLES, **kw):
    from csd_kernels.decoding import generate

    out = generate(model, torch.full((samples, 1), 8), cfg_scale=1.0, temperature=0.4,
                   seed=torch.arange(samples) + seed, **kw)
    return (out.tokens * (4 ** torch.arange(4))).sum(1).numpy(), out


def test_loop_tests_the_siblings_against_the_law_they_were_drawn_from(two_rows, monkeypatch):
    """Every iteration of sjd + tree (2, 2) with drafts from above: the siblings' drawing law equals verify_tree's
    sibling law exactly, and some are one-hot (a sibling from above); uniform fresh drafts and K = 3 keep q."""
    calls = Calls(monkeypatch)
    _codes(two_rows, 0, samples=256, mode="sjd", window=4, static=True, tree=(2, 2), draft_init="above")
    assert len(calls.drawn) == len(calls.tested) > 0
    for drawn, tested in zip(calls.drawn, calls.tested):
        torch.testing.assert_close(drawn, tested, rtol=0, atol=0)
    assert calls.one_hot_siblings > 50
    for kw in (dict(tree=(2, 2), window=4, draft_init="uniform"), dict(tree=(3, 2), window=6, draft_init="above")):
        calls = Calls(monkeypatch)
        _codes(two_rows, 0, samples=64, mode="sjd", static=True, **kw)
        assert calls.one_hot_siblings == 0


def test_sjd_tree_with_siblings_from_above_is_lossless(two_rows):
    """Two-sample χ² against ar on the 256 joint outcomes and each position (test_tree.py's test and power)."""
    from test_tree import _same_law_p

    ar, _ = _codes(two_rows, 10**6, mode="ar")
    codes, out = _codes(two_rows, 0, mode="sjd", window=4, static=True, tree=(2, 2), draft_init="above")
    assert out.passes_per_row().mean() < 3.5
    assert _same_law_p(ar, codes) > 1e-3
