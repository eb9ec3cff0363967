// C launcher of the CUDA kernel of torch.ops.csd_kernels.verify_rows. Raw pointers and a cudaStream_t only; the
// torch glue is csrc/cuda/verify_glue.cpp. Seed and offset are device pointers read inside the kernel, so a launch
// never synchronises with the host and can be captured in a CUDA graph.
#pragma once

#include <cuda_runtime_api.h>
#include <stdint.h>

#include "../verify_row.h"

struct CsdVerifyLaunch {
  int64_t B, L;
  csd::VerifyParams prm;  // vocab, cfg, temperature, top_k, mode, lambda, tau, next_drafts
  int logit_dtype;        // csd::LogitDtype
  const void* logits;     // [B, L, V], last-dim stride 1
  int64_t lg_sB, lg_sL;
  const void* uncond;  // nullptr when no CFG; same dtype/shape as logits
  int64_t un_sB, un_sL;
  const float* draft_probs;  // nullptr: one-hot q
  int64_t q_sB, q_sL, q_sV;  // q_sV in {0, 1}
  const int64_t* draft_tokens;
  int64_t dt_sB, dt_sL;
  const int64_t* start;      // [B]
  const int64_t* positions;  // [B]
  const int64_t* seed;       // [n_seed] (device)
  int64_t n_seed;            // 1 (shared) or B (per row)
  const int64_t* offset;     // [n_offset] (device)
  int64_t n_offset;          // 1 (shared) or B (per row: row b uses offset[b])
  float* probs;              // [B, L, V] or nullptr
  float *entropy, *tvd, *accept_prob, *distortion;  // [B, L]
  uint32_t* flags;                                  // [B, L] workspace
  int64_t* resampled;                               // [B, L] workspace
  int64_t* tokens;                                  // [B, L] output
  int32_t *accept_len, *status;                     // [B]
};

// Enqueues the verification on `stream`; returns the cudaError_t of the launches (cudaSuccess = 0).
extern "C" int csd_verify_rows_launch(const CsdVerifyLaunch* args, cudaStream_t stream);
