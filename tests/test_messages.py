"""Every message the user reads is true: the help's bounds and defaults are what the checks accept, the tables name
each run's coupling as generate() runs it, prompts are judged by the model's grammar before anything loads (quoting
at most ~80 characters, saying which model takes a prompt of another grammar), seeds have one range everywhere, and
the pictures hold what they say (titles inside, colour bars as tall as their maps, grids as wide as their images,
legends naming drawn lines, plain numbers on log axes)."""

import contextlib
import io
import json
import math
import os
import re
import subprocess
import sys
import types
import warnings

import numpy as np
import pytest
import torch

import csd_kernels as ck
from csd_kernels import cli, zoo
from csd_kernels import reference as ref
from csd_kernels.bench import frontier, frontier_plot
from csd_kernels.bench import op as bench
from csd_kernels.cli import commands
from csd_kernels.cli import parser as cli_parser
from csd_kernels.config.generation import DEFAULT_COUPLING, DIGITS_HELDOUT_PER_CLASS, MODES, run_label
from csd_kernels.decoding.validation import TREE_MODES, ArgumentError, check_tree, row_seeds
from csd_kernels.fileio.inputs import QUOTED

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(ck.__file__)))


# ----------------------------------------------------------------------------------------------------------------------
# the help: every bound and default it states is what the checks do
# ----------------------------------------------------------------------------------------------------------------------
_BOUNDS = re.compile(r"an int in \[(-?\d+), (\d+)\]|an int >= (-?\d+)|a finite number in ([\[(])([-\d.]+), ([-\d.]+)"
                     r"([\])])|a finite number >= ([-\d.]+)")


def _subcommand_actions():
    parser = cli_parser.build_parser()
    (sub,) = [a for a in parser._actions if a.dest == "command"]
    for name, command in sub.choices.items():
        for action in command._actions:
            if action.option_strings and action.help:
                yield name, action


def _minimal(command: str, prompts) -> list:
    return {"generate": ["generate", "--prompt", "3"], "compare": ["compare", "--prompt", "3"], "sweep": ["sweep"],
            "run": ["run", "--prompts", str(prompts), "--out", "o"], "bench": ["bench"]}[command]


def _accepted(argv: list) -> bool:
    """Whether the torch-free checks (parse, flags, prompts) take ``argv``."""
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            args = cli_parser.build_parser().parse_args(argv)
        cli_parser.check_flags(args)
    except (ArgumentError, ValueError, SystemExit):
        return False
    return True


def _stated_bounds():
    for command, action in _subcommand_actions():
        for found in _BOUNDS.finditer(" ".join(action.help.split())):
            yield pytest.param(command, action.option_strings[0], found.groups(),
                               id=f"{command} {action.option_strings[0]} {found.group(0)}")


@pytest.mark.parametrize("command, flag, bounds", list(_stated_bounds()))
def test_each_bound_the_help_states_is_the_one_checked(command, flag, bounds, tmp_path):
    """e.g. csd compare --num: the help said [1, 1024] and then 1 was refused; now each bound is taken and the value
    past it refused, by the checks that run before torch loads."""
    (tmp_path / "p.txt").write_text("3\n")
    base = _minimal(command, tmp_path / "p.txt")
    low, high, at_least, open_low, real_low, real_high, open_high, real_at_least = bounds
    if low is not None:
        inside, outside = [int(low), int(high)], [int(low) - 1, int(high) + 1]
    elif at_least is not None:
        inside, outside = [int(at_least)], [int(at_least) - 1]
    elif real_low is not None:
        low_f, high_f = float(real_low), float(real_high)
        inside = [v for v, is_open in ((low_f, open_low == "("), (high_f, open_high == ")")) if not is_open]
        inside += [(low_f + high_f) / 2]
        outside = [low_f - 0.01, high_f + 0.01] + [v for v, is_open in ((low_f, open_low == "("),
                                                                        (high_f, open_high == ")")) if is_open]
    else:
        inside, outside = [float(real_at_least)], [float(real_at_least) - 0.01]
    for value in inside:
        assert _accepted(base + [flag, str(value)]), (flag, value, "refused, though the help takes it")
    for value in outside:
        assert not _accepted(base + [flag, str(value)]), (flag, value, "taken, though the help refuses it")


