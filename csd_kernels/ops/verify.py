"""The public ``verify`` op: argument checks, the ``torch.library`` registration, and backend dispatch.

``csd_kernels::verify`` is one custom op (schema + fake implementation, so ``torch.compile(fullgraph=True)`` sees
through it) whose ``backend`` argument names the implementation. The C++/CUDA extension registers its own op,
``csd_kernels::verify_rows``, whose fake implementation is registered here too.
"""

from __future__ import annotations

import functools
from typing import Optional, Union

import torch

from .. import reference as ref
from ..backends.compiled import compiled_extension, verify_rows
from ..backends.spec import CHOICES, VERIFY_ARGS, VERIFY_RETURNS, Arg, OpSettings, VerifyArgs, schema, settings_of
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
from .registry import select_backend

__all__ = ["VerifyResult", "VerifyArgs", "OpSettings", "verify"]

VerifyResult = ref.VerifyResult

_INT_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


# ----------------------------------------------------------------------------------------------------------------------
# Backends behind one op: each takes one backends.spec.VerifyArgs
# ----------------------------------------------------------------------------------------------------------------------
def _torch_backend(a: VerifyArgs) -> tuple:
    s = settings_of(a)
    probs_in = s.target_is_probs
    out = ref.verify(
        None if probs_in else a.target_logits, a.draft_tokens, a.draft_probs,
        target_probs=a.target_logits if probs_in else None, uncond_logits=a.uncond_logits, neighbours=a.neighbours,
        start=a.start, coupling=ref.COUPLINGS[s.coupling], positions=a.positions, seed=a.seed, offset=a.offset,
        return_probs=s.return_probs, informed=a.informed, **reference_options(s),
    )
    probs = out.probs if s.return_probs else a.target_logits.new_empty((0,), dtype=torch.float32)
    return out.accept_len, out.tokens, probs, out.entropy, out.tvd, out.accept_prob, out.distortion, out.status


def _triton_backend(a: VerifyArgs, packed_outputs=False):
    global _verify_triton
    if _verify_triton is None:  # imported on first use (triton is optional), then kept: an import costs every call
        from ..backends.triton.verify import verify_triton as _verify_triton
    return _verify_triton(a, packed_outputs=packed_outputs)


_verify_triton = None


_BACKEND_FUNCTIONS = {"torch": _torch_backend, "triton": _triton_backend, "cpu": verify_rows, "cuda": verify_rows}
_CHOICES, _RETURN_PROBS = VerifyArgs._fields.index("choices"), CHOICES.index("return_probs")

# csd_kernels::verify: one custom op over the spec (+ the backend's name), so torch.compile(fullgraph=True) traces it
torch.library.define("csd_kernels::verify", schema(VERIFY_ARGS, VERIFY_RETURNS, extra=(Arg("backend", "str"),)))


@torch.library.impl("csd_kernels::verify", "default")
def _verify_op(*args) -> tuple:
    *fields, backend = args
    return tuple(_BACKEND_FUNCTIONS[backend](VerifyArgs(*fields)))


def _fake_outputs(target_logits: torch.Tensor, return_probs: bool):
    batch, length, vocab = target_logits.shape
    per_position = lambda: target_logits.new_empty((batch, length), dtype=torch.float32)  # noqa: E731
    return (
        target_logits.new_empty((batch,), dtype=torch.int32),
        target_logits.new_empty((batch, length), dtype=torch.int64),
        target_logits.new_empty((batch, length, vocab) if return_probs else (0,), dtype=torch.float32),
        per_position(), per_position(), per_position(), per_position(),
        target_logits.new_empty((batch,), dtype=torch.int32),
    )


def fake_backend(a: VerifyArgs) -> tuple:
    """A backend function that runs no kernel: uninitialised outputs of the right shapes and dtypes (the meta
    device's stand-in in tests and host-time benchmarks)."""
    return _fake_outputs(a.target_logits, bool(a.choices[_RETURN_PROBS]))


@torch.library.register_fake("csd_kernels::verify")
def _(*args):
    return _fake_outputs(args[0], bool(args[_CHOICES][_RETURN_PROBS]))


if compiled_extension() is not None:

    @torch.library.register_fake("csd_kernels::verify_rows")
    def _(*args):
        return _fake_outputs(args[0], bool(args[_CHOICES][_RETURN_PROBS]))


