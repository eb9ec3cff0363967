"""Packaging: a kernel-only install (no extras) imports and verifies with torch and numpy alone; setup.py ships the
weights as package data without setuptools warnings and does not recompile an extension that is current."""

import functools
import os
import pathlib
import re
import runpy
import shutil
import subprocess
import sys
import sysconfig
import zipfile

import torch

EXTRAS_ONLY = ("transformers", "safetensors", "matplotlib", "sklearn", "PIL", "tqdm")

SCRIPT = """
import torch
import csd_kernels as ck
import csd_kernels.models, csd_kernels.decoding  # importable; they need the extras only when used
logits = torch.randn(2, 4, 50)
res = ck.verify(logits, torch.randint(0, 50, (2, 4)), torch.softmax(torch.randn(2, 4, 50), -1), seed=1)
print(res.accept_len.tolist(), ck.available_backends())
"""


def test_kernel_only_install_imports_and_verifies(tmp_path):
    """Each extras-only package is shadowed by one whose import fails, as if it were not installed."""
    for name in EXTRAS_ONLY:
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(f"raise ImportError('{name} is not installed (test)')\n")
    result = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300,
                            env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tmp_path), "TRITON_INTERPRET": "0"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.startswith("[")


# ----------------------------------------------------------------------------------------------------------------------
# The build (setup.py): the weights ship as package data, no setuptools warnings, a current extension is not rebuilt
# ----------------------------------------------------------------------------------------------------------------------
REPO = pathlib.Path(__file__).resolve().parents[1]
BUILT = "csd_kernels/_C" + sysconfig.get_config_var("EXT_SUFFIX")
# stands in for ninja on the PATH: a build that compiles anything fails, and says so
FAKE_NINJA = """#!/bin/sh
[ "$1" = "--version" ] && { echo 1.11.1; exit 0; }
echo "fake ninja: asked to compile"
exit 1
"""


@functools.lru_cache(maxsize=None)
def _setup() -> dict:
    """setup.py's globals (imported, so setup() does not run)."""
    return runpy.run_path(str(REPO / "setup.py"), run_name="csd_kernels_setup")


def _source_hash(root) -> str:
    setup = _setup()
    return setup["source_hash"](str(root), setup["torch_build_id"](torch), setup["ext_modules"][0])


def _tree(tmp_path) -> pathlib.Path:
    """A copy of what a build reads, holding a stand-in for a current extension (its bytes and its stamp)."""
    tree = tmp_path / "tree"
    skip = shutil.ignore_patterns("__pycache__", "*.so", "*.stamp", "*.egg-info", "build")
    for name in ("setup.py", "pyproject.toml"):
        tree.mkdir(exist_ok=True)
        shutil.copy(REPO / name, tree / name)
    for name in ("csrc", "python", "csd_kernels"):
        shutil.copytree(REPO / name, tree / name, ignore=skip)
    (tree / BUILT).write_bytes(b"a current extension")
    _setup()["write_stamp"](str(tree), str(tree / BUILT), _source_hash(tree))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ninja").write_text(FAKE_NINJA)
    (bin_dir / "ninja").chmod(0o755)
    return tree


