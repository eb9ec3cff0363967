// The acceptance rules, shared by the CPU and CUDA kernels (chain and tree): one acceptance function, one residual
// function and the per-token distortion terms, for every rule.
//
// csd_kernels/config/acceptance.py is the table (names, codes, parameters in order); csd_kernels/reference/rules.py
// is the definition. The enum's order is the table's (tests/test_rules.py compares them through _C.rule_table()).
// A rule's parameters arrive as rule_params[] in the table's order, as fp32. gsd's groups need the whole sorted row:
// gsd_row.h. No torch headers.
#pragma once

#include <stdint.h>

#include "ieee.h"

namespace csd {

enum Rule : int {
  kRuleStrict = 0,
  kRuleCsd = 1,          // params: entropy_coef (lambda), tvd_threshold (tau)
  kRuleGsd = 2,          // params: group_rank (k), group_delta (delta)
  kRuleArsample = 3,     // params: arsample_scale (c), arsample_offset (s0)
  kRuleLantern = 4,      // params: lantern_delta (delta), lantern_k (the neighbour table's width)
  kRuleLanternPlus = 5,  // "lantern++"; params: lantern_lambda (lambda), lantern_k
  kRuleCount = 6
};
constexpr int kMaxRuleParams = 4;

// The enum as the extension reports it, with the facts the kernels switch on (tests/test_rules.py holds every field
// to config/acceptance.py): lossless (distortion 0), residual_qa (the resampling law is max(p - q*a, 0) over every
// a(y)), gathers (the exact distortion needs a(y) for every y at a cost beyond a pass: NaN unless
// gather_distortion).
struct RuleInfo {
  Rule code;
  const char* name;
  int params;
  bool lossless, residual_qa, gathers;
};
constexpr RuleInfo kRuleInfo[kRuleCount] = {
    {kRuleStrict, "strict", 0, true, false, false},     {kRuleCsd, "csd", 2, false, false, false},
    {kRuleGsd, "gsd", 2, false, true, true},            {kRuleArsample, "arsample", 2, false, false, false},
    {kRuleLantern, "lantern", 2, false, false, true},   {kRuleLanternPlus, "lantern++", 2, false, false, true}};
constexpr bool rule_info_in_code_order(int i = 0) {
  return i == kRuleCount || (kRuleInfo[i].code == i && rule_info_in_code_order(i + 1));
}
static_assert(rule_info_in_code_order(), "kRuleInfo must list the rules by code");

// The facts as comparisons (device code cannot index a host constexpr array), held to kRuleInfo at compile time.
CSD_HD constexpr bool rule_lossless(int rule) { return rule == kRuleStrict; }
// gsd resamples from max(p - q*a, 0) over its a(y) for every y; every other rule's a(y) >= min(1, p/q), so its
// law max(p - q*a, 0) is max(p - q, 0).
CSD_HD constexpr bool rule_residual_qa(int rule) { return rule == kRuleGsd; }
CSD_HD constexpr bool rule_is_lantern(int rule) { return rule == kRuleLantern || rule == kRuleLanternPlus; }
CSD_HD constexpr bool rule_gathers_distortion(int rule) { return rule == kRuleGsd || rule_is_lantern(rule); }
constexpr bool rule_facts_are_the_info(int i = 0) {
  return i == kRuleCount ||
         (rule_lossless(i) == kRuleInfo[i].lossless && rule_residual_qa(i) == kRuleInfo[i].residual_qa &&
          rule_gathers_distortion(i) == kRuleInfo[i].gathers && rule_facts_are_the_info(i + 1));
}
static_assert(rule_facts_are_the_info(), "the rule predicates must say what kRuleInfo says");

// The row scalars a rule reads at one position, formed once.
struct RuleRow {
  int rule;
  float p0, p1;  // the first two parameters
  float h;       // H(p)
  float lambda_h;  // csd: lambda * H
  bool gate;     // csd: TVD < tau (the bonus applies)
  float s;       // arsample: clamp(H / c + s0, 0, 1)
};

CSD_HD RuleRow rule_row(int rule, const float* params, float h, float tvd) {
  RuleRow r;
  r.rule = rule;
  r.p0 = params[0];
  r.p1 = params[1];
  r.h = h;
  r.lambda_h = f_mul(r.p0, h);
  r.gate = rule == kRuleCsd && tvd < r.p1;
  float s = f_add(f_div(h, r.p0), r.p1);
  r.s = s < 0.0f ? 0.0f : (s > 1.0f ? 1.0f : s);
  return r;
}

CSD_HD float min1(float x) { return x > 1.0f ? 1.0f : x; }

// min(1, p(x)/q(x)); 0 where q(x) = 0 (callers pass q(x) = 0 for no draft or a draft outside the support of p).
CSD_HD float strict_acceptance(float p_x, float q_x) { return q_x > 0.0f ? min1(f_div(p_x, q_x)) : 0.0f; }

// a(x) by the rule (reference.rules.acceptance_at), 0 where q(x) = 0. extra_x: lantern's c_m(x)
// (lantern_bonus), gsd's group ratio min(1, sum_G p / sum_G q) (gsd_row.h); unused by the others.
CSD_HD float rule_acceptance(const RuleRow& r, float p_x, float q_x, float extra_x) {
  if (!(q_x > 0.0f)) return 0.0f;
  const float ratio = f_div(p_x, q_x);
  switch (r.rule) {
    case kRuleCsd:
      return min1(r.gate ? f_add(ratio, r.lambda_h) : ratio);
    case kRuleArsample:
      return r.s > 0.0f ? min1(f_div(min1(ratio), r.s)) : 1.0f;
    case kRuleLantern:
    case kRuleLanternPlus:
      return min1(f_div(f_add(p_x, extra_x), q_x));
    case kRuleGsd:
      return min1(extra_x);
    default:
      return min1(ratio);
  }
}

// The resampling weight of token y: max(p - q*a, 0) for gsd (qa = q(y)*a(y)), max(p - q, 0) for every other rule.
CSD_HD float rule_residual(int rule, float p, float q, float qa) {
  const float d = f_sub(p, rule_residual_qa(rule) ? qa : q);
  return d > 0.0f ? d : 0.0f;
}

// The per-token distortion term max(q*a(y) - p(y), 0) of the rules whose a(y) needs only p(y), q(y) and the row
// (csd, arsample), division free where it can be; 0 for the others (gsd and lantern sum theirs separately) and
// outside the support (the caller passes in_support). For p < q: csd's is min(q - p, lambda*H*q) with its gate open
// (the caller gates the sum: the TVD may not be known yet); arsample's min(q - p, p/s - p) (q - p where s = 0).
CSD_HD bool rule_has_token_terms(int rule) { return rule == kRuleCsd || rule == kRuleArsample; }
CSD_HD float rule_distortion_term(const RuleRow& r, float p, float q, bool in_support) {
  if (!in_support || !(p < q)) return 0.0f;
  const float gap = f_sub(q, p);
  float t = 0.0f;
  if (r.rule == kRuleCsd) {
    const float cap = f_mul(q, r.lambda_h);
    t = gap < cap ? gap : cap;
  } else if (r.rule == kRuleArsample) {
    const float cap = r.s > 0.0f ? f_sub(f_div(p, r.s), p) : gap;
    t = gap < cap ? gap : cap;
  }
  return t > 0.0f ? t : 0.0f;
}

// ---- lantern: the neighbours' mass ------------------------------------------------------------------------------
// The bound on the prefix sums at token y: delta (lantern), (lambda - 1)*p(y) (lantern++).
CSD_HD float lantern_limit(const RuleRow& r, float p_y) {
  return r.rule == kRuleLantern ? r.p0 : f_mul(f_sub(r.p0, 1.0f), p_y);
}

// c_m at token y (reference.neighbour_mass): the largest prefix sum c_j = sum_{i <= j} p(N[y, i]) (fp64, rounded to
// fp32 at each j) not above `limit`; entries outside [0, V) add nothing. Stops early once c_j > limit, or once
// c_j >= `enough` (callers that only need min(c_m, enough)). p_at(v): p at token v.
template <class P>
CSD_HD float lantern_bonus(const int64_t* row, int64_t k, int64_t V, float limit, float enough, P p_at) {
  double acc = 0.0;
  float best = 0.0f;
  for (int64_t j = 0; j < k; ++j) {
    const int64_t v = row[j];
    if (v >= 0 && v < V) acc += static_cast<double>(p_at(v));
    const float c = static_cast<float>(acc);
    if (!(c <= limit)) break;
    best = c;
    if (best >= enough) break;
  }
  return best;
}

// The lantern distortion term at token y in the support: max(q*a(y) - p, 0) = min(q - p, c_m(y)) for p < q.
template <class P>
CSD_HD float lantern_distortion_term(const RuleRow& r, const int64_t* row, int64_t k, int64_t V, float p, float q,
                                     P p_at) {
  if (!(p < q)) return 0.0f;
  const float gap = f_sub(q, p);
  const float c = lantern_bonus(row, k, V, lantern_limit(r, p), gap, p_at);
  return gap < c ? gap : c;
}

}  // namespace csd
