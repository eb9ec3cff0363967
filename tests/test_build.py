"""The build against the torch in use (issue 44): no C++ standard of our own (torch's cpp_extension adds the one its
headers need), the extension records the torch it was built for, the loader refuses a _C built for another torch in
one warning line and falls back to the Triton / torch backends, and setup.py refuses a build that is not against the
torch that will load it."""

import importlib.util
import os
import pathlib
import runpy
import subprocess
import sys
import types
import warnings

import pytest
import torch

from csd_kernels.backends import build_flags as flags
from csd_kernels.backends import compiled, jit

REPO = pathlib.Path(__file__).resolve().parents[1]


def test_no_flag_fixes_the_cpp_standard():
    """torch 2.14's headers refuse C++17 and older torch's cpp_extension adds C++17: a -std of ours fits one torch."""
    for flag in flags.CXX_FLAGS + flags.NVCC_FLAGS + flags.LINK_FLAGS:
        assert not flag.startswith(("-std", "--std")), flag


def test_build_info_round_trips_through_the_generated_header(tmp_path):
    """The header's string, as the compiler lays it into the binary (NUL-terminated, among other bytes), reads back."""
    info = {"torch": "2.14.1+cu130", "cxx11_abi": 1}
    flags.write_build_info_header(str(tmp_path), info)
    header = (tmp_path / flags.BUILD_INFO_HEADER).read_text()
    literal = header.split("#define CSD_BUILD_INFO ", 1)[1].strip()
    binary = tmp_path / "fake.so"
    binary.write_bytes(b"\x7fELF\0junk\0" + literal.strip('"').encode() + b";cplusplus=202002L\0more\0")
    assert flags.read_build_info(str(binary)) == {"torch": "2.14.1+cu130", "cxx11_abi": "1", "cplusplus": "202002L"}
    (tmp_path / "old.so").write_bytes(b"\x7fELF\0no record\0")
    assert flags.read_build_info(str(tmp_path / "old.so")) is None


def test_the_built_extension_records_the_running_torch():
    """The built _C (scripts/install.sh) says, in its file and from build_info(), the torch and ABI it runs with,
    compiled at least as C++17 (C++20 where torch's cpp_extension asks for it)."""
    extension = compiled.compiled_extension()
    if extension is None:
        pytest.skip(f"csd_kernels._C not built: {compiled.load_error()}")
    recorded = flags.read_build_info(importlib.util.find_spec("csd_kernels._C").origin)
    assert recorded == flags.parse_build_info(extension.build_info().split(":", 1)[1])
    assert {k: recorded[k] for k in ("torch", "cxx11_abi", "ops")} == {
        k: str(v) for k, v in flags.build_info(torch).items()}
    assert int(recorded["cplusplus"].rstrip("L")) >= 201703


def _refused(monkeypatch) -> str:
    """The one warning line of loading a _C (this file stands in for it) whose record does not match: it is not
    imported, the loader raises ImportError."""
    monkeypatch.setattr(compiled.importlib.util, "find_spec", lambda _name: types.SimpleNamespace(origin=__file__))
    monkeypatch.setattr(compiled.importlib, "import_module", lambda name: pytest.fail(f"imported {name}"))
    monkeypatch.delenv(jit.ENV, raising=False)
    with warnings.catch_warnings(record=True) as caught, pytest.raises(ImportError):
        warnings.simplefilter("always")
        compiled._import_for_running_torch()
    (warning,) = [w for w in caught if issubclass(w.category, compiled.BuildMismatchWarning)]
    message = str(warning.message)
    assert "\n" not in message
    return message


def test_a_mismatched_build_warns_in_one_line_and_is_not_loaded(monkeypatch):
    running = {"torch": "9.9.9", "cxx11_abi": 1}
    monkeypatch.setattr(compiled.flags, "build_info", lambda _torch: running)
    message = _refused(monkeypatch)
    assert "built for an unrecorded torch" in message and "running torch 9.9.9" in message
    assert "pip install --no-build-isolation ." in message and f"{jit.ENV}=1" in message


def test_a_build_of_other_op_arguments_warns_in_one_line_and_is_not_loaded(monkeypatch):
    """A _C compiled before backends/spec.py's arguments changed (an update without a rebuild) is not called with
    arguments it does not take: one warning line, then the Triton / torch backends."""
    built = {**{k: str(v) for k, v in flags.build_info(torch).items()}, "ops": "0" * 12}
    monkeypatch.setattr(compiled.flags, "read_build_info", lambda _path: built)
    assert "built from another version of csd_kernels (its ops take other arguments)" in _refused(monkeypatch)


