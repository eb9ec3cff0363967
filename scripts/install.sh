#!/usr/bin/env bash
# Installs csd-kernels into ./.venv: the CPU build of torch first (a plain `torch` requirement could pull a
# multi-GB CUDA build), then the build tools, then the package itself (compiling csd_kernels._C against that
# torch) with its test extras. Safe to rerun: pip skips what is already there.
set -euo pipefail
cd "$(dirname "$0")/.."
TORCH_SPEC="${CSD_TORCH_SPEC:-torch==2.13.0}"
[ -x .venv/bin/python ] || python3 -m venv .venv
. .venv/bin/activate
pip install -q --upgrade pip setuptools wheel
pip install -q "$TORCH_SPEC"
pip install -q pybind11 ninja numpy  # numpy before the build imports torch: no "Failed to initialize NumPy"
pip install -q --no-build-isolation -e ".[test]"
python -c "import csd_kernels, torch; print('csd_kernels', csd_kernels.__version__, 'torch', torch.__version__, 'backends', csd_kernels.available_backends())"
