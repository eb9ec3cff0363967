// Split path of the CUDA verification (see split.cuh): grid (B*L*S,), block b = position * S + slice.
//
//   split_stats_kernel: per slice, max m_s, Z_s = sum exp(z - m_s), S1_s = sum exp(z - m_s)(z - m_s), the non-finite
//     flag, the first argmax (T = 0) or the gumbel argmax; it also zeroes this launch's arrival counters.
//   split_finish_kernel: every block combines its position's slice statistics (m, Z, H), computes p on its slice and
//     the slice sums of |p - q|, max(p - q, 0), p and the gated distortion. The last block of a position to arrive
//     (atomic counter after a fence) combines those sums, decides, and draws by inverse CDF: the slice holding
//     u * total is found from the slice totals, then only that slice is scanned. The last position of a row to finish
//     runs the row epilogue. Two launches, no host sync, CUDA-graph safe. Top-k is not split (launcher's choice).
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "../include/block_ops.cuh"
#include "../include/decision.h"
#include "split.cuh"

namespace csd {
namespace cuda {
namespace {

constexpr int kSplitThreads = 128;
constexpr int kSplitWarps = kSplitThreads / 32;
using Shared = BlockShared<kSplitWarps>;

// A block's coordinates, and the launch's workspace it reads and writes.
struct SplitBlock {
  int64_t id, item, slice, n_split, b, i, v0, v1;
  SplitWorkspace ws;
};

__device__ SplitBlock split_block_coords(const VerifyProblem& a) {
  SplitBlock c;
  c.n_split = split_count(a);
  c.id = blockIdx.x;
  c.item = c.id / c.n_split;
  c.slice = c.id % c.n_split;
  c.b = c.item / a.L;
  c.i = c.item % a.L;
  c.v0 = c.slice * a.split_block;
  c.v1 = c.v0 + a.split_block < a.prm.vocab ? c.v0 + a.split_block : a.prm.vocab;
  carve_split_workspace(a.workspace, a.B * a.L * c.n_split, a.B * a.L, a.B, &c.ws);
  return c;
}

// q(v) of one position with invalid entries read as 0 (the row-level flag then discards q altogether):
// draft_probs, a uniform q (last-dim stride 0), one-hot(token), or 0 with neither a draft nor draft_probs.
struct DraftRow {
  const float* q;
  bool scalar;
  int64_t token;

