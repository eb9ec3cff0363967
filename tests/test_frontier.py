"""csd sweep / csd_kernels.bench.frontier: the grid, the Pareto analysis, a small end-to-end sweep, bad input."""

import csv
import dataclasses
import json

import pytest

from csd_kernels.bench import frontier
from csd_kernels.bench.frontier import Setting
from csd_kernels.cli import commands as cli
from csd_kernels.cli import main as csd_main
from csd_kernels.zoo import DIGITS_MEASURES, Measure


def _row(passes, accuracy, frechet, std=0.0):
    return {"passes": {"mean": passes, "std": 0.0}, "accuracy": {"mean": accuracy, "std": std},
            "frechet": {"mean": frechet, "std": std}}


def test_grid():
    grid = frontier.settings()
    # ar, sjd x3, gsd; csd x couplings x λ x τ; sjd+maximal static, sjd+maximal+tree x trees, csd+maximal+tree x
    # trees x λ x τ
    assert len(grid) == 5 + 2 * 6 * 3 + 1 + 2 + 2 * 6 * 3
    assert len({s.label for s in grid}) == len(grid)
    chain_csd = [s.label for s in grid if s.mode == "csd" and s.entropy_coef == 0.0 and s.tree is None]
    tree_csd = [s.label for s in grid if s.mode == "csd" and s.entropy_coef == 0.0 and s.tree is not None]
    assert [s.label for s in grid if s.lossless] == ["ar", "sjd+independent", "sjd+maximal", "sjd+gumbel",
                                                     *chain_csd, "sjd+maximal static", "sjd+maximal+tree 2x2",
                                                     "sjd+maximal+tree 3x2", *tree_csd]
    assert len(tree_csd) == 2 * 3
    tree_rows = [s for s in grid if s.tree is not None or s.static]
    assert tree_rows[0].generate_kwargs() == dict(mode="sjd", coupling="maximal", static=True)
    assert tree_rows[2].generate_kwargs() == dict(mode="sjd", coupling="maximal", static=True, tree=(3, 2))
    assert grid[-1].generate_kwargs() == dict(mode="csd", coupling="maximal", entropy_coef=1.0, tvd_threshold=1.0,
                                              static=True, tree=(3, 2))
    assert Setting("x", "csd", "maximal", 0.25, 0.3).generate_kwargs() == dict(
        mode="csd", coupling="maximal", entropy_coef=0.25, tvd_threshold=0.3)
    assert Setting("ar", "ar").generate_kwargs() == dict(mode="ar", coupling=None)


def test_tree_settings():
    """--trees: one sjd+maximal+tree per tree; csd+maximal+tree over λ × τ once csd is a tree mode (maximal only)."""
    grid = frontier.settings((0.0, 0.5), (0.3,), ("independent", "maximal"), trees=((2, 3),),
                             tree_modes=("sjd", "csd"))
    trees = [s for s in grid if s.tree is not None]
    assert [s.label for s in grid if s.static] == ["sjd+maximal static"]
    assert [s.label for s in trees] == ["sjd+maximal+tree 2x3", "csd+maximal+tree 2x3 λ=0 τ=0.3",
                                        "csd+maximal+tree 2x3 λ=0.5 τ=0.3"]
    assert [s.lossless for s in trees] == [True, True, False]
    assert trees[2].generate_kwargs() == dict(mode="csd", coupling="maximal", entropy_coef=0.5, tvd_threshold=0.3,
                                              static=True, tree=(2, 3))
    assert not [s for s in frontier.settings(couplings=("independent",), tree_modes=("csd",)) if s.tree]
    assert not [s for s in frontier.settings(trees=()) if s.tree or s.static]


