"""GenerationConfig is every setting once: its fields are generate()'s settings, the csd flags, what csd run records in
run.json and csd generate in stats.json (a field added to it appears in all of them, checked in a process whose
config/generation.py has one more field); config=... with keyword overrides; bad values named; the config package and
the command line's parser import no torch."""

import dataclasses
import inspect
import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import torch

import csd_kernels as ck
from csd_kernels import reference as ref
from csd_kernels import zoo
from csd_kernels.cli import commands
from csd_kernels.cli import parser as cli_parser
from csd_kernels.config.generation import RULES
from csd_kernels.config.rules import ArgumentError
from csd_kernels.ops.verify import verify
from csd_kernels.ops.verify_tree import verify_tree
from csd_kernels.runner.files import SETTINGS

GenerationConfig = ck.GenerationConfig
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_IDS = torch.tensor([[515]])  # the digits model's prompt: class 3


def _dests(command: str) -> set:
    (commands_action,) = [a for a in cli_parser.build_parser()._actions if a.dest == "command"]
    return {a.dest for a in commands_action.choices[command]._actions}


def _bad_value(name: str):
    """A value the field's rule refuses (for seed and tree, which generate() checks with the inputs: a string)."""
    rule = GenerationConfig.field_info(name)["rule"]
    return {None: "x", "int": 2.5, "real": float("nan"), "bool": "yes", "choice": "nope"}[rule and rule.kind]


# ----------------------------------------------------------------------------------------------------------------------
# one source
# ----------------------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def digits():
    return zoo.load("digits")


def test_every_field_is_a_generate_keyword_checked_by_name(digits):
    """generate() takes every field as a keyword and refuses a bad value naming it, before any model call."""
    for name in GenerationConfig.names():
        with pytest.raises(ValueError, match=rf"^{name}=") as exc:
            ck.generate(digits.model, _IDS, **{name: _bad_value(name)})
        assert isinstance(exc.value, ArgumentError) and exc.value.name == name


def test_the_flags_are_the_fields():
    """Every flag="every" field is a flag of generate, compare and run; the flag="own" ones are generate's; every
    generation flag of a command is a field."""
    every, own = set(GenerationConfig.names(flag="every")), set(GenerationConfig.names(flag="own"))
    assert every and own and set(cli_parser.GENERATION_FLAGS) == every
    for command in ("generate", "compare", "run"):
        assert every <= _dests(command), command
    assert own <= _dests("generate")
    fields = set(GenerationConfig.names())
    assert _dests("generate") & fields == every | own
    assert _dests("compare") & fields == every  # compare runs its own modes, couplings and seeds


def test_run_and_stats_record_the_fields(digits):
    assert set(SETTINGS) == set(GenerationConfig.names(flag="every"))
    assert all(flag == "--" + name.replace("_", "-") for name, flag in SETTINGS.items())
    recorded = commands._settings_used({"window": 8}, "csd", None, "cpu")
    assert list(recorded) == list(GenerationConfig.names(recorded=True))
    assert recorded["window"] == 8 and recorded["coupling"] == ck.decoding.DEFAULT_COUPLING
    assert recorded["backend"] in ck.available_backends("cpu")


def test_rules_are_the_fields_rules():
    for name in GenerationConfig.names():
        rule = GenerationConfig.field_info(name)["rule"]
        assert rule is None or RULES[name] is rule, name


def test_every_field_says_what_it_is():
    for name in GenerationConfig.names():
        info = GenerationConfig.field_info(name)
        assert info["help"] and info["flag"] in ("every", "own", None), name


def test_the_ops_take_the_same_csd_defaults():
    """The ops take a rule's parameters by keyword, their defaults the table's (config/acceptance.py), as
    GenerationConfig does."""
    config = GenerationConfig()
    assert config.entropy_coef == ref.DEFAULT_ENTROPY_COEF and config.tvd_threshold == ref.DEFAULT_TVD_THRESHOLD
    for fn in (verify, verify_tree, ref.verify, ref.verify_tree):
        params = inspect.signature(fn).parameters
        assert "entropy_coef" not in params and params["rule_params"].kind == inspect.Parameter.VAR_KEYWORD, fn
    assert ref.rule_parameters("csd", {}) == dict(entropy_coef=config.entropy_coef, tvd_threshold=config.tvd_threshold)


