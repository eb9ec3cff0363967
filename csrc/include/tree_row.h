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

#include "decision.h"
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

// One row's walk: its scratch, its streams and its node tokens.
struct TreeWalk {
  int64_t b, out0;  // out0: the row's first output slot
  float *z, *pj, *qj;  // the visited node's z, its p then its residuals, and the residual's q
  RowKey key;
  int64_t offset;
  const int64_t* tokens;  // [S]: the row's node tokens
  GsdScratch gs;
};

template <class X>
CSD_HD TreeWalk tree_walk(const TreeProblem& P, int64_t b, X& ex) {
  const int64_t V = P.prm.vocab;
  TreeWalk w;
  w.b = b;
  w.out0 = b * (P.M + 1);
  w.z = P.workspace + b * 3 * V;
  w.pj = w.z + V;
  w.qj = w.pj + V;
  w.key = seeded_row_key(P.seed, P.n_seed, b);
  w.offset = row_offset(P.offset, P.n_offset, b);
  w.tokens = P.node_tokens + b * P.S;
  w.gs = P.gsd_workspace ? gsd_scratch(P.gsd_workspace, b, V, P.gsd_keys) : GsdScratch{};
  if (ex.leader()) {
    for (int64_t i = 0; i <= P.M; ++i) {
      P.path[w.out0 + i] = i == 0 ? 0 : -1;
      P.tokens[w.out0 + i] = -1;
      P.accept_prob[w.out0 + i] = P.entropy[w.out0 + i] = P.tvd[w.out0 + i] = P.distortion[w.out0 + i] = 0.0f;
    }
  }
  return w;
}

// The law at a visited node (decision.h): its p and its level's q; qa reads gsd's a(y) (gsd only).
CSD_HD auto node_law(const TreeWalk& w, const NodeTarget& n, const float* q, bool gsd) {
  const float* pj = w.pj;
  const float* z = w.z;
  const float* a = w.gs.a;
  return slot_law([pj](int64_t v) { return pj[v]; }, [q](int64_t v) { return q[v]; },
                  [=](int64_t v) { return gsd && n.in_support(z, v) ? f_mul(q[v], a[v]) : 0.0f; },
                  [n, z](int64_t v) { return n.in_support(z, v); });
}

// Lane 0 of the tree stream at `slot`: the uniform that tests the candidate there.
CSD_HD float candidate_uniform(const TreeWalk& w, int64_t slot) {
  return uniform_from_bits(tree_bits(w.key, static_cast<uint32_t>(slot), w.offset).x[0]);
}

// The level i of the walk at node `cur`: its q, its rule (an uninformed main draft, a uniform fresh one, is tested
// strictly, as verify's ``informed``), the TVD reported, and the main draft's decision with its distortion and cap.
struct TreeLevel {
  const float* q;  // the level's q (the last level's below it)
  int rule;
  bool gsd;
  float tvd;  // against q; below the last level against q = 0
  SlotDecision main;
};

template <class X>
CSD_HD TreeLevel decide_level(const TreeProblem& P, const TreeWalk& w, int64_t i, int64_t cur, const NodeTarget& n,
                              X& ex) {
  const VerifyParams& prm = P.prm;
  const int64_t V = prm.vocab, M = P.M;
  const float* pj = w.pj;
  TreeLevel L;
  L.q = P.draft_probs + (w.b * M + (i < M ? i : M - 1)) * V;
  const float* q = L.q;
  const float tvd = static_cast<float>(0.5 * ex.sum(V, [&](int64_t v) {
    const float d = f_sub(pj[v], q[v]);
    return d >= 0.0f ? d : -d;
  }));
  L.rule = i < M && P.informed != nullptr && P.informed[w.b * M + i] == 0 ? int(kRuleStrict) : prm.rule;
  const RuleRow rr = rule_row(L.rule, prm.rule_params, n.h, tvd);
  const int64_t main_child = P.children[cur * P.K];
  const int64_t x = i < M && main_child >= 0 && is_vocab_token(w.tokens[main_child], V) ? w.tokens[main_child] : -1;
  L.gsd = L.rule == kRuleGsd && x >= 0;
  const auto law = node_law(w, n, q, L.gsd);
  if (L.gsd)  // the groups of the node's p and q: the main draft's a(x) and the gsd residual
    gsd_groups(V, static_cast<int64_t>(prm.rule_params[0]), prm.rule_params[1], law.p, law.q, w.gs, ex);
  const float u = x >= 0 ? candidate_uniform(w, main_child) : 1.0f;
  L.main = decide_slot(rr, prm, draft_terms(law, x), u, law, [&] { return w.gs.a[x]; },
                       [&](DistortionCase, auto term) { return ex.sum(V, term); });
  L.tvd = i < M ? tvd : static_cast<float>(0.5 * ex.sum(V, [&](int64_t v) { return pj[v]; }));
  return L;
}

