"""A failing run never costs the user an earlier result, and says what happened in one line: a full disk (a real
tmpfs where this machine can mount one, else ENOSPC injected into the write path of the real command), SIGINT and
SIGTERM sent to a real ``csd`` process, damaged input files written here. Every case runs the command as a user
does (``python -m csd_kernels``, a fresh interpreter) unless it only needs the parser and the checks."""

import contextlib
import hashlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from csd_kernels import cli
from csd_kernels.fileio.outputs import STAGING_PREFIX, TMP_SUFFIX

SCENES_WEIGHTS = os.path.join(os.path.dirname(cli.__file__), "..", "zoo", "scenes", "weights")
GENERATE = ["generate", "--prompt", "3", "--num", "2", "--quiet"]

# The command with the K-th file it opens for writing under DIR failing with ENOSPC (a disk that fills up while the
# run writes; what a file system says when a new file gets no block).
_INJECTED = r"""
import builtins, errno, os, runpy, sys
root, budget = os.path.realpath(sys.argv[1]), int(sys.argv[2])
real_open, opened = builtins.open, [0]
def open_(file, mode="r", *args, **kwargs):
    if isinstance(file, (str, bytes, os.PathLike)) and any(c in mode for c in "wax+"):
        if os.path.realpath(os.fsdecode(file)).startswith(root + os.sep):
            opened[0] += 1
            if opened[0] >= budget:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), os.fsdecode(file))
    return real_open(file, mode, *args, **kwargs)
builtins.open = open_
sys.argv = ["csd"] + sys.argv[3:]
runpy.run_module("csd_kernels", run_name="__main__")
"""

# The command on a tmpfs of SIZE KiB mounted at DIR in a mount namespace of its own, DIR first holding EARLIER's files;
# the listing of DIR (names and sha256) is written to RESULT before the namespace goes.
_TMPFS = r"""
set -u
mount -t tmpfs -o size="$SIZE"k tmpfs "$DIR" || exit 99
if [ -n "$EARLIER" ]; then cp -a "$EARLIER"/. "$DIR"/; fi
"$PYTHON" -m csd_kernels "$@" > "$RESULT.stdout" 2> "$RESULT.stderr"
echo $? > "$RESULT.rc"
"$PYTHON" -c "$LISTING" "$DIR" > "$RESULT.json"
"""
_LISTING = r"""
import hashlib, json, os, sys
root = sys.argv[1]
print(json.dumps({os.path.relpath(os.path.join(d, f), root): hashlib.sha256(open(os.path.join(d, f), "rb").read())
                  .hexdigest() for d, _, files in os.walk(root) for f in files}))
"""


def listing(folder) -> dict:
    """{relative path: sha256} of every file under ``folder`` (the temporary and staging ones included)."""
    return json.loads(subprocess.run([sys.executable, "-c", _LISTING, str(folder)], capture_output=True, text=True,
                                     check=True).stdout)


def csd(argv, cwd, env=None, timeout=600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "csd_kernels", *map(str, argv)], capture_output=True, text=True,
                          cwd=cwd, timeout=timeout, env=dict(os.environ, **(env or {})))


def can_mount_tmpfs() -> bool:
    if not shutil.which("unshare") or os.geteuid() != 0:
        return False
    probe = subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt"],
                           capture_output=True)
    return probe.returncode == 0


DISKS = [pytest.param("tmpfs", marks=pytest.mark.skipif(not can_mount_tmpfs(), reason="cannot mount a tmpfs here "
                                                                                   "(needs root and unshare)")),
         "injected"]


def on_full_disk(disk: str, argv: list, folder, tmp_path, earlier=None, tmpfs_kib=0, injected_at=1) -> tuple:
    """(exit status, stdout, stderr, {path: sha256} of ``folder`` afterwards): the command with ``folder`` on a disk
    that fills up (tmpfs: ``tmpfs_kib`` KiB holding ``earlier``'s files; injected: ``folder`` as it is, the
    ``injected_at``-th file the command opens for writing under it failing)."""
    if disk == "injected":
        result = subprocess.run([sys.executable, "-c", _INJECTED, str(folder), str(injected_at), *map(str, argv)],
                                capture_output=True, text=True, cwd=tmp_path, timeout=600)
        return result.returncode, result.stdout, result.stderr, listing(folder)
    folder.mkdir(parents=True, exist_ok=True)
    result_path = tmp_path / "result"
    env = dict(os.environ, SIZE=str(tmpfs_kib), DIR=str(folder), EARLIER=str(earlier or ""), PYTHON=sys.executable,
               RESULT=str(result_path), LISTING=_LISTING)
    subprocess.run(["unshare", "-m", "bash", "-c", _TMPFS, "tmpfs", *map(str, argv)], cwd=tmp_path, env=env,
                   timeout=600, check=True)
    files = json.loads((tmp_path / "result.json").read_text())
    return (int((tmp_path / "result.rc").read_text()), (tmp_path / "result.stdout").read_text(),
            (tmp_path / "result.stderr").read_text(), files)


