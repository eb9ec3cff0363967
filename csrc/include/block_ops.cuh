// Block-wide building blocks of the CUDA verification kernels (device code, no torch headers): reductions that
// return the same value in every thread, an exclusive scan, the logit row accessor, and the inverse-CDF search.
// Templated on the block's warp count W (the per-position kernel runs 16 warps, the split kernels 4).
#pragma once

#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "verify_row.h"

namespace csd {
namespace cuda {

constexpr unsigned kFull = 0xffffffffu;
// The block of the kernels that give one row or position a whole block (verify.cu's chain, verify_tree.cu's tree).
constexpr int kRowThreads = 512;
constexpr int kRowWarps = kRowThreads / 32;

template <int W>
struct BlockShared {
  double d[W];
  float f[W];
  int64_t i64[W];
  unsigned hist[256];
  int64_t result;
  double carry;
  float target;
  unsigned digit;
  int remaining;
  int flag;
};

__device__ __forceinline__ double warp_sum(double v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFull, v, o);
  return v;
}

// Sum over the block, same value (and same order of operations) in every thread.
template <int W>
__device__ double block_sum(double v, BlockShared<W>& sh) {
  v = warp_sum(v);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) sh.d[threadIdx.x >> 5] = v;
  __syncthreads();
  double s = 0.0;
#pragma unroll
  for (int w = 0; w < W; ++w) s += sh.d[w];
  return s;
}

// Reduction over the block by ``pick`` (a, b) -> the one kept, in the same order in every thread: within each warp,
// then over the W warp results in ``slots`` (shared memory).
template <int W, typename T, class Pick>
__device__ T block_reduce(T v, T* slots, Pick pick) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = pick(v, __shfl_xor_sync(kFull, v, o));
  __syncthreads();
  if ((threadIdx.x & 31) == 0) slots[threadIdx.x >> 5] = v;
  __syncthreads();
  T r = slots[0];
#pragma unroll
  for (int w = 1; w < W; ++w) r = pick(r, slots[w]);
  return r;
}

template <int W>
__device__ float block_max(float v, BlockShared<W>& sh) {
  return block_reduce<W>(v, sh.f, [](float a, float b) { return b > a ? b : a; });
}

template <int W>
__device__ int64_t block_min_i64(int64_t v, BlockShared<W>& sh) {
  return block_reduce<W>(v, sh.i64, [](int64_t a, int64_t b) { return b < a ? b : a; });
}

template <int W>
__device__ int64_t block_max_i64(int64_t v, BlockShared<W>& sh) {
  return -block_min_i64(-v, sh);
}

template <int W>
__device__ bool block_any(bool v, BlockShared<W>& sh) {
  return block_max_i64(v ? 1 : 0, sh) != 0;
}

// Argmax of (value, index) pairs, lowest index on ties; -inf values lose to everything. *best gets the value.
template <int W>
__device__ int64_t block_argmax(float val, int64_t idx, BlockShared<W>& sh, float* best = nullptr) {
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
  for (int w = 1; w < W; ++w)
    if (sh.f[w] > bv || (sh.f[w] == bv && sh.i64[w] < bi)) bv = sh.f[w], bi = sh.i64[w];
  if (best) *best = bv;
  return bi;
}

// Exclusive prefix over the block (thread order) of per-thread fp64 values; *total gets the sum.
template <int W>
__device__ double block_exclusive_scan(double v, double* total, BlockShared<W>& sh) {
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
  for (int w = 0; w < W; ++w) {
    if (w < warp) before += sh.d[w];
    all += sh.d[w];
  }
  *total = all;
  return before + inc - v;
}

