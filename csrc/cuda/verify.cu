// CUDA kernel of torch.ops.csd_kernels.verify_rows (no torch headers: `nvcc -arch=sm_90 -c verify.cu` builds alone).
//
// Layout: one thread block of kRowThreads threads per (row, position); the vocabulary is walked with block-strided
// loops (coalesced) and combined with warp-shuffle block reductions. The target probabilities are never stored
// (except into the optional probs output): every pass recomputes p_v = exp(z_v - max) / Z from the logits (L2 hits),
// which is deterministic, so all passes agree bit for bit. Passes:
//   1. max z and finiteness (+ the draft-probability row check)
//   2. (top-k) exact k-th largest z by a 4 x 8-bit radix select on order-preserving keys
//   3. Z = sum exp(z - max), sum exp * (z - max)  -> entropy
//   4. TVD, sum p, the rule's per-token distortion terms (csd, arsample), probs output; then the rule's term of the
//      draft (lantern: k gathers of p; gsd: its groups over the row sorted in the block's workspace, gsd_row.h)
//   5. inverse-CDF draws: per-thread contiguous chunks summed in fp64, a block exclusive scan, and one thread
//      walking the chunk that crosses u * total (fp64 running sum, as torch.cumsum on the CPU)
//   6. (gumbel) argmax(z + G) with one Philox call per 4 tokens
// A second tiny kernel (one thread per row) does the row epilogue: accept_len, token selection, status bits.
// Seed and offset are read from device memory inside the kernel (no host sync; CUDA-graph safe).
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../include/block_ops.cuh"
#include "../include/gsd_row.h"
#include "split.cuh"
#include "verify.cuh"

