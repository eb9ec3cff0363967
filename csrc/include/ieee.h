// IEEE fp32 arithmetic without contraction, and float bit helpers, shared by every kernel header. On the device the
// products and sums that decide anything use round-to-nearest intrinsics so nvcc cannot contract them into FMAs (the
// host build uses -ffp-contract=off for the same reason). No torch headers.
#pragma once

#include <stdint.h>
#include <string.h>

#include "philox.h"

#if defined(__CUDACC__) || defined(__HIPCC__)
#include <math.h>
#else
#include <cmath>
#endif

namespace csd {

#if defined(__CUDA_ARCH__)
CSD_HD float f_add(float a, float b) { return __fadd_rn(a, b); }
CSD_HD float f_sub(float a, float b) { return __fsub_rn(a, b); }
CSD_HD float f_mul(float a, float b) { return __fmul_rn(a, b); }
CSD_HD float f_div(float a, float b) { return __fdiv_rn(a, b); }
CSD_HD float bits_to_float(uint32_t x) { return __uint_as_float(x); }
CSD_HD uint32_t float_to_bits(float x) { return __float_as_uint(x); }
CSD_HD bool f_isfinite(float x) { return isfinite(x); }
CSD_HD float f_nan() { return __int_as_float(0x7fc00000); }
CSD_HD float f_inf() { return __int_as_float(0x7f800000); }
#else
CSD_HD float f_add(float a, float b) { return a + b; }
CSD_HD float f_sub(float a, float b) { return a - b; }
CSD_HD float f_mul(float a, float b) { return a * b; }
CSD_HD float f_div(float a, float b) { return a / b; }
CSD_HD float bits_to_float(uint32_t x) {
  float f;
  memcpy(&f, &x, sizeof f);
  return f;
}
CSD_HD uint32_t float_to_bits(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  return u;
}
CSD_HD bool f_isfinite(float x) { return std::isfinite(x); }
CSD_HD float f_nan() { return bits_to_float(0x7fc00000u); }
CSD_HD float f_inf() { return bits_to_float(0x7f800000u); }
#endif

// Sortable key of a float (monotone: a < b <=> key(a) < key(b); -0 sorts just below +0).
CSD_HD uint32_t float_order_key(float f) {
  const uint32_t b = float_to_bits(f);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
CSD_HD float float_from_order_key(uint32_t k) { return bits_to_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k); }

}  // namespace csd
