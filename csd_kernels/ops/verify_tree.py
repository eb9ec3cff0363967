"""The public ``verify_tree`` op: argument checks, the ``torch.library`` registration, and backend dispatch.

``csd_kernels::verify_tree`` is one custom op (schema + fake, so ``torch.compile(fullgraph=True)`` sees through it)
whose ``backend`` argument names the implementation: ``torch`` (reference.verify_tree, the definition), ``triton``
(csd_kernels.backends.triton.verify_tree), ``cpu`` / ``cuda`` (the compiled ``csd_kernels::verify_tree_rows``,
csrc/include/tree_row.h, whose fake is registered here too). See docs/trees.md, "The fused op".
"""

from __future__ import annotations

import functools
from typing import Optional

import torch

from .. import reference as ref
from ..backends.compiled import has_tree, verify_tree_rows
from ..backends.spec import TREE_ARGS, TREE_RETURNS, Arg, TreeArgs, schema, settings_of
from ..constants import SEED_LIMIT
from .checks import (
    SeedLike,
    check_device,
    check_informed,
    check_logits,
    check_options,
    philox_word,
    reference_options,
    word_tensor,
)
from .registry import select_tree_backend

__all__ = ["TreeResult", "verify_tree"]

TreeResult = ref.TreeResult


# ----------------------------------------------------------------------------------------------------------------------
# Backends behind one op: each takes one backends.spec.TreeArgs
# ----------------------------------------------------------------------------------------------------------------------
def _torch_backend(a: TreeArgs) -> tuple:
    s = settings_of(a)
    layout = device_layout(s.branching, s.depth_limit, a.target_logits.shape[1], a.target_logits.device)
    out = ref.verify_tree(a.target_logits, a.node_tokens, a.draft_probs, layout, uncond_logits=a.uncond_logits,
                          neighbours=a.neighbours, sibling_probs=a.sibling_probs, seed=a.seed, offset=a.offset,
                          informed=a.informed, **reference_options(s))
    return (out.accept_len, out.path, out.tokens, out.accept_prob.float(), out.entropy.float(), out.tvd.float(),
            out.distortion.float(), out.status)


def _triton_backend(a: TreeArgs) -> tuple:
    from ..backends.triton.verify_tree import verify_tree_triton  # optional (triton), imported on first use

    uncond = None if a.uncond_logits is None else a.uncond_logits.contiguous()
    return verify_tree_triton(a._replace(target_logits=a.target_logits.contiguous(), uncond_logits=uncond))


_BACKEND_FUNCTIONS = {"torch": _torch_backend, "triton": _triton_backend, "cpu": verify_tree_rows,
                      "cuda": verify_tree_rows}


@functools.lru_cache(maxsize=32)
def device_layout(branching: int, depth_limit: int, slots: int, device: torch.device) -> ref.TreeLayout:
    """reference.tree_layout(K, D, S) with its tensors on ``device``, made once (no copy per call; the decoding loop
    binds this same object, so its first iteration does what the others do)."""
    return ref.tree_layout(branching, depth_limit, slots).to(device)


# csd_kernels::verify_tree: one custom op over the spec (+ the backend's name), so torch.compile traces it
torch.library.define("csd_kernels::verify_tree", schema(TREE_ARGS, TREE_RETURNS, extra=(Arg("backend", "str"),)))
_DRAFT_PROBS = TreeArgs._fields.index("draft_probs")


@torch.library.impl("csd_kernels::verify_tree", "default")
def _verify_tree_op(*args) -> tuple:
    *fields, backend = args
    return tuple(_BACKEND_FUNCTIONS[backend](TreeArgs(*fields)))


def _fake_outputs(target_logits: torch.Tensor, draft_probs: torch.Tensor):
    batch, nodes = target_logits.shape[0], draft_probs.shape[1] + 1
    per_node = lambda dtype: target_logits.new_empty((batch, nodes), dtype=dtype)  # noqa: E731
    return (target_logits.new_empty((batch,), dtype=torch.int64), per_node(torch.int64), per_node(torch.int64),
            per_node(torch.float32), per_node(torch.float32), per_node(torch.float32), per_node(torch.float32),
            target_logits.new_empty((batch,), dtype=torch.int32))


