"""One iteration of the static loop with a draft tree (``generate(..., tree=(K, D))``, sjd or csd).

Every row feeds W inputs: x_{n-1} (the root) and the W - 1 draft nodes of reference.tree_layout(K, D, W) — the main
chain (the drafts the loop keeps at n, n+1, ..) and, at each of the first D levels, the siblings of the Cartesian
tree: K candidates per position, the main draft and K - 1 more drawn without replacement from the position's q by
Gumbel-top-K on the tree stream. One forward call with the ancestor mask (``forward_tree``), then one call of
the fused op ck.verify_tree (reference.verify_tree defines it: p at the visited nodes, recursive rejection sampling
at every accepted node, the main draft under the run's rule — strict for sjd, csd's relaxed test for csd, strict
for a uniform fresh draft (informed_slots) — the
correction from the last residual, a draw from p below a leaf, and H / TVD / distortion at the path nodes); the
accepted path's keys and values move into place (``keep_path``), and the main chain after the stop draws the next
drafts by the maximal coupling against its own p (ck.verify on the chain: the step stream, untouched by the walk),
whose p is the next q (docs/trees.md). With drafts from the row above (draft_init "above" / "above-p") and K = 2,
a level's sibling is the committed token one grid row up where it differs from the main draft (:func:`above_law`).

Shapes: B rows, W window slots, M main-chain draft nodes (W - 1 minus the siblings), V image tokens.
"""

from __future__ import annotations

import torch

from .. import reference as ref
from ..ops.drafts import tree_candidates
from ..ops.verify import verify as verify_op
from ..ops.verify_tree import verify_tree
from .state import StaticState
from .step import (
    Drafted,
    Settings,
    Verified,
    commit,
    draft,
    draft_probs,
    forward,
    informed_slots,
    sampling_kwargs,
    uniform_probs,
    window,
)

__all__ = ["tree_step"]


def tree_step(adapter, run: Settings, state: StaticState, layout: ref.TreeLayout) -> None:
    """One iteration for every row, in place on ``state`` (static.static_step with a tree in the window)."""
    n, levels = state.n, layout.levels
    win = window(state, n, run.window, n < run.total, run, levels=levels)  # drafts on the main chain only
    drafted = draft(state, win, run, state.q_store)
    q = draft_probs(win, drafted, run, state.q_store)
    if q is None:  # greedy: p is one-hot, any q with q(x) > 0 takes the argmax decision
        q = uniform_probs(n.shape[0], run.window, run.vocab, n.device)
    main, q = drafted.tokens[:, :levels], q[:, :levels + 1].float()  # the chain's M drafts, and a slot past them

    siblings = _sibling_probs(run, state, win, layout, main, q[:, :levels])  # None: q
    nodes = _node_tokens(run, state, layout, main, q[:, :levels] if siblings is None else siblings)  # [B, W]
    depth, ancestor = layout.depth.to(n.device), layout.ancestor.to(n.device)
    cond, uncond = forward(lambda inputs: adapter.forward_tree(inputs, n - 1, depth, ancestor), state.seq, win,
                           nodes[:, 1:], float32=True)
    res = verify_tree(cond, nodes, q[:, :levels], layout, **sampling_kwargs(run, uncond, state.attempts),
                      **run.rule, sibling_probs=siblings, informed=informed_slots(win, drafted)[:, :levels],
                      backend=run.backend)
    chain = _chain_drafts(cond, uncond, main, q, run, state)
    adapter.keep_path(n - 1, torch.where(win.active[:, None], res.path, -1))
    state.record(commit(state, win, drafted, _verified(res, chain, drafted, levels)), win.active)


def _sibling_probs(run: Settings, state: StaticState, win, layout: ref.TreeLayout, main, q):
    """[B, M, V] the law each level's siblings are drawn from and tested against, or None (q, as verify_tree's
    default). With 2-D drafting (draft_init "above" / "above-p") and K = 2: :func:`above_law` of the committed
    token one grid row up. Uniform fresh drafts, or K > 2: None — verify_tree takes one sibling law per level (rank
    r >= 1 is drawn from it without the ranks before it), so a one-hot law gives one sibling and leaves the others
    missing; a rank-1 token from above with ranks 2.. from q would need a law per rank."""
    if run.draft_init == "uniform" or layout.branching != 2:
        return None
    above_pos = win.grid_pos[:, :main.shape[1]] - run.width
    token = state.seq.gather(1, above_pos.clamp(0, state.seq.shape[1] - 1))
    known = (above_pos >= 0) & (above_pos < state.n[:, None])  # committed: fixed before this pass's forward
    return above_law(q, main, token, known)


