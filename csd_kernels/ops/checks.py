"""The argument checks verify and verify_tree share (no host sync: values inside tensors are checked by the kernels
through the status bits): ValueErrors naming the argument."""

from __future__ import annotations

import math
from typing import Optional, Union

import torch

from .. import reference as ref
from ..config.rules import real_rule

__all__ = ["FLOAT_DTYPES", "SeedLike", "check_real", "philox_word", "word_tensor", "check_logits", "check_device",
           "check_nucleus", "check_scalars"]

FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)  # the logits the ops take
SeedLike = Union[int, torch.Tensor]
_RULE_CODE = {name: code for code, name in enumerate(ref.RULES)}
_COUPLING_CODE = {name: code for code, name in enumerate(ref.COUPLINGS)}


def check_real(name: str, value, low: float = -math.inf, high: float = math.inf) -> float:
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not number or not math.isfinite(value) or not low <= value <= high:
        raise ValueError(f"{name} must be {real_rule(low, high).expected}, got {value!r}")
    return float(value)


def philox_word(name: str, value: SeedLike, device: torch.device, *, allow_per_row: int = 0,
                limit: int) -> Union[int, torch.Tensor]:
    """A non-negative integer below ``limit`` (at most constants.SEED_LIMIT = 2^63: an int64) as the op's word: the
    int (see :func:`word_tensor`), or an int64 tensor [1] (or [allow_per_row]) as given (its values are not read:
    no host sync)."""
    if isinstance(value, bool) or not isinstance(value, (int, torch.Tensor)):
        raise ValueError(f"{name} must be an int or an int64 tensor, got {type(value).__name__}")
    if isinstance(value, int):
        if not 0 <= value < limit:
            raise ValueError(f"{name} must lie in [0, 2^{limit.bit_length() - 1}), got {value}")
        return value
    sizes = (1, allow_per_row) if allow_per_row else (1,)
    if value.dtype != torch.int64 or value.numel() not in sizes or value.dim() > 1:
        raise ValueError(f"{name} must be an int64 tensor with {' or '.join(map(str, sizes))} element(s), got "
                         f"{value.dtype} {tuple(value.shape)}")
    return value.reshape(-1).to(device)


def word_tensor(word: Union[int, torch.Tensor], device: torch.device) -> torch.Tensor:
    """A seed / offset word as the int64 tensor every backend but the eager Triton launch reads (that one takes the
    int as a kernel argument: no fill kernel)."""
    if isinstance(word, torch.Tensor):
        return word
    # A fill kernel, not a host-to-device copy: no sync, and capturable in a CUDA graph (the int is baked in).
    return torch.full((1,), word, dtype=torch.int64, device=device)


def check_logits(name: str, tensor, shape=None, dtypes=FLOAT_DTYPES) -> torch.Tensor:
    if not isinstance(tensor, torch.Tensor):
        raise ValueError(f"{name} must be a tensor, got {type(tensor).__name__}")
    if tensor.dim() != 3:
        raise ValueError(f"{name} must have shape [B, L, V], got {tuple(tensor.shape)}")
    if shape is not None and tensor.shape != shape:  # torch.Size compares equal to the tuple
        raise ValueError(f"{name} must have the shape of target_logits {shape}, got {tuple(tensor.shape)}")
    if tensor.dtype not in dtypes:
        raise ValueError(f"{name} must be {', '.join(str(d).split('.')[-1] for d in dtypes)}, got {tensor.dtype}")
    if min(tensor.shape) < 1:
        raise ValueError(f"{name} must be non-empty, got shape {tuple(tensor.shape)}")
    return tensor if tensor.stride(-1) == 1 else tensor.contiguous()


def check_device(name: str, tensor: Optional[torch.Tensor], device: torch.device) -> None:
    if tensor is not None and tensor.device != device:
        raise ValueError(f"{name} is on {tensor.device} but target_logits is on {device}")


def check_nucleus(top_p, min_p) -> tuple[float, float]:
    """(top_p, min_p) for the backends: 1.0 and 0.0 mean no restriction."""
    if top_p is not None:
        top_p = check_real("top_p", top_p, 0.0, 1.0)
        if top_p == 0.0:
            raise ValueError("top_p must lie in (0, 1] (None or 1 keeps every token), got 0")
    min_p = 0.0 if min_p is None else check_real("min_p", min_p, 0.0, 1.0)
    return (1.0 if top_p is None else top_p), min_p


def check_scalars(has_uncond, cfg_scale, temperature, top_k, rule, entropy_coef, tvd_threshold, coupling) -> tuple:
    """(cfg_scale, temperature, top_k or 0, rule code, entropy_coef, tvd_threshold, coupling code), checked."""
    cfg_scale = check_real("cfg_scale", cfg_scale)
    if not has_uncond and cfg_scale != 1.0:
        raise ValueError(f"cfg_scale={cfg_scale} needs uncond_logits (classifier-free guidance mixes two sets of "
                         "logits)")
    temperature = check_real("temperature", temperature, 0.0)
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise ValueError(f"top_k must be None or an int >= 1, got {top_k!r}")
    if rule not in _RULE_CODE:
        raise ValueError(f"rule must be one of {ref.RULES}, got {rule!r}")
    entropy_coef = check_real("entropy_coef", entropy_coef, 0.0)
    tvd_threshold = check_real("tvd_threshold", tvd_threshold, 0.0, 1.0)
    if coupling not in _COUPLING_CODE:
        raise ValueError(f"coupling must be one of {ref.COUPLINGS}, got {coupling!r}")
    return cfg_scale, temperature, top_k or 0, _RULE_CODE[rule], entropy_coef, tvd_threshold, _COUPLING_CODE[coupling]
