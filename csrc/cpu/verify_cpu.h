// Internal interface of the CPU kernel (csrc/cpu/verify.cpp). Raw pointers only; the torch glue lives in
// csrc/verify_glue.h.
#pragma once

#include <stdint.h>

#include "../include/verify_row.h"

namespace csd {
namespace cpu {

using Problem = VerifyProblem;

// isa_override: 0 auto, 1 baseline, 2 AVX2 (tests); never above what the CPU has.
void verify_rows_cpu_impl(const Problem& P, int isa_override);
int detect_isa_public();  // 0 baseline, 1 AVX2+FMA, 2 AVX-512

}  // namespace cpu
}  // namespace csd