@torch.library.register_fake("csd_kernels::verify_tree")
def _(*args):
    return _fake_outputs(args[0], args[_DRAFT_PROBS])


if has_tree():

    @torch.library.register_fake("csd_kernels::verify_tree_rows")
    def _(target_logits, uncond_logits, node_tokens, draft_probs, *rest):
        return _fake_outputs(target_logits, draft_probs)


# ----------------------------------------------------------------------------------------------------------------------
# The public op
# ----------------------------------------------------------------------------------------------------------------------
def verify_tree(
    target_logits: torch.Tensor,
    node_tokens: torch.Tensor,
    draft_probs: torch.Tensor,
    layout: ref.TreeLayout,
    *,
    uncond_logits: Optional[torch.Tensor] = None,
    cfg_scale: float = 1.0,
    temperature: float = 1.0,
    top_k: Optional[int] = None,
    top_p: Optional[float] = None,
    min_p: Optional[float] = None,
    rule: str = "strict",
    neighbours: Optional[torch.Tensor] = None,
    gather_distortion: bool = False,
    max_distortion: Optional[float] = None,
    sibling_probs: Optional[torch.Tensor] = None,
    seed: SeedLike,
    offset: SeedLike,
    informed: Optional[torch.Tensor] = None,
    backend: Optional[str] = None,
    **rule_params,
) -> TreeResult:
    """Verify a window of draft trees in one pass over the tree's unique nodes (reference.verify_tree defines it).

    From the root, p is computed at each visited node (CFG, temperature, top-k / top-p / min-p as in verify), its
    children are tested in rank order by recursive rejection sampling (the main draft by ``rule`` and its parameters,
    keywords as in verify, rejected into the rule's resampling law; siblings strictly
    against ``sibling_probs``, the law they were drawn from; default draft_probs), the first accepted child is the next
    node, and when none is, a token is drawn from the last residual. The uniforms come from the tree stream
    (reference.tree_uniforms) keyed by ``seed`` and ``offset`` (the row's attempt count).
    A node token outside [-1, V) is a missing candidate and sets STATUS_BAD_DRAFT_TOKEN in ``status``; a visited node
    with bad logits (NaN, +inf, no finite logit) sets STATUS_BAD_LOGITS; a level of draft_probs or sibling_probs
    with a negative or non-finite value, or not summing to 1 within PROB_SUM_TOLERANCE, is used as zero (its candidates
    are rejected, the node emits from p) and sets STATUS_BAD_DRAFT_PROBS. ``informed`` [B, M] bool: False where a
    level's main draft was drawn without information (a uniform fresh draft); it is tested strictly under every rule,
    as in verify (docs/op.md#uninformed-drafts); None: every level informed. ``max_distortion``: as in verify, a
    main draft whose node's distortion exceeds it is tested strictly. Never syncs with the host.

    Shape: target_logits, uncond_logits [B, S, V] float32/bfloat16/float16 (S = the layout's slots); node_tokens
    [B, S] integer (slot 0 unused, -1: missing); draft_probs, sibling_probs [B, M, V] float32 (M = layout.levels);
    seed an int in [0, 2^63) or int64 tensor of 1 or B elements, offset an int in [0, 2^63) or int64 tensor of 1 or
    B elements. Returns TreeResult: accept_len [B] int64, path, tokens [B, M + 1] int64, accept_prob, entropy, tvd,
    distortion [B, M + 1] float32, status [B] int32.
    """
    target_logits = check_logits("target_logits", target_logits)
    batch, slots, vocab = target_logits.shape
    device = target_logits.device
    levels = _check_layout(layout, slots)
    _check_node_tokens(node_tokens, batch, slots, device)
    _check_probs("draft_probs", draft_probs, (batch, levels, vocab), device)
    if sibling_probs is not None:
        _check_probs("sibling_probs", sibling_probs, (batch, levels, vocab), device)
    # bad tokens and q rows made safe once, here, for every backend (the reference does the same, idempotently)
    node_tokens, draft_probs, sibling_probs, status_in = ref.tree_inputs(node_tokens, draft_probs, sibling_probs,
                                                                         vocab)
    if uncond_logits is not None:
        uncond_logits = check_logits("uncond_logits", uncond_logits, (batch, slots, vocab))
        check_device("uncond_logits", uncond_logits, device)
        if uncond_logits.dtype != target_logits.dtype:
            raise ValueError(f"uncond_logits must have the dtype of target_logits ({target_logits.dtype}), got "
                             f"{uncond_logits.dtype}")
    o = check_options("verify_tree", has_uncond=uncond_logits is not None, cfg_scale=cfg_scale,
                      temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, coupling="independent",
                      rule=rule, rule_params=rule_params, neighbours=neighbours, vocab=vocab, device=device,
                      gather_distortion=gather_distortion, max_distortion=max_distortion, branching=layout.branching,
                      depth_limit=layout.depth_limit)
    informed = check_informed(informed, (batch, levels), device, where="[B, M]")
    seed = word_tensor(philox_word("seed", seed, device, allow_per_row=batch, limit=SEED_LIMIT), device)
    offset = word_tensor(philox_word("offset", offset, device, allow_per_row=batch, limit=SEED_LIMIT), device)
    chosen = select_tree_backend(backend, device)
    compiling = torch.compiler.is_compiling()
    on_device = layout.children.device == device
    tree = layout if compiling or on_device else device_layout(layout.branching, layout.depth_limit, slots, device)
    args = TreeArgs(target_logits=target_logits, uncond_logits=uncond_logits, node_tokens=node_tokens,
                    draft_probs=draft_probs, sibling_probs=sibling_probs, neighbours=o.neighbours,
                    children=tree.children.to(device), informed=informed, seed=seed, offset=offset,
                    settings=o.settings.floats(), choices=o.settings.ints())
    if compiling:
        outputs = torch.ops.csd_kernels.verify_tree(*args, chosen)  # the registered op: traced through its fake
    else:  # eager: the same implementation without the dispatcher's per-call cost
        with torch.no_grad():
            outputs = _BACKEND_FUNCTIONS[chosen](args)
    result = TreeResult(*outputs)
    result.status = result.status | status_in
    return result


