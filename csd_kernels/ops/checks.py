"""The argument checks verify and verify_tree share (no host sync: values inside tensors are checked by the kernels
through the status bits): ValueErrors naming the argument."""

from __future__ import annotations

import math
from typing import NamedTuple, Optional, Union

import torch

from .. import reference as ref
from ..backends.spec import OpSettings
from ..config.acceptance import PARAMS, default_lantern_k, param_values, params_by_name, rule_named
from ..config.rules import real_rule

__all__ = ["FLOAT_DTYPES", "SeedLike", "check_real", "philox_word", "word_tensor", "check_logits", "check_device",
           "check_nucleus", "check_scalars", "check_informed", "check_rule", "rule_keywords", "CheckedRule", "Options",
           "check_distortion", "check_options", "reference_options"]

FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)  # the logits the ops take
SeedLike = Union[int, torch.Tensor]
_COUPLING_CODE = {name: code for code, name in enumerate(ref.COUPLINGS)}
_INT_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


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


def check_informed(informed, shape: tuple, device: torch.device, where: str = "[B, L]") -> Optional[torch.Tensor]:
    """``informed`` (None, or a bool tensor of ``shape`` on ``device``: False where a slot's draft was drawn without
    information), checked."""
    if informed is None:
        return None
    if not isinstance(informed, torch.Tensor) or informed.dtype != torch.bool:
        got = getattr(informed, "dtype", type(informed).__name__)
        raise ValueError(f"informed must be a bool tensor {where} (False: a draft drawn without information), "
                         f"got {got}")
    if tuple(informed.shape) != tuple(shape):
        raise ValueError(f"informed must have shape {where} = {tuple(shape)}, got {tuple(informed.shape)}")
    check_device("informed", informed, device)
    return informed


def check_nucleus(top_p, min_p) -> tuple[float, float]:
    """(top_p, min_p) for the backends: 1.0 and 0.0 mean no restriction."""
    if top_p is not None:
        top_p = check_real("top_p", top_p, 0.0, 1.0)
        if top_p == 0.0:
            raise ValueError("top_p must lie in (0, 1] (None or 1 keeps every token), got 0")
    min_p = 0.0 if min_p is None else check_real("min_p", min_p, 0.0, 1.0)
    return (1.0 if top_p is None else top_p), min_p


def check_scalars(has_uncond, cfg_scale, temperature, top_k, coupling) -> tuple:
    """(cfg_scale, temperature, top_k or 0, coupling code), checked."""
    cfg_scale = check_real("cfg_scale", cfg_scale)
    if not has_uncond and cfg_scale != 1.0:
        raise ValueError(f"cfg_scale={cfg_scale} needs uncond_logits (classifier-free guidance mixes two sets of "
                         "logits)")
    temperature = check_real("temperature", temperature, 0.0)
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise ValueError(f"top_k must be None or an int >= 1, got {top_k!r}")
    if coupling not in _COUPLING_CODE:
        raise ValueError(f"coupling must be one of {ref.COUPLINGS}, got {coupling!r}")
    return cfg_scale, temperature, top_k or 0, _COUPLING_CODE[coupling]


class CheckedRule(NamedTuple):
    """A rule as the backends take it: its code, its parameter values as floats (config/acceptance.py's order, as
    many as it declares) and the neighbour table (int64 [V, k], k its lantern_k) or None."""

    code: int
    params: tuple
    neighbours: Optional[torch.Tensor]


def rule_keywords(keywords: dict, op: str) -> dict:
    """The rule-parameter keywords of an op call, each value checked even where the chosen rule does not read it (a
    bad value is an error, not silently unused); TypeError naming any other keyword."""
    unknown = sorted(set(keywords) - set(PARAMS))
    if unknown:
        raise TypeError(f"{op}() got unexpected keyword argument(s) {unknown}; the rules' parameters are "
                        f"{', '.join(PARAMS)}")
    for name, value in keywords.items():
        if value is not None:
            PARAMS[name].check.check(name, value)
    return keywords


def check_rule(rule: str, params: dict, neighbours, vocab: int, device: torch.device) -> CheckedRule:
    """The rule, its parameters (the table's checks: ArgumentError naming the keyword) and its neighbour table:
    an integer tensor [V, K] on the device, which lantern and lantern++ need (its first lantern_k columns; lantern_k
    defaults to default_lantern_k(rule, V) capped at K) and the other rules ignore. Entries outside [0, V) lend
    nothing."""
    spec = rule_named(rule)
    table = None
    if spec.needs_neighbours:
        table = _check_neighbours(rule, neighbours, vocab, device)
        if params.get("lantern_k") is None:
            params = dict(params, lantern_k=min(default_lantern_k(rule, vocab), table.shape[1]))
    values = param_values(spec, params)
    if table is not None:
        k = values[spec.param_names().index("lantern_k")]
        if k > table.shape[1]:
            raise ValueError(f"lantern_k={k} exceeds the neighbour table's width {table.shape[1]}")
        table = table[:, :k]
    return CheckedRule(spec.code, tuple(float(v) for v in values), table)


