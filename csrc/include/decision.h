// The decision of one slot (a row's position, or a tree node's main draft), shared by every kernel that decides one:
// the CPU item (csrc/cpu/verify_kernel.inc), the CUDA position and split kernels (csrc/cuda/verify.cu,
// verify_split.cu) and the tree walk (tree_row.h).
//
// The kernels differ in how they pass over the vocabulary (vector loops, block reductions, slices); what they decide
// from those passes is written here once: the slot's draft token and flags, its distortion (which case, and the
// per-token terms), the decision with max_distortion's cap, the residual's rule, the draws by coupling, and the
// stores. The vocabulary sums stay the caller's (its loop fixes the order of addition, and so the bits). No torch
// headers.
#pragma once

#include <stdint.h>

#include "philox.h"
#include "rules.h"
#include "verify_row.h"

namespace csd {

// ---- the slot's draft, flags and uniforms ---------------------------------------------------------------------------
struct DraftSlot {
  int64_t token;  // -1: no draft
  bool bad;       // outside [-1, V): reported (kFlagBadToken), then read as no draft
  bool has_draft;
};

CSD_HD DraftSlot draft_slot(const VerifyProblem& P, int64_t b, int64_t i) {
  const int64_t raw = P.draft_tokens[b * P.dt_sB + i * P.dt_sL];
  DraftSlot x;
  x.bad = draft_token_is_bad(raw, P.prm.vocab);
  x.token = x.bad ? -1 : raw;
  x.has_draft = x.token >= 0;
  return x;
}

// A token of the vocabulary (a tree's missing candidate is any other value, and is not reported).
CSD_HD bool is_vocab_token(int64_t tok, int64_t vocab) { return tok >= 0 && tok < vocab; }

// The flags the row epilogue reads besides acceptance and bad logits.
CSD_HD uint32_t slot_flags(const DraftSlot& x, bool bad_probs) {
  return (x.has_draft ? kFlagHasDraft : 0u) | (x.bad ? kFlagBadToken : 0u) | (bad_probs ? kFlagBadProbs : 0u);
}

// Row b's Philox key and attempt offset: one seed (offset) for the batch, or one per row.
CSD_HD RowKey seeded_row_key(const int64_t* seed, int64_t n_seed, int64_t b) {
  const bool shared = n_seed == 1;
  return row_key(seed[shared ? 0 : b], shared, b);
}
CSD_HD int64_t row_offset(const int64_t* offset, int64_t n_offset, int64_t b) {
  return offset[n_offset == 1 ? 0 : b];
}

// The step stream of slot (b, i): its key and position (the gumbel stream's too) and its two uniforms.
struct SlotRandom {
  RowKey key;
  uint32_t pos;
  float u_accept, u_sample;
};

CSD_HD SlotRandom slot_random(const VerifyProblem& P, int64_t b, int64_t i) {
  SlotRandom r;
  r.key = seeded_row_key(P.seed, P.n_seed, b);
  r.pos = absolute_position(P.positions[b], i);
  step_uniforms(r.key, r.pos, row_offset(P.offset, P.n_offset, b), &r.u_accept, &r.u_sample);
  return r;
}

// ---- the slot's law -------------------------------------------------------------------------------------------------
// q of one slot: the row, a uniform q0 (last-dim stride 0), or one-hot(token) without draft probabilities; bad ones
// read as q = 0 (q nullptr, q0 0).
struct QRow {
  const float* q;  // nullptr: q0 everywhere, or one-hot(token) when one_hot
  float q0;
  int64_t token;
  bool one_hot;
  CSD_HD float at(int64_t v) const { return q ? q[v] : (one_hot ? (v == token ? 1.0f : 0.0f) : q0); }
};

// p, q, gsd's q*a and the support of p as functions of the token: what the decision's sums and draws read.
// one_hot: q is one-hot(token) (no draft probabilities), whose strict residual is p without the token.
template <class P, class Q, class QA, class S>
struct SlotLaw {
  P p;
  Q q;
  QA qa;  // read only where the rule resamples by it (gsd, not capped) or sums it (gsd's distortion)
  S in_support;
  bool one_hot;
  int64_t token;
};

template <class P, class Q, class QA, class S>
CSD_HD SlotLaw<P, Q, QA, S> slot_law(P p, Q q, QA qa, S in_support, bool one_hot = false, int64_t token = -1) {
  return SlotLaw<P, Q, QA, S>{p, q, qa, in_support, one_hot, token};
}

// The draft x as the decision reads it; q = 0 where x cannot be accepted (no draft, or outside the support of p:
// masked, or cut by top-k / top-p / min-p).
struct DraftTerms {
  int64_t token;
  bool has_draft, in_support;
  float p, q;
};

template <class Law>
CSD_HD DraftTerms draft_terms(const Law& law, int64_t token) {
  DraftTerms x;
  x.token = token;
  x.has_draft = token >= 0;
  x.in_support = x.has_draft && law.in_support(token);
  x.p = x.has_draft ? law.p(token) : 0.0f;
  x.q = x.in_support ? law.q(token) : 0.0f;
  return x;
}

// The rule's term of the draft for rule_acceptance (its extra_x): lantern's neighbours' mass c_m(x) (k gathers of p),
// gsd's group ratio (gsd_x(): gsd_row.h's a(x), however the caller found it); 0 where a(x) is 0 anyway (q(x) = 0).
template <class Law, class G>
CSD_HD float draft_rule_term(const RuleRow& rr, const VerifyParams& prm, const DraftTerms& x, const Law& law,
                             G gsd_x) {
  if (!(x.q > 0.0f)) return 0.0f;
  if (rule_is_lantern(rr.rule))
    return lantern_bonus(prm.neighbours + x.token * prm.nb_stride, prm.nb_k, prm.vocab, lantern_limit(rr, x.p),
                         f_inf(), law.p);
  return rr.rule == kRuleGsd ? gsd_x() : 0.0f;
}

// ---- the distortion -------------------------------------------------------------------------------------------------
// Which distortion a slot reports (reference.verify): none (no draft, a lossless rule, or csd's gate closed); NaN where
// the rule needs every a(y) (lantern: k gathers each; gsd: the sorted row) and gather_distortion is off; with
// q = one-hot(x) the only term, x's; otherwise the sum over tokens of the rule's terms max(q*a - p, 0).
enum DistortionCase : int {
  kDistortionNone,
  kDistortionNotGathered,
  kDistortionOneHot,
  kDistortionGsd,
  kDistortionLantern,
  kDistortionTokenTerms,  // csd and arsample: terms of p(y), q(y) and the row alone (rules.h)
};

CSD_HD DistortionCase distortion_case(const RuleRow& rr, bool has_draft, bool gather, bool one_hot) {
  if (!has_draft || rule_lossless(rr.rule)) return kDistortionNone;
  if (rule_gathers_distortion(rr.rule) && !gather) return kDistortionNotGathered;
  if (one_hot) return kDistortionOneHot;
  if (rr.rule == kRuleGsd) return kDistortionGsd;
  if (rule_is_lantern(rr.rule)) return kDistortionLantern;
  return rr.rule != kRuleCsd || rr.gate ? kDistortionTokenTerms : kDistortionNone;
}

// Token v's term of the distortions that are sums over tokens: gsd's max(q*a - p, 0), lantern's over the support
// (k gathers), and the csd / arsample terms of rules.h.
template <class Law>
CSD_HD float gsd_distortion_term(const Law& law, int64_t v) {
  const float t = f_sub(law.qa(v), law.p(v));
  return t > 0.0f ? t : 0.0f;
}
template <class Law>
CSD_HD float lantern_distortion_term_at(const RuleRow& rr, const VerifyParams& prm, const Law& law, int64_t v) {
  return law.in_support(v) ? lantern_distortion_term(rr, prm.neighbours + v * prm.nb_stride, prm.nb_k, prm.vocab,
                                                     law.p(v), law.q(v), law.p)
                           : 0.0f;
}

// The slot's distortion. sum(c, term): the fp64 sum over the vocabulary of term(v), in the caller's loop, or what
// the caller's passes over p already summed for case c. One sum per case: a loop of its own each.
template <class Law, class Sum>
CSD_HD float slot_distortion(DistortionCase c, float accept_prob, const DraftTerms& x, const RuleRow& rr,
                             const VerifyParams& prm, const Law& law, Sum sum) {
  switch (c) {
    case kDistortionNotGathered:
      return f_nan();
    case kDistortionOneHot: {
      const float t = f_sub(accept_prob, x.p);  // max(a(x) - p(x), 0)
      return x.in_support && t > 0.0f ? t : 0.0f;
    }
    case kDistortionGsd:
      return static_cast<float>(sum(c, [&](int64_t v) { return gsd_distortion_term(law, v); }));
    case kDistortionLantern:
      return static_cast<float>(sum(c, [&](int64_t v) { return lantern_distortion_term_at(rr, prm, law, v); }));
    case kDistortionTokenTerms:
      return static_cast<float>(
          sum(c, [&](int64_t v) { return rule_distortion_term(rr, law.p(v), law.q(v), law.in_support(v)); }));
    default:
      return 0.0f;
  }
}

// ---- the decision ---------------------------------------------------------------------------------------------------
// The decision of one position: the rule's a(x) (rules.h) and the strict one (for coupling = maximal).
struct PositionDecision {
  float accept_prob;  // a(x) under the rule
  float strict_prob;  // min(1, p(x)/q(x))
  bool accepted;      // has_draft && u_accept < a(x)
  bool keep_draft;    // has_draft && u_accept < strict_prob
};

// q_x = 0 when there is no usable draft (no token, q(x) = 0 or x outside the support); extra_x: rule_acceptance's.
CSD_HD PositionDecision decide_position(const RuleRow& rr, float p_x, float q_x, float extra_x, bool has_draft,
                                        float u_accept) {
  PositionDecision d;
  if (!has_draft) q_x = 0.0f;
  d.accept_prob = rule_acceptance(rr, p_x, q_x, extra_x);
  d.strict_prob = strict_acceptance(p_x, q_x);
  d.accepted = has_draft && u_accept < d.accept_prob;
  d.keep_draft = has_draft && u_accept < d.strict_prob;
  return d;
}

// A position whose distortion is above max_distortion is decided strictly (reference.relaxed_slots): a = min(1, p/q)
// and the strict residual; its distortion is then 0. A NaN distortion (not gathered) is never above.
CSD_HD bool above_cap(float distortion, float max_distortion) { return distortion > max_distortion; }
CSD_HD PositionDecision strict_decision(PositionDecision d) {
  d.accept_prob = d.strict_prob;
  d.accepted = d.keep_draft;
  return d;
}

// A slot decided: its decision, its distortion (0 once capped), and whether the cap decided it strictly.
struct SlotDecision {
  PositionDecision d;
  float distortion;
  bool capped;
  // The rule whose residual a rejection resamples from (rules.h's rule_residual).
  CSD_HD int residual_rule(int rule) const { return capped ? int(kRuleStrict) : rule; }
};

// The decision comes before the distortion (one-hot q's is a(x) - p(x)), the cap after it.
template <class Law, class G, class Sum>
CSD_HD SlotDecision decide_slot(const RuleRow& rr, const VerifyParams& prm, const DraftTerms& x, float u_accept,
                                const Law& law, G gsd_x, Sum sum) {
  SlotDecision s;
  s.d = decide_position(rr, x.p, x.q, draft_rule_term(rr, prm, x, law, gsd_x), x.has_draft, u_accept);
  const DistortionCase c = distortion_case(rr, x.has_draft, prm.gather_distortion, law.one_hot);
  s.distortion = slot_distortion(c, s.d.accept_prob, x, rr, prm, law, sum);
  s.capped = above_cap(s.distortion, prm.max_distortion);
  if (s.capped) {
    s.d = strict_decision(s.d);
    s.distortion = 0.0f;
  }
  return s;
}

// ---- draws and the next draft ---------------------------------------------------------------------------------------
// Token v's weight in the residual a rejection resamples from: rule_residual under `rule` (SlotDecision::
// residual_rule). Its two forms apart, for kernels that draw from each in a loop of its own: the rules that resample
// by q*a (gsd), and the others, max(p - q, 0) -- with q = one-hot(x), p without x.
template <class Law>
CSD_HD float qa_residual_weight(int rule, const Law& law, int64_t v) {
  return rule_residual(rule, law.p(v), 0.0f, law.qa(v));
}
template <class Law>
CSD_HD float strict_residual_weight(const Law& law, int64_t v) {
  if (law.one_hot) return v == law.token ? 0.0f : law.p(v);
  return rule_residual(kRuleStrict, law.p(v), law.q(v), 0.0f);
}
template <class Law>
CSD_HD float residual_weight(int rule, const Law& law, int64_t v) {
  return rule_residual_qa(rule) ? qa_residual_weight(rule, law, v) : strict_residual_weight(law, v);
}

// The slot's draws, both from u_sample: from_p, a token of p (the next draft under independent coupling, and the
// resampled token where the residual has no mass), and the resampled token, from the residual where it is used
// (a draft, and a residual with mass). -1: not drawn.
struct SlotDraws {
  int64_t from_p, resampled;
};

template <class DrawP, class DrawResidual>
CSD_HD SlotDraws slot_draws(bool use_residual, int coupling, DrawP draw_p, DrawResidual draw_residual) {
  SlotDraws s;
  s.from_p = !use_residual || coupling == kCouplingIndependent ? draw_p() : int64_t(-1);
  s.resampled = use_residual ? draw_residual() : s.from_p;
  return s;
}

// The token drafted for the later positions, by coupling: independent, from p; maximal, the draft where it is kept
// (u < min(1, p/q)), else the resampled token; gumbel, gumbel() (argmax z + G, the caller's pass).
template <class G>
CSD_HD int64_t next_draft(int coupling, const PositionDecision& d, int64_t token, const SlotDraws& draws, G gumbel) {
  if (coupling == kCouplingIndependent) return draws.from_p;
  if (coupling == kCouplingMaximal) return d.keep_draft ? token : draws.resampled;
  return gumbel();
}

// ---- stores (one thread) --------------------------------------------------------------------------------------------
// A slot without a distribution (bad logits): NaN statistics, token 0, a stop.
CSD_HD void store_bad_slot(const VerifyProblem& P, int64_t item, uint32_t flags) {
  const float nan = f_nan();
  P.entropy[item] = P.tvd[item] = P.accept_prob[item] = P.distortion[item] = nan;
  P.flags[item] = flags | kFlagBadLogits;
  P.resampled[item] = 0;
  P.tokens[item] = 0;
}

// A decided slot; a next draft outside the vocabulary (none drawn) reads as token 0.
CSD_HD void store_slot(const VerifyProblem& P, int64_t item, float h, float tvd, const SlotDecision& s,
                       uint32_t flags, int64_t resampled, int64_t later) {
  P.entropy[item] = h;
  P.tvd[item] = tvd;
  P.accept_prob[item] = s.d.accept_prob;
  P.distortion[item] = s.distortion;
  P.flags[item] = flags | (s.d.accepted ? kFlagAccepted : 0u);
  P.resampled[item] = resampled;
  P.tokens[item] = is_vocab_token(later, P.prm.vocab) ? later : 0;
}

}  // namespace csd
