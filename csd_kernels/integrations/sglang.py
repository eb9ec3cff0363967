"""SGLang's tree verification, ``tree_speculative_sampling_target_only``, with sgl-kernel 0.3.21's signature.

What the function computes (sgl-kernel's kernel, and SGLang 0.5.23's own JIT copy of it, which SGLang calls on CUDA):
row b holds a draft tree of N nodes — node 0 the last verified token, ``candidates[b, i]`` node i's token,
``retrive_next_token[b, i]`` its first child and ``retrive_next_sibling[b, i]`` its next sibling (−1: none),
``target_probs[b, i]`` the target's law of the token after node i. From the root, at most S − 1 levels deep
(S = ``accept_index.shape[1]``), the children of the current node are tried in sibling order with one coin per node
(``uniform_samples[b, node]``): child j is accepted iff p(x_j) > 0 and (coin < (p(x_1) + .. + p(x_j)) /
threshold_acc or p(x_j) ≥ threshold_single). With both thresholds 1 that is recursive rejection sampling with
one-hot drafts (x_j accepted with probability p(x_j) / (1 − p(x_1) − .. − p(x_{j−1}))): lossless. Where no child is
accepted, one token is drawn (by inverse CDF on ``uniform_samples_for_final_sampling[b]``) from
max(p − draft_probs, 0) at the current node with the tried children removed — from p alone after S − 1 accepted
levels. Outputs, in place: ``predicts[retrive_index[b, node]]`` the token after each path node (the next accepted
token, or the drawn one at the last), ``accept_index[b, :1 + accepted]`` the path's ``retrive_index`` entries,
``accept_token_num[b]`` the accepted count; the other entries of predicts / accept_index are left as they were.

The walk is vectorised over rows in torch, without host syncs; the per-node coins are the caller's, so with the
same inputs the tokens are sgl-kernel's (up to the order of float sums in the final draw). ``rule=`` other than
"strict" relaxes the first child's test with :func:`csd_kernels.verify`'s rule against its one-hot q (a(x_1) in
place of p(x_1)); the siblings are then tested strictly against the residual, as the op's tree verification does
(docs/trees.md), so each emitted token has the rule's chain law. The op's own ``verify_tree`` verifies its fixed
K-ary layout with per-level q and its own random stream; SGLang's trees are arbitrary and bring their uniforms, so
this walk is written here.

``register()`` is the ``sglang.srt.plugins`` entry point (setup.py): with ``CSD_KERNELS_SGLANG`` set to a rule (or 1
for "strict") it rebinds the name in ``sglang.kernels.ops.speculative.verify_sampling`` and in the modules that
import it (``sglang.srt.speculative.eagle_utils``, ``dflash_utils``).
"""

from __future__ import annotations

import math

import torch

from ..ops.verify import verify
from ..reference import inverse_cdf_sample
from .plugin import rebind, rule_from_env

__all__ = ["PLUGIN_ENV", "SGLANG_MODULES", "tree_speculative_sampling_target_only", "register", "install"]

PLUGIN_ENV = "CSD_KERNELS_SGLANG"
SGLANG_MODULES = ("sglang.kernels.ops.speculative.verify_sampling", "sglang.srt.speculative.eagle_utils",
                  "sglang.srt.speculative.dflash_utils")
_MIN_THRESHOLD_ACC = 1e-9  # sgl-kernel floors threshold_acc there


