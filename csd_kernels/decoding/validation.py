"""One check of every setting :func:`csd_kernels.generate` and the ``csd`` command take.

A bad value raises :class:`ArgumentError`, a ValueError naming the keyword (``window=0: expected an int >= 1``). The
API calls these functions first thing; the command line calls the same ones on its flags before it loads a model or
writes a file, and prints the error as one line naming the flag (``--window 0: expected an int >= 1``, exit status 2;
:mod:`csd_kernels.runner.usage`). A new setting is one line in :data:`RULES`.
"""

from __future__ import annotations

import math
import numbers
import warnings
from dataclasses import dataclass
from typing import Optional

import torch

from .. import reference as ref
from ..ops.registry import BACKENDS, backend_status

__all__ = ["ArgumentError", "Rule", "RULES", "MODES", "DRAFT_INITS", "MAX_IMAGES", "TREE_MODES", "check",
           "check_settings", "check_generate", "check_tree", "row_seeds", "check_prompt", "check_prompt_ids",
           "check_device", "check_backend"]

MODES = ("ar", "jd", "sjd", "gsd", "csd")
DRAFT_INITS = ("uniform", "above")
MAX_IMAGES = 1024  # images the command line generates in one generate() call (--num, --batch-size)
MAX_SEED = (1 << 63) - 1  # seeds are int64 on the device (verify takes [0, 2^64); generate adds the row index)


class _Text(str):
    """A description shown as is in an error (not quoted like a string value)."""

    __repr__ = str.__str__


class ArgumentError(ValueError):
    """A bad argument: ``name`` (the keyword), the ``value`` given and what was ``expected``."""

    def __init__(self, name: str, value, expected: str):
        self.name, self.value, self.expected = name, value, expected
        super().__init__(f"{name}={value!r}: expected {expected}")


@dataclass(frozen=True)
class Rule:
    """An int, a finite number, a bool or one of ``choices``; bounds inclusive unless ``open_low``/``open_high``."""

    kind: str  # "int", "real", "bool" or "choice"
    low: float = -math.inf
    high: float = math.inf
    open_low: bool = False
    open_high: bool = False
    choices: tuple = ()
    optional: bool = False  # None allowed (the default applies)

    @property
    def expected(self) -> str:
        if self.kind == "choice":
            text = f"one of {', '.join(map(str, self.choices))}"
        elif self.kind == "bool":
            text = "True or False"
        else:
            text = "an int" if self.kind == "int" else "a finite number"
            low, high = (f"{b:g}" if isinstance(b, float) else str(b) for b in (self.low, self.high))
            if self.low > -math.inf and self.high < math.inf:
                text += f" in {'(' if self.open_low else '['}{low}, {high}{')' if self.open_high else ']'}"
            elif self.low > -math.inf:
                text += f" {'>' if self.open_low else '>='} {low}"
            elif self.high < math.inf:
                text += f" {'<' if self.open_high else '<='} {high}"
        return f"None or {text}" if self.optional else text

    def check(self, name: str, value):
        """``value`` as the rule's type (int / float / as given); ArgumentError naming ``name`` when it breaks it."""
        if value is None and self.optional:
            return None
        if self.kind == "choice":
            if isinstance(value, str) and value in self.choices:
                return value
            raise ArgumentError(name, value, self.expected)
        if self.kind == "bool":
            if isinstance(value, bool):
                return value
            raise ArgumentError(name, value, self.expected)
        integral = isinstance(value, numbers.Integral) and not isinstance(value, bool)
        real = isinstance(value, numbers.Real) and not isinstance(value, bool)
        if not (integral if self.kind == "int" else real) or not math.isfinite(value) or not self._inside(value):
            raise ArgumentError(name, value, self.expected)
        return int(value) if self.kind == "int" else float(value)

    def _inside(self, value) -> bool:
        above = value > self.low if self.open_low else value >= self.low
        below = value < self.high if self.open_high else value <= self.high
        return above and below


def _int(low=-math.inf, high=math.inf, optional=False) -> Rule:
    return Rule("int", low, high, optional=optional)


def _real(low=-math.inf, high=math.inf, open_low=False, open_high=False, optional=False) -> Rule:
    return Rule("real", low, high, open_low, open_high, optional=optional)


def _bool(optional=False) -> Rule:
    return Rule("bool", optional=optional)


def _choice(choices, optional=False) -> Rule:
    return Rule("choice", choices=tuple(choices), optional=optional)


