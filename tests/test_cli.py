"""The `csd` command and the shipped digits model driven through the generic decoding loop."""

import functools
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from PIL import Image

import csd_kernels as ck
from csd_kernels import cli, zoo
from csd_kernels.cli import commands


@pytest.fixture(scope="module")
def digits():
    return zoo.load("digits")


def test_shipped_model_generates_valid_images_for_every_class(digits):
    prompts = [str(c) for c in range(10)]
    out = ck.generate(digits.model, **digits.prompt_inputs(prompts), mode="csd", window=16, seed=0, **digits.defaults)
    assert out.tokens.shape == (10, 256) and out.tokens.min() >= 0 and out.tokens.max() < 512
    assert out.images.shape == (10, 32, 32, 3) and out.images.dtype == torch.uint8
    assert out.forward_passes < 256  # speculative decoding did accept drafts
    metrics = digits.quality(out.tokens, prompts)
    assert 0.0 <= metrics["accuracy"] <= 1.0 and np.isfinite(metrics["frechet"])


def test_generate_writes_images_maps_and_stats(tmp_path, capsys):
    out_dir = tmp_path / "gen"
    assert cli.main(["generate", "--model", "digits", "--prompt", "7", "--mode", "sjd", "--num", "3", "--seed", "1",
                     "--out", str(out_dir), "--quiet"]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith("sjd+maximal: 3 images, ")  # the run as the tables name it
    assert printed[1] == f"wrote img_000.png … img_002.png (3 files), grid.png, maps.png, stats.json to {out_dir}"
    names = sorted(os.listdir(out_dir))
    assert names == ["grid.png", "img_000.png", "img_001.png", "img_002.png", "maps.png", "stats.json"]
    assert Image.open(out_dir / "img_000.png").size == (32, 32)
    stats = json.loads((out_dir / "stats.json").read_text())
    assert stats["mode"] == "sjd" and stats["num"] == 3 and stats["mean_distortion"] == pytest.approx(0, abs=1e-6)
    assert 1 <= stats["forward_passes_per_image"] <= stats["forward_passes"] <= 256
    assert stats["tokens_per_pass"] == pytest.approx(256 / stats["forward_passes_per_image"])
    assert set(stats["timings"]) >= {"model", "verify", "rest", "total"}
    assert set(stats["quality"]) == {"accuracy", "frechet"}
    # each pass count says what it counts (at B > 1 the batch's and the images' differ)
    assert set(stats["notes"]) >= {"forward_passes", "forward_passes_per_image", "prefill_passes"}


def test_generate_runs_a_tree(tmp_path, monkeypatch, capsys):
    """--tree K,D reaches generate() (in the static loop) and stats.json records it."""
    calls = []
    real = commands.generate
    recording = functools.wraps(real)(lambda *args, **kw: calls.append(kw) or real(*args, **kw))  # its signature
    monkeypatch.setattr(commands, "generate", recording)
    out_dir = tmp_path / "tree"
    assert cli.main(["generate", "--model", "digits", "--prompt", "7", "--mode", "sjd", "--num", "1", "--tree", "2,2",
                     "--out", str(out_dir), "--quiet"]) == 0
    assert calls[0]["tree"] == (2, 2) and calls[0]["static"] is True
    assert capsys.readouterr().out.startswith("sjd+maximal: 1 image, ")  # (was "1 images")
    stats = json.loads((out_dir / "stats.json").read_text())
    assert stats["parameters"]["tree"] == [2, 2] and stats["parameters"]["static"] is True
    assert stats["forward_passes_per_image"] < 256


def test_run_takes_a_tree_for_its_sjd_items(tmp_path, capsys):
    """csd run --tree K,D: sjd (and csd) items run the tree (recorded per item and in run.json), ar items the chain;
    a rerun without the tree is refused (another run)."""
    from csd_kernels.runner.files import item_paths

    (tmp_path / "prompts.txt").write_text("7\n")
    out = tmp_path / "run"
    argv = ["run", "--prompts", str(tmp_path / "prompts.txt"), "--modes", "ar,sjd", "--quiet", "--out", str(out)]
    assert cli.main(argv + ["--tree", "2,2"]) == 0
    assert json.loads((out / "run.json").read_text())["tree"] == [2, 2]
    records = {mode: json.loads(open(item_paths(str(out), mode, 0)[1]).read()) for mode in ("ar", "sjd")}
    assert records["sjd"]["tree"] == [2, 2] and records["ar"]["tree"] is None
    assert records["sjd"]["forward_passes"] < records["ar"]["forward_passes"] == 256
    capsys.readouterr()
    assert cli.main(argv) == 2 and "--tree None (the run has 2,2)" in capsys.readouterr().err


def test_quality_of_a_single_image_has_no_frechet_distance(digits):
    tokens = ck.generate(digits.model, **digits.prompt_inputs(["4"]), mode="csd", seed=0, **digits.defaults).tokens
    quality = digits.quality(tokens, ["4"])
    assert quality["frechet"] is None and 0 <= quality["accuracy"] <= 1


def test_compare_reports_every_run_and_writes_the_side_by_side(tmp_path, capsys):
    out_dir = tmp_path / "cmp"
    assert cli.main(["compare", "--model", "digits", "--prompt", "1", "--num", "2", "--seeds", "2", "--window", "8",
                     "--out", str(out_dir), "--quiet"]) == 0
    printed = capsys.readouterr()
    table = printed.out
    report = json.loads((out_dir / "compare.json").read_text())
    runs = len(commands.COMPARE_RUNS)  # with --quiet still a line per run as it finishes, in order
    lines = [line for line in printed.err.splitlines() if line.startswith("[")]
    assert [line.split("] ")[1].split(":")[0] for line in lines] == list(report["results"])
    assert lines[0].startswith(f"[1/{runs}] ar: 256.0 passes/image, ") and lines[-1].startswith(f"[{runs}/{runs}] ")
    seconds = [int(line.rsplit(", ", 1)[1].split(" s ")[0]) for line in lines]
    assert seconds == sorted(seconds)  # the time since the compare began, not the last run's
    assert list(report["results"]) == [label for label, _, _ in commands.COMPARE_RUNS]
    for label in report["results"]:
        assert label in table
    assert report["results"]["ar"]["passes"]["mean"] == 256 and report["results"]["ar"]["speedup"] == 1.0
    assert report["results"]["sjd+independent"]["distortion"]["mean"] == pytest.approx(0, abs=1e-6)
    assert Image.open(out_dir / "compare.png").size[1] > Image.open(out_dir / "compare.png").size[0] / 2


def test_compare_png_labels_every_row_with_its_mode(tmp_path):
    rows = [np.zeros((2, 8, 8, 3), np.uint8) for _ in range(3)]
    for tiles in rows:
        tiles[..., 1] = 200  # green tiles: the labels are grey levels, the gutters white
    path = tmp_path / "compare.png"
    commands._save_labelled(np.concatenate(rows), 2, str(path), "prompt 7", labels=["ar", "sjd+maximal", "csd"],
                            scale=4)
    image = np.asarray(Image.open(path).convert("RGB")).astype(int)
    top, left = np.argwhere((image[..., 0] == 0) & (image[..., 1] == 200)).min(0)
    text = image.max(-1) < 100
    assert text[:top].any()  # the title
    for row in range(3):
        assert text[top + row * 9 * 4: top + row * 9 * 4 + 8 * 4, :left].any(), f"row {row} has no label"
    assert not text[:, left:].any() and image.shape[1] >= left + 2 * 9 * 4  # the tiles right of the labels


def test_bench_writes_json_csv_and_plot(tmp_path):
    from csd_kernels.bench import op as bench

    rows = bench.run(shapes=[(1, 4, 64)], json_path=str(tmp_path / "benchmark.json"))
    assert {r.backend for r in rows} == {name for name in ck.available_backends("cpu") if name != "triton"}
    assert {r.return_probs for r in rows} == {True, False} and all(r.read_once_seconds > 0 for r in rows)
    raw = json.loads((tmp_path / "benchmark.json").read_text())  # pytest-benchmark's own JSON, baselines as rows
    assert {b["extra_info"]["kind"] for b in raw["benchmarks"]} == {"read-once", "authors-loop", "verify"}
    paths = bench.save(rows, str(tmp_path), "test")
    assert json.loads(open(paths["json"]).read())["rows"][0]["vocab"] == 64
    assert open(paths["csv"]).read().startswith("backend,batch,length,vocab")
    assert Image.open(paths["png"]).size[0] > 100


@pytest.mark.parametrize(
    "argv, message",
    [
        (["generate", "--model", "janus", "--prompt", "7"], "unknown model"),
        (["generate", "--model", "digits", "--prompt", "12"], "class id 0..9"),
        (["generate", "--model", "digits", "--prompt", "seven"], "class id 0..9"),
        (["compare", "--model", "digits", "--prompt", "-1"], "class id 0..9"),
        (["compare", "--model", "digits", "--prompt", "7", "--num", "1"], "--num 1: expected an int in [2, 1024]"),
        (["generate", "--model", "digits", "--prompt", "7", "--out", "/proc/csd-out"], "--out"),
        (["generate", "--model", "digits", "--prompt", "1" * 100_000], "--prompt: prompt '1111"),
        (["generate", "--model", "digits", "--prompt", "\uff14"], "prompt '\uff14': the digits model takes a class id"),
        (["generate", "--model", "digits", "--prompt", "7", "--tree", "100,100"],
         "a tree whose (K^D - 1)/(K - 1) (over 1,000,000) draft nodes fit in the W - 1 = 15 draft slots"),
        (["generate", "--model", "digits", "--prompt", "7", "--mode", "lantern", "--lantern-k", "600"],
         "--lantern-k 600: expected an int in [1, 511] for --model digits"),
        (["compare", "--model", "digits", "--prompt", "7", "--lantern-k", "512"],
         "--lantern-k 512: expected an int in [1, 511] for --model digits"),
    ],
)
def test_clear_errors(argv, message, capsys, tmp_path):
    argv = argv if "--out" in argv else argv + ["--out", str(tmp_path / "out")]
    assert cli.main(argv + ["--quiet"]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err
    assert len(err) < 400 and "int_max_str_digits" not in err and not (tmp_path / "out").exists()


def test_unknown_mode_is_rejected_by_the_parser(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["generate", "--model", "digits", "--prompt", "7", "--mode", "fast"])
    assert exc.value.code == 2 and "invalid choice: 'fast'" in capsys.readouterr().err


def test_console_script_module_entry_point():
    result = subprocess.run([sys.executable, "-m", "csd_kernels", "--help"], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0 and "generate" in result.stdout and "compare" in result.stdout