# ----------------------------------------------------------------------------------------------------------------------
# Argument checks (no host sync: values inside tensors are checked by the kernels through the status bits)
# ----------------------------------------------------------------------------------------------------------------------
def _index_tensor(name: str, value, batch: int, device: torch.device, default: int = 0,
                  high: int = (1 << 63) - 1) -> torch.Tensor:
    """[B] int64 on ``device`` from None, an int in [0, high], or an integer tensor of shape [], [1] or [B]."""
    if value is None:
        value = default
    if isinstance(value, bool) or not isinstance(value, (int, torch.Tensor)):
        raise ValueError(f"{name} must be an int or an integer tensor of shape [B], got {type(value).__name__}")
    if isinstance(value, int):
        if not 0 <= value <= high:
            raise ValueError(f"{name} must lie in [0, {high}], got {value}")
        if value == 0 and not torch.compiler.is_compiling():
            return _zeros(batch, device)
        return torch.full((batch,), value, dtype=torch.int64, device=device)
    if value.dtype not in _INT_DTYPES or value.numel() not in (1, batch) or value.dim() > 1:
        raise ValueError(f"{name} must be an integer tensor of shape [{batch}] (or one element), got {value.dtype} "
                         f"{tuple(value.shape)}")
    return value.reshape(-1).to(device=device, dtype=torch.int64).expand(batch).contiguous()


@functools.lru_cache(maxsize=64)
def _zeros(batch: int, device: torch.device) -> torch.Tensor:
    """[B] int64 zeros (the default start / positions), made once per shape and device: the kernels only read it."""
    return torch.zeros(batch, dtype=torch.int64, device=device)


_STATUS_MESSAGES = (
    (ref.STATUS_BAD_LOGITS, "target_logits/uncond_logits contain NaN or +Inf, overflow when mixed by cfg_scale, or "
                            "leave a position with no finite logit (-inf alone masks a token)"),
    (ref.STATUS_BAD_DRAFT_TOKEN, "draft_tokens must lie in [-1, V)"),
    (ref.STATUS_BAD_DRAFT_PROBS, f"draft_probs must be finite, non-negative and sum to 1 within "
                                 f"{ref.PROB_SUM_TOLERANCE:g} per position"),
    (ref.STATUS_MISSING_COMMITTED_TOKEN,
     "draft_tokens is -1 at a position before start (a committed position needs its token)"),
)
_BAD_TARGET_PROBS = (f"target_probs must be finite, non-negative and sum to 1 within {ref.PROB_SUM_TOLERANCE:g} per "
                     "position (rows are renormalised within that tolerance)")


def _raise_for_status(status: list[int], target_is_probs: bool = False) -> None:
    for bit, message in _STATUS_MESSAGES:
        if bit == ref.STATUS_BAD_LOGITS and target_is_probs:
            message = _BAD_TARGET_PROBS
        rows = [row for row, flags in enumerate(status) if flags & bit]
        if rows:
            raise ValueError(f"{message}: rows {rows[:8]}{' ...' if len(rows) > 8 else ''}")