  __device__ float at(int64_t v) const {
    if (!q) return v == token ? 1.0f : 0.0f;
    const float x = q[scalar ? 0 : v];
    return (f_isfinite(x) && x >= 0.0f) ? x : 0.0f;
  }
  __device__ bool bad_at(int64_t v) const {
    if (!q) return false;
    const float x = q[scalar ? 0 : v];
    return !(f_isfinite(x) && x >= 0.0f);
  }
};

__device__ DraftRow draft_row(const VerifyProblem& a, int64_t b, int64_t i, int64_t token) {
  DraftRow d;
  d.q = a.draft_probs ? a.draft_probs + b * a.q_sB + i * a.q_sL : nullptr;
  d.scalar = a.draft_probs && a.q_sV == 0;
  d.token = token;
  return d;
}

template <typename T>
__global__ void __launch_bounds__(kSplitThreads) split_stats_kernel(VerifyProblem a) {
  __shared__ Shared sh;
  const SplitBlock c = split_block_coords(a);
  if (threadIdx.x == 0 && c.slice == 0) {
    c.ws.position_count[c.item] = 0u;
    if (c.i == 0) c.ws.row_count[c.b] = 0u;
  }
  const Row<T> row = make_row<T>(a, c.b, c.i);

  float m = -f_inf();
  bool bad = false;
  for (int64_t v = c.v0 + threadIdx.x; v < c.v1; v += kSplitThreads) {
    bool bad_v;
    const float zv = row.z_checked(v, &bad_v);
    bad |= bad_v;
    m = zv > m ? zv : m;
  }
  m = block_max(m, sh);
  bad = block_any(bad, sh);

  double z_sum = 0.0, s1 = 0.0;
  float gumbel_best = -f_inf();
  int64_t index = 0;
  if (a.prm.greedy) {
    int64_t first = c.v1;
    for (int64_t v = c.v0 + threadIdx.x; v < c.v1; v += kSplitThreads)
      if (row.z(v) == m && v < first) first = v;
    index = block_min_i64(first, sh);
  } else {
    float zs = 0.0f, es = 0.0f;
    for (int64_t v = c.v0 + threadIdx.x; v < c.v1; v += kSplitThreads) {
      const float zv = row.z(v);
      if (!(zv > -f_inf())) continue;  // a masked token adds nothing
      const float x = f_sub(zv, m);
      const float ev = expf(x);
      zs = f_add(zs, ev);
      es = f_add(es, f_mul(ev, x));
    }
    z_sum = block_sum(zs, sh);
    s1 = block_sum(es, sh);
    if (a.prm.coupling == kCouplingGumbel) {
      const RowKey key = seeded_row_key(a.seed, a.n_seed, c.b);
      const uint32_t pos = absolute_position(a.positions[c.b], c.i);
      float best = -f_inf();
      int64_t best_i = a.prm.vocab;
      for (int64_t g = c.v0 / 4 + threadIdx.x; 4 * g < c.v1; g += kSplitThreads) {
        const Philox4 bits = gumbel_bits(key, pos, static_cast<uint32_t>(g));
#pragma unroll
        for (int l = 0; l < 4; ++l) {
          const int64_t v = 4 * g + l;
          if (v >= c.v1) break;
          const float val = f_add(row.z(v), -logf(-logf(uniform_from_bits(bits.x[l]))));
          if (val > best || (val == best && v < best_i)) best = val, best_i = v;
        }
      }
      index = block_argmax(best, best_i, sh, &gumbel_best);
    }
  }
  if (threadIdx.x == 0) c.ws.stats[c.id] = SliceStats{z_sum, s1, index, m, gumbel_best, bad ? 1 : 0};
}

// The position's softmax from its slice statistics: row.m / row.scale (or row.greedy_token), the entropy, the bad
// flag and the gumbel argmax.
struct Combined {
  float h;
  bool bad;
  int64_t gumbel_token;
};

template <typename T>
__device__ Combined combine_stats(const VerifyProblem& a, const SplitBlock& c, Row<T>& row, Shared& sh) {
  const SliceStats* stats = c.ws.stats + c.item * c.n_split;
  Combined out{0.0f, false, 0};
  float m = -f_inf();
  bool bad = false;
  for (int64_t t = threadIdx.x; t < c.n_split; t += kSplitThreads) {
    const float mt = stats[t].max;
    m = mt > m ? mt : m;
    bad |= stats[t].bad != 0;
  }
  m = block_max(m, sh);
  out.bad = block_any(bad, sh) || !(m > -f_inf());  // bad input, or no finite logit in the row
  if (a.prm.greedy) {
    int64_t first = c.n_split;  // the first slice holding the maximum holds the first argmax
    for (int64_t t = threadIdx.x; t < c.n_split; t += kSplitThreads)
      if (stats[t].max == m && t < first) first = t;
    first = block_min_i64(first, sh);
    row.greedy_token = first < c.n_split ? stats[first].index : 0;
    out.gumbel_token = row.greedy_token;
    return out;
  }
  double z_total = 0.0, s1_total = 0.0;
  float best = -f_inf();
  int64_t best_i = a.prm.vocab;
  for (int64_t t = threadIdx.x; t < c.n_split; t += kSplitThreads) {
    if (!(stats[t].max > -f_inf())) continue;  // a slice of masked tokens only
    const double shift = static_cast<double>(stats[t].max) - static_cast<double>(m);
    const double scale = exp(shift);
    z_total += stats[t].z_sum * scale;
    s1_total += scale * (stats[t].s1 + shift * stats[t].z_sum);
    const float g = stats[t].gumbel_best;
    if (g > best) best = g, best_i = stats[t].index;  // slices in order: the first of equal values wins
  }
  z_total = block_sum(z_total, sh);
  s1_total = block_sum(s1_total, sh);
  row.m = m;
  row.scale = f_div(1.0f, static_cast<float>(z_total));
  out.h = entropy_from_sums(z_total, s1_total);
  if (a.prm.coupling == kCouplingGumbel) out.gumbel_token = block_argmax(best, best_i, sh);
  return out;
}

// Inverse-CDF draw at u * total over weights w whose per-slice totals are the sums' `field`: thread 0 finds the
// slice holding the target from the totals, then the block scans only that slice.
template <typename Wt>
__device__ int64_t split_inverse_cdf(Wt w, double SliceSums::*field, const VerifyProblem& a, const SplitBlock& c,
                                     float u, Shared& sh) {
  const SliceSums* sums = c.ws.sums + c.item * c.n_split;
  if (threadIdx.x == 0) {
    double total = 0.0;
    for (int64_t t = 0; t < c.n_split; ++t) total += __ldcg(&(sums[t].*field));
    const float target = f_mul(u, static_cast<float>(total));
    double before = 0.0, before_last = 0.0;
    int64_t chosen = -1, last = 0;
    for (int64_t t = 0; t < c.n_split; ++t) {
      const double wt = __ldcg(&(sums[t].*field));
      if (chosen < 0 && static_cast<float>(before + wt) > target) chosen = t, sh.carry = before;
      if (wt > 0.0) last = t, before_last = before;
      before += wt;
    }
    sh.result = chosen >= 0 ? chosen : last;
    sh.target = chosen >= 0 ? target : f_inf();  // rounding overshoot: the last positive weight
    if (chosen < 0) sh.carry = before_last;
  }
  __syncthreads();
  const int64_t slice = sh.result;
  const double carry = sh.carry;
  const float target = sh.target;
  __syncthreads();
  const int64_t v0 = slice * a.split_block;
  const int64_t v1 = v0 + a.split_block < a.prm.vocab ? v0 + a.split_block : a.prm.vocab;
  double slice_total;
  const Chunk chunk = chunk_prefix(w, v0, v1, &slice_total, sh);
  int64_t result = chunk_search(w, chunk, v1, carry, target, sh);
  if (result < 0) result = last_positive(w, v0, v1, sh);
  return result < 0 ? 0 : result;
}

// Sums of the finished position, read back from the workspace (written by the position's other blocks).
struct PositionSums {
  double abs, residual, p, dist;
  bool bad_q;
};

// has_q: draft_probs was given, so its row must sum to 1 within `tolerance`.
__device__ PositionSums gather_sums(const SplitBlock& c, bool has_q, double tolerance, Shared& sh) {
  const SliceSums* sums = c.ws.sums + c.item * c.n_split;
  double abs_s = 0.0, res_s = 0.0, p_s = 0.0, dist_s = 0.0, q_s = 0.0;
  bool bad_q = false;
  for (int64_t t = threadIdx.x; t < c.n_split; t += kSplitThreads) {
    abs_s += __ldcg(&sums[t].abs);
    res_s += __ldcg(&sums[t].residual);
    p_s += __ldcg(&sums[t].p);
    dist_s += __ldcg(&sums[t].dist);
    q_s += __ldcg(&sums[t].q);
    bad_q |= __ldcg(&sums[t].bad_q) != 0;
  }
  PositionSums s;
  s.abs = block_sum(abs_s, sh);
  s.residual = block_sum(res_s, sh);
  s.p = block_sum(p_s, sh);
  s.dist = block_sum(dist_s, sh);
  q_s = block_sum(q_s, sh);
  s.bad_q = block_any(bad_q, sh) || (has_q && !(fabs(q_s - 1.0) <= tolerance));
  return s;
}

// True in every thread of the block that arrives last at `counter` (of `expected` arrivals).
__device__ bool arrive_last(unsigned* counter, unsigned expected, Shared& sh) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();  // this block's workspace writes before its arrival
    sh.flag = atomicAdd(counter, 1u) == expected - 1u;
  }
  __syncthreads();
  const bool last = sh.flag != 0;
  if (last) __threadfence();  // and the others' before our reads
  return last;
}

// This slice's sums for the position's last block: |p - q|, max(p - q, 0), p, the distortion terms (csd's whatever
// its gate: the TVD is known after; lantern's where gathered), q, and whether q had a bad entry here.
template <typename T>
__device__ __forceinline__ void slice_sums(const VerifyProblem& a, const SplitBlock& c, const VerifyParams& prm,
                                           const Row<T>& row, const Combined& st, const DraftRow& q, Shared& sh) {
  const int64_t V = prm.vocab;
  const RuleRow pre = rule_row(prm.rule, prm.rule_params, st.h, 0.0f);  // lambda*H and s (the gate needs the TVD)
  const bool lantern_terms = rule_is_lantern(prm.rule) && prm.gather_distortion;
  auto p_at = [&row](int64_t v) { return row.p(v); };
  float sa = 0.0f, sr = 0.0f, sp = 0.0f, sd = 0.0f, sq = 0.0f;
  bool bad_q = false;
  float* probs_out = a.probs ? a.probs + c.item * V : nullptr;
  for (int64_t v = c.v0 + threadIdx.x; v < c.v1; v += kSplitThreads) {
    const float pv = st.bad ? 0.0f : row.p(v);
    if (probs_out) probs_out[v] = st.bad ? f_nan() : pv;
    const float qv = q.at(v);
    bad_q |= q.bad_at(v);
    const float d = f_sub(pv, qv);
    sa = f_add(sa, fabsf(d));
    sr = f_add(sr, d > 0.0f ? d : 0.0f);
    sp = f_add(sp, pv);
    if (!st.bad && row.in_support(v)) {
      if (rule_has_token_terms(prm.rule)) sd = f_add(sd, rule_distortion_term(pre, pv, qv, true));
      if (lantern_terms)  // k gathers per token of the slice
        sd = f_add(sd, lantern_distortion_term(pre, prm.neighbours + v * prm.nb_stride, prm.nb_k, V, pv, qv, p_at));
    }
    sq = f_add(sq, qv);
  }
  const double abs_s = block_sum(sa, sh), res_s = block_sum(sr, sh), p_s = block_sum(sp, sh);
  const double dist_s = block_sum(sd, sh), q_s = block_sum(sq, sh);
  bad_q = block_any(bad_q, sh);
  if (threadIdx.x == 0) c.ws.sums[c.id] = SliceSums{abs_s, res_s, p_s, dist_s, q_s, bad_q ? 1 : 0};
}

// The position's decision, draws and outputs, by its last block from every slice's sums. The slices read
// q = one-hot(x) as any q (and summed its terms); a bad q reads as 0. gsd never runs split.
template <typename T>
__device__ __forceinline__ void finish_position(const VerifyProblem& a, const SplitBlock& c, const VerifyParams& prm,
                                                const Row<T>& row, const Combined& st, const DraftSlot& slot,
                                                const DraftRow& q, Shared& sh) {
  const PositionSums sums = gather_sums(c, a.draft_probs != nullptr, prm.prob_sum_tolerance, sh);
  const SlotRandom rnd = slot_random(a, c.b, c.i);
  const uint32_t flags = slot_flags(slot, sums.bad_q);
  if (st.bad) {
    if (threadIdx.x == 0) store_bad_slot(a, c.item, flags);
    return;
  }
  const auto law = slot_law([&row](int64_t v) { return row.p(v); },
                            [&q, &sums](int64_t v) { return sums.bad_q ? 0.0f : q.at(v); },
                            [](int64_t) { return 0.0f; }, [&row](int64_t v) { return row.in_support(v); });
  const DraftTerms x = draft_terms(law, slot.token);
  const float tvd = static_cast<float>(0.5 * (sums.bad_q ? sums.p : sums.abs));
  const RuleRow rr = rule_row(prm.rule, prm.rule_params, st.h, tvd);
  auto sum = [&sums](DistortionCase, auto) { return sums.bad_q ? 0.0 : sums.dist; };  // the slices summed the terms
  const SlotDecision s = decide_slot(rr, prm, x, rnd.u_accept, law, [] { return 0.0f; }, sum);
  auto w_res = [&law](int64_t v) { return strict_residual_weight(law, v); };
  const SlotDraws draws = slot_draws(
      x.has_draft && !sums.bad_q && sums.residual > 0.0, prm.coupling,
      [&] { return split_inverse_cdf(law.p, &SliceSums::p, a, c, rnd.u_sample, sh); },
      [&] { return split_inverse_cdf(w_res, &SliceSums::residual, a, c, rnd.u_sample, sh); });
  const int64_t later = next_draft(prm.coupling, s.d, x.token, draws, [&st] { return st.gumbel_token; });
  if (threadIdx.x == 0) store_slot(a, c.item, st.h, tvd, s, flags, draws.resampled, later);
}

template <typename T>
__global__ void __launch_bounds__(kSplitThreads) split_finish_kernel(VerifyProblem a) {
  __shared__ Shared sh;
  const SplitBlock c = split_block_coords(a);
  const VerifyParams prm = params_at(a, c.b, c.i);
  Row<T> row = make_row<T>(a, c.b, c.i);
  const Combined st = combine_stats(a, c, row, sh);
  const DraftSlot slot = draft_slot(a, c.b, c.i);
  const DraftRow q = draft_row(a, c.b, c.i, slot.token);
  slice_sums(a, c, prm, row, st, q, sh);
  if (!arrive_last(c.ws.position_count + c.item, static_cast<unsigned>(c.n_split), sh)) return;
  finish_position(a, c, prm, row, st, slot, q, sh);

  // ---- the last position of the row to finish writes the row
  if (!arrive_last(c.ws.row_count + c.b, static_cast<unsigned>(a.L), sh)) return;
  if (threadIdx.x == 0)
    row_epilogue(a.L, prm.vocab, a.start[c.b], a.draft_tokens + c.b * a.dt_sB, a.dt_sL, a.flags + c.b * a.L,
                 a.resampled + c.b * a.L, a.tokens + c.b * a.L, a.accept_len + c.b, a.status + c.b);
}

template <typename T>
cudaError_t launch_split_typed(const VerifyProblem& a, cudaStream_t stream) {
  const int64_t blocks = a.B * a.L * split_count(a);
  if (blocks > 0x7fffffffLL) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(blocks));
  split_stats_kernel<T><<<grid, kSplitThreads, 0, stream>>>(a);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  split_finish_kernel<T><<<grid, kSplitThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_split(const VerifyProblem& a, cudaStream_t stream) {
  switch (a.logit_dtype) {
    case kLogitF32:
      return launch_split_typed<float>(a, stream);
    case kLogitF16:
      return launch_split_typed<f16_bits>(a, stream);
    case kLogitBF16:
      return launch_split_typed<bf16_bits>(a, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace cuda
}  // namespace csd
