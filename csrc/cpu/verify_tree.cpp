// CPU kernel of torch.ops.csd_kernels.verify_tree_rows: one row per task (at::parallel_for), the walk of
// csrc/include/tree_row.h run by a serial executor. p is computed only at the nodes the walk visits; the vocabulary
// loops are plain loops over the row's scratch (z, p_j, q_j: [3, V] floats). IEEE fp32 without contraction, fp64 sums.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <functional>
#include <vector>

#include "../tree_glue.h"
#include "serial_exec.h"

namespace csd {
namespace {

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
                                        neighbours, children, informed, seed, offset, settings, choices);
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