def one_line(stderr: str) -> str:
    lines = stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in stderr, stderr[-3000:]
    return lines[0]


def no_temporaries(files: dict) -> None:
    left = [p for p in files if STAGING_PREFIX in p or p.endswith(TMP_SUFFIX) or os.path.basename(p) == ".lock"]
    assert left == [], left


@pytest.fixture(scope="module")
def earlier_run(tmp_path_factory):
    """A folder holding an earlier csd generate run (2 digits images)."""
    folder = tmp_path_factory.mktemp("earlier") / "out"
    result = csd([*GENERATE, "--seed", "9", "--out", folder], cwd=folder.parent)
    assert result.returncode == 0, result.stderr[-3000:]
    return folder


# ----------------------------------------------------------------------------------------------------------------------
# a full disk
# ----------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("disk", DISKS)
def test_generate_on_a_full_disk_keeps_the_earlier_run(disk, earlier_run, tmp_path):
    """The issue's case: a rerun into a folder holding an earlier run fills the disk while writing its grid; the
    earlier run must stay byte for byte, nothing of the new run or its staging stay behind, one line, exit 1."""
    folder = tmp_path / "out"
    if disk == "injected":
        shutil.copytree(earlier_run, folder)
    before = listing(earlier_run)
    size = sum(-(-os.path.getsize(earlier_run / name) // 4096) * 4 for name in before) + 16  # KiB: the new run's
    # images fit, its grid or maps do not
    status, stdout, stderr, after = on_full_disk(disk, [*GENERATE, "--prompt", "4", "--out", folder], folder,
                                                 tmp_path, earlier=earlier_run, tmpfs_kib=size, injected_at=3)
    line = one_line(stderr)
    assert status == 1, (status, stderr)
    assert line.startswith("csd generate: error: no space left on ") and " while writing " in line, line
    assert line.endswith(f"the earlier run in {folder} is unchanged"), line
    assert after == before  # every file of the earlier run as it was; nothing else (no staging folder)
    assert "wrote" not in stdout


@pytest.mark.parametrize("disk", DISKS)
def test_run_on_a_full_disk_keeps_its_complete_images(disk, tmp_path):
    """csd run fills the disk: one line saying what was kept and how to go on, exit 1, no temporary file, no lock;
    every image it reports kept is complete (PNG and JSON)."""
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("3\n5\n7\n")
    folder = tmp_path / "run"
    argv = ["run", "--prompts", prompts, "--modes", "ar", "--batch-size", "1", "--quiet", "--out", folder]
    # the log, run.json, then image 0's PNG and JSON: image 1's PNG fails
    status, _, stderr, after = on_full_disk(disk, argv, folder, tmp_path, tmpfs_kib=24, injected_at=5)
    line = one_line(stderr)
    assert status == 1, (status, stderr)
    assert line.startswith("csd run: error: no space left on ") and " while writing " in line, line
    images = sorted(p for p in after if p.startswith("ar/") and p.endswith(".json"))
    assert line.endswith(f"{len(images)} of 3 images kept in {folder}; rerun the same command to resume"), line
    assert all(p.replace(".json", ".png") in after for p in images)
    no_temporaries(after)


# ----------------------------------------------------------------------------------------------------------------------
# signals
# ----------------------------------------------------------------------------------------------------------------------
def _start(argv, cwd) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "csd_kernels", *map(str, argv)], cwd=cwd, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _wait_for(predicate, process, seconds=300) -> None:
    end = time.monotonic() + seconds
    while not predicate():
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < end, "timed out"
        time.sleep(0.2)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_stops_run_with_one_line_and_a_resumable_folder(signum, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("".join(f"{c}\n" for c in range(6)))
    folder = tmp_path / "run"
    argv = ["run", "--prompts", prompts, "--modes", "ar", "--batch-size", "1", "--quiet", "--out", folder]
    process = _start(argv, tmp_path)
    _wait_for(lambda: (folder / "ar").is_dir() and any(p.suffix == ".json" for p in (folder / "ar").iterdir()),
              process)
    process.send_signal(signum)
    _, stderr = process.communicate(timeout=300)
    line = one_line(stderr)
    assert process.returncode == 128 + signum, (process.returncode, stderr)
    files = listing(folder)
    kept = sorted(p for p in files if p.startswith("ar/") and p.endswith(".json"))
    assert line == (f"csd run: interrupted by {signal.Signals(signum).name}: {len(kept)} of 6 images kept in "
                    f"{folder}; rerun the same command to resume"), line
    no_temporaries(files)
    if signum == signal.SIGTERM:  # the same command resumes: the kept images are not made again
        result = csd(argv, cwd=tmp_path)
        assert result.returncode == 0, result.stderr[-3000:]
        summary = json.loads((folder / "summary.json").read_text())
        assert summary["skipped_complete"] == len(kept) and summary["images"] == 6


@pytest.mark.parametrize("after", [0.5, 3.0])  # importing torch / loading the model / generating, by machine load
def test_a_signal_during_generate_keeps_the_earlier_run(earlier_run, tmp_path, after):
    folder = tmp_path / "out"
    shutil.copytree(earlier_run, folder)
    before = listing(folder)
    process = _start([*GENERATE, "--prompt", "4", "--num", "16", "--out", folder], tmp_path)
    time.sleep(after)  # wherever it is, the folder stays as it was and the line says so
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=300)
    assert process.returncode == 143, (process.returncode, stderr)
    assert one_line(stderr) == f"csd generate: interrupted by SIGTERM: the earlier run in {folder} is unchanged"
    assert listing(folder) == before


# ----------------------------------------------------------------------------------------------------------------------
# damaged input files: one line naming the flag and the file, exit 2, nothing written
# ----------------------------------------------------------------------------------------------------------------------
def _main(argv) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            status = cli.main([str(a) for a in argv])
        except SystemExit as exc:
            status = exc.code
    return status, err.getvalue()


def _truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[:len(data) // 3])


def _rewrite_header(path, change):
    """The safetensors file ``path`` with its header changed by ``change(header)`` (the data as it was)."""
    data = path.read_bytes()
    length = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + length])
    change(header)
    text = json.dumps(header).encode()
    path.write_bytes(len(text).to_bytes(8, "little") + text + data[8 + length:])


