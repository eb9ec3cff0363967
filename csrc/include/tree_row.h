// The per-row maths of the fused tree verification (reference.verify_tree), shared by the CPU and CUDA kernels.
//
// One call of tree_row walks one row of a draft tree from the root: p is computed only at the nodes the walk
// visits (one pass over the tree's unique nodes, never per root-to-leaf path), the children of each visited node are
// tested by recursive rejection sampling in rank order, and the residual p_j, q_j live in the row's scratch.
// The vocabulary loops go through an executor X (the "how"): X is a serial loop on the CPU (csrc/cpu/verify_tree.cpp)
// and a thread block on the GPU (csrc/cuda/verify_tree.cu). Every X method is called by every thread of the row and
// returns the same value to all of them, so the walk's control flow is uniform. X provides:
//   each(n, f)            f(v) for this thread's share of [0, n)
//   sum(n, f)             fp64 sum of f(v) over [0, n)            max(n, f)  float max (NaN ignored)
//   any(n, f)             whether f(v) holds for some v          barrier()  scratch writes visible to all threads
//   argmax_first(z, n)    first index of max z                   kth_largest(z, n, k)  k-th largest z (ties counted)
//   inverse_cdf(w, n, u)  reference.inverse_cdf_sample (fp64 prefix sums)   leader()  the thread that writes outputs
//   sort(keys, n), scan(w, n, out)  gsd's groups (gsd_row.h)
// No torch headers.
#pragma once

#include <stdint.h>

#include "gsd_row.h"
#include "philox.h"
#include "rules.h"
#include "verify_row.h"

namespace csd {

// One tree verification call described by raw pointers (the torch glue is csrc/tree_glue.h).
struct TreeProblem {
  int64_t B, S, M, K;    // rows, slots, draft levels (main-chain nodes), branching (children per node)
  VerifyParams prm;      // vocab, CFG, temperature, top-k / top-p / min-p, the rule (coupling unused)
  int logit_dtype;       // LogitDtype
  LogitRows logits;      // [B, S, V]
  LogitRows uncond;      // absent when no CFG; same dtype/shape as logits
  const int64_t* node_tokens;   // [B, S] contiguous; -1 (or anything outside [0, V)): missing candidate
  const float* draft_probs;     // [B, M, V] contiguous: q of each draft level
  const float* sibling_probs;   // [B, M, V] contiguous or nullptr (= draft_probs): the siblings' law
  const int64_t* children;      // [S, K] slots in rank order, -1 none (reference.TreeLayout.children)
  const int64_t* seed;          // [n_seed]: 1 (shared, rows keyed by index) or B (per row)
  int64_t n_seed;
  const int64_t* offset;        // [n_offset]: 1 or B (the row's attempt count)
  int64_t n_offset;
  const uint8_t* informed;      // [B, M] contiguous bool or nullptr (every level informed): false = tested strictly
  float* workspace;             // [B, 3, V] scratch: z, then p_j, q_j of the visited node
  void* gsd_workspace;          // gsd: B blocks of gsd_scratch_bytes(V, gsd_keys), else nullptr
  int64_t gsd_keys;
  int64_t* accept_len;          // [B]
  int64_t *path, *tokens;       // [B, M + 1]
  float *accept_prob, *entropy, *tvd, *distortion;  // [B, M + 1]
  int32_t* status;              // [B]
};

// The target distribution at one node: z (mixed, -inf outside the support) in scratch, p in scratch.
struct NodeTarget {
  float m;          // max z
  float thr;        // top-k / top-p threshold on z (-inf: none)
  float log_min_p;  // min-p bound on z - m (-inf: none)
  int greedy;
  int64_t greedy_token;
  float h;          // H(p) in nats
  bool bad;         // bad logits: z was replaced by zeros (p uniform), as reference.target_distribution

