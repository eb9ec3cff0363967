"""The torch matrix: for each torch, a side venv, the package built with `pip wheel --no-build-isolation` (what
`pip install --no-build-isolation .` runs) and installed with its test extras, then the core subset (SUBSET: the op's
API, backend equality, the C++ kernel, the build's own tests, golden tokens) and `csd generate` on digits. Prints one
markdown row per torch (docs/development.md#the-torch-matrix keeps the table).

    python3 scripts/torch_matrix.py 2.13.0 2.14.1            # torch releases pip can install here
    python3 scripts/torch_matrix.py /path/torch-2.11.0-....whl  # or a wheel file
    python3 scripts/torch_matrix.py --python python3.12 2.14.1   # another Python (its venvs: torch-2.14.1-python3.12)
    MATRIX_DIR=build/matrix CSD_KERNELS_CUDA=0 (defaults); --venv-only: make the venvs, build and test nothing

Each torch gets MATRIX_DIR/torch-<version>/{venv,src,wheels,out}; a venv is reused when it exists. Standard library
only, so any python3 runs it."""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SUBSET = ["tests/test_verify_api.py", "tests/test_backends.py", "tests/test_cpp_kernel.py", "tests/test_build.py",
          "tests/test_golden.py"]
GENERATE = ["generate", "--model", "digits", "--prompt", "4", "--mode", "csd", "--num", "4", "--seed", "0"]


def run(command, cwd=None, env=None, log=None, timeout=3600):
    """Runs command, appending its output to log; returns (exit status, seconds, output)."""
    start = time.time()
    result = subprocess.run([str(c) for c in command], cwd=cwd, env=env, capture_output=True, text=True,
                            timeout=timeout)
    seconds = time.time() - start
    if log is not None:
        with open(log, "a") as f:
            f.write(f"$ {' '.join(map(str, command))}\n{result.stdout}{result.stderr}\n[exit {result.returncode}, "
                    f"{seconds:.0f} s]\n")
    return result.returncode, seconds, result.stdout + result.stderr


def version_of(spec: str) -> str:
    match = re.search(r"torch-([^-]+)-", Path(spec).name) if spec.endswith(".whl") else None
    return match.group(1) if match else spec.split("==")[-1]


def make_venv(directory: Path, spec: str, log: Path, base_python: str) -> Path:
    python = directory / "venv" / "bin" / "python"
    if not python.exists():
        run([base_python, "-m", "venv", directory / "venv"], log=log)
        run([python, "-m", "pip", "install", "-q", "--upgrade", "pip", "setuptools", "wheel"], log=log)
    requirement = spec if spec.endswith(".whl") else f"torch=={spec.split('==')[-1]}"
    status, _, output = run([python, "-m", "pip", "install", "-q", requirement, "pybind11", "ninja", "numpy"], log=log)
    if status:
        raise RuntimeError(f"installing {requirement} failed: {output[-2000:]}")
    return python


def copy_tree(destination: Path):
    """The working tree as git sees it (tracked and untracked, not ignored): no .venv, no build/, no built .so."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, check=True,
                           capture_output=True).stdout.decode().split("\0")
    for name in ("csd_kernels", "csrc", "python", "tests"):  # build/ stays for --incremental
        shutil.rmtree(destination / name, ignore_errors=True)
    for name in filter(None, files):
        if (REPO / name).is_file():
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, destination / name)


def counts(output: str) -> dict:
    """pytest's closing line as {'passed': n, 'failed': n, ...}."""
    last = output.strip().splitlines()[-1] if output.strip() else ""
    found = re.findall(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed)", last)
    return {word: int(n) for n, word in found}


def one_torch(spec: str, root: Path, venv_only: bool, base_python: str = sys.executable,
              incremental: bool = False) -> dict:
    suffix = "" if base_python == sys.executable else "-" + Path(base_python).name
    directory = root / f"torch-{version_of(spec)}{suffix}"
    directory.mkdir(parents=True, exist_ok=True)
    log = directory / "log.txt"
    python = make_venv(directory, spec, log, base_python)
    _, _, about = run([python, "-c", "import json, sys, torch; print(json.dumps([torch.__version__, "
                       "'%d.%d.%d' % sys.version_info[:3]]))"], log=log)
    torch_version, python_version = json.loads(about.strip().splitlines()[-1])
    row = {"torch": torch_version, "python": python_version}
    if venv_only:
        return row
    src, wheels = directory / "src", directory / "wheels"
    if not incremental:  # a build from scratch, as a new user's
        shutil.rmtree(src, ignore_errors=True)
    copy_tree(src)
    shutil.rmtree(wheels, ignore_errors=True)
    env = {**os.environ, "CSD_KERNELS_CUDA": os.environ.get("CSD_KERNELS_CUDA", "0")}
    status, seconds, output = run([python, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-w", wheels,
                                   "."], cwd=src, env=env, log=log)
    row["build_s"] = round(seconds)
    if status:
        return {**row, "error": "build failed: " + output.strip().splitlines()[-1]}
    (wheel,) = wheels.glob("csd_kernels-*.whl")
    row["wheel_mb"] = round(wheel.stat().st_size / 2**20, 1)
    run([python, "-m", "pip", "install", "-q", "--force-reinstall", "--no-deps", wheel], log=log)
    run([python, "-m", "pip", "install", "-q", f"{wheel}[test]"], log=log)
    with zipfile.ZipFile(wheel) as archive:  # the tests run in the copy: give it the extension pip built
        for name in archive.namelist():
            if re.fullmatch(r"csd_kernels/_C[^/]*\.so", name):
                (src / name).write_bytes(archive.read(name))
    _, row["tests_s"], output = run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider", *SUBSET], cwd=src,
                                    env=env, log=log)
    row["tests"] = counts(output)
    row["tests_s"] = round(row["tests_s"])
    csd = python.parent / "csd"
    status, _, output = run([csd, *GENERATE, "--out", directory / "out"], cwd=directory, env=env, log=log)
    row["generate"] = "ok" if status == 0 else "failed: " + output.strip().splitlines()[-1]
    return row


def markdown(row: dict) -> str:
    tests = row.get("tests", {})
    return (f"| {row['torch']} | {row['python']} | {row.get('build_s', '-')} | {tests.get('passed', 0)} / "
            f"{tests.get('failed', 0)} ({tests.get('skipped', 0)} skipped, {row.get('tests_s', '-')} s) | "
            f"{row.get('generate', row.get('error', '-'))} | {row.get('wheel_mb', '-')} |")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("torch", nargs="+", help="torch versions (2.14.1) or wheel files")
    parser.add_argument("--venv-only", action="store_true", help="make the venvs only")
    parser.add_argument("--incremental", action="store_true", help="keep the last build's objects (timing not new)")
    parser.add_argument("--python", default=sys.executable, help="the Python of the venvs (default: this one)")
    args = parser.parse_args(argv)
    root = Path(os.environ.get("MATRIX_DIR", REPO / "build" / "matrix")).resolve()
    print("| torch | Python | build s | subset passed / failed | csd generate digits | wheel MB |")
    print("| --- | --- | --- | --- | --- | --- |")
    bad = 0
    for spec in args.torch:
        row = one_torch(spec, root, args.venv_only, args.python, args.incremental)
        with open(root / "results.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")
        print(markdown(row), flush=True)
        bad += bool(row.get("error") or row.get("tests", {}).get("failed") or row.get("generate", "ok") != "ok")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
