// CPU kernel of torch.ops.csd_kernels.verify_rows.
//
// Work items are (row, position) pairs spread over threads with at::parallel_for. Each item makes a few passes over
// the vocabulary on a per-thread scratch buffer (z, then e = exp(z - max)); the passes are written with GCC vector
// extensions (csrc/cpu/verify_kernel.inc), branch free, so every hot loop is vectorised. That body is compiled three
// times -- AVX-512 (16 lanes), AVX2+FMA (8 lanes) and the baseline ISA -- and the copy is picked once at run time.
// Nothing [B, L, V] is materialised except the optional probs output.
//
//   pass 1  z = mix(c, u) * (1/T), max z, finiteness                   (reads the logits once)
//   top-k   k-th largest z via nth_element on a copy                    (only when 0 < top_k < V)
//   pass 2  e = exp(z - max) where kept, Z = sum e, sum e*(z - max)      (entropy without a log per element)
//   pass 3  p = e / Z (probs output), sum |p - q|, the csd / arsample distortion sum (rules.h), and per 256-token
//           block the fp64 sums of p and of the residual max(p - q, 0) for the inverse-CDF draws
//   rules   the rule's term of the draft (lantern: k gathers of p; gsd: its groups over the sorted row, gsd_row.h),
//           a(x), and the distortion of the rules whose terms need those (gsd; lantern with gather_distortion)
//   draws   inverse CDF: walk the fp64 block sums, then scan the one block that crosses u * total in fp64
//           (torch.cumsum's CPU accumulation), so token draws match the reference except for float tie splits
//   gumbel  argmax(z + G) with a vectorised Philox (16-bit partial products) and a vectorised log
//
// The op's own arithmetic is IEEE fp32 without contraction (-ffp-contract=off, no fast-math); FMAs appear only inside
// the exp/log polynomials. So decisions and tokens match reference.verify(float32).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <vector>

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) && !defined(__clang__))
#include <immintrin.h>
#endif

#include "../include/decision.h"
#include "../include/gsd_row.h"
#include "../include/philox.h"
#include "../include/verify_row.h"
#include "serial_exec.h"
#include "verify_cpu.h"

namespace csd {
namespace cpu {
namespace {

#define CSD_AI inline __attribute__((always_inline))

constexpr int kBlock = 256;  // tokens per fp64 block sum of the inverse-CDF draws

// ---- per-thread scratch ---------------------------------------------------------------------------------------------
struct Scratch {
  std::vector<float> z, p, tmp, gsd_floats;
  std::vector<double> wbs, pbs;
  std::vector<uint64_t> gsd_keys;
  // gsd's scratch (gsd_row.h) for a vocabulary of V
  GsdScratch gsd(int64_t vocab) {
    if (static_cast<int64_t>(gsd_keys.size()) < vocab) gsd_keys.resize(vocab);
    if (static_cast<int64_t>(gsd_floats.size()) < 5 * vocab + 2) gsd_floats.resize(5 * vocab + 2);
    float* f = gsd_floats.data();
    return GsdScratch{gsd_keys.data(), f, f + vocab, f + 2 * vocab, f + 3 * vocab + 1, f + 4 * vocab + 2};
  }
  void ensure(int64_t vocab) {
    const int64_t nblk = (vocab + kBlock - 1) / kBlock;
    if (static_cast<int64_t>(z.size()) < vocab + kBlock) {
      z.assign(vocab + kBlock, 0.0f);
      p.assign(vocab + kBlock, 0.0f);
    }
    if (static_cast<int64_t>(wbs.size()) < nblk + 1) {
      wbs.assign(nblk + 1, 0.0);
      pbs.assign(nblk + 1, 0.0);
    }
  }
};

Scratch& thread_scratch() {
  static thread_local Scratch s;
  return s;
}

// ---- an item's law (decision.h's SlotLaw) -----------------------------------------------------------------------------
// Functors defined here, outside the per-ISA copies below: decision.h's templates are compiled for the baseline ISA,
// and GCC does not inline a function of the AVX2 / AVX-512 copies (a lambda there) into them, which cost a call per
// token in the distortion sums and per gather in lantern's.
struct ItemP {
  const float* e;
  float scale;
  float operator()(int64_t v) const { return e[v] * scale; }
};
struct ItemSupport {  // greedy: the argmax; otherwise z >= thr and finite
  const float* z;
  float thr;
  bool by_token;
  int64_t token;
  bool operator()(int64_t v) const { return by_token ? v == token : (z[v] >= thr && z[v] > -f_inf()); }
};
struct ItemQ {
  QRow row;
  float operator()(int64_t v) const { return row.at(v); }
};
struct ItemQA {  // gsd's q*a over the support (gs filled by gsd_sorted_row where it is read)
  ItemSupport in_support;
  ItemQ q;
  const GsdScratch* gs;
  float operator()(int64_t v) const { return in_support(v) ? f_mul(q(v), gs->a[v]) : 0.0f; }
};


// ---- the vectorised body, once per instruction set ------------------------------------------------------------------
#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) && !defined(__clang__))
#define CSD_CPU_X86 1
#else
#define CSD_CPU_X86 0
#endif

namespace isa_base {
#define CSD_LANES 8
#include "verify_kernel.inc"
#undef CSD_LANES
}  // namespace isa_base

#if CSD_CPU_X86
#pragma GCC push_options
#pragma GCC target("avx2,fma")
namespace isa_avx2 {
#define CSD_LANES 8
#include "verify_kernel.inc"
#undef CSD_LANES
}  // namespace isa_avx2
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f,avx512dq,avx512bw,avx512vl,avx2,fma")
namespace isa_avx512 {
#define CSD_LANES 16
#include "verify_kernel.inc"
#undef CSD_LANES
}  // namespace isa_avx512
#pragma GCC pop_options
#endif

enum class Isa { kBase, kAvx2, kAvx512 };

Isa detect_isa() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("fma"))
    return Isa::kAvx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return Isa::kAvx2;
#endif
  return Isa::kBase;
}

template <typename T>
void run_typed(const Problem& P, int isa_override) {
  static const Isa detected = detect_isa();
  Isa isa = detected;  // isa_override: 0 auto, 1 baseline, 2 AVX2 (never above what the CPU has)
  if (isa_override == 1) isa = Isa::kBase;
  if (isa_override == 2 && detected != Isa::kBase) isa = Isa::kAvx2;
  at::parallel_for(0, P.B * P.L, 1, [&](int64_t begin, int64_t end) {
#if CSD_CPU_X86
    if (isa == Isa::kAvx512) return isa_avx512::process_range<T>(P, begin, end);
    if (isa == Isa::kAvx2) return isa_avx2::process_range<T>(P, begin, end);
#endif
    (void)isa;
    isa_base::process_range<T>(P, begin, end);
  });
  if (P.prm.rule != kRuleGsd || P.prm.gather_distortion) return;
  at::parallel_for(0, P.B, 1, [&](int64_t begin, int64_t end) {  // gsd's residual draws, one per row at most
#if CSD_CPU_X86
    if (isa == Isa::kAvx512) return isa_avx512::finish_deferred<T>(P, begin, end);
    if (isa == Isa::kAvx2) return isa_avx2::finish_deferred<T>(P, begin, end);
#endif
    isa_base::finish_deferred<T>(P, begin, end);
  });
}

}  // namespace

