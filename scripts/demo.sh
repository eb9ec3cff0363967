#!/usr/bin/env bash
# The main job of the README: install into ./.venv (see install.sh), then generate colour scenes with CSD on the shipped
# scenes model (576 tokens per image, Janus-Pro's count), the same prompts with plain AR, and every decoding mode on
# the same prompts and seeds. Results land in out/demo/. Each step says what it does and roughly how long it takes on
# a 2-core CPU (docs/development.md: the times measured, and how the last one's was estimated); `csd compare` prints a
# line per mode as each finishes.
set -euo pipefail
cd "$(dirname "$0")/.."
step() { echo; echo "== $*"; }
step "1/4 installing torch (CPU) and the package into ./.venv (first time: a few minutes; then seconds)"
bash scripts/install.sh
. .venv/bin/activate
PROMPT="red circle top-left; blue square center; yellow triangle bottom-right; on clouds"
step "2/4 csd generate: 16 scenes with CSD, 576 tokens each (about 1-2 minutes on a 2-core CPU)"
csd generate --model scenes --prompt "$PROMPT" --mode csd --num 16 --seed 0 --out out/demo/csd
step "3/4 csd generate: the same 16 scenes with plain AR, one token a pass (about 1-2 minutes on a 2-core CPU)"
csd generate --model scenes --prompt "$PROMPT" --mode ar --num 16 --seed 0 --out out/demo/ar --quiet
step "4/4 csd compare: every mode on 8 of the scenes, a line per mode as it finishes (roughly 5-10 minutes on a 2-core" \
     "CPU)"
csd compare --model scenes --prompt "$PROMPT" --num 8 --seeds 1 --out out/demo/compare --quiet
echo
echo "open out/demo/csd/grid.png, out/demo/csd/maps.png and out/demo/compare/compare.png"
