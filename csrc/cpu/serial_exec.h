// The executor of the shared row headers (tree_row.h, gsd_row.h) on one CPU thread: every "block" operation is a
// loop. No torch headers.
#pragma once

#include <stdint.h>

#include <algorithm>
#include <functional>
#include <vector>

#include "../include/ieee.h"

namespace csd {

// The executor of tree_row on one CPU thread: every "block" operation is a loop.
struct SerialExec {
  static constexpr int kLanes = 8;
  static constexpr bool kInOrder = true;  // each(n, f) visits 0 .. n - 1 in order, on one thread
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
  // Stable ascending sort of keys by their high 32 bits (LSD radix, 8 bits a pass; the four digits' counts in one
  // read, a pass whose digit is the same for every key skipped): keys written in token order keep it among equal
  // high words.
  void sort(uint64_t* keys, int64_t n) const {
    static thread_local std::vector<uint64_t> buffer;
    if (static_cast<int64_t>(buffer.size()) < n) buffer.resize(n);
    int64_t count[4][257] = {};
    for (int64_t i = 0; i < n; ++i) {
      const uint32_t high = static_cast<uint32_t>(keys[i] >> 32);
      for (int d = 0; d < 4; ++d) ++count[d][((high >> (8 * d)) & 0xFF) + 1];
    }
    uint64_t* src = keys;
    uint64_t* dst = buffer.data();
    for (int d = 0; d < 4; ++d) {
      const int shift = 32 + 8 * d;
      int64_t* c = count[d];
      if (c[((src[0] >> shift) & 0xFF) + 1] == n) continue;
      for (int b = 0; b < 256; ++b) c[b + 1] += c[b];
      for (int64_t i = 0; i < n; ++i) dst[c[(src[i] >> shift) & 0xFF]++] = src[i];
      std::swap(src, dst);
    }
    if (src != keys) std::copy(src, src + n, keys);
  }
  // out[0] = 0, out[i + 1] = float(fp64 running sum of w[0..i]) (torch.cumsum's order on the CPU).
  void scan(const float* w, int64_t n, float* out) const {
    double run = 0.0;
    out[0] = 0.0f;
    for (int64_t i = 0; i < n; ++i) out[i + 1] = static_cast<float>(run += static_cast<double>(w[i]));
  }
  void barrier() const {}
  bool leader() const { return true; }
};

}  // namespace csd
