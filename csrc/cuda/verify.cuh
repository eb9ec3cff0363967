// C launcher of the CUDA kernel of torch.ops.csd_kernels.verify_rows. Raw pointers and a cudaStream_t only; the
// torch glue is csrc/cuda/verify_glue.cpp. Seed and offset are device pointers read inside the kernel, so a launch
// never synchronises with the host and can be captured in a CUDA graph.
#pragma once

#include <cuda_runtime_api.h>
#include <stdint.h>

#include "../include/verify_row.h"  // csd::VerifyProblem

// The vocabulary slice per block of the split path (several blocks per position, for small batches), or 0 for one
// block per position (the default until CSD_KERNELS_CUDA_SPLIT=1). The caller stores it in args->split_block.
extern "C" int64_t csd_verify_split_block(const csd::VerifyProblem* args);

// Bytes of device workspace the launch needs for args->split_block (0 for one block per position).
extern "C" int64_t csd_verify_workspace_bytes(const csd::VerifyProblem* args);

// Enqueues the verification on `stream`; returns the cudaError_t of the launches (cudaSuccess = 0).
extern "C" int csd_verify_rows_launch(const csd::VerifyProblem* args, cudaStream_t stream);
