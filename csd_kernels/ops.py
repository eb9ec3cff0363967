"""The public ``verify`` op: argument checks, the ``torch.library`` registration, and backend dispatch.

``csd_kernels::verify`` is one custom op (schema + fake implementation, so ``torch.compile(fullgraph=True)`` sees
through it) whose ``backend`` argument names the implementation. The C++/CUDA extension registers its own op,
``csd_kernels::verify_rows``, whose fake implementation is registered here too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Union

import torch

from . import reference
from .dispatch import compiled_extension, select_backend

__all__ = ["VerifyResult", "verify"]

_FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_INT_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)
_MODE_CODE = {name: code for code, name in enumerate(reference.MODES)}
_NEXT_DRAFTS_CODE = {name: code for code, name in enumerate(reference.NEXT_DRAFTS)}
SeedLike = Union[int, torch.Tensor]


@dataclass
class VerifyResult:
    """What one verification step returns.

    Shape: accept_len [B] int32; tokens [B, L] int64; probs [B, L, V] float32 or None;
    entropy, tvd, accept_prob, distortion [B, L] float32; status [B] int32.

    accept_len: first position at or after ``start`` whose draft was rejected or missing (L if none).
    tokens: the drafts before accept_len, the resampled token at accept_len, and the next drafts after it.
    probs: the target distribution p (after CFG, temperature, top-k).
    entropy: H(p) in nats. tvd: ½Σ|p − q| (½ where there is neither a draft nor draft_probs).
    accept_prob: a(x) for the draft (0 where there is none). distortion: ½Σ|out − p| of the rule at that position.
    status: per-row bit mask of input problems (reference.STATUS_*), 0 when the row was fine.
    accept_len_host: accept_len as a Python list when validate=True read it (with the status, in one host sync).
    """

    accept_len: torch.Tensor
    tokens: torch.Tensor
    probs: Optional[torch.Tensor]
    entropy: torch.Tensor
    tvd: torch.Tensor
    accept_prob: torch.Tensor
    distortion: torch.Tensor
    status: torch.Tensor
    accept_len_host: Optional[list[int]] = None


# ----------------------------------------------------------------------------------------------------------------------
# Backends behind one op
# ----------------------------------------------------------------------------------------------------------------------
def _torch_backend(logits, draft_tokens, draft_probs, uncond, cfg_scale, temperature, top_k, mode, entropy_coef,
                   tvd_threshold, start, next_drafts, positions, seed, offset, return_probs):
    out = reference.verify(
        logits, draft_tokens, draft_probs, uncond_logits=uncond, cfg_scale=cfg_scale, temperature=temperature,
        top_k=top_k or None, mode=reference.MODES[mode], entropy_coef=entropy_coef, tvd_threshold=tvd_threshold,
        start=start, next_drafts=reference.NEXT_DRAFTS[next_drafts], positions=positions, seed=seed, offset=offset,
        return_probs=return_probs,
    )
    probs = out.probs if return_probs else logits.new_empty((0,), dtype=torch.float32)
    return out.accept_len, out.tokens, probs, out.entropy, out.tvd, out.accept_prob, out.distortion, out.status


def _triton_backend(*args):
    from .triton_verify import verify_triton

    return verify_triton(*args)


def _compiled_backend(*args):
    return tuple(torch.ops.csd_kernels.verify_rows(*args))


_BACKEND_FUNCTIONS = {"torch": _torch_backend, "triton": _triton_backend, "cpu": _compiled_backend, "cuda": _compiled_backend}


@torch.library.custom_op("csd_kernels::verify", mutates_args=())
def _verify_op(
    target_logits: torch.Tensor,
    draft_tokens: torch.Tensor,
    draft_probs: Optional[torch.Tensor],
    uncond_logits: Optional[torch.Tensor],
    cfg_scale: float,
    temperature: float,
    top_k: int,
    mode: int,
    entropy_coef: float,
    tvd_threshold: float,
    start: torch.Tensor,
    next_drafts: int,
    positions: torch.Tensor,
    seed: torch.Tensor,
    offset: torch.Tensor,
    return_probs: bool,
    backend: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    outputs = _BACKEND_FUNCTIONS[backend](
        target_logits, draft_tokens, draft_probs, uncond_logits, cfg_scale, temperature, top_k, mode, entropy_coef,
        tvd_threshold, start, next_drafts, positions, seed, offset, return_probs,
    )
    return tuple(outputs)


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


@_verify_op.register_fake
def _(target_logits, draft_tokens, draft_probs, uncond_logits, cfg_scale, temperature, top_k, mode, entropy_coef,
      tvd_threshold, start, next_drafts, positions, seed, offset, return_probs, backend):
    return _fake_outputs(target_logits, return_probs)


if compiled_extension() is not None:

    @torch.library.register_fake("csd_kernels::verify_rows")
    def _(target_logits, draft_tokens, draft_probs, uncond_logits, cfg_scale, temperature, top_k, mode, entropy_coef,
          tvd_threshold, start, next_drafts, positions, seed, offset, return_probs):
        return _fake_outputs(target_logits, return_probs)


# ----------------------------------------------------------------------------------------------------------------------
# Argument checks (no host sync: values inside tensors are checked by the kernels through the status bits)
# ----------------------------------------------------------------------------------------------------------------------
def _check_real(name: str, value, low: float = -math.inf, high: float = math.inf) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or not low <= value <= high:
        raise ValueError(f"{name} must be a finite number in [{low}, {high}], got {value!r}")
    return float(value)


def _index_tensor(name: str, value, batch: int, device: torch.device, default: int = 0) -> torch.Tensor:
    """[B] int64 on ``device`` from None, an int, or an integer tensor of shape [], [1] or [B]."""
    if value is None:
        value = default
    if isinstance(value, bool) or not isinstance(value, (int, torch.Tensor)):
        raise ValueError(f"{name} must be an int or an integer tensor of shape [B], got {type(value).__name__}")
    if isinstance(value, int):
        return torch.full((batch,), value, dtype=torch.int64, device=device)
    if value.dtype not in _INT_DTYPES or value.numel() not in (1, batch) or value.dim() > 1:
        raise ValueError(f"{name} must be an integer tensor of shape [{batch}] (or one element), got {value.dtype} {tuple(value.shape)}")
    return value.reshape(-1).to(device=device, dtype=torch.int64).expand(batch).contiguous()


def _philox_word(name: str, value: SeedLike, device: torch.device, *, allow_per_row: int = 0, limit: int) -> torch.Tensor:
    """int64 tensor [1] (or [allow_per_row]) holding the bit pattern of a non-negative integer below ``limit``."""
    if isinstance(value, bool) or not isinstance(value, (int, torch.Tensor)):
        raise ValueError(f"{name} must be an int or an int64 tensor, got {type(value).__name__}")
    if isinstance(value, int):
        if not 0 <= value < limit:
            raise ValueError(f"{name} must lie in [0, {limit}), got {value}")
        signed = value - (1 << 64) if value >= (1 << 63) else value
        # A fill kernel, not a host-to-device copy: no sync, and capturable in a CUDA graph (the int is baked in).
        return torch.full((1,), signed, dtype=torch.int64, device=device)
    sizes = (1, allow_per_row) if allow_per_row else (1,)
    if value.dtype != torch.int64 or value.numel() not in sizes or value.dim() > 1:
        raise ValueError(f"{name} must be an int64 tensor with {' or '.join(map(str, sizes))} element(s), got {value.dtype} {tuple(value.shape)}")
    return value.reshape(-1).to(device)


def _check_logits(name: str, tensor, shape=None) -> torch.Tensor:
    if not isinstance(tensor, torch.Tensor):
        raise ValueError(f"{name} must be a tensor, got {type(tensor).__name__}")
    if tensor.dim() != 3:
        raise ValueError(f"{name} must have shape [B, L, V], got {tuple(tensor.shape)}")
    if shape is not None and tuple(tensor.shape) != shape:
        raise ValueError(f"{name} must have the shape of target_logits {shape}, got {tuple(tensor.shape)}")
    if tensor.dtype not in _FLOAT_DTYPES:
        raise ValueError(f"{name} must be float32, bfloat16 or float16, got {tensor.dtype}")
    if min(tensor.shape) < 1:
        raise ValueError(f"{name} must be non-empty, got shape {tuple(tensor.shape)}")
    return tensor if tensor.stride(-1) == 1 else tensor.contiguous()


def _check_device(name: str, tensor: Optional[torch.Tensor], device: torch.device) -> None:
    if tensor is not None and tensor.device != device:
        raise ValueError(f"{name} is on {tensor.device} but target_logits is on {device}")


_STATUS_MESSAGES = (
    (reference.STATUS_BAD_LOGITS, "target_logits/uncond_logits contain NaN or ±Inf (or overflow when mixed by cfg_scale)"),
    (reference.STATUS_BAD_DRAFT_TOKEN, "draft_tokens must lie in [-1, V)"),
    (reference.STATUS_BAD_DRAFT_PROBS, "draft_probs must be finite and non-negative"),
    (reference.STATUS_MISSING_COMMITTED_TOKEN, "draft_tokens is -1 at a position before start (a committed position needs its token)"),
)


def _raise_for_status(status: list[int]) -> None:
    for bit, message in _STATUS_MESSAGES:
        rows = [row for row, flags in enumerate(status) if flags & bit]
        if rows:
            raise ValueError(f"{message}: rows {rows[:8]}{' ...' if len(rows) > 8 else ''}")


def verify(
    target_logits: torch.Tensor,
    draft_tokens: torch.Tensor,
    draft_probs: Optional[torch.Tensor] = None,
    *,
    uncond_logits: Optional[torch.Tensor] = None,
    cfg_scale: float = 1.0,
    temperature: float = 1.0,
    top_k: Optional[int] = None,
    mode: str = "csd",
    entropy_coef: float = 0.5,
    tvd_threshold: float = 0.65,
    start: Optional[Union[int, torch.Tensor]] = None,
    next_drafts: str = "independent",
    positions: Optional[Union[int, torch.Tensor]] = None,
    seed: SeedLike = 0,
    offset: SeedLike = 0,
    return_probs: bool = True,
    backend: Optional[str] = None,
    validate: bool = True,
) -> VerifyResult:
    """Verify a window of draft tokens against the target model's logits, in one pass over the vocabulary.

    The maths is defined once in :mod:`csd_kernels.reference`; see its docstring and the README.

    Shape: target_logits [B, L, V] (float32/bfloat16/float16, any strides on B and L), draft_tokens [B, L] int
    (-1 = no draft), draft_probs [B, L, V] float32 or None (one-hot drafts; strides may be 0 for a uniform q),
    uncond_logits like target_logits, start and positions [B] int (or an int for all rows),
    seed an int in [0, 2^64) or an int64 tensor of 1 or B elements (B: one seed per row), offset an int in [0, 2^63)
    or an int64 tensor of 1 or B elements (B: one step-stream offset per row, row b uses offset[b]; values must lie
    in [0, 2^63)) (tensors keep the op CUDA-graph safe).

    ``validate=True`` reads the per-row status the kernels write (one host sync, together with accept_len, which
    lands in ``accept_len_host``) and raises ValueError naming the argument; with ``validate=False`` the op never
    syncs and bad rows are only reported in ``status`` (their tokens are still in range).
    """
    target_logits = _check_logits("target_logits", target_logits)
    batch, length, vocab = target_logits.shape
    device = target_logits.device
    if not isinstance(draft_tokens, torch.Tensor) or draft_tokens.dtype not in _INT_DTYPES:
        raise ValueError(f"draft_tokens must be an integer tensor, got {getattr(draft_tokens, 'dtype', type(draft_tokens).__name__)}")
    if tuple(draft_tokens.shape) != (batch, length):
        raise ValueError(f"draft_tokens must have shape [B, L] = {(batch, length)}, got {tuple(draft_tokens.shape)}")
    _check_device("draft_tokens", draft_tokens, device)
    if uncond_logits is not None:
        uncond_logits = _check_logits("uncond_logits", uncond_logits, (batch, length, vocab))
        _check_device("uncond_logits", uncond_logits, device)
    if draft_probs is not None:
        if not isinstance(draft_probs, torch.Tensor) or draft_probs.dtype != torch.float32:
            raise ValueError(f"draft_probs must be a float32 tensor, got {getattr(draft_probs, 'dtype', type(draft_probs).__name__)}")
        if tuple(draft_probs.shape) != (batch, length, vocab):
            raise ValueError(f"draft_probs must have shape [B, L, V] = {(batch, length, vocab)}, got {tuple(draft_probs.shape)}")
        _check_device("draft_probs", draft_probs, device)
        if draft_probs.stride(-1) not in (0, 1):
            draft_probs = draft_probs.contiguous()
    cfg_scale = _check_real("cfg_scale", cfg_scale)
    if uncond_logits is None and cfg_scale != 1.0:
        raise ValueError(f"cfg_scale={cfg_scale} needs uncond_logits (classifier-free guidance mixes two sets of logits)")
    temperature = _check_real("temperature", temperature, 0.0)
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise ValueError(f"top_k must be None or an int >= 1, got {top_k!r}")
    if mode not in _MODE_CODE:
        raise ValueError(f"mode must be one of {reference.MODES}, got {mode!r}")
    entropy_coef = _check_real("entropy_coef", entropy_coef, 0.0)
    tvd_threshold = _check_real("tvd_threshold", tvd_threshold, 0.0, 1.0)
    if next_drafts not in _NEXT_DRAFTS_CODE:
        raise ValueError(f"next_drafts must be one of {reference.NEXT_DRAFTS}, got {next_drafts!r}")
    start = _index_tensor("start", start, batch, device)
    positions = _index_tensor("positions", positions, batch, device)
    seed = _philox_word("seed", seed, device, allow_per_row=batch, limit=1 << 64)
    offset = _philox_word("offset", offset, device, allow_per_row=batch, limit=1 << 63)
    chosen = select_backend(backend, device)

    outputs = _verify_op(
        target_logits, draft_tokens, draft_probs, uncond_logits, cfg_scale, temperature, top_k or 0, _MODE_CODE[mode],
        entropy_coef, tvd_threshold, start, _NEXT_DRAFTS_CODE[next_drafts], positions, seed, offset, return_probs, chosen,
    )
    result = VerifyResult(*outputs)
    if not return_probs:
        result.probs = None
    if validate:
        checks = torch.cat([result.status, result.accept_len, (start < 0).any().reshape(1).to(torch.int32)]).tolist()
        if checks[-1]:
            raise ValueError("start must be >= 0")
        _raise_for_status(checks[:batch])
        result.accept_len_host = checks[batch:2 * batch]
    return result
