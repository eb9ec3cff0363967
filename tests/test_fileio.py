"""The file layer every command writes and reads through (csd_kernels/fileio): an Output is all or nothing, cleans up
after any failure and says what was kept; write_atomic leaves no temporary file; the input checks name the flag,
the path and what is wrong, in one line."""

import errno
import json
import os
import re
import signal
import sys
import time
import traceback

import pytest

from csd_kernels.fileio import inputs, outputs
from csd_kernels.fileio.inputs import (
    InputError,
    check_finite,
    check_safetensors,
    quote,
    read_json,
    read_prompt_lines,
    shorten,
)
from csd_kernels.fileio.outputs import STAGING_PREFIX, Output, OutputError, describe, write_atomic
from csd_kernels.fileio.signals import Interrupted, if_stopped, raise_on_signals, signals_held


def files(folder) -> dict:
    return {os.path.relpath(os.path.join(d, f), folder): open(os.path.join(d, f), "rb").read()
            for d, _, names in os.walk(folder) for f in names}


# ----------------------------------------------------------------------------------------------------------- Output
def test_an_output_replaces_the_earlier_run_only_at_the_commit(tmp_path):
    (tmp_path / "img_000.png").write_bytes(b"old 0")
    (tmp_path / "img_001.png").write_bytes(b"old 1")
    (tmp_path / "notes.txt").write_bytes(b"keep")
    with Output(str(tmp_path), replaces=re.compile(r"img_\d+\.png|stats\.json")) as out:
        out.write("img_000.png", b"new 0")
        out.write_json("stats.json", {"a": 1})
        assert files(tmp_path)["img_000.png"] == b"old 0"  # nothing in place before the commit
    assert files(tmp_path) == {"img_000.png": b"new 0", "stats.json": b'{\n  "a": 1\n}\n', "notes.txt": b"keep"}
    assert out.removed == ["img_001.png"] and out.replaced == ["img_000.png"]
    assert out.summary() == (f"wrote img_000.png, stats.json to {tmp_path}; they replace the earlier run's files "
                             "(its img_001.png removed)")


@pytest.mark.parametrize("failure", [RuntimeError("the model failed"), OSError(errno.ENOSPC, "No space left"),
                                     Interrupted(signal.SIGTERM)], ids=["exception", "full disk", "signal"])
def test_a_failed_output_leaves_the_folder_as_it_was(failure, tmp_path):
    (tmp_path / "img_000.png").write_bytes(b"old")
    before = files(tmp_path)
    with pytest.raises((type(failure), OutputError)) as caught:
        with Output(str(tmp_path), replaces=re.compile(r"img_\d+\.png")) as out:
            out.write("img_000.png", b"new")
            with open(out.path("grid.png"), "wb") as f:
                f.write(b"half")
                raise failure
    assert files(tmp_path) == before and os.listdir(tmp_path) == ["img_000.png"]  # no staging folder
    if isinstance(failure, OSError):
        assert str(caught.value) == (f"no space left on {outputs._mount_point(str(tmp_path))} while writing "
                                     f"{tmp_path}/grid.png: the earlier run in {tmp_path} is unchanged")
    if isinstance(failure, Interrupted):
        assert str(caught.value) == f"interrupted by SIGTERM: the earlier run in {tmp_path} is unchanged"


@pytest.mark.parametrize("failing", ["img_000.png", "stats.json", "img_001.png"])
def test_a_failed_rename_rolls_back_the_commit_and_names_its_file(failing, tmp_path, monkeypatch):
    (tmp_path / "img_000.png").write_bytes(b"old 0")
    (tmp_path / "stats.json").write_bytes(b"old stats")
    before = files(tmp_path)
    replace = os.replace

    def refuse(source, target):  # (a file made immutable: its rename fails, the others work)
        if os.path.basename(target) == failing and STAGING_PREFIX in str(source):
            raise PermissionError(errno.EPERM, "Operation not permitted")
        replace(source, target)

    monkeypatch.setattr(outputs.os, "replace", refuse)
    with pytest.raises(OutputError) as caught:
        with Output(str(tmp_path), replaces=re.compile(r"img_\d+\.png|stats\.json")) as out:
            out.write("img_000.png", b"new 0")
            out.write("img_001.png", b"new 1")
            out.write_json("stats.json", {"a": 1})
    assert files(tmp_path) == before and sorted(os.listdir(tmp_path)) == ["img_000.png", "stats.json"]
    assert str(caught.value) == (f"Operation not permitted while writing {tmp_path}/{failing}: the earlier run in "
                                 f"{tmp_path} is unchanged")


