"""What the engines' plugin entry points share: the switch (an environment variable that names the rule) and the
rebinding of an engine's module-level function (idempotent: engines load their plugins once per process, but a
process may import them again)."""

from __future__ import annotations

import inspect
import os
from typing import Callable, Optional

from ..config.acceptance import RULE_NAMES

__all__ = ["OFF", "rule_from_env", "rule_from_value", "same_signature", "rebind"]

OFF = ("", "0", "off", "false", "no")


def same_signature(engine: Callable, ours: Callable) -> bool:
    """Whether ``ours`` starts with ``engine``'s parameters (names, order, kinds, defaults), the rest keyword-only."""
    theirs = list(inspect.signature(engine).parameters.values())
    mine = list(inspect.signature(ours).parameters.values())
    key = [(p.name, p.kind, p.default) for p in theirs]
    return [(p.name, p.kind, p.default) for p in mine[:len(theirs)]] == key and all(
        p.kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.VAR_KEYWORD) for p in mine[len(theirs):])


def rule_from_env(variable: str) -> Optional[str]:
    """The rule the plugin runs, from ``variable``: None (off) when unset or one of OFF; "1" / "on" / "true" / "yes"
    mean "strict" (the engine's own law); any other value must name a rule ``csd_kernels.verify`` takes: ValueError
    in one line otherwise, when the plugin loads rather than at the engine's first call."""
    return rule_from_value(os.environ.get(variable, ""), variable)


def rule_from_value(value: str, variable: str = "rule") -> Optional[str]:
    """:func:`rule_from_env` on a value given directly (``variable`` names it in the error)."""
    value = str(value).strip()
    if value.lower() in OFF:
        return None
    rule = "strict" if value.lower() in ("1", "on", "true", "yes") else value
    if rule not in RULE_NAMES:
        raise ValueError(f"{variable}={value!r} names no csd_kernels rule: set it to 1 (strict), one of "
                         f"{', '.join(RULE_NAMES)}, or 0 to switch the plugin off")
    return rule


def rebind(module, name: str, replacement: Callable, ours: Optional[Callable] = None) -> bool:
    """Sets ``module.name`` to ``replacement`` unless it already is a csd_kernels replacement; whether it did. With
    ``ours``, the engine's function must have the signature ``ours`` starts with (names, order, kinds, defaults):
    RuntimeError in one line otherwise, rather than a wrong call at the engine's first step."""
    current = getattr(module, name, None)
    if current is None:
        raise AttributeError(f"{module.__name__} has no {name}: this engine version is not the one the plugin knows")
    if getattr(current, "csd_kernels_original", None) is not None:
        return False
    if ours is not None and not same_signature(current, ours):
        raise RuntimeError(f"{module.__name__}.{name}{inspect.signature(current)} is not the signature csd_kernels' "
                           f"adapter has: this engine version is not the one the plugin knows")
    replacement.csd_kernels_original = current
    setattr(module, name, replacement)
    return True