namespace csd {
namespace cuda {
namespace {

// The top-p threshold (reference.restrict_top_p): the largest order key t whose mass, the sum of exp(z - max) over
// the kept z with key >= t, reaches top_p times the mass of every kept z; a bisection over the 32-bit keys (±0 share
// one key, as torch compares them equal). The returned z keeps ties at the threshold.
template <typename T>
__device__ float block_top_p_threshold(const Row<T>& row, int64_t V, float top_p, BlockShared<kRowWarps>& sh) {
  auto key_of = [](float zv) { return float_order_key(zv == 0.0f ? 0.0f : zv); };
  auto mass = [&](uint32_t lo) {
    float s = 0.0f;
    for (int64_t v = threadIdx.x; v < V; v += kRowThreads) {
      const float zv = row.z(v);
      if (row.kept(zv) && key_of(zv) >= lo) s = f_add(s, expf(f_sub(zv, row.m)));
    }
    return static_cast<float>(block_sum(s, sh));
  };
  const float limit = f_mul(top_p, mass(0u));
  uint64_t lo = 0, hi = 0xFFFFFFFFull;
  while (lo < hi) {  // the same lo and hi in every thread (block_sum broadcasts)
    const uint64_t mid = (lo + hi + 1) / 2;
    if (mass(static_cast<uint32_t>(mid)) >= limit)
      lo = mid;
    else
      hi = mid - 1;
  }
  return float_from_order_key(static_cast<uint32_t>(lo));
}

template <typename T>
__global__ void __launch_bounds__(kRowThreads) verify_position_kernel(csd::VerifyProblem a) {
  __shared__ BlockShared<kRowWarps> sh;
  const int64_t item = blockIdx.x;
  const int64_t b = item / a.L, i = item % a.L;
  const int64_t V = a.prm.vocab;
  const VerifyParams prm = params_at(a, b, i);

  Row<T> row = make_row<T>(a, b, i);

  const int64_t raw_tok = a.draft_tokens[b * a.dt_sB + i * a.dt_sL];
  const bool bad_token = draft_token_is_bad(raw_tok, V);
  const int64_t token = bad_token ? -1 : raw_tok;
  const bool has_draft = token >= 0;
  const bool shared_seed = a.n_seed == 1;
  const RowKey key = row_key(a.seed[shared_seed ? 0 : b], shared_seed, b);
  const uint32_t pos = absolute_position(a.positions[b], i);
  float u_accept, u_sample;
  step_uniforms(key, pos, a.offset[a.n_offset == 1 ? 0 : b], &u_accept, &u_sample);

  // 1. max and bad input (target probabilities: also their sums Z = sum w and sum w ln w)
  float m = -f_inf();
  bool bad = false;
  float ws = 0.0f, wls = 0.0f;
  for (int64_t v = threadIdx.x; v < V; v += kRowThreads) {
    bool bad_v;
    const float zv = row.z_checked(v, &bad_v);
    bad |= bad_v;
    m = zv > m ? zv : m;
    if (prm.probs_input && zv > -f_inf()) {
      const float wv = row.w(v);
      ws = f_add(ws, wv);
      wls = f_add(wls, f_mul(wv, zv));
    }
  }
  m = block_max(m, sh);
  bool bad_logits = block_any(bad, sh) || !(m > -f_inf());  // bad input, or no finite logit
  double w_sum = 0.0, wl_sum = 0.0;
  if (prm.probs_input) {
    w_sum = block_sum(ws, sh);
    wl_sum = block_sum(wls, sh);
    bad_logits = bad_logits || !(fabs(w_sum - 1.0) <= prm.prob_sum_tolerance);
  }

  const float* q = a.draft_probs ? a.draft_probs + b * a.q_sB + i * a.q_sL : nullptr;
  const bool q_scalar = q && a.q_sV == 0;
  bool bad_probs = false;
  if (q) {
    bool qbad = false;
    float qs = 0.0f;
    for (int64_t v = threadIdx.x; v < (q_scalar ? 1 : V); v += kRowThreads) {
      qbad |= !(f_isfinite(q[v]) && q[v] >= 0.0f);
      qs = f_add(qs, q[v]);
    }
    const double q_sum = q_scalar ? static_cast<double>(q[0]) * V : block_sum(qs, sh);
    bad_probs = block_any(qbad, sh) || !(fabs(q_sum - 1.0) <= prm.prob_sum_tolerance);
  }
  const bool q_full = q && !q_scalar && !bad_probs;
  const float q0 = (q_scalar && !bad_probs) ? q[0] : 0.0f;
  uint32_t flags = (has_draft ? kFlagHasDraft : 0u) | (bad_token ? kFlagBadToken : 0u) | (bad_probs ? kFlagBadProbs : 0u);

  if (bad_logits) {
    const float nan = f_nan();
    if (a.probs)
      for (int64_t v = threadIdx.x; v < V; v += kRowThreads) a.probs[item * V + v] = nan;
    if (threadIdx.x == 0) {
      a.entropy[item] = a.tvd[item] = a.accept_prob[item] = a.distortion[item] = nan;
      a.flags[item] = flags | kFlagBadLogits;
      a.resampled[item] = 0;
      a.tokens[item] = 0;
    }
    return;
  }

  // 2-3. greedy token, or top-k threshold and the softmax sums
  row.m = m;
  float h = 0.0f;
  if (prm.probs_input) {
    row.scale = f_div(1.0f, static_cast<float>(w_sum));
    h = entropy_from_sums(w_sum, wl_sum);
  } else if (prm.greedy) {
    int64_t first = V;
    for (int64_t v = threadIdx.x; v < V; v += kRowThreads)
      if (row.z(v) == m && v < first) first = v;
    row.greedy_token = block_min_i64(first, sh);
  } else {
    if (prm.top_k > 0 && prm.top_k < V) {
      row.thr = block_kth_largest([&row](int64_t v) { return row.z(v); }, V, prm.top_k, sh);
      row.has_thr = true;
    }
    if (prm.top_p < 1.0f) {
      row.thr = block_top_p_threshold(row, V, prm.top_p, sh);
      row.has_thr = true;
    }
    if (prm.log_min_p > -f_inf()) {
      float lowest = m;  // the smallest kept z with z - max >= ln(min_p)
      for (int64_t v = threadIdx.x; v < V; v += kRowThreads) {
        const float zv = row.z(v);
        if (row.kept(zv) && f_sub(zv, m) >= prm.log_min_p && zv < lowest) lowest = zv;
      }
      lowest = -block_max(-lowest, sh);
      row.thr = row.has_thr && row.thr > lowest ? row.thr : lowest;
      row.has_thr = true;
    }
    float zs = 0.0f, es = 0.0f;
    for (int64_t v = threadIdx.x; v < V; v += kRowThreads) {
      const float zv = row.z(v);
      if (row.kept(zv)) {
        const float x = f_sub(zv, m);
        const float ev = expf(x);
        zs = f_add(zs, ev);
        es = f_add(es, f_mul(ev, x));
      }
    }
    const double zsum = block_sum(zs, sh);
    const double ezsum = block_sum(es, sh);
    row.scale = f_div(1.0f, static_cast<float>(zsum));
    h = entropy_from_sums(zsum, ezsum);
  }

  // 4. TVD, sum p, the rule's per-token distortion terms (csd: gated below), probs output
  const bool one_hot_q = !a.draft_probs && has_draft;
  const RuleRow pre = rule_row(prm.rule, prm.rule_params, h, 0.0f);  // lambda*H and s (the gate needs the TVD)
  const bool token_terms = rule_has_token_terms(prm.rule) && !one_hot_q;
  float sa = 0.0f, sd = 0.0f, sr = 0.0f;
  float* probs_out = a.probs ? a.probs + item * V : nullptr;
  for (int64_t v = threadIdx.x; v < V; v += kRowThreads) {
    const float pv = row.p(v);
    if (probs_out) probs_out[v] = pv;
    const float qv = q_full ? q[v] : q0;
    const float d = f_sub(pv, qv);
    sa = f_add(sa, fabsf(d));
    if (token_terms) sd = f_add(sd, rule_distortion_term(pre, pv, qv, row.in_support(v)));
    // the residual's mass (one-hot q: p without the draft token); only "is it positive" is used
    sr = f_add(sr, one_hot_q ? (v == token ? 0.0f : pv) : (d > 0.0f ? d : 0.0f));
  }
  double sum_abs = block_sum(sa, sh);
  const double sum_dist = block_sum(sd, sh);
  const bool residual_positive = block_sum(sr, sh) > 0.0;

  const float p_x = row.p(has_draft ? token : 0);
  // a draft outside the support of p (masked, or cut by top-k / top-p / min-p) is rejected: q(x) counts as 0
  const bool x_in_support = has_draft && row.in_support(token);
  float q_x = 0.0f;
  if (x_in_support) q_x = a.draft_probs ? (q_full ? q[token] : q0) : 1.0f;
  if (one_hot_q) sum_abs += static_cast<double>(fabsf(f_sub(p_x, 1.0f))) - static_cast<double>(p_x);
  const float tvd = static_cast<float>(0.5 * sum_abs);  // q = 0 (no draft, no draft_probs): TVD = sum p / 2
  const RuleRow rr = rule_row(prm.rule, prm.rule_params, h, tvd);

  // the rule's term of the draft (lantern: its neighbours' mass; gsd: its group, with every token's a(y))
  const Row<T>& rw = row;
  auto p_at = [&rw](int64_t v) { return rw.p(v); };
  auto q_at = [&](int64_t v) { return q_full ? q[v] : (a.draft_probs ? q0 : (v == token ? 1.0f : 0.0f)); };
  const bool gsd = prm.rule == kRuleGsd && has_draft;
  GsdScratch gs{};
  if (gsd) {
    gs = gsd_scratch(a.workspace, item, V, next_pow2(V));
    BlockExec<kRowWarps> ex{sh};
    gsd_groups(V, static_cast<int64_t>(prm.rule_params[0]), prm.rule_params[1], p_at, q_at, gs, ex);
  }
  auto qa_at = [&](int64_t v) { return gsd && rw.in_support(v) ? f_mul(q_at(v), gs.a[v]) : 0.0f; };
  float extra_x = gsd && x_in_support ? gs.a[token] : 0.0f;
  if (rule_is_lantern(prm.rule) && x_in_support)  // every thread gathers the same k values (one L1 line each)
    extra_x = lantern_bonus(prm.neighbours + token * prm.nb_stride, prm.nb_k, V, lantern_limit(rr, p_x), f_inf(),
                            p_at);
  const PositionDecision dec = decide_position(rr, p_x, q_x, extra_x, has_draft, u_accept);
  if (dec.accepted) flags |= kFlagAccepted;
  float distortion = 0.0f;
  if (!has_draft || rule_lossless(prm.rule)) {
    distortion = 0.0f;
  } else if (rule_gathers_distortion(prm.rule) && !prm.gather_distortion) {
    distortion = f_nan();  // a(y) for every y (lantern: k gathers each; gsd: the sorted row): when asked
  } else if (one_hot_q) {
    const float t = f_sub(dec.accept_prob, p_x);  // q = one-hot(x): the only term is max(a(x) - p(x), 0)
    distortion = x_in_support && t > 0.0f ? t : 0.0f;
  } else if (gsd) {
    float s = 0.0f;
    for (int64_t v = threadIdx.x; v < V; v += kRowThreads) {
      const float t = f_sub(qa_at(v), p_at(v));
      s = f_add(s, t > 0.0f ? t : 0.0f);
    }
    distortion = static_cast<float>(block_sum(s, sh));
  } else if (rule_is_lantern(prm.rule)) {
    float s = 0.0f;
    for (int64_t v = threadIdx.x; v < V; v += kRowThreads)
      if (rw.in_support(v))
        s = f_add(s, lantern_distortion_term(rr, prm.neighbours + v * prm.nb_stride, prm.nb_k, V, p_at(v), q_at(v),
                                             p_at));
    distortion = static_cast<float>(block_sum(s, sh));
  } else if (prm.rule != kRuleCsd || rr.gate) {
    distortion = static_cast<float>(sum_dist);
  }

  // 5. draws
  const Row<T>& r = row;
  auto w_p = [&r](int64_t v) { return r.p(v); };
  const bool need_from_p = !has_draft || prm.coupling == kCouplingIndependent;
  int64_t from_p = need_from_p ? block_inverse_cdf(w_p, V, u_sample, sh) : -1;
  int64_t resampled = from_p;
  if (gsd) {  // gsd's residual max(p - q*a, 0)
    auto w_gsd = [&](int64_t v) { return rule_residual(kRuleGsd, p_at(v), 0.0f, qa_at(v)); };
    float s = 0.0f;
    for (int64_t v = threadIdx.x; v < V; v += kRowThreads) s = f_add(s, w_gsd(v));
    if (block_sum(s, sh) > 0.0)
      resampled = block_inverse_cdf(w_gsd, V, u_sample, sh);
    else
      resampled = need_from_p ? from_p : block_inverse_cdf(w_p, V, u_sample, sh);
  } else if (has_draft) {
    auto w_res = [&r, q, q_full, q0, one_hot_q, token](int64_t v) {
      const float pv = r.p(v);
      if (one_hot_q) return v == token ? 0.0f : pv;
      const float d = f_sub(pv, q_full ? q[v] : q0);
      return d > 0.0f ? d : 0.0f;
    };
    if (residual_positive)
      resampled = block_inverse_cdf(w_res, V, u_sample, sh);
    else
      resampled = need_from_p ? from_p : block_inverse_cdf(w_p, V, u_sample, sh);
  }

  // 6. the token drafted for later positions
  int64_t later;
  if (prm.coupling == kCouplingIndependent) {
    later = from_p;
  } else if (prm.coupling == kCouplingMaximal) {
    later = dec.keep_draft ? token : resampled;
  } else if (prm.greedy && !prm.probs_input) {
    later = row.greedy_token;
  } else {
    float best = -f_inf();
    int64_t best_i = V;
    const int64_t groups = (V + 3) / 4;
    for (int64_t g = threadIdx.x; g < groups; g += kRowThreads) {
      const Philox4 bits = gumbel_bits(key, pos, static_cast<uint32_t>(g));
#pragma unroll
      for (int l = 0; l < 4; ++l) {
        const int64_t v = 4 * g + l;
        if (v >= V) break;
        const float zv = row.z(v);
        if (!row.kept(zv)) continue;
        const float gv = -logf(-logf(uniform_from_bits(bits.x[l])));
        const float val = f_add(zv, gv);
        if (val > best || (val == best && v < best_i)) best = val, best_i = v;
      }
    }
    later = block_argmax(best, best_i, sh);
    if (later >= V) later = 0;
  }

  if (threadIdx.x == 0) {
    a.entropy[item] = h;
    a.tvd[item] = tvd;
    a.accept_prob[item] = dec.accept_prob;
    a.distortion[item] = has_draft ? distortion : 0.0f;
    a.flags[item] = flags;
    a.resampled[item] = resampled;
    a.tokens[item] = later;
  }
}

__global__ void row_epilogue_kernel(csd::VerifyProblem a) {
  const int64_t b = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (b >= a.B) return;
  row_epilogue(a.L, a.prm.vocab, a.start[b], a.draft_tokens + b * a.dt_sB, a.dt_sL, a.flags + b * a.L,
               a.resampled + b * a.L, a.tokens + b * a.L, a.accept_len + b, a.status + b);
}

}  // namespace
}  // namespace cuda
}  // namespace csd

