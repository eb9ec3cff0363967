"""``csd run``: sharded (torchrun, gloo), resumable generation on the digits model (CPU).

The torchrun jobs run as subprocesses (``python -m torch.distributed.run --standalone --nproc-per-node 2 -m
csd_kernels run ...``) on a 6-prompt file; the single-process reference runs in this process. When the digits model's
trained weights are not in csd_kernels/zoo/digits/weights yet, the tests use a random model of the same
architecture (written to a temporary folder; the subprocesses are pointed at it by a two-line launcher).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from csd_kernels import cli, zoo
from csd_kernels import runner as D
from csd_kernels.runner.group import Dist
from csd_kernels.zoo.digits import model as M

REPO = Path(__file__).resolve().parents[1]
PROMPTS = ["3", "7", "0", "9", "1", "7"]
MODES = "ar,csd"
TIMEOUT = 240
SHIPPED = all((M.WEIGHTS_DIR / name).is_file() for name in (M.MODEL_FILE, M.CONFIG_FILE, M.CODEBOOK_FILE))

LAUNCHER = """import sys
from pathlib import Path
from csd_kernels.zoo.digits import model as M
M.WEIGHTS_DIR = Path(sys.argv.pop(1))
from csd_kernels.cli import main
sys.exit(main())
"""


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """(argv prefix of a 2-rank torchrun job, subprocess environment); the digits model loadable in this process."""
    root = tmp_path_factory.mktemp("run")
    (root / "prompts.txt").write_text("\n".join(PROMPTS) + "\n")
    os.environ.pop(D.CRASH_ENV, None)
    sub_env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(
        [str(REPO)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    saved = M.WEIGHTS_DIR
    if SHIPPED:
        prefix = torchrun + ["-m", "csd_kernels"]
    else:
        from csd_kernels.zoo.digits import PatchCodebook, build_lm

        weights = root / "weights"
        M.save_lm(build_lm(seed=0), weights)
        g = torch.Generator().manual_seed(0)
        PatchCodebook(torch.rand(512, 4, generator=g), torch.rand(512, 4, generator=g)).save(weights / M.CODEBOOK_FILE)
        (root / "launch.py").write_text(LAUNCHER)
        prefix = torchrun + [str(root / "launch.py"), str(weights)]
        M.WEIGHTS_DIR = weights
    zoo.load.cache_clear()
    yield {"root": root, "prompts": str(root / "prompts.txt"), "prefix": prefix, "env": sub_env}
    M.WEIGHTS_DIR = saved
    zoo.load.cache_clear()


def run_args(env, out, modes=MODES, batch=2, *extra):
    return ["run", "--prompts", env["prompts"], "--modes", modes, "--out", str(out), "--batch-size", str(batch),
            "--seed", "5", "--num-threads", "1", "--quiet", *extra]


def torchrun(env, args, crash=None):
    sub_env = dict(env["env"])
    if crash is not None:
        sub_env[D.CRASH_ENV] = crash
    return subprocess.run(env["prefix"] + args, env=sub_env, cwd=env["root"], capture_output=True, text=True,
                          timeout=TIMEOUT)


def outputs(out, modes=MODES) -> dict:
    """{(mode, index): (tokens, png sha256)} of every image JSON in ``out``."""
    result = {}
    for mode in modes.split(","):
        for path in sorted((Path(out) / mode).glob("*.json")):
            record = json.loads(path.read_text())
            result[(mode, record["index"])] = (record["tokens"], record["png_sha256"])
    return result


def leftovers(out) -> list:
    return [p.name for p in Path(out).rglob("*") if p.name.endswith(".tmp") or p.name == D.LOCK]


@pytest.fixture(scope="module")
def reference(env):
    """One plain process (no process group), batch 3."""
    out = env["root"] / "single"
    assert cli.main(run_args(env, out, batch=3)) == 0
    return out


# ----------------------------------------------------------------------------------------------------------------------
def test_seed_and_shard_rules():
    assert D.image_seed(5, 3, "csd") == D.image_seed(5, 3, "csd")
    assert len({D.image_seed(s, i, m) for s in (0, 1) for i in range(50) for m in ("ar", "csd")}) == 200
    assert 0 <= D.image_seed(0, 0, "ar") < 2 ** 31
    items = D.work_items(7, ["ar", "sjd", "csd"])
    for world in (1, 2, 3, 4):
        shards = [D.shard(items, r, world) for r in range(world)]
        assert sorted(x for s in shards for x in s) == sorted(items)
        assert max(map(len, shards)) - min(map(len, shards)) <= 1


class _Rank1(Dist):
    """Rank 1 of two whose collectives return rank 0's side: the scripted broadcasts, then _Stop."""

    def __init__(self, sent):
        super().__init__(rank=1, world_size=2, local_world_size=2, active=True)
        self.sent = list(sent)

    def broadcast(self, obj):
        if not self.sent:
            raise _Stop
        return self.sent.pop(0)