// Recursive rejection sampling over the children of `cur` in rank order (reference.verify_tree): the main draft by
// the level's decision, the siblings strictly. Returns the accepted slot (its a in *chosen_a), or -1 with the last
// residual in pj (p itself when nothing was tested).
template <class X>
CSD_HD int64_t test_children(const TreeProblem& P, const TreeWalk& w, int64_t i, int64_t cur, const NodeTarget& n,
                             const TreeLevel& L, float* chosen_a, X& ex) {
  const int64_t V = P.prm.vocab;
  const auto law = node_law(w, n, L.q, L.gsd);
  const float* qc = L.q;
  const float* rest_main = P.sibling_probs ? P.sibling_probs + (w.b * P.M + i) * V : L.q;
  for (int64_t r = 0; r < P.K; ++r) {
    const int64_t slot = P.children[cur * P.K + r];
    if (slot < 0) continue;
    const int64_t x = w.tokens[slot];
    if (!is_vocab_token(x, V)) continue;  // a missing candidate changes nothing
    const float a = r == 0 ? L.main.d.accept_prob : strict_acceptance(w.pj[x], n.in_support(w.z, x) ? qc[x] : 0.0f);
    if (r == 0 ? L.main.d.accepted : candidate_uniform(w, slot) < a) {
      *chosen_a = a;
      return slot;
    }
    reject_candidate(r == 0 ? L.main.residual_rule(L.rule) : int(kRuleStrict), w.pj, qc, r == 0 ? rest_main : qc, x,
                     V, w.pj, w.qj, law.qa, ex);
    qc = w.qj;
  }
  return -1;
}

// Verify row b of the tree (reference.verify_tree): the walk on the tree stream's uniforms and the stats at the
// visited nodes. Every thread of the row calls this; X::leader() writes the outputs.
template <typename T, class X>
CSD_HD void tree_row(const TreeProblem& P, int64_t b, X& ex) {
  const int64_t M = P.M;
  const TreeWalk w = tree_walk(P, b, ex);
  int32_t status = 0;
  int64_t cur = 0, accept_len = M;
  for (int64_t i = 0; i <= M; ++i) {
    const NodeTarget n = node_target<T>(P, P.logits.row<T>(b, cur), P.uncond.row<T>(b, cur), w.z, w.pj, ex);
    if (n.bad) status |= kStatusBadLogits;
    const TreeLevel L = decide_level(P, w, i, cur, n, ex);
    if (ex.leader()) {
      P.entropy[w.out0 + i] = n.h;
      P.tvd[w.out0 + i] = L.tvd;
      P.distortion[w.out0 + i] = L.main.distortion;
    }
    float chosen_a = 0.0f;
    const int64_t chosen = i < M ? test_children(P, w, i, cur, n, L, &chosen_a, ex) : -1;  // no children below M
    if (chosen < 0) {  // emit a draw from the last residual and stop
      const Philox4 bits = tree_bits(w.key, static_cast<uint32_t>(cur), w.offset);
      const int64_t emitted = ex.inverse_cdf(w.pj, P.prm.vocab, uniform_from_bits(bits.x[1]));
      if (ex.leader()) P.tokens[w.out0 + i] = emitted;
      accept_len = i;
      break;
    }
    if (ex.leader()) {
      P.path[w.out0 + i + 1] = chosen;
      P.tokens[w.out0 + i] = w.tokens[chosen];
      P.accept_prob[w.out0 + i] = chosen_a;
    }
    cur = chosen;
  }
  if (ex.leader()) {
    P.accept_len[b] = accept_len;
    P.status[b] = status;
  }
}

}  // namespace csd
