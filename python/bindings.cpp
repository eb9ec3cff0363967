// csd_kernels._C: the compiled kernels of csd_kernels.
//
// * pybind11 module (TORCH_EXTENSION_NAME = csd_kernels._C): has_cuda(), the Philox helpers used by the tests.
// * torch.ops.csd_kernels.verify_rows: schema below, CPU implementation in csrc/cpu/verify.cpp and (CUDA builds,
//   -DCSD_WITH_CUDA) CUDA implementation in csrc/cuda/verify_glue.cpp. The Python fake (meta) implementation and
//   the user-facing wrapper are registered on the Python side.
// * tree_candidates: the sibling candidates of a draft tree on the CPU (csrc/cpu/tree_candidates.cpp), called by
//   csd_kernels/ops/drafts.py.
// * torch.ops.csd_kernels.verify_tree_rows: the fused tree verification (csrc/include/tree_row.h), CPU implementation
//   in csrc/cpu/verify_tree.cpp, CUDA in csrc/cuda/tree_glue.cpp; wrapper and fake in csd_kernels/ops/verify_tree.py.
#include <ATen/ATen.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/library.h>

#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "../csrc/cpu/tree_candidates.h"
#include "../csrc/include/philox.h"
#include "../csrc/tree_glue.h"
#include "../csrc/verify_glue.h"

namespace {

at::Tensor as_cpu_i64(const at::Tensor& t) { return t.to(at::kCPU, at::kLong).contiguous(); }

// Philox4x32-10 of uint32 values held in int64 tensors (broadcast), as reference.philox4x32.
std::vector<at::Tensor> philox4x32(const at::Tensor& c0, const at::Tensor& c1, const at::Tensor& c2,
                                   const at::Tensor& c3, const at::Tensor& k0, const at::Tensor& k1) {
  auto bt = at::broadcast_tensors({as_cpu_i64(c0), as_cpu_i64(c1), as_cpu_i64(c2), as_cpu_i64(c3), as_cpu_i64(k0),
                                   as_cpu_i64(k1)});
  std::vector<at::Tensor> in;
  for (auto& t : bt) in.push_back(t.contiguous());
  std::vector<at::Tensor> out;
  for (int l = 0; l < 4; ++l) out.push_back(at::empty(in[0].sizes(), in[0].options()));
  const int64_t n = in[0].numel();
  const int64_t* p[6];
  for (int j = 0; j < 6; ++j) p[j] = in[j].data_ptr<int64_t>();
  int64_t* o[4];
  for (int l = 0; l < 4; ++l) o[l] = out[l].data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    const csd::Philox4 r =
        csd::philox4x32_10(static_cast<uint32_t>(p[0][i]), static_cast<uint32_t>(p[1][i]),
                           static_cast<uint32_t>(p[2][i]), static_cast<uint32_t>(p[3][i]),
                           static_cast<uint32_t>(p[4][i]), static_cast<uint32_t>(p[5][i]));
    for (int l = 0; l < 4; ++l) o[l][i] = r.x[l];
  }
  return out;
}

// (u_accept, u_sample) [B, L] float32 of the step stream, as reference.step_uniforms.
std::vector<at::Tensor> step_uniforms(const at::Tensor& seed, const at::Tensor& offset, const at::Tensor& positions,
                                      int64_t length) {
  const at::Tensor s = as_cpu_i64(seed).reshape(-1), pos = as_cpu_i64(positions).reshape(-1);
  const at::Tensor off_t = as_cpu_i64(offset).reshape(-1).contiguous();
  const int64_t B = pos.numel();
  TORCH_CHECK(s.numel() == 1 || s.numel() == B, "step_uniforms: seed must be [1] or [B]");
  TORCH_CHECK(off_t.numel() == 1 || off_t.numel() == B, "step_uniforms: offset must be [1] or [B]");
  at::Tensor ua = at::empty({B, length}, at::kFloat), us = at::empty({B, length}, at::kFloat);
  for (int64_t b = 0; b < B; ++b) {
    const bool shared = s.numel() == 1;
    const csd::RowKey key = csd::row_key(s.data_ptr<int64_t>()[shared ? 0 : b], shared, b);
    const int64_t off = off_t.data_ptr<int64_t>()[off_t.numel() == 1 ? 0 : b];
    for (int64_t i = 0; i < length; ++i) {
      csd::step_uniforms(key, csd::absolute_position(pos.data_ptr<int64_t>()[b], i), off,
                         ua.data_ptr<float>() + b * length + i, us.data_ptr<float>() + b * length + i);
    }
  }
  return {ua, us};
}

