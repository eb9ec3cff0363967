"""What a setting accepts (:class:`Rule`: an int, a finite number, a bool or one of some choices, within bounds) and
the error a bad value raises (:class:`ArgumentError`, a ValueError naming the keyword). Torch-free: the command line
checks its flags with these before it imports torch."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

__all__ = ["ArgumentError", "Rule", "Text", "int_rule", "real_rule", "bool_rule", "choice_rule"]


class Text(str):
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


def int_rule(low=-math.inf, high=math.inf, optional=False) -> Rule:
    return Rule("int", low, high, optional=optional)


def real_rule(low=-math.inf, high=math.inf, open_low=False, open_high=False, optional=False) -> Rule:
    return Rule("real", low, high, open_low, open_high, optional=optional)


def bool_rule(optional=False) -> Rule:
    return Rule("bool", optional=optional)


def choice_rule(choices, optional=False) -> Rule:
    return Rule("choice", choices=tuple(choices), optional=optional)
