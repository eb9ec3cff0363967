"""The acceptance rules of ``verify``, once: :data:`RULES`, a table of :class:`AcceptanceRule` (name, integer code,
parameters with their defaults and checks, lossless or not, what the decision reads). Everything else that names a
rule derives from it: the op's checks and error texts (ops/checks.py), the report labels, the Triton constexpr
``RULE`` (backends/triton/kernels/common.py), the C++ enum ``csd::Rule`` (csrc/include/rules.h; tests/test_rules.py
holds its order to this table), GenerationConfig's parameter fields and the modes that use a rule (modes.py).

The maths of each rule is :mod:`csd_kernels.reference.rules` (the definition); every backend has one acceptance
function and one residual function that switch on the code. Torch-free.

A rule's parameters reach the kernels as ``OpSettings.rule_params`` (backends/spec.py): their values in the table's
order, as floats (integers are exact), as many as the rule declares.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from ..constants import (
    DEFAULT_ENTROPY_COEF,
    DEFAULT_GROUP_DELTA,
    DEFAULT_GROUP_RANK,
    DEFAULT_TVD_THRESHOLD,
)
from .rules import ArgumentError, Rule, int_rule, real_rule

__all__ = ["Param", "AcceptanceRule", "RULES", "RULE_NAMES", "GRID_RULES", "RULE_CODES", "MAX_PARAMS", "PARAMS",
           "rule_named", "param_values", "params_by_name", "LANTERN_CODEBOOK", "default_lantern_k"]

MAX_PARAMS = 4  # the rule parameters the compiled kernels' VerifyParams holds (csrc/include/rules.h, kMaxRuleParams)
# LANTERN published its k for LlamaGen's VQ codebook of 16384 codes; a default k keeps that share of a model's codebook
LANTERN_CODEBOOK = 16384


@dataclass(frozen=True)
class Param:
    """One parameter of a rule: its keyword (verify's, GenerationConfig's, the --flag), default, check and meaning."""

    name: str
    default: float
    check: Rule
    help: str
    source: str = ""


@dataclass(frozen=True)
class AcceptanceRule:
    """One acceptance rule.

    name: the value of ``rule=``; code: its integer in the kernels (its index in RULES); params: what it takes;
    lossless: its output law is p exactly; needs_q: its decision reads the drafts' whole q row (csd: TVD(p, q); gsd:
    the group's q mass), not only q(x); needs_neighbours: it takes the codebook's neighbour table (``neighbours=``);
    residual_qa: the resampling law is max(p − q·a, 0) over the rule's a(y) for every y (gsd) rather than
    max(p − q, 0) (the two are equal when a(y) >= min(1, p/q), as for every other rule); distortion_gathers: the exact
    distortion needs a(y) for every token at a cost beyond a pass over the row (lantern: a gather per token and
    neighbour, V·k per position; gsd: the whole row sorted, where the decision needs only the draft's group), so it is
    computed only on request (``gather_distortion=True``; NaN otherwise); sorts_row: its decision reads the draft's
    group in the row sorted by p (one program holds the whole row: the Triton backend's per-position paths, and no
    Triton tree); sweep_flags: the ``csd sweep`` flags of its own that sweep its parameters (a relaxed rule without
    them is swept by ``--grid PARAM=...``); label: how reports name it; source: where the rule comes from."""

    name: str
    params: tuple
    lossless: bool
    needs_q: bool
    needs_neighbours: bool
    label: str
    source: str
    residual_qa: bool = False
    distortion_gathers: bool = False
    sorts_row: bool = False
    sweep_flags: tuple = ()

    @property
    def code(self) -> int:
        return RULE_NAMES.index(self.name)

    def param(self, name: str) -> Param:
        return next(p for p in self.params if p.name == name)

    def param_names(self) -> tuple:
        return tuple(p.name for p in self.params)


_LAMBDA = Param("entropy_coef", DEFAULT_ENTROPY_COEF, real_rule(0), "CSD λ: acceptance bonus per nat of entropy",
                "the CSD reference code (constants.DEFAULT_ENTROPY_COEF)")
_TAU = Param("tvd_threshold", DEFAULT_TVD_THRESHOLD, real_rule(0, 1), "CSD τ: the bonus applies where TVD(p, q) < τ",
             "the CSD reference code (constants.DEFAULT_TVD_THRESHOLD)")
_GROUP_RANK = Param("group_rank", DEFAULT_GROUP_RANK, int_rule(1, 1 << 24),
                    "GSD k: the draft's group is the tokens within ±k ranks of it in p",
                    "the CSD repository's GSD (constants.DEFAULT_GROUP_RANK)")
_GROUP_DELTA = Param("group_delta", DEFAULT_GROUP_DELTA, real_rule(0), "GSD δ: ... whose probability is within δ of "
                     "the draft's", "the CSD repository's GSD (constants.DEFAULT_GROUP_DELTA)")
_AR_SCALE = Param("arsample_scale", 9.0, real_rule(0, open_low=True),
                  "ARsample: s = clamp(H / scale + offset, 0, 1); accept iff u·s < min(1, p/q)",
                  "krennic999/ARsample, Lumina-mGPT path (if_entropy_acc)")
_AR_OFFSET = Param("arsample_offset", 0.05, real_rule(0, 1), "ARsample: the offset of s",
                   "krennic999/ARsample, Lumina-mGPT path (if_entropy_acc)")
_LANTERN_DELTA = Param("lantern_delta", 0.1, real_rule(0, 1),
                       "LANTERN δ: the draft's latent neighbours lend it their mass up to δ",
                       "jadohu/LANTERN run.sh")
_LANTERN_LAMBDA = Param("lantern_lambda", 5.0, real_rule(1),
                        "LANTERN++ λ: the neighbours lend the draft up to (λ − 1)·p(x)", "jadohu/LANTERN run.sh")


def _lantern_k(default: int) -> Param:
    return Param("lantern_k", default, int_rule(1, 1 << 24), "LANTERN k: the draft's nearest codes in the codebook "
                 f"(default: the published k at {LANTERN_CODEBOOK} codes, scaled to the codebook; at most the "
                 "neighbour table's width)", "jadohu/LANTERN run.sh")


RULES: tuple = (
    AcceptanceRule("strict", (), lossless=True, needs_q=False, needs_neighbours=False, label="strict",
                   source="speculative sampling (Leviathan et al., 2023; Chen et al., 2023)"),
    AcceptanceRule("csd", (_LAMBDA, _TAU), lossless=False, needs_q=True, needs_neighbours=False,
                   label="csd λ={entropy_coef:g} τ={tvd_threshold:g}", source="aderfebr/CSD",
                   sweep_flags=("--lambdas", "--taus")),
    AcceptanceRule("gsd", (_GROUP_RANK, _GROUP_DELTA), lossless=False, needs_q=True, needs_neighbours=False,
                   label="gsd k={group_rank} δ={group_delta:g}", source="So et al. 2025; the CSD repository's GSD",
                   residual_qa=True, distortion_gathers=True, sorts_row=True,
                   sweep_flags=("--gsd-ranks", "--gsd-deltas")),
    AcceptanceRule("arsample", (_AR_SCALE, _AR_OFFSET), lossless=False, needs_q=False, needs_neighbours=False,
                   label="arsample c={arsample_scale:g} s0={arsample_offset:g}", source="krennic999/ARsample"),
    AcceptanceRule("lantern", (_LANTERN_DELTA, _lantern_k(1000)), lossless=False, needs_q=False,
                   needs_neighbours=True, label="lantern δ={lantern_delta:g} k={lantern_k}",
                   source="jadohu/LANTERN (evaluate_posterior)", distortion_gathers=True),
    AcceptanceRule("lantern++", (_LANTERN_LAMBDA, _lantern_k(10)), lossless=False, needs_q=False,
                   needs_neighbours=True, label="lantern++ λ={lantern_lambda:g} k={lantern_k}",
                   source="jadohu/LANTERN (evaluate_posterior)", distortion_gathers=True),
)
RULE_NAMES = tuple(r.name for r in RULES)
# the relaxed rules that `csd sweep --grid PARAM=...` sweeps and `csd compare` adds a row for (the others have sweep
# flags and rows of their own)
GRID_RULES = tuple(r.name for r in RULES if not r.lossless and not r.sweep_flags)
RULE_CODES = {r.name: code for code, r in enumerate(RULES)}
# every parameter name, once (a name several rules share, lantern_k, has one check; its default is the rule's)
PARAMS = {p.name: p for r in RULES for p in r.params}
assert all(len(r.params) <= MAX_PARAMS for r in RULES)


def rule_named(name: str) -> AcceptanceRule:
    """The rule called ``name``; ArgumentError (a ValueError naming ``rule``) listing the rules otherwise."""
    if name not in RULE_CODES:
        raise ArgumentError("rule", name, f"one of {', '.join(RULE_NAMES)}")
    return RULES[RULE_CODES[name]]


def param_values(rule: AcceptanceRule, given: dict, defaults: Optional[dict] = None) -> tuple:
    """The rule's parameter values in table order, each checked: ``given[name]`` when it is there and not None, else
    ``defaults[name]``, else the table's default. Parameters of other rules in ``given`` are ignored."""
    defaults = defaults or {}
    values = []
    for p in rule.params:
        value = given.get(p.name)
        value = defaults.get(p.name, p.default) if value is None else value
        values.append(p.check.check(p.name, value))
    return tuple(values)


def params_by_name(code: int, values) -> dict:
    """{name: value} of rule ``code``'s parameters from the kernels' ``rule_params`` (ints as ints)."""
    rule = RULES[code]
    return {p.name: int(v) if p.check.kind == "int" else float(v) for p, v in zip(rule.params, values)}


def default_lantern_k(rule: str, vocab: int) -> int:
    """A lantern rule's k when none is given, for a codebook of ``vocab`` codes: the published k times
    V / LANTERN_CODEBOOK, rounded up, within [1, V − 1] (16384 codes: 1000 and 10; digits' 512: 32 and 1). A k near V
    makes nearly every code a neighbour, so lantern's δ lends almost any draft the mass it lacks (issue 45)."""
    k = rule_named(rule).param("lantern_k").default
    return max(1, min(vocab - 1, math.ceil(k * vocab / LANTERN_CODEBOOK)))