# Every checked setting, by keyword (the command line's flag is the keyword with dashes: cfg_scale -> --cfg-scale).
RULES: dict[str, Rule] = {
    # generate()
    "mode": _choice(MODES),
    "window": _int(1),
    "cfg_scale": _real(),
    "temperature": _real(0),
    "top_k": _int(1, optional=True),
    "top_p": _real(0, 1, open_low=True, optional=True),
    "min_p": _real(0, 1, optional=True),
    "entropy_coef": _real(0),
    "tvd_threshold": _real(0, 1),
    "draft_init": _choice(DRAFT_INITS),
    "coupling": _choice(ref.COUPLINGS, optional=True),
    "backend": _choice(BACKENDS, optional=True),
    "group_rank": _int(1),
    "group_delta": _real(0),
    "max_lead": _int(0, optional=True),
    "seed": _int(0, MAX_SEED),
    # the command line
    "num": _int(1, MAX_IMAGES),
    "batch_size": _int(1, MAX_IMAGES),
    "seeds": _int(1, 1000),
    "per_class": _int(1, 1000),
    "images": _int(2, 100_000),  # sweep prompts of a model without classes (a Fréchet distance needs two)
    "workers": _int(1, 256),
    "num_threads": _int(1, 4096, optional=True),
    "image_size": _int(1, 65536, optional=True),
}


def check(name: str, value):
    """``value`` checked by ``RULES[name]`` (and converted to its type)."""
    return RULES[name].check(name, value)


def check_settings(**values) -> dict:
    """Every keyword checked by its rule; the checked values."""
    return {name: check(name, value) for name, value in values.items()}


def check_generate(mode: str, coupling: Optional[str] = None, **settings) -> str:
    """generate()'s settings (any of RULES' generate() keywords), checked together; returns the coupling the
    verification uses (``None``: sjd and csd take ``default``, the other modes draw next drafts independently)."""
    check("mode", mode)
    check_settings(**settings)
    if coupling == "none":
        warnings.warn('coupling="none" is deprecated; use "independent"', DeprecationWarning, stacklevel=3)
        coupling = "independent"
    check("coupling", coupling)
    if mode in ("sjd", "csd"):
        return coupling
    if coupling not in (None, "independent"):
        raise ArgumentError("coupling", coupling, f"None or independent with mode {mode} (only sjd and csd couple "
                                                  "their next drafts)")
    return "independent"

TREE_MODES = ("sjd", "csd")  # the modes that take tree=(K, D)


def check_tree(tree, mode: str, window: int, coupling: Optional[str], static: Optional[bool]) -> Optional[tuple]:
    """tree=(K, D) for generate(): None, or K >= 1 and D >= 1 ints whose (K^D − 1)/(K − 1) draft nodes fit in the
    W − 1 draft slots of the window, with mode sjd or csd (csd relaxes the main draft's test only; docs/trees.md),
    the maximal coupling and the static loop (static None or True). Returns (K, D) or None."""
    if tree is None:
        return None
    try:
        branching, depth = tree
    except (TypeError, ValueError):
        raise ArgumentError("tree", tree, "None or a pair (K, D) of ints >= 1") from None
    where = f"K={branching!r}, D={depth!r}, W={window!r}"
    if not all(isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in (branching, depth)):
        raise ArgumentError("tree", tree, f"a pair (K, D) of ints >= 1 ({where})")
    if branching < 1 or depth < 1:
        raise ArgumentError("tree", tree, f"K >= 1 and D >= 1 ({where})")
    nodes = ref.tree_nodes(int(branching), int(depth))
    if nodes > window - 1:
        raise ArgumentError("tree", tree, f"a tree whose (K^D - 1)/(K - 1) = {nodes} draft nodes fit in the W - 1 = "
                                          f"{window - 1} draft slots of the window ({where})")
    if mode not in TREE_MODES:
        raise ArgumentError("tree", tree, f"None with mode {mode!r}: draft trees run with mode 'sjd' or 'csd' only "
                                          f"({where})")
    if coupling not in (None, "maximal"):
        raise ArgumentError("tree", tree, f"None with coupling {coupling!r}: trees draw the next drafts by the "
                                          f"maximal coupling ({where})")
    if static is not None and not static:
        raise ArgumentError("tree", tree, f"None with static={static!r}: draft trees run in the static loop only "
                                          f"({where}; leave static at None)")
    return int(branching), int(depth)


def row_seeds(seed, batch: int) -> torch.Tensor:
    """int s -> [s, s+1, ..., s+B-1]; B ints (a sequence or an integer tensor) -> as given. Returns [B] int64 (CPU).

    Every seed must lie in [0, 2^63): the row seeds are int64 tensors."""
    expected = f"an int in [0, {MAX_SEED - batch + 1}] or {batch} per-row ints in [0, {MAX_SEED}]"
    if isinstance(seed, torch.Tensor):
        if seed.dtype.is_floating_point or seed.dtype.is_complex or seed.dtype == torch.bool:
            raise ArgumentError("seed", seed, expected)
        seed = seed.item() if seed.ndim == 0 else seed.reshape(-1).tolist()
    if isinstance(seed, numbers.Integral) and not isinstance(seed, bool):
        if not 0 <= seed <= MAX_SEED - batch + 1:
            raise ArgumentError("seed", seed, expected)
        return torch.arange(batch, dtype=torch.int64) + int(seed)
    try:
        seeds = list(seed)
    except TypeError:
        raise ArgumentError("seed", seed, expected) from None
    if len(seeds) != batch or not all(isinstance(s, numbers.Integral) and not isinstance(s, bool)
                                      and 0 <= s <= MAX_SEED for s in seeds):
        raise ArgumentError("seed", seed, expected)
    return torch.tensor([int(s) for s in seeds], dtype=torch.int64)