def test_each_default_the_help_shows_is_accepted(tmp_path):
    (tmp_path / "p.txt").write_text("3\n")
    for command, action in _subcommand_actions():
        if action.default not in (None, False, True) and action.nargs is None:
            argv = _minimal(command, tmp_path / "p.txt") + [action.option_strings[0], str(action.default)]
            assert f"(default: {action.default})" in action.help and _accepted(argv), (command, action.dest)


def test_the_per_class_bound_is_the_held_out_digits_of_the_rarest_class():
    assert zoo.digits_heldout_per_class() == DIGITS_HELDOUT_PER_CLASS


def test_the_tree_help_names_the_modes_that_take_a_tree():
    """--tree said "--mode sjd" while --mode csd --tree 3,2 works (as the README says)."""
    for command, action in _subcommand_actions():
        if action.dest == "tree":
            names = "|".join(map(re.escape, sorted(MODES, key=len, reverse=True)))  # lantern++ before lantern
            named = set(re.findall(r"(?<![\w+])(" + names + r")(?![\w+])", action.help.split("--mode")[-1]))
            assert named == set(TREE_MODES), (command, action.help)
    for mode in TREE_MODES:
        assert check_tree((3, 2), mode, 16, "maximal", static=True) == (3, 2)


# ----------------------------------------------------------------------------------------------------------------------
# labels: every table names the coupling, as generate() runs it
# ----------------------------------------------------------------------------------------------------------------------
def test_compare_rows_name_their_coupling_and_generate_s_default_is_one_of_them():
    labels = [label for label, _, _ in commands.COMPARE_RUNS]
    assert labels == ["ar", "sjd+independent", "sjd+maximal", "sjd+gumbel", "gsd", "csd+independent", "csd+maximal",
                      "csd+gumbel", "arsample+maximal", "lantern+maximal", "lantern++/maximal"]
    assert all(label == run_label(mode, coupling) for label, mode, coupling in commands.COMPARE_RUNS)
    assert run_label("csd") == f"csd+{DEFAULT_COUPLING}" in labels  # csd generate --mode csd: that row
    assert [run_label(s.mode, s.coupling) for s in frontier.settings(trees=()) if s.mode == "sjd"] == [
        "sjd+independent", "sjd+maximal", "sjd+gumbel"]


def test_the_progress_bar_names_the_coupling(capsys):
    digits = zoo.load("digits")
    ck.generate(digits.model, torch.tensor([[515]]), mode="sjd", coupling="gumbel", progress=True, seed=0)
    assert "csd_kernels sjd+gumbel" in capsys.readouterr().err


def _result(images=2, pareto=("csd+maximal λ=0.5 τ=0.65",)) -> dict:
    r = lambda mean: {"mean": mean, "std": 0.0}  # noqa: E731
    row = lambda passes, accuracy: {"passes": r(passes), "batch_passes": r(passes + 2), "distortion": r(0.0),  # noqa
                                    "accuracy": r(accuracy), "frechet": r(9.0), "wall_per_image": r(1.0)}
    rows = {"ar": row(256, 0.9), "sjd+maximal": row(70, 0.9), "csd+maximal λ=0.5 τ=0.65": row(64, 0.8)}
    return {"results": rows, "measures": [{"name": "accuracy", "label": "accuracy", "higher_is_better": True,
                                           "axis": "a", "fmt": ".3f", "log_scale": False},
                                          {"name": "frechet", "label": "Fréchet", "higher_is_better": False,
                                           "axis": "f", "fmt": ".2f", "log_scale": True}],
            "pareto": list(pareto), "best_lossless": "sjd+maximal", "fewest_inside_ar_band": "sjd+maximal",
            "fast_inside_ar_band": ["sjd+maximal"],
            "images": images, "batch": min(16, images), "heldout": None, "ceiling": "c", "model": "digits",
            "seeds": [0], "settings": {label: {"mode": label.split("+")[0], "coupling": "maximal",
                                               "entropy_coef": 0.5, "tvd_threshold": 0.65} for label in rows},
            "csd_vs_gsd": {"gsd_dominated_by": {}, "csd_front_dominated_by": {}}}