def above_law(q: torch.Tensor, main: torch.Tensor, token: torch.Tensor, known: torch.Tensor) -> torch.Tensor:
    """The siblings' law [B, M, V]: one-hot at ``token`` (the committed token above) where it is ``known``, there is
    a main draft and it differs from it; q elsewhere. Why it is lossless: the walk tests the sibling strictly
    against the main draft's residual r with this same law (verify_tree's sibling_probs, without the main draft:
    still the one-hot), so it accepts ``token`` with probability r(token) and otherwise draws from r without it —
    r exactly, for any law fixed before the forward, and this one is (a committed token, the main draft).
    Shapes: q [B, M, V], main, token [B, M] (main -1: none), known [B, M] bool."""
    use = known & (main >= 0) & (token != main)
    one_hot = torch.nn.functional.one_hot(token.clamp(min=0), q.shape[-1]).to(q.dtype)
    return torch.where(use[..., None], one_hot, q)


def _node_tokens(run: Settings, state: StaticState, layout: ref.TreeLayout, main, q) -> torch.Tensor:
    """[B, W] each slot's token: slot 0 unused (-1 here), the main draft or a sibling candidate of its level, drawn
    from ``q`` [B, M, V] (the siblings' law); no siblings where the position has no main draft, nor at level 1 (one
    node: the root's only child)."""
    depth = layout.depth.to(main.device)
    rank = layout.rank.to(main.device)
    batch, tree_levels, branching = main.shape[0], layout.depth_limit, layout.branching
    cand = torch.full((batch, main.shape[1], branching), -1, dtype=main.dtype, device=main.device)
    cand[:, :, 0] = main
    if tree_levels > 1 and branching > 1:
        siblings = tree_candidates(run.seeds, state.attempts, main[:, 1:tree_levels], q[:, 1:tree_levels],
                                   branching, first=1)
        cand[:, 1:tree_levels] = torch.where(main[:, 1:tree_levels, None] >= 0, siblings, -1)  # [B, D - 1, K]
    tokens = cand[:, depth[1:] - 1, rank[1:]]
    return torch.cat([torch.full_like(tokens[:, :1], -1), tokens], 1)


def _chain_drafts(cond, uncond, main, q, run: Settings, state: StaticState) -> ref.VerifyResult:
    """The main chain (slots 0 .. M) verified strictly with the maximal coupling: its tokens are the next drafts at
    every position after the walk's stop (accepted iff kept), its p the next q."""
    length = main.shape[1] + 1
    drafts = torch.cat([main, torch.full_like(main[:, :1], -1)], 1)
    uncond = None if uncond is None else uncond[:, :length]
    return verify_op(cond[:, :length], drafts, q, **sampling_kwargs(run, uncond,
                     state.attempts), rule="strict", start=torch.zeros_like(state.n), coupling="maximal",
                     positions=state.n, return_probs=True, backend=run.backend, validate=False)


def _verified(res: ref.TreeResult, chain: ref.VerifyResult, drafted: Drafted, levels: int) -> Verified:
    """The window after the walk: the path and the emitted token, then the chain's next drafts (their p the next
    q); the stats of the path node that emits each token (verify_tree's, by depth)."""
    slots = torch.arange(drafted.tokens.shape[1], device=drafted.tokens.device)[None, :]
    index = slots.clamp(max=levels).expand(drafted.tokens.shape[0], -1)
    walked, later = res.tokens.gather(1, index), chain.tokens.gather(1, index)
    tokens = torch.where(slots <= res.accept_len[:, None], walked,
                         torch.where(slots <= levels, later, drafted.current))
    stats = torch.stack([s.gather(1, index) for s in (res.entropy, res.accept_prob, res.distortion, res.tvd)]).float()
    return Verified(tokens, res.accept_len, stats, chain.probs, res.status | chain.status)
