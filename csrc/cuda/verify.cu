// CUDA kernel of torch.ops.csd_kernels.verify_rows (no torch headers: `nvcc -arch=sm_90 -c verify.cu` builds alone).
//
// Layout: one thread block of kThreads threads per (row, position); the vocabulary is walked with block-strided
// loops (coalesced) and combined with warp-shuffle block reductions. The target probabilities are never stored
// (except into the optional probs output): every pass recomputes p_v = exp(z_v - max) / Z from the logits (L2 hits),
// which is deterministic, so all passes agree bit for bit. Passes:
//   1. max z and finiteness (+ the draft-probability row check)
//   2. (top-k) exact k-th largest z by a 4 x 8-bit radix select on order-preserving keys
//   3. Z = sum exp(z - max), sum exp * (z - max)  -> entropy
//   4. TVD, sum p, closed-form distortion, probs output
//   5. inverse-CDF draws: per-thread contiguous chunks summed in fp64, a block exclusive scan, and one thread
//      walking the chunk that crosses u * total (fp64 running sum, as torch.cumsum on the CPU)
//   6. (gumbel) argmax(z + G) with one Philox call per 4 tokens
// A second tiny kernel (one thread per row) does the row epilogue: accept_len, token selection, status bits.
// Seed and offset are read from device memory inside the kernel (no host sync; CUDA-graph safe).
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "verify.cuh"

namespace csd {
namespace cuda {
namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr unsigned kFull = 0xffffffffu;

struct SharedState {
  double d[kWarps];
  float f[kWarps];
  int64_t i64[kWarps];
  unsigned hist[256];
  int64_t result;
  unsigned digit;
  int remaining;
};

__device__ __forceinline__ double warp_sum(double v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFull, v, o);
  return v;
}

// Sum over the block, same value (and same order of operations) in every thread.
__device__ double block_sum(double v, SharedState& sh) {
  v = warp_sum(v);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) sh.d[threadIdx.x >> 5] = v;
  __syncthreads();
  double s = 0.0;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) s += sh.d[w];
  return s;
}

__device__ float block_max(float v, SharedState& sh) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float other = __shfl_xor_sync(kFull, v, o);
    v = other > v ? other : v;
  }
  __syncthreads();
  if ((threadIdx.x & 31) == 0) sh.f[threadIdx.x >> 5] = v;
  __syncthreads();
  float m = sh.f[0];
#pragma unroll
  for (int w = 1; w < kWarps; ++w) m = sh.f[w] > m ? sh.f[w] : m;
  return m;
}

__device__ int64_t block_min_i64(int64_t v, SharedState& sh) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const int64_t other = __shfl_xor_sync(kFull, v, o);
    v = other < v ? other : v;
  }
  __syncthreads();
  if ((threadIdx.x & 31) == 0) sh.i64[threadIdx.x >> 5] = v;
  __syncthreads();
  int64_t m = sh.i64[0];
#pragma unroll
  for (int w = 1; w < kWarps; ++w) m = sh.i64[w] < m ? sh.i64[w] : m;
  return m;
}

__device__ int64_t block_max_i64(int64_t v, SharedState& sh) { return -block_min_i64(-v, sh); }

__device__ bool block_any(bool v, SharedState& sh) { return block_max_i64(v ? 1 : 0, sh) != 0; }

// Argmax of (value, index) pairs, lowest index on ties; -inf values lose to everything.
__device__ int64_t block_argmax(float val, int64_t idx, SharedState& sh) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(kFull, val, o);
    const int64_t oi = __shfl_xor_sync(kFull, idx, o);
    if (ov > val || (ov == val && oi < idx)) val = ov, idx = oi;
  }
  __syncthreads();
  if ((threadIdx.x & 31) == 0) {
    sh.f[threadIdx.x >> 5] = val;
    sh.i64[threadIdx.x >> 5] = idx;
  }
  __syncthreads();
  float bv = sh.f[0];
  int64_t bi = sh.i64[0];
#pragma unroll
  for (int w = 1; w < kWarps; ++w)
    if (sh.f[w] > bv || (sh.f[w] == bv && sh.i64[w] < bi)) bv = sh.f[w], bi = sh.i64[w];
  return bi;
}

