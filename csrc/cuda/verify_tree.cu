// CUDA kernel of torch.ops.csd_kernels.verify_tree_rows (no torch headers: `nvcc -arch=sm_90 -c verify_tree.cu`
// builds alone). One thread block per row runs the walk of csrc/include/tree_row.h: every thread follows the same
// walk, the vocabulary loops are block-strided and combined by the block reductions of block_ops.cuh (the same value in every
// thread, so the walk's control flow stays uniform), and thread 0 writes the outputs. The row's scratch (z, p_j, q_j)
// is global memory [3, V], resident in L2 for Janus-size vocabularies.
#include <cuda_runtime.h>
#include <stdint.h>

#include "../include/block_ops.cuh"
#include "verify_tree.cuh"

namespace csd {
namespace cuda {
namespace {

template <typename T>
__global__ void __launch_bounds__(kRowThreads) verify_tree_kernel(TreeProblem P) {
  __shared__ BlockShared<kRowWarps> sh;
  BlockExec<kRowWarps> ex{sh};
  tree_row<T>(P, blockIdx.x, ex);
}

}  // namespace
}  // namespace cuda
}  // namespace csd

extern "C" int csd_verify_tree_launch(const csd::TreeProblem* problem, cudaStream_t stream) {
  const csd::TreeProblem& P = *problem;
  if (P.B == 0) return static_cast<int>(cudaSuccess);
  const dim3 grid(static_cast<unsigned>(P.B)), block(csd::cuda::kRowThreads);
  switch (P.logit_dtype) {
    case csd::kLogitF32:
      csd::cuda::verify_tree_kernel<float><<<grid, block, 0, stream>>>(P);
      break;
    case csd::kLogitF16:
      csd::cuda::verify_tree_kernel<csd::f16_bits><<<grid, block, 0, stream>>>(P);
      break;
    default:
      csd::cuda::verify_tree_kernel<csd::bf16_bits><<<grid, block, 0, stream>>>(P);
  }
  return static_cast<int>(cudaGetLastError());
}