def check_prompt(input_ids, prompt_embeds, attention_mask) -> int:
    """Exactly one of input_ids [B, S] (integer) / prompt_embeds [B, S, C] (floating), and attention_mask None or
    [B, S] of 0/1; with input_ids the prompts are left-padded (the last column is 1). Returns B."""
    if (input_ids is None) == (prompt_embeds is None):
        raise ValueError("pass exactly one of input_ids and prompt_embeds")
    if prompt_embeds is not None:
        name, prompt = "prompt_embeds", prompt_embeds
        if not isinstance(prompt, torch.Tensor) or prompt.ndim != 3 or not prompt.is_floating_point():
            raise ArgumentError(name, _shape(prompt), "a [B, S, C] floating-point tensor")
    else:
        name, prompt = "input_ids", input_ids
        if not isinstance(prompt, torch.Tensor) or prompt.ndim != 2 or not _integer(prompt):
            raise ArgumentError(name, _shape(prompt), "a [B, S] integer tensor of token ids")
    if prompt.shape[0] < 1 or prompt.shape[1] < 1:
        raise ArgumentError(name, _shape(prompt), "a non-empty prompt [B >= 1, S >= 1, ...]")
    if attention_mask is not None:
        _check_mask(attention_mask, tuple(prompt.shape[:2]), left_padded=input_ids is not None)
    return int(prompt.shape[0])


def _check_mask(mask, shape: tuple, left_padded: bool) -> None:
    expected = f"None or a {list(shape)} tensor of 0/1 (1 = a prompt token)"
    if not isinstance(mask, torch.Tensor) or tuple(mask.shape) != shape or mask.is_complex():
        raise ArgumentError("attention_mask", _shape(mask), expected)
    if mask.device.type == "meta":  # no values to check
        return
    binary, last_ones, rows_ones = torch.stack([((mask == 0) | (mask == 1)).all(), (mask[:, -1] == 1).all(),
                                                (mask != 0).any(1).all()]).tolist()
    if not binary or not rows_ones:
        raise ArgumentError("attention_mask", _Text("values"), expected + ", at least one 1 per row")
    if left_padded and not last_ones:
        raise ArgumentError("attention_mask", _Text("right padding"), expected + ", left-padded: the last column all 1")


def check_prompt_ids(input_ids: Optional[torch.Tensor], vocab: Optional[int]) -> None:
    """input_ids within the model's vocabulary [0, vocab) (skipped when either is None, and on the meta device,
    whose tensors hold no values)."""
    if input_ids is None or vocab is None or input_ids.device.type == "meta":
        return
    low, high = torch.stack([input_ids.min(), input_ids.max()]).tolist()
    if low < 0 or high >= vocab:
        raise ArgumentError("input_ids", _Text(f"ids in [{low}, {high}]"),
                            f"token ids of the model's vocabulary [0, {vocab})")


def check_device(device) -> torch.device:
    """A device torch can use here (cuda only with a visible GPU of that index)."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ArgumentError("device", device, "cpu, cuda or cuda:N") from None
    if dev.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ArgumentError("device", device, "cpu: torch sees no GPU here")
        if dev.index is not None and dev.index >= count:
            raise ArgumentError("device", device, f"cuda:0 .. cuda:{count - 1} (torch sees {count} GPUs)")
    elif dev.type not in ("cpu", "meta"):
        raise ArgumentError("device", device, "cpu, cuda or cuda:N")
    return dev


def check_backend(backend: Optional[str], device, name: str = "backend") -> Optional[str]:
    """None or a verify backend that can run on ``device`` (see csd_kernels.ops.registry)."""
    RULES["backend"].check(name, backend)
    if backend is None:
        return None
    ok, reason = backend_status(backend, torch.device(device))
    if not ok:
        raise ArgumentError(name, backend, f"a backend that runs on {torch.device(device)}; this one cannot: {reason}")
    return backend


def _integer(tensor: torch.Tensor) -> bool:
    return not (tensor.is_floating_point() or tensor.is_complex() or tensor.dtype == torch.bool)


def _shape(value) -> str:
    if isinstance(value, torch.Tensor):
        return _Text(f"{value.dtype} tensor of shape {list(value.shape)}")
    return _Text(f"a {type(value).__name__}")