def _build(command: list, tree: pathlib.Path) -> subprocess.CompletedProcess:
    env = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}  # that one warns
    env.update(PATH=f"{tree.parent / 'bin'}:{os.environ['PATH']}", PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    return subprocess.run(command, cwd=tree, capture_output=True, text=True, timeout=900, env=env)


def _warnings(output: str) -> list:
    """Lines of output that say warning, or that start a Python warning ("file.py:12: InformationOnly: ...")."""
    return [line for line in output.splitlines() if re.search(r"warn|\.py:\d+: \w+: ", line, re.IGNORECASE)]


def test_the_stamp_follows_every_build_input(tmp_path):
    """Any change to csrc/, python/, setup.py, the flags, the ops' arguments or the torch changes the hash; the same
    tree elsewhere does not."""
    tree = tmp_path / "tree"
    shutil.copytree(REPO / "csrc", tree / "csrc")
    shutil.copytree(REPO / "python", tree / "python")
    shutil.copy(REPO / "setup.py", tree / "setup.py")
    (tree / "csd_kernels" / "backends").mkdir(parents=True)
    for name in ("build_flags.py", "spec.py"):
        shutil.copy(REPO / "csd_kernels" / "backends" / name, tree / "csd_kernels" / "backends" / name)
    hashes = [_source_hash(tree)]
    assert hashes[0] == _source_hash(REPO)
    for path in ("csrc/cpu/verify.cpp", "python/bindings.cpp", "setup.py", "csd_kernels/backends/build_flags.py",
                 "csd_kernels/backends/spec.py"):
        with open(tree / path, "a") as f:
            f.write("\n")
        hashes.append(_source_hash(tree))
    (tree / "csrc" / "new.h").write_text("")
    hashes.append(_source_hash(tree))
    setup = _setup()
    hashes.append(setup["source_hash"](str(tree), "2.0.0 other", setup["ext_modules"][0]))
    assert len(set(hashes)) == len(hashes)


def test_a_stamp_of_other_sources_or_another_build_is_not_current(tmp_path):
    setup = _setup()
    built = tmp_path / "csd_kernels" / "_C.so"
    built.parent.mkdir()
    built.write_bytes(b"built")
    assert not setup["is_current"](str(tmp_path), str(built), "abc")  # no stamp
    setup["write_stamp"](str(tmp_path), str(built), "abc")
    assert setup["is_current"](str(tmp_path), str(built), "abc")
    assert not setup["is_current"](str(tmp_path), str(built), "abd")
    built.write_bytes(b"copied in by hand")
    assert not setup["is_current"](str(tmp_path), str(built), "abc")


def test_a_wheel_reuses_the_current_extension_ships_the_weights_and_warns_nothing(tmp_path):
    """pip's build of a tree whose extension is current: no compiler run (the fake ninja would fail it), no
    setuptools warning, and the wheel holds that extension, every weights file, the models' READMEs, the
    custom_generate folder and the plugin entry points."""
    tree = _tree(tmp_path)
    result = _build([sys.executable, "-m", "pip", "wheel", "-v", "--no-build-isolation", "--no-deps",
                     "-w", str(tmp_path / "wheels"), "."], tree)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-5000:]
    assert f"{BUILT} is current" in output and "fake ninja" not in output
    assert _warnings(output) == []
    (wheel,) = (tmp_path / "wheels").glob("csd_kernels-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        assert archive.read(BUILT) == b"a current extension"
        entry_points = archive.read(next(n for n in names if n.endswith(".dist-info/entry_points.txt"))).decode()
    data = {str(path.relative_to(tree)) for path in (tree / "csd_kernels" / "zoo").rglob("*")
            if path.is_file() and path.suffix not in (".py", ".pyc")}
    assert {"csd_kernels/zoo/digits/weights/model.safetensors", "csd_kernels/zoo/digits/README.md"} <= data
    assert data <= names
    assert "csd_kernels/_C.stamp" not in names
    # the sources of the just-in-time build (CSD_KERNELS_JIT=1), in their own layout
    assert {"csd_kernels/_csrc/python/bindings.cpp", "csd_kernels/_csrc/csrc/cpu/verify.cpp"} <= names
    # transformers' generate(custom_generate=...) folder, and the engines' plugin entry points (docs/drop-in.md)
    assert "csd_kernels/integrations/custom_generate_repo/custom_generate/generate.py" in names
    assert "[vllm.general_plugins]\ncsd_kernels = csd_kernels.integrations.vllm:register" in entry_points
    assert "[sglang.srt.plugins]\ncsd_kernels = csd_kernels.integrations.sglang:register" in entry_points


def test_an_editable_build_reuses_the_extension_until_a_source_changes(tmp_path):
    """What `pip install -e .` (scripts/install.sh) asks setuptools for, run directly: with the extension current,
    no compiler run and no warning; with one C++ source changed, the compiler runs (the fake ninja, which fails)."""
    tree = _tree(tmp_path)
    written = (tree / BUILT).stat().st_mtime_ns
    command = [sys.executable, "-c", "from setuptools import build_meta; build_meta.build_editable('../editable')"]
    current = _build(command, tree)
    output = current.stdout + current.stderr
    assert current.returncode == 0 and f"{BUILT} is current" in output, output[-5000:]
    assert _warnings(output) == []
    assert (tree / BUILT).stat().st_mtime_ns == written  # not even copied over itself
    with open(tree / "csrc" / "cpu" / "verify.cpp", "a") as f:
        f.write("// changed\n")
    changed = _build(command, tree)
    assert changed.returncode != 0 and "fake ninja: asked to compile" in changed.stdout + changed.stderr
    assert "is current" not in changed.stdout
