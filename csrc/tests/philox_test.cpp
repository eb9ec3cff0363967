// Torch-free checks of csrc/include/philox.h and csrc/include/verify_row.h: Random123 known-answer vectors for
// Philox4x32-10, the uniform mapping, and the fp16/bf16 loaders. Built and run by CMakeLists.txt (ctest).
#include <cmath>
#include <cstdio>
#include <cstring>

#include "../include/philox.h"
#include "../include/verify_row.h"

static int failures = 0;

static void check_kat(const char* name, const uint32_t c[4], uint32_t k0, uint32_t k1, const uint32_t want[4]) {
  const csd::Philox4 r = csd::philox4x32_10(c[0], c[1], c[2], c[3], k0, k1);
  const bool ok = std::memcmp(r.x, want, sizeof r.x) == 0;
  std::printf("%s %s: %08x %08x %08x %08x\n", ok ? "ok  " : "FAIL", name, r.x[0], r.x[1], r.x[2], r.x[3]);
  failures += !ok;
}

static void expect(bool ok, const char* what) {
  if (!ok) std::printf("FAIL %s\n", what);
  failures += !ok;
}

int main() {
  {
    const uint32_t c[4] = {0, 0, 0, 0}, want[4] = {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8};
    check_kat("zeros", c, 0, 0, want);
  }
  {
    const uint32_t c[4] = {0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff};
    const uint32_t want[4] = {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd};
    check_kat("ones", c, 0xffffffff, 0xffffffff, want);
  }
  {
    const uint32_t c[4] = {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344};
    const uint32_t want[4] = {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1};
    check_kat("pi", c, 0xa4093822, 0x299f31d0, want);
  }
  // uniform mapping: ((x >> 9) + 0.5) * 2^-23, strictly inside (0, 1)
  expect(csd::uniform_from_bits(0u) == 0.5f * std::ldexp(1.0f, -23), "uniform(0)");
  expect(csd::uniform_from_bits(0xffffffffu) < 1.0f, "uniform(max) < 1");
  expect(csd::uniform_from_bits(0xffffffffu) == 1.0f - 0.5f * std::ldexp(1.0f, -23), "uniform(max)");
  // seeds/offsets >= 2^32 split into (lo, hi)
  const csd::RowKey key = csd::row_key(int64_t(0x123456789abcdefLL), true, 3);
  expect(key.k0 == 0x89abcdefu && key.k1 == 0x01234567u && key.row_id == 3u, "row_key split");
  expect(csd::absolute_position(int64_t(0xffffffffLL), 2) == 1u, "position wraps mod 2^32");
  // fp16 / bf16 loaders
  expect(csd::f16_to_float(0x3c00) == 1.0f, "f16 1.0");
  expect(csd::f16_to_float(0xc000) == -2.0f, "f16 -2.0");
  expect(csd::f16_to_float(0x0001) == std::ldexp(1.0f, -24), "f16 smallest subnormal");
  expect(std::isinf(csd::f16_to_float(0x7c00)), "f16 inf");
  expect(std::isnan(csd::f16_to_float(0x7e00)), "f16 nan");
  expect(csd::bf16_to_float(0x3f80) == 1.0f, "bf16 1.0");
  // order keys
  expect(csd::float_from_order_key(csd::float_order_key(-3.5f)) == -3.5f, "order key roundtrip");
  expect(csd::float_order_key(-1.0f) < csd::float_order_key(0.5f), "order key monotone");
  std::printf("%s\n", failures ? "FAILED" : "all passed");
  return failures ? 1 : 0;
}