_NEW_FIELD = """
    lookahead: int = _setting(3, int_rule(1), "a setting added by test_config")
"""
_CHECK_NEW_FIELD = """
import contextlib, importlib.machinery, io, sys

class Loader(importlib.machinery.SourceFileLoader):
    def get_code(self, fullname):
        source = self.get_data(self.path).decode()
        anchor = "\\n    def __post_init__(self):"
        assert anchor in source
        return compile(source.replace(anchor, NEW_FIELD + anchor, 1), self.path, "exec")

class Finder:
    def find_spec(self, fullname, path, target=None):
        if fullname != "csd_kernels.config.generation":
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        spec.loader = Loader(fullname, spec.origin)
        return spec

sys.meta_path.insert(0, Finder())
import torch
import csd_kernels as ck
from csd_kernels.cli import commands, main, parser
from csd_kernels.config.generation import RULES
from csd_kernels.runner.files import SETTINGS

assert ck.GenerationConfig(lookahead=5).changed() == {"lookahead": 5}
assert "lookahead" in RULES and SETTINGS["lookahead"] == "--lookahead", SETTINGS
try:
    ck.generate(None, torch.tensor([[1]]), lookahead=0)
    raise AssertionError("generate took lookahead=0")
except ValueError as exc:
    assert exc.name == "lookahead", exc
assert commands._settings_used({"lookahead": 5}, "csd", None, "cpu")["lookahead"] == 5
for command in ("generate", "compare", "run"):
    err = io.StringIO()
    argv = [command, "--lookahead", "0", "--prompt", "3", "--prompts", "p.txt", "--out", "o"]
    argv = [a for a in argv if command == "run" or a not in ("--prompts", "p.txt")]
    argv = [a for a in argv if command != "run" or a not in ("--prompt", "3")]
    with contextlib.redirect_stderr(err):
        assert main(argv) == 2, command
    assert "--lookahead 0: expected an int >= 1" in err.getvalue(), (command, err.getvalue())
print("ok")
"""


def test_a_new_field_appears_everywhere(tmp_path):
    """A field added to GenerationConfig (here: in a process whose config/generation.py has one more) is a generate()
    keyword checked by its rule, a flag of every sampling command refused by that rule, a setting run.json records and
    one stats.json records, with nothing else edited."""
    script = f"NEW_FIELD = {_NEW_FIELD!r}\n" + textwrap.dedent(_CHECK_NEW_FIELD)
    env = dict(os.environ, PYTHONPATH=ROOT)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, env=env,
                            timeout=600)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-3000:]


# ----------------------------------------------------------------------------------------------------------------------
# config= and overrides
# ----------------------------------------------------------------------------------------------------------------------
def test_overrides_replace_the_configs_fields(digits):
    config = digits.defaults.replace(window=8, mode="sjd")
    by_config = ck.generate(digits.model, _IDS, config=config, window=4, seed=3)
    by_keywords = ck.generate(digits.model, _IDS, mode="sjd", window=4, seed=3, **digits.defaults)
    assert torch.equal(by_config.tokens, by_keywords.tokens)
    assert by_config.forward_passes == by_keywords.forward_passes
    assert config.replace(window=4) == GenerationConfig(**dict(digits.defaults), mode="sjd", window=4)


def test_the_model_defaults_are_a_config_whose_changes_are_keywords(digits):
    assert isinstance(digits.defaults, GenerationConfig)
    assert dict(digits.defaults) == {"cfg_scale": digits.defaults.cfg_scale} != {}
    assert {**GenerationConfig(window=4, top_k=7)} == {"window": 4, "top_k": 7}
    assert dict(GenerationConfig()) == {}