def test_the_sweep_table_holds_the_rows_its_verdict_lines_cite():
    result = _result(images=2)
    table = frontier.format_table(result)
    for line in frontier.summary_lines(result):
        for label in result["results"]:
            if label in line:
                assert f"| {label} |" in table, (label, line)
    assert "| ar |" in table and "passes / batch of 2 |" in table and "batch of 16" not in table
    assert "passes / batch of up to 16 |" in frontier.format_table(dict(_result(images=20), batch=16))


# ----------------------------------------------------------------------------------------------------------------------
# prompts: the model's grammar, before anything loads
# ----------------------------------------------------------------------------------------------------------------------
_REFUSE = """
import sys, time
begin = time.perf_counter()
from csd_kernels.cli.entry import main
status = main(sys.argv[1:])
print(status, time.perf_counter() - begin, *[m for m in ("torch", "transformers") if m in sys.modules])
"""


@pytest.mark.parametrize("argv, message", [
    (["generate", "--model", "scenes", "--prompt", "purple circle center"], "colour 'purple' is not one of red,"),
    (["generate", "--prompt", "red circle center"], "the digits model takes a class id 0..9; it is a prompt of "
                                                    "--model scenes"),
    (["compare", "--model", "scenes", "--prompt", "3"], "it is a prompt of --model digits"),
    (["generate", "--model", "janus-pro", "--weights", "x", "--prompt", " "], "expected a non-empty text"),
])
def test_a_bad_prompt_is_refused_before_torch_loads(argv, message, tmp_path):
    result = subprocess.run([sys.executable, "-c", _REFUSE, *argv, "--out", str(tmp_path / "o")], capture_output=True,
                            text=True, cwd=tmp_path, env=dict(os.environ, PYTHONPATH=ROOT), timeout=120)
    status, seconds, *loaded = result.stdout.split()
    assert status == "2" and loaded == [], (result.stdout, result.stderr)
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"csd {argv[0]}: error: --prompt: prompt ") and message in line, line
    if os.getloadavg()[0] < 0.5:  # the time only means something on an idle machine
        assert float(seconds) < 0.5, seconds
    assert not (tmp_path / "o").exists()


def test_a_long_prompt_is_quoted_short():
    status, err = _main(["generate", "--model", "scenes", "--prompt", "x" * 10_000])
    assert status == 2 and len(err.splitlines()) == 1 and len(err) < 4 * QUOTED, err
    assert err.count("x") <= QUOTED + 2


def test_a_string_where_a_list_is_expected_is_refused_with_the_reason():
    digits = zoo.load("digits")
    with pytest.raises(ValueError, match="expected a list of prompts, got one str 'red circle center' .*pass "
                                         r"\[prompt\]"):
        digits.prompt_inputs("red circle center")
    with pytest.raises(ValueError, match="the list is empty"):
        digits.prompt_inputs([])
    with pytest.raises(ValueError, match="prompt '12': the digits model takes a class id 0..9"):
        digits.prompt_inputs(["3", "12"])


def test_the_scenes_grammar_help_comes_from_the_world():
    from csd_kernels.zoo.scenes import prompts, world

    text = prompts.grammar()
    for words in (world.COLOURS, world.SHAPES, world.CELLS):
        assert ", ".join(words) in text
    assert "on " + "|".join(world.BACKGROUNDS) in text


def _main(argv) -> tuple:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            status = cli.main(argv)
        except SystemExit as exc:
            status = exc.code
    return status, err.getvalue()