// Exclusive prefix over the block (thread order) of per-thread fp64 values; *total gets the sum.
__device__ double block_exclusive_scan(double v, double* total, SharedState& sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  double inc = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const double n = __shfl_up_sync(kFull, inc, o);
    if (lane >= o) inc += n;
  }
  __syncthreads();
  if (lane == 31) sh.d[warp] = inc;
  __syncthreads();
  double before = 0.0, all = 0.0;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    if (w < warp) before += sh.d[w];
    all += sh.d[w];
  }
  *total = all;
  return before + inc - v;
}

// Everything one (row, position) needs to recompute z_v and p_v.
template <typename T>
struct Row {
  const T* c;
  const T* u;
  VerifyParams prm;
  float m = 0.0f, thr = 0.0f, scale = 1.0f;
  int64_t greedy_token = 0;
  bool has_thr = false;

  __device__ float z(int64_t v) const {
    const float cv = LogitLoad<T>::load(c, v);
    const float uv = u ? LogitLoad<T>::load(u, v) : 0.0f;
    return mix_logit(cv, uv, prm);
  }
  __device__ bool kept(float zv) const { return !has_thr || zv >= thr; }
  // exp(z - max) where kept, else 0
  __device__ float e(int64_t v) const {
    const float zv = z(v);
    return kept(zv) ? expf(f_sub(zv, m)) : 0.0f;
  }
  __device__ float p(int64_t v) const {
    if (prm.greedy) return v == greedy_token ? 1.0f : 0.0f;
    return f_mul(e(v), scale);
  }
};

// Exact k-th largest of z (ties counted): radix select over order-preserving keys, 8 bits at a time.
template <typename T>
__device__ float block_kth_largest(const Row<T>& row, int64_t V, int64_t k, SharedState& sh) {
  uint32_t prefix = 0, mask = 0;
  if (threadIdx.x == 0) sh.remaining = static_cast<int>(k);
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int d = threadIdx.x; d < 256; d += kThreads) sh.hist[d] = 0;
    __syncthreads();
    for (int64_t v = threadIdx.x; v < V; v += kThreads) {
      const uint32_t key = float_order_key(row.z(v));
      if ((key & mask) == prefix) atomicAdd(&sh.hist[(key >> shift) & 255u], 1u);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      int cum = 0, rem = sh.remaining;
      unsigned digit = 0;
      for (int d = 255; d >= 0; --d) {
        const int h = static_cast<int>(sh.hist[d]);
        if (cum + h >= rem) {
          digit = static_cast<unsigned>(d);
          rem -= cum;
          break;
        }
        cum += h;
      }
      sh.digit = digit;
      sh.remaining = rem;
    }
    __syncthreads();
    prefix |= sh.digit << shift;
    mask |= 255u << shift;
  }
  return float_from_order_key(prefix);
}

// Inverse-CDF draw over weights w(v) >= 0: first v with float(fp64 prefix) > u * float(total), else the last v with
// w(v) > 0. The same value is returned to every thread.
template <typename W>
__device__ int64_t block_inverse_cdf(W w, int64_t V, float u, SharedState& sh) {
  const int64_t chunk = (V + kThreads - 1) / kThreads;
  const int64_t begin = static_cast<int64_t>(threadIdx.x) * chunk;
  const int64_t end = begin + chunk < V ? begin + chunk : V;
  double s = 0.0;
  for (int64_t v = begin; v < end; ++v) s += static_cast<double>(w(v));
  double total;
  const double excl = block_exclusive_scan(s, &total, sh);
  const float target = f_mul(u, static_cast<float>(total));
  const bool crosses = begin < end && static_cast<float>(excl + s) > target;
  const int64_t first = block_min_i64(crosses ? static_cast<int64_t>(threadIdx.x) : int64_t(kThreads), sh);
  if (threadIdx.x == 0) sh.result = -1;
  __syncthreads();
  if (first < kThreads && threadIdx.x == first) {
    double r = excl;
    int64_t found = -1;
    for (int64_t v = begin; v < V; ++v) {  // normally ends inside this chunk
      r += static_cast<double>(w(v));
      if (static_cast<float>(r) > target) {
        found = v;
        break;
      }
    }
    sh.result = found;
  }
  __syncthreads();
  int64_t result = sh.result;
  if (result < 0) {  // rounding overshoot: the last positive weight
    int64_t last = -1;
    for (int64_t v = threadIdx.x; v < V; v += kThreads)
      if (w(v) > 0.0f) last = v;
    result = block_max_i64(last, sh);
    if (result < 0) result = 0;
  }
  return result;
}

