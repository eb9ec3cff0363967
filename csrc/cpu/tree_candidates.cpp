// CPU kernel of the sibling candidates of a draft tree (reference.tree_candidates on the uniforms of
// reference.tree_gumbel_uniforms): per (row, level), Gumbel-top-(K-1) of log q with the main draft removed, in one pass
// over the vocabulary that keeps the best K-1 keys. The tree stream's Philox runs once per group of 4 tokens, and only
// for groups that hold a token whose key could still enter, the logs only for the tokens whose (q, u) could. Keys are
// log q - log(-log u) in IEEE fp32 (std::log); ties go to the lowest token (the reference's stable sort).
#include "tree_candidates.h"

#include <ATen/Parallel.h>

#include <cmath>
#include <limits>

#include "../include/philox.h"

namespace csd {
namespace {

constexpr int kMaxSiblings = 64;
// Above -log(-log u) for every u of uniform_from_bits (at most 1 - 2^-24: 16.64), with room for rounding.
constexpr float kGumbelBound = 17.0f;

// The best `n` keys seen so far, best first; NaN keys rank above all (the reference sorts them first).
struct TopKeys {
  int capacity, n = 0;
  float key[kMaxSiblings];
  int64_t token[kMaxSiblings];

  static bool beats(float a, float b) { return std::isnan(a) ? !std::isnan(b) : a > b; }
  // Tokens arrive in increasing order, so an equal key never displaces an earlier token.
  void offer(float k, int64_t v) {
    if (n == capacity && !beats(k, key[n - 1])) return;
    int i = n < capacity ? n++ : n - 1;
    for (; i > 0 && beats(k, key[i - 1]); --i) key[i] = key[i - 1], token[i] = token[i - 1];
    key[i] = k;
    token[i] = v;
  }
  float floor() const { return n == capacity ? key[n - 1] : -std::numeric_limits<float>::infinity(); }
};

// Tokens whose key cannot reach the kept keys' floor f: q < exp(f - 17) (the largest noise), and, as -log u >= 1 - u,
// q < (1 - u)·exp(f - 0.01) (log q - log(1 - u) bounds the key; the margin is far above the keys' fp32 rounding).
struct Bounds {
  double q = 0.0, scale = 0.0;
  void update(float floor) {
    q = std::exp(static_cast<double>(floor) - kGumbelBound);
    scale = std::exp(static_cast<double>(floor) - 0.01);
  }
  bool below(float x) const { return static_cast<double>(x) < q; }  // false for NaN bounds and NaN q
  bool below(float x, float u) const { return static_cast<double>(x) < (1.0 - static_cast<double>(u)) * scale; }
};

void candidates_of_level(const float* q, int64_t V, int64_t main, const RowKey& key, uint32_t level, int64_t offset,
                         int siblings, int64_t* out) {
  TopKeys top;
  top.capacity = siblings;
  Bounds bound;
  for (int64_t g = 0; g < V; g += 4) {
    const int64_t end = g + 4 < V ? g + 4 : V;
    bool any = false;
    for (int64_t v = g; v < end; ++v) any |= v != main && !(q[v] <= 0.0f) && !bound.below(q[v]);
    if (!any) continue;
    const Philox4 bits = tree_gumbel_bits(key, level, offset, static_cast<uint32_t>(g >> 2));
    for (int64_t v = g; v < end; ++v) {
      const float x = q[v], u = uniform_from_bits(bits.x[v & 3]);
      // q <= 0 or the main draft: key -inf, never a candidate; a NaN q keeps its NaN key as the reference does
      if (v == main || x <= 0.0f || bound.below(x, u)) continue;
      const float floor = top.floor();
      top.offer(std::log(x) - std::log(-std::log(u)), v);
      if (top.floor() != floor) bound.update(top.floor());
    }
  }
  for (int r = 0; r < siblings; ++r) out[r] = r < top.n && std::isfinite(top.key[r]) ? top.token[r] : -1;
}

}  // namespace

at::Tensor tree_candidates_cpu(const at::Tensor& seed, const at::Tensor& offset, const at::Tensor& main_tokens,
                               const at::Tensor& q, int64_t branching, int64_t first) {
  TORCH_CHECK(q.dim() == 3 && q.scalar_type() == at::kFloat && q.device().is_cpu(),
              "tree_candidates: q must be a [B, P, V] float32 CPU tensor");
  const int64_t B = q.size(0), P = q.size(1), V = q.size(2);
  TORCH_CHECK(main_tokens.sizes() == at::IntArrayRef({B, P}), "tree_candidates: main_tokens must be [B, P]");
  TORCH_CHECK(branching >= 1 && branching - 1 <= kMaxSiblings, "tree_candidates: branching must be in [1, 65]");
  TORCH_CHECK(first >= 0 && first + P <= (int64_t{1} << 32), "tree_candidates: levels must fit in 32 bits");
  const at::Tensor s = seed.to(at::kCPU, at::kLong).reshape(-1).contiguous();
  const at::Tensor off = offset.to(at::kCPU, at::kLong).reshape(-1).contiguous();
  TORCH_CHECK(s.numel() == 1 || s.numel() == B, "tree_candidates: seed must be [1] or [B]");
  TORCH_CHECK(off.numel() == 1 || off.numel() == B, "tree_candidates: offset must be [1] or [B]");
  const at::Tensor main = main_tokens.to(at::kLong).contiguous();
  const at::Tensor qc = q.contiguous();
  at::Tensor out = at::empty({B, P, branching}, main.options());
  const int64_t *ps = s.data_ptr<int64_t>(), *po = off.data_ptr<int64_t>(), *pm = main.data_ptr<int64_t>();
  const float* pq = qc.data_ptr<float>();
  int64_t* pout = out.data_ptr<int64_t>();
  at::parallel_for(0, B * P, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t b = i / P, j = i % P;
      const bool shared = s.numel() == 1;
      const RowKey key = row_key(ps[shared ? 0 : b], shared, b);
      int64_t* o = pout + i * branching;
      o[0] = pm[i];
      if (branching > 1)
        candidates_of_level(pq + i * V, V, pm[i], key, static_cast<uint32_t>(first + j), po[off.numel() == 1 ? 0 : b],
                            static_cast<int>(branching - 1), o + 1);
    }
  });
  return out;
}

}  // namespace csd