def test_unknown_and_bad_settings_are_named(digits):
    with pytest.raises(TypeError, match="'windows'"):
        ck.generate(digits.model, _IDS, windows=8)
    with pytest.raises(TypeError, match="'lamda'"):
        GenerationConfig().replace(lamda=1.0)
    with pytest.raises(TypeError, match="GenerationConfig"):
        ck.generate(digits.model, _IDS, config={"window": 8})
    with pytest.raises(ArgumentError, match=r"^tvd_threshold=2: expected a finite number in \[0, 1\]$"):
        GenerationConfig(tvd_threshold=2)
    with pytest.raises(ArgumentError, match=r"^window=0"):
        GenerationConfig(window=8).replace(window=0)
    with pytest.raises(ArgumentError, match=r"^coupling='gumbel': expected None or independent with mode ar"):
        ck.generate(digits.model, _IDS, config=GenerationConfig(mode="ar", coupling="gumbel"))


def test_a_config_holds_checked_values():
    config = GenerationConfig(window=8, top_k=np.int64(5), cfg_scale=3)
    assert config.cfg_scale == 3.0 and isinstance(config.cfg_scale, float)
    assert config.top_k == 5 and type(config.top_k) is int  # JSON-writable in run.json and stats.json
    assert dataclasses.is_dataclass(config) and config.__dataclass_params__.frozen


# ----------------------------------------------------------------------------------------------------------------------
# no torch before it is needed
# ----------------------------------------------------------------------------------------------------------------------
_WITHOUT_PACKAGE_INIT = """
import os, sys, types
package = types.ModuleType("csd_kernels")  # the modules below csd_kernels/__init__.py, without it
package.__path__ = [os.path.join(sys.argv[1], "csd_kernels")]
package.__version__ = "test"
sys.modules["csd_kernels"] = package
import contextlib, io
import csd_kernels.config.generation
import csd_kernels.cli.parser
from csd_kernels.cli.entry import main
with contextlib.redirect_stderr(io.StringIO()) as err:
    assert main(["generate", "--prompt", "3", "--window", "0"]) == 2
    assert main(["run", "--prompts", "p.txt", "--out", "o", "--batch-size", "0"]) == 2
    assert main(["generate", "--prompt", "3", "--mode", "ar", "--coupling", "gumbel"]) == 2
assert err.getvalue().count("error:") == 3, err.getvalue()
for argv in (["--version"], ["--help"], ["generate", "--help"], ["generate", "--window", "x"]):
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            main(argv)
        except SystemExit:
            pass
heavy = sorted(m for m in ("torch", "numpy", "transformers", "triton") if m in sys.modules)
print(",".join(heavy) or "none")
"""


def test_config_and_the_command_line_refuse_bad_flags_without_torch(tmp_path):
    result = subprocess.run([sys.executable, "-c", _WITHOUT_PACKAGE_INIT, ROOT], capture_output=True, text=True,
                            cwd=tmp_path, timeout=300)
    assert result.returncode == 0 and result.stdout.strip() == "none", (result.stdout, result.stderr[-3000:])


@pytest.mark.parametrize("argv", [["--version"], ["--help"], ["generate", "--prompt", "3", "--window", "0"]])
def test_csd_answers_without_importing_torch(argv, tmp_path):
    """python -m csd_kernels.cli (what the csd entry point runs): --version, --help and a refused flag load none of
    torch, transformers, triton, and take < 0.5 s on an idle machine."""
    script = ("import runpy, sys\nsys.argv = ['csd'] + sys.argv[1:]\n"
              "try:\n    runpy.run_module('csd_kernels.cli', run_name='__main__')\nexcept SystemExit:\n    pass\n"
              "print('HEAVY', *[m for m in ('torch', 'transformers', 'triton') if m in sys.modules])")
    begin = time.perf_counter()
    result = subprocess.run([sys.executable, "-c", script, *argv], capture_output=True, text=True, cwd=tmp_path,
                            env=dict(os.environ, PYTHONPATH=ROOT), timeout=300)
    seconds = time.perf_counter() - begin
    assert result.stdout.splitlines()[-1] == "HEAVY", result.stdout[-500:]
    if os.getloadavg()[0] < 0.5:  # the time only means something on an idle machine
        assert seconds < 0.5, seconds
