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
// What split_stats_kernel leaves of each slice: its max m_s, Z_s, S1_s, the argmax (T = 0) or gumbel argmax with
// its value, the non-finite flag.
struct SliceStats {
  double z_sum, s1;
  int64_t index;
  float max, gumbel_best;
  int32_t bad;
};

// What split_finish_kernel sums over each slice (|p - q|, max(p - q, 0), p, the distortion terms, q) and whether q
// had a bad entry there.
struct SliceSums {
  double abs, residual, p, dist, q;
  int32_t bad_q;
};

struct SplitWorkspace {
  SliceStats* stats;                     // [P*S]
  SliceSums* sums;                       // [P*S]
  unsigned *position_count, *row_count;  // [B*L], [B]
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
  ws->stats = static_cast<SliceStats*>(take(blocks * sizeof(SliceStats)));
  ws->sums = static_cast<SliceSums*>(take(blocks * sizeof(SliceSums)));
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
