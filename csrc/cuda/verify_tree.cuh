// C launcher of the CUDA kernel of torch.ops.csd_kernels.verify_tree_rows. Raw pointers and a cudaStream_t only; the
// torch glue is csrc/cuda/tree_glue.cpp. Seed and offset are device pointers read inside the kernel (no host sync).
#pragma once

#include <cuda_runtime_api.h>

#include "../include/tree_row.h"  // csd::TreeProblem

// Enqueues the tree verification (one block per row) on `stream`; returns the cudaError_t of the launch.
extern "C" int csd_verify_tree_launch(const csd::TreeProblem* problem, cudaStream_t stream);
