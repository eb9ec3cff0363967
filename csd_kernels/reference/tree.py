"""Draft trees: several candidates per position, verified by recursive rejection sampling (RRS), defined.

A window of S slots: slot 0 is the root (the last committed token x_{n-1}), every other slot a draft node whose token
sits at grid position n - 1 + depth. Tree (K, D): a full K-ary tree of D draft levels below the root (one node at
level 1, K^(d-1) at level d: (K^D - 1)/(K - 1) nodes), all nodes of one level drawing from the same candidate set
(candidate r of level d is cand[d - 1, r]: the Cartesian product of SJD-PAC), and the main chain (rank 0 at every
level) continuing one node per level to fill the window. The main chain takes slots 1 .. M in level order, so a walk
that stays on it needs no key/value move.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch

from .distributions import (
    PROB_SUM_TOLERANCE,
    STATUS_BAD_DRAFT_PROBS,
    STATUS_BAD_DRAFT_TOKEN,
    STATUS_BAD_LOGITS,
    inverse_cdf_sample,
    target_distribution,
    total_variation,
)
from .rng import tree_uniforms
from .rules import Acceptance, relaxed_slots

__all__ = ["TreeLayout", "tree_nodes", "tree_layout", "tree_candidates", "rrs_step", "TreeWalk", "tree_walk",
           "TreeResult", "valid_levels", "tree_inputs", "verify_tree"]


@dataclass(frozen=True)
class TreeLayout:
    """The static shape of a draft tree in a window of ``slots`` inputs.

    Shape: parent, depth, rank [S] int64 (slot 0: parent -1, depth 0); children [S, K] int64 slots in rank order
    (-1 none); main [M + 1] the main chain's slots by depth (main[0] = 0); ancestor [S, S] bool (t is s or above s).
    """

    branching: int
    depth_limit: int
    parent: torch.Tensor
    depth: torch.Tensor
    rank: torch.Tensor
    children: torch.Tensor
    main: torch.Tensor
    ancestor: torch.Tensor

    @property
    def levels(self) -> int:
        """Draft levels (= the main chain's draft nodes M)."""
        return self.main.numel() - 1

    def to(self, device) -> "TreeLayout":
        """The same layout with its tensors on ``device``."""
        moved = {name: getattr(self, name).to(device) for name in ("parent", "depth", "rank", "children", "main",
                                                                    "ancestor")}
        return TreeLayout(self.branching, self.depth_limit, **moved)


def tree_nodes(branching: int, depth: int) -> int:
    """(K^D − 1)/(K − 1): the draft nodes of a full K-ary tree of D levels (D when K = 1)."""
    return depth if branching == 1 else (branching**depth - 1) // (branching - 1)


def tree_layout(branching: int, depth: int, slots: int) -> TreeLayout:
    """The layout of tree (K, D) in a window of ``slots`` inputs (root + slots - 1 draft nodes); needs
    tree_nodes(K, D) <= slots - 1 (validation.check_tree says so by name)."""
    chain = slots - 1 - (tree_nodes(branching, depth) - depth)  # main-chain draft nodes M >= D
    parent, level, rank = [-1] + list(range(chain)), list(range(chain + 1)), [0] * (chain + 1)
    frontier = [(1, 1)]  # (slot, level) of the tree's nodes whose children are placed next
    for d in range(1, depth):
        below = []
        for slot, _ in frontier:
            for r in range(branching):
                if r == 0 and slot == d:  # the main node's rank-0 child is the main chain's next node
                    below.append((d + 1, d + 1))
                    continue
                parent.append(slot)
                level.append(d + 1)
                rank.append(r)
                below.append((len(parent) - 1, d + 1))
        frontier = below
    size = len(parent)
    children = torch.full((size, max(branching, 1)), -1, dtype=torch.int64)
    for s in range(1, size):
        children[parent[s], rank[s]] = s
    ancestor = torch.eye(size, dtype=torch.bool)
    for s in range(1, size):
        ancestor[s] |= ancestor[parent[s]]
    return TreeLayout(branching, depth, torch.tensor(parent), torch.tensor(level), torch.tensor(rank), children,
                      torch.arange(chain + 1), ancestor)



def tree_candidates(main_tokens: torch.Tensor, q: torch.Tensor, branching: int, uniforms: torch.Tensor):
    """cand [B, P, K]: rank 0 the main draft, ranks 1..K-1 Gumbel-top-(K-1) of log q with the main draft removed —
    given x_1 ~ q, (x_1, .., x_K) are K draws from q without replacement. -1 where q has no mass left. Equal keys go
    to the lowest token (a uniform q ties whenever two 23-bit uniforms do; topk's order among ties is unspecified).

    Shape: main_tokens [B, P] (-1: none), q [B, P, V], uniforms [B, P, V] in (0, 1)."""
    if branching == 1:
        return main_tokens[..., None]
    keys = torch.log(q) - torch.log(-torch.log(uniforms.to(q.dtype)))
    main = torch.nn.functional.one_hot(main_tokens.clamp(min=0), q.shape[-1]).bool() & (main_tokens >= 0)[..., None]
    keys = keys.masked_fill(main | (q <= 0), float("-inf"))
    top = keys.sort(dim=-1, descending=True, stable=True)
    values, indices = top.values[..., :branching - 1], top.indices[..., :branching - 1]
    siblings = torch.where(torch.isfinite(values), indices, -1)
    return torch.cat([main_tokens[..., None], siblings], -1)


def rrs_step(p: torch.Tensor, q: torch.Tensor, x: torch.Tensor, support: Optional[torch.Tensor] = None,
             accept: Optional[torch.Tensor] = None, rest: Optional[torch.Tensor] = None,
             residual: Optional[torch.Tensor] = None):
    """One candidate of recursive rejection sampling: (a(x), the next p and q if x is rejected).

    a(x) = min(1, p(x)/q(x)), or ``accept`` when given (a relaxed rule's a of the main draft). Next p =
    norm(``residual``) (default max(p − q, 0), the rule's resampling weights when given; p where they sum to zero);
    next q = ``rest`` (default q: the law the next candidates are drawn from) without x, renormalised (zero when
    nothing is left). A missing candidate (x = -1) changes nothing and is never accepted. Shape: p, q, rest,
    residual [..., V], x, accept [...]."""
    present = x >= 0
    index = x.clamp(min=0)[..., None]
    if accept is None:
        accept = Acceptance("strict", p, q, support=support).at(x[..., None])[..., 0]
    a = torch.where(present, accept, 0)
    residual = (p - q).clamp(min=0) if residual is None else residual
    mass = residual.sum(-1, keepdim=True)
    next_p = torch.where(mass > 0, residual / torch.where(mass > 0, mass, 1), p)
    removed = (q if rest is None else rest).scatter(-1, index, 0.0)
    left = removed.sum(-1, keepdim=True)
    next_q = torch.where(left > 0, removed / torch.where(left > 0, left, 1), 0.0)
    keep = ~present[..., None]
    return a, torch.where(keep, p, next_p), torch.where(keep, q, next_q)


@dataclass
class TreeWalk:
    """The outcome of a tree verification. Shape: accept_len [B] accepted draft nodes; path [B, M + 1] slots by
    depth (path[:, 0] = 0, -1 past the stop); tokens [B, M + 1] the accepted tokens, then the emitted token at
    accept_len (-1 after it); accept_prob [B, M + 1] a(x) of the accepted candidate below each path node (0 at the
    stop); leaf [B] the walk accepted a node without children (the emitted token is then drawn from p there)."""

    accept_len: torch.Tensor
    path: torch.Tensor
    tokens: torch.Tensor
    accept_prob: torch.Tensor
    leaf: torch.Tensor


def tree_walk(p: torch.Tensor, tokens: torch.Tensor, q: torch.Tensor, layout: TreeLayout, u_accept: torch.Tensor,
              u_sample: torch.Tensor, support: Optional[torch.Tensor] = None, rule: str = "strict",
              sibling_q: Optional[torch.Tensor] = None, neighbours: Optional[torch.Tensor] = None,
              informed: Optional[torch.Tensor] = None, max_distortion: float = math.inf,
              **rule_params) -> TreeWalk:
    """Verify a draft tree: from the root, at each accepted node RRS over its children in rank order (their shared
    q is that of their level); the first accepted child is the next node; all rejected: emit a draw from the last
    residual; a node without children: emit a draw from its p. The emitted tokens are distributed exactly as the
    target's autoregressive law (tests/test_tree.py).

    The main draft (rank 0) is tested against q with ``rule`` and its parameters (reference.rules: e.g. csd adds λ·H(p)
    where TVD(p, q) < τ, both at the node) and rejected into the rule's resampling law (max(p − q, 0), gsd's
    max(p − q·a, 0)), so each emitted token has exactly the law of the rule on a chain, and the same distortion); the
    siblings (ranks 1..) by strict RRS against ``sibling_q`` (default q), the law they were drawn from without
    replacement (tree_candidates on sibling_q): given any rejected main draft, strict RRS emits the residual's law.
    ``informed`` [B, M] bool (None: all): False where a level's main draft was drawn without information; it is then
    tested strictly, as verify's ``informed`` (docs/op.md#uninformed-drafts); so is a main draft whose node's
    distortion under the rule exceeds ``max_distortion`` (verify's cap).

    Shape: p [B, S, V] the target at each slot's output (the law of its children's position); tokens [B, S] each
    slot's token (-1: missing candidate); q, sibling_q [B, M, V] the q of each draft level; u_accept, u_sample
    [B, S]; support [B, S, V] bool or None (p > 0)."""
    batch, slots, _ = p.shape
    levels = layout.levels
    rows = torch.arange(batch, device=p.device)
    children = layout.children.to(p.device)
    cur = torch.zeros(batch, dtype=torch.int64, device=p.device)
    done = torch.zeros(batch, dtype=torch.bool, device=p.device)
    path = torch.full((batch, levels + 1), -1, dtype=torch.int64, device=p.device)
    out = torch.full_like(path, -1)
    accept_prob = torch.zeros(batch, levels + 1, dtype=p.dtype, device=p.device)
    path[:, 0] = 0
    leaf = torch.zeros_like(done)
    residual = p[:, 0]  # the law the emitted token is drawn from, fixed at the stop
    for level in range(levels + 1):
        kids = children[cur]  # [B, K]
        p_j = p[rows, cur]
        q_j = q[:, min(level, levels - 1)]
        sup = None if support is None else support[rows, cur]
        chosen = torch.full_like(cur, -1)
        chosen_a = torch.zeros_like(accept_prob[:, 0])
        ranks = kids.shape[1] if 1 <= level < layout.depth_limit else 1  # only tree nodes have siblings below
        rest = None if sibling_q is None else sibling_q[:, min(level, levels - 1)]
        for r in range(ranks):
            slot = kids[:, r]
            x = torch.where((slot >= 0) & (chosen < 0), tokens[rows, slot.clamp(min=0)], -1)
            main = _main_rule(p_j, q_j, sup, rule, neighbours, rule_params) if r == 0 else None
            relaxed = None if main is None else main.at(x[..., None])[..., 0]
            weights = None if main is None or not main.rule.residual_qa else main.residual()
            told = None if main is None else _main_relaxed(main, informed, level, max_distortion)
            if told is not None:  # an uninformed or capped main draft: the strict test and residual
                strict = Acceptance("strict", p_j, q_j, support=sup)
                relaxed = torch.where(told, relaxed, strict.at(x[..., None])[..., 0])
                weights = None if weights is None else torch.where(told[:, None], weights, strict.residual())
            a, next_p, next_q = rrs_step(p_j, q_j, x, sup, relaxed, rest if r == 0 else None, weights)
            hit = (x >= 0) & (u_accept[rows, slot.clamp(min=0)] < a)
            chosen, chosen_a = torch.where(hit, slot, chosen), torch.where(hit, a, chosen_a)
            p_j, q_j = torch.where(hit[:, None], p_j, next_p), torch.where(hit[:, None], q_j, next_q)
        stop = ~done & (chosen < 0)
        residual = torch.where(stop[:, None], p_j, residual)
        leaf |= stop & (kids[:, 0] < 0)
        go = ~done & ~stop
        if level < levels:
            accept_prob[:, level] = torch.where(go, chosen_a, 0)
            cur = torch.where(go, chosen, cur)
            path[:, level + 1] = torch.where(go, chosen, -1)
            out[:, level] = torch.where(go, tokens[rows, chosen.clamp(min=0)], -1)
        done |= stop
    accept_len = (path[:, 1:] >= 0).sum(-1)
    emitted = inverse_cdf_sample(residual, u_sample[rows, cur])  # cur: the stop node
    out = out.scatter(1, accept_len[:, None], emitted[:, None])
    return TreeWalk(accept_len, path, out, accept_prob, leaf)


@dataclass
class TreeResult:
    """What verify_tree returns (every backend). The stats at i describe the node path[i] that emits token i.

    Shape: accept_len [B] int64; path, tokens [B, M + 1] int64 (TreeWalk's); accept_prob, entropy, tvd,
    distortion [B, M + 1] float32 (0 after accept_len); status [B] int32 (STATUS_BAD_LOGITS: a visited node had bad
    logits; STATUS_BAD_DRAFT_TOKEN / STATUS_BAD_DRAFT_PROBS: see tree_inputs). entropy H(p)
    at the node; tvd ½Σ|p − q_i| (½ at i = M, no q); distortion the rule's at the node (0 without a main draft
    below it, and under a lossless rule; NaN for lantern / lantern++ unless gather_distortion)."""

    accept_len: torch.Tensor
    path: torch.Tensor
    tokens: torch.Tensor
    accept_prob: torch.Tensor
    entropy: torch.Tensor
    tvd: torch.Tensor
    distortion: torch.Tensor
    status: torch.Tensor


def valid_levels(probs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(probs as float32 with bad rows zeroed, bad [B]): a row is bad as in verify's draft_probs (a negative or
    non-finite value, or a sum off 1 by more than PROB_SUM_TOLERANCE); a zero q accepts nothing and the node emits
    from p, so a bad level costs speed, never the law.  Shape: [B, M, V]."""
    q = probs.float()
    bad = ~(torch.isfinite(q) & (q >= 0)).all(-1) | ~((q.sum(-1) - 1).abs() <= PROB_SUM_TOLERANCE)
    return torch.where(bad[..., None], torch.zeros_like(q), q), bad.any(-1)


def tree_inputs(node_tokens: torch.Tensor, draft_probs: torch.Tensor, sibling_probs: Optional[torch.Tensor],
                vocab: int) -> tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor], torch.Tensor]:
    """verify_tree's inputs made safe, with the status bits that say so: (node tokens as int64, those outside
    [-1, V) missing (-1) and STATUS_BAD_DRAFT_TOKEN — slot 0, the root, is not a candidate; draft_probs and
    sibling_probs through valid_levels, STATUS_BAD_DRAFT_PROBS). Idempotent on what it returns, status aside.

    Shape: node_tokens [B, S]; draft_probs, sibling_probs [B, M, V]; returns ..., status [B] int32."""
    tokens = node_tokens.to(torch.int64)
    bad_token = (tokens < -1) | (tokens >= vocab)
    bad_token[:, 0] = False
    q, bad_q = valid_levels(draft_probs)
    sibling_q, bad_sibling = (None, bad_q) if sibling_probs is None else valid_levels(sibling_probs)
    status = (bad_token.any(1).to(torch.int32) * STATUS_BAD_DRAFT_TOKEN
              | (bad_q | bad_sibling).to(torch.int32) * STATUS_BAD_DRAFT_PROBS)
    return tokens.masked_fill(bad_token, -1), q, sibling_q, status


def verify_tree(target_logits: torch.Tensor, node_tokens: torch.Tensor, draft_probs: torch.Tensor,
                layout: TreeLayout, *, uncond_logits: Optional[torch.Tensor] = None, cfg_scale: float = 1.0,
                temperature: float = 1.0, top_k: Optional[int] = None, top_p: Optional[float] = None,
                min_p: Optional[float] = None, rule: str = "strict", neighbours: Optional[torch.Tensor] = None,
                gather_distortion: bool = False, sibling_probs: Optional[torch.Tensor] = None,
                seed: torch.Tensor, offset: torch.Tensor, informed: Optional[torch.Tensor] = None,
                max_distortion: float = math.inf, **rule_params) -> TreeResult:
    """The fused tree verification, defined: p at every slot (CFG, temperature, top-k / top-p / min-p), the walk
    on the tree stream's uniforms (tree_walk), and the stats of the nodes on the path.

    Shape: target_logits, uncond_logits [B, S, V]; node_tokens [B, S] (slot 0 unused, -1: missing candidate);
    draft_probs, sibling_probs [B, M, V] (M = layout.levels); seed, offset [1] or [B] int64; informed [B, M] bool or
    None (tree_walk's: an uninformed level's main draft is tested strictly and spends no distortion, as is one whose
    node's distortion exceeds ``max_distortion``)."""
    batch, slots, _ = target_logits.shape
    target = target_distribution(target_logits, uncond_logits, cfg_scale, temperature, top_k, torch.float32, top_p,
                                 min_p)
    node_tokens, q, sibling_q, status_in = tree_inputs(node_tokens, draft_probs, sibling_probs, target.p.shape[-1])
    u_accept, u_sample = tree_uniforms(seed, offset, batch, slots)
    walk = tree_walk(target.p, node_tokens, q, layout, u_accept, u_sample, target.support, rule, sibling_q,
                     neighbours, informed, max_distortion, **rule_params)
    rows = torch.arange(batch, device=q.device)[:, None]
    on_path = walk.path >= 0
    node = walk.path.clamp(min=0)
    p_at = target.p[rows, node]  # [B, M + 1, V]
    q_at = torch.cat([q, torch.zeros_like(q[:, :1])], 1)
    h = target.h[rows, node]
    tvd = total_variation(p_at, q_at)
    main_child = layout.children.to(q.device)[node, 0]
    has_draft = (main_child >= 0) & (node_tokens.gather(1, main_child.clamp(min=0)) >= 0)
    acc = Acceptance(rule, p_at, q_at, support=target.support[rows, node], h=h, tvd=tvd, neighbours=neighbours,
                     **rule_params)
    if acc.rule.distortion_gathers and not gather_distortion and max_distortion == math.inf:
        distortion = torch.full_like(h, float("nan"))
    else:
        distortion = acc.distortion()
    if informed is not None:  # node i's main draft is level i's; the last node has none
        has_draft = has_draft & torch.cat([informed, torch.ones_like(informed[:, :1])], 1)
    distortion = torch.where(has_draft & ~(distortion > max_distortion), distortion, 0)
    zero = torch.zeros_like(h)
    status = (target.bad[rows, node] & on_path).any(-1).to(torch.int32) * STATUS_BAD_LOGITS
    status = status | status_in
    return TreeResult(walk.accept_len, walk.path, walk.tokens, walk.accept_prob, torch.where(on_path, h, zero),
                      torch.where(on_path, tvd, zero), torch.where(on_path, distortion, zero), status)


def _main_relaxed(main: Acceptance, informed: Optional[torch.Tensor], level: int,
                  max_distortion: float) -> Optional[torch.Tensor]:
    """[B] where the rule tests the main draft at this level's nodes (None: every row), as verify's relaxed_slots."""
    told = None if informed is None else informed[:, min(level, informed.shape[1] - 1)]
    distortion = main.distortion() if max_distortion < math.inf else main.h  # (unread without a cap)
    return relaxed_slots(told, distortion, max_distortion)


def _main_rule(p, q, support, rule: str, neighbours, rule_params: dict) -> Optional[Acceptance]:
    """The rule of a main draft against its q at the node (None under the strict rule: rrs_step's min(1, p/q))."""
    if rule == "strict":
        return None
    return Acceptance(rule, p, q, support=support, neighbours=neighbours, **rule_params)
