"""What the engines' plugin entry points share: the switch (an environment variable that names the rule) and the
rebinding of an engine's module-level function (idempotent: engines load their plugins once per process, but a
process may import them again)."""

from __future__ import annotations

import os
from typing import Callable, Optional

__all__ = ["OFF", "rule_from_env", "rebind"]

OFF = ("", "0", "off", "false", "no")


def rule_from_env(variable: str) -> Optional[str]:
    """The rule the plugin runs, from ``variable``: None (off) when unset or one of OFF; "1" / "on" / "true" / "yes"
    mean "strict" (the engine's own law); any other value is the rule's name, passed to ``csd_kernels.verify`` as
    is (which raises naming the rules it knows)."""
    value = os.environ.get(variable, "").strip()
    if value.lower() in OFF:
        return None
    return "strict" if value.lower() in ("1", "on", "true", "yes") else value


def rebind(module, name: str, replacement: Callable) -> bool:
    """Sets ``module.name`` to ``replacement`` unless it already is a csd_kernels replacement; whether it did."""
    current = getattr(module, name, None)
    if current is None:
        raise AttributeError(f"{module.__name__} has no {name}: this engine version is not the one the plugin knows")
    if getattr(current, "csd_kernels_original", None) is not None:
        return False
    replacement.csd_kernels_original = current
    setattr(module, name, replacement)
    return True
