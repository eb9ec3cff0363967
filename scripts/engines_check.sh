#!/usr/bin/env bash
# The adapters inside the real installed engines (NOT run by CI: vLLM pulls ~10 GB and the run takes tens of minutes).
#
#   bash scripts/engines_check.sh [VENV_ROOT]        (default /work/venvs; writes VENV_ROOT/engines_check.md)
#
# Makes VENV_ROOT/vllm with the newest vLLM the index serves (VLLM_SPEC=vllm==X pins one), installs this package into
# it from a scratch copy (CSD_KERNELS_CUDA=0; the C++ standard is the one that torch asks for, see issue 44),
# downloads the matching vLLM sdist for its tests (VLLM_SDIST=PATH: one at hand), and runs scripts/engines_check.py: signatures, the plugin through
# vLLM's loader, vLLM's test files for both samplers with vLLM's function and with ours. The table it prints is the
# one in docs/drop-in.md. SGLang: see docs/drop-in.md for what runs on a CPU.
set -euo pipefail
root=${1:-/work/venvs}
repo=$(cd "$(dirname "$0")/.." && pwd)
venv=$root/vllm
scratch=$(mktemp -d /tmp/engines_check.XXXXXX)
mkdir -p "$root"

[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/pip" install -q "${VLLM_SPEC:-vllm}" pytest 2>&1 | grep -v "^WARNING: Location" || true
version=$("$venv/bin/python" -c "import importlib.metadata as m; print(m.version('vllm'))")

# this package, built against the venv's torch: a scratch copy with the C++ standard that torch needs
git -C "$repo" ls-files -z --cached --others --exclude-standard | (cd "$repo" && xargs -0 tar cf -) | tar xf - -C "$scratch" --one-top-level=pkg
CSD_KERNELS_CUDA=0 "$venv/bin/pip" install -q --no-build-isolation "$scratch/pkg" 2>&1 | grep -v "^WARNING: Location" || true

# vLLM's tests, from the sdist of the installed version (VLLM_SDIST: one already downloaded; pip download prepares
# the sdist's metadata, which may fail on a CPU after the file came)
sdist=${VLLM_SDIST:-$scratch/sdist/vllm-$version.tar.gz}
[ -f "$sdist" ] || (cd "$scratch" && pip download -q --no-deps --no-binary :all: "vllm==$version" -d sdist \
    >/dev/null 2>&1 || true)
[ -f "$sdist" ] || { echo "could not download the vllm $version sdist: pass VLLM_SDIST=PATH" >&2; exit 1; }
tar xzf "$sdist" -C "$scratch" "vllm-$version/tests"
touch "$scratch/vllm-$version/tests/__init__.py"

# SGLang: its wheel only (its tests need sgl-kernel / JIT CUDA kernels): the wrapper's signature, read by AST
(cd "$scratch" && pip download -q --no-deps "${SGLANG_SPEC:-sglang}" -d sglang >/dev/null 2>&1 || true)
sglang_wheel=$(ls "$scratch"/sglang/sglang-*.whl 2>/dev/null | head -1)

cd "$scratch"  # not the repo: the installed package is the one under test
"$venv/bin/python" "$repo/scripts/engines_check.py" --tests "$scratch/vllm-$version" --out "$root/engines_check.md" \
    ${sglang_wheel:+--sglang-wheel "$sglang_wheel"} "${@:2}"
echo "table: $root/engines_check.md (scratch: $scratch)"
