// The per-call settings record of csd_kernels/backends/spec.py (OpSettings), as the compiled ops take it: `settings`
// (floats, then the rule's parameters) and `choices` (ints and flags), read once into an OpSettings and checked here.
// The indices below are spec.py's SETTINGS and CHOICES, in order (tests/test_rules.py holds them to it).
#pragma once

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

namespace csd {

enum SettingIndex : int { kSetCfgScale, kSetTemperature, kSetTopP, kSetMinP, kSetMaxDistortion, kSetRuleParams };
enum ChoiceIndex : int {
  kChoTopK,
  kChoRule,
  kChoCoupling,
  kChoTargetIsProbs,
  kChoGatherDistortion,
  kChoReturnProbs,
  kChoBranching,
  kChoDepthLimit,
  kChoCount
};

struct OpSettings {
  double cfg_scale, temperature, top_p, min_p, max_distortion;
  c10::ArrayRef<double> rule_params;  // as many as the rule declares
  int64_t top_k, rule, coupling, branching, depth_limit;
  bool target_is_probs, gather_distortion, return_probs;
};

// The record, its sizes and the values every op shares checked (op: "csd_kernels.<name>: ").
inline OpSettings read_settings(c10::ArrayRef<double> settings, c10::ArrayRef<int64_t> choices, const char* op) {
  TORCH_CHECK(settings.size() >= kSetRuleParams, op, "settings must hold at least ", int(kSetRuleParams),
              " floats (backends/spec.py's SETTINGS), got ", settings.size());
  TORCH_CHECK(choices.size() == kChoCount, op, "choices must hold ", int(kChoCount),
              " ints (backends/spec.py's CHOICES), got ", choices.size());
  OpSettings s;
  s.cfg_scale = settings[kSetCfgScale];
  s.temperature = settings[kSetTemperature];
  s.top_p = settings[kSetTopP];
  s.min_p = settings[kSetMinP];
  s.max_distortion = settings[kSetMaxDistortion];
  s.rule_params = settings.slice(kSetRuleParams);
  s.top_k = choices[kChoTopK];
  s.rule = choices[kChoRule];
  s.coupling = choices[kChoCoupling];
  s.target_is_probs = choices[kChoTargetIsProbs] != 0;
  s.gather_distortion = choices[kChoGatherDistortion] != 0;
  s.return_probs = choices[kChoReturnProbs] != 0;
  s.branching = choices[kChoBranching];
  s.depth_limit = choices[kChoDepthLimit];
  TORCH_CHECK(s.coupling >= 0 && s.coupling <= 2, op,
              "coupling must be 0 (independent), 1 (maximal) or 2 (gumbel), got ", s.coupling);
  TORCH_CHECK(s.temperature >= 0.0, op, "temperature must be >= 0, got ", s.temperature);
  TORCH_CHECK(s.top_k >= 0, op, "top_k must be >= 0 (0 = no restriction), got ", s.top_k);
  TORCH_CHECK(s.top_p > 0.0 && s.top_p <= 1.0, op, "top_p must lie in (0, 1] (1 = no restriction), got ", s.top_p);
  TORCH_CHECK(s.min_p >= 0.0 && s.min_p <= 1.0, op, "min_p must lie in [0, 1] (0 = no restriction), got ", s.min_p);
  TORCH_CHECK(s.max_distortion >= 0.0, op, "max_distortion must be >= 0 (inf = no cap), got ", s.max_distortion);
  return s;
}

}  // namespace csd