// [B, L] int64 random draft tokens in [0, V) from lane 2 of the step stream, as reference.random_draft_tokens.
at::Tensor random_draft_tokens(const at::Tensor& seed, const at::Tensor& offset, const at::Tensor& positions,
                               int64_t length, int64_t vocab) {
  const at::Tensor s = as_cpu_i64(seed).reshape(-1), pos = as_cpu_i64(positions).reshape(-1);
  const at::Tensor off_t = as_cpu_i64(offset).reshape(-1).contiguous();
  const int64_t B = pos.numel();
  TORCH_CHECK(s.numel() == 1 || s.numel() == B, "random_draft_tokens: seed must be [1] or [B]");
  TORCH_CHECK(off_t.numel() == 1 || off_t.numel() == B, "random_draft_tokens: offset must be [1] or [B]");
  at::Tensor out = at::empty({B, length}, at::kLong);
  for (int64_t b = 0; b < B; ++b) {
    const bool shared = s.numel() == 1;
    const csd::RowKey key = csd::row_key(s.data_ptr<int64_t>()[shared ? 0 : b], shared, b);
    const int64_t off = off_t.data_ptr<int64_t>()[off_t.numel() == 1 ? 0 : b];
    for (int64_t i = 0; i < length; ++i)
      out.data_ptr<int64_t>()[b * length + i] =
          csd::random_draft_token(key, csd::absolute_position(pos.data_ptr<int64_t>()[b], i), off, vocab);
  }
  return out;
}

// [B, L, V] float32 uniforms of the gumbel stream, as reference.gumbel_uniforms.
at::Tensor gumbel_uniforms(const at::Tensor& seed, const at::Tensor& positions, int64_t length, int64_t vocab) {
  const at::Tensor s = as_cpu_i64(seed).reshape(-1), pos = as_cpu_i64(positions).reshape(-1);
  const int64_t B = pos.numel();
  TORCH_CHECK(s.numel() == 1 || s.numel() == B, "gumbel_uniforms: seed must be [1] or [B]");
  at::Tensor out = at::empty({B, length, vocab}, at::kFloat);
  float* o = out.data_ptr<float>();
  for (int64_t b = 0; b < B; ++b) {
    const bool shared = s.numel() == 1;
    const csd::RowKey key = csd::row_key(s.data_ptr<int64_t>()[shared ? 0 : b], shared, b);
    for (int64_t i = 0; i < length; ++i) {
      const uint32_t p = csd::absolute_position(pos.data_ptr<int64_t>()[b], i);
      for (int64_t v = 0; v < vocab; ++v) o[(b * length + i) * vocab + v] = csd::gumbel_uniform(key, p, v);
    }
  }
  return out;
}

