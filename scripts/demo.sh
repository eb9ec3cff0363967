#!/usr/bin/env bash
# The main job of the README: install into ./.venv (see install.sh), then generate colour scenes with CSD on the shipped
# scenes model (576 tokens per image, Janus-Pro's count), the same prompts with plain AR, and every decoding mode on
# the same prompts and seeds. Results land in out/demo/.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
. .venv/bin/activate
PROMPT="red circle top-left; blue square center; yellow triangle bottom-right; on clouds"
csd generate --model scenes --prompt "$PROMPT" --mode csd --num 16 --seed 0 --out out/demo/csd
csd generate --model scenes --prompt "$PROMPT" --mode ar --num 16 --seed 0 --out out/demo/ar --quiet
csd compare --model scenes --prompt "$PROMPT" --num 8 --seeds 1 --out out/demo/compare --quiet
echo "open out/demo/csd/grid.png, out/demo/csd/maps.png and out/demo/compare/compare.png"
