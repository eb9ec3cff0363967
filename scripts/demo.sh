#!/usr/bin/env bash
# The main job of the README: install into ./.venv (see install.sh), then generate sevens with CSD on the shipped
# digits model and compare every decoding mode on the same prompts and seeds. Results land in out/demo/.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
. .venv/bin/activate
csd generate --model digits --prompt 7 --mode csd --num 16 --seed 0 --out out/demo/csd
csd generate --model digits --prompt 7 --mode ar --num 16 --seed 0 --out out/demo/ar --quiet
csd compare --model digits --prompt 7 --num 32 --seeds 2 --out out/demo/compare --quiet
echo "open out/demo/csd/grid.png, out/demo/csd/maps.png and out/demo/compare/compare.png"
