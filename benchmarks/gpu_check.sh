#!/usr/bin/env bash
# The one GPU check, for whoever has an NVIDIA GPU (< 5 minutes on an H200): build the extension with CUDA against
# the machine's own torch, run the GPU tests and the CPU/GPU agreement tests, then the verify benchmark on the GPU.
# Usage: bash benchmarks/gpu_check.sh [OUT_DIR]      (results land in OUT_DIR, default benchmarks/results/gpu)
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-benchmarks/results/gpu}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
python3 - <<'EOF'
import torch, triton
print("torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__, torch.cuda.get_device_name())
EOF
echo "== build csd_kernels._C with CUDA (sm_90)"
start=$(date +%s)
CSD_KERNELS_CUDA=1 CSD_KERNELS_CUDA_ARCH="9.0" MAX_JOBS=16 python3 setup.py -q build_ext --inplace 2>&1 | tail -n 20
echo "build took $(( $(date +%s) - start )) s"
python3 -c "import csd_kernels as ck; print('backends on cuda:', ck.available_backends('cuda'))"
echo "== GPU tests"
python3 -m pytest -q -x tests/test_gpu.py -p no:cacheprovider 2>&1 | tee "$out/tests.log"
echo "== benchmark"
python3 benchmarks/bench_verify.py --device cuda --out "$out" --repeats 50 2>&1 | tee "$out/bench.log"
