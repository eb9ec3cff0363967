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
#include "../include/decision.h"
#include "../include/gsd_row.h"
#include "split.cuh"
#include "verify.cuh"

namespace csd {
namespace cuda {
namespace {

using Shared = BlockShared<kRowWarps>;

// The top-p threshold (reference.restrict_top_p): the largest order key t whose mass, the sum of exp(z - max) over
// the kept z with key >= t, reaches top_p times the mass of every kept z; a bisection over the 32-bit keys (±0 share
// one key, as torch compares them equal). The returned z keeps ties at the threshold.
template <typename T>
__device__ float block_top_p_threshold(const Row<T>& row, int64_t V, float top_p, Shared& sh) {
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

// fp64 sum over the block of f(v), v < V: fp32 per thread, as every sum of this kernel.
template <class F>
__device__ __forceinline__ double strided_sum(int64_t V, F f, Shared& sh) {
  float s = 0.0f;
  for (int64_t v = threadIdx.x; v < V; v += kRowThreads) s = f_add(s, f(v));
  return block_sum(s, sh);
}

// 1. What the first pass over the logits finds: max z, bad input (or no finite logit), and for target probabilities
// their sums Z = sum w and sum w ln w.
struct Target {
  float m;
  bool bad;
  double w_sum, wl_sum;
};

template <typename T>
__device__ __forceinline__ Target scan_target(const VerifyParams& prm, const Row<T>& row, Shared& sh) {
  float m = -f_inf();
  bool bad = false;
  float ws = 0.0f, wls = 0.0f;
  for (int64_t v = threadIdx.x; v < prm.vocab; v += kRowThreads) {
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
  Target t;
  t.m = block_max(m, sh);
  t.bad = block_any(bad, sh) || !(t.m > -f_inf());
  t.w_sum = t.wl_sum = 0.0;
  if (prm.probs_input) {
    t.w_sum = block_sum(ws, sh);
    t.wl_sum = block_sum(wls, sh);
    t.bad = t.bad || !(fabs(t.w_sum - 1.0) <= prm.prob_sum_tolerance);
  }
  return t;
}

// The draft probabilities of slot (b, i), checked: finite, >= 0, summing to 1 within the tolerance.
__device__ __forceinline__ QRow read_draft_probs(const VerifyProblem& a, const VerifyParams& prm, int64_t b,
                                                 int64_t i, const DraftSlot& slot, bool* bad_probs, Shared& sh) {
  const float* q = a.draft_probs ? a.draft_probs + b * a.q_sB + i * a.q_sL : nullptr;
  const bool q_scalar = q && a.q_sV == 0;
  bool bad = false;
  if (q) {
    bool qbad = false;
    float qs = 0.0f;
    for (int64_t v = threadIdx.x; v < (q_scalar ? 1 : prm.vocab); v += kRowThreads) {
      qbad |= !(f_isfinite(q[v]) && q[v] >= 0.0f);
      qs = f_add(qs, q[v]);
    }
    const double q_sum = q_scalar ? static_cast<double>(q[0]) * prm.vocab : block_sum(qs, sh);
    bad = block_any(qbad, sh) || !(fabs(q_sum - 1.0) <= prm.prob_sum_tolerance);
  }
  *bad_probs = bad;
  return QRow{q && !q_scalar && !bad ? q : nullptr, (q_scalar && !bad) ? q[0] : 0.0f, slot.token,
              !a.draft_probs && slot.has_draft};
}

// 2. The support's threshold on z: top-k's k-th largest (radix select), top-p's, min-p's (the smallest kept z with
// z - max >= ln(min_p)).
template <typename T>
__device__ __forceinline__ void restrict_support(const VerifyParams& prm, Row<T>& row, Shared& sh) {
  const int64_t V = prm.vocab;
  if (prm.top_k > 0 && prm.top_k < V) {
    row.thr = block_kth_largest([&row](int64_t v) { return row.z(v); }, V, prm.top_k, sh);
    row.has_thr = true;
  }
  if (prm.top_p < 1.0f) {
    row.thr = block_top_p_threshold(row, V, prm.top_p, sh);
    row.has_thr = true;
  }
  if (prm.log_min_p > -f_inf()) {
    float lowest = row.m;
    for (int64_t v = threadIdx.x; v < V; v += kRowThreads) {
      const float zv = row.z(v);
      if (row.kept(zv) && f_sub(zv, row.m) >= prm.log_min_p && zv < lowest) lowest = zv;
    }
    lowest = -block_max(-lowest, sh);
    row.thr = row.has_thr && row.thr > lowest ? row.thr : lowest;
    row.has_thr = true;
  }
}

// 2-3. The greedy token, or the support and the softmax sums: row.m, row.scale. Returns H(p).
template <typename T>
__device__ __forceinline__ float softmax(const VerifyParams& prm, const Target& t, Row<T>& row, Shared& sh) {
  const int64_t V = prm.vocab;
  row.m = t.m;
  if (prm.probs_input) {
    row.scale = f_div(1.0f, static_cast<float>(t.w_sum));
    return entropy_from_sums(t.w_sum, t.wl_sum);
  }
  if (prm.greedy) {
    int64_t first = V;
    for (int64_t v = threadIdx.x; v < V; v += kRowThreads)
      if (row.z(v) == t.m && v < first) first = v;
    row.greedy_token = block_min_i64(first, sh);
    return 0.0f;
  }
  restrict_support(prm, row, sh);
  float zs = 0.0f, es = 0.0f;
  for (int64_t v = threadIdx.x; v < V; v += kRowThreads) {
    const float zv = row.z(v);
    if (row.kept(zv)) {
      const float x = f_sub(zv, t.m);
      const float ev = expf(x);
      zs = f_add(zs, ev);
      es = f_add(es, f_mul(ev, x));
    }
  }
  const double zsum = block_sum(zs, sh);
  const double ezsum = block_sum(es, sh);
  row.scale = f_div(1.0f, static_cast<float>(zsum));
  return entropy_from_sums(zsum, ezsum);
}

// 4. One pass over p: the probs output, the TVD, the rule's token terms (csd's whatever its gate: the TVD is known
// after) and whether the strict residual has mass. One-hot q is read as q = 0 and x's term corrected after.
struct PassSums {
  float tvd;
  double sum_dist;
  bool residual_positive;
};

template <typename T>
__device__ __forceinline__ PassSums pass_over_p(const VerifyProblem& a, int64_t item, const VerifyParams& prm,
                                                const Row<T>& row, const QRow& q, float h, Shared& sh) {
  const int64_t V = prm.vocab;
  const RuleRow pre = rule_row(prm.rule, prm.rule_params, h, 0.0f);  // lambda*H and s (the gate needs the TVD)
  const bool token_terms = rule_has_token_terms(prm.rule) && !q.one_hot;
  float sa = 0.0f, sd = 0.0f, sr = 0.0f;
  float* probs_out = a.probs ? a.probs + item * V : nullptr;
  for (int64_t v = threadIdx.x; v < V; v += kRowThreads) {
    const float pv = row.p(v);
    if (probs_out) probs_out[v] = pv;
    const float qv = q.q ? q.q[v] : q.q0;
    const float d = f_sub(pv, qv);
    sa = f_add(sa, fabsf(d));
    if (token_terms) sd = f_add(sd, rule_distortion_term(pre, pv, qv, row.in_support(v)));
    // the residual's mass (one-hot q: p without the draft token); only "is it positive" is used
    sr = f_add(sr, q.one_hot ? (v == q.token ? 0.0f : pv) : (d > 0.0f ? d : 0.0f));
  }
  PassSums s;
  double sum_abs = block_sum(sa, sh);
  s.sum_dist = block_sum(sd, sh);
  s.residual_positive = block_sum(sr, sh) > 0.0;
  if (q.one_hot) {
    const float p_x = row.p(q.token);
    sum_abs += static_cast<double>(fabsf(f_sub(p_x, 1.0f))) - static_cast<double>(p_x);
  }
  s.tvd = static_cast<float>(0.5 * sum_abs);  // q = 0 (no draft, no draft_probs): TVD = sum p / 2
  return s;
}

// The position's law (decision.h); qa reads gs, gsd's a(y) of every token (gsd only).
template <typename T>
__device__ __forceinline__ auto position_law(const Row<T>& row, const QRow& q, const GsdScratch& gs, bool gsd) {
  auto p = [&row](int64_t v) { return row.p(v); };
  auto q_at = [&q](int64_t v) { return q.at(v); };
  auto in_support = [&row](int64_t v) { return row.in_support(v); };
  auto qa = [&row, &q, &gs, gsd](int64_t v) { return gsd && row.in_support(v) ? f_mul(q.at(v), gs.a[v]) : 0.0f; };
  return slot_law(p, q_at, qa, in_support, q.one_hot, q.token);
}

// 5. The draws, by block inverse CDF. gsd's residual max(p - q*a, 0) has its mass summed here; the strict residual's
// is pass 4's.
template <class Law>
__device__ __forceinline__ SlotDraws position_draws(const VerifyParams& prm, const Law& law, const SlotDecision& s,
                                                    bool has_draft, bool residual_positive, float u, Shared& sh) {
  auto draws = [&](bool positive, auto w) {
    return slot_draws(
        has_draft && positive, prm.coupling, [&] { return block_inverse_cdf(law.p, prm.vocab, u, sh); },
        [&] { return block_inverse_cdf(w, prm.vocab, u, sh); });
  };
  const int rule = s.residual_rule(prm.rule);
  if (has_draft && rule_residual_qa(rule)) {  // each residual in a loop of its own: fewer registers
    auto w = [&](int64_t v) { return qa_residual_weight(rule, law, v); };
    return draws(strided_sum(prm.vocab, w, sh) > 0.0, w);
  }
  return draws(residual_positive, [&](int64_t v) { return strict_residual_weight(law, v); });
}

// 6. argmax(z + G) over the support, with one Philox call per 4 tokens (0 where nothing is kept).
template <typename T>
__device__ __forceinline__ int64_t gumbel_token(const Row<T>& row, const SlotRandom& rnd, int64_t V, Shared& sh) {
  float best = -f_inf();
  int64_t best_i = V;
  const int64_t groups = (V + 3) / 4;
  for (int64_t g = threadIdx.x; g < groups; g += kRowThreads) {
    const Philox4 bits = gumbel_bits(rnd.key, rnd.pos, static_cast<uint32_t>(g));
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
  const int64_t found = block_argmax(best, best_i, sh);
  return found < V ? found : 0;
}

template <typename T>
__global__ void __launch_bounds__(kRowThreads) verify_position_kernel(csd::VerifyProblem a) {
  __shared__ Shared sh;
  const int64_t item = blockIdx.x;
  const int64_t b = item / a.L, i = item % a.L;
  const VerifyParams prm = params_at(a, b, i);
  const int64_t V = prm.vocab;
  const DraftSlot slot = draft_slot(a, b, i);
  const SlotRandom rnd = slot_random(a, b, i);
  Row<T> row = make_row<T>(a, b, i);
  const Target target = scan_target(prm, row, sh);
  bool bad_probs;
  const QRow q = read_draft_probs(a, prm, b, i, slot, &bad_probs, sh);
  const uint32_t flags = slot_flags(slot, bad_probs);
  if (target.bad) {  // every output of this position is fixed: NaN statistics, token 0, a stop
    if (a.probs)
      for (int64_t v = threadIdx.x; v < V; v += kRowThreads) a.probs[item * V + v] = f_nan();
    if (threadIdx.x == 0) store_bad_slot(a, item, flags);
    return;
  }
  const float h = softmax(prm, target, row, sh);
  const PassSums ps = pass_over_p(a, item, prm, row, q, h, sh);
  const RuleRow rr = rule_row(prm.rule, prm.rule_params, h, ps.tvd);

  // the rule's term of the draft (lantern: its neighbours' mass; gsd: its group, with every token's a(y))
  const bool gsd = prm.rule == kRuleGsd && slot.has_draft;
  GsdScratch gs{};
  const auto law = position_law(row, q, gs, gsd);
  if (gsd) {
    gs = gsd_scratch(a.workspace, item, V, next_pow2(V));
    BlockExec<kRowWarps> ex{sh};
    gsd_groups(V, static_cast<int64_t>(prm.rule_params[0]), prm.rule_params[1], law.p, law.q, gs, ex);
  }
  const DraftTerms x = draft_terms(law, slot.token);
  auto sum = [&](DistortionCase c, auto term) {
    return c == kDistortionTokenTerms ? ps.sum_dist : strided_sum(V, term, sh);
  };
  const SlotDecision s = decide_slot(rr, prm, x, rnd.u_accept, law, [&] { return gs.a[x.token]; }, sum);
  const SlotDraws draws = position_draws(prm, law, s, x.has_draft, ps.residual_positive, rnd.u_sample, sh);
  const int64_t later = next_draft(prm.coupling, s.d, x.token, draws, [&] {
    return prm.greedy && !prm.probs_input ? row.greedy_token : gumbel_token(row, rnd, V, sh);
  });
  if (threadIdx.x == 0) store_slot(a, item, h, ps.tvd, s, flags, draws.resampled, later);
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