def test_a_smaller_grid_keeps_the_chosen_sjd_couplings():
    """benchmarks/frontier_scenes.py's grid: sjd with the maximal next drafts alone, no trees."""
    grid = frontier.settings((0.25,), (0.65,), ("maximal",), trees=(), sjd_couplings=("maximal",))
    assert [s.label for s in grid] == ["ar", "sjd+maximal", "gsd", "csd+maximal λ=0.25 τ=0.65"]
    assert grid[1].generate_kwargs() == dict(mode="sjd", coupling="maximal")


def test_rule_grids_sweep_each_rule_over_its_own_parameters():
    """--grid: each relaxed rule other than csd and gsd over the product of its swept parameters, the rest at its
    defaults, in its own mode with the default coupling; labels from the table."""
    grids = frontier.rule_grids({"lantern_delta": (0.05, 0.2), "lantern_k": (4, 8), "arsample_scale": (4.5,)})
    assert grids == {"arsample": [{"arsample_scale": 4.5}],
                     "lantern": [{"lantern_delta": 0.05, "lantern_k": 4}, {"lantern_delta": 0.05, "lantern_k": 8},
                                 {"lantern_delta": 0.2, "lantern_k": 4}, {"lantern_delta": 0.2, "lantern_k": 8}]}
    rules = frontier.rule_grids({"lantern_lambda": (2.0,), "arsample_offset": (0.2,)})
    grid = frontier.settings((0.5,), (0.65,), ("maximal",), trees=(), sjd_couplings=("maximal",), rules=rules,
                             vocab=16384)
    assert [s.label for s in grid[4:]] == ["arsample+maximal c=9 s0=0.2", "lantern++/maximal λ=2 k=10"]
    # a lantern rule's default k is the codebook's (config.acceptance.default_lantern_k): labelled as it runs
    assert frontier.rule_settings({"lantern": [{}]}, 512)[0].label == "lantern+maximal δ=0.1 k=32"
    with pytest.raises(ValueError, match="lantern: its default lantern_k depends on the codebook; pass vocab="):
        frontier.rule_settings({"lantern": [{}]})
    assert grid[-1].generate_kwargs() == dict(mode="lantern++", coupling="maximal", lantern_lambda=2.0,
                                              gather_distortion=True)  # the exact distortion axis
    assert grid[-1].rule == "lantern++" and not grid[-1].lossless
    with pytest.raises(ValueError, match="entropy_coeff: not a rule parameter"):
        frontier.rule_grids({"entropy_coeff": (0.1,)})


def test_windows_repeat_the_chain_settings():
    """--windows 32: sjd (each coupling) and csd again at W 32, labelled, the window passed to generate()."""
    grid = frontier.settings((0.5,), (0.65,), ("maximal",), trees=(), sjd_couplings=("independent", "maximal"),
                             windows=(32,))
    assert [s.label for s in grid if s.window] == ["sjd+independent W32", "sjd+maximal W32",
                                                  "csd+maximal λ=0.5 τ=0.65 W32"]
    assert grid[-1].generate_kwargs() == dict(mode="csd", coupling="maximal", entropy_coef=0.5, tvd_threshold=0.65,
                                              window=32)
    assert "window" not in grid[1].generate_kwargs()  # the model's own window


def test_summarise_carries_the_images_standard_error():
    records = [{"passes": 100.0, "passes_se": 3.0, "row_passes": [99.0, 101.0], "adherence": 0.5},
               {"passes": 110.0, "passes_se": 4.0, "row_passes": [109.0, 111.0], "adherence": 0.7}]
    summary = frontier.summarise(records)
    assert summary["passes"] == {"mean": 105.0, "std": 5.0, "se": 2.5}  # sqrt(3² + 4²) / 2
    assert summary["adherence"] == pytest.approx({"mean": 0.6, "std": 0.1})
    assert set(summary) == {"passes", "adherence"}