class _Stop(Exception):
    pass


@pytest.mark.parametrize("rank0_refused", [False, True])
def test_rank_1_follows_rank_0_on_the_out_folder(tmp_path, monkeypatch, rank0_refused):
    # rank 0's check of --out creates and removes the folder: a rank that looked at it itself could see it half-made
    # ("not writable", exit 2 alone: CI, 1 run in ~500). Here --out is a file, which rank 1 must not judge by itself.
    out = tmp_path / "a_file"
    out.write_text("")
    monkeypatch.setattr(Dist, "init", classmethod(lambda cls: _Rank1([rank0_refused])))
    with pytest.raises(SystemExit if rank0_refused else _Stop) as caught:
        D.run("digits", str(tmp_path / "prompts.txt"), "ar", str(out), num_threads=1)
    assert rank0_refused is False or caught.value.code == 2
    assert out.read_text() == ""


def test_two_ranks_equal_one_process(env, reference):
    out = env["root"] / "two"
    proc = torchrun(env, run_args(env, out, batch=2))
    assert proc.returncode == 0, proc.stderr[-3000:]
    single, double = outputs(reference), outputs(out)
    assert len(single) == len(PROMPTS) * 2 and single.keys() == double.keys()
    for key in single:
        assert single[key] == double[key], key  # same tokens, same PNG bytes
    ranks = {json.loads(p.read_text())["rank"] for p in out.glob("*/*.json")}
    assert ranks == {0, 1}
    s1, s2 = (json.loads((d / D.SUMMARY).read_text()) for d in (reference, out))
    assert s2["world_size"] == 2 and s1["world_size"] == 1
    assert s1["images"] == s2["images"] == s2["generated_this_run"] == len(PROMPTS) * 2
    for mode in MODES.split(","):
        a, b = s1["per_mode"][mode], s2["per_mode"][mode]
        assert a["images"] == b["images"] == len(PROMPTS)
        assert a["forward_passes_per_image"] == b["forward_passes_per_image"]
        assert a["accuracy"] == b["accuracy"] and a["frechet"] == pytest.approx(b["frechet"])
    assert s1["per_mode"]["ar"]["forward_passes_per_image"]["mean"] == 256
    assert (out / D.TABLE).read_text().startswith("mode")
    assert (out / "logs" / "rank0.log").exists() and (out / "logs" / "rank1.log").exists()
    assert leftovers(out) == []