// The split path is opt-in (CSD_KERNELS_CUDA_SPLIT=1) until it has run on a GPU: 1024-token slices (at most 256 per
// position), as the Triton split path measured fastest on an H200. Top-k needs the whole row in one block (its
// radix select), so it is never split.
extern "C" int64_t csd_verify_split_block(const csd::VerifyProblem* args) {
  const csd::VerifyProblem& a = *args;
  const char* flag = getenv("CSD_KERNELS_CUDA_SPLIT");
  if (flag == nullptr || strcmp(flag, "1") != 0) return 0;
  if (a.B * a.L == 0 || a.prm.probs_input || a.prm.rule == csd::kRuleGsd) return 0;  // gsd sorts the whole row
  if (!a.prm.greedy && (a.prm.top_k > 0 || a.prm.top_p < 1.0f || a.prm.log_min_p > -INFINITY)) return 0;
  constexpr int64_t kBlock = 1024, kMaxSlices = 256;
  int64_t block = kBlock;
  while ((a.prm.vocab + block - 1) / block > kMaxSlices) block *= 2;
  return block;
}

extern "C" int64_t csd_verify_workspace_bytes(const csd::VerifyProblem* args) {
  const csd::VerifyProblem& a = *args;
  if (a.prm.rule == csd::kRuleGsd)  // one gsd scratch per position (keys for the bitonic sort: a power of two)
    return a.B * a.L * csd::gsd_scratch_bytes(a.prm.vocab, csd::cuda::next_pow2(a.prm.vocab));
  if (a.split_block <= 0) return 0;
  csd::cuda::SplitWorkspace ws;
  return static_cast<int64_t>(
      csd::cuda::carve_split_workspace(nullptr, a.B * a.L * csd::cuda::split_count(a), a.B * a.L, a.B, &ws));
}

