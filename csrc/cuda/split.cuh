// The split path of the CUDA verification: S blocks per (row, position), each on one slice of the vocabulary, for the
// small batches of image generation (B*L far below the SM count). Kernels in verify_split.cu; the launcher
// (verify.cu) picks the path.
#pragma once

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#include "../include/verify_row.h"

namespace csd {
namespace cuda {

// Per-slice statistics and sums (struct of arrays over the B*L*S blocks) and the arrival counters.
struct SplitWorkspace {
  double *z_sum, *s1, *abs_sum, *residual_sum, *p_sum, *dist_sum, *q_sum;  // [P*S]
  int64_t* index;                                                   // [P*S] argmax (T = 0) or gumbel argmax
  float *max, *gumbel_best;                                         // [P*S]
  int32_t *bad, *bad_q;                                             // [P*S]
  unsigned *position_count, *row_count;                             // [B*L], [B]
};

// Carves the workspace at `base` (or only measures it when base is nullptr); returns its size in bytes.
__host__ __device__ inline size_t carve_split_workspace(void* base, int64_t blocks, int64_t positions, int64_t rows,
                                                        SplitWorkspace* ws) {
  char* p = static_cast<char*>(base);
  size_t at = 0;
  auto take = [&](size_t bytes) {
    void* q = p ? p + at : nullptr;
    at += (bytes + 15) / 16 * 16;
    return q;
  };
  ws->z_sum = static_cast<double*>(take(blocks * sizeof(double)));
  ws->s1 = static_cast<double*>(take(blocks * sizeof(double)));
  ws->abs_sum = static_cast<double*>(take(blocks * sizeof(double)));
  ws->residual_sum = static_cast<double*>(take(blocks * sizeof(double)));
  ws->p_sum = static_cast<double*>(take(blocks * sizeof(double)));
  ws->dist_sum = static_cast<double*>(take(blocks * sizeof(double)));
  ws->q_sum = static_cast<double*>(take(blocks * sizeof(double)));
  ws->index = static_cast<int64_t*>(take(blocks * sizeof(int64_t)));
  ws->max = static_cast<float*>(take(blocks * sizeof(float)));
  ws->gumbel_best = static_cast<float*>(take(blocks * sizeof(float)));
  ws->bad = static_cast<int32_t*>(take(blocks * sizeof(int32_t)));
  ws->bad_q = static_cast<int32_t*>(take(blocks * sizeof(int32_t)));
  ws->position_count = static_cast<unsigned*>(take(positions * sizeof(unsigned)));
  ws->row_count = static_cast<unsigned*>(take(rows * sizeof(unsigned)));
  return at;
}

// Slices per position for a.split_block.
__host__ __device__ inline int64_t split_count(const VerifyProblem& a) {
  return (a.prm.vocab + a.split_block - 1) / a.split_block;
}

// Enqueues the two split kernels (a.split_block > 0, a.workspace set).
cudaError_t launch_split(const VerifyProblem& a, cudaStream_t stream);

}  // namespace cuda
}  // namespace csd