def tree_speculative_sampling_target_only(
    predicts: torch.Tensor,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    candidates: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    uniform_samples: torch.Tensor,
    uniform_samples_for_final_sampling: torch.Tensor,
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    threshold_single: float = 1.0,
    threshold_acc: float = 1.0,
    deterministic: bool = True,
    *,
    rule: str = "strict",
    **verify_options,
) -> None:
    """sgl-kernel's ``tree_speculative_sampling_target_only`` (module docstring); writes predicts, accept_index and
    accept_token_num in place. ``deterministic`` is accepted and has no effect (the walk always is). draft_probs is
    read, not written (sgl-kernel uses it as scratch). ``rule`` / ``**verify_options``: ours, keyword-only.

    Shape: predicts [B * N] int32, accept_index [B, S] int32, accept_token_num [B] int32, candidates and retrive_*
    [B, N] int64, uniform_samples [B, N] float32, uniform_samples_for_final_sampling [B] float32, target_probs and
    draft_probs [B, N, V] float32.
    """
    del deterministic
    batch, nodes, spec, vocab = _check(predicts, accept_index, accept_token_num, candidates, retrive_index,
                                       retrive_next_token, retrive_next_sibling, uniform_samples,
                                       uniform_samples_for_final_sampling, target_probs, draft_probs,
                                       threshold_single, threshold_acc)
    if batch == 0:
        return
    rows = torch.arange(batch, device=candidates.device)
    parent, rank = _parents(retrive_next_token, retrive_next_sibling)
    tokens = candidates.clamp(0, vocab - 1)
    threshold_acc = max(float(threshold_acc), _MIN_THRESHOLD_ACC)
    cur = torch.zeros(batch, dtype=torch.int64, device=rows.device)
    alive = torch.ones(batch, dtype=torch.bool, device=rows.device)
    rejected_at_cur = torch.zeros_like(alive)
    accepted = torch.zeros(batch, dtype=torch.int64, device=rows.device)
    path = torch.full((batch, spec), -1, dtype=torch.int64, device=rows.device)
    path[:, 0] = retrive_index[:, 0]
    for level in range(1, spec):
        kids = (parent == cur[:, None]) & alive[:, None]
        p = target_probs[rows, cur]
        p_kids = torch.where(kids, p.gather(1, tokens), 0.0)
        slot = torch.where(kids, rank, nodes)  # the kids in sibling order, in columns 0 .. K - 1
        ranked_p = p_kids.new_zeros(batch, nodes + 1).scatter(1, slot, p_kids)[:, :nodes]
        ranked = torch.full((batch, nodes + 1), -1, dtype=torch.int64, device=rows.device).scatter(
            1, slot, torch.arange(nodes, device=rows.device).expand(batch, -1))[:, :nodes]
        cumulative = _cumulative(ranked_p, p, tokens.gather(1, ranked.clamp(min=0))[:, 0], ranked[:, 0] >= 0, rule,
                                 verify_options)
        coin = uniform_samples[rows, cur]
        hit = (ranked >= 0) & (ranked_p > 0) & ((coin[:, None] < cumulative / threshold_acc)
                                                | (ranked_p >= threshold_single))
        found = hit.any(1)
        child = ranked.gather(1, hit.to(torch.int8).argmax(1, keepdim=True))[:, 0]
        go = alive & found
        _write(predicts, retrive_index[rows, cur], candidates[rows, child.clamp(min=0)], go)
        path[:, level] = torch.where(go, retrive_index[rows, child.clamp(min=0)], -1)
        rejected_at_cur = torch.where(alive, ~found & kids.any(1), rejected_at_cur)  # frozen once a row stops
        cur, accepted, alive = torch.where(go, child, cur), accepted + go, go
    sampled = _final_draw(target_probs[rows, cur], draft_probs[rows, cur], tokens, parent == cur[:, None],
                          rejected_at_cur, accepted == spec - 1, uniform_samples_for_final_sampling)
    _write(predicts, retrive_index[rows, cur], sampled, torch.ones_like(alive))
    accept_index.copy_(torch.where(path >= 0, path, accept_index.to(torch.int64)).to(accept_index.dtype))
    accept_token_num.copy_(accepted.to(accept_token_num.dtype))


def _cumulative(ranked_p, p, first_token, has_first, rule: str, verify_options: dict):
    """[B, N] the coin thresholds of the kids in sibling order: the cumulative p (sgl-kernel's prob_acc); under a
    relaxed rule the first kid's a(x_1) (verify's, against one-hot q) and the siblings' RRS on the residual p − x_1:
    a_1 + (1 − a_1)·(p(x_2) + .. + p(x_j)) / (1 − p(x_1))."""
    cumulative = ranked_p.cumsum(1)
    if rule == "strict":
        return cumulative
    drafts = torch.where(has_first, first_token, -1)[:, None]
    a1 = verify(target_probs=p[:, None], draft_tokens=drafts, rule=rule, return_probs=False, validate=False,
                **verify_options).accept_prob[:, :1]
    p1 = ranked_p[:, :1]
    rest = torch.where(p1 < 1, (cumulative - p1) / torch.where(p1 < 1, 1 - p1, 1), 0.0)
    return a1 + (1 - a1) * rest


def _final_draw(p, draft, tokens, kids, rejected, full, coin):
    """[B] the token drawn at the stop node: from max(p − draft, 0) with the rejected kids' mass removed (sgl-kernel
    writes p into draft at each rejected candidate), from p after S − 1 accepted levels; p where nothing is left."""
    removed = torch.zeros_like(p).scatter_add(1, tokens, (kids & rejected[:, None]).to(p.dtype)) > 0
    draft = torch.where(removed, p, draft)
    residual = torch.where(full[:, None], p, (p - draft).clamp(min=0))
    residual = torch.where(residual.sum(1, keepdim=True) > 0, residual, p)
    return inverse_cdf_sample(residual, coin.clamp(0, 1))


