"""The positional arguments of the verify and verify_tree backends, once.

Every backend function takes one :data:`VerifyArgs` (or :data:`TreeArgs`) tuple, whose fields are these, in this
order; ops/ builds the ``torch.library`` schema of its custom ops from them, and tests/test_rules.py holds the compiled
extension's schemas (python/bindings.cpp) and the Triton launchers to them. Types are ``torch.library`` schema types.
A rule's parameters travel as ``rule_params``: their values in config/acceptance.py's order, as floats.
"""

from __future__ import annotations

from collections import namedtuple
from typing import NamedTuple

__all__ = ["Arg", "VERIFY_ARGS", "TREE_ARGS", "VerifyArgs", "TreeArgs", "schema", "compiled_names",
           "VERIFY_RETURNS", "TREE_RETURNS"]


class Arg(NamedTuple):
    name: str
    type: str  # the torch.library schema type
    compiled: bool = True  # an argument of the compiled extension's op too (python/bindings.cpp)


_TARGET = (Arg("cfg_scale", "float"), Arg("temperature", "float"), Arg("top_k", "int"), Arg("top_p", "float"),
           Arg("min_p", "float"))
_RULE = (Arg("rule", "int"), Arg("rule_params", "float[]"), Arg("gather_distortion", "bool"))

VERIFY_ARGS = (
    Arg("target_logits", "Tensor"), Arg("draft_tokens", "Tensor"), Arg("draft_probs", "Tensor?"),
    Arg("uncond_logits", "Tensor?"), Arg("neighbours", "Tensor?"), *_TARGET, Arg("target_is_probs", "bool"), *_RULE,
    Arg("start", "Tensor"), Arg("coupling", "int"), Arg("positions", "Tensor"), Arg("seed", "Tensor"),
    Arg("offset", "Tensor"), Arg("return_probs", "bool"), Arg("informed", "Tensor?"),
)
TREE_ARGS = (
    Arg("target_logits", "Tensor"), Arg("uncond_logits", "Tensor?"), Arg("node_tokens", "Tensor"),
    Arg("draft_probs", "Tensor"), Arg("sibling_probs", "Tensor?"), Arg("neighbours", "Tensor?"),
    Arg("children", "Tensor"), Arg("depth", "Tensor", compiled=False), Arg("branching", "int", compiled=False),
    Arg("depth_limit", "int", compiled=False), *_TARGET, *_RULE, Arg("seed", "Tensor"), Arg("offset", "Tensor"),
    Arg("informed", "Tensor?"),
)
VERIFY_RETURNS = 8  # the fields of reference.VerifyResult, in order
TREE_RETURNS = 8  # the fields of reference.TreeResult, in order

VerifyArgs = namedtuple("VerifyArgs", [a.name for a in VERIFY_ARGS])
TreeArgs = namedtuple("TreeArgs", [a.name for a in TREE_ARGS])


def schema(spec: tuple, returns: int, extra: tuple = (), compiled: bool = False) -> str:
    """The torch.library schema of an op over ``spec`` (+ ``extra`` arguments; ``compiled``: only the compiled
    extension's), e.g. ``(Tensor target_logits, ...) -> (Tensor, ...)``."""
    args = [a for a in (*spec, *extra) if a.compiled or not compiled]
    return f"({', '.join(f'{a.type} {a.name}' for a in args)}) -> ({', '.join(['Tensor'] * returns)})"


def compiled_names(spec: tuple) -> tuple:
    """The names of the compiled extension's arguments, in order."""
    return tuple(a.name for a in spec if a.compiled)
