"""csd sweep / csd_kernels.frontier: the grid, the Pareto analysis, a small end-to-end sweep, bad input."""

import csv
import json

import pytest

from csd_kernels import cli, frontier
from csd_kernels.frontier import Setting
from csd_kernels.zoo import DIGITS_MEASURES


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
    assert [s.label for s in grid if s.lossless] == ["ar", "sjd", "sjd+maximal", "sjd+gumbel"] + chain_csd + [
        "sjd+maximal static", "sjd+maximal+tree 2x2", "sjd+maximal+tree 3x2"] + tree_csd
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


def test_small_sweep(tmp_path):
    grid = [Setting("ar", "ar"), Setting("sjd+maximal", "sjd", "maximal"),
            Setting("csd+maximal λ=0 τ=0.65", "csd", "maximal", 0.0, 0.65),
            Setting("csd+maximal λ=1 τ=1", "csd", "maximal", 1.0, 1.0),
            Setting("sjd+maximal+tree 3x2", "sjd", "maximal", tree=(3, 2))]
    result = frontier.sweep("digits", per_class=1, seeds=(0, 1), workers=1, grid=grid, classes=("1", "7"))
    rows = result["results"]
    assert rows["ar"]["passes"] == {"mean": 256.0, "std": 0.0}
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
])
def test_sweep_bad_input(argv, message, capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(frontier, "sweep", lambda *args, **kwargs: pytest.fail("the sweep ran before the check"))
    assert cli.main(["sweep", "--out", str(tmp_path / "f"), *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_digits_heldout_quality():
    from csd_kernels import zoo
    from csd_kernels.zoo.digits import quality

    entry = zoo.load("digits")
    _, _, _, y_test = quality._data_split()
    prompts = [str(c) for c in y_test]  # every held-out digit once
    assert entry.heldout_quality(prompts, 0)["accuracy"] == pytest.approx(quality.heldout_accuracy(round_trip=True))
    with pytest.raises(ValueError, match="class 3: .* held-out digits"):
        entry.heldout_quality(prompts + ["3"], 0)