# ----------------------------------------------------------------------------------------------------------------------
# one range of seeds; messages of the op
# ----------------------------------------------------------------------------------------------------------------------
def test_a_seed_is_an_int_in_0_to_2_63_everywhere(tmp_path):
    logits, drafts = torch.randn(1, 2, 8), torch.zeros(1, 2, dtype=torch.long)
    ck.verify(logits, drafts, None, seed=2**63 - 1)
    with pytest.raises(ValueError, match=r"seed must lie in \[0, 2\^63\), got 9223372036854775808"):
        ck.verify(logits, drafts, None, seed=2**63)
    layout = ref.tree_layout(2, 1, 3)
    q = torch.softmax(torch.randn(1, layout.levels, 8), -1)
    tree = dict(target_logits=torch.randn(1, 3, 8), node_tokens=torch.zeros(1, 3, dtype=torch.long), draft_probs=q,
                layout=layout, offset=0)
    ck.verify_tree(**tree, seed=2**63 - 1)
    with pytest.raises(ValueError, match=r"seed must lie in \[0, 2\^63\)"):
        ck.verify_tree(**tree, seed=2**63)
    assert row_seeds(2**63 - 1, 1).tolist() == [2**63 - 1]
    with pytest.raises(ArgumentError, match="seed"):
        row_seeds(2**63, 1)
    assert _accepted(["generate", "--prompt", "3", "--seed", str(2**63 - 1)])
    assert not _accepted(["generate", "--prompt", "3", "--seed", str(2**63)])


def test_the_op_says_what_a_number_must_be():
    logits, drafts = torch.randn(1, 2, 8), torch.zeros(1, 2, dtype=torch.long)
    with pytest.raises(ValueError, match=r"^temperature must be a finite number >= 0, got inf$"):
        ck.verify(logits, drafts, None, temperature=math.inf)
    with pytest.raises(ValueError, match=r"^cfg_scale must be a finite number, got nan$"):
        ck.verify(logits, drafts, None, uncond_logits=logits, cfg_scale=math.nan)


def test_options_that_do_not_apply_are_named_in_good_grammar():
    with pytest.raises(ValueError, match="^--model digits ships its weights: --dtype does not apply$"):
        zoo.load("digits", dtype="float32")
    with pytest.raises(ValueError, match="^--model digits ships its weights: --dtype, --weights do not apply$"):
        zoo.load("digits", dtype="float32", weights="w")


# ----------------------------------------------------------------------------------------------------------------------
# pictures
# ----------------------------------------------------------------------------------------------------------------------
def _pixels(fig) -> tuple:
    fig.canvas.draw()
    return fig.canvas.get_renderer(), fig.bbox


@pytest.mark.parametrize("count", [1, 2, 16])
def test_maps_have_colour_bars_as_tall_as_the_maps_and_the_title_inside(count):
    import matplotlib.pyplot as plt

    maps = torch.rand(count, 16, 16)
    out = types.SimpleNamespace(entropy_map=maps * 4, accept_map=maps)
    title = "csd+maximal, prompt " + "red circle top-left; blue square center; yellow triangle bottom-right; on " \
                                     "noise, --seed 0: 16 images"
    fig = commands.maps_figure(out, commands._grid_columns(count), title)
    renderer, canvas = _pixels(fig)
    images = [ax for ax in fig.axes if ax.images]
    bars = [ax for ax in fig.axes if not ax.images]
    assert len(images) == 2 and len(bars) == 2
    for ax, bar in zip(images, bars):
        drawn = ax.images[0].get_window_extent(renderer)
        assert abs(bar.get_window_extent(renderer).height - drawn.height) <= 2, (bar.bbox, drawn)
    title_box = fig._suptitle.get_window_extent(renderer)
    assert canvas.x0 <= title_box.x0 and title_box.x1 <= canvas.x1 and title_box.y1 <= canvas.y1, title_box
    plt.close(fig)