def test_pareto_and_answers():
    rows = {"ar": _row(256, 0.90, 10.0, std=0.02),  # band: accuracy >= 0.88, Fréchet <= 10.02
            "a": _row(80, 0.89, 10.0),  # 3.2x, inside the band
            "b": _row(90, 0.80, 30.0),  # dominated by a
            "c": _row(60, 0.70, 40.0),  # fastest, outside the band
            "d": _row(100, 0.95, 9.0)}  # best quality
    grid = {"ar": Setting("ar", "ar"), "a": Setting("a", "csd", "maximal", 0.1, 0.3),
            "b": Setting("b", "sjd", "maximal"), "c": Setting("c", "gsd"), "d": Setting("d", "sjd", "gumbel")}
    out = frontier.answers(rows, grid, DIGITS_MEASURES)
    assert out["pareto"] == ["c", "a", "d"]  # by passes; ar is dominated by d
    assert out["fast_inside_ar_band"] == ["a"]  # c is 4.3x but outside the band, d is 2.6x
    assert out["best_lossless"] == "b"  # the lossless setting with the fewest passes (d: 100, b: 90)
    assert not frontier.inside_band(rows["b"], rows["ar"], DIGITS_MEASURES)


def test_one_seed_band_is_ars_standard_error_over_the_images():
    """With one seed the spread over seeds is 0: the band is then ar's mean ± its standard error over the images."""
    ar = {"passes": {"mean": 256.0, "std": 0.0}, "accuracy": {"mean": 0.90, "std": 0.0, "se": 0.03},
          "frechet": {"mean": 10.0, "std": 0.0, "se": 1.0}}
    close = _row(80, 0.88, 10.5)
    assert frontier.inside_band(close, ar, DIGITS_MEASURES, spread="se")
    assert not frontier.inside_band(close, ar, DIGITS_MEASURES)  # by the seeds' spread (0): below ar's mean
    assert not frontier.inside_band(_row(80, 0.86, 10.5), ar, DIGITS_MEASURES, spread="se")
    grid = {"ar": Setting("ar", "ar"), "a": Setting("a", "csd", "maximal", 0.1, 0.3)}
    assert frontier.answers({"ar": ar, "a": close}, grid, DIGITS_MEASURES, spread="se")["fast_inside_ar_band"] == ["a"]


def test_small_sweep(tmp_path):
    grid = [Setting("ar", "ar"), Setting("sjd+maximal", "sjd", "maximal"),
            Setting("csd+maximal λ=0 τ=0.65", "csd", "maximal", 0.0, 0.65),
            Setting("csd+maximal λ=1 τ=1", "csd", "maximal", 1.0, 1.0),
            Setting("sjd+maximal+tree 3x2", "sjd", "maximal", tree=(3, 2))]
    lines = []
    result = frontier.sweep("digits", per_class=1, seeds=(0, 1), workers=1, grid=grid, classes=("1", "7"),
                            progress=lines.append)
    rows = result["results"]
    # a line per setting as its last seed finishes, in the grid's order, with its passes
    assert [line.split("] ")[1].split(":")[0] for line in lines] == [s.label for s in grid]
    assert lines[0].startswith("[1/5] ar: 256.0 passes/image, ") and lines[-1].startswith("[5/5] sjd+maximal+tree")
    assert rows["ar"]["passes"] == {"mean": 256.0, "std": 0.0, "se": 0.0}
    # λ = 0 is strict verification: the same streams give the same passes and images as sjd with the same coupling
    per_seed = {(r["label"], r["seed"]): r for r in result["per_seed"]}
    for seed in (0, 1):
        a, b = per_seed[("sjd+maximal", seed)], per_seed[("csd+maximal λ=0 τ=0.65", seed)]
        assert a["passes"] == b["passes"] and a["frechet"] == b["frechet"] and b["distortion"] == 0.0
    assert rows["csd+maximal λ=1 τ=1"]["distortion"]["mean"] > 0.0
    tree = rows["sjd+maximal+tree 3x2"]  # lossless, and its own passes (another loop, other streams)
    assert tree["distortion"]["mean"] == 0.0 and tree["passes"]["mean"] < 256
    assert tree["passes"] != rows["sjd+maximal"]["passes"]
    assert result["best_lossless"] in ("sjd+maximal", "csd+maximal λ=0 τ=0.65", "sjd+maximal+tree 3x2")
    assert result["heldout"]["accuracy"]["mean"] >= 0.5
    paths = frontier.save(result, str(tmp_path / "f"))
    assert json.load(open(paths["json"]))["pareto"] == result["pareto"]
    table = list(csv.DictReader(open(paths["csv"])))
    assert [r["label"] for r in table] == [s.label for s in grid]
    assert [r["tree"] for r in table] == ["", "", "", "", "3x2"]
    assert [r["static"] for r in table] == ["0", "0", "0", "0", "1"]
    assert open(paths["png"], "rb").read(4) == b"\x89PNG"


