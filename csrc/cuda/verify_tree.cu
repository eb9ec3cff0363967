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

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;

// The executor of tree_row on one thread block (see csrc/include/tree_row.h for the interface).
struct BlockExec {
  BlockShared<kWarps>& sh;

  template <class F>
  __device__ void each(int64_t n, F f) const {
    for (int64_t v = threadIdx.x; v < n; v += kThreads) f(v);
  }
  template <class F>
  __device__ double sum(int64_t n, F f) const {
    double s = 0.0;
    for (int64_t v = threadIdx.x; v < n; v += kThreads) s += static_cast<double>(f(v));
    return block_sum(s, sh);
  }
  template <class F>
  __device__ float max(int64_t n, F f) const {
    float m = -f_inf();
    for (int64_t v = threadIdx.x; v < n; v += kThreads) {
      const float x = f(v);
      m = x > m ? x : m;
    }
    return block_max(m, sh);
  }
  template <class F>
  __device__ bool any(int64_t n, F f) const {
    bool hit = false;
    for (int64_t v = threadIdx.x; v < n; v += kThreads) hit |= static_cast<bool>(f(v));
    return block_any(hit, sh);
  }
  __device__ int64_t argmax_first(const float* z, int64_t n) const {
    float best = -f_inf();
    int64_t idx = n;
    for (int64_t v = threadIdx.x; v < n; v += kThreads)
      if (idx == n || z[v] > best) best = z[v], idx = v;
    const int64_t found = block_argmax(best, idx, sh);
    return found < n ? found : 0;
  }
  __device__ float kth_largest(const float* z, int64_t n, int64_t k) const {
    return block_kth_largest([z](int64_t v) { return z[v]; }, n, k, sh);
  }
  __device__ int64_t inverse_cdf(const float* w, int64_t n, float u) const {
    return block_inverse_cdf([w](int64_t v) { return w[v]; }, n, u, sh);
  }
  __device__ void barrier() const { __syncthreads(); }
  __device__ bool leader() const { return threadIdx.x == 0; }
};

template <typename T>
__global__ void __launch_bounds__(kThreads) verify_tree_kernel(TreeProblem P) {
  __shared__ BlockShared<kWarps> sh;
  BlockExec ex{sh};
  tree_row<T>(P, blockIdx.x, ex);
}

}  // namespace
}  // namespace cuda
}  // namespace csd

extern "C" int csd_verify_tree_launch(const csd::TreeProblem* problem, cudaStream_t stream) {
  const csd::TreeProblem& P = *problem;
  if (P.B == 0) return static_cast<int>(cudaSuccess);
  const dim3 grid(static_cast<unsigned>(P.B)), block(csd::cuda::kThreads);
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
