#!/usr/bin/env bash
# The test command of the README: install into ./.venv (see install.sh), then the whole suite on the CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
. .venv/bin/activate
python -m pytest -q tests "$@"