def _overlap(header):
    """The second tensor in the data moved 4 bytes back, into the first one's bytes."""
    name = sorted((info["data_offsets"], name) for name, info in header.items() if name != "__metadata__")[1][1]
    header[name]["data_offsets"] = [offset - 4 for offset in header[name]["data_offsets"]]


def _out_of_range(header):
    name = next(name for name in header if name != "__metadata__")
    header[name]["data_offsets"] = [offset + 2**40 for offset in header[name]["data_offsets"]]


def _nan(path):
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(path))
    tensors["model.embed_tokens.weight"][3, 5] = float("nan")
    save_file(tensors, str(path))


DAMAGE = {
    "overlapping tensors": ("model.safetensors", lambda p: _rewrite_header(p, _overlap), "overlap (bytes"),
    "offsets out of range": ("model.safetensors", lambda p: _rewrite_header(p, _out_of_range), "truncated: tensor"),
    "NaN weights": ("model.safetensors", _nan, "tensor 'model.embed_tokens.weight' holds 1 non-finite values"),
    "truncated model": ("model.safetensors", _truncate, "truncated: tensor"),
    "random model": ("model.safetensors", lambda p: p.write_bytes(os.urandom(50_000)), "not a safetensors file"),
    "empty model": ("model.safetensors", lambda p: p.write_bytes(b""), "not a safetensors file"),
    "random tokenizer": ("tokenizer.safetensors", lambda p: p.write_bytes(os.urandom(3000)),
                         "not a safetensors file"),
    "config not JSON": ("config.json", lambda p: p.write_text('{\n  \n'), "not JSON (Expecting property name"),
    "config a list": ("config.json", lambda p: p.write_text("[1, 2]"), "holds a JSON list; expected"),
    "config of another model": ("config.json", lambda p: p.write_text(json.dumps(
        {**json.loads(p.read_text()), "num_hidden_layers": 2})), "model.safetensors: tensors of another model than "
                                                                 "its config.json describes (0 missing, 18 unexpected"),
    "no model file": ("model.safetensors", lambda p: p.unlink(), "no model.safetensors in the folder"),
}