def test_a_commit_keeps_the_earlier_files_by_copy_without_hard_links(tmp_path, monkeypatch):
    (tmp_path / "img_000.png").write_bytes(b"old 0")  # replaced, then put back from its copy
    (tmp_path / "stats.json").write_bytes(b"old stats")
    replace = os.replace

    def refuse(source, target):
        if os.path.basename(target) == "stats.json" and STAGING_PREFIX in str(source):
            raise PermissionError(errno.EPERM, "Operation not permitted")
        replace(source, target)

    monkeypatch.setattr(outputs.os, "link", lambda *a: (_ for _ in ()).throw(OSError(errno.EPERM, "no links")))
    monkeypatch.setattr(outputs.os, "replace", refuse)
    with pytest.raises(OutputError, match="while writing .*stats.json: the earlier run"):
        with Output(str(tmp_path), replaces=re.compile(r"img_\d+\.png|stats\.json")) as out:
            out.write("img_000.png", b"new 0")
            out.write_json("stats.json", {"a": 1})
    assert files(tmp_path) == {"img_000.png": b"old 0", "stats.json": b"old stats"}


def test_a_failed_output_removes_the_folders_it_made(tmp_path):
    target = tmp_path / "a" / "b"
    with pytest.raises(OutputError, match=f"nothing was written to {target}"):
        with Output(str(target)) as out:
            out.write("x.json", "{}")
            raise OSError(errno.ENOSPC, "No space left on device")
    assert os.listdir(tmp_path) == []


def test_a_signal_before_anything_is_staged_says_nothing_was_written(tmp_path):
    with pytest.raises(Interrupted) as caught:
        with Output(str(tmp_path / "out")):
            raise Interrupted(signal.SIGINT)
    assert str(caught.value) == f"interrupted by SIGINT: nothing was written to {tmp_path / 'out'}"
    assert not (tmp_path / "out").exists()


def test_describe_shortens_numbered_runs():
    assert describe([f"img_{i:03d}.png" for i in range(16)] + ["grid.png"]) == \
        "img_000.png … img_015.png (16 files), grid.png"
    assert describe(["img_000.png", "img_001.png"]) == "img_000.png, img_001.png"
    assert describe(["a1.png", "a3.png", "a4.png"]) == "a1.png, a3.png, a4.png"


def test_write_atomic_leaves_no_temporary_file_on_a_full_disk(tmp_path, monkeypatch):
    target = tmp_path / "000001.png"
    target.write_bytes(b"old")
    real_fsync = os.fsync

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OutputError, match="no space left on .* while writing .*000001.png: kept"):
        write_atomic(str(target), b"new", kept="kept")
    monkeypatch.setattr(os, "fsync", real_fsync)
    assert files(tmp_path) == {"000001.png": b"old"}


def test_signals_are_held_during_the_renames_and_raise_after():
    with raise_on_signals():
        with pytest.raises(Interrupted) as caught:
            with signals_held():
                os.kill(os.getpid(), signal.SIGTERM)
                held = True  # still here: the signal waits
        assert held and caught.value.status == 143
    with pytest.raises(Interrupted, match="interrupted by SIGINT: what is left"):
        with if_stopped("what is left"):
            raise Interrupted(signal.SIGINT)


