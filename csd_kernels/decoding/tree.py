"""One iteration of the static loop with a draft tree (``generate(..., tree=(K, D))``, sjd or csd).

Every row feeds W inputs: x_{n-1} (the root) and the W - 1 draft nodes of reference.tree_layout(K, D, W) — the main
chain (the drafts the loop keeps at n, n+1, ..) and, at each of the first D levels, the siblings of the Cartesian
tree: K candidates per position, the main draft and K - 1 more drawn without replacement from the position's q by
Gumbel-top-K on the tree stream. One forward call with the ancestor mask (``forward_tree``), then one call of
the fused op ck.verify_tree (reference.verify_tree defines it: p at the visited nodes, recursive rejection sampling
at every accepted node, the main draft under the run's rule — strict for sjd, csd's relaxed test for csd — the
correction from the last residual, a draw from p below a leaf, and H / TVD / distortion at the path nodes); the
accepted path's keys and values move into place (``keep_path``), and the main chain after the stop draws the next
drafts by the maximal coupling against its own p (ck.verify on the chain: the step stream, untouched by the walk),
whose p is the next q (docs/trees.md).

Shapes: B rows, W window slots, M main-chain draft nodes (W - 1 minus the siblings), V image tokens.
"""

from __future__ import annotations

import torch

from .. import reference as ref
from ..ops.drafts import random_draft_tokens, tree_candidates
from ..ops.verify import verify
from ..ops.verify_tree import verify_tree
from .static import StaticState, static_draft_probs
from .steps import Settings

__all__ = ["tree_step"]


def tree_step(adapter, run: Settings, state: StaticState, layout: ref.TreeLayout) -> None:
    """One iteration for every row, in place on ``state`` (the tree form of static.static_step)."""
    window, total, levels = run.window, run.total, layout.levels
    n = state.n
    slots = torch.arange(window, device=n.device)
    grid_pos = n[:, None] + slots  # [B, W] positions of the main-chain view n .. n + W - 1
    active = n < total
    win_end = (n + window).clamp(max=total)
    draftable = (grid_pos < win_end[:, None] - 1) & (slots < levels)  # the main chain's M drafts
    sampled = draftable & (grid_pos < state.drafted[:, None])
    fresh = draftable & ~sampled
    fresh_tokens = random_draft_tokens(run.seeds, state.attempts, n, window, run.vocab)
    above = None
    if run.draft_init == "above":
        above_pos = grid_pos - run.width
        above = fresh & (above_pos >= 0) & (above_pos < n[:, None])
        fresh_tokens = torch.where(above, state.seq.gather(1, above_pos.clamp(min=0)), fresh_tokens)
    current = state.seq.gather(1, grid_pos)
    main = torch.where(sampled, current, torch.where(fresh, fresh_tokens, -1))  # [B, W]
    q = static_draft_probs(state, run, sampled, above, fresh_tokens)
    if q is None:  # greedy: p is one-hot, any q with q(x) > 0 takes the argmax decision
        q = torch.full((1, 1, 1), 1.0 / run.vocab, device=n.device).expand(n.shape[0], window, run.vocab)

    nodes = _node_tokens(run, state, layout, main[:, :levels], q[:, :levels])  # [B, W]
    last = state.seq.gather(1, (n - 1).clamp(min=0)[:, None])
    inputs = torch.cat([last, nodes[:, 1:].clamp(min=0)], 1)
    cond, uncond = adapter.forward_tree(inputs, n - 1, layout.depth.to(n.device), layout.ancestor.to(n.device))
    cond, uncond = cond.float(), (None if uncond is None else uncond.float())

    res = verify_tree(cond, nodes, q[:, :levels].float(), layout, uncond_logits=uncond, cfg_scale=run.cfg_scale,
                      temperature=run.temperature, top_k=run.top_k, top_p=run.top_p, min_p=run.min_p,
                      rule="csd" if run.mode == "csd" else "strict", entropy_coef=run.entropy_coef,
                      tvd_threshold=run.tvd_threshold, sibling_probs=None, seed=run.seeds, offset=state.attempts,
                      backend=run.backend)
    chain = _chain_drafts(cond, uncond, main, q, run, state, levels)
    adapter.keep_path(n - 1, torch.where(active[:, None], res.path, -1))
    _commit(state, run, res, chain, grid_pos, current, active, win_end, levels)