  // In the support of p (reference: finite z after top-k, top-p, min-p; the argmax when greedy).
  CSD_HD bool kept(float zv) const { return zv > -f_inf() && zv >= thr && f_sub(zv, m) >= log_min_p; }
  CSD_HD bool in_support(const float* z, int64_t v) const { return greedy ? v == greedy_token : kept(z[v]); }
};

// Order key of z with ±0 merged (torch compares them equal).
CSD_HD uint32_t order_key_merged(float zv) { return float_order_key(zv == 0.0f ? 0.0f : zv); }

// reference.restrict_top_p on the kept z: the largest order key t whose mass (sum of e over key >= t) reaches
// float32(top_p) times the whole mass; a bisection over the 32-bit keys. e (exp(z - m) where kept, else 0) is in `e`.
template <class X>
CSD_HD float top_p_threshold(const float* z, const float* e, int64_t V, float top_p, X& ex) {
  const float limit = f_mul(top_p, static_cast<float>(ex.sum(V, [&](int64_t v) { return e[v]; })));
  uint64_t lo = 0, hi = 0xFFFFFFFFull;
  while (lo < hi) {
    const uint64_t mid = (lo + hi + 1) / 2;
    const uint32_t t = static_cast<uint32_t>(mid);
    const float mass =
        static_cast<float>(ex.sum(V, [&](int64_t v) { return order_key_merged(z[v]) >= t ? e[v] : 0.0f; }));
    if (mass >= limit)
      lo = mid;
    else
      hi = mid - 1;
  }
  return float_from_order_key(static_cast<uint32_t>(lo));
}

// p at a node (reference.target_distribution): z = CFG mix / temperature with the -inf mask (NaN = bad), a bad row
// replaced by zeros, then top-k, top-p, min-p, softmax (one-hot of the first argmax when greedy). Writes z and p.
template <typename T, class X>
CSD_HD NodeTarget node_target(const TreeProblem& P, const T* c, const T* u, float* z, float* p, X& ex) {
  const VerifyParams& prm = P.prm;
  const int64_t V = prm.vocab;
  NodeTarget n;
  ex.each(V, [&](int64_t v) {
    bool bad;
    const float zv = masked_mix_logit(LogitLoad<T>::load(c, v), u ? LogitLoad<T>::load(u, v) : 0.0f, prm, &bad);
    z[v] = bad ? f_nan() : zv;
  });
  ex.barrier();
  n.m = ex.max(V, [&](int64_t v) { return z[v]; });
  n.bad = !(n.m > -f_inf()) || ex.any(V, [&](int64_t v) { return z[v] != z[v]; });
  if (n.bad) {
    ex.each(V, [&](int64_t v) { z[v] = 0.0f; });
    ex.barrier();
    n.m = 0.0f;
  }
  n.greedy = prm.greedy;
  n.thr = -f_inf();
  n.log_min_p = -f_inf();
  n.greedy_token = 0;
  if (prm.greedy) {  // the restrictions always keep the argmax
    n.greedy_token = ex.argmax_first(z, V);
    ex.each(V, [&](int64_t v) { p[v] = v == n.greedy_token ? 1.0f : 0.0f; });
    ex.barrier();
    n.h = 0.0f;
    return n;
  }
  if (prm.top_k > 0 && prm.top_k < V) n.thr = ex.kth_largest(z, V, prm.top_k);
  if (prm.top_p < 1.0f) {
    const NodeTarget k = n;
    ex.each(V, [&](int64_t v) { p[v] = k.kept(z[v]) ? expf(f_sub(z[v], k.m)) : 0.0f; });
    ex.barrier();
    const float t = top_p_threshold(z, p, V, prm.top_p, ex);
    n.thr = t > n.thr ? t : n.thr;
  }
  n.log_min_p = prm.log_min_p;
  const NodeTarget k = n;
  ex.each(V, [&](int64_t v) { p[v] = k.kept(z[v]) ? expf(f_sub(z[v], k.m)) : 0.0f; });
  ex.barrier();
  const double zsum = ex.sum(V, [&](int64_t v) { return p[v]; });
  const double ezsum =
      ex.sum(V, [&](int64_t v) { return p[v] > 0.0f ? static_cast<double>(p[v]) * (z[v] - k.m) : 0.0; });
  n.h = entropy_from_sums(zsum, ezsum);
  const float scale = 1.0f / static_cast<float>(zsum);
  ex.each(V, [&](int64_t v) { p[v] = f_mul(p[v], scale); });
  ex.barrier();
  return n;
}

// One rejected candidate x of recursive rejection sampling (reference.rrs_step): p <- norm(w) with w(v) = the
// resampling weight (rules.h's rule_residual: max(p - q, 0), gsd's max(p - q*a, 0) with qa(v) = q(v)*a(v); p when w
// is all zero), q <- `rest` without x, renormalised (zero when nothing is left). Writes p_out and q_out.
template <class X, class QA>
CSD_HD void reject_candidate(int rule, const float* p, const float* q, const float* rest, int64_t x, int64_t V,
                             float* p_out, float* q_out, QA qa, X& ex) {
  const float mass = static_cast<float>(ex.sum(V, [&](int64_t v) { return rule_residual(rule, p[v], q[v], qa(v)); }));
  const float left = static_cast<float>(ex.sum(V, [&](int64_t v) { return v == x ? 0.0f : rest[v]; }));
  ex.barrier();  // p or q may be p_out / q_out: every thread has read them
  ex.each(V, [&](int64_t v) {
    const float w = rule_residual(rule, p[v], q[v], qa(v));
    const float r = v == x ? 0.0f : rest[v];
    p_out[v] = mass > 0.0f ? f_div(w, mass) : p[v];
    q_out[v] = left > 0.0f ? f_div(r, left) : 0.0f;
  });
  ex.barrier();
}

// Verify row b of the tree (reference.verify_tree): the walk on the tree stream's uniforms and the stats at the
// visited nodes. Every thread of the row calls this; X::leader() writes the outputs.
template <typename T, class X>
CSD_HD void tree_row(const TreeProblem& P, int64_t b, X& ex) {
  const VerifyParams& prm = P.prm;
  const int64_t V = prm.vocab, M = P.M, S = P.S, K = P.K;
  float* z = P.workspace + b * 3 * V;
  float* pj = z + V;  // the visited node's p, then its residuals
  float* qj = pj + V;
  const bool shared_seed = P.n_seed == 1;
  const RowKey key = row_key(P.seed[shared_seed ? 0 : b], shared_seed, b);
  const int64_t offset = P.offset[P.n_offset == 1 ? 0 : b];
  const int64_t* tokens_in = P.node_tokens + b * S;
  const int64_t out0 = b * (M + 1);
  if (ex.leader()) {
    for (int64_t i = 0; i <= M; ++i) {
      P.path[out0 + i] = i == 0 ? 0 : -1;
      P.tokens[out0 + i] = -1;
      P.accept_prob[out0 + i] = P.entropy[out0 + i] = P.tvd[out0 + i] = P.distortion[out0 + i] = 0.0f;
    }
  }
  int32_t status = 0;
  int64_t cur = 0, accept_len = M;
  const GsdScratch gs = P.gsd_workspace ? gsd_scratch(P.gsd_workspace, b, V, P.gsd_keys) : GsdScratch{};
  for (int64_t i = 0; i <= M; ++i) {
    const T* c = P.logits.row<T>(b, cur);
    const T* u = P.uncond.row<T>(b, cur);
    const NodeTarget n = node_target<T>(P, c, u, z, pj, ex);
    if (n.bad) status |= kStatusBadLogits;

    // stats at the node: H, TVD against this level's q (q = 0 below the last level), the rule's distortion
    const int64_t level = i < M ? i : M - 1;
    const float* q = P.draft_probs + (b * M + level) * V;
    const float tvd = static_cast<float>(0.5 * ex.sum(V, [&](int64_t v) {
      const float d = f_sub(pj[v], q[v]);
      return d >= 0.0f ? d : -d;
    }));
    // an uninformed main draft (a uniform fresh one) is tested strictly, as verify's ``informed``
    const int rule = i < M && P.informed != nullptr && P.informed[b * M + i] == 0 ? int(kRuleStrict) : prm.rule;
    const RuleRow rr = rule_row(rule, prm.rule_params, n.h, tvd);
    const int64_t main_child = P.children[cur * K];
    const bool has_draft = main_child >= 0 && tokens_in[main_child] >= 0 && tokens_in[main_child] < V;
    const bool gsd = rule == kRuleGsd && i < M && has_draft;
    if (gsd)  // the groups of the node's p and q: the main draft's a(x) and the gsd residual
      gsd_groups(V, static_cast<int64_t>(prm.rule_params[0]), prm.rule_params[1], [&](int64_t v) { return pj[v]; },
                 [&](int64_t v) { return q[v]; }, gs, ex);
    auto qa = [&](int64_t v) { return gsd && n.in_support(z, v) ? f_mul(q[v], gs.a[v]) : 0.0f; };
    float distortion = 0.0f;
    if (i < M && has_draft && !rule_lossless(rule)) {
      if (rule_gathers_distortion(rule) && !prm.gather_distortion) {
        distortion = f_nan();  // a(y) for every y (lantern: k gathers each; gsd: the sorted row): when asked
      } else if (rule_is_lantern(rule)) {
        distortion = static_cast<float>(ex.sum(V, [&](int64_t v) {
          return n.in_support(z, v) ? lantern_distortion_term(rr, prm.neighbours + v * prm.nb_stride, prm.nb_k, V,
                                                               pj[v], q[v], [&](int64_t t) { return pj[t]; })
                                    : 0.0f;
        }));
      } else if (gsd) {
        distortion = static_cast<float>(ex.sum(V, [&](int64_t v) {
          const float t = f_sub(qa(v), pj[v]);
          return t > 0.0f ? t : 0.0f;
        }));
      } else if (rule != kRuleCsd || rr.gate) {
        distortion = static_cast<float>(ex.sum(V, [&](int64_t v) {
          return rule_distortion_term(rr, pj[v], q[v], n.in_support(z, v));
        }));
      }
    }
    const float tvd_out = i < M ? tvd : static_cast<float>(0.5 * ex.sum(V, [&](int64_t v) { return pj[v]; }));
    if (ex.leader()) {
      P.entropy[out0 + i] = n.h;
      P.tvd[out0 + i] = tvd_out;
      P.distortion[out0 + i] = distortion;
    }

    // recursive rejection sampling over the children in rank order (none below the last level)
    const float* qc = q;
    const float* rest_main = P.sibling_probs ? P.sibling_probs + (b * M + level) * V : q;
    int64_t chosen = -1;
    float chosen_a = 0.0f;
    for (int64_t r = 0; r < K && i < M; ++r) {
      const int64_t slot = P.children[cur * K + r];
      if (slot < 0) continue;
      const int64_t x = tokens_in[slot];
      if (x < 0 || x >= V) continue;  // a missing candidate changes nothing
      const float p_x = pj[x], q_x = n.in_support(z, x) ? qc[x] : 0.0f;
      float a = strict_acceptance(p_x, q_x);
      if (r == 0) {  // the main draft by the rule (e.g. csd: + lambda*H where TVD < tau), siblings strict
        float extra = gsd ? gs.a[x] : 0.0f;
        if (rule_is_lantern(rule) && q_x > 0.0f)
          extra = lantern_bonus(prm.neighbours + x * prm.nb_stride, prm.nb_k, V, lantern_limit(rr, p_x), f_inf(),
                                [&](int64_t t) { return pj[t]; });
        a = rule_acceptance(rr, p_x, q_x, extra);
      }
      const Philox4 bits = tree_bits(key, static_cast<uint32_t>(slot), offset);
      if (uniform_from_bits(bits.x[0]) < a) {
        chosen = slot;
        chosen_a = a;
        break;
      }
      reject_candidate(r == 0 ? rule : kRuleStrict, pj, qc, r == 0 ? rest_main : qc, x, V, pj, qj, qa, ex);
      qc = qj;
    }
    if (chosen < 0) {  // emit a draw from the last residual (from p when nothing was tested) and stop
      const Philox4 bits = tree_bits(key, static_cast<uint32_t>(cur), offset);
      const int64_t emitted = ex.inverse_cdf(pj, V, uniform_from_bits(bits.x[1]));
      if (ex.leader()) P.tokens[out0 + i] = emitted;
      accept_len = i;
      break;
    }
    if (ex.leader()) {
      P.path[out0 + i + 1] = chosen;
      P.tokens[out0 + i] = tokens_in[chosen];
      P.accept_prob[out0 + i] = chosen_a;
    }
    cur = chosen;
  }
  if (ex.leader()) {
    P.accept_len[b] = accept_len;
    P.status[b] = status;
  }
}

}  // namespace csd
