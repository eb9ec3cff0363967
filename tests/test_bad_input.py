"""Bad input never costs a run: a table of bad command lines for every subcommand (exit status 2, one line on stderr
naming the flag, no file written, quickly) and of bad generate() arguments (a ValueError naming the argument before
any model call); folder ownership of ``csd generate`` and ``csd run``; help and --version."""

import contextlib
import io
import json
import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

import csd_kernels as ck
from csd_kernels import cli, zoo
from csd_kernels.bench import op as bench
from csd_kernels.cli import commands
from csd_kernels.cli import parser as cli_parser
from csd_kernels.config import rules
from csd_kernels.decoding import validation
from csd_kernels.decoding.validation import ArgumentError

# flags that can only be judged with the model (its prompts, its files); every other flag is checked before loading
MODEL_FLAGS = ("--prompt", "--prompts", "--weights", "--dtype", "--model")
SECONDS = 20  # generous: the machine is shared; a check that runs after the work takes minutes, not seconds


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """Files the bad command lines point at (outside the folder a case must leave empty)."""
    folder = tmp_path_factory.mktemp("inputs")
    (folder / "prompts.txt").write_text("3\n7\n")
    (folder / "bad_prompts.txt").write_text("3\n12\n")
    (folder / "c2i_B_256.pt").write_text("just some notes, not a checkpoint\n")  # named like a LlamaGen checkpoint
    (folder / "garbage.safetensors").write_bytes(bytes(range(256)) * 4)
    (folder / "janus").mkdir()
    (folder / "janus" / "config.json").write_text('{"model_type": "janus"}')
    (folder / "janus" / "model.safetensors").write_bytes(bytes(range(256)) * 4)
    return folder


def _run_main(argv: list[str]) -> tuple[int, str, float]:
    """cli.main in this process: (exit status, stderr, seconds); argparse's SystemExit counts as a status too."""
    err = io.StringIO()
    begin = time.perf_counter()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            status = cli.main(argv)
        except SystemExit as exc:
            status = exc.code
    return status, err.getvalue(), time.perf_counter() - begin


