// Torch glue shared by the CPU and CUDA entry points of torch.ops.csd_kernels.verify_tree_rows: argument checks, the
// outputs, the per-row scratch and the raw TreeProblem. Header only (included by csrc/cpu/verify_tree.cpp and
// csrc/cuda/tree_glue.cpp). The user-facing checks (ValueError naming the argument) are those of
// csd_kernels/ops/verify_tree.py.
#pragma once

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <limits>
#include <optional>
#include <tuple>

#include "include/tree_row.h"
#include "verify_glue.h"

namespace csd {

// The eight tensors of reference.TreeResult, in its order.
using TreeTuple = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor,
                             at::Tensor>;

// (csd_kernels/backends/spec.py's TREE_ARGS that the compiled op takes, in order)
#define CSD_VERIFY_TREE_ROWS_SIGNATURE(NAME)                                                                       \
  TreeTuple NAME(const at::Tensor& target_logits, const std::optional<at::Tensor>& uncond_logits,                  \
                 const at::Tensor& node_tokens, const at::Tensor& draft_probs,                                     \
                 const std::optional<at::Tensor>& sibling_probs, const std::optional<at::Tensor>& neighbours,      \
                 const at::Tensor& children, const std::optional<at::Tensor>& informed, const at::Tensor& seed,    \
                 const at::Tensor& offset, c10::ArrayRef<double> settings, c10::ArrayRef<int64_t> choices)

CSD_VERIFY_TREE_ROWS_SIGNATURE(verify_tree_rows_cpu);
#ifdef CSD_WITH_CUDA
CSD_VERIFY_TREE_ROWS_SIGNATURE(verify_tree_rows_cuda);
#endif

// Everything a kernel call needs: the outputs, contiguous inputs and the scratch (tensors, so the raw pointers in
// `problem` stay valid as long as this object lives).
struct PreparedTree {
  at::Tensor accept_len, path, tokens, accept_prob, entropy, tvd, distortion, status;
  at::Tensor node_tokens, draft_probs, sibling_probs, children, seed, offset, informed, workspace, gsd_workspace;
  TreeProblem problem;
  TreeTuple as_tuple() const { return {accept_len, path, tokens, accept_prob, entropy, tvd, distortion, status}; }
};

// gsd's per-row scratch keys: a power of two >= V on the GPU (its bitonic sort), V on the CPU.
inline int64_t gsd_keys_length(int64_t V, bool cuda) {
  int64_t n = 1;
  while (cuda && n < V) n *= 2;
  return cuda ? n : V;
}

inline PreparedTree prepare_tree_call(const at::Tensor& target_logits, const std::optional<at::Tensor>& uncond_logits,
                                      const at::Tensor& node_tokens, const at::Tensor& draft_probs,
                                      const std::optional<at::Tensor>& sibling_probs,
                                      const std::optional<at::Tensor>& neighbours, const at::Tensor& children,
                                      const std::optional<at::Tensor>& informed, const at::Tensor& seed,
                                      const at::Tensor& offset, c10::ArrayRef<double> settings,
                                      c10::ArrayRef<int64_t> choices) {
  const char* op = "csd_kernels.verify_tree_rows: ";
  const OpSettings s = read_settings(settings, choices, op);
  TORCH_CHECK(target_logits.dim() == 3, op, "target_logits must be [B, S, V], got ", target_logits.sizes());
  const int64_t B = target_logits.size(0), S = target_logits.size(1), V = target_logits.size(2);
  TORCH_CHECK(V >= 1 && S >= 1, op, "target_logits must have S >= 1 slots and V >= 1 tokens");
  TORCH_CHECK(V <= (int64_t(1) << 31) - 1, op, "vocabularies >= 2^31 are not supported");
  TORCH_CHECK(V == 1 || target_logits.stride(2) == 1, op, "target_logits must have a unit stride on its last dim");
  const at::Device device = target_logits.device();
  auto on_device = [&](const at::Tensor& t, const char* name) {
    TORCH_CHECK(t.device() == device, op, name, " must be on ", device, " like target_logits, got ", t.device());
  };
  TORCH_CHECK(draft_probs.dim() == 3 && draft_probs.size(0) == B && draft_probs.size(2) == V &&
                  draft_probs.size(1) >= 1,
              op, "draft_probs must be [B, M, V] with M >= 1, got ", draft_probs.sizes());
  TORCH_CHECK(draft_probs.scalar_type() == at::kFloat, op, "draft_probs must be float32");
  on_device(draft_probs, "draft_probs");
  const int64_t M = draft_probs.size(1);
  TORCH_CHECK(children.dim() == 2 && children.size(0) == S && children.size(1) >= 1 &&
                  children.scalar_type() == at::kLong,
              op, "children must be int64 [S, K] with S = ", S, ", got ", children.scalar_type(), " ",
              children.sizes());
  on_device(children, "children");
  const int64_t K = children.size(1);
  TORCH_CHECK(node_tokens.dim() == 2 && node_tokens.size(0) == B && node_tokens.size(1) == S &&
                  node_tokens.scalar_type() == at::kLong,
              op, "node_tokens must be int64 [B, S], got ", node_tokens.scalar_type(), " ", node_tokens.sizes());
  on_device(node_tokens, "node_tokens");
  if (sibling_probs.has_value()) {
    TORCH_CHECK(sibling_probs->sizes() == draft_probs.sizes() && sibling_probs->scalar_type() == at::kFloat, op,
                "sibling_probs must be float32 like draft_probs ", draft_probs.sizes(), ", got ",
                sibling_probs->sizes());
    on_device(*sibling_probs, "sibling_probs");
  }
  if (uncond_logits.has_value()) {
    TORCH_CHECK(uncond_logits->sizes() == target_logits.sizes() &&
                    uncond_logits->scalar_type() == target_logits.scalar_type(),
                op, "uncond_logits must have the shape and dtype of target_logits");
    TORCH_CHECK(V == 1 || uncond_logits->stride(2) == 1, op, "uncond_logits must have a unit stride on its last dim");
    on_device(*uncond_logits, "uncond_logits");
  }
  for (auto pr : {std::make_pair(&seed, "seed"), std::make_pair(&offset, "offset")}) {
    on_device(*pr.first, pr.second);
    TORCH_CHECK(pr.first->scalar_type() == at::kLong && (pr.first->numel() == 1 || pr.first->numel() == B), op,
                pr.second, " must be int64 [1] or [B], got ", pr.first->scalar_type(), " ", pr.first->sizes());
  }
  if (informed.has_value()) {
    on_device(*informed, "informed");
    TORCH_CHECK(informed->scalar_type() == at::kBool && informed->dim() == 2 && informed->size(0) == B &&
                    informed->size(1) == M,
                op, "informed must be bool [B, M] = [", B, ", ", M, "], got ", informed->scalar_type(), " ",
                informed->sizes());
  }
  TORCH_CHECK(!s.target_is_probs, op, "target probabilities are not taken by the tree op");

  PreparedTree c;
  const at::TensorOptions base = target_logits.options();
  const auto f32 = base.dtype(at::kFloat), i64 = base.dtype(at::kLong);
  c.accept_len = at::empty({B}, i64);
  c.path = at::empty({B, M + 1}, i64);
  c.tokens = at::empty({B, M + 1}, i64);
  c.accept_prob = at::empty({B, M + 1}, f32);
  c.entropy = at::empty({B, M + 1}, f32);
  c.tvd = at::empty({B, M + 1}, f32);
  c.distortion = at::empty({B, M + 1}, f32);
  c.status = at::empty({B}, base.dtype(at::kInt));
  c.node_tokens = node_tokens.contiguous();
  c.draft_probs = draft_probs.contiguous();
  if (sibling_probs.has_value()) c.sibling_probs = sibling_probs->contiguous();
  c.children = children.contiguous();
  c.seed = seed.contiguous();
  c.offset = offset.contiguous();
  if (informed.has_value()) c.informed = informed->contiguous();
  c.workspace = at::empty({B, 3, V}, f32);

  TreeProblem& P = c.problem;
  P.B = B;
  P.S = S;
  P.M = M;
  P.K = K;
  VerifyParams& prm = P.prm;
  set_target(prm, s, V, uncond_logits.has_value(), neighbours, device, op);
  P.gsd_workspace = nullptr;
  P.gsd_keys = 0;
  if (prm.rule == kRuleGsd) {
    P.gsd_keys = gsd_keys_length(V, device.is_cuda());
    c.gsd_workspace = at::empty({B * gsd_scratch_bytes(V, P.gsd_keys)}, base.dtype(at::kByte));
    P.gsd_workspace = c.gsd_workspace.data_ptr();
  }
  P.logit_dtype = logit_dtype_code(target_logits, "target_logits", "csd_kernels.verify_tree_rows");
  P.logits = logit_rows(target_logits);
  P.uncond = logit_rows(uncond_logits);
  P.node_tokens = c.node_tokens.data_ptr<int64_t>();
  P.draft_probs = c.draft_probs.data_ptr<float>();
  P.sibling_probs = sibling_probs.has_value() ? c.sibling_probs.data_ptr<float>() : nullptr;
  P.children = c.children.data_ptr<int64_t>();
  P.seed = c.seed.data_ptr<int64_t>();
  P.n_seed = c.seed.numel();
  P.offset = c.offset.data_ptr<int64_t>();
  P.n_offset = c.offset.numel();
  P.informed = informed.has_value() ? reinterpret_cast<const uint8_t*>(c.informed.data_ptr<bool>()) : nullptr;
  P.workspace = c.workspace.data_ptr<float>();
  P.accept_len = c.accept_len.data_ptr<int64_t>();
  P.path = c.path.data_ptr<int64_t>();
  P.tokens = c.tokens.data_ptr<int64_t>();
  P.accept_prob = c.accept_prob.data_ptr<float>();
  P.entropy = c.entropy.data_ptr<float>();
  P.tvd = c.tvd.data_ptr<float>();
  P.distortion = c.distortion.data_ptr<float>();
  P.status = c.status.data_ptr<int32_t>();
  return c;
}

}  // namespace csd