extern "C" int csd_verify_rows_launch(const csd::VerifyProblem* args, cudaStream_t stream) {
  using namespace csd::cuda;
  const csd::VerifyProblem& a = *args;
  if (a.B == 0) return cudaSuccess;
  if (a.L > 0 && a.split_block > 0) return launch_split(a, stream);  // the row epilogue runs inside
  if (a.L > 0) {
    const int64_t items = a.B * a.L;
    if (items > 0x7fffffffLL) return cudaErrorInvalidValue;
    const dim3 grid(static_cast<unsigned>(items));
    switch (a.logit_dtype) {
      case csd::kLogitF32:
        verify_position_kernel<float><<<grid, kRowThreads, 0, stream>>>(a);
        break;
      case csd::kLogitF16:
        verify_position_kernel<csd::f16_bits><<<grid, kRowThreads, 0, stream>>>(a);
        break;
      case csd::kLogitBF16:
        verify_position_kernel<csd::bf16_bits><<<grid, kRowThreads, 0, stream>>>(a);
        break;
      default:
        return cudaErrorInvalidValue;
    }
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  const int threads = 128;
  row_epilogue_kernel<<<static_cast<unsigned>((a.B + threads - 1) / threads), threads, 0, stream>>>(a);
  return cudaGetLastError();
}