int detect_isa_public() { return static_cast<int>(detect_isa()); }

void verify_rows_cpu_impl(const Problem& P, int isa_override) {
  if (P.B == 0 || P.L == 0) {
    for (int64_t b = 0; b < P.B; ++b) P.accept_len[b] = 0, P.status[b] = 0;
    return;
  }
  switch (P.logit_dtype) {
    case kLogitF32:
      run_typed<float>(P, isa_override);
      break;
    case kLogitF16:
      run_typed<f16_bits>(P, isa_override);
      break;
    case kLogitBF16:
      run_typed<bf16_bits>(P, isa_override);
      break;
    default:
      TORCH_CHECK(false, "csd_kernels.verify_rows: unsupported logit dtype");
  }
  for (int64_t b = 0; b < P.B; ++b) {
    row_epilogue(P.L, P.prm.vocab, P.start[b], P.draft_tokens + b * P.dt_sB, P.dt_sL, P.flags + b * P.L,
                 P.resampled + b * P.L, P.tokens + b * P.L, P.accept_len + b, P.status + b);
  }
}

}  // namespace cpu
}  // namespace csd

// ---- torch glue -----------------------------------------------------------------------------------------------------
#include <atomic>
#include <string>

#include "../verify_glue.h"

namespace csd {

static std::atomic<int> g_isa_override{0};
void set_cpu_isa(const std::string& name) {
  if (name == "auto" || name == "avx512")
    g_isa_override = 0;
  else if (name == "baseline")
    g_isa_override = 1;
  else if (name == "avx2")
    g_isa_override = 2;
  else
    TORCH_CHECK(false, "csd_kernels._C._set_cpu_isa: expected auto, avx512, avx2 or baseline, got ", name);
}
std::string cpu_isa() {
  static const char* names[] = {"baseline", "avx2", "avx512"};
  const int detected = static_cast<int>(cpu::detect_isa_public());
  int isa = detected;
  if (g_isa_override == 1) isa = 0;
  if (g_isa_override == 2 && detected > 0) isa = 1;
  return names[isa];
}

CSD_VERIFY_ROWS_SIGNATURE(verify_rows_cpu) {
  const OpSettings s = read_settings(settings, choices, "csd_kernels.verify_rows: ");
  const CheckedArgs a = check_verify_args(target_logits, draft_tokens, draft_probs, uncond_logits, neighbours,
                                          informed, start, positions, seed, offset, s, target_logits.device());
  TORCH_CHECK(target_logits.device().is_cpu(), "csd_kernels.verify_rows (CPU): tensors must be on the CPU");
  const PreparedCall call = prepare_call(a, target_logits, draft_tokens, draft_probs, uncond_logits, start, positions,
                                         seed, offset, s.return_probs, informed);
  cpu::verify_rows_cpu_impl(call.problem, g_isa_override.load());
  return call.out.as_tuple();
}

}  // namespace csd
