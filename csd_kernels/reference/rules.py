"""The acceptance rules, defined (their table, names, codes and parameters: config/acceptance.py).

For a window position with target p, draft distribution q, support S of p, entropy H = H(p), TVD = ½Σ|p − q| and
a draft x, each rule gives the acceptance probability a(x) of x; a(y) = 0 whenever q(y) = 0 or y ∉ S (a masked or
filtered draft is always rejected, whatever the rule):

* strict     a(y) = min(1, p(y)/q(y))                                              (lossless)
* csd        a(y) = min(1, p(y)/q(y) + λ·H) where TVD < τ, else strict
* gsd        a(y) = min(1, Σ_G(y) p / Σ_G(y) q): G(y) the tokens within ±k ranks of y in p (sorted descending,
             ties by token id) whose probability is within δ of p(y) — a contiguous interval of ranks (see
             :func:`group_acceptance`; 0 when the group has no q mass)
* arsample   s = clamp(H / c + s0, 0, 1);  a(y) = min(1, min(1, p(y)/q(y)) / s)  (1 where s = 0): accept iff
             u·s < min(1, p/q)
* lantern    c_j(y) = Σ_{i ≤ j} p(N[y, i]) over y's neighbour list N[y] (its k nearest codes, nearest first);
             m = max{j : c_j ≤ δ} (c_0 = 0);  a(y) = min(1, (p(y) + c_m(y)) / q(y))
* lantern++  the same with m = max{j : c_j ≤ (λ − 1)·p(y)}

Resampling after a rejection: r ∝ max(p − q·a, 0) for every rule (the law that minimises ½Σ|out − p|); for every
rule with a(y) ≥ min(1, p/q) that is max(p − q, 0) (a = 1 where p > q), which is what those rules compute; gsd's a
can fall below it, so gsd draws from max(p − q·a, 0). The output law is then out = q·a + (1 − Σ q·a)·r and the
distortion ½Σ|out − p| = Σ_y max(q(y)a(y) − p(y), 0) (:func:`~.distributions.closed_form_distortion`).

Float conventions every backend follows: parameters are float32; the lantern prefix sums c_j are accumulated in
float64 and rounded to float32 before the comparison; (λ − 1) is formed in float32.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from ..config.acceptance import RULES, AcceptanceRule, default_lantern_k, param_values, rule_named
from .distributions import closed_form_distortion, entropy, total_variation

__all__ = ["RULES", "rule_parameters", "Acceptance", "acceptance_at", "accepted_mass", "group_acceptance",
           "neighbour_mass", "codebook_neighbours", "relaxed_slots"]

_LANTERN_CHUNK = 1 << 22  # gathered neighbour probabilities held at once by the full-vocabulary lantern terms


def rule_parameters(rule: str, params: dict) -> dict:
    """{name: value} of the rule's parameters, checked (table defaults for those not given or None)."""
    spec = rule_named(rule)
    return dict(zip(spec.param_names(), param_values(spec, params)))


