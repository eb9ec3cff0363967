"""The checks of :func:`csd_kernels.generate`'s inputs that need torch, and re-exports of the torch-free ones.

A setting's rule is its :class:`~.config.GenerationConfig` field's (:data:`~.config.RULES`, checked when a config is
made); a bad value raises :class:`ArgumentError`, a ValueError naming the keyword (``window=0: expected an int >=
1``). The API calls these first thing; the command line checks its flags by the same rules before it imports torch,
and prints the error as one line naming the flag (``--window 0: expected an int >= 1``, exit status 2;
:mod:`csd_kernels.runner.usage`). Here: the prompts, the seeds per row, the draft tree, the device and whether a
backend runs on it.
"""

from __future__ import annotations

import numbers
from typing import Optional

import torch

from .. import reference as ref
from ..config.generation import DRAFT_INITS, MAX_IMAGES, MAX_SEED, MODES, RULES, check, check_generate, check_settings
from ..config.modes import TREE_MODES  # the modes that take tree=(K, D)
from ..config.rules import ArgumentError, Rule, Text
from ..ops.registry import backend_status

__all__ = ["ArgumentError", "Rule", "RULES", "MODES", "DRAFT_INITS", "MAX_IMAGES", "MAX_SEED", "TREE_MODES", "check",
           "check_settings", "check_generate", "check_tree", "row_seeds", "check_prompt", "check_prompt_ids",
           "check_device", "check_backend"]



_SAID_NODES = 10**6  # a tree's node count above this is not printed (--tree 100,100 has a 199-digit one)


def check_tree(tree, mode: str, window: int, coupling: Optional[str], static: Optional[bool]) -> Optional[tuple]:
    """tree=(K, D) for generate(): None, or K >= 1 and D >= 1 ints whose (K^D − 1)/(K − 1) draft nodes fit in the
    W − 1 draft slots of the window, with a mode of TREE_MODES (a relaxed rule relaxes the main draft's test only;
    docs/trees.md),
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
    # (a tree never fits with D > W - 1: its count, a number of any size, is computed only when it might fit, and
    # said only when it is short)
    nodes = ref.tree_nodes(int(branching), int(depth)) if depth <= window - 1 else None
    if nodes is None or nodes > window - 1:
        count = f" = {nodes}" if nodes is not None and nodes < _SAID_NODES else f" (over {_SAID_NODES:,})"
        raise ArgumentError("tree", tree, f"a tree whose (K^D - 1)/(K - 1){count} draft nodes fit in the W - 1 = "
                                          f"{window - 1} draft slots of the window ({where})")
    if mode not in TREE_MODES:
        raise ArgumentError("tree", tree, f"None with mode {mode!r}: draft trees run with mode "
                                          f"{', '.join(map(repr, TREE_MODES))} only ({where})")
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
        raise ArgumentError("attention_mask", Text("values"), expected + ", at least one 1 per row")
    if left_padded and not last_ones:
        raise ArgumentError("attention_mask", Text("right padding"), expected + ", left-padded: the last column all 1")


def check_prompt_ids(input_ids: Optional[torch.Tensor], vocab: Optional[int]) -> None:
    """input_ids within the model's vocabulary [0, vocab) (skipped when either is None, and on the meta device,
    whose tensors hold no values)."""
    if input_ids is None or vocab is None or input_ids.device.type == "meta":
        return
    low, high = torch.stack([input_ids.min(), input_ids.max()]).tolist()
    if low < 0 or high >= vocab:
        raise ArgumentError("input_ids", Text(f"ids in [{low}, {high}]"),
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
        return Text(f"{value.dtype} tensor of shape {list(value.shape)}")
    return Text(f"a {type(value).__name__}")