def _check_neighbours(rule: str, neighbours, vocab: int, device: torch.device) -> torch.Tensor:
    expected = f"an integer tensor [V, k] = [{vocab}, k] (ck.codebook_neighbours(codebook, k))"
    if neighbours is None:
        raise ValueError(f"rule={rule!r} needs neighbours=: {expected}")
    if not isinstance(neighbours, torch.Tensor) or neighbours.dtype not in _INT_DTYPES or neighbours.dim() != 2 \
            or neighbours.shape[0] != vocab:
        got = f"{neighbours.dtype} {tuple(neighbours.shape)}" if isinstance(neighbours, torch.Tensor) else \
            type(neighbours).__name__
        raise ValueError(f"neighbours must be {expected}, got {got}")
    check_device("neighbours", neighbours, device)
    if neighbours.dtype != torch.int64 or neighbours.stride(-1) != 1:
        neighbours = neighbours.to(torch.int64).contiguous()
    return neighbours


class Options(NamedTuple):
    """An op call's options as the backends take them: the record of its scalars and the rule's neighbour table."""

    settings: OpSettings
    neighbours: Optional[torch.Tensor]


def check_distortion(rule: str, gather_distortion, max_distortion) -> tuple[bool, float]:
    """(gather_distortion, the cap as a float, inf for None): the cap on a relaxed rule's distortion per position is
    None or a real >= 0, and turns ``gather_distortion`` on for a rule whose distortion costs gathers (gsd, lantern):
    the cap compares that distortion."""
    cap = math.inf if max_distortion is None else max_distortion
    number = isinstance(cap, (int, float)) and not isinstance(cap, bool)
    if not number or not cap >= 0:  # (NaN fails too)
        raise ValueError(f"max_distortion must be None (no cap) or a real >= 0, got {max_distortion!r}")
    return bool(gather_distortion) or (cap < math.inf and rule_named(rule).distortion_gathers), float(cap)


def check_options(op: str, *, has_uncond: bool, cfg_scale, temperature, top_k, top_p, min_p, coupling: str,
                  rule: str, rule_params: dict, neighbours, vocab: int, device: torch.device, max_distortion=None,
                  gather_distortion: bool = False, **choices) -> Options:
    """The options of ``op`` (verify, verify_tree) checked and made one :class:`~csd_kernels.backends.spec.OpSettings`,
    in one place: the scalars, the rule with its parameters and neighbour table, a coupling the rule's resampling law
    allows, top_p / min_p, the distortion cap; ``choices``: the record's other fields (flags, the tree's shape), as
    given."""
    cfg_scale, temperature, top_k, coupling_code = check_scalars(has_uncond, cfg_scale, temperature, top_k, coupling)
    checked = check_rule(rule, rule_keywords(rule_params, op), neighbours, vocab, device)
    if coupling == "maximal" and rule_named(rule).residual_qa:
        raise ValueError(f"coupling='maximal' redraws from the strict residual max(p - q, 0); rule={rule!r} resamples "
                         "from max(p - q·a, 0): use coupling 'independent' or 'gumbel'")
    top_p, min_p = check_nucleus(top_p, min_p)
    gather, cap = check_distortion(rule, gather_distortion, max_distortion)
    settings = OpSettings(cfg_scale=cfg_scale, temperature=temperature, top_p=top_p, min_p=min_p, max_distortion=cap,
                          top_k=top_k, rule=checked.code, coupling=coupling_code, gather_distortion=gather,
                          rule_params=checked.params, **choices)
    return Options(settings, checked.neighbours)


def reference_options(s: OpSettings) -> dict:
    """The record as the reference's keywords (reference.verify and reference.verify_tree alike): None where a
    restriction is off, the rule by name and its parameters by name."""
    return dict(cfg_scale=s.cfg_scale, temperature=s.temperature, top_k=s.top_k or None,
                top_p=s.top_p if s.top_p < 1.0 else None, min_p=s.min_p or None, rule=ref.RULES[s.rule],
                gather_distortion=s.gather_distortion, max_distortion=s.max_distortion,
                **params_by_name(s.rule, s.rule_params))
