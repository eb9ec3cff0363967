"""The op's arguments, declared once: the tensors of verify and verify_tree, and the record of per-call settings.

Every backend function takes one :data:`VerifyArgs` (or :data:`TreeArgs`) tuple, whose fields are these, in this
order; ops/ builds the ``torch.library`` schema of its custom ops from them, and tests/test_rules.py holds the compiled
extension's schemas (python/bindings.cpp) and its index of the record (csrc/settings.h) to them. Types are
``torch.library`` schema types.

The scalars travel as one :class:`OpSettings` record, built once in ops/ (ops/checks.py's ``check_options``) and handed
to the op as two lists: ``settings`` (the floats, then the rule's parameters in config/acceptance.py's order, as many
as the rule declares) and ``choices`` (the integers and flags). A new per-call option is a field here, its check in
ops/checks.py, its index in csrc/settings.h and the code that reads it.
"""

from __future__ import annotations

import functools
import math
from collections import namedtuple
from typing import NamedTuple

__all__ = ["Arg", "OpSettings", "SETTINGS", "CHOICES", "VERIFY_ARGS", "TREE_ARGS", "VerifyArgs", "TreeArgs", "schema",
           "settings_of", "VERIFY_RETURNS", "TREE_RETURNS"]


class Arg(NamedTuple):
    name: str
    type: str  # the torch.library schema type


class OpSettings(NamedTuple):
    """The per-call scalars of verify / verify_tree, from the caller to every kernel. The float fields travel in
    ``settings`` (then ``rule_params``), the int and bool fields in ``choices``, both in this order."""

    cfg_scale: float = 1.0
    temperature: float = 1.0  # 0: greedy
    top_p: float = 1.0  # 1: no restriction
    min_p: float = 0.0  # 0: no restriction
    max_distortion: float = math.inf  # a relaxed rule's cap per position (inf: none; reference.verify)
    top_k: int = 0  # 0: no restriction
    rule: int = 0  # config/acceptance.py's code
    coupling: int = 0  # reference.COUPLINGS' index (verify; verify_tree: 0)
    target_is_probs: bool = False
    gather_distortion: bool = False
    return_probs: bool = True  # (verify)
    branching: int = 1  # the tree's K (verify_tree)
    depth_limit: int = 1  # the tree's D (verify_tree)
    rule_params: tuple = ()  # the rule's parameters as floats, in its table order

    def floats(self) -> tuple:
        return (*self[:_N_FLOATS], *self.rule_params)  # (the fields are declared in the record's order)

    def ints(self) -> tuple:
        return self[_N_FLOATS:-1]  # (bools are ints to the schema's int[])

    @classmethod
    def unpack(cls, settings, choices) -> "OpSettings":
        return cls(*settings[:_N_FLOATS], *(kind(v) for kind, v in zip(_CHOICE_TYPES, choices)),
                   tuple(settings[_N_FLOATS:]))


_TYPES = {name: type(default) for name, default in OpSettings._field_defaults.items()}  # every field has a default
SETTINGS = tuple(name for name, kind in _TYPES.items() if kind is float)  # the floats before the rule's parameters
CHOICES = tuple(name for name, kind in _TYPES.items() if kind in (int, bool))
_N_FLOATS, _CHOICE_TYPES = len(SETTINGS), tuple(_TYPES[name] for name in CHOICES)
assert OpSettings._fields == (*SETTINGS, *CHOICES, "rule_params")  # floats, then ints, then the rule's parameters
_RECORD = (Arg("settings", "float[]"), Arg("choices", "int[]"))

VERIFY_ARGS = (
    Arg("target_logits", "Tensor"), Arg("draft_tokens", "Tensor"), Arg("draft_probs", "Tensor?"),
    Arg("uncond_logits", "Tensor?"), Arg("neighbours", "Tensor?"), Arg("informed", "Tensor?"), Arg("start", "Tensor"),
    Arg("positions", "Tensor"), Arg("seed", "Tensor"), Arg("offset", "Tensor"), *_RECORD,
)
TREE_ARGS = (
    Arg("target_logits", "Tensor"), Arg("uncond_logits", "Tensor?"), Arg("node_tokens", "Tensor"),
    Arg("draft_probs", "Tensor"), Arg("sibling_probs", "Tensor?"), Arg("neighbours", "Tensor?"),
    Arg("children", "Tensor"), Arg("informed", "Tensor?"), Arg("seed", "Tensor"), Arg("offset", "Tensor"), *_RECORD,
)
VERIFY_RETURNS = 8  # the fields of reference.VerifyResult, in order
TREE_RETURNS = 8  # the fields of reference.TreeResult, in order

VerifyArgs = namedtuple("VerifyArgs", [a.name for a in VERIFY_ARGS])
TreeArgs = namedtuple("TreeArgs", [a.name for a in TREE_ARGS])


def settings_of(a) -> OpSettings:
    """The record of a VerifyArgs / TreeArgs (ops/ hands tuples: one unpacking per distinct record)."""
    if isinstance(a.settings, tuple) and isinstance(a.choices, tuple):
        return _unpacked(a.settings, a.choices)
    return OpSettings.unpack(a.settings, a.choices)


@functools.lru_cache(maxsize=256)
def _unpacked(settings: tuple, choices: tuple) -> OpSettings:
    return OpSettings.unpack(settings, choices)


def schema(spec: tuple, returns: int, extra: tuple = ()) -> str:
    """The torch.library schema of an op over ``spec`` (+ ``extra`` arguments), e.g.
    ``(Tensor target_logits, ...) -> (Tensor, ...)``."""
    return f"({', '.join(f'{a.type} {a.name}' for a in (*spec, *extra))}) -> ({', '.join(['Tensor'] * returns)})"
