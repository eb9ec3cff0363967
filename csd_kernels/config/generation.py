"""Every setting of :func:`csd_kernels.generate`, once: :class:`GenerationConfig`, a frozen dataclass whose fields
carry their default, the values they accept (a :class:`~.rules.Rule`), their help text and where the default comes
from. What else lists settings reads them from here: :data:`RULES` (the checks of validation.py), the command line's
flags and their help (cli/parser.py), the settings ``csd run`` records in run.json and ``csd generate`` in
stats.json. A family's sampling defaults (``model.defaults``) are a GenerationConfig too.

Torch-free (stdlib, constants.py and rules.py only): the command line builds its parser and refuses bad flags with
it before it imports torch.
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass, field
from typing import Optional, Sequence, Union

from ..constants import BACKENDS, COUPLINGS, SEED_LIMIT
from .acceptance import PARAMS
from .acceptance import RULES as ACCEPTANCE_RULES
from .modes import COUPLED_MODES, MODE_TABLE, MODES
from .rules import ArgumentError, Rule, bool_rule, choice_rule, int_rule, real_rule

__all__ = ["GenerationConfig", "RULES", "MODES", "DRAFT_INITS", "DEFAULT_COUPLING", "MAX_IMAGES", "MAX_SEED", "FLAGS",
           "check", "check_settings", "check_generate", "run_label"]

DRAFT_INITS = ("uniform", "above", "above-p")  # docs/decoding.md, "Fresh drafts"
DEFAULT_COUPLING = "maximal"  # lossless-tested like the others, and the fewest passes (docs/decoding.md)
MAX_IMAGES = 1024  # images the command line generates in one generate() call (--num, --batch-size)
MAX_SEED = SEED_LIMIT - 1  # a seed is an int in [0, 2^63) in verify, generate and the CLI (constants.SEED_LIMIT)
# csd sweep --per-class: the held-out digits of the rarest class (zoo.digits_heldout_per_class(); a test holds them
# equal)
DIGITS_HELDOUT_PER_CLASS = 43

# Where a field is a flag of the csd command: "every" sampling command (generate, compare, run) takes it as --name,
# its default the model's; "own": each command declares it itself (its default or meaning differs per command);
# None: the API only.
FLAGS = ("every", "own", None)


def _setting(default, rule: Optional[Rule], text: str, *, source: str = "", flag: Optional[str] = "every",
             recorded: bool = True, shown: Optional[str] = None):
    """A GenerationConfig field. rule: what it accepts (None: checked by generate() with the inputs, see
    validation.py); text: what it is (the flag's help); source: where the default comes from; flag: see FLAGS;
    recorded: csd generate's stats.json lists it under "parameters" (mode and seed have keys of their own there;
    progress and sync_timings change no token); shown: the default as help shows it (default: the value)."""
    assert flag in FLAGS, flag
    return field(default=default, metadata=dict(rule=rule, help=text, source=source, flag=flag, recorded=recorded,
                                                shown=shown))


def _rule_param(name: str):
    """A field for the acceptance rules' parameter ``name`` (config/acceptance.py): its check, help and source; its
    default the rule's (None where rules differ: each takes its own, e.g. lantern_k)."""
    param = PARAMS[name]
    defaults = {r.name: r.param(name).default for r in ACCEPTANCE_RULES if name in r.param_names()}
    if len(set(defaults.values())) == 1:
        return _setting(param.default, param.check, param.help, source=param.source)
    shown = ", ".join(f"{value} for {rule}" for rule, value in defaults.items())
    return _setting(None, dataclasses.replace(param.check, optional=True), param.help, source=param.source,
                    shown=shown)


def _with_rule_params(cls):
    """``cls`` with one field per parameter of config/acceptance.py's rules (PARAMS), after its own: a rule's new
    parameter is a setting of generate(), a --flag and a stats.json key without an edit here."""
    for name, param in PARAMS.items():
        kind, setting = ("int" if param.check.kind == "int" else "float"), _rule_param(name)
        cls.__annotations__[name] = f"Optional[{kind}]" if setting.default is None else kind
        setattr(cls, name, setting)
    return cls