def _check_layout(layout, slots: int) -> int:
    """The layout's draft levels M; the layout must be reference.tree_layout(K, D, S) for these S slots."""
    if not isinstance(layout, ref.TreeLayout):
        raise ValueError(f"layout must be a reference.TreeLayout (reference.tree_layout(K, D, S)), got "
                         f"{type(layout).__name__}")
    if layout.children.shape[0] != slots:
        raise ValueError(f"layout has {layout.children.shape[0]} slots but target_logits has S = {slots}")
    return layout.levels


def _check_node_tokens(node_tokens, batch: int, slots: int, device) -> None:
    if not isinstance(node_tokens, torch.Tensor) or node_tokens.dtype.is_floating_point or node_tokens.dtype in (
            torch.bool, torch.complex64, torch.complex128):
        got = getattr(node_tokens, "dtype", type(node_tokens).__name__)
        raise ValueError(f"node_tokens must be an integer tensor, got {got}")
    if node_tokens.shape != (batch, slots):
        raise ValueError(f"node_tokens must have shape [B, S] = {(batch, slots)}, got {tuple(node_tokens.shape)}")
    check_device("node_tokens", node_tokens, device)


def _check_probs(name: str, probs, shape: tuple, device) -> None:
    if not isinstance(probs, torch.Tensor) or probs.dtype != torch.float32:
        raise ValueError(f"{name} must be a float32 tensor, got {getattr(probs, 'dtype', type(probs).__name__)}")
    if probs.shape != shape:
        raise ValueError(f"{name} must have shape [B, M, V] = {shape} (M = layout.levels), got {tuple(probs.shape)}")
    check_device(name, probs, device)
