// Torch glue of the CUDA tree kernel (compiled only into CUDA builds, -DCSD_WITH_CUDA): argument checks, outputs,
// device guard and current stream, then csd_verify_tree_launch. Seed and offset stay on the device (no host sync).
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "../tree_glue.h"
#include "verify_tree.cuh"

namespace csd {

CSD_VERIFY_TREE_ROWS_SIGNATURE(verify_tree_rows_cuda) {
  TORCH_CHECK(target_logits.is_cuda(), "csd_kernels.verify_tree_rows (CUDA): target_logits must be a CUDA tensor");
  const c10::cuda::CUDAGuard guard(target_logits.device());
  PreparedTree call = prepare_tree_call(target_logits, uncond_logits, node_tokens, draft_probs, sibling_probs,
                                        neighbours, children, informed, seed, offset, settings, choices);
  const int err = csd_verify_tree_launch(&call.problem, c10::cuda::getCurrentCUDAStream().stream());
  TORCH_CHECK(err == 0, "csd_kernels.verify_tree_rows (CUDA): launch failed: ",
              cudaGetErrorString(static_cast<cudaError_t>(err)));
  return call.as_tuple();
}

}  // namespace csd
