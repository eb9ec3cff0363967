"""Draft trees (reference.tree_walk): the law of the emitted tokens, exactly and by χ², on an order-2 Markov target
over V = 4 tokens; the three SJD-PAC defects, each planted as a small variant here, are caught by the same test."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from csd_kernels import reference as ref

pytestmark = pytest.mark.usefixtures("one_thread")

V = 4
PREFIX = (0, 1)  # x_{n-2}, x_{n-1}: the committed prefix the window is conditioned on
SAMPLES = 40000


def _markov(seed: int = 0) -> torch.Tensor:
    """[V, V, V] float64: p(x_t | x_{t-2}, x_{t-1}), peaked (so that q is far from p and bias shows)."""
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(2.5 * torch.randn(V, V, V, generator=g, dtype=torch.float64), -1)


def _stale_q(levels: int, seed: int = 1) -> torch.Tensor:
    """[levels, V] float64: the q of each draft level (a stale p, strictly positive)."""
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(1.5 * torch.randn(levels, V, generator=g, dtype=torch.float64), -1)


def _ar_law(table: torch.Tensor, length: int) -> np.ndarray:
    """[V^length] the exact joint law of `length` tokens after PREFIX (index Σ x_k V^k)."""
    law = np.zeros(V**length)
    for seq in itertools.product(range(V), repeat=length):
        prob, a, b = 1.0, *PREFIX
        for x in seq:
            prob *= float(table[a, b, x])
            a, b = b, x
        law[sum(x * V**k for k, x in enumerate(seq))] = prob
    return law


# ----------------------------------------------------------------------------------------------------------------------
# Monte Carlo: the reference sampler (Philox tree stream, Gumbel-top-K siblings, vectorised walk) against the law
# ----------------------------------------------------------------------------------------------------------------------
def _node_tokens(layout: ref.TreeLayout, cand: torch.Tensor) -> torch.Tensor:
    """[N, S] slot tokens from cand [N, levels, K] (slot 0: the prefix's last token)."""
    depth, rank = layout.depth, layout.rank
    tokens = cand[:, (depth[1:] - 1), rank[1:]]
    return torch.cat([torch.full((cand.shape[0], 1), PREFIX[1]), tokens], 1)


def _slot_probs(layout: ref.TreeLayout, table: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """[N, S, V] p at each slot's output: table[token of the parent, token of the slot]."""
    parent_tok = torch.cat([torch.full((tokens.shape[0], 1), PREFIX[0]), tokens[:, layout.parent[1:]]], 1)
    return table[parent_tok.clamp(min=0), tokens.clamp(min=0)]


def _draw(layout, q, seeds, gen, siblings="without_replacement", sibling_q=None):
    """cand [N, levels, K]: main drafts ~ q, siblings from the tree stream (or a planted variant) drawn from
    sibling_q (default q)."""
    n, levels, k = seeds.numel(), layout.levels, layout.branching
    qn = q[None].expand(n, -1, -1)
    main = ref.inverse_cdf_sample(qn, torch.rand(n, levels, generator=gen, dtype=torch.float64))
    if siblings == "without_replacement":
        sn = qn if sibling_q is None else sibling_q[None].expand(n, -1, -1)
        return ref.tree_candidates(main, sn, k, ref.tree_gumbel_uniforms(seeds, torch.zeros(1), n, levels, V))
    # planted defect 2: siblings i.i.d. from the stale distribution (with replacement: duplicates of each other and
    # of the main draft possible) while the walk's RRS assumes draws without replacement
    u = torch.rand(n, levels, k - 1, generator=gen, dtype=torch.float64)
    sib = ref.inverse_cdf_sample(qn[:, :, None].expand(-1, -1, k - 1, -1), u)
    return torch.cat([main[..., None], sib], -1)


def _longest_path_walk(p, tokens, q, layout, u_accept, u_sample):
    """Planted defect 3: test every child of every node (sibling k against the residual of siblings < k, accepted
    or not) and keep the longest accepted root path (lowest rank on ties); emit from the stop node's last residual."""
    n, slots, _ = p.shape
    rows = torch.arange(n)
    accepted = torch.zeros(n, slots, dtype=torch.bool)
    residual = p.clone()
    for s in range(slots):
        p_j, q_j = p[:, s], q[:, min(int(layout.depth[s]), layout.levels - 1)]
        for c in layout.children[s].tolist():
            if c < 0:
                continue
            a, p_j, q_j = ref.rrs_step(p_j, q_j, tokens[:, c])
            accepted[:, c] = u_accept[:, c] < a
        residual[:, s] = p_j
    deep = torch.zeros(n, slots, dtype=torch.int64)
    for s in reversed(range(slots)):
        for c in layout.children[s].tolist():
            if c >= 0:
                deep[:, s] = torch.maximum(deep[:, s], torch.where(accepted[:, c], deep[:, c] + 1, 0))
    cur, out = torch.zeros(n, dtype=torch.int64), torch.full((n, layout.levels + 1), -1)
    done = torch.zeros(n, dtype=torch.bool)
    for level in range(layout.levels + 1):
        best = torch.full_like(cur, -1)
        for r in reversed(range(layout.children.shape[1])):  # the lowest rank of the deepest wins
            slot = layout.children[cur, r]
            safe = slot.clamp(min=0)
            best = torch.where((slot >= 0) & accepted[rows, safe] & (deep[rows, safe] + 1 == deep[rows, cur]), slot,
                               best)
        stop = ~done & (best < 0)
        emitted = ref.inverse_cdf_sample(residual[rows, cur], u_sample[rows, cur])
        out[:, level] = torch.where(stop, emitted, out[:, level])
        go = ~done & ~stop
        out[:, level] = torch.where(go, tokens[rows, best.clamp(min=0)], out[:, level])
        cur, done = torch.where(go, best, cur), done | stop
    return out


def _emitted(branching, depth, defect=None, table=None, samples=SAMPLES, sibling_q=None):
    """[N, D + 1] tokens after PREFIX: the window's accepted and emitted tokens, completed autoregressively (siblings
    drawn from and tested against sibling_q [levels, V] when given)."""
    table = _markov() if table is None else table
    layout = ref.tree_layout(branching, depth, ref.tree_nodes(branching, depth) + 1)  # the tree alone (M = D)
    q = _stale_q(layout.levels)
    seeds = torch.arange(samples, dtype=torch.int64) + 7
    gen = torch.Generator().manual_seed(3)
    cand = _draw(layout, q, seeds, gen, "iid_residual" if defect == "stale_residual_siblings" else
                 "without_replacement", sibling_q)
    tokens = _node_tokens(layout, cand)
    p = _slot_probs(layout, table, tokens)
    u_accept, u_sample = ref.tree_uniforms(seeds, torch.zeros(1, dtype=torch.int64), samples, p.shape[1])
    qn = q[None].expand(samples, -1, -1)
    if defect == "longest_path":
        out = _longest_path_walk(p, tokens, qn, layout, u_accept, u_sample)
    else:
        walk = ref.tree_walk(p, tokens, qn, layout, u_accept, u_sample,
                             sibling_q=None if sibling_q is None else sibling_q[None].expand(samples, -1, -1))
        out = walk.tokens
        if defect == "uniform_after_leaf":  # planted defect 1: the token after a fully accepted path is uniform
            uniform = torch.randint(0, V, (samples,), generator=gen)
            out = out.scatter(1, walk.accept_len[:, None], torch.where(walk.leaf, uniform, out.gather(
                1, walk.accept_len[:, None])[:, 0])[:, None])
    return _complete(out, table, gen)


def _complete(out: torch.Tensor, table: torch.Tensor, gen) -> torch.Tensor:
    """Fill the -1 tail of every row with autoregressive draws from the target."""
    out = out.clone()
    a = torch.full((out.shape[0],), PREFIX[0])
    b = torch.full((out.shape[0],), PREFIX[1])
    for k in range(out.shape[1]):
        draw = ref.inverse_cdf_sample(table[a, b], torch.rand(out.shape[0], generator=gen, dtype=torch.float64))
        out[:, k] = torch.where(out[:, k] < 0, draw, out[:, k])
        a, b = b, out[:, k]
    return out


def _gof_p(seqs: torch.Tensor, law: np.ndarray) -> float:
    """χ² goodness of fit of the joint outcomes against the exact law; cells with expected count < 5 merged."""
    codes = (seqs * (V ** torch.arange(seqs.shape[1]))).sum(1).numpy()
    counts = np.bincount(codes, minlength=law.size)
    expected = law * len(codes)
    small = expected < 5
    obs = np.append(counts[~small], counts[small].sum())
    exp = np.append(expected[~small], expected[small].sum())
    keep = exp > 0
    return float(chisquare(obs[keep], exp[keep] * obs[keep].sum() / exp[keep].sum()).pvalue)


# Power: N = 40000; a planted defect moves mass between outcomes of the joint law of D + 1 tokens. A shift of total
# variation 0.02 concentrated on two cells of probability 0.05 has noncentrality ≥ N·2·0.02²/0.05 = 640 on ≤ 255 df:
# power > 0.999 at α = 1e-3. The planted copies below are each rejected at p < 1e-6.
CASES = [(1, 3), (2, 2), (2, 3), (3, 2), (3, 3)]


@pytest.mark.parametrize("branching, depth", CASES)
def test_tree_walk_law_equals_the_target(branching, depth):
    law = _ar_law(_markov(), depth + 1)
    assert _gof_p(_emitted(branching, depth), law) > 1e-3


def test_tree_walk_law_with_a_sibling_proposal_equals_the_target():
    """The sampler with siblings drawn (Gumbel-top-K, the main draft removed) from a flattened other law than q, and
    the walk testing them against it (sibling_q): the law of D + 1 tokens is still the target's."""
    siblings = _stale_q(2, seed=4) ** 0.3
    law = _ar_law(_markov(), 3)
    assert _gof_p(_emitted(3, 2, sibling_q=siblings / siblings.sum(-1, keepdim=True)), law) > 1e-3


@pytest.mark.parametrize("defect, branching, depth", [("uniform_after_leaf", 2, 2),
                                                       ("stale_residual_siblings", 3, 2),
                                                       ("longest_path", 2, 3)])
def test_sjd_pac_defects_are_caught(defect, branching, depth):
    """Each of SJD-PAC's three defects, planted as a variant of the sampler, fails the law test the real walk
    passes (test_tree_walk_law_equals_the_target runs the same (K, D))."""
    law = _ar_law(_markov(), depth + 1)
    assert _gof_p(_emitted(branching, depth, defect), law) < 1e-6
    assert _gof_p(_emitted(branching, depth), law) > 1e-3


# ----------------------------------------------------------------------------------------------------------------------
# exact: enumerate every candidate set and every RRS outcome (rrs_step's probabilities) of the walk
# ----------------------------------------------------------------------------------------------------------------------
def _ordered_draw_probs(q: torch.Tensor, k: int, siblings: torch.Tensor = None) -> dict:
    """{(x_1, .., x_k): probability}: the main draft x_1 ~ q, then k - 1 draws without replacement from ``siblings``
    (default q) with x_1 removed."""
    s = q if siblings is None else siblings
    probs = {}
    for xs in itertools.permutations(range(V), k):
        prob, left = float(q[xs[0]]), 1.0 - float(s[xs[0]])
        for x in xs[1:]:
            prob *= float(s[x]) / left if left > 0 else 0.0
            left -= float(s[x])
        probs[xs] = prob
    return probs


def _exact_law(layout: ref.TreeLayout, table: torch.Tensor, q: torch.Tensor,
               sibling_q: torch.Tensor = None) -> np.ndarray:
    """The exact law of the D + 1 tokens the walk emits (AR-completed), by enumeration over candidate sets (siblings
    drawn from ``sibling_q``, default q, and tested against it as rrs_step's ``rest``)."""
    length = layout.levels + 1
    per_level = [_ordered_draw_probs(q[d], layout.branching, None if sibling_q is None else sibling_q[d])
                 for d in range(layout.levels)]
    law = np.zeros(V**length)

    def emit(prefix: tuple, prob: float, a: int, b: int):
        if len(prefix) == length:
            law[sum(x * V**k for k, x in enumerate(prefix))] += prob
            return
        for x in range(V):
            emit(prefix + (x,), prob * float(table[a, b, x]), b, x)

    def walk(slot: int, cand: tuple, prefix: tuple, prob: float, a: int, b: int):
        level = min(int(layout.depth[slot]), layout.levels - 1)
        p_j, q_j = table[a, b], q[level]
        rest = None if sibling_q is None else sibling_q[level]
        for c in layout.children[slot].tolist():
            if c < 0:
                continue
            x = cand[int(layout.depth[c]) - 1][int(layout.rank[c])]
            acc, next_p, next_q = ref.rrs_step(p_j, q_j, torch.tensor(x), rest=rest if layout.rank[c] == 0 else None)
            walk(c, cand, prefix + (x,), prob * float(acc), b, x)
            prob *= 1 - float(acc)
            p_j, q_j = next_p, next_q
        for y in range(V):  # the emitted token, then the autoregressive completion
            emit(prefix + (y,), prob * float(p_j[y]), b, y)

    for sets in itertools.product(*[list(d.items()) for d in per_level]):
        cand = tuple(s[0] for s in sets)
        walk(0, cand, (), float(np.prod([s[1] for s in sets])), *PREFIX)
    return law


@pytest.mark.parametrize("branching, depth", [(2, 2), (2, 3), (3, 2)])
def test_tree_walk_law_is_exact(branching, depth):
    table = _markov()
    layout = ref.tree_layout(branching, depth, ref.tree_nodes(branching, depth) + 1)
    exact = _exact_law(layout, table, _stale_q(layout.levels))
    np.testing.assert_allclose(exact, _ar_law(table, depth + 1), rtol=0, atol=1e-12)


@pytest.mark.parametrize("branching, depth", [(2, 2), (3, 2)])
def test_tree_walk_law_is_exact_with_a_sibling_proposal(branching, depth):
    """Siblings drawn from a law other than q (without replacement, the main draft removed) and tested against it:
    the emitted tokens keep the target's law exactly."""
    table = _markov()
    layout = ref.tree_layout(branching, depth, ref.tree_nodes(branching, depth) + 1)
    q = _stale_q(layout.levels)
    siblings = _stale_q(layout.levels, seed=4) ** 0.3
    exact = _exact_law(layout, table, q, siblings / siblings.sum(-1, keepdim=True))
    np.testing.assert_allclose(exact, _ar_law(table, depth + 1), rtol=0, atol=1e-12)


# ----------------------------------------------------------------------------------------------------------------------
# structure, greedy, streams
# ----------------------------------------------------------------------------------------------------------------------
def test_layout_of_a_binary_tree_of_depth_three():
    layout = ref.tree_layout(2, 3, 10)
    assert ref.tree_nodes(2, 3) == 7 and ref.tree_nodes(1, 4) == 4 and ref.tree_nodes(4, 2) == 5
    assert layout.parent.tolist() == [-1, 0, 1, 2, 3, 4, 1, 2, 6, 6]
    assert layout.depth.tolist() == [0, 1, 2, 3, 4, 5, 2, 3, 3, 3]
    assert layout.main.tolist() == [0, 1, 2, 3, 4, 5]
    assert [int((layout.depth == d).sum()) for d in (1, 2, 3)] == [1, 2, 4]  # the full tree, then the chain
    assert bool(layout.ancestor[9, 6]) and not bool(layout.ancestor[9, 2]) and bool(layout.ancestor[9, 0])


def test_greedy_walk_emits_the_argmax_chain():
    """Temperature 0: p one-hot; with any q (uniform here) the walk emits the greedy continuation."""
    table = torch.nn.functional.one_hot(_markov().argmax(-1), V).double()
    out = _emitted(3, 3, table=table, samples=2000)
    greedy, a, b = [], *PREFIX
    for _ in range(4):
        a, b = b, int(table[a, b].argmax())
        greedy.append(b)
    assert (out == torch.tensor(greedy)).all()


def test_candidates_are_distinct_and_respect_q():
    q = torch.tensor([[[0.5, 0.5, 0.0, 0.0]]]).expand(6, 1, 4)
    main = torch.tensor([[0], [1], [0], [1], [0], [-1]])
    u = ref.tree_gumbel_uniforms(torch.arange(6), torch.zeros(1, dtype=torch.int64), 6, 1, 4)
    cand = ref.tree_candidates(main, q, 3, u)[:, 0]
    assert cand[:5, 1].tolist() == [1, 0, 1, 0, 1] and (cand[:5, 2] == -1).all()  # q has two tokens
    assert set(cand[5, 1:].tolist()) == {0, 1} and cand[5, 0] == -1


def test_tree_stream_is_separate_and_keyed_by_row_seed():
    u_a, u_s = ref.tree_uniforms(torch.tensor([5, 9]), torch.tensor([3, 3]), 2, 6)
    alone = ref.tree_uniforms(torch.tensor([9]), torch.tensor([3]), 1, 6)
    assert torch.equal(u_a[1:], alone[0]) and torch.equal(u_s[1:], alone[1])
    step_a, _ = ref.step_uniforms(torch.tensor([5]), torch.tensor([3]), torch.tensor([0]), 6)
    assert not torch.equal(u_a[:1], step_a)


# ----------------------------------------------------------------------------------------------------------------------
# the loop: generate(..., tree=(K, D), static=True) on tiny models
# ----------------------------------------------------------------------------------------------------------------------
TREES = [((2, 2), 4), ((3, 2), 6), ((2, 3), 8)]
LOOP_SAMPLES = 20000  # no CFG here (half the rows); greedy runs CFG (its keys and values move too)


@pytest.fixture(scope="module")
def four_codes():
    """4 image codes (ids 0..3), class token 8, null 9; a 1 x 4 grid (256 joint outcomes): the tree's candidates
    cover most of the vocabulary, so sibling acceptances and off-main paths are frequent."""
    from conftest import build_tiny_llama

    from csd_kernels.models import ImageGPT

    return ImageGPT(build_tiny_llama(10, seed=3, init=0.15), image_token_range=(0, 4), grid=(1, 4), null_token_id=9)


def _loop_codes(model, seed: int, **kw) -> np.ndarray:
    """At T = 0.4 p is peaked, so the stale q of sampled drafts is far from uniform: siblings drawn from another q
    than the walk's (planted) are caught here, as is a skipped key/value move."""
    from csd_kernels.decoding import generate

    out = generate(model, torch.full((LOOP_SAMPLES, 1), 8), cfg_scale=1.0, temperature=0.4,
                   seed=torch.arange(LOOP_SAMPLES) + seed, **kw)
    return (out.tokens * (V ** torch.arange(4))).sum(1).numpy(), out


@pytest.fixture(scope="module")
def ar_codes(four_codes):
    return _loop_codes(four_codes, 10**6, mode="ar")[0]


def _same_law_p(a: np.ndarray, b: np.ndarray) -> float:
    """Two-sample χ² on the 256 joint outcomes (cells with a pooled count < 10 merged), and on each position."""
    from scipy.stats import chi2_contingency

    def p_value(x, y, cells):
        cx, cy = np.bincount(x, minlength=cells), np.bincount(y, minlength=cells)
        small = (cx + cy) < 10
        table = np.stack([np.append(cx[~small], cx[small].sum()), np.append(cy[~small], cy[small].sum())])
        return float(chi2_contingency(table[:, table.sum(0) > 0])[1])

    return min([p_value(a, b, 256)] + [p_value((a // V**k) % V, (b // V**k) % V, V) for k in range(4)])


@pytest.mark.parametrize("tree, window", TREES)
def test_sjd_tree_is_lossless(four_codes, ar_codes, tree, window):
    """Power: n = 20000 per sample; a TVD shift of 0.03 between two cells of probability 0.25 of one position's
    marginal has noncentrality 10000·2·0.03²/0.25 = 72 on 3 df: power > 0.999 at α = 1e-3."""
    codes, out = _loop_codes(four_codes, 0, mode="sjd", window=window, static=True, tree=tree)
    assert out.passes_per_row().mean() < 3.5  # the tree's candidates are used: fewer passes than tokens
    assert _same_law_p(ar_codes, codes) > 1e-3


def test_lumina_sjd_tree_is_lossless(tiny_chameleon):
    """Lumina-mGPT's forced row ends (tests/conftest.py's tiny Chameleon with 4 image codes on a 2 x 2 grid: a row
    end after every second token, so the tree's levels alternate) keep the tree lossless: the same two-sample χ²
    and power as test_sjd_tree_is_lossless, against `ar` on the same adapter."""
    from csd_kernels.decoding import generate
    from csd_kernels.models import LuminaMGPT

    adapter = LuminaMGPT(tiny_chameleon, grid=(2, 2), image_token_range=(8, 12), row_end_token_id=41,
                         image_start_token_id=42, image_end_token_id=43, size_token_offset=44)
    prompt = torch.tensor([[1, 5, 6]]).expand(LOOP_SAMPLES, -1)

    def codes(seed: int, **kw) -> np.ndarray:
        out = generate(adapter, prompt, cfg_scale=1.0, temperature=0.4, seed=torch.arange(LOOP_SAMPLES) + seed, **kw)
        return (out.tokens * (V ** torch.arange(4))).sum(1).numpy()

    tree = codes(0, mode="sjd", window=4, static=True, tree=(2, 2))
    assert _same_law_p(codes(10**6, mode="ar"), tree) > 1e-3


def test_lossy_loop_is_detected(four_codes, ar_codes):
    """The same test's power on this model: csd's relaxed acceptance is caught."""
    codes, _ = _loop_codes(four_codes, 0, mode="csd", window=4, static=True, entropy_coef=2.0, tvd_threshold=1.0)
    assert _same_law_p(ar_codes, codes) < 1e-6


@pytest.mark.parametrize("tree, window", TREES + [((4, 2), 16), ((1, 2), 3)])
def test_greedy_tree_equals_ar(tree, window):
    from conftest import build_tiny_llama

    from csd_kernels.decoding import generate
    from csd_kernels.models import ImageGPT

    model = ImageGPT(build_tiny_llama(24, seed=1), image_token_range=(0, 4), grid=(4, 5), null_token_id=23)
    prompts = torch.tensor([[16], [17], [18]])
    ar = generate(model, prompts, mode="ar", temperature=0, cfg_scale=2.0)
    out = generate(model, prompts, mode="sjd", window=window, temperature=0, cfg_scale=2.0, static=True, tree=tree,
                   seed=5)
    assert torch.equal(out.tokens, ar.tokens)
    assert out.forward_passes < ar.forward_passes


@pytest.mark.parametrize("kw, words", [
    (dict(tree=(0, 2), window=8), "K=0, D=2, W=8"),
    (dict(tree=(2, 0), window=8), "K=2, D=0, W=8"),
    (dict(tree=(2, 3), window=7), "7 draft nodes"),
    (dict(tree=(2, 2), window=8, mode="gsd"), "mode 'gsd'"),
    (dict(tree=(2, 2), window=8, mode="ar"), "mode 'ar'"),
    (dict(tree=(2, 2), window=8, mode="jd"), "mode 'jd'"),
    (dict(tree=(2, 2), window=8, static=False), "static=False"),
    (dict(tree=(2, 2), window=8, coupling="gumbel"), "coupling 'gumbel'"),
    (dict(tree=2, window=8), "a pair"),
    (dict(tree=(2.0, 2), window=8), "ints"),
])
def test_bad_tree_raises(four_codes, kw, words):
    from csd_kernels.decoding import generate

    settings = dict(mode="sjd") | kw
    with pytest.raises(ValueError, match="tree=") as err:
        generate(four_codes, torch.full((1, 1), 8), **settings)
    assert words in str(err.value)


def test_batched_tree_rows_equal_rows_alone():
    """Streams keyed by the row's seed and attempt count; finished rows frozen: a row's tokens do not depend on the
    batch."""
    from conftest import build_tiny_llama

    from csd_kernels.decoding import generate
    from csd_kernels.models import ImageGPT

    model = ImageGPT(build_tiny_llama(24, seed=1), image_token_range=(0, 16), grid=(4, 5), null_token_id=23)
    prompts, seeds = torch.tensor([[16], [17], [18]]), [4, 9, 2]
    kw = dict(mode="sjd", window=8, cfg_scale=2.0, static=True, tree=(3, 2))
    batched = generate(model, prompts, seed=seeds, **kw)
    for b in range(3):
        alone = generate(model, prompts[b:b + 1], seed=[seeds[b]], **kw)
        assert torch.equal(batched.tokens[b:b + 1], alone.tokens)


def test_tree_loop_reports_the_status_bits_as_raised(four_codes, monkeypatch):
    """A status bit the tree verification raises reaches the error as that bit (here bad draft probabilities, 4),
    as in the chain's static loop — not folded into 'bad logits' (1)."""
    from csd_kernels.decoding import generate, tree

    real = tree.verify_tree

    def flagging(*args, **kw):
        out = real(*args, **kw)
        out.status = out.status | ref.STATUS_BAD_DRAFT_PROBS
        return out

    monkeypatch.setattr(tree, "verify_tree", flagging)
    with pytest.raises(ValueError, match=r"status bits \[4\]"):
        generate(four_codes, torch.full((1, 1), 8), mode="sjd", window=4, tree=(2, 2), seed=0)