template <typename T>
__global__ void __launch_bounds__(kThreads) verify_position_kernel(csd::VerifyProblem a) {
  __shared__ SharedState sh;
  const int64_t item = blockIdx.x;
  const int64_t b = item / a.L, i = item % a.L;
  const int64_t V = a.prm.vocab;
  const VerifyParams& prm = a.prm;

  Row<T> row;
  row.prm = prm;
  row.c = static_cast<const T*>(a.logits) + b * a.lg_sB + i * a.lg_sL;
  row.u = a.uncond ? static_cast<const T*>(a.uncond) + b * a.un_sB + i * a.un_sL : nullptr;

  const int64_t raw_tok = a.draft_tokens[b * a.dt_sB + i * a.dt_sL];
  const bool bad_token = draft_token_is_bad(raw_tok, V);
  const int64_t token = bad_token ? -1 : raw_tok;
  const bool has_draft = token >= 0;
  const bool shared_seed = a.n_seed == 1;
  const RowKey key = row_key(a.seed[shared_seed ? 0 : b], shared_seed, b);
  const uint32_t pos = absolute_position(a.positions[b], i);
  float u_accept, u_sample;
  step_uniforms(key, pos, a.offset[a.n_offset == 1 ? 0 : b], &u_accept, &u_sample);

  // 1. max and finiteness
  float m = -f_inf();
  bool bad = false;
  for (int64_t v = threadIdx.x; v < V; v += kThreads) {
    const float zv = row.z(v);
    bad |= !f_isfinite(zv);
    m = zv > m ? zv : m;
  }
  m = block_max(m, sh);
  const bool bad_logits = block_any(bad, sh);

  const float* q = a.draft_probs ? a.draft_probs + b * a.q_sB + i * a.q_sL : nullptr;
  const bool q_scalar = q && a.q_sV == 0;
  bool bad_probs = false;
  if (q) {
    bool qbad = false;
    for (int64_t v = threadIdx.x; v < (q_scalar ? 1 : V); v += kThreads) qbad |= !(f_isfinite(q[v]) && q[v] >= 0.0f);
    bad_probs = block_any(qbad, sh);
  }
  const bool q_full = q && !q_scalar && !bad_probs;
  const float q0 = (q_scalar && !bad_probs) ? q[0] : 0.0f;
  uint32_t flags = (has_draft ? kFlagHasDraft : 0u) | (bad_token ? kFlagBadToken : 0u) | (bad_probs ? kFlagBadProbs : 0u);

  if (bad_logits) {
    const float nan = f_nan();
    if (a.probs)
      for (int64_t v = threadIdx.x; v < V; v += kThreads) a.probs[item * V + v] = nan;
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
  if (prm.greedy) {
    int64_t first = V;
    for (int64_t v = threadIdx.x; v < V; v += kThreads)
      if (row.z(v) == m && v < first) first = v;
    row.greedy_token = block_min_i64(first, sh);
  } else {
    if (prm.top_k > 0 && prm.top_k < V) {
      row.thr = block_kth_largest(row, V, prm.top_k, sh);
      row.has_thr = true;
    }
    float zs = 0.0f, es = 0.0f;
    for (int64_t v = threadIdx.x; v < V; v += kThreads) {
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

  // 4. TVD, sum p, distortion (csd, gate decided below), probs output
  const bool one_hot_q = !a.draft_probs && has_draft;
  const float lambda_h = f_mul(prm.entropy_coef, h);
  float sa = 0.0f, sd = 0.0f;
  float* probs_out = a.probs ? a.probs + item * V : nullptr;
  for (int64_t v = threadIdx.x; v < V; v += kThreads) {
    const float pv = row.p(v);
    if (probs_out) probs_out[v] = pv;
    const float qv = q_full ? q[v] : q0;
    const float d = f_sub(pv, qv);
    sa = f_add(sa, fabsf(d));
    if (d < 0.0f) {
      const float gap = f_sub(qv, pv), cap = f_mul(qv, lambda_h);
      const float t = gap < cap ? gap : cap;
      sd = f_add(sd, t > 0.0f ? t : 0.0f);
    }
  }
  double sum_abs = block_sum(sa, sh);
  const double sum_dist = block_sum(sd, sh);

  const float p_x = row.p(has_draft ? token : 0);
  float q_x = 0.0f;
  if (has_draft) q_x = a.draft_probs ? (q_full ? q[token] : q0) : 1.0f;
  if (one_hot_q) sum_abs += static_cast<double>(fabsf(f_sub(p_x, 1.0f))) - static_cast<double>(p_x);
  const float tvd = static_cast<float>(0.5 * sum_abs);  // q = 0 (no draft, no draft_probs): TVD = sum p / 2
  const PositionDecision dec = decide_position(p_x, q_x, h, tvd, has_draft, u_accept, prm);
  if (dec.accepted) flags |= kFlagAccepted;
  float distortion = 0.0f;
  if (has_draft && dec.gate_open)
    distortion = one_hot_q ? distortion_term(p_x, 1.0f, lambda_h) : static_cast<float>(sum_dist);

  // 5. draws
  const Row<T>& r = row;
  auto w_p = [&r](int64_t v) { return r.p(v); };
  const bool need_from_p = !has_draft || prm.next_drafts == kNextIndependent;
  int64_t from_p = need_from_p ? block_inverse_cdf(w_p, V, u_sample, sh) : -1;
  int64_t resampled = from_p;
  if (has_draft) {
    auto w_res = [&r, q, q_full, q0, one_hot_q, token](int64_t v) {
      const float pv = r.p(v);
      if (one_hot_q) return v == token ? 0.0f : pv;
      const float d = f_sub(pv, q_full ? q[v] : q0);
      return d > 0.0f ? d : 0.0f;
    };
    bool positive = false;
    for (int64_t v = threadIdx.x; v < V; v += kThreads) positive |= w_res(v) > 0.0f;
    if (block_any(positive, sh))
      resampled = block_inverse_cdf(w_res, V, u_sample, sh);
    else
      resampled = need_from_p ? from_p : block_inverse_cdf(w_p, V, u_sample, sh);
  }

  // 6. the token drafted for later positions
  int64_t later;
  if (prm.next_drafts == kNextIndependent) {
    later = from_p;
  } else if (prm.next_drafts == kNextMaximal) {
    later = dec.keep_draft ? token : resampled;
  } else if (prm.greedy) {
    later = row.greedy_token;
  } else {
    float best = -f_inf();
    int64_t best_i = V;
    const int64_t groups = (V + 3) / 4;
    for (int64_t g = threadIdx.x; g < groups; g += kThreads) {
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

extern "C" int csd_verify_rows_launch(const csd::VerifyProblem* args, cudaStream_t stream) {
  using namespace csd::cuda;
  const csd::VerifyProblem& a = *args;
  if (a.B == 0) return cudaSuccess;
  if (a.L > 0) {
    const int64_t items = a.B * a.L;
    if (items > 0x7fffffffLL) return cudaErrorInvalidValue;
    const dim3 grid(static_cast<unsigned>(items));
    switch (a.logit_dtype) {
      case csd::kLogitF32:
        verify_position_kernel<float><<<grid, kThreads, 0, stream>>>(a);
        break;
      case csd::kLogitF16:
        verify_position_kernel<csd::f16_bits><<<grid, kThreads, 0, stream>>>(a);
        break;
      case csd::kLogitBF16:
        verify_position_kernel<csd::bf16_bits><<<grid, kThreads, 0, stream>>>(a);
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