def test_a_signal_during_an_import_is_raised_after_it(tmp_path, monkeypatch):
    # torch's import runs Python inside native code that aborts the process on an exception (std::terminate): the
    # module's top level must run to its end, and the signal arrive once the import is over.
    (tmp_path / "slow_module.py").write_text(
        "import os, signal, time\n"
        "os.kill(os.getpid(), signal.SIGTERM)\n"
        "end = time.monotonic() + 0.2\n"
        "while time.monotonic() < end:\n"
        "    time.sleep(0.001)  # the signal's retries land here, inside the import\n"
        "finished = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "slow_module", raising=False)
    with raise_on_signals():
        with pytest.raises(Interrupted) as caught:
            import slow_module  # noqa: F401
            end = time.monotonic() + 5
            while time.monotonic() < end:
                time.sleep(0.001)
    assert sys.modules["slow_module"].finished and caught.value.status == 143
    assert all(frame.f_code.co_filename != str(tmp_path / "slow_module.py")
               for frame, _ in traceback.walk_tb(caught.tb))


def test_an_output_does_not_take_a_path_outside_its_folder(tmp_path):
    with pytest.raises(ValueError, match="a plain file name"):
        Output(str(tmp_path)).path("../escape.txt")
    assert not any(name.startswith(STAGING_PREFIX) for name in os.listdir(tmp_path))


# ----------------------------------------------------------------------------------------------------------- inputs
def _safetensors(path, tensors: dict, data: bytes, extra: bytes = b"") -> None:
    header = json.dumps(tensors).encode()
    path.write_bytes(len(header).to_bytes(8, "little") + header + data + extra)


def test_a_valid_safetensors_header_is_read_without_torch(tmp_path):
    path = tmp_path / "w.safetensors"
    _safetensors(path, {"a": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
                        "__metadata__": {"format": "pt"}}, bytes(24))
    assert check_safetensors(str(path), "--weights") == {"a": {"dtype": "F32", "shape": [2, 3],
                                                               "data_offsets": [0, 24]}}


@pytest.mark.parametrize("write, problem", [
    (lambda p: p.write_bytes(b""), "not a safetensors file (0 bytes; no valid header length at its start)"),
    (lambda p: p.write_bytes(os.urandom(4)), "not a safetensors file (4 bytes;"),
    (lambda p: p.write_bytes((2**40).to_bytes(8, "little") + b"{}"), "no valid header length"),
    (lambda p: p.write_bytes((5).to_bytes(8, "little") + b"\xff\xfe{}}"), "its header is not JSON"),
    (lambda p: _safetensors(p, {"a": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}}, bytes(10)),
     "truncated: tensor 'a' ends at byte 24 of the data, the file holds 10"),
    (lambda p: _safetensors(p, {"a": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 20]}}, bytes(20)),
     "tensor 'a' has 20 bytes; its F32 shape [2, 3] holds 24"),
    (lambda p: _safetensors(p, {"a": {"dtype": "F32", "shape": "2", "data_offsets": [0, 8]}}, bytes(8)),
     "tensor 'a' has no valid dtype, shape and data_offsets"),
    (lambda p: _safetensors(p, {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, -8]}}, bytes(8)),
     "tensor 'a' has no valid dtype, shape and data_offsets"),
    (lambda p: _safetensors(p, {"a": {"dtype": "Q7", "shape": [2], "data_offsets": [0, 8]}}, bytes(8)),
     "tensor 'a' has dtype 'Q7', which safetensors does not define"),
    (lambda p: _safetensors(p, {"a": {"dtype": "U8", "shape": [0], "data_offsets": [8, 0]}}, bytes(8)),
     "tensor 'a' ends (byte 0) before it begins (byte 8)"),
    (lambda p: _safetensors(p, {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                                "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, bytes(12)),
     "tensors 'a' and 'b' overlap (bytes 4..8 of the data)"),
    (lambda p: _safetensors(p, {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                                "b": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, bytes(8)),
     "tensors 'a' and 'b' overlap (bytes 0..8 of the data)"),
    (lambda p: _safetensors(p, {"a": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, bytes(12)),
     "4 bytes of the data before tensor 'a' belong to no tensor"),
    (lambda p: _safetensors(p, {"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                                "b": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]}}, bytes(12)),
     "4 bytes of the data before tensor 'b' belong to no tensor"),
    (lambda p: _safetensors(p, {"a": {"dtype": "F32", "shape": [2], "data_offsets": [2**40, 2**40 + 8]}}, bytes(8)),
     "truncated: tensor 'a' ends at byte 1099511627784 of the data, the file holds 8"),
    (lambda p: p.write_bytes((100).to_bytes(8, "little") + b'{"a": 1}'), "no valid header length"),
    (lambda p: _safetensors(p, {"a": {"dtype": "F16", "shape": [2], "data_offsets": [0, 4]}}, bytes(4), b"junk"),
     "4 bytes after the last tensor's data"),
    (lambda p: p.mkdir(), "is a folder; expected a safetensors file"),
    (lambda p: None, "no such file (expected a safetensors file)"),
])
def test_a_damaged_safetensors_file_is_one_line(write, problem, tmp_path):
    path = tmp_path / "w.safetensors"
    write(path)
    with pytest.raises(InputError) as caught:
        check_safetensors(str(path), "--weights")
    assert str(caught.value).startswith(f"--weights {path}: ") and problem in str(caught.value)
    assert "\n" not in str(caught.value)


def test_a_safetensors_header_in_any_order_of_its_entries_is_read(tmp_path):
    path = tmp_path / "w.safetensors"  # (the format sorts by offset; JSON keeps the writer's order)
    header = {"b": {"dtype": "F16", "shape": [2], "data_offsets": [8, 12]},
              "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
              "e": {"dtype": "F32", "shape": [0], "data_offsets": [12, 12]}}
    _safetensors(path, header, bytes(12))
    assert check_safetensors(str(path), "--weights") == header


def test_non_finite_weights_are_named_with_their_tensor():
    import torch

    tensors = {"ok": torch.ones(3), "ids": torch.arange(3), "w": torch.tensor([1.0, float("nan"), float("inf")])}
    with pytest.raises(InputError) as caught:
        check_finite(tensors, "--weights", "m.safetensors")
    assert str(caught.value) == ("--weights m.safetensors: tensor 'w' holds 2 non-finite values (NaN or infinity) "
                                 "of 3")
    assert check_finite({"ok": torch.ones(2)}, "--weights", "m.safetensors")["ok"].sum() == 2


@pytest.mark.parametrize("text, problem", [
    ('{"a": 1,\n}', "not JSON (Expecting property name enclosed in double quotes at line 2, column 1)"),
    ("[1]", "holds a JSON list; expected a config"),
    ("", "not JSON (Expecting value at line 1, column 1)"),
])
def test_a_bad_json_file_names_the_flag_the_path_and_the_place(text, problem, tmp_path):
    path = tmp_path / "config.json"
    path.write_text(text)
    with pytest.raises(InputError, match=re.escape(f"--config {path}: {problem}")):
        read_json(str(path), "--config", "a config")


def test_prompt_lines_keep_their_numbers(tmp_path):
    path = tmp_path / "p.txt"
    path.write_text("3\n\n  7 \n")
    assert read_prompt_lines(str(path)) == [(1, "3"), (3, "7")]
    assert inputs.read_prompts(str(path)) == ["3", "7"]


def test_a_long_input_is_quoted_in_at_most_80_characters():
    text = "x" * 10_000
    assert len(quote(text)) < 120 and quote(text).count("x") <= 80 and "10000 characters" in quote(text)
    assert shorten(text).count("x") <= 80 and quote("red circle") == "'red circle'" and shorten("3") == "3"


def test_the_out_probe_tolerates_another_rank_making_the_folder(tmp_path, monkeypatch):
    """csd run's ranks probe --out at the same time: a folder another rank made meanwhile is creatable (no 'cannot
    create the folder (File exists)'), and the probe leaves it alone."""
    import os

    from csd_kernels.runner import usage

    target = tmp_path / "a" / "b"
    real_mkdir = os.mkdir

    def raced(path, *args):
        real_mkdir(path, *args)  # the other rank's probe got there first
        raise FileExistsError(17, "File exists", str(path))

    monkeypatch.setattr(os, "mkdir", raced)
    assert usage.check_out(str(target)) == str(target)
    assert (tmp_path / "a").is_dir()  # not ours to remove
