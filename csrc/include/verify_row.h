// The per-(row, position) maths of CSD verification, shared by the CPU and CUDA kernels.
//
// csd_kernels/reference/ is the definition; this header holds the scalar pieces every backend composes:
// logit loading (fp32 / fp16 / bf16 -> fp32), the CFG mix and temperature scale, the acceptance rule a(x), the
// closed-form distortion term, the entropy from the softmax sums, the per-position decision and the per-row
// epilogue (accept_len, token selection, status bits). All maths is fp32 (the inverse-CDF prefix sums are fp64, like
// torch.cumsum on the CPU). Products and sums that decide anything are written with round-to-nearest intrinsics on the
// device so nvcc cannot contract them into FMAs (the host build uses -ffp-contract=off for the same reason).
// No torch headers.
#pragma once

#include <stdint.h>
#include <string.h>

#include "philox.h"

#if defined(__CUDACC__) || defined(__HIPCC__)
#include <math.h>
#else
#include <cmath>
#endif

namespace csd {

// ---- conventions of the op (mirrored in python/bindings.cpp and the Python wrapper) --------------------------------
enum Rule : int { kRuleStrict = 0, kRuleCsd = 1 };
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

// ---- IEEE arithmetic without contraction ----------------------------------------------------------------------------
#if defined(__CUDA_ARCH__)
CSD_HD float f_add(float a, float b) { return __fadd_rn(a, b); }
CSD_HD float f_sub(float a, float b) { return __fsub_rn(a, b); }
CSD_HD float f_mul(float a, float b) { return __fmul_rn(a, b); }
CSD_HD float f_div(float a, float b) { return __fdiv_rn(a, b); }
CSD_HD float bits_to_float(uint32_t x) { return __uint_as_float(x); }
CSD_HD uint32_t float_to_bits(float x) { return __float_as_uint(x); }
CSD_HD bool f_isfinite(float x) { return isfinite(x); }
CSD_HD float f_nan() { return __int_as_float(0x7fc00000); }
CSD_HD float f_inf() { return __int_as_float(0x7f800000); }
#else
CSD_HD float f_add(float a, float b) { return a + b; }
CSD_HD float f_sub(float a, float b) { return a - b; }
CSD_HD float f_mul(float a, float b) { return a * b; }
CSD_HD float f_div(float a, float b) { return a / b; }
CSD_HD float bits_to_float(uint32_t x) {
  float f;
  memcpy(&f, &x, sizeof f);
  return f;
}
CSD_HD uint32_t float_to_bits(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  return u;
}
CSD_HD bool f_isfinite(float x) { return std::isfinite(x); }
CSD_HD float f_nan() { return bits_to_float(0x7fc00000u); }
CSD_HD float f_inf() { return bits_to_float(0x7f800000u); }
#endif

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
  int rule;               // kRuleStrict / kRuleCsd
  float entropy_coef;     // lambda
  float tvd_threshold;    // tau
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

// Sortable key of a float (monotone: a < b <=> key(a) < key(b); -0 sorts just below +0).
CSD_HD uint32_t float_order_key(float f) {
  const uint32_t b = float_to_bits(f);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
CSD_HD float float_from_order_key(uint32_t k) { return bits_to_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k); }

// a(x) = min(1, p/q [+ lambda*H if csd and TVD < tau]); 0 when q = 0 (reference.acceptance_probability).
CSD_HD float acceptance_probability(float p_x, float q_x, float h, float tvd, int rule, float entropy_coef,
                                    float tvd_threshold) {
  float ratio = q_x > 0.0f ? f_div(p_x, q_x) : 0.0f;
  if (rule == kRuleCsd && tvd < tvd_threshold) ratio = q_x > 0.0f ? f_add(ratio, f_mul(entropy_coef, h)) : 0.0f;
  return ratio > 1.0f ? 1.0f : ratio;
}

// One term of the closed-form distortion: max(q*a(y) - min(p, q), 0) with a(y) the gated (csd) acceptance;
// lambda_h = entropy_coef * H when the gate is open (callers only sum this when it is).
CSD_HD float distortion_term(float p, float q, float lambda_h) {
  float a = q > 0.0f ? f_add(f_div(p, q), lambda_h) : 0.0f;
  a = a > 1.0f ? 1.0f : a;
  const float t = f_sub(f_mul(q, a), p < q ? p : q);
  return t > 0.0f ? t : 0.0f;
}

// The per-token term of the closed-form distortion with the csd gate open, division free: for p < q it is
// min(q - p, lambda_h * q) (= q * min(1, p/q + lambda_h) - p), and 0 where p >= q.
CSD_HD float gated_distortion_term(float p, float q, float lambda_h) {
  if (!(p < q)) return 0.0f;
  const float gap = f_sub(q, p), cap = f_mul(q, lambda_h);
  const float t = gap < cap ? gap : cap;
  return t > 0.0f ? t : 0.0f;
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

// The decision of one position from its reductions.
struct PositionDecision {
  float accept_prob;  // a(x) under `rule`
  float strict_prob;  // a(x) under strict (for coupling = maximal)
  bool accepted;      // has_draft && u_accept < a(x)
  bool keep_draft;    // has_draft && u_accept < strict_prob
  bool gate_open;     // csd and TVD < tau: the distortion sum uses the relaxed acceptance
};

CSD_HD PositionDecision decide_position(float p_x, float q_x, float h, float tvd, bool has_draft, float u_accept,
                                        const VerifyParams& prm) {
  PositionDecision d;
  if (!has_draft) q_x = 0.0f;
  d.accept_prob = acceptance_probability(p_x, q_x, h, tvd, prm.rule, prm.entropy_coef, prm.tvd_threshold);
  d.strict_prob = acceptance_probability(p_x, q_x, h, tvd, kRuleStrict, prm.entropy_coef, prm.tvd_threshold);
  d.accepted = has_draft && u_accept < d.accept_prob;
  d.keep_draft = has_draft && u_accept < d.strict_prob;
  d.gate_open = prm.rule == kRuleCsd && tvd < prm.tvd_threshold;
  return d;
}

// Per-row epilogue. flags[i], resampled[i] (token at accept_len), tokens[i] (on input: the "later" token) for the
// row's L positions; draft tokens raw (any value) with stride. Writes tokens, *accept_len, *status.
// The workspaces are read through volatile pointers: in the CUDA split path other blocks wrote them in this launch.
CSD_HD void row_epilogue(int64_t length, int64_t vocab, int64_t start, const int64_t* draft_tokens,
                         int64_t draft_stride, const volatile uint32_t* flags, const volatile int64_t* resampled,
                         volatile int64_t* tokens, int32_t* accept_len, int32_t* status) {
  int64_t al = length;
  int32_t st = 0;
  for (int64_t i = 0; i < length; ++i) {
    const uint32_t f = flags[i];
    const bool committed = i < start;
    const bool stops = (!(f & kFlagAccepted) && !committed) || (f & kFlagBadLogits);
    if (stops && al == length) al = i;
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

// One verification call described by raw pointers and strides: what the torch glue (verify_glue.h) hands to the
// CPU kernel and to the CUDA launcher alike. [B, L] outputs and workspaces are contiguous.
struct VerifyProblem {
  int64_t B, L;
  VerifyParams prm;     // vocab, cfg, temperature, top_k, rule, lambda, tau, coupling
  int logit_dtype;      // LogitDtype
  const void* logits;   // [B, L, V], last-dim stride 1
  int64_t lg_sB, lg_sL;
  const void* uncond;   // nullptr when no CFG; same dtype/shape as logits
  int64_t un_sB, un_sL;
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
};

}  // namespace csd
