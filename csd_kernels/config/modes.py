"""The decoding modes of ``generate``, once: :data:`MODE_TABLE`, a table of :class:`Mode` (the acceptance rule it
verifies with, whether it drafts a window, takes a coupling, carries the drafts' q, takes a draft tree). The loop
(decoding/), the checks (config/generation.py, decoding/validation.py), the command line and ``csd run`` read it.
A speculative mode per acceptance rule (config/acceptance.py): sjd is the strict rule, every other one is named by
its rule. Torch-free."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from .acceptance import RULES, rule_named

__all__ = ["Mode", "MODE_TABLE", "MODES", "TREE_MODES", "COUPLED_MODES", "exact_distortion"]


@dataclass(frozen=True)
class Mode:
    """One decoding mode. rule: the acceptance rule of its verification (None: jd's exact match); window: it drafts
    a window (ar verifies one sampled token per pass); coupling: it takes a coupling for its next drafts (the others
    draw them independently); needs_q: its drafts carry their q (with temperature > 0); tree: it takes tree=(K, D)."""

    name: str
    rule: Optional[str]
    window: bool = True
    coupling: bool = True
    needs_q: bool = True
    tree: bool = True
    help: str = ""


def _speculative(rule, **facts) -> Mode:
    return Mode(rule.name, rule.name, help=f"speculative Jacobi decoding, {rule.label.split(' ')[0]}'s rule", **facts)


def _facts(rule) -> dict:
    """A rule whose resampling law is max(p − q·a, 0) (gsd), not the strict residual the maximal coupling redraws
    from, drafts independently, as its authors do, and draws no tree."""
    return dict(coupling=False, tree=False) if rule.residual_qa else {}


MODE_TABLE: dict = {m.name: m for m in (
    Mode("ar", "strict", window=False, coupling=False, needs_q=False, tree=False, help="autoregressive, one token a "
         "pass"),
    Mode("jd", None, coupling=False, needs_q=False, tree=False, help="Jacobi decoding: a draft is kept while it "
         "equals the fresh sample"),
    Mode("sjd", "strict", help="speculative Jacobi decoding, lossless"),
    *(_speculative(rule, **_facts(rule)) for rule in RULES if not rule.lossless),
)}
MODES = tuple(MODE_TABLE)
TREE_MODES = tuple(name for name, m in MODE_TABLE.items() if m.tree)
COUPLED_MODES = tuple(name for name, m in MODE_TABLE.items() if m.coupling)


def exact_distortion(mode: str) -> dict:
    """The keywords a run that reports ``mode``'s distortion passes: ``gather_distortion=True`` where the rule
    computes it only on request (gsd, lantern, lantern++: config/acceptance.py's distortion_gathers), else none."""
    rule = MODE_TABLE[mode].rule
    return {"gather_distortion": True} if rule is not None and rule_named(rule).distortion_gathers else {}