def test_killed_run_resumes_to_the_same_images(env, reference):
    out = env["root"] / "killed"
    args = run_args(env, out, batch=2)
    # rank 1 raises after its 3rd image (in its 2nd batch); torchrun then stops rank 0
    proc = torchrun(env, args, crash="1:3")
    # the rank's own log, written before it raises: torchrun's relay of a dying worker's stderr can lose the lines
    assert proc.returncode != 0 and "test hook" in (out / "logs" / "rank1.log").read_text()
    before = outputs(out)
    assert 2 <= len(before) < len(PROMPTS) * 2
    assert (out / D.LOCK).exists()  # left by the dead rank 0: stale, taken over below
    proc = torchrun(env, args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((out / D.SUMMARY).read_text())
    assert summary["skipped_complete"] == len(before)
    assert summary["generated_this_run"] == len(PROMPTS) * 2 - len(before)
    assert summary["images"] == len(PROMPTS) * 2
    assert outputs(out) == outputs(reference)  # nothing lost, nothing changed
    assert len(list(out.glob("*/*.png"))) == len(list(out.glob("*/*.json"))) == len(PROMPTS) * 2
    assert leftovers(out) == []
    assert "stale lock" in (out / "logs" / "rank0.log").read_text()


def test_corrupt_outputs_are_regenerated(env, reference):
    out = env["root"] / "corrupt"
    shutil.copytree(reference, out)
    png = out / "csd" / "000001.png"
    png.write_bytes(png.read_bytes()[:100])  # truncated PNG
    (out / "ar" / "000002.json").write_text('{"mode": "ar", "ind')  # truncated JSON
    (out / "csd" / "000004.json").unlink()  # PNG written, JSON not
    (out / "ar" / "000005.png").unlink()  # JSON without its PNG
    (out / "csd" / ".000003.json.999.tmp").write_text("partial")  # a killed run's temporary file
    untouched = out / "ar" / "000000.json"
    stamp = untouched.stat().st_mtime_ns
    assert cli.main(run_args(env, out, batch=2)) == 0
    summary = json.loads((out / D.SUMMARY).read_text())
    assert summary["generated_this_run"] == summary["redone_corrupt_or_partial"] == 4
    assert summary["skipped_complete"] == len(PROMPTS) * 2 - 4
    assert outputs(out) == outputs(reference)
    assert untouched.stat().st_mtime_ns == stamp
    assert leftovers(out) == []


# ----------------------------------------------------------------------------------------------------------------------
# clear errors (one line, exit status 2)
# ----------------------------------------------------------------------------------------------------------------------
def _error(capsys, argv) -> str:
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("csd run: error:") and "\n" not in err
    return err


def test_prompts_file_missing_or_empty_or_bad(env, tmp_path, capsys):
    args = run_args(env, tmp_path / "o")
    args[args.index("--prompts") + 1] = str(tmp_path / "nope.txt")
    assert "no such file" in _error(capsys, args)
    (tmp_path / "empty.txt").write_text("\n  \n")
    args[args.index("--prompts") + 1] = str(tmp_path / "empty.txt")
    assert "no prompts" in _error(capsys, args)
    (tmp_path / "bad.txt").write_text("1\n12\n")
    args[args.index("--prompts") + 1] = str(tmp_path / "bad.txt")
    assert "line 2: prompt '12': the digits model takes a class id 0..9" in _error(capsys, args)
    assert "unknown mode" in _error(capsys, run_args(env, tmp_path / "o", modes="ar,fast"))
    assert not (tmp_path / "o" / D.LOCK).exists()


def test_folder_in_use_is_refused_and_stale_lock_taken_over(env, tmp_path, capsys):
    out = tmp_path / "o"
    out.mkdir()
    (out / D.LOCK).write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "started": "now"}))
    err = _error(capsys, run_args(env, out, modes="csd"))
    assert "in use by another run" in err and f"pid {os.getpid()}" in err
    assert (out / D.LOCK).exists() and not (out / D.MANIFEST).exists()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (out / D.LOCK).write_text(json.dumps({"pid": dead.pid, "host": socket.gethostname(), "started": "then"}))
    assert cli.main(run_args(env, out, modes="csd")) == 0
    assert not (out / D.LOCK).exists() and len(outputs(out, "csd")) == len(PROMPTS)


def test_resume_with_other_arguments_is_refused(env, reference, tmp_path, capsys):
    out = tmp_path / "o"
    shutil.copytree(reference, out)
    args = run_args(env, out, batch=3)
    args[args.index("--seed") + 1] = "6"
    err = _error(capsys, args + ["--cfg-scale", "2.0"])
    assert "--seed 6 (the run has 5)" in err and "--cfg-scale 2.0" in err
    assert "--modes csd" in _error(capsys, run_args(env, out, modes="csd"))
    (tmp_path / "other.txt").write_text("1\n2\n")
    args = run_args(env, out)
    args[args.index("--prompts") + 1] = str(tmp_path / "other.txt")
    assert "--prompts" in _error(capsys, args)
    assert not (out / D.LOCK).exists()
    # the batch size and the process count are not settings of the images: a resume may change them
    assert cli.main(run_args(env, out, batch=5)) == 0
    assert json.loads((out / D.SUMMARY).read_text())["generated_this_run"] == 0
