// Torch glue of the CUDA kernel (compiled only into CUDA builds, -DCSD_WITH_CUDA): argument checks, outputs,
// device guard and current stream, then csd_verify_rows_launch. Seed and offset stay on the device (no host sync).
#include <ATen/ATen.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>

#include "../verify_glue.h"
#include "verify.cuh"

namespace csd {

CSD_VERIFY_ROWS_SIGNATURE(verify_rows_cuda) {
  TORCH_CHECK(target_logits.is_cuda(), "csd_kernels.verify_rows (CUDA): target_logits must be a CUDA tensor");
  const OpSettings s = read_settings(settings, choices, "csd_kernels.verify_rows: ");
  const CheckedArgs a = check_verify_args(target_logits, draft_tokens, draft_probs, uncond_logits, neighbours,
                                          informed, start, positions, seed, offset, s, target_logits.device());
  const c10::cuda::CUDAGuard guard(target_logits.device());
  PreparedCall call = prepare_call(a, target_logits, draft_tokens, draft_probs, uncond_logits, start, positions, seed,
                                   offset, s.return_probs, informed);
  call.problem.split_block = csd_verify_split_block(&call.problem);
  if (csd_verify_workspace_bytes(&call.problem) > 0) {  // the split path's, or gsd's per-position scratch
    call.workspace = at::empty({csd_verify_workspace_bytes(&call.problem)}, target_logits.options().dtype(at::kByte));
    call.problem.workspace = call.workspace.data_ptr();
  }
  const int err = csd_verify_rows_launch(&call.problem, c10::cuda::getCurrentCUDAStream().stream());
  TORCH_CHECK(err == 0, "csd_kernels.verify_rows (CUDA): launch failed: ",
              cudaGetErrorString(static_cast<cudaError_t>(err)));
  return call.out.as_tuple();
}

}  // namespace csd