// Exact k-th largest of load(v), v < n (ties counted): radix select over order-preserving keys, 8 bits at a time.
template <int W, class Load>
__device__ float block_kth_largest(Load load, int64_t n, int64_t k, BlockShared<W>& sh) {
  uint32_t prefix = 0, mask = 0;
  if (threadIdx.x == 0) sh.remaining = static_cast<int>(k);
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int d = threadIdx.x; d < 256; d += W * 32) sh.hist[d] = 0;
    __syncthreads();
    for (int64_t v = threadIdx.x; v < n; v += W * 32) {
      const uint32_t key = float_order_key(load(v));
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

// Everything one (row, position) needs to recompute z_v and p_v.
template <typename T>
struct Row {
  const T* c;
  const T* u;
  VerifyParams prm;
  float m = 0.0f, thr = 0.0f, scale = 1.0f;
  int64_t greedy_token = 0;
  bool has_thr = false;

  // Target probabilities (prm.probs_input, float32 only): w_v.
  __device__ float w(int64_t v) const { return reinterpret_cast<const float*>(c)[v]; }
  // z_v: the masked mix (reference.mixed_logits), or ln w for target probabilities; *bad for bad input.
  __device__ float z_checked(int64_t v, bool* bad) const {
    if (prm.probs_input) {
      const float wv = w(v);
      *bad = !(wv >= 0.0f && wv < f_inf());
      return wv > 0.0f ? logf(wv) : -f_inf();
    }
    const float cv = LogitLoad<T>::load(c, v);
    const float uv = u ? LogitLoad<T>::load(u, v) : 0.0f;
    return masked_mix_logit(cv, uv, prm, bad);
  }
  __device__ float z(int64_t v) const {
    bool bad;
    return z_checked(v, &bad);
  }
  // In the support of p: finite z above the top-k / top-p / min-p threshold.
  __device__ bool kept(float zv) const { return (!has_thr || zv >= thr) && zv > -f_inf(); }
  __device__ bool in_support(int64_t v) const { return prm.greedy ? v == greedy_token : kept(z(v)); }
  // exp(z - max) where kept (w for target probabilities), else 0
  __device__ float e(int64_t v) const {
    if (prm.probs_input) {
      const float wv = w(v);
      return wv > 0.0f ? wv : 0.0f;
    }
    const float zv = z(v);
    return kept(zv) ? expf(f_sub(zv, m)) : 0.0f;
  }
  __device__ float p(int64_t v) const {
    if (prm.greedy) return v == greedy_token ? 1.0f : 0.0f;
    return f_mul(e(v), scale);
  }
};

template <typename T>
__device__ Row<T> make_row(const VerifyProblem& a, int64_t b, int64_t i) {
  Row<T> row;
  row.prm = a.prm;
  row.c = a.logits.row<T>(b, i);
  row.u = a.uncond.row<T>(b, i);
  return row;
}

// Sums of w over per-thread contiguous chunks of [v0, v1) in fp64 (as torch.cumsum on the CPU): the thread's chunk,
// its sum and the exclusive prefix before it; *total gets the block's sum.
struct Chunk {
  int64_t begin, end;
  double sum, before;
};

template <int W, typename Wt>
__device__ Chunk chunk_prefix(Wt w, int64_t v0, int64_t v1, double* total, BlockShared<W>& sh) {
  const int64_t per = (v1 - v0 + W * 32 - 1) / (W * 32);
  Chunk c;
  c.begin = v0 + static_cast<int64_t>(threadIdx.x) * per;
  c.end = c.begin + per < v1 ? c.begin + per : v1;
  c.sum = 0.0;
  for (int64_t v = c.begin; v < c.end; ++v) c.sum += static_cast<double>(w(v));
  c.before = block_exclusive_scan(c.sum, total, sh);
  return c;
}

// First v in [v0, v1) with float(carry + fp64 prefix) > target, -1 if none; the same value in every thread.
template <int W, typename Wt>
__device__ int64_t chunk_search(Wt w, const Chunk& c, int64_t v1, double carry, float target, BlockShared<W>& sh) {
  const bool crosses = c.begin < c.end && static_cast<float>(carry + c.before + c.sum) > target;
  const int64_t first = block_min_i64(crosses ? static_cast<int64_t>(threadIdx.x) : int64_t(W * 32), sh);
  if (threadIdx.x == 0) sh.result = -1;
  __syncthreads();
  if (first < W * 32 && threadIdx.x == first) {
    double r = carry + c.before;
    int64_t found = -1;
    for (int64_t v = c.begin; v < v1; ++v) {  // normally ends inside this chunk
      r += static_cast<double>(w(v));
      if (static_cast<float>(r) > target) {
        found = v;
        break;
      }
    }
    sh.result = found;
  }
  __syncthreads();
  return sh.result;
}

// The last v in [v0, v1) with w(v) > 0, -1 if none.
template <int W, typename Wt>
__device__ int64_t last_positive(Wt w, int64_t v0, int64_t v1, BlockShared<W>& sh) {
  int64_t last = -1;
  for (int64_t v = v0 + threadIdx.x; v < v1; v += W * 32)
    if (w(v) > 0.0f) last = v;
  return block_max_i64(last, sh);
}

// Inverse-CDF draw over weights w(v) >= 0: first v with float(fp64 prefix) > u * float(total), else the last v with
// w(v) > 0 (rounding overshoot). The same value is returned to every thread.
template <int W, typename Wt>
__device__ int64_t block_inverse_cdf(Wt w, int64_t V, float u, BlockShared<W>& sh) {
  double total;
  const Chunk c = chunk_prefix(w, 0, V, &total, sh);
  const float target = f_mul(u, static_cast<float>(total));
  int64_t result = chunk_search(w, c, V, 0.0, target, sh);
  if (result < 0) result = last_positive(w, 0, V, sh);
  return result < 0 ? 0 : result;
}

// Ascending bitonic sort of keys[0, n2) (n2 a power of two) in global memory, by the whole block.
template <int W>
__device__ void block_bitonic_sort(uint64_t* keys, int64_t n2) {
  for (int64_t size = 2; size <= n2; size <<= 1)
    for (int64_t stride = size >> 1; stride > 0; stride >>= 1) {
      for (int64_t i = threadIdx.x; i < n2 / 2; i += W * 32) {
        const int64_t lo = 2 * stride * (i / stride) + i % stride, hi = lo + stride;
        const uint64_t a = keys[lo], b = keys[hi];
        if ((a > b) == ((lo & size) == 0)) {
          keys[lo] = b;
          keys[hi] = a;
        }
      }
      __syncthreads();
    }
}

CSD_HD int64_t next_pow2(int64_t n) {
  int64_t p = 1;
  while (p < n) p *= 2;
  return p;
}

// The executor of the shared row headers (tree_row.h, gsd_row.h) on one thread block: every method is called by
// every thread and returns the same value to all of them.
template <int W>
struct BlockExec {
  static constexpr bool kInOrder = false;  // each(n, f) spreads 0 .. n - 1 over the block's threads
  BlockShared<W>& sh;
  static constexpr int kThreads = W * 32;

  template <class F>
  __device__ void each(int64_t n, F f) const {
    for (int64_t v = threadIdx.x; v < n; v += kThreads) f(v);
  }
  template <class F>
  __device__ double sum(int64_t n, F f) const {
    double s = 0.0;
    for (int64_t v = threadIdx.x; v < n; v += kThreads) s += static_cast<double>(f(v));
    return block_sum(s, sh);
  }
  template <class F>
  __device__ float max(int64_t n, F f) const {
    float m = -f_inf();
    for (int64_t v = threadIdx.x; v < n; v += kThreads) {
      const float x = f(v);
      m = x > m ? x : m;
    }
    return block_max(m, sh);
  }
  template <class F>
  __device__ bool any(int64_t n, F f) const {
    bool hit = false;
    for (int64_t v = threadIdx.x; v < n; v += kThreads) hit |= static_cast<bool>(f(v));
    return block_any(hit, sh);
  }
  __device__ int64_t argmax_first(const float* z, int64_t n) const {
    float best = -f_inf();
    int64_t idx = n;
    for (int64_t v = threadIdx.x; v < n; v += kThreads)
      if (idx == n || z[v] > best) best = z[v], idx = v;
    const int64_t found = block_argmax(best, idx, sh);
    return found < n ? found : 0;
  }
  __device__ float kth_largest(const float* z, int64_t n, int64_t k) const {
    return block_kth_largest([z](int64_t v) { return z[v]; }, n, k, sh);
  }
  __device__ int64_t inverse_cdf(const float* w, int64_t n, float u) const {
    return block_inverse_cdf([w](int64_t v) { return w[v]; }, n, u, sh);
  }
  // keys[0, n) sorted ascending; keys has room for next_pow2(n) (padded here with the largest key).
  __device__ void sort(uint64_t* keys, int64_t n) const {
    const int64_t n2 = next_pow2(n);
    for (int64_t v = n + threadIdx.x; v < n2; v += kThreads) keys[v] = ~uint64_t(0);
    __syncthreads();
    block_bitonic_sort<W>(keys, n2);
  }
  // out[0] = 0, out[i + 1] = float(fp64 sum of w[0..i]) (per-thread chunks after a block scan of their sums).
  __device__ void scan(const float* w, int64_t n, float* out) const {
    double total;
    const Chunk c = chunk_prefix([w](int64_t v) { return w[v]; }, 0, n, &total, sh);
    double run = c.before;
    for (int64_t v = c.begin; v < c.end; ++v) out[v + 1] = static_cast<float>(run += static_cast<double>(w[v]));
    if (threadIdx.x == 0) out[0] = 0.0f;
    __syncthreads();
  }
  __device__ void barrier() const { __syncthreads(); }
  __device__ bool leader() const { return threadIdx.x == 0; }
};

}  // namespace cuda
}  // namespace csd