@pytest.mark.parametrize("case", DAMAGE)
def test_a_damaged_weights_folder_is_one_line_naming_the_flag_and_the_file(case, tmp_path):
    name, damage, problem = DAMAGE[case]
    weights = tmp_path / "weights"
    shutil.copytree(SCENES_WEIGHTS, weights)
    damage(weights / name)
    folder = tmp_path / "out"
    status, stderr = _main(["generate", "--model", "scenes", "--weights", weights, "--prompt", "red circle center",
                            "--num", "1", "--quiet", "--out", folder])
    line = one_line(stderr)
    assert status == 2, stderr
    assert line.startswith("csd generate: error: --weights ") and problem in line, line
    assert f"--weights {weights}" in line and (str(weights / name) in line or case in ("no model file",
                                                                                      "config of another model")), line
    assert not folder.exists()


def test_a_lantern_k_wider_than_the_table_is_refused_before_run_json(tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("3\n")
    out = tmp_path / "run"
    begin = time.perf_counter()
    status, stderr = _main(["run", "--prompts", prompts, "--modes", "ar,lantern", "--lantern-k", "600", "--quiet",
                            "--out", out])
    assert status == 2 and one_line(stderr) == ("csd run: error: --lantern-k 600: expected an int in [1, 511] for "
                                                "--model digits (its neighbour table holds the 511 other codes of "
                                                "its codebook)"), stderr
    assert not out.exists() and time.perf_counter() - begin < 60


def test_a_second_run_on_a_folder_in_use_is_refused_before_the_model_loads(tmp_path, monkeypatch):
    import socket

    from csd_kernels import zoo

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("3\n")
    out = tmp_path / "run"
    out.mkdir()
    (out / ".lock").write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "started": "now"}))
    monkeypatch.setattr(zoo, "load", lambda *a, **k: pytest.fail("the model loaded for a folder in use"))
    status, stderr = _main(["run", "--prompts", prompts, "--modes", "ar", "--quiet", "--out", out])
    assert status == 2 and "the folder is in use by another run" in one_line(stderr), stderr
    assert os.listdir(out) == [".lock"]


@pytest.mark.parametrize("content, problem", [
    (None, "is a folder; expected a text file, one prompt per line"),
    (b"\xff\xfe\x00garbage", "not UTF-8 text (byte 0); expected one prompt per line"),
    (b"\n  \n", "the file has no prompts (one per line expected)"),
    (b"3\n\n12\n", "line 3: prompt '12': the digits model takes a class id 0..9"),
])
def test_a_bad_prompts_file_is_one_line(content, problem, tmp_path):
    prompts = tmp_path / "prompts"
    prompts.mkdir() if content is None else prompts.write_bytes(content)
    status, stderr = _main(["run", "--prompts", prompts, "--quiet", "--out", tmp_path / "run"])
    assert status == 2 and one_line(stderr) == f"csd run: error: --prompts {prompts}: {problem}", stderr
    assert not (tmp_path / "run").exists()


def test_a_run_json_that_is_not_json_is_one_line(tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("3\n")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "run.json").write_text("{not json")
    status, stderr = _main(["run", "--prompts", prompts, "--modes", "ar", "--quiet", "--out", tmp_path / "run"])
    assert status == 2 and "run.json is unreadable" in one_line(stderr), stderr


def test_the_staging_folder_of_a_killed_run_is_removed_by_the_next(tmp_path):
    """SIGKILL leaves a staging folder (nothing can run then); the next run into the folder removes it."""
    from csd_kernels.fileio.outputs import Output

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f"{STAGING_PREFIX}{dead.pid}"
    stale.mkdir()
    (stale / "grid.png").write_bytes(b"half")
    with Output(str(tmp_path)) as output:
        output.write("a.txt", "new")
    assert sorted(os.listdir(tmp_path)) == ["a.txt"]


def test_sha256_listing_sees_every_file(tmp_path):
    """The listing the full-disk tests compare covers hidden files and folders (a staging folder would show)."""
    (tmp_path / ".hidden").mkdir()
    (tmp_path / ".hidden" / "x").write_bytes(b"1")
    assert listing(tmp_path) == {".hidden/x": hashlib.sha256(b"1").hexdigest()}
