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
  const CheckedArgs a = check_verify_args(target_logits, draft_tokens, draft_probs, uncond_logits, cfg_scale,
                                          temperature, top_k, mode, entropy_coef, tvd_threshold, start, next_drafts,
                                          positions, seed, offset, target_logits.device());
  const c10::cuda::CUDAGuard guard(target_logits.device());
  VerifyOutputs out = allocate_outputs(a, return_probs, target_logits.options());
  const at::Tensor start_c = start.contiguous(), positions_c = positions.contiguous(), seed_c = seed.contiguous(),
                   offset_c = offset.contiguous();
  at::Tensor flags = at::empty({a.B, a.L}, target_logits.options().dtype(at::kInt));
  at::Tensor resampled = at::empty({a.B, a.L}, target_logits.options().dtype(at::kLong));

  CsdVerifyLaunch L;
  L.B = a.B;
  L.L = a.L;
  L.prm = a.prm;
  L.logit_dtype = a.logit_dtype;
  L.logits = target_logits.data_ptr();
  L.lg_sB = target_logits.stride(0);
  L.lg_sL = target_logits.stride(1);
  L.uncond = uncond_logits.has_value() ? uncond_logits->data_ptr() : nullptr;
  L.un_sB = uncond_logits.has_value() ? uncond_logits->stride(0) : 0;
  L.un_sL = uncond_logits.has_value() ? uncond_logits->stride(1) : 0;
  L.draft_probs = draft_probs.has_value() ? draft_probs->data_ptr<float>() : nullptr;
  L.q_sB = draft_probs.has_value() ? draft_probs->stride(0) : 0;
  L.q_sL = draft_probs.has_value() ? draft_probs->stride(1) : 0;
  L.q_sV = a.q_sV;
  L.draft_tokens = draft_tokens.data_ptr<int64_t>();
  L.dt_sB = draft_tokens.stride(0);
  L.dt_sL = draft_tokens.stride(1);
  L.start = start_c.data_ptr<int64_t>();
  L.positions = positions_c.data_ptr<int64_t>();
  L.seed = seed_c.data_ptr<int64_t>();
  L.n_seed = seed_c.numel();
  L.offset = offset_c.data_ptr<int64_t>();
  L.n_offset = offset_c.numel();
  L.probs = return_probs ? out.probs.data_ptr<float>() : nullptr;
  L.entropy = out.entropy.data_ptr<float>();
  L.tvd = out.tvd.data_ptr<float>();
  L.accept_prob = out.accept_prob.data_ptr<float>();
  L.distortion = out.distortion.data_ptr<float>();
  L.flags = reinterpret_cast<uint32_t*>(flags.data_ptr<int32_t>());
  L.resampled = resampled.data_ptr<int64_t>();
  L.tokens = out.tokens.data_ptr<int64_t>();
  L.accept_len = out.accept_len.data_ptr<int32_t>();
  L.status = out.status.data_ptr<int32_t>();
  const int err = csd_verify_rows_launch(&L, c10::cuda::getCurrentCUDAStream().stream());
  TORCH_CHECK(err == 0, "csd_kernels.verify_rows (CUDA): launch failed: ",
              cudaGetErrorString(static_cast<cudaError_t>(err)));
  return out.as_tuple();
}

}  // namespace csd
