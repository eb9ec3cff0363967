// Internal interface of the CPU kernel (csrc/cpu/verify.cpp). Raw pointers only; the torch glue lives in
// csrc/verify_glue.h.
#pragma once

#include <stdint.h>

#include "../verify_row.h"

namespace csd {
namespace cpu {

struct Problem {
  int64_t B, L;
  VerifyParams prm;
  int logit_dtype;  // LogitDtype
  const void* logits;
  int64_t lg_sB, lg_sL;
  const void* uncond;  // nullptr: no CFG
  int64_t un_sB, un_sL;
  const float* draft_probs;  // nullptr: one-hot q
  int64_t q_sB, q_sL, q_sV;  // q_sV in {0, 1}
  const int64_t* draft_tokens;
  int64_t dt_sB, dt_sL;
  const int64_t* start;      // [B] contiguous
  const int64_t* positions;  // [B] contiguous
  const int64_t* seed;       // [n_seed]
  int64_t n_seed;
  const int64_t* offset;     // [n_offset]
  int64_t n_offset;          // 1 (shared) or B (per row: row b uses offset[b])
  float* probs;  // [B, L, V] or nullptr
  float *entropy, *tvd, *accept_prob, *distortion;  // [B, L]
  uint32_t* flags;                                  // [B, L] workspace
  int64_t* resampled;                               // [B, L] workspace
  int64_t* later;                                   // [B, L]: the tokens output
  int32_t *accept_len, *status;                     // [B]
  int isa_override;                                 // 0 auto, 1 baseline, 2 AVX2 (tests)
};

void verify_rows_cpu_impl(const Problem& P);
int detect_isa_public();  // 0 baseline, 1 AVX2+FMA, 2 AVX-512

}  // namespace cpu
}  // namespace csd
