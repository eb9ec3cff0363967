// CPU kernel of torch.ops.csd_kernels.verify_tree_rows: one row per task (at::parallel_for), the walk of
// csrc/include/tree_row.h run by a serial executor. p is computed only at the nodes the walk visits; the vocabulary
// loops are plain loops over the row's scratch (z, p_j, q_j: [3, V] floats). IEEE fp32 without contraction, fp64 sums.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <functional>
#include <vector>

#include "../tree_glue.h"

namespace csd {
namespace {

// The executor of tree_row on one CPU thread: every "block" operation is a loop.
struct SerialExec {
  static constexpr int kLanes = 8;
  std::vector<float>& tmp;

  template <class F>
  void each(int64_t n, F f) const {
    for (int64_t v = 0; v < n; ++v) f(v);
  }
  // Eight partial sums (and maxima): independent chains the compiler can vectorise; the order is free here (the
  // reference's float32 sums have their own), only inverse_cdf keeps torch.cumsum's serial order.
  template <class F>
  double sum(int64_t n, F f) const {
    double part[kLanes] = {};
    int64_t v = 0;
    for (; v + kLanes <= n; v += kLanes)
      for (int l = 0; l < kLanes; ++l) part[l] += static_cast<double>(f(v + l));
    double s = 0.0;
    for (int l = 0; l < kLanes; ++l) s += part[l];
    for (; v < n; ++v) s += static_cast<double>(f(v));
    return s;
  }
  template <class F>
  float max(int64_t n, F f) const {
    float part[kLanes];
    for (int l = 0; l < kLanes; ++l) part[l] = -f_inf();
    int64_t v = 0;
    for (; v + kLanes <= n; v += kLanes)
      for (int l = 0; l < kLanes; ++l) {
        const float x = f(v + l);
        part[l] = x > part[l] ? x : part[l];
      }
    float m = -f_inf();
    for (int l = 0; l < kLanes; ++l) m = part[l] > m ? part[l] : m;
    for (; v < n; ++v) {
      const float x = f(v);
      m = x > m ? x : m;
    }
    return m;
  }
  template <class F>
  bool any(int64_t n, F f) const {
    for (int64_t v = 0; v < n; ++v)
      if (f(v)) return true;
    return false;
  }
  int64_t argmax_first(const float* z, int64_t n) const {
    int64_t best = 0;
    for (int64_t v = 1; v < n; ++v)
      if (z[v] > z[best]) best = v;
    return best;
  }
  float kth_largest(const float* z, int64_t n, int64_t k) const {
    tmp.assign(z, z + n);
    std::nth_element(tmp.begin(), tmp.begin() + (k - 1), tmp.end(), std::greater<float>());
    return tmp[k - 1];
  }
  // reference.inverse_cdf_sample with torch.cumsum's fp64 running sum on the CPU.
  int64_t inverse_cdf(const float* w, int64_t n, float u) const {
    double total = 0.0;
    for (int64_t v = 0; v < n; ++v) total += static_cast<double>(w[v]);
    const float target = f_mul(u, static_cast<float>(total));
    double run = 0.0;
    for (int64_t v = 0; v < n; ++v) {
      run += static_cast<double>(w[v]);
      if (static_cast<float>(run) > target) return v;
    }
    for (int64_t v = n - 1; v > 0; --v)
      if (w[v] > 0.0f) return v;
    return 0;
  }
  void barrier() const {}
  bool leader() const { return true; }
};

template <typename T>
void run_rows(const TreeProblem& P) {
  at::parallel_for(0, P.B, 1, [&](int64_t begin, int64_t end) {
    static thread_local std::vector<float> tmp;
    SerialExec ex{tmp};
    for (int64_t b = begin; b < end; ++b) tree_row<T>(P, b, ex);
  });
}

}  // namespace

CSD_VERIFY_TREE_ROWS_SIGNATURE(verify_tree_rows_cpu) {
  TORCH_CHECK(target_logits.device().is_cpu(), "csd_kernels.verify_tree_rows (CPU): tensors must be on the CPU");
  PreparedTree call = prepare_tree_call(target_logits, uncond_logits, node_tokens, draft_probs, sibling_probs,
                                        children, cfg_scale, temperature, top_k, top_p, min_p, rule, entropy_coef,
                                        tvd_threshold, seed, offset);
  switch (call.problem.logit_dtype) {
    case kLogitF32:
      run_rows<float>(call.problem);
      break;
    case kLogitF16:
      run_rows<f16_bits>(call.problem);
      break;
    default:
      run_rows<bf16_bits>(call.problem);
  }
  return call.as_tuple();
}

}  // namespace csd