bool has_cuda() {
#ifdef CSD_WITH_CUDA
  return true;
#else
  return false;
#endif
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "csd_kernels compiled kernels (torch.ops.csd_kernels.verify_rows) and Philox helpers";
  m.def("has_cuda", &has_cuda, "True when the extension was built with its CUDA kernel");
  m.def(
      "status_bits",
      [] {
        return std::map<std::string, int32_t>{{"bad_logits", csd::kStatusBadLogits},
                                              {"bad_draft_token", csd::kStatusBadDraftToken},
                                              {"bad_draft_probs", csd::kStatusBadDraftProbs},
                                              {"missing_committed_token", csd::kStatusMissingCommittedToken}};
      },
      "The per-row status bits of verify_rows (the tests hold them to reference.STATUS_*)");
  m.def(
      "rule_table",
      [] {
        std::vector<std::tuple<int, std::string, int, bool, bool, bool>> rules;
        for (const csd::RuleInfo& r : csd::kRuleInfo)
          rules.emplace_back(int(r.code), r.name, r.params, r.lossless, r.residual_qa, r.gathers);
        return rules;
      },
      "The acceptance rules of the kernels: (code, name, parameter count, lossless, residual_qa, gathers) from "
      "csd::kRuleInfo (the tests hold them to config/acceptance.py)");
  m.def("philox4x32", &philox4x32, "Philox4x32-10 of uint32 values in int64 tensors -> 4 int64 tensors",
        pybind11::arg("c0"), pybind11::arg("c1"), pybind11::arg("c2"), pybind11::arg("c3"), pybind11::arg("k0"),
        pybind11::arg("k1"));
  m.def("step_uniforms", &step_uniforms, "(u_accept, u_sample) of the step stream, [B, L] float32",
        pybind11::arg("seed"), pybind11::arg("offset"), pybind11::arg("positions"), pybind11::arg("length"));
  m.def("random_draft_tokens", &random_draft_tokens, "random draft tokens (lane 2 of the step stream), [B, L] int64",
        pybind11::arg("seed"), pybind11::arg("offset"), pybind11::arg("positions"), pybind11::arg("length"),
        pybind11::arg("vocab"));
  m.def("gumbel_uniforms", &gumbel_uniforms, "uniforms of the gumbel stream, [B, L, V] float32",
        pybind11::arg("seed"), pybind11::arg("positions"), pybind11::arg("length"), pybind11::arg("vocab"));
  m.def("tree_candidates", &csd::tree_candidates_cpu,
        "sibling candidates of a draft tree, [B, P, K] int64 (reference.tree_candidates on the tree stream)",
        pybind11::arg("seed"), pybind11::arg("offset"), pybind11::arg("main_tokens"), pybind11::arg("q"),
        pybind11::arg("branching"), pybind11::arg("first"));
  m.def("_set_cpu_isa", &csd::set_cpu_isa,
        "Tests: CPU code path of verify_rows: 'auto' (= 'avx512'), 'avx2' or 'baseline' (capped at what the CPU has)");
  m.def("cpu_isa", &csd::cpu_isa, "The CPU code path verify_rows uses now: 'avx512', 'avx2' or 'baseline'");
}

// The schemas are csd_kernels/backends/spec.py's argument lists (tests/test_rules.py compares them).
TORCH_LIBRARY(csd_kernels, m) {
  m.def(
      "verify_rows(Tensor target_logits, Tensor draft_tokens, Tensor? draft_probs, Tensor? uncond_logits, "
      "Tensor? neighbours, float cfg_scale, float temperature, int top_k, float top_p, float min_p, "
      "bool target_is_probs, int rule, float[] rule_params, bool gather_distortion, Tensor start, int coupling, "
      "Tensor positions, Tensor seed, Tensor offset, bool return_probs, Tensor? informed) "
      "-> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)");
  m.def(
      "verify_tree_rows(Tensor target_logits, Tensor? uncond_logits, Tensor node_tokens, Tensor draft_probs, "
      "Tensor? sibling_probs, Tensor? neighbours, Tensor children, float cfg_scale, float temperature, int top_k, "
      "float top_p, float min_p, int rule, float[] rule_params, bool gather_distortion, Tensor seed, Tensor offset) "
      "-> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(csd_kernels, CPU, m) {
  m.impl("verify_rows", &csd::verify_rows_cpu);
  m.impl("verify_tree_rows", &csd::verify_tree_rows_cpu);
}

#ifdef CSD_WITH_CUDA
TORCH_LIBRARY_IMPL(csd_kernels, CUDA, m) {
  m.impl("verify_rows", &csd::verify_rows_cuda);
  m.impl("verify_tree_rows", &csd::verify_tree_rows_cuda);
}
#endif