def _parents(next_token: torch.Tensor, next_sibling: torch.Tensor):
    """(parent [B, N], rank [B, N]): each node's parent (−1 for the root and nodes no first-child link reaches) and
    its place in its parent's sibling list, by pointer jumping along the sibling links (no host sync)."""
    batch, nodes = next_token.shape
    node = torch.arange(nodes, device=next_token.device).expand(batch, -1)

    def inverse(links):  # inverse[b, links[b, i]] = i where links[b, i] >= 0, else -1
        target = torch.where(links >= 0, links, nodes).clamp(max=nodes)
        return torch.full((batch, nodes + 1), -1, dtype=torch.int64, device=links.device).scatter(
            1, target, node)[:, :nodes]

    previous = inverse(next_sibling)
    head = torch.where(previous >= 0, previous, node)
    rank = (previous >= 0).to(torch.int64)
    for _ in range(max(1, math.ceil(math.log2(max(nodes, 2)))) + 1):
        rank = rank + rank.gather(1, head)
        head = head.gather(1, head)
    return inverse(next_token).gather(1, head), rank


def _write(flat: torch.Tensor, index: torch.Tensor, value: torch.Tensor, mask: torch.Tensor) -> None:
    """flat[index[b]] = value[b] where mask[b] (each row's index its own), without a host sync."""
    index = index.to(torch.int64)
    flat.scatter_(0, index, torch.where(mask, value.to(flat.dtype), flat.gather(0, index)))


def _check(predicts, accept_index, accept_token_num, candidates, retrive_index, retrive_next_token,
           retrive_next_sibling, uniform_samples, uniform_samples_for_final_sampling, target_probs, draft_probs,
           threshold_single, threshold_acc) -> tuple:
    """sgl-kernel's shape and dtype checks, as ValueErrors naming the argument; (B, N, S, V)."""
    if not isinstance(target_probs, torch.Tensor) or target_probs.dim() != 3:
        raise ValueError(f"target_probs must be a float32 tensor [B, N, V], got "
                         f"{tuple(getattr(target_probs, 'shape', ()))}")
    batch, nodes, vocab = target_probs.shape
    spec = accept_index.shape[1] if isinstance(accept_index, torch.Tensor) and accept_index.dim() == 2 else 0
    expected = dict(
        candidates=((batch, nodes), torch.int64), retrive_index=((batch, nodes), torch.int64),
        retrive_next_token=((batch, nodes), torch.int64), retrive_next_sibling=((batch, nodes), torch.int64),
        accept_index=((batch, spec), torch.int32), accept_token_num=((batch,), torch.int32),
        predicts=((batch * nodes,), torch.int32), uniform_samples=((batch, nodes), torch.float32),
        uniform_samples_for_final_sampling=((batch,), torch.float32), target_probs=((batch, nodes, vocab),
                                                                                   torch.float32),
        draft_probs=((batch, nodes, vocab), torch.float32))
    given = dict(candidates=candidates, retrive_index=retrive_index, retrive_next_token=retrive_next_token,
                 retrive_next_sibling=retrive_next_sibling, accept_index=accept_index,
                 accept_token_num=accept_token_num, predicts=predicts, uniform_samples=uniform_samples,
                 uniform_samples_for_final_sampling=uniform_samples_for_final_sampling, target_probs=target_probs,
                 draft_probs=draft_probs)
    for name, (shape, dtype) in expected.items():
        value = given[name]
        if not isinstance(value, torch.Tensor) or tuple(value.shape) != shape or value.dtype != dtype:
            raise ValueError(f"{name} must be a {str(dtype).split('.')[-1]} tensor of shape {list(shape)}, got "
                             f"{getattr(value, 'dtype', type(value).__name__)} {list(getattr(value, 'shape', ()))}")
        if value.device != target_probs.device:
            raise ValueError(f"{name} is on {value.device} but target_probs is on {target_probs.device}")
    if min(nodes, spec, vocab) < 1:
        raise ValueError(f"N, S and V must be positive, got N={nodes}, S={spec}, V={vocab}")
    for name, value in (("threshold_single", threshold_single), ("threshold_acc", threshold_acc)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
            raise ValueError(f"{name} must be a number in [0, 1], got {value!r}")
    return batch, nodes, spec, vocab


# ----------------------------------------------------------------------------------------------------------------------
# The sglang.srt.plugins entry point
# ----------------------------------------------------------------------------------------------------------------------
def register() -> None:
    """SGLang calls this in each of its processes (entry point ``csd_kernels`` of ``sglang.srt.plugins``). With
    ``CSD_KERNELS_SGLANG`` unset (or 0) it does nothing; set to a rule (1 = "strict") it rebinds SGLang's name."""
    rule = rule_from_env(PLUGIN_ENV)
    if rule is None:
        return
    import importlib

    install([importlib.import_module(name) for name in SGLANG_MODULES], rule)


def install(modules, rule: str = "strict") -> int:
    """Rebinds ``tree_speculative_sampling_target_only`` in each of ``modules`` to this package's, with ``rule``;
    how many it rebound (already rebound ones are left)."""

    def replacement():
        def tree_speculative_sampling_on_csd_kernels(*args, **kwargs):
            return tree_speculative_sampling_target_only(*args, rule=rule, **kwargs)

        return tree_speculative_sampling_on_csd_kernels

    return sum(rebind(module, "tree_speculative_sampling_target_only", replacement()) for module in modules)