@dataclass(frozen=True)
@_with_rule_params
class GenerationConfig:
    """The settings of :func:`csd_kernels.generate` (see its docstring and docs/decoding.md); every value is checked
    when the config is made (:class:`~.rules.ArgumentError` naming the field). ``config.replace(window=32)`` is a
    copy with other values; ``**config`` and ``dict(config)`` give the fields that differ from the defaults (so
    ``generate(model, ids, **model.defaults)`` works as ``generate(model, ids, config=model.defaults)``)."""

    mode: str = _setting("csd", choice_rule(MODES), "decoding mode", flag="own", recorded=False)
    window: int = _setting(16, int_rule(1), "Jacobi window: tokens drafted per pass",
                           source="the CSD reference code (Janus-Pro); docs/measurements.md")
    cfg_scale: float = _setting(5.0, real_rule(), "classifier-free guidance scale (1: no guidance)",
                                source="the CSD reference code (Janus-Pro)")
    temperature: float = _setting(1.0, real_rule(0), "sampling temperature (0: greedy)",
                                  source="the CSD reference code")
    top_k: Optional[int] = _setting(None, int_rule(1, optional=True), "sample from the k most likely tokens",
                                    source="the CSD reference code (no top-k)", shown="all")
    top_p: Optional[float] = _setting(None, real_rule(0, 1, open_low=True, optional=True),
                                      "nucleus sampling: the smallest set of most likely tokens holding this much "
                                      "probability", shown="off")
    min_p: Optional[float] = _setting(None, real_rule(0, 1, optional=True), "keep tokens with p >= min_p * max p",
                                      shown="off")
    draft_init: str = _setting("above", choice_rule(DRAFT_INITS), "fresh drafts: uniform, the token above "
                               "(q one-hot), or a draw from p above (q = that p)",
                               source="fewest passes per CPU second on scenes and digits, lossless and csd "
                                      "(docs/measurements.md#drafts-from-the-row-above-scenes-digits)")
    coupling: Optional[str] = _setting(None, choice_rule(COUPLINGS, optional=True),
                                       f"how {', '.join(COUPLED_MODES)} draw the next drafts (other modes: "
                                       "independent)", flag="own", shown=f"{DEFAULT_COUPLING} for those modes")
    seed: Union[int, Sequence[int]] = _setting(0, None, "seed of row 0 (row b: seed + b), or one per row (a sequence "
                                               "or an integer tensor)", flag="own", recorded=False)
    progress: bool = _setting(False, bool_rule(), "a progress bar", flag=None, recorded=False)
    backend: Optional[str] = _setting(None, choice_rule(BACKENDS, optional=True),
                                      "verify backend; it must run on the device", shown="the best available")
    sync_timings: bool = _setting(False, bool_rule(), "on CUDA, synchronise around the timed phases", flag=None,
                                  recorded=False)
    max_lead: Optional[int] = _setting(None, int_rule(0, optional=True), "rows more than this many committed tokens "
                                       "ahead of the slowest row pause (eager loop)", flag=None, shown="one window",
                                       source="docs/measurements.md")
    static: Optional[bool] = _setting(None, bool_rule(optional=True), "the fixed-shape iteration, no host sync "
                                      "inside (docs/fast-path.md)", flag=None, shown="with a tree only")
    cuda_graph: Optional[bool] = _setting(None, bool_rule(optional=True), "static only: replay one iteration as a "
                                          "CUDA graph", flag=None, shown="on for CUDA")
    compile: bool = _setting(False, bool_rule(), "static only: the iteration under torch.compile(fullgraph=True)",
                             flag=None)
    tree: Optional[tuple] = _setting(None, None, "a draft tree (K, D) in every window (docs/trees.md)", flag="own",
                                     shown="none, a chain")
    gather_distortion: bool = _setting(False, bool_rule(), "the distortion map of gsd, lantern and lantern++ too "
                                       "(every token's a(y): gsd sorts each row, lantern gathers k per token; NaN "
                                       "without)", flag=None)
    max_distortion: Optional[float] = _setting(None, real_rule(0, optional=True), "a relaxed rule's cap on the "
                                               "distortion it may spend at one token: above it the token is "
                                               "verified strictly (0: lossless)", shown="none",
                                               source="docs/op.md#a-cap-on-the-distortion")
    # ... then the acceptance rules' parameters, one field each, in the table's order (_with_rule_params)

    def __post_init__(self):
        if self.coupling == "none":
            warnings.warn('coupling="none" is deprecated; use "independent"', DeprecationWarning, stacklevel=4)
            object.__setattr__(self, "coupling", "independent")
        for f in dataclasses.fields(self):
            if f.metadata["rule"] is not None:
                object.__setattr__(self, f.name, check(f.name, getattr(self, f.name)))

    def replace(self, **overrides) -> "GenerationConfig":
        """This config with ``overrides``; TypeError naming a keyword that is no field."""
        unknown = sorted(set(overrides) - set(self.names()))
        if unknown:
            raise TypeError(f"unexpected keyword argument{'s' if len(unknown) > 1 else ''} "
                            f"{', '.join(map(repr, unknown))}: the settings are GenerationConfig's fields "
                            f"({', '.join(self.names())})")
        return dataclasses.replace(self, **overrides) if overrides else self

    @classmethod
    def names(cls, **metadata) -> tuple:
        """The field names, in order; those whose metadata has the given values (e.g. ``flag="every"``)."""
        return tuple(f.name for f in dataclasses.fields(cls) if all(f.metadata[k] == v for k, v in metadata.items()))

    @classmethod
    def field_info(cls, name: str) -> dict:
        """A field's metadata (rule, help, source, flag, recorded, shown) and its ``default``."""
        (f,) = [f for f in dataclasses.fields(cls) if f.name == name]
        return dict(f.metadata, default=f.default)

    def changed(self) -> dict:
        """The fields whose values differ from the defaults."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if _differs(getattr(self, f.name),
                                                                                             f.default)}

    def keys(self):
        return self.changed().keys()

    def __getitem__(self, name: str):
        return self.changed()[name]

    def as_dict(self, names: Optional[Sequence[str]] = None) -> dict:
        """{name: value} of every field (or of ``names``)."""
        return {name: getattr(self, name) for name in (names or self.names())}


def _differs(value, default) -> bool:
    try:
        return bool(value != default)
    except (TypeError, ValueError, RuntimeError):  # e.g. a tensor of per-row seeds
        return True


# Every checked setting, by keyword (the command line's flag is the keyword with dashes: cfg_scale -> --cfg-scale):
# GenerationConfig's fields, then the command line's own.
RULES: dict[str, Rule] = {
    **{name: GenerationConfig.field_info(name)["rule"] for name in GenerationConfig.names()
       if GenerationConfig.field_info(name)["rule"] is not None},
    "seed": int_rule(0, MAX_SEED),  # an int on the command line (generate() also takes one per row: row_seeds)
    "num": int_rule(1, MAX_IMAGES),
    "compare_num": int_rule(2, MAX_IMAGES),  # csd compare --num: a spread and a Fréchet distance are of a set
    "batch_size": int_rule(1, MAX_IMAGES),
    "seeds": int_rule(1, 1000),
    "per_class": int_rule(1, DIGITS_HELDOUT_PER_CLASS),
    "images": int_rule(2, 100_000),  # sweep prompts of a model without classes (a Fréchet distance needs two)
    "workers": int_rule(1, 256),
    "num_threads": int_rule(1, 4096, optional=True),
    "image_size": int_rule(1, 65536, optional=True),
}


def check(name: str, value):
    """``value`` checked by ``RULES[name]`` (and converted to its type)."""
    return RULES[name].check(name, value)


def check_settings(**values) -> dict:
    """Every keyword checked by its rule; the checked values."""
    return {name: check(name, value) for name, value in values.items()}


def run_label(mode: str, coupling: Optional[str] = None) -> str:
    """How tables, plots and progress bars name a run: the mode, and for the modes that take a coupling
    (modes.MODE_TABLE) the coupling of their next drafts (None: DEFAULT_COUPLING, what generate() uses), e.g. "ar",
    "sjd+independent", "csd+maximal", "lantern+maximal"; a mode whose name ends in "+" is joined by "/", never read
    as "+++": "lantern++/maximal"."""
    if not MODE_TABLE[mode].coupling:
        return mode
    return f"{mode}{'/' if mode.endswith('+') else '+'}{coupling or DEFAULT_COUPLING}"


def check_generate(mode: str, coupling: Optional[str] = None, **settings) -> Optional[str]:
    """generate()'s settings (any of RULES' GenerationConfig fields), checked together; returns the coupling the
    verification uses (``None``: the modes that take a coupling, modes.MODE_TABLE, take DEFAULT_COUPLING; the
    others draw next drafts independently)."""
    config = GenerationConfig(mode=mode, coupling=coupling, **settings)
    if MODE_TABLE[mode].coupling:
        return config.coupling
    if config.coupling not in (None, "independent"):
        coupled = ", ".join(name for name, m in MODE_TABLE.items() if m.coupling)
        raise ArgumentError("coupling", config.coupling, f"None or independent with mode {mode} (only {coupled} "
                                                         "couple their next drafts)")
    return "independent"