@pytest.mark.parametrize("argv, message", [
    (["--couplings", "maximal,best"], "--couplings best: expected one of"),
    (["--lambdas", "0,half"], "--lambdas: expected comma-separated numbers"),
    (["--model", "llamagen"], "only digits and scenes have one"),
    (["--model", "nope"], "unknown model"),
    (["--per-class", "0"], "--per-class 0: expected an int in [1, "),
    (["--trees", "3x2,3"], "--trees: expected comma-separated KxD"),
    (["--trees", "0x2"], "--trees (0, 2): expected K >= 1 and D >= 1"),
    (["--trees", "4x3"], "--trees (4, 3): expected a tree whose (K^D - 1)/(K - 1) = 21 draft nodes fit"),
    (["--grid", "entropy_coef=0.1"], "--grid 'entropy_coef=0.1': expected PARAM=V1,V2,... with PARAM one of "
     "arsample_scale, arsample_offset, lantern_delta, lantern_k, lantern_lambda (csd: --lambdas/--taus"),
    (["--grid", "lantern_delta=0.1,2"], "--grid lantern_delta 2.0: expected a finite number in [0, 1]"),
])
def test_sweep_bad_input(argv, message, capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(frontier, "sweep", lambda *args, **kwargs: pytest.fail("the sweep ran before the check"))
    assert csd_main(["sweep", "--out", str(tmp_path / "f"), *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_digits_outputs_are_unchanged_by_the_measures():
    """The measures refactor keeps digits' table, CSV columns, compare and run tables, text for text: the Pareto rows
    of the committed frontier (written by the code before it) and literals the code printed (since then the tables
    name sjd's and csd's coupling, show '-' for a measure without a value and say the default coupling)."""
    from csd_kernels.runner.summary import format_table as run_table

    result = json.load(open("docs/img/digits_frontier.json"))
    result.update(measures=[dataclasses.asdict(m) for m in DIGITS_MEASURES], ceiling="held-out real digits")
    assert frontier.format_table(result, labels=result["pareto"]) == result["pareto_table"]
    r = lambda mean, std: {"mean": mean, "std": std}  # noqa: E731
    results = {"ar": {"passes": r(256.0, 0.0), "wall": r(1.234, 0.05), "distortion": r(0.0, 0.0),
                      "accuracy": r(0.9625, 0.0125), "frechet": r(4.01, 0.33), "speedup": 1.0},
               "csd+maximal": {"passes": r(64.25, 1.5), "wall": r(0.4, 0.01), "distortion": r(0.01234, 0.001),
                               "accuracy": r(0.875, 0.025), "frechet": r(6.9, 0.5), "speedup": 3.98}}
    assert cli.format_compare(results, DIGITS_MEASURES) == (
        "run              passes/img speed-up       wall s distortion      accuracy       Fréchet\n" + "-" * 88 + "\n"
        "ar                256.0±0.0    1.00x    1.23±0.05     0.0000   0.963±0.013     4.01±0.33\n"
        "csd+maximal        64.2±1.5    3.98x    0.40±0.01     0.0123   0.875±0.025     6.90±0.50\n"
        "sjd, csd, arsample, lantern, lantern++ draw their next drafts with the maximal coupling unless told otherwise "
        "(csd generate --mode csd runs csd+maximal)")
    mode = lambda passes, std, speedup, wall, dist, **quality: {  # noqa: E731
        "images": 20, "forward_passes_per_image": r(passes, std), "speedup_vs_ar": speedup, "wall_seconds": wall,
        "wall_seconds_per_image": wall / 20, "mean_distortion": dist, **quality}
    summary = {"world_size": 1, "measures": [dataclasses.asdict(m) for m in DIGITS_MEASURES],
               "per_mode": {"ar": mode(256.0, 0.0, 1.0, 11.5, 0.0, accuracy=0.95, frechet=4.25),
                            "csd": mode(64.3, 3.2, 3.98, 3.5, 0.0123, accuracy=0.85)}}
    assert run_table(summary) == (
        "mode         images       passes/img  speed-up    wall s    s/img distortion   accuracy    Fréchet\n"
        + "-" * 98 + "\n"
        "ar               20     256.0±0.0        1.00x     11.50    0.575     0.0000      0.950       4.25\n"
        "csd+maximal      20      64.3±3.2        3.98x      3.50    0.175     0.0123      0.850          -\n"
        "-: no value of Fréchet for these images and prompts\n"
        "(1 process(es); wall s = generation seconds summed over ranks; speed-up = ar passes / passes per image)")


def test_compare_table_takes_the_models_measures():
    """Scenes' columns; a measure a run could not give (no background named in the prompt) is a dash, not a crash."""
    up, down, bg = (Measure("adherence", "adherence", True, "a"), Measure("frechet", "Fréchet", False, "f", ".2f"),
                    Measure("background_accuracy", "background", True, "b"))
    r = lambda mean: {"mean": mean, "std": 0.0}  # noqa: E731
    results = {"ar": {"passes": r(576.0), "wall": r(9.0), "distortion": r(0.0), "adherence": r(0.75),
                      "frechet": r(3.5), "speedup": 1.0}}
    table = cli.format_compare(results, (up, down, bg)).splitlines()
    assert table[0].split()[-3:] == ["adherence", "Fréchet", "background"]
    assert table[2].split()[-3:] == ["0.750±0.000", "3.50±0.00", "-"]


def test_band_and_pareto_follow_the_measures():
    """Three measures, two directions: a setting outside ar's band on any one of them is outside; the Pareto set and
    csd against gsd by every measure."""
    up, down, bg = (Measure("adherence", "adherence", True, "a"), Measure("frechet", "Fréchet", False, "f"),
                    Measure("background_accuracy", "background", True, "b"))

    def row(passes, a, f, b, std=0.0):
        return {"passes": {"mean": passes, "std": 0.0}, "adherence": {"mean": a, "std": std},
                "frechet": {"mean": f, "std": std}, "background_accuracy": {"mean": b, "std": std}}

    rows = {"ar": row(576, 0.80, 10.0, 0.90, std=0.02),
            "csd a": row(150, 0.79, 10.01, 0.89),  # inside on all three
            "csd b": row(120, 0.80, 9.0, 0.85),  # the background outside
            "gsd": row(150, 0.70, 12.0, 0.89),  # dominated by csd a
            "gsd k=4 δ=0.05": row(100, 0.60, 20.0, 0.5)}  # fastest: dominated by nothing
    grid = {"ar": Setting("ar", "ar"), "csd a": Setting("csd a", "csd", "maximal", 0.1, 0.3),
            "csd b": Setting("csd b", "csd", "maximal", 0.5, 0.65), "gsd": Setting("gsd", "gsd"),
            "gsd k=4 δ=0.05": Setting("gsd k=4 δ=0.05", "gsd", group_rank=4, group_delta=0.05)}
    out = frontier.answers(rows, grid, (up, down, bg))
    assert out["fast_inside_ar_band"] == ["csd a"] and out["fewest_inside_ar_band"] == "csd a"
    assert frontier.inside_band(rows["csd b"], rows["ar"], (up, down))  # the background decides
    assert out["pareto"] == ["gsd k=4 δ=0.05", "csd b", "csd a", "ar"]  # gsd: dominated by csd a
    assert out["csd_vs_gsd"] == {"gsd_dominated_by": {"gsd": ["csd a"], "gsd k=4 δ=0.05": []},
                                 "csd_front_dominated_by": {"csd b": [], "csd a": []}}
    assert frontier.answers(rows, grid, (up, down))["fewest_inside_ar_band"] == "csd b"


def test_digits_heldout_quality():
    from csd_kernels import zoo
    from csd_kernels.zoo.digits import quality

    entry = zoo.load("digits")
    _, _, _, y_test = quality.data_split()
    prompts = [str(c) for c in y_test]  # every held-out digit once
    assert entry.heldout_quality(prompts, 0)["accuracy"] == pytest.approx(quality.heldout_accuracy(round_trip=True))
    with pytest.raises(ValueError, match="class 3: .* held-out digits"):
        entry.heldout_quality(prompts + ["3"], 0)


# ------------------------------------------------------------------ scenes: a tiny random-weight model of its format
@pytest.fixture(scope="module")
def tiny_scenes(tmp_path_factory):
    """A scenes-format checkpoint (config.json, model.safetensors) of a tiny random-weight GPT: no real model, the
    plumbing only; it runs with the shipped tokenizer."""
    from csd_kernels.zoo.scenes.model import build_lm, save_lm

    folder = tmp_path_factory.mktemp("tiny_scenes")
    save_lm(build_lm(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                     num_key_value_heads=2), folder)
    return str(folder)


@pytest.fixture
def small_basis(monkeypatch):
    """The scenes Fréchet features on 200 rendered scenes instead of 2000 (8 CPU s): the plumbing, not the measure."""
    import functools

    from csd_kernels.zoo.scenes import checker

    full = checker._basis
    monkeypatch.setattr(checker, "_basis", functools.lru_cache(maxsize=1)(lambda: full.__wrapped__(n=200)))


@pytest.mark.filterwarnings("ignore:Matrix is singular")  # a Fréchet distance of 2 images in 48 dimensions
def test_scenes_sweep_end_to_end(tiny_scenes, small_basis, tmp_path, capsys):
    """csd sweep --model scenes: the fixed prompt mix, the scenes measures in every output, gsd's own grid, the
    ceiling (rendered scenes through the tokenizer)."""
    prefix = tmp_path / "f"
    assert csd_main(["sweep", "--model", "scenes", "--weights", tiny_scenes, "--images", "2", "--seeds", "1",
                     "--lambdas", "0.5", "--taus", "0.65", "--couplings", "maximal", "--trees", "none",
                     "--gsd-ranks", "4", "--workers", "1", "--out", str(prefix)]) == 0
    out = capsys.readouterr().out
    result = json.load(open(f"{prefix}.json"))
    assert [m["name"] for m in result["measures"]] == ["adherence", "frechet", "background_accuracy"]
    assert result["images"] == 2 and result["per_class"] is None and result["ceiling"].startswith("rendered scenes")
    rows = result["results"]
    assert list(rows) == ["ar", "sjd+independent", "sjd+maximal", "sjd+gumbel", "gsd", "gsd k=4 δ=0.15",
                          "csd+maximal λ=0.5 τ=0.65"]
    assert rows["ar"]["passes"]["mean"] == 576 and rows["sjd+independent"]["distortion"]["mean"] == 0.0
    # its own group, not gsd's defaults (on this random-weight model p is nearly flat: neighbours in rank have nearly
    # equal p, so k hardly moves a(x) and the passes may tie)
    assert result["settings"]["gsd k=4 δ=0.15"]["group_rank"] == 4 and result["settings"]["gsd"]["group_rank"] is None
    assert result["settings"]["gsd k=4 δ=0.15"]["group_rank"] == 4
    assert result["heldout"]["adherence"]["mean"] == 1.0  # two rendered scenes read back exactly
    assert set(result["csd_vs_gsd"]["gsd_dominated_by"]) == {"gsd", "gsd k=4 δ=0.15"}
    assert "| adherence | Fréchet | background |" in out and "| rendered scenes, tokenizer round trip |" in out
    header = next(csv.reader(open(f"{prefix}.csv")))
    assert "adherence_mean" in header and "background_accuracy_std" in header and "accuracy_mean" not in header
    assert open(f"{prefix}.png", "rb").read(4) == b"\x89PNG"


def test_scenes_refuses_missing_weights(tmp_path, monkeypatch, capsys):
    """No random-weight model passes for the real one: without its files the scenes entry is one line saying how to
    train them (the shipped folder and --weights alike)."""
    from csd_kernels import zoo
    from csd_kernels.zoo.scenes import model

    monkeypatch.setattr(model, "WEIGHTS_DIR", tmp_path)  # the package without its trained weights
    zoo.load.cache_clear()  # an earlier test's load of the shipped model would answer instead
    with pytest.raises(ValueError, match="the shipped weights, .*: no config.json and no model.safetensors in the "
                                         "folder .*python -m csd_kernels.zoo.scenes.train --out DIR") as e:
        zoo.load("scenes")
    assert "\n" not in str(e.value)
    assert csd_main(["generate", "--model", "scenes", "--weights", str(tmp_path), "--prompt", "red circle top",
                     "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "--weights" in err and "zoo.scenes.train" in err and err.count("\n") == 1


def test_scenes_refuses_a_model_of_another_world(tmp_path, capsys):
    """A model whose prompt vocabulary is another world's (the three-kind model: 4126 tokens) would read every
    background token wrong: one line naming the flag, the file and the two vocabularies, exit 2."""
    import shutil

    from csd_kernels.zoo.scenes import model

    for name in ("config.json", "model.safetensors", "tokenizer.safetensors"):
        shutil.copy(model.WEIGHTS_DIR / name, tmp_path / name)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "vocab_size": model.VOCAB_SIZE - 2}))
    assert csd_main(["generate", "--model", "scenes", "--weights", str(tmp_path), "--prompt", "red circle top",
                     "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert f"--weights {tmp_path / 'config.json'}: a model of vocabulary {model.VOCAB_SIZE - 2}" in err
    assert f"has {model.VOCAB_SIZE} (5 backgrounds" in err and err.count("\n") == 1
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("argv, message", [
    (["--model", "scenes", "--per-class", "2"], "--per-class does not apply to --model scenes"),
    (["--model", "digits", "--images", "20"], "--images does not apply to --model digits"),
    (["--model", "scenes", "--images", "1"], "--images 1: expected an int in [2, 100000]"),
    (["--gsd-ranks", "0"], "--gsd-ranks 0: expected an int in [1, 16777216]"),  # an exact float32 in rule_params
    (["--gsd-ranks", "4.5"], "--gsd-ranks: expected comma-separated numbers"),
    (["--gsd-deltas", "0.1,-1"], "--gsd-deltas -1.0: expected a finite number >= 0"),
    (["--model", "digits", "--weights", "/nowhere"], "--model digits ships its weights: --weights does not apply"),
    (["--model", "scenes", "--weights", "/nowhere"], "--weights /nowhere: no such folder; expected a scenes model"),
])
def test_sweep_bad_flags_for_scenes(argv, message, capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(frontier, "sweep", lambda *args, **kwargs: pytest.fail("the sweep ran before the check"))
    assert csd_main(["sweep", "--out", str(tmp_path / "f"), *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
