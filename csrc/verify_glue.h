// Torch glue shared by the CPU and CUDA entry points of torch.ops.csd_kernels.verify_rows: argument checks, the
// scalar parameters and the outputs. Header only (included by python/bindings.cpp and csrc/cuda/verify_glue.cpp).
#pragma once

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <tuple>

#include "include/verify_row.h"
#include "settings.h"

namespace csd {

// The op returns the eight tensors of a VerifyResult as a tuple (the schema's order, as csd_kernels.VerifyResult).
using VerifyTuple = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor,
                                at::Tensor>;

struct CheckedArgs {
  int64_t B, L, V;
  int logit_dtype;
  VerifyParams prm;
  int64_t q_sV;
};

// The kernels' view of a [B, rows, V] logit tensor (or of an absent one).
inline LogitRows logit_rows(const std::optional<at::Tensor>& t) {
  if (!t.has_value()) return LogitRows{nullptr, 0, 0};
  return LogitRows{t->data_ptr(), t->stride(0), t->stride(1)};
}

inline int logit_dtype_code(const at::Tensor& t, const char* name, const char* op = "csd_kernels.verify_rows") {
  switch (t.scalar_type()) {
    case at::kFloat:
      return kLogitF32;
    case at::kHalf:
      return kLogitF16;
    case at::kBFloat16:
      return kLogitBF16;
    default:
      TORCH_CHECK(false, op, ": ", name, " must be float32, float16 or bfloat16, got ", t.scalar_type());
  }
  return -1;
}

// The rule, its parameters and its neighbour table into prm (shared by the chain and the tree glue). The table must
// be int64 [V, k] with a unit last stride on `device`; lantern and lantern++ need it, the other rules ignore it.
inline void set_rule(VerifyParams& p, const OpSettings& s, const std::optional<at::Tensor>& neighbours, int64_t V,
                     at::Device device, const char* op) {
  const int64_t rule = s.rule;
  TORCH_CHECK(rule >= 0 && rule < kRuleCount, op, "rule must be a code of config/acceptance.py's table in [0, ",
              int(kRuleCount), "), got ", rule);
  TORCH_CHECK(static_cast<int64_t>(s.rule_params.size()) <= kMaxRuleParams, op, "at most ", int(kMaxRuleParams),
              " rule parameters, got ", s.rule_params.size());
  TORCH_CHECK(static_cast<int>(s.rule_params.size()) >= kRuleInfo[rule].params, op, "rule ", kRuleInfo[rule].name,
              " takes ", kRuleInfo[rule].params, " rule parameters, got ", s.rule_params.size());
  p.rule = static_cast<int>(rule);
  for (int j = 0; j < kMaxRuleParams; ++j)
    p.rule_params[j] = j < static_cast<int>(s.rule_params.size()) ? static_cast<float>(s.rule_params[j]) : 0.0f;
  p.gather_distortion = s.gather_distortion ? 1 : 0;
  p.max_distortion = static_cast<float>(s.max_distortion);
  // the cap compares the position's distortion, which a gathering rule computes only on request
  TORCH_CHECK(!(std::isfinite(s.max_distortion) && rule_gathers_distortion(p.rule) && !s.gather_distortion), op,
              "rule ", kRuleInfo[rule].name, " with max_distortion needs gather_distortion (its distortion)");
  p.neighbours = nullptr;
  p.nb_stride = p.nb_k = 0;
  if (rule_is_lantern(p.rule)) {
    TORCH_CHECK(neighbours.has_value(), op, "rule ", kRuleInfo[rule].name, " needs the neighbour table");
    const at::Tensor& n = *neighbours;
    TORCH_CHECK(n.device() == device, op, "neighbours must be on ", device, ", got ", n.device());
    TORCH_CHECK(n.dim() == 2 && n.size(0) == V && n.scalar_type() == at::kLong && (n.size(1) <= 1 || n.stride(1) == 1),
                op, "neighbours must be int64 [V, k] = [", V, ", k] with a unit last stride, got ", n.scalar_type(),
                " ", n.sizes());
    p.neighbours = n.data_ptr<int64_t>();
    p.nb_stride = n.stride(0);
    p.nb_k = n.size(1);
  }
}

// The target distribution's settings into prm (shared by the chain and the tree glue): CFG, 1/T rounded once,
// top-k / top-p / ln(min-p) as the kernels read them, then the rule.
inline void set_target(VerifyParams& p, const OpSettings& s, int64_t V, bool has_uncond,
                       const std::optional<at::Tensor>& neighbours, at::Device device, const char* op) {
  p.vocab = V;
  p.has_uncond = has_uncond ? 1 : 0;
  p.cfg_scale = static_cast<float>(s.cfg_scale);
  p.greedy = s.temperature == 0.0 ? 1 : 0;
  p.inv_temperature = s.temperature > 0.0 ? static_cast<float>(1.0 / s.temperature) : 1.0f;
  p.top_k = (s.top_k > 0 && s.top_k < V) ? s.top_k : 0;
  p.top_p = static_cast<float>(s.top_p);
  p.log_min_p = s.min_p > 0.0 ? static_cast<float>(std::log(s.min_p)) : -std::numeric_limits<float>::infinity();
  p.probs_input = s.target_is_probs ? 1 : 0;
  p.prob_sum_tolerance = kProbSumTolerance;
  p.coupling = kCouplingIndependent;
  set_rule(p, s, neighbours, V, device, op);
}

inline CheckedArgs check_verify_args(const at::Tensor& target_logits, const at::Tensor& draft_tokens,
                                     const std::optional<at::Tensor>& draft_probs,
                                     const std::optional<at::Tensor>& uncond_logits,
                                     const std::optional<at::Tensor>& neighbours,
                                     const std::optional<at::Tensor>& informed, const at::Tensor& start,
                                     const at::Tensor& positions, const at::Tensor& seed, const at::Tensor& offset,
                                     const OpSettings& s, at::Device device) {
  const char* op = "csd_kernels.verify_rows: ";
  TORCH_CHECK(target_logits.dim() == 3, op, "target_logits must be [B, L, V], got ", target_logits.sizes());
  CheckedArgs a;
  a.B = target_logits.size(0);
  a.L = target_logits.size(1);
  a.V = target_logits.size(2);
  TORCH_CHECK(a.V >= 1, op, "the vocabulary (last dim of target_logits) must not be empty");
  TORCH_CHECK(a.V <= (int64_t(1) << 31) - 1, op, "vocabularies >= 2^31 are not supported");
  a.logit_dtype = logit_dtype_code(target_logits, "target_logits");
  auto on_device = [&](const at::Tensor& t, const char* name) {
    TORCH_CHECK(t.device() == device, op, name, " must be on ", device, " like target_logits, got ", t.device());
  };
  TORCH_CHECK(a.V == 1 || target_logits.stride(2) == 1, op, "target_logits must have a unit stride on its last dim");
  on_device(draft_tokens, "draft_tokens");
  TORCH_CHECK(draft_tokens.dim() == 2 && draft_tokens.size(0) == a.B && draft_tokens.size(1) == a.L, op,
              "draft_tokens must be [B, L] = [", a.B, ", ", a.L, "], got ", draft_tokens.sizes());
  TORCH_CHECK(draft_tokens.scalar_type() == at::kLong, op, "draft_tokens must be int64, got ",
              draft_tokens.scalar_type());
  a.q_sV = 0;
  if (draft_probs.has_value()) {
    const at::Tensor& q = *draft_probs;
    on_device(q, "draft_probs");
    TORCH_CHECK(q.dim() == 3 && q.size(0) == a.B && q.size(1) == a.L && q.size(2) == a.V, op,
                "draft_probs must be [B, L, V] like target_logits, got ", q.sizes());
    TORCH_CHECK(q.scalar_type() == at::kFloat, op, "draft_probs must be float32, got ", q.scalar_type());
    a.q_sV = a.V == 1 ? 0 : q.stride(2);
    TORCH_CHECK(a.q_sV == 0 || a.q_sV == 1, op, "draft_probs must have a last-dim stride of 0 or 1, got ", a.q_sV);
  }
  if (uncond_logits.has_value()) {
    const at::Tensor& u = *uncond_logits;
    on_device(u, "uncond_logits");
    TORCH_CHECK(u.sizes() == target_logits.sizes(), op, "uncond_logits must have the shape of target_logits ",
                target_logits.sizes(), ", got ", u.sizes());
    TORCH_CHECK(u.scalar_type() == target_logits.scalar_type(), op,
                "uncond_logits must have the dtype of target_logits (", target_logits.scalar_type(), "), got ",
                u.scalar_type());
    TORCH_CHECK(a.V == 1 || u.stride(2) == 1, op, "uncond_logits must have a unit stride on its last dim");
  }
  for (auto pr : {std::make_pair(&start, "start"), std::make_pair(&positions, "positions")}) {
    on_device(*pr.first, pr.second);
    TORCH_CHECK(pr.first->numel() == a.B && pr.first->scalar_type() == at::kLong, op, pr.second,
                " must be int64 [B] with B = ", a.B, ", got ", pr.first->scalar_type(), " ", pr.first->sizes());
  }
  on_device(seed, "seed");
  TORCH_CHECK(seed.scalar_type() == at::kLong && (seed.numel() == 1 || seed.numel() == a.B), op,
              "seed must be int64 [1] or [B], got ", seed.scalar_type(), " ", seed.sizes());
  on_device(offset, "offset");
  TORCH_CHECK(offset.scalar_type() == at::kLong && (offset.numel() == 1 || offset.numel() == a.B), op,
              "offset must be int64 [1] or [B], got ", offset.scalar_type(), " ", offset.sizes());
  if (informed.has_value()) {
    on_device(*informed, "informed");
    TORCH_CHECK(informed->scalar_type() == at::kBool && informed->dim() == 2 && informed->size(0) == a.B &&
                    informed->size(1) == a.L,
                op, "informed must be bool [B, L] = [", a.B, ", ", a.L, "], got ", informed->scalar_type(), " ",
                informed->sizes());
  }
  TORCH_CHECK(!s.target_is_probs || (target_logits.scalar_type() == at::kFloat && !uncond_logits.has_value() &&
                                     s.temperature == 1.0 && s.top_k == 0 && s.top_p == 1.0 && s.min_p == 0.0),
              op, "target probabilities must be float32, with no uncond_logits, temperature 1 and no top-k/p/min-p");

  VerifyParams& p = a.prm;
  set_target(p, s, a.V, uncond_logits.has_value(), neighbours, device, op);
  TORCH_CHECK(!(s.coupling == kCouplingMaximal && rule_residual_qa(p.rule)), op, "rule ", kRuleInfo[p.rule].name,
              " resamples from max(p - q*a, 0): the maximal coupling needs the strict residual");
  p.coupling = static_cast<int>(s.coupling);
  return a;
}

struct VerifyResult {
  at::Tensor accept_len, tokens, probs, entropy, tvd, accept_prob, distortion, status;
  VerifyTuple as_tuple() const {
    return {accept_len, tokens, probs, entropy, tvd, accept_prob, distortion, status};
  }
};

inline VerifyResult allocate_outputs(const CheckedArgs& a, bool return_probs, const at::TensorOptions& base) {
  VerifyResult o;
  auto f32 = base.dtype(at::kFloat);
  o.accept_len = at::empty({a.B}, base.dtype(at::kInt));
  o.tokens = at::empty({a.B, a.L}, base.dtype(at::kLong));
  o.probs = return_probs ? at::empty({a.B, a.L, a.V}, f32) : at::empty({0}, f32);
  o.entropy = at::empty({a.B, a.L}, f32);
  o.tvd = at::empty({a.B, a.L}, f32);
  o.accept_prob = at::empty({a.B, a.L}, f32);
  o.distortion = at::empty({a.B, a.L}, f32);
  o.status = at::empty({a.B}, base.dtype(at::kInt));
  return o;
}

// Everything a kernel call needs, ready: the outputs, contiguous copies of the [B] inputs, the [B, L] workspaces
// (tensors, so the raw pointers in `problem` stay valid as long as this object lives) and the raw description.
struct PreparedCall {
  VerifyResult out;
  at::Tensor start, positions, seed, offset, flags, resampled, workspace;
  VerifyProblem problem;
};

inline PreparedCall prepare_call(const CheckedArgs& a, const at::Tensor& target_logits,
                                 const at::Tensor& draft_tokens, const std::optional<at::Tensor>& draft_probs,
                                 const std::optional<at::Tensor>& uncond_logits, const at::Tensor& start,
                                 const at::Tensor& positions, const at::Tensor& seed, const at::Tensor& offset,
                                 bool return_probs, const std::optional<at::Tensor>& informed) {
  const at::TensorOptions base = target_logits.options();
  PreparedCall c;
  c.out = allocate_outputs(a, return_probs, base);
  c.start = start.contiguous();
  c.positions = positions.contiguous();
  c.seed = seed.contiguous();
  c.offset = offset.contiguous();
  c.flags = at::empty({a.B, a.L}, base.dtype(at::kInt));
  c.resampled = at::empty({a.B, a.L}, base.dtype(at::kLong));

  VerifyProblem& P = c.problem;
  P.B = a.B;
  P.L = a.L;
  P.prm = a.prm;
  P.logit_dtype = a.logit_dtype;
  P.logits = logit_rows(target_logits);
  P.uncond = logit_rows(uncond_logits);
  P.draft_probs = draft_probs.has_value() ? draft_probs->data_ptr<float>() : nullptr;
  P.q_sB = draft_probs.has_value() ? draft_probs->stride(0) : 0;
  P.q_sL = draft_probs.has_value() ? draft_probs->stride(1) : 0;
  P.q_sV = a.q_sV;
  P.draft_tokens = draft_tokens.data_ptr<int64_t>();
  P.dt_sB = draft_tokens.stride(0);
  P.dt_sL = draft_tokens.stride(1);
  P.start = c.start.data_ptr<int64_t>();
  P.positions = c.positions.data_ptr<int64_t>();
  P.seed = c.seed.data_ptr<int64_t>();
  P.n_seed = c.seed.numel();
  P.offset = c.offset.data_ptr<int64_t>();
  P.n_offset = c.offset.numel();
  P.probs = return_probs ? c.out.probs.data_ptr<float>() : nullptr;
  P.entropy = c.out.entropy.data_ptr<float>();
  P.tvd = c.out.tvd.data_ptr<float>();
  P.accept_prob = c.out.accept_prob.data_ptr<float>();
  P.distortion = c.out.distortion.data_ptr<float>();
  P.flags = reinterpret_cast<uint32_t*>(c.flags.data_ptr<int32_t>());
  P.resampled = c.resampled.data_ptr<int64_t>();
  P.tokens = c.out.tokens.data_ptr<int64_t>();
  P.accept_len = c.out.accept_len.data_ptr<int32_t>();
  P.status = c.out.status.data_ptr<int32_t>();
  P.split_block = 0;
  P.workspace = nullptr;
  P.informed = informed.has_value() ? reinterpret_cast<const uint8_t*>(informed->data_ptr<bool>()) : nullptr;
  P.inf_sB = informed.has_value() ? informed->stride(0) : 0;
  P.inf_sL = informed.has_value() ? informed->stride(1) : 0;
  return c;
}

}  // namespace csd

namespace csd {

// Entry points registered for torch.ops.csd_kernels.verify_rows (same signature as the schema).
// (csd_kernels/backends/spec.py's VERIFY_ARGS, in order)
#define CSD_VERIFY_ROWS_SIGNATURE(NAME)                                                                             \
  VerifyTuple NAME(const at::Tensor& target_logits, const at::Tensor& draft_tokens,                               \
                    const std::optional<at::Tensor>& draft_probs, const std::optional<at::Tensor>& uncond_logits, \
                    const std::optional<at::Tensor>& neighbours, const std::optional<at::Tensor>& informed,      \
                    const at::Tensor& start, const at::Tensor& positions, const at::Tensor& seed,                 \
                    const at::Tensor& offset, c10::ArrayRef<double> settings, c10::ArrayRef<int64_t> choices)

CSD_VERIFY_ROWS_SIGNATURE(verify_rows_cpu);
#ifdef CSD_WITH_CUDA
CSD_VERIFY_ROWS_SIGNATURE(verify_rows_cuda);
#endif

// Tests: pick the CPU kernel's code path ("auto"/"avx512", "avx2", "baseline"); cpu_isa() names the one in use.
void set_cpu_isa(const std::string& name);
std::string cpu_isa();

}  // namespace csd
