// Philox4x32-10 (Salmon et al., SC'11) and the two random streams of csd_kernels.
//
// This is the bit-exact C++/CUDA twin of csd_kernels/reference/rng.py (philox4x32, uniform_from_bits, step_uniforms,
// gumbel_uniforms). No torch headers: it is included by the CPU kernel, the CUDA kernel and the torch-free tests.
#pragma once

#include <stdint.h>

#if defined(__CUDACC__) || defined(__HIPCC__)
#define CSD_HD __host__ __device__ __forceinline__
#else
#define CSD_HD inline
#endif

namespace csd {

constexpr uint32_t kPhiloxM0 = 0xD2511F53u;
constexpr uint32_t kPhiloxM1 = 0xCD9E8D57u;
constexpr uint32_t kPhiloxW0 = 0x9E3779B9u;
constexpr uint32_t kPhiloxW1 = 0xBB67AE85u;
constexpr int kPhiloxRounds = 10;
constexpr uint32_t kGumbelStreamTag = 0x80000000u;
constexpr uint32_t kTreeStreamTag = 0xC0000000u;  // word 3 of the tree stream (reference.TREE_STREAM_TAG)

struct Philox4 {
  uint32_t x[4];
};

// Philox4x32-10 of counter (c0, c1, c2, c3) under key (k0, k1).
CSD_HD Philox4 philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0, uint32_t k1) {
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int round = 0; round < kPhiloxRounds; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(kPhiloxM0) * c0;
    const uint64_t p1 = static_cast<uint64_t>(kPhiloxM1) * c2;
    const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    const uint32_t n0 = hi1 ^ c1 ^ k0;
    const uint32_t n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
    k0 += kPhiloxW0;
    k1 += kPhiloxW1;
  }
  Philox4 out;
  out.x[0] = c0;
  out.x[1] = c1;
  out.x[2] = c2;
  out.x[3] = c3;
  return out;
}

// ((x >> 9) + 0.5) * 2^-23: exact in float32, strictly inside (0, 1).
CSD_HD float uniform_from_bits(uint32_t x) {
  return (static_cast<float>(x >> 9) + 0.5f) * 1.1920928955078125e-07f;
}

// Key halves of a row's seed and the row id used in the counters.
// seed_is_shared: one seed for the whole batch (row_id = b); otherwise every row has its own seed (row_id = 0).
struct RowKey {
  uint32_t k0, k1, row_id;
};

CSD_HD RowKey row_key(int64_t seed, bool seed_is_shared, int64_t b) {
  RowKey key;
  const uint64_t s = static_cast<uint64_t>(seed);
  key.k0 = static_cast<uint32_t>(s);
  key.k1 = static_cast<uint32_t>(s >> 32);
  key.row_id = seed_is_shared ? static_cast<uint32_t>(b) : 0u;
  return key;
}

// Absolute token index of window position i of a row whose first position is `position`, mod 2^32.
CSD_HD uint32_t absolute_position(int64_t position, int64_t i) {
  return static_cast<uint32_t>(static_cast<uint64_t>(position) + static_cast<uint64_t>(i));
}

// Step stream: counter (pos, row_id, offset_lo, offset_hi); lane 0 -> u_accept, lane 1 -> u_sample, lane 2 -> the
// random draft token.
CSD_HD Philox4 step_bits(const RowKey& key, uint32_t pos, int64_t offset) {
  const uint64_t off = static_cast<uint64_t>(offset);
  return philox4x32_10(pos, key.row_id, static_cast<uint32_t>(off), static_cast<uint32_t>(off >> 32), key.k0, key.k1);
}

CSD_HD void step_uniforms(const RowKey& key, uint32_t pos, int64_t offset, float* u_accept, float* u_sample) {
  const Philox4 r = step_bits(key, pos, offset);
  *u_accept = uniform_from_bits(r.x[0]);
  *u_sample = uniform_from_bits(r.x[1]);
}

// Lane 2 of the step stream: the uniformly random draft token floor(x * V / 2^32) a decoding loop puts at a fresh
// position (reference.random_draft_tokens).
CSD_HD int64_t random_draft_token(const RowKey& key, uint32_t pos, int64_t offset, int64_t vocab) {
  const Philox4 r = step_bits(key, pos, offset);
  return static_cast<int64_t>((static_cast<uint64_t>(r.x[2]) * static_cast<uint64_t>(vocab)) >> 32);
}

// Gumbel stream: one call per group of 4 tokens, counter (v >> 2, pos, row_id, 0x80000000), lane v & 3.
CSD_HD Philox4 gumbel_bits(const RowKey& key, uint32_t pos, uint32_t group) {
  return philox4x32_10(group, pos, key.row_id, kGumbelStreamTag, key.k0, key.k1);
}

CSD_HD float gumbel_uniform(const RowKey& key, uint32_t pos, int64_t token) {
  const Philox4 r = gumbel_bits(key, pos, static_cast<uint32_t>(static_cast<uint64_t>(token) >> 2));
  return uniform_from_bits(r.x[token & 3]);
}

// Tree stream (reference.tree_uniforms): counter (slot, 2^31, offset_lo, TAG | row_id), keyed by the row's attempt
// count; lane 0 -> u_accept (tests the candidate at `slot`), lane 1 -> u_sample (the token emitted below `slot`).
CSD_HD Philox4 tree_bits(const RowKey& key, uint32_t slot, int64_t offset) {
  const uint32_t off_lo = static_cast<uint32_t>(static_cast<uint64_t>(offset));
  return philox4x32_10(slot, 0x80000000u, off_lo, kTreeStreamTag | (key.row_id & 0x3FFFFFFFu), key.k0, key.k1);
}

// Tree stream, sibling candidates (reference.tree_gumbel_uniforms): one call per group of 4 tokens at tree level
// `level`, counter (v >> 2, level, offset_lo, TAG | row_id), lane v & 3.
CSD_HD Philox4 tree_gumbel_bits(const RowKey& key, uint32_t level, int64_t offset, uint32_t group) {
  const uint32_t off_lo = static_cast<uint32_t>(static_cast<uint64_t>(offset));
  return philox4x32_10(group, level, off_lo, kTreeStreamTag | (key.row_id & 0x3FFFFFFFu), key.k0, key.k1);
}

}  // namespace csd