def verify(
    target_logits: Optional[torch.Tensor] = None,
    draft_tokens: Optional[torch.Tensor] = None,
    draft_probs: Optional[torch.Tensor] = None,
    *,
    target_probs: Optional[torch.Tensor] = None,
    uncond_logits: Optional[torch.Tensor] = None,
    cfg_scale: float = 1.0,
    temperature: float = 1.0,
    top_k: Optional[int] = None,
    top_p: Optional[float] = None,
    min_p: Optional[float] = None,
    rule: str = "csd",
    neighbours: Optional[torch.Tensor] = None,
    gather_distortion: bool = False,
    max_distortion: Optional[float] = None,
    start: Optional[Union[int, torch.Tensor]] = None,
    coupling: str = "independent",
    positions: Optional[Union[int, torch.Tensor]] = None,
    seed: SeedLike = 0,
    offset: SeedLike = 0,
    return_probs: bool = True,
    informed: Optional[torch.Tensor] = None,
    backend: Optional[str] = None,
    validate: bool = True,
    **rule_params,
) -> VerifyResult:
    """Verify a window of draft tokens against the target model's logits, in one pass over the vocabulary.

    The maths is defined once in :mod:`csd_kernels.reference`; see its docstring and docs/op.md.
    rule: the acceptance rule, one of reference.RULES (config/acceptance.py, reference/rules.py): "strict" (the
    lossless speculative test), "csd" (CSD's relaxed acceptance where TVD(p, q) < tvd_threshold), "gsd" (grouped),
    "arsample" (entropy-scaled), "lantern" / "lantern++" (a draft's latent neighbours lend it their probability;
    they take ``neighbours``, the codebook's neighbour table, ck.codebook_neighbours). Its parameters are keywords
    (``entropy_coef=``, ``tvd_threshold=``, ``group_rank=``, ``group_delta=``, ``arsample_scale=``,
    ``arsample_offset=``, ``lantern_delta=``, ``lantern_lambda=``, ``lantern_k=``; the table's defaults; those of
    other rules are checked, not used). distortion: exact for every rule; lantern's and lantern++'s costs k gathers
    per token (V·k per position), so it is NaN unless ``gather_distortion=True``.
    max_distortion: a cap on the distortion a relaxed rule may spend at one position: where the rule's distortion
    there exceeds it, the position is decided by the strict test (distortion 0, the strict residual), as an
    uninformed slot is; 0 makes every rule lossless, None (the default) is no cap. It turns ``gather_distortion``
    on for the rules that gather (docs/op.md#a-cap-on-the-distortion).
    coupling: how the positions after accept_len get their next draft: "independent" (a fresh draw from p),
    "maximal" (the draft kept with probability min(1, p/q), else the residual draw; not with gsd, whose residual is
    not the strict one) or "gumbel" (argmax z + G).
    informed: [B, L] bool, False where the slot's draft was drawn without information (a uniform fresh draft): every
    rule decides such a slot by the strict test a = min(1, p/q) (distortion 0, the strict residual), since each
    relaxed rule was defined for a drafter's q (docs/op.md#uninformed-drafts); None: every slot informed.
    (``mode=`` and ``next_drafts=`` are deprecated names of ``rule=`` and ``coupling=``.)
    A −inf logit (in target_logits or uncond_logits) masks its token: p = 0 there, and a masked draft is rejected.
    top_k / top_p / min_p restrict p (in that order; ties at a threshold are kept), see docs/op-semantics.md.
    target_probs: the target distribution instead of target_logits (exactly one of the two; then no uncond_logits,
    cfg_scale, temperature or top-k / top-p / min-p): rows must sum to 1 within reference.PROB_SUM_TOLERANCE and are
    renormalised. draft_probs rows must sum to 1 within the same tolerance where a draft is tested (else status
    STATUS_BAD_DRAFT_PROBS); at an undrafted position (draft −1) the q row decides nothing and is not checked.

    Shape: target_logits [B, L, V] (float32/bfloat16/float16, any strides on B and L) or target_probs [B, L, V]
    float32, draft_tokens [B, L] int32 or int64
    (-1 = no draft), draft_probs [B, L, V] float32 or None (one-hot drafts; strides may be 0 for a uniform q),
    uncond_logits like target_logits, neighbours [V, K] integer (entries outside [0, V) lend nothing), start and
    positions [B] int (or an int for all rows),
    seed an int in [0, 2^63) or an int64 tensor of 1 or B elements (B: one seed per row), offset an int in [0, 2^63)
    or an int64 tensor of 1 or B elements (B: one step-stream offset per row, row b uses offset[b]; values must lie
    in [0, 2^63)) (tensors keep the op CUDA-graph safe).

    ``validate=True`` reads the per-row status the kernels write (one host sync, together with accept_len, which
    lands in ``accept_len_host``) and raises ValueError naming the argument; with ``validate=False`` the op never
    syncs and bad rows are only reported in ``status`` (their tokens are still in range).
    """
    rule, coupling, rule_params = _renamed(rule_params, rule, coupling)
    target_is_probs = target_probs is not None
    target_logits = _one_target(target_logits, target_probs, uncond_logits, cfg_scale, temperature, top_k, top_p,
                                min_p)
    target_logits, draft_tokens, draft_probs, uncond_logits = _check_tensors(target_logits, draft_tokens, draft_probs,
                                                                             uncond_logits, target_is_probs)
    batch, length, vocab = target_logits.shape
    device = target_logits.device
    o = check_options("verify", has_uncond=uncond_logits is not None, cfg_scale=cfg_scale, temperature=temperature,
                      top_k=top_k, top_p=top_p, min_p=min_p, coupling=coupling, rule=rule, rule_params=rule_params,
                      neighbours=neighbours, vocab=vocab, device=device, target_is_probs=target_is_probs,
                      gather_distortion=gather_distortion, max_distortion=max_distortion,
                      return_probs=bool(return_probs))
    informed = check_informed(informed, (batch, length), device)
    start = _index_tensor("start", start, batch, device, high=length)
    positions = _index_tensor("positions", positions, batch, device)
    seed = philox_word("seed", seed, device, allow_per_row=batch, limit=SEED_LIMIT)
    offset = philox_word("offset", offset, device, allow_per_row=batch, limit=SEED_LIMIT)
    chosen = select_backend(backend, device)
    compiling = torch.compiler.is_compiling()
    if compiling or chosen != "triton":  # the eager Triton launch passes int seeds / offsets as kernel arguments
        seed, offset = word_tensor(seed, device), word_tensor(offset, device)
    args = VerifyArgs(target_logits=target_logits, draft_tokens=draft_tokens, draft_probs=draft_probs,
                      uncond_logits=uncond_logits, neighbours=o.neighbours, informed=informed, start=start,
                      positions=positions, seed=seed, offset=offset, settings=o.settings.floats(),
                      choices=o.settings.ints())
    if compiling:
        outputs = torch.ops.csd_kernels.verify(*args, chosen)  # the registered op: traced through its fake
    else:  # eager: the same implementation without the dispatcher's per-call cost
        outputs = _eager(chosen, args)
    result = VerifyResult(*outputs)
    if not return_probs:
        result.probs = None
    if validate:
        _validate(result, start, batch, length, target_is_probs)
    return result


