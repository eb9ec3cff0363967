#!/usr/bin/env bash
# The one GPU check, for whoever has an NVIDIA GPU (about 5 minutes on an H200). Stages, each time-boxed; a failing
# stage is reported and the next one still runs:
#   build      the extension with CUDA (sm_90) against the machine's own torch
#   tests      tests/test_gpu.py (reference agreement, CPU/GPU agreement, no host sync, CUDA graph replay)
#   tree       tests/test_verify_tree.py on CUDA tensors: the cuda and triton tree backends against the reference
#   agreement  token agreement Triton vs CUDA vs C++ CPU over 2^20 positions at V=4096, Triton vs CUDA at V=16384
#   timing     CUDA-graph device time per call against read-once and the HBM floor (benchmarks/gpu_timing.py)
#   bench      the verify benchmark (benchmarks/bench_verify.py: wall time, vs the authors' loop)
#   host       host time of one eager Triton call (benchmarks/host_time.py --cuda: 1000 calls, validate=False)
#   sanitize   compute-sanitizer memcheck / racecheck / synccheck over benchmarks/gpu_sanitize.py
#   loop_tokens  the decoding loop: CUDA vs CPU tokens on the tiny fixtures, eager / static / static+graph
#   loop_syncs   host syncs per iteration of each loop (torch.cuda.set_sync_debug_mode)
#   loop_speed   wall time per iteration and image, first-call time, GPU-busy fraction at LlamaGen GPT-L and
#                Janus-Pro-7B shapes, random bf16 weights (benchmarks/gpu_loop.py; the loop_* stages: <= 5 min)
# Usage: bash benchmarks/gpu_check.sh [OUT_DIR] [STAGE ...]   (default: every stage; results land in OUT_DIR,
# default benchmarks/results/gpu)
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-benchmarks/results/gpu}"
shift || true
stages="${*:-build tests tree agreement timing bench host sanitize loop_tokens loop_syncs loop_speed}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1 TRITON_INTERPRET=0 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
failed=()

run_stage() {  # name limit_s command...   (command may be a function of this script)
    local name=$1 limit=$2 begin rc
    shift 2
    [[ " $stages " == *" $name "* ]] || return 0
    echo "== $name"
    begin=$(date +%s)
    if declare -F "$1" >/dev/null; then "$@"; else timeout "$limit" "$@"; fi 2>&1 | tee "$out/$name.log"
    rc=${PIPESTATUS[0]}
    echo "== $name: exit $rc after $(( $(date +%s) - begin )) s"
    [ "$rc" -eq 0 ] || failed+=("$name")
}

sanitize() {
    local tool
    for tool in ${SANITIZERS:-memcheck racecheck synccheck}; do  # SANITIZERS / SANITIZE_ARGS=--quick: a subset
        echo "-- compute-sanitizer --tool $tool"
        timeout 120 compute-sanitizer --tool "$tool" --error-exitcode 3 python3 benchmarks/gpu_sanitize.py $SANITIZE_ARGS \
            | tail -n 12 \
            || return 1
    done
}

gpu_tests() {  # per-test time limit when pytest-timeout is installed
    local limit=()
    python3 -c "import pytest_timeout" 2>/dev/null && limit=(--timeout "${TEST_TIMEOUT:-60}")
    timeout 280 python3 -m pytest -q -rfE --tb=short --durations=12 "${limit[@]}" tests/test_gpu.py -p no:cacheprovider
}

agreement() {
    python3 benchmarks/gpu_agreement.py --vocab 16384 --out "$out" && python3 benchmarks/gpu_agreement.py --cpu --out "$out"
}

python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, torch.cuda.get_device_name())"
run_stage build 300 env CSD_KERNELS_CUDA=1 CSD_KERNELS_CUDA_ARCH="9.0" MAX_JOBS=16 python3 setup.py -q build_ext --inplace
python3 -c "import csd_kernels as ck; print('backends on cuda:', ck.available_backends('cuda'))"
run_stage tests 300 gpu_tests
run_stage tree 120 python3 -m pytest -q -rfE --tb=short tests/test_verify_tree.py -k "cuda or triton" -p no:cacheprovider
run_stage agreement 180 agreement
run_stage timing 240 python3 benchmarks/gpu_timing.py --sweep --out "$out"
run_stage bench 180 python3 benchmarks/bench_verify.py --device cuda --out "$out"
run_stage host 120 python3 benchmarks/host_time.py --cuda --calls 1000 --out "$out"
run_stage sanitize 300 sanitize
run_stage loop_tokens 60 python3 benchmarks/gpu_loop.py tokens --out "$out"
run_stage loop_syncs 30 python3 benchmarks/gpu_loop.py syncs --out "$out"
run_stage loop_speed 210 python3 benchmarks/gpu_loop.py speed --out "$out"
echo "failed stages: ${failed[*]:-none}"
[ ${#failed[@]} -eq 0 ]
