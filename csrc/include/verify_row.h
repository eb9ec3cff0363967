// The per-(row, position) maths of CSD verification, shared by the CPU and CUDA kernels.
//
// csd_kernels/reference/ is the definition; this header holds the scalar pieces every backend composes:
// logit loading (fp32 / fp16 / bf16 -> fp32), the CFG mix and temperature scale, the entropy from the softmax sums and
// the per-row epilogue (accept_len, token selection, status bits); the per-position decision is decision.h's. All
// maths is fp32 (the inverse-CDF prefix sums are fp64, like torch.cumsum on the CPU), without contraction (ieee.h).
// No torch headers.
#pragma once

#include <stdint.h>
#include <string.h>

#include "ieee.h"
#include "philox.h"
#include "rules.h"

namespace csd {

// ---- conventions of the op (mirrored in python/bindings.cpp and the Python wrapper) --------------------------------
enum Coupling : int { kCouplingIndependent = 0, kCouplingMaximal = 1, kCouplingGumbel = 2 };
enum LogitDtype : int { kLogitF32 = 0, kLogitF16 = 1, kLogitBF16 = 2 };

// Status bits, as reference.STATUS_*.
constexpr int32_t kStatusBadLogits = 1;
constexpr int32_t kStatusBadDraftToken = 2;
constexpr int32_t kStatusBadDraftProbs = 4;
constexpr int32_t kStatusMissingCommittedToken = 8;

// Per-position flags handed from the position pass to the row epilogue.
constexpr uint32_t kFlagAccepted = 1u;
constexpr uint32_t kFlagBadLogits = 2u;
constexpr uint32_t kFlagHasDraft = 4u;
constexpr uint32_t kFlagBadToken = 8u;
constexpr uint32_t kFlagBadProbs = 16u;

// ---- logit loading: fp32 / fp16 / bf16 -> fp32 (exact) --------------------------------------------------------------
struct f16_bits {
  uint16_t x;
};
struct bf16_bits {
  uint16_t x;
};

CSD_HD float bf16_to_float(uint16_t h) { return bits_to_float(static_cast<uint32_t>(h) << 16); }

// IEEE half -> float, branch free (the fp16 library's method; handles subnormals, Inf and NaN).
CSD_HD float f16_to_float(uint16_t h) {
  const uint32_t w = static_cast<uint32_t>(h) << 16;
  const uint32_t sign = w & 0x80000000u;
  const uint32_t two_w = w + w;
  const float normalized = bits_to_float((two_w >> 4) + (0xE0u << 23)) * 1.925929944387236e-34f;  // 2^-112
  const float denormalized = bits_to_float((two_w >> 17) | (126u << 23)) - 0.5f;
  const uint32_t body = two_w < (1u << 27) ? float_to_bits(denormalized) : float_to_bits(normalized);
  return bits_to_float(sign | body);
}

// Load-and-convert functors: LogitLoad<T>::load(ptr, v) -> float.
template <typename T>
struct LogitLoad;
template <>
struct LogitLoad<float> {
  CSD_HD static float load(const float* p, int64_t v) { return p[v]; }
};
template <>
struct LogitLoad<f16_bits> {
  CSD_HD static float load(const f16_bits* p, int64_t v) { return f16_to_float(p[v].x); }
};
template <>
struct LogitLoad<bf16_bits> {
  CSD_HD static float load(const bf16_bits* p, int64_t v) { return bf16_to_float(p[v].x); }
};

// ---- the scalar parameters of one verify call -----------------------------------------------------------------------
struct VerifyParams {
  int64_t vocab;
  int has_uncond;
  float cfg_scale;        // s, rounded to fp32 like torch's tensor * python-float
  int greedy;             // temperature == 0
  float inv_temperature;  // float(1/T) (double division, rounded once to fp32), as reference.mixed_logits
  int64_t top_k;          // 0 or >= vocab: no restriction
  int rule;               // csd::Rule (rules.h)
  float rule_params[kMaxRuleParams];  // the rule's parameters, in config/acceptance.py's order
  int gather_distortion;  // compute the distortion of the rules whose a(y) for every y costs more (lantern, gsd)
  float max_distortion;   // above it a position is decided strictly (reference.verify); inf: no cap
  const int64_t* neighbours;  // [V, nb_k] with row stride nb_stride (lantern), else nullptr
  int64_t nb_stride, nb_k;
  int coupling;         // kCoupling*
  float top_p;          // 1: no restriction (reference.restrict_top_p)
  float log_min_p;      // float32(ln min_p); -inf: no restriction (reference.restrict_min_p)
  int probs_input;      // the logits pointer holds target probabilities w (p = w / sum w)
  double prob_sum_tolerance;  // reference.PROB_SUM_TOLERANCE
};

constexpr double kProbSumTolerance = 1e-3;  // reference.PROB_SUM_TOLERANCE

// A token is masked (p = 0, z = -inf) when either logit is -inf; NaN or +inf in either, or a mix of finite logits
// that overflows, is bad input (reference.mixed_logits).
CSD_HD bool logit_is_bad(float x) { return !(x < f_inf()); }

// z = (u + s*(c - u)) * (1/T)   (no scaling when greedy)
CSD_HD float mix_logit(float c, float u, const VerifyParams& prm) {
  float z = prm.has_uncond ? f_add(u, f_mul(prm.cfg_scale, f_sub(c, u))) : c;
  return prm.greedy ? z : f_mul(z, prm.inv_temperature);
}

// z with the -inf mask applied; *bad set when the element is bad input (see logit_is_bad).
CSD_HD float masked_mix_logit(float c, float u, const VerifyParams& prm, bool* bad) {
  const bool masked = c == -f_inf() || (prm.has_uncond && u == -f_inf());
  const float z = mix_logit(c, u, prm);
  *bad = logit_is_bad(c) || (prm.has_uncond && logit_is_bad(u)) || (!masked && !f_isfinite(z));
  return masked ? -f_inf() : z;
}

// Entropy of p = e / Z with e = exp(z - max): H = ln Z - (1/Z) * sum e*(z - max)  (= -sum p ln p), clamped at 0.
CSD_HD float entropy_from_sums(double z_sum, double ez_sum) {
  const double h = log(z_sum) - ez_sum / z_sum;
  return h > 0.0 ? static_cast<float>(h) : 0.0f;
}

// Draft token sanitising: tokens outside [-1, V) are bad and treated as -1 (no draft).
CSD_HD bool draft_token_is_bad(int64_t tok, int64_t vocab) { return tok < -1 || tok >= vocab; }
CSD_HD int64_t sanitized_draft_token(int64_t tok, int64_t vocab) {
  return draft_token_is_bad(tok, vocab) ? int64_t(-1) : tok;
}

// Per-row epilogue. flags[i], resampled[i] (token at accept_len), tokens[i] (on input: the "later" token) for the
// row's L positions; draft tokens raw (any value) with stride. Writes tokens, *accept_len, *status.
// The workspaces are read through volatile pointers: in the CUDA split path other blocks wrote them in this launch.
// A resampled token not drawn yet (gsd without its distortion on the CPU: drawn at the row's first stop only).
constexpr int64_t kResampleDeferred = -2;

// The first position that ends the accepted prefix: a rejected one past the committed prefix, or bad logits;
// length if none.
CSD_HD int64_t first_stop(int64_t length, int64_t start, const volatile uint32_t* flags) {
  for (int64_t i = 0; i < length; ++i) {
    const uint32_t f = flags[i];
    if ((!(f & kFlagAccepted) && i >= start) || (f & kFlagBadLogits)) return i;
  }
  return length;
}

CSD_HD void row_epilogue(int64_t length, int64_t vocab, int64_t start, const int64_t* draft_tokens,
                         int64_t draft_stride, const volatile uint32_t* flags, const volatile int64_t* resampled,
                         volatile int64_t* tokens, int32_t* accept_len, int32_t* status) {
  const int64_t al = first_stop(length, start, flags);
  int32_t st = 0;
  for (int64_t i = 0; i < length; ++i) {
    const uint32_t f = flags[i];
    const bool committed = i < start;
    if (f & kFlagBadLogits) st |= kStatusBadLogits;
    if (f & kFlagBadToken) st |= kStatusBadDraftToken;
    if ((f & kFlagBadProbs) && (f & kFlagHasDraft)) st |= kStatusBadDraftProbs;  // q decides only where drafted
    if (committed && !(f & kFlagHasDraft)) st |= kStatusMissingCommittedToken;
  }
  for (int64_t i = 0; i < length; ++i) {
    int64_t t;
    if (i < al)
      t = sanitized_draft_token(draft_tokens[i * draft_stride], vocab);
    else if (i == al)
      t = resampled[i];
    else
      t = tokens[i];
    if ((flags[i] & kFlagBadLogits) || t < 0) t = 0;
    tokens[i] = t;
  }
  *accept_len = static_cast<int32_t>(al);
  *status = st;
}

// A [B, rows, V] logit tensor (last-dim stride 1) as the kernels read it; data nullptr: absent (no CFG).
struct LogitRows {
  const void* data;
  int64_t sB, sRow;
  template <typename T>
  CSD_HD const T* row(int64_t b, int64_t r) const {
    return data ? static_cast<const T*>(data) + b * sB + r * sRow : nullptr;
  }
};

// One verification call described by raw pointers and strides: what the torch glue (verify_glue.h) hands to the
// CPU kernel and to the CUDA launcher alike. [B, L] outputs and workspaces are contiguous.
struct VerifyProblem {
  int64_t B, L;
  VerifyParams prm;     // vocab, cfg, temperature, top_k, rule, lambda, tau, coupling
  int logit_dtype;      // LogitDtype
  LogitRows logits;     // [B, L, V]
  LogitRows uncond;     // absent when no CFG; same dtype/shape as logits
  const float* draft_probs;  // nullptr: one-hot q
  int64_t q_sB, q_sL, q_sV;  // q_sV in {0, 1}
  const int64_t* draft_tokens;
  int64_t dt_sB, dt_sL;
  const int64_t* start;      // [B]
  const int64_t* positions;  // [B]
  const int64_t* seed;       // [n_seed] (on the tensors' device)
  int64_t n_seed;            // 1 (shared) or B (per row)
  const int64_t* offset;     // [n_offset] (on the tensors' device)
  int64_t n_offset;          // 1 (shared) or B (per row: row b uses offset[b])
  float* probs;              // [B, L, V] or nullptr
  float *entropy, *tvd, *accept_prob, *distortion;  // [B, L]
  uint32_t* flags;                                  // [B, L] workspace
  int64_t* resampled;                               // [B, L] workspace
  int64_t* tokens;                                  // [B, L] output
  int32_t *accept_len, *status;                     // [B]
  int64_t split_block;  // CUDA only: vocabulary slice per block of the split path, 0 = one block per position
  void* workspace;      // CUDA only: the split path's workspace (csd_verify_workspace_bytes), else nullptr
  const uint8_t* informed;  // [B, L] bool (strides inf_sB, inf_sL) or nullptr: every slot informed
  int64_t inf_sB, inf_sL;
};

// The parameters slot (b, i) is decided with: the call's, or the strict rule where the slot's draft was drawn
// without information (reference.verify's ``informed``: a = min(1, p/q), distortion 0, the strict residual).
CSD_HD VerifyParams params_at(const VerifyProblem& P, int64_t b, int64_t i) {
  VerifyParams prm = P.prm;
  if (P.informed != nullptr && P.informed[b * P.inf_sB + i * P.inf_sL] == 0) prm.rule = kRuleStrict;
  return prm;
}

}  // namespace csd