class Acceptance:
    """A rule with its parameters at one window's positions: a(y) at any tokens, q·a for every token, the resampling
    weights and the distortion. Shape: p, q, support [..., V]; h, tvd [...]; neighbours [V, k] int64 or None."""

    def __init__(self, rule: str, p: torch.Tensor, q: torch.Tensor, *, support: Optional[torch.Tensor] = None,
                 h: Optional[torch.Tensor] = None, tvd: Optional[torch.Tensor] = None,
                 neighbours: Optional[torch.Tensor] = None, **params):
        self.rule: AcceptanceRule = rule_named(rule)
        if self.rule.needs_neighbours:
            if neighbours is None:
                raise ValueError(f"rule {rule!r} needs neighbours (the codebook's neighbour table [V, k])")
            if params.get("lantern_k") is None:  # as the op: the codebook's default, capped at the width
                params = dict(params, lantern_k=min(default_lantern_k(rule, p.shape[-1]), neighbours.shape[1]))
        self.params = rule_parameters(rule, params)
        self.p, self.q = p, q
        self.support = p > 0 if support is None else support
        self._h, self._tvd = h, tvd
        self.neighbours = neighbours[:, :self.params["lantern_k"]] if self.rule.needs_neighbours else None
        self._groups = None

    @property
    def h(self) -> torch.Tensor:
        """H(p) [...] (computed when first read)."""
        if self._h is None:
            self._h = entropy(self.p)
        return self._h

    @property
    def tvd(self) -> torch.Tensor:
        """TVD(p, q) [...] (computed when first read)."""
        if self._tvd is None:
            self._tvd = total_variation(self.p, self.q)
        return self._tvd

    def at(self, tokens: torch.Tensor) -> torch.Tensor:
        """a(y) at ``tokens`` [..., n] (-1: no token, a = 0)."""
        return acceptance_at(self, tokens)

    def accepted_mass(self) -> torch.Tensor:
        """q(y)·a(y) for every token y [..., V] (lantern: k gathers per token, in chunks)."""
        vocab = self.p.shape[-1]
        tokens = torch.arange(vocab, device=self.p.device).expand(*self.p.shape[:-1], vocab)
        if not self.rule.needs_neighbours:
            return self.q * self.at(tokens)
        per_chunk = max(1, _LANTERN_CHUNK // max(1, self.p[..., 0].numel() * self.neighbours.shape[1]))
        parts = [self.q[..., s:s + per_chunk] * self.at(tokens[..., s:s + per_chunk])
                 for s in range(0, vocab, per_chunk)]
        return torch.cat(parts, -1)

    def residual(self, q_times_a: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The unnormalised resampling weights: max(p − q·a, 0) (gsd), max(p − q, 0) (every other rule, where the two
        are equal)."""
        if self.rule.residual_qa:
            return (self.p - (self.accepted_mass() if q_times_a is None else q_times_a)).clamp(min=0)
        return (self.p - self.q).clamp(min=0)

    def distortion(self, q_times_a: Optional[torch.Tensor] = None) -> torch.Tensor:
        """½Σ|out − p| of the output law [...]: 0 for a lossless rule and for csd with its gate closed."""
        if self.rule.lossless:
            return torch.zeros_like(self.h)
        dist = closed_form_distortion(self.p, self.q, self.accepted_mass() if q_times_a is None else q_times_a)
        if self.rule.name == "csd":
            dist = torch.where(self.tvd < self.params["tvd_threshold"], dist, 0)
        return dist

    def groups(self) -> torch.Tensor:
        """gsd's a(y) for every token (computed once)."""
        if self._groups is None:
            self._groups = group_acceptance(self.p, self.q, self.params["group_rank"], self.params["group_delta"])
        return self._groups


def acceptance_at(acc: Acceptance, tokens: torch.Tensor) -> torch.Tensor:
    """a(y) at ``tokens`` [..., n] by the rule (module docstring); 0 where there is no token, q(y) = 0 or y ∉ S."""
    p, q, name, prm = acc.p, acc.q, acc.rule.name, acc.params
    index = tokens.clamp(min=0)
    p_t, q_t = p.gather(-1, index), q.gather(-1, index)
    valid = (tokens >= 0) & (q_t > 0) & acc.support.gather(-1, index)
    safe_q = torch.where(valid, q_t, torch.ones_like(q_t))
    ratio = torch.where(valid, p_t / safe_q, torch.zeros_like(p_t))
    if name == "csd":
        relaxed = torch.where(valid, ratio + prm["entropy_coef"] * acc.h[..., None], torch.zeros_like(ratio))
        a = torch.where(acc.tvd[..., None] < prm["tvd_threshold"], relaxed, ratio)
    elif name == "arsample":
        s = (acc.h[..., None] / prm["arsample_scale"] + prm["arsample_offset"]).clamp(0.0, 1.0)
        a = torch.where(s > 0, ratio.clamp(max=1.0) / torch.where(s > 0, s, torch.ones_like(s)), valid.to(p.dtype))
    elif name in ("lantern", "lantern++"):
        if name == "lantern":
            limit = torch.full_like(p_t, prm["lantern_delta"])
        else:
            limit = p_t * float(torch.tensor(prm["lantern_lambda"], dtype=torch.float32) - 1)
        bonus = neighbour_mass(p, tokens, acc.neighbours, limit)
        a = torch.where(valid, (p_t + bonus) / safe_q, torch.zeros_like(p_t))
    elif name == "gsd":
        a = torch.where(valid, acc.groups().gather(-1, index), torch.zeros_like(p_t))
    else:
        a = ratio
    return a.clamp(max=1.0)


def accepted_mass(rule: str, p: torch.Tensor, q: torch.Tensor, **kwargs) -> torch.Tensor:
    """q(y)·a(y) for every token y: the probability of drafting y and accepting it.  Shape: [..., V]. Keywords: those
    of :class:`Acceptance` (support, h, tvd, neighbours, the rule's parameters)."""
    return Acceptance(rule, p, q, **kwargs).accepted_mass()


def relaxed_slots(informed: Optional[torch.Tensor], distortion: torch.Tensor,
                  max_distortion: float) -> Optional[torch.Tensor]:
    """Where the rule decides (None: everywhere): an informed slot whose distortion is not above the cap; elsewhere
    the strict test decides.  Shape: informed, distortion and the result [...]."""
    if max_distortion == math.inf:
        return informed
    within = ~(distortion > max_distortion)
    return within if informed is None else informed & within


def neighbour_mass(p: torch.Tensor, tokens: torch.Tensor, neighbours: torch.Tensor,
                   limit: torch.Tensor) -> torch.Tensor:
    """c_m of lantern at ``tokens`` [..., n]: the largest prefix sum c_j = Σ_{i ≤ j} p(N[y, i]) not above ``limit``
    [..., n] (0 when c_1 is already above it). Neighbour entries outside [0, V) (e.g. -1 padding) add nothing."""
    vocab, width = p.shape[-1], neighbours.shape[1]
    if width == 0:
        return torch.zeros_like(limit)
    table = neighbours[tokens.clamp(min=0)]  # [..., n, k]
    inside = (table >= 0) & (table < vocab)
    lead = p.shape[:-1]
    gathered = p[..., None, :].expand(*lead, tokens.shape[-1], vocab).gather(-1, table.clamp(0, vocab - 1))
    prefix = torch.where(inside, gathered, torch.zeros_like(gathered)).double().cumsum(-1).to(p.dtype)
    within = prefix <= limit[..., None]
    return torch.where(within, prefix, torch.zeros_like(prefix)).amax(-1)


def group_acceptance(p: torch.Tensor, q: torch.Tensor, group_rank: int, group_delta: float) -> torch.Tensor:
    """gsd's a(y) = min(1, Σ_G(y) p / Σ_G(y) q) for every token y, before the support and q(y) > 0 conditions.

    Ranks: p sorted descending, ties by token id. G(y) = ranks [max(r − k, lo), min(r + k, hi)] with r = y's rank,
    lo = the first rank whose p ≤ p(y) + δ, hi = the last rank whose p ≥ p(y) − δ (both float32 sums), always
    holding y itself; the group sums are differences of the float32-rounded prefix sums (accumulated in float64, as
    torch.cumsum on the CPU). Shape: p, q [..., V] -> [..., V]."""
    vocab = p.shape[-1]
    order = torch.sort(p, dim=-1, descending=True, stable=True).indices  # [..., V] token at each rank
    p_sorted = p.gather(-1, order)
    q_sorted = q.gather(-1, order)
    ascending = (-p_sorted).contiguous()  # ascending along the ranks
    low_p = torch.searchsorted(ascending, (-(p_sorted + group_delta)).contiguous(), right=False)
    high_p = torch.searchsorted(ascending, (-(p_sorted - group_delta)).contiguous(), right=True) - 1
    rank = torch.arange(vocab, device=p.device)
    low = torch.maximum(rank - group_rank, low_p).clamp(0, vocab - 1)
    high = torch.minimum(rank + group_rank, high_p).clamp(0, vocab - 1)
    high = torch.maximum(high, rank)  # the group always holds y itself (guards float rounding)
    low = torch.minimum(low, rank)
    zero = torch.zeros_like(p_sorted[..., :1])
    cum_p = torch.cat([zero, p_sorted.double().cumsum(-1).to(p.dtype)], -1)  # [..., V + 1]
    cum_q = torch.cat([zero, q_sorted.double().cumsum(-1).to(q.dtype)], -1)
    sum_p = (cum_p.gather(-1, high + 1) - cum_p.gather(-1, low)).clamp(min=0)
    sum_q = (cum_q.gather(-1, high + 1) - cum_q.gather(-1, low)).clamp(min=0)
    ratio = torch.where(sum_q > 0, sum_p / torch.where(sum_q > 0, sum_q, torch.ones_like(sum_q)),
                        torch.zeros_like(sum_p))
    return torch.zeros_like(p_sorted).scatter(-1, order, ratio.clamp(max=1.0))


def codebook_neighbours(codebook: torch.Tensor, k: int, chunk: int = 256) -> torch.Tensor:
    """[V, k] int64: each code's k nearest codes by L2 distance in ``codebook`` [V, D], nearest first, ties by the
    lower index, the code itself excluded (k ≤ V − 1). The squared distances are |a|² + |b|² − 2a·b in float64."""
    vocab = codebook.shape[0]
    rows = codebook.to(torch.float64)
    norms = (rows * rows).sum(-1)
    out = []
    for start in range(0, vocab, chunk):
        block = rows[start:start + chunk]
        dist = norms[start:start + chunk, None] + norms[None, :] - 2 * block @ rows.T  # [c, V]
        own = torch.arange(start, start + block.shape[0], device=rows.device)
        dist[torch.arange(block.shape[0], device=rows.device), own] = float("inf")
        out.append(torch.sort(dist, dim=-1, stable=True).indices[:, :k])
    return torch.cat(out).to(torch.int64)