def _node_tokens(run: Settings, state: StaticState, layout: ref.TreeLayout, main, q) -> torch.Tensor:
    """[B, W] each slot's token: slot 0 unused (-1 here), the main draft or a sibling candidate of its level; no
    siblings where the position has no main draft, nor at level 1 (one node: the root's only child)."""
    depth = layout.depth.to(main.device)
    rank = layout.rank.to(main.device)
    batch, tree_levels, branching = main.shape[0], layout.depth_limit, layout.branching
    cand = torch.full((batch, main.shape[1], branching), -1, dtype=main.dtype, device=main.device)
    cand[:, :, 0] = main
    if tree_levels > 1 and branching > 1:
        siblings = tree_candidates(run.seeds, state.attempts, main[:, 1:tree_levels], q[:, 1:tree_levels].float(),
                                   branching, first=1)
        cand[:, 1:tree_levels] = torch.where(main[:, 1:tree_levels, None] >= 0, siblings, -1)  # [B, D - 1, K]
    tokens = cand[:, depth[1:] - 1, rank[1:]]
    return torch.cat([torch.full_like(tokens[:, :1], -1), tokens], 1)


def _chain_drafts(cond, uncond, main, q, run: Settings, state: StaticState, levels: int) -> ref.VerifyResult:
    """The main chain (slots 0 .. M) verified strictly with the maximal coupling: its tokens are the next drafts at
    every position after the walk's stop (accepted iff kept), its p the next q."""
    length = levels + 1
    drafts = torch.cat([main[:, :levels], torch.full_like(main[:, :1], -1)], 1)
    return verify(cond[:, :length], drafts, q[:, :length].float(),
                  uncond_logits=None if uncond is None else uncond[:, :length], cfg_scale=run.cfg_scale,
                  temperature=run.temperature, top_k=run.top_k, top_p=run.top_p, min_p=run.min_p, rule="strict",
                  start=torch.zeros_like(state.n), coupling="maximal", positions=state.n, seed=run.seeds,
                  offset=state.attempts, return_probs=True, backend=run.backend, validate=False)


def _commit(state: StaticState, run: Settings, res: ref.TreeResult, chain: ref.VerifyResult, grid_pos, current,
            active, win_end, levels: int) -> None:
    """Active rows commit the path and the emitted token and keep the chain's next drafts (their p as q)."""
    n, window, batch = state.n, run.window, state.n.shape[0]
    slots = torch.arange(window, device=n.device)[None, :]
    accept_len = res.accept_len
    new_n = torch.where(active, torch.minimum(n + accept_len + 1, win_end), n)
    index = slots.clamp(max=levels).expand(batch, -1)
    walked = res.tokens.gather(1, index)
    later = chain.tokens.gather(1, index)
    tokens = torch.where(slots <= accept_len[:, None], walked, torch.where(slots <= levels, later, current))
    state.seq.scatter_(1, grid_pos, torch.where(active[:, None], tokens, current))

    # the stats of the path node that emits each token (verify_tree's, by depth)
    stats = torch.stack([s.gather(1, index) for s in (res.entropy, res.accept_prob, res.distortion, res.tvd)]).float()
    newly = active[:, None] & (grid_pos < new_n[:, None])
    map_index = grid_pos[None].expand(4, -1, -1)
    state.maps.scatter_(2, map_index, torch.where(newly[None], stats, state.maps.gather(2, map_index)))
    state.accepted.index_copy_(0, state.passes, (new_n - n)[None])
    state.passes.add_(active.any().to(torch.int64))
    if state.q_store is not None:
        shift = ((new_n - n)[:, None] + slots).clamp(max=levels)
        fresh_q = chain.probs.gather(1, shift[..., None].expand(-1, -1, run.vocab))
        state.q_store.copy_(torch.where(active[:, None, None], fresh_q, state.q_store))
    bad = (res.status | chain.status).to(torch.int64)  # the bits as raised, as static._commit keeps them
    state.drafted.copy_(torch.where(active, torch.minimum(n + levels + 1, win_end), state.drafted))
    state.attempts.add_(active.to(torch.int64))
    state.status.copy_(torch.where(active, bad, 0) | state.status)
    state.n.copy_(new_n)
    state.flags.copy_(torch.stack([new_n.min(), state.status.max()]))