def test_the_ops_contract_follows_the_declaration(tmp_path):
    """The recorded contract changes with the ops' arguments (here: one more choice in the settings record)."""
    import csd_kernels.backends.spec as spec_module

    text = pathlib.Path(spec_module.__file__).read_text()
    line = "    depth_limit: int = 1  # the tree's D (verify_tree)\n"
    assert line in text
    (tmp_path / "spec.py").write_text(text.replace(line, line + "    extra: int = 0\n"))
    assert flags.ops_contract(str(tmp_path / "spec.py")) != flags.ops_contract()


def test_the_package_falls_back_when_its_extension_is_for_another_torch():
    """A fresh interpreter whose torch claims another version: one warning line, no compiled backend, and verify
    still runs (on the torch backend)."""
    if compiled.compiled_extension() is None:
        pytest.skip("csd_kernels._C not built")
    code = ("import torch; torch.__version__ = '0.0.1'\n"
            "import csd_kernels as ck\n"
            "print('backends', ck.available_backends('cpu'))\n")
    env = {**os.environ, "PYTHONWARNINGS": "default"}
    env.pop(jit.ENV, None)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env,
                            cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "'compiled'" not in result.stdout and "torch" in result.stdout
    lines = [line for line in result.stderr.splitlines() if "BuildMismatchWarning" in line]
    assert len(lines) == 1 and "running torch 0.0.1" in lines[0], result.stderr[-3000:]


def test_the_jit_cache_is_keyed_by_torch_and_sources(tmp_path, monkeypatch):
    monkeypatch.setenv(jit.CACHE_ENV, str(tmp_path / "cache"))
    root = jit.source_root()
    info = {"torch": "2.14.1", "cxx11_abi": 1}
    first = jit.cache_dir(root, info, with_cuda=False)
    assert first == jit.cache_dir(root, info, with_cuda=False) and first.parent == tmp_path / "cache"
    assert first != jit.cache_dir(root, {**info, "torch": "2.13.0"}, with_cuda=False)
    assert first != jit.cache_dir(root, info, with_cuda=True)


@pytest.fixture(scope="module")
def setup_module_globals():
    return runpy.run_path(str(REPO / "setup.py"), run_name="csd_kernels_setup")


def test_setup_refuses_a_build_without_the_torch_that_will_load_it(setup_module_globals):
    check = setup_module_globals["_check_build_torch"]
    isolated = types.SimpleNamespace(__version__="2.15.0", __file__="/tmp/pip-build-env-x/overlay/torch/__init__.py")
    for build_torch in (None, isolated):
        with pytest.raises(SystemExit) as refused:
            check(build_torch, ["setup.py", "bdist_wheel", "--dist-dir", "out"])
        assert "\n" not in str(refused.value) and "pip install --no-build-isolation ." in str(refused.value)
    check(None, ["setup.py", "egg_info"])  # metadata only: no torch needed
    check(torch, ["setup.py", "bdist_wheel"])  # the torch of this environment


def test_an_isolated_pip_build_is_refused_in_one_line(tmp_path):
    """`pip wheel .` without --no-build-isolation: pip's build environment has no torch (pyproject does not ask for
    one), and the build stops with the refusal instead of making a wheel for another torch."""
    env = {**os.environ, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(_wheel_dir())}
    result = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(tmp_path), str(REPO)],
                            capture_output=True, text=True, timeout=600, env=env)
    assert result.returncode != 0
    assert "this build environment has no torch" in result.stdout + result.stderr
    assert not list(tmp_path.glob("*.whl"))


def _wheel_dir() -> pathlib.Path:
    """The build requirements as wheels, from this environment (pip may not reach an index in the tests)."""
    out = REPO / "build" / "test-wheels"
    if not out.exists():
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "-d", str(out), "setuptools>=64", "wheel",
                        "numpy", "pybind11", "ninja"], check=True, timeout=600)
    return out


def test_no_source_holds_the_record_marker():
    """The loader takes the first marker in the binary: a docstring quoting it (as one did) would be read instead."""
    for top in flags.SOURCE_DIRS:
        for path in (REPO / top).rglob("*"):
            if path.is_file() and path.suffix in (".cpp", ".cu", ".h", ".cuh"):
                assert flags.BUILD_INFO_MARKER not in path.read_bytes(), path