@pytest.mark.parametrize("count", [1, 2, 3, 16])
def test_a_grid_is_as_wide_as_its_images(count, tmp_path):
    from PIL import Image

    images = np.full((count, 24, 24, 3), 40, np.uint8)
    path = tmp_path / "grid.png"
    long_title = "csd+maximal, prompt red circle top-left; blue square center; on noise, --seed 0: many images"
    commands._save_labelled(images, commands._grid_columns(count), str(path), long_title)
    pixels = np.asarray(Image.open(path).convert("RGB")).astype(int)
    tiles = np.argwhere((pixels == 40).all(-1))
    (top, left), (_, right) = tiles.min(0), tiles.max(0)
    gutter = pixels.shape[1] / (commands._grid_columns(count) * 25 + 1)  # one mosaic pixel, scaled
    assert right >= pixels.shape[1] - gutter - 2 and left <= gutter + 1, (left, right, pixels.shape)  # no empty half
    assert (pixels[:top].max(-1) < 100).any()  # the title, above the tiles


def test_the_bench_plot_draws_every_line_its_legend_names():
    import matplotlib.pyplot as plt

    rows = [bench.BenchRow(backend, batch, 16, vocab, probs, 1e-5 * batch, 1e-6, 1e-3)
            for backend in ("cpu", "torch") for vocab, batch in ((16384, 1), (8192, 4)) for probs in (True, False)]
    fig = bench.figure(rows, "CPU")  # --quick: one batch per panel
    renderer, canvas = _pixels(fig)
    (legend,) = fig.legends
    named = {text.get_text() for text in legend.get_texts()}
    for ax in fig.axes:
        drawn = {line.get_label() for line in ax.get_lines() if len(line.get_xdata()) and line.get_marker()
                 not in (None, "None", "")}
        assert drawn == named, (drawn, named)
        assert not legend.get_window_extent(renderer).overlaps(ax.get_window_extent(renderer))
    plt.close(fig)


def test_log_axes_of_the_sweep_plot_read_as_plain_numbers():
    import matplotlib.pyplot as plt

    result = _result()
    for label, frechet in zip(result["results"], (8.2, 8.9, 9.4)):  # within one decade: minor ticks get labels
        result["results"][label]["frechet"]["mean"] = frechet
    fig = frontier_plot.figure(result)
    fig.canvas.draw()
    labels = [t.get_text() for ax in fig.axes for axis in (ax.xaxis, ax.yaxis)
              for t in axis.get_majorticklabels() + axis.get_minorticklabels() if t.get_text()]
    assert labels and not [t for t in labels if "×" in t or "times" in t or "^" in t], labels
    plt.close(fig)


def test_the_frechet_distance_of_few_images_warns_nothing():
    from csd_kernels.zoo.frechet import frechet_distance

    rng = np.random.default_rng(0)
    few, more = rng.normal(size=(3, 48)), rng.normal(size=(5, 48))  # singular covariances
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert np.isfinite(frechet_distance(few, more))


def test_bench_announces_every_file_it_writes(tmp_path, monkeypatch, capsys):
    def fake_run(json_path, **kwargs):
        with open(json_path, "w") as f:
            json.dump({"benchmarks": []}, f)
        return [bench.BenchRow("torch", 1, 16, 64, True, 1e-5, 1e-6, 1e-3)]

    monkeypatch.setattr(bench, "run", fake_run)
    assert cli.main(["bench", "--backends", "torch", "--device", "cpu", "--out", str(tmp_path / "b")]) == 0
    out = capsys.readouterr().out
    assert f"wrote benchmark.json, verify.json, verify.csv, verify.png to {tmp_path / 'b'}" in out
    assert sorted(os.listdir(tmp_path / "b")) == ["benchmark.json", "verify.csv", "verify.json", "verify.png"]


def test_errors_md_lists_every_mode_in_its_mode_row():
    path = os.path.join(os.path.dirname(__file__), "..", "docs", "errors.md")
    (row,) = [line for line in open(path, encoding="utf-8") if line.startswith("| `mode` (`--mode`) |")]
    listed = row.split("|")[2].split("(")[0]
    assert [name.strip() for name in listed.split(",")] == list(MODES)


def test_a_mode_ending_in_plus_is_not_read_as_plus_plus_plus():
    assert run_label("lantern++") == f"lantern++/{DEFAULT_COUPLING}" and run_label("csd", "gumbel") == "csd+gumbel"
    assert all("+++" not in label for label, _, _ in commands.COMPARE_RUNS)
