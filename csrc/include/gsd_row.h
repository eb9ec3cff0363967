// gsd's group acceptance a(y) for every token of one position (reference.rules.group_acceptance), shared by the CPU
// and CUDA kernels (chain and tree). The loops go through an executor X, as in tree_row.h: a serial loop on the CPU,
// a thread block on the GPU. X provides each(n, f), barrier(), sort(keys, n) (uint64 ascending) and
// scan(w, n, out) (out[0] = 0, out[i + 1] = float(fp64 sum of w[0..i]), as torch.cumsum on the CPU).
//
// Ranks: p sorted descending, ties by token id (a key (~order_key(p) << 32 | id) sorted ascending). The group of the
// token at rank r is the ranks [max(r - k, lo), min(r + k, hi)] (always holding r), lo = the first rank whose
// p <= fl(p_r + delta), hi = the last rank whose p >= fl(p_r - delta); its sums are differences of the rounded
// prefix sums. No torch headers.
#pragma once

#include <stdint.h>

#include "ieee.h"

namespace csd {

// The scratch of one position: keys [V] (a power of two >= V on the GPU, see gsd_scratch_floats), the sorted p and
// q [V], their prefix sums [V + 1] and a(y) by token [V].
struct GsdScratch {
  uint64_t* keys;
  float *ps, *qs, *cum_p, *cum_q, *a;
};

// Bytes of one position's scratch (keys_len >= V keys, then 5V + 2 floats), 8-byte aligned.
CSD_HD int64_t gsd_scratch_bytes(int64_t V, int64_t keys_len) { return 8 * keys_len + ((4 * (5 * V + 2) + 7) / 8) * 8; }

// The scratch of position `item` in a workspace of such blocks.
CSD_HD GsdScratch gsd_scratch(void* base, int64_t item, int64_t V, int64_t keys_len) {
  char* block = static_cast<char*>(base) + item * gsd_scratch_bytes(V, keys_len);
  float* f = reinterpret_cast<float*>(block + 8 * keys_len);
  return GsdScratch{reinterpret_cast<uint64_t*>(block), f, f + V, f + 2 * V, f + 3 * V + 1, f + 4 * V + 2};
}

// The rank key of token v with probability p (ascending = p descending, ties by token id), and p back from it.
CSD_HD uint64_t gsd_rank_key(float p, int64_t v) {
  return (static_cast<uint64_t>(~float_order_key(p)) << 32) | static_cast<uint64_t>(v);
}
CSD_HD int64_t gsd_key_token(uint64_t key) { return static_cast<int64_t>(key & 0xFFFFFFFFull); }
CSD_HD float gsd_key_p(uint64_t key) { return float_from_order_key(~static_cast<uint32_t>(key >> 32)); }

// Number of ranks i with ps[i] > t (ps descending).
CSD_HD int64_t count_above(const float* ps, int64_t n, float t) {
  int64_t lo = 0, hi = n;
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    if (ps[mid] > t)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

// Number of ranks i with ps[i] >= t (ps descending).
CSD_HD int64_t count_at_least(const float* ps, int64_t n, float t) {
  int64_t lo = 0, hi = n;
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    if (ps[mid] >= t)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

// The group of rank r: the ranks [low, high] within k of r and inside its delta-window [lo_p, hi_p], clamped to the
// row and always holding r.
struct GsdGroup {
  int64_t low, high;
};
CSD_HD GsdGroup gsd_group(int64_t V, int64_t k, int64_t r, int64_t lo_p, int64_t hi_p) {
  int64_t low = r - k > lo_p ? r - k : lo_p;
  int64_t high = r + k < hi_p ? r + k : hi_p;
  low = low < 0 ? 0 : (low > V - 1 ? V - 1 : low);
  high = high < 0 ? 0 : (high > V - 1 ? V - 1 : high);
  return GsdGroup{low < r ? low : r, high > r ? high : r};
}

// a = min(1, sum p / sum q) of a group from the float prefix sums at its ends (0 when the group has no q mass).
CSD_HD float gsd_ratio(float cp_low, float cp_high, float cq_low, float cq_high) {
  float sum_p = f_sub(cp_high, cp_low);
  float sum_q = f_sub(cq_high, cq_low);
  sum_p = sum_p > 0.0f ? sum_p : 0.0f;
  sum_q = sum_q > 0.0f ? sum_q : 0.0f;
  const float ratio = sum_q > 0.0f ? f_div(sum_p, sum_q) : 0.0f;
  return ratio > 1.0f ? 1.0f : ratio;
}

// s.a[token at rank r]: gsd_ratio over gsd_group(r) from the sorted row's prefix sums.
CSD_HD void gsd_group_ratio(const GsdScratch& s, int64_t V, int64_t k, int64_t r, int64_t lo_p, int64_t hi_p) {
  const GsdGroup g = gsd_group(V, k, r, lo_p, hi_p);
  s.a[gsd_key_token(s.keys[r])] =
      gsd_ratio(s.cum_p[g.low], s.cum_p[g.high + 1], s.cum_q[g.low], s.cum_q[g.high + 1]);
}

// s.a[y] = min(1, sum_G(y) p / sum_G(y) q) (0 when the group has no q mass) for every token y; p_at(v), q_at(v):
// p and q at token v. Every thread of X calls this; s.a is complete after it returns. An executor that visits the
// ranks in order (X::kInOrder, the CPU's) finds each delta-window by two pointers: as r grows p_r falls, so both
// bounds only move forward (O(V), where a search per rank costs O(V log V) in unpredictable branches).
template <class X, class P, class Q>
CSD_HD void gsd_groups(int64_t V, int64_t k, float delta, P p_at, Q q_at, const GsdScratch& s, X& ex) {
  ex.each(V, [&](int64_t v) {
    s.keys[v] = gsd_rank_key(p_at(v), v);
  });
  ex.barrier();
  ex.sort(s.keys, V);
  ex.each(V, [&](int64_t r) {
    const int64_t v = gsd_key_token(s.keys[r]);
    s.ps[r] = p_at(v);
    s.qs[r] = q_at(v);
  });
  ex.barrier();
  ex.scan(s.ps, V, s.cum_p);
  ex.scan(s.qs, V, s.cum_q);
  ex.barrier();
  if constexpr (X::kInOrder) {
    int64_t above = 0, at_least = 0;  // count_above / count_at_least of rank r's bounds
    for (int64_t r = 0; r < V; ++r) {
      const float up = f_add(s.ps[r], delta), down = f_sub(s.ps[r], delta);
      while (above < V && s.ps[above] > up) ++above;
      while (at_least < V && s.ps[at_least] >= down) ++at_least;
      gsd_group_ratio(s, V, k, r, above, at_least - 1);
    }
  } else {
    ex.each(V, [&](int64_t r) {
      const float pr = s.ps[r];
      gsd_group_ratio(s, V, k, r, count_above(s.ps, V, f_add(pr, delta)),
                      count_at_least(s.ps, V, f_sub(pr, delta)) - 1);
    });
  }
  ex.barrier();
}


}  // namespace csd