def _eager(chosen: str, args: VerifyArgs) -> tuple:
    if chosen == "triton":  # kernels write fresh outputs through pointers: no autograd graph, so no no_grad cost
        return _triton_backend(args, packed_outputs=True)  # eager outputs may share storage (fewer allocations)
    with torch.no_grad():
        return _BACKEND_FUNCTIONS[chosen](args)


def _one_target(target_logits, target_probs, uncond_logits, cfg_scale, temperature, top_k, top_p, min_p):
    """The tensor that holds the target (logits or probabilities); exactly one of the two, and probabilities come
    with none of the options that act on logits."""
    if (target_logits is None) == (target_probs is None):
        raise ValueError("give exactly one of target_logits and target_probs")
    if target_probs is None:
        return target_logits
    options = dict(uncond_logits=uncond_logits is not None, cfg_scale=cfg_scale != 1.0, temperature=temperature != 1.0,
                   top_k=top_k is not None, top_p=top_p is not None, min_p=min_p is not None)
    given = [name for name, used in options.items() if used]
    if given:
        raise ValueError(f"target_probs is the final target distribution: {', '.join(given)} cannot be applied to it "
                         "(apply them before normalising, or pass target_logits)")
    return target_probs


def _renamed(keywords: dict, rule: str, coupling: str) -> tuple[str, str, dict]:
    """(rule, coupling, the other keywords), taking the deprecated ``mode=`` / ``next_drafts=`` spellings with a
    warning."""
    if "mode" not in keywords and "next_drafts" not in keywords:
        return rule, coupling, keywords
    import warnings

    keywords = dict(keywords)
    for old, new in (("mode", "rule"), ("next_drafts", "coupling")):
        if old in keywords:
            warnings.warn(f"verify({old}=...) is deprecated; use {new}=", DeprecationWarning, stacklevel=3)
    return keywords.pop("mode", rule), keywords.pop("next_drafts", coupling), keywords


def _check_tensors(target_logits, draft_tokens, draft_probs, uncond_logits, target_is_probs: bool = False) -> tuple:
    if target_is_probs:
        target_logits = check_logits("target_probs", target_logits, dtypes=(torch.float32,))
    else:
        target_logits = check_logits("target_logits", target_logits)
    batch, length, vocab = target_logits.shape
    device = target_logits.device
    if not isinstance(draft_tokens, torch.Tensor) or draft_tokens.dtype not in _INT_DTYPES:
        got = getattr(draft_tokens, "dtype", type(draft_tokens).__name__)
        raise ValueError(f"draft_tokens must be an integer tensor, got {got}")
    if draft_tokens.shape != (batch, length):
        raise ValueError(f"draft_tokens must have shape [B, L] = {(batch, length)}, got {tuple(draft_tokens.shape)}")
    check_device("draft_tokens", draft_tokens, device)
    if draft_tokens.dtype != torch.int64:  # every backend reads int64 (int32 ids from other decoders are common)
        draft_tokens = draft_tokens.to(torch.int64)
    if uncond_logits is not None:
        uncond_logits = check_logits("uncond_logits", uncond_logits, (batch, length, vocab))
        check_device("uncond_logits", uncond_logits, device)
    if draft_probs is not None:
        if not isinstance(draft_probs, torch.Tensor) or draft_probs.dtype != torch.float32:
            got = getattr(draft_probs, "dtype", type(draft_probs).__name__)
            raise ValueError(f"draft_probs must be a float32 tensor, got {got}")
        if draft_probs.shape != (batch, length, vocab):
            raise ValueError(f"draft_probs must have shape [B, L, V] = {(batch, length, vocab)}, got "
                             f"{tuple(draft_probs.shape)}")
        check_device("draft_probs", draft_probs, device)
        if draft_probs.stride(-1) not in (0, 1):
            draft_probs = draft_probs.contiguous()
    return target_logits, draft_tokens, draft_probs, uncond_logits


def _validate(result: VerifyResult, start: torch.Tensor, batch: int, length: int,
              target_is_probs: bool = False) -> None:
    """One host sync: the status bits, accept_len (kept in accept_len_host) and 0 <= start <= L."""
    out_of_range = ((start < 0) | (start > length)).any().reshape(1).to(torch.int32)
    checks = torch.cat([result.status, result.accept_len, out_of_range]).tolist()
    if checks[-1]:
        raise ValueError(f"start must lie in [0, L] = [0, {length}]")
    _raise_for_status(checks[:batch], target_is_probs)
    result.accept_len_host = checks[batch:2 * batch]