def _no_gpu(case: list) -> list:
    """Cases that name plain cuda are bad input only without a GPU."""
    return [pytest.param(*c, marks=pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible"))
            if "cuda" in c[1] else c for c in case]


GEN = ["generate", "--prompt", "3", "--quiet"]
CMP = ["compare", "--prompt", "3", "--quiet"]
RUN = ["run", "--prompts", "{inputs}/prompts.txt", "--quiet", "--modes", "ar"]
LLAMAGEN = ["--model", "llamagen", "--config", "GPT-B", "--device", "cpu"]

# (subcommand argv, the flag the one line must name); the output goes to OUT, which must not exist afterwards
CASES = _no_gpu([
    # generate: every flag
    ("generate", GEN + ["--window", "0"], "--window"),
    ("generate", GEN + ["--window", "abc"], "--window"),
    ("generate", GEN + ["--temperature", "-1"], "--temperature"),
    ("generate", GEN + ["--temperature", "inf"], "--temperature"),
    ("generate", GEN + ["--top-k", "0"], "--top-k"),
    ("generate", GEN + ["--top-p", "0"], "--top-p"),
    ("generate", GEN + ["--top-p", "1.5"], "--top-p"),
    ("generate", GEN + ["--min-p", "-0.1"], "--min-p"),
    ("generate", GEN + ["--min-p", "nan"], "--min-p"),
    ("generate", GEN + ["--max-distortion", "-0.1"], "--max-distortion"),
    ("generate", GEN + ["--max-distortion", "nan"], "--max-distortion"),
    ("generate", GEN + ["--cfg-scale", "nan"], "--cfg-scale"),
    ("generate", GEN + ["--entropy-coef", "-1"], "--entropy-coef"),
    ("generate", GEN + ["--tvd-threshold", "2"], "--tvd-threshold"),
    ("generate", GEN + ["--draft-init", "left"], "--draft-init"),
    ("generate", GEN + ["--seed", "99999999999999999999"], "--seed"),
    ("generate", GEN + ["--seed", "-1"], "--seed"),
    ("generate", GEN + ["--device", "cuda"], "--device"),
    ("generate", GEN + ["--device", "cuda:99"], "--device"),
    ("generate", GEN + ["--device", "tpu"], "--device"),
    ("generate", GEN + ["--backend", "foo"], "--backend"),
    ("generate", GEN + ["--backend", "cuda", "--device", "cpu"], "--backend"),
    ("generate", GEN + ["--mode", "ar", "--coupling", "gumbel"], "--coupling"),
    ("generate", GEN + ["--mode", "fast"], "--mode"),
    ("generate", GEN + ["--num", "0"], "--num"),
    ("generate", GEN + ["--num", "1000000000"], "--num"),
    ("generate", GEN + ["--image-size", "0"], "--image-size"),
    ("generate", ["generate", "--prompt", "12", "--quiet"], "--prompt"),
    ("generate", ["generate", "--quiet"], "--prompt"),
    ("generate", GEN + ["--model", "nope"], "--model"),
    ("generate", GEN + ["--weights", "{inputs}/c2i_B_256.pt"], "--weights"),
    ("generate", GEN + ["--dtype", "int8", *LLAMAGEN, "--weights", "{inputs}/c2i_B_256.pt"], "--dtype"),
    ("generate", GEN + [*LLAMAGEN, "--weights", "{inputs}/c2i_B_256.pt"], "--weights"),
    ("generate", GEN + [*LLAMAGEN, "--weights", "{inputs}/garbage.safetensors", "--image-size", "256"], "--weights"),
    ("generate", GEN + ["--model", "janus-pro", "--weights", "{inputs}/janus", "--device", "cpu"], "--weights"),
    ("generate", GEN + ["--out", "{inputs}/prompts.txt"], "--out"),
    ("generate", GEN + ["--mode", "sjd", "--tree", "3"], "--tree"),
    ("generate", GEN + ["--mode", "sjd", "--tree", "3,x"], "--tree"),
    ("generate", GEN + ["--mode", "sjd", "--tree", "0,2"], "--tree"),
    ("generate", GEN + ["--mode", "sjd", "--tree", "3,3", "--window", "8"], "--tree"),
    ("generate", GEN + ["--mode", "sjd", "--tree", "4,3"], "--tree"),  # 21 draft nodes: more than W = 16 holds
    ("generate", GEN + ["--mode", "ar", "--tree", "2,2"], "--tree"),
    ("generate", GEN + ["--mode", "sjd", "--coupling", "gumbel", "--tree", "2,2"], "--tree"),
    # compare
    ("compare", CMP + ["--seeds", "0"], "--seeds"),
    ("compare", CMP + ["--num", "0"], "--num"),
    ("compare", CMP + ["--num", "1000000000"], "--num"),
    ("compare", CMP + ["--window", "0"], "--window"),
    ("compare", CMP + ["--tvd-threshold", "-0.5"], "--tvd-threshold"),
    ("compare", CMP + ["--backend", "foo"], "--backend"),
    ("compare", CMP + ["--group-rank", "0"], "--group-rank"),
    ("compare", CMP + ["--group-delta", "-1"], "--group-delta"),
    ("compare", CMP + ["--arsample-scale", "0"], "--arsample-scale"),
    ("compare", CMP + ["--arsample-offset", "2"], "--arsample-offset"),
    ("compare", CMP + ["--lantern-delta", "1.5"], "--lantern-delta"),
    ("compare", CMP + ["--lantern-lambda", "0.5"], "--lantern-lambda"),
    ("compare", CMP + ["--lantern-k", "0"], "--lantern-k"),
    ("compare", CMP + ["--device", "cuda"], "--device"),
    # sweep (before any generation)
    ("sweep", ["sweep", "--taus", "2"], "--taus"),
    ("sweep", ["sweep", "--taus", "x"], "--taus"),
    ("sweep", ["sweep", "--lambdas", "-1"], "--lambdas"),
    ("sweep", ["sweep", "--lambdas", "nan"], "--lambdas"),
    ("sweep", ["sweep", "--couplings", "independent,foo"], "--couplings"),
    ("sweep", ["sweep", "--seeds", "0"], "--seeds"),
    ("sweep", ["sweep", "--per-class", "0"], "--per-class"),
    ("sweep", ["sweep", "--per-class", "100"], "--per-class"),  # more than the held-out digits of a class
    ("sweep", ["sweep", "--workers", "0"], "--workers"),
    ("sweep", ["sweep", "--trees", "2"], "--trees"),
    ("sweep", ["sweep", "--trees", "5x3"], "--trees"),
    ("sweep", ["sweep", "--model", "llamagen"], "--model"),
    # bench (before the benchmark runs)
    ("bench", ["bench", "--backends", "foo"], "--backends"),
    ("bench", ["bench", "--backends", "torch", "cuda", "--device", "cpu"], "--backends"),
    ("bench", ["bench", "--device", "cuda"], "--device"),
    # run: nothing written, run.json included
    ("run", RUN + ["--window", "0"], "--window"),
    ("run", RUN + ["--tvd-threshold", "2"], "--tvd-threshold"),
    ("run", RUN + ["--backend", "foo"], "--backend"),
    ("run", RUN + ["--backend", "cuda"], "--backend"),
    ("run", RUN + ["--temperature", "nan"], "--temperature"),
    ("run", RUN + ["--top-k", "0"], "--top-k"),
    ("run", RUN + ["--top-p", "2"], "--top-p"),
    ("run", RUN + ["--seed", "-3"], "--seed"),
    ("run", RUN + ["--batch-size", "0"], "--batch-size"),
    ("run", RUN + ["--batch-size", "1000000000"], "--batch-size"),
    ("run", RUN + ["--num-threads", "0"], "--num-threads"),
    ("run", RUN + ["--modes", "ar,fast"], "--modes"),
    ("run", RUN + ["--tree", "2;2"], "--tree"),
    ("run", RUN + ["--tree", "2,2"], "--tree"),  # --modes ar: no sjd item to take it
    ("run", RUN + ["--modes", "ar,sjd", "--tree", "2,5"], "--tree"),  # 31 draft nodes: more than W = 16 holds
    ("run", RUN + ["--modes", "ar,sjd", "--coupling", "gumbel", "--tree", "2,2"], "--tree"),
    ("run", RUN + ["--image-size", "-1"], "--image-size"),
    ("run", ["run", "--prompts", "{inputs}/bad_prompts.txt", "--quiet"], "--prompts"),
    ("run", ["run", "--prompts", "{inputs}/missing.txt", "--quiet"], "--prompts"),
    ("run", RUN + [*LLAMAGEN[:4], "--weights", "{inputs}/garbage.safetensors", "--image-size", "256"], "--weights"),
])


def _ids(case) -> str:
    values = case.values if hasattr(case, "values") else case
    return " ".join(a for a in values[1] if a not in ("--quiet", "--prompt", "3")).replace("{inputs}/", "")


@pytest.mark.parametrize("command, argv, flag", CASES, ids=[_ids(c) for c in CASES])
def test_bad_command_line_is_one_line_exit_2_and_writes_nothing(command, argv, flag, inputs, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # default outputs (out/, benchmarks/) would land here
    real_load = zoo.load

    def guarded_load(*args, **kwargs):  # a setting flag must be refused before any model is loaded
        if flag not in MODEL_FLAGS:
            pytest.fail(f"{flag}: a model was loaded before the flag was checked")
        return real_load(*args, **kwargs)

    monkeypatch.setattr(zoo, "load", guarded_load)
    monkeypatch.setattr(bench, "run", lambda *args, **kwargs: pytest.fail("the benchmark ran before the check"))
    out = tmp_path / "out" / ("frontier" if command == "sweep" else "")
    argv = [a.format(inputs=inputs) for a in argv]
    if "--out" not in argv:
        argv += ["--out", str(out)]
    status, err, seconds = _run_main(argv)
    assert status == 2, (status, err)
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("csd"), err
    assert flag in lines[0], lines[0]
    assert "Traceback" not in err
    assert os.listdir(tmp_path) == [], os.listdir(tmp_path)  # no folder, no run.json, no log
    assert seconds < SECONDS, seconds


def test_cases_cover_every_subcommand_and_the_checked_generate_flags():
    covered = {(c.values if hasattr(c, "values") else c)[0] for c in CASES}
    assert covered == {"generate", "compare", "sweep", "bench", "run"}
    flags = {(c.values if hasattr(c, "values") else c)[2] for c in CASES}
    for name in cli_parser.GENERATION_FLAGS + ("num", "seed", "seeds", "batch_size", "num_threads", "image_size",
                                               "tree"):
        assert "--" + name.replace("_", "-") in flags, name


@pytest.mark.parametrize("rule, good, bad, expected", [
    (rules.int_rule(1), [1, 7, np.int64(3)], [0, 2.0, True, "1", None], "an int >= 1"),
    (rules.int_rule(1, 4, optional=True), [None, 1, 4], [0, 5], "None or an int in [1, 4]"),
    (rules.real_rule(0, 1), [0, 0.5, 1], [-0.1, 1.1, float("nan"), float("inf"), False], "a finite number in [0, 1]"),
    (rules.real_rule(0, 1, open_low=True), [1e-9, 1], [0, 1.5], "a finite number in (0, 1]"),  # a top_p
    (rules.real_rule(0, 1, open_high=True), [0, 0.99], [1, -1], "a finite number in [0, 1)"),  # a min_p
    (rules.real_rule(), [-3.5, 0, 7], [float("nan"), float("-inf"), "1"], "a finite number"),
    (rules.bool_rule(), [True, False], [1, 0, "yes", None], "True or False"),  # a static
    (rules.choice_rule(("a", "b")), ["a", "b"], ["c", None, 1], "one of a, b"),
])
def test_rules_say_what_they_accept(rule, good, bad, expected):
    assert rule.expected == expected
    for value in good:
        assert rule.check("x", value) == value
    for value in bad:
        with pytest.raises(ArgumentError, match=r"^x=.*: expected " + re.escape(expected)):
            rule.check("x", value)


# ----------------------------------------------------------------------------------------------------------------------
# the API: the same rules, a ValueError naming the argument, before any model call
# ----------------------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def digits():
    return zoo.load("digits")


_IDS = torch.tensor([[515]])  # the digits model's prompt: class 3
API_CASES = [
    (dict(window=0), "window"),
    (dict(window=2.5), "window"),
    (dict(window=True), "window"),
    (dict(temperature=-1.0), "temperature"),
    (dict(temperature=float("nan")), "temperature"),
    (dict(top_k=0), "top_k"),
    (dict(top_k=2.5), "top_k"),
    (dict(top_p=0.0), "top_p"),
    (dict(top_p=1.01), "top_p"),
    (dict(min_p=1.5), "min_p"),
    (dict(cfg_scale=float("nan")), "cfg_scale"),
    (dict(cfg_scale=float("inf")), "cfg_scale"),
    (dict(entropy_coef=-1.0), "entropy_coef"),
    (dict(tvd_threshold=2.0), "tvd_threshold"),
    (dict(tvd_threshold=-0.1), "tvd_threshold"),
    (dict(draft_init="left"), "draft_init"),
    (dict(mode="fast"), "mode"),
    (dict(mode="ar", coupling="gumbel"), "coupling"),
    (dict(mode="gsd", coupling="maximal"), "coupling"),
    (dict(coupling="best"), "coupling"),
    (dict(backend="foo"), "backend"),
    (dict(backend="cuda"), "backend"),  # the model is on the CPU
    (dict(seed=1.5), "seed"),
    (dict(seed=-1), "seed"),
    (dict(seed=1 << 63), "seed"),
    (dict(seed=(1 << 63) - 1, input_ids=torch.tensor([[515], [516]])), "seed"),  # row 1's seed overflows int64
    (dict(seed=[1, 2]), "seed"),
    (dict(seed=torch.tensor([0.5])), "seed"),
    (dict(seed="7"), "seed"),
    (dict(max_lead=-1), "max_lead"),
    (dict(group_rank=0), "group_rank"),
    (dict(group_delta=float("nan")), "group_delta"),
    (dict(input_ids=torch.tensor([[10 ** 6]])), "input_ids"),  # outside the model's vocabulary
    (dict(input_ids=torch.tensor([[-1]])), "input_ids"),
    (dict(input_ids=torch.tensor([[515.0]])), "input_ids"),
    (dict(input_ids=torch.tensor([515])), "input_ids"),
    (dict(input_ids=torch.zeros(1, 0, dtype=torch.long)), "input_ids"),
    (dict(attention_mask=torch.ones(2, 5)), "attention_mask"),
    (dict(attention_mask=torch.ones(1)), "attention_mask"),
    (dict(attention_mask=torch.tensor([[2]])), "attention_mask"),
    (dict(input_ids=torch.tensor([[515, 0]]), attention_mask=torch.tensor([[1, 0]])), "attention_mask"),  # right pad
]


@pytest.mark.parametrize("kwargs, argument", API_CASES, ids=[f"{k}" for k, _ in API_CASES])
def test_generate_raises_a_value_error_naming_the_argument_before_any_model_call(kwargs, argument, digits,
                                                                                 forward_counter):
    counter = forward_counter(digits.model.lm)
    kwargs = dict(kwargs)
    input_ids = kwargs.pop("input_ids", _IDS)
    begin = time.perf_counter()
    with pytest.raises(ValueError, match=argument) as exc:
        ck.generate(digits.model, input_ids, **kwargs)
    assert isinstance(exc.value, ArgumentError) and exc.value.name == argument
    assert "\n" not in str(exc.value)
    assert counter.calls == 0  # refused before the prefill
    assert time.perf_counter() - begin < SECONDS


def test_the_cli_and_the_api_share_one_rule(digits, monkeypatch, tmp_path):
    """Change one rule and both the API and every command line that takes the setting follow: no second check."""
    monkeypatch.setitem(validation.RULES, "window", validation.Rule("int", 5))
    with pytest.raises(ArgumentError, match=r"window=4: expected an int >= 5"):
        ck.generate(digits.model, _IDS, window=4)
    for argv in (GEN, CMP, [a.format(inputs=tmp_path) for a in RUN]):
        status, err, _ = _run_main(argv + ["--window", "4", "--out", str(tmp_path / "out")])
        assert status == 2 and "--window 4: expected an int >= 5" in err, err


# ----------------------------------------------------------------------------------------------------------------------
# folders: csd generate owns its --out; csd run writes run.json only for valid arguments
# ----------------------------------------------------------------------------------------------------------------------
def test_generate_replaces_its_earlier_images_and_records_every_setting(tmp_path):
    out = tmp_path / "out"
    base = ["generate", "--prompt", "3", "--quiet", "--window", "8", "--out", str(out)]
    assert cli.main(base + ["--num", "4"]) == 0
    assert {p.name for p in out.glob("img_*.png")} == {f"img_{i:03d}.png" for i in range(4)}
    assert cli.main(base + ["--num", "2", "--mode", "sjd"]) == 0
    assert {p.name for p in out.glob("img_*.png")} == {"img_000.png", "img_001.png"}  # no stale img_002/003
    stats = json.loads((out / "stats.json").read_text())
    assert stats["command"] == "csd generate" and stats["num"] == 2 and stats["mode"] == "sjd"
    parameters = stats["parameters"]
    expected = {"window": 8, "cfg_scale": zoo.load("digits").defaults.cfg_scale, "temperature": 1.0,
                "top_k": None, "entropy_coef": 0.5, "tvd_threshold": 0.65, "draft_init": "above",
                "coupling": ck.decoding.DEFAULT_COUPLING}
    assert {k: parameters[k] for k in expected} == expected
    assert parameters["backend"] in ck.available_backends("cpu")  # the backend that ran, not None


def test_generate_refuses_a_folder_it_does_not_own(tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    (out / "stats.json").write_text('{"something": "else"}')
    status, err, _ = _run_main(["generate", "--prompt", "3", "--quiet", "--num", "1", "--out", str(out)])
    assert status == 2 and len(err.splitlines()) == 1 and "--out" in err and "notes.txt" in err
    assert sorted(os.listdir(out)) == ["notes.txt", "stats.json"]
    assert (out / "stats.json").read_text() == '{"something": "else"}'


def test_a_failed_generate_leaves_the_earlier_run_as_it_was(tmp_path, monkeypatch):
    out = tmp_path / "out"
    assert cli.main(["generate", "--prompt", "3", "--quiet", "--num", "2", "--window", "8", "--out", str(out)]) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def broken(*args, **kwargs):
        raise RuntimeError("the model failed")

    monkeypatch.setattr(commands, "generate", broken)
    with pytest.raises(RuntimeError):
        cli.main(["generate", "--prompt", "4", "--quiet", "--num", "1", "--out", str(out)])
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_run_with_a_bad_flag_leaves_no_folder_and_the_corrected_command_runs(inputs, tmp_path):
    out = tmp_path / "run"
    argv = ["run", "--prompts", str(inputs / "prompts.txt"), "--modes", "ar", "--quiet", "--out", str(out)]
    for bad in (["--window", "0"], ["--tvd-threshold", "2"], ["--backend", "foo"]):
        status, err, _ = _run_main(argv + bad)
        assert status == 2 and bad[0] in err and not out.exists()
    assert cli.main(argv + ["--window", "4"]) == 0  # not refused: no run.json of the failed starts
    manifest = json.loads((out / "run.json").read_text())
    assert manifest["generate"]["window"] == 4
    existing = sorted(os.listdir(out))
    status, err, _ = _run_main(argv + ["--window", "4", "--top-k", "0"])
    assert status == 2 and "--top-k" in err and sorted(os.listdir(out)) == existing


# ----------------------------------------------------------------------------------------------------------------------
# help, --version, pil_images; a few real processes
# ----------------------------------------------------------------------------------------------------------------------
def _subcommand_actions():
    parser = cli_parser.build_parser()
    (commands,) = [a for a in parser._actions if a.dest == "command"]
    for name, sub in commands.choices.items():
        for action in sub._actions:
            if action.dest != "help":
                yield name, action


def test_every_flag_has_help_and_shows_its_default():
    for name, action in _subcommand_actions():
        flag = action.option_strings[0]
        assert action.help, (name, flag)
        if action.required:
            continue
        assert "(default: " in action.help, (name, flag)
        if action.default not in (None, False):
            assert f"(default: {action.default})" in action.help, (name, flag, action.default)


def test_version(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["--version"])
    assert exc.value.code == 0 and capsys.readouterr().out.strip() == f"csd {ck.__version__}"


def test_pil_images(digits):
    out = ck.generate(digits.model, torch.tensor([[515], [516]]), mode="ar", seed=0)
    images = out.pil_images()
    assert len(images) == 2 and images[0].size == (out.images.shape[2], out.images.shape[1])
    assert torch.equal(torch.from_numpy(np.array(images[1])), out.images[1])
    out.images = None
    with pytest.raises(ValueError, match="pixel decoder"):
        out.pil_images()


def _csd(argv, cwd, env=None):
    begin = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "csd_kernels", *argv], capture_output=True, text=True, cwd=cwd,
                            timeout=300, env=env)
    return result, time.perf_counter() - begin


@pytest.mark.parametrize("argv, flag, env", [
    (["generate", "--prompt", "3", "--window", "0"], "--window", {}),
    (["run", "--prompts", "{inputs}/prompts.txt", "--out", "run", "--tvd-threshold", "2"], "--tvd-threshold", {}),
    (["generate", "--prompt", "3", "--backend", "triton", "--device", "cpu"], "--backend", {"TRITON_INTERPRET": None}),
], ids=["generate", "run", "triton-without-interpreter"])
def test_real_process(argv, flag, env, inputs, tmp_path):
    environment = {k: v for k, v in os.environ.items() if k not in env}
    result, seconds = _csd([a.format(inputs=inputs) for a in argv], tmp_path, environment)
    assert seconds < 3 * SECONDS  # (most of it is importing torch)
    assert result.returncode == 2, result.stderr
    assert len(result.stderr.splitlines()) == 1 and flag in result.stderr, result.stderr
    assert os.listdir(tmp_path) == []
