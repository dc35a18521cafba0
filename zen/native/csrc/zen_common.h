// Shared by the CPU and CUDA kernels: the hash family of zen/hashing.py in uint32 arithmetic.
//
// hash32(x, level) = fmix32(x * a_level + b_level) mod 2^32 (murmur3 finaliser over a seeded
// multiply-add); h0 and the probes reduce it to a range with a 64-bit multiply-shift. These must stay
// bit-identical to HashFamily.hash32 / h0 / probe, which emulate the same uint32 arithmetic with int64 ops.
#pragma once

#include <cstdint>
#include <vector>

#if defined(__CUDACC__)
#define ZEN_HD __host__ __device__ __forceinline__
#else
#define ZEN_HD inline
#endif

namespace zen {

constexpr int kMaxLevels = 16;  // h0 plus up to 15 probes

// Coefficients of h0..hk, passed by value to kernels.
struct Family {
  uint32_t a[kMaxLevels];
  uint32_t b[kMaxLevels];
  int levels;  // k + 1
};

ZEN_HD uint32_t fmix32(uint32_t h) {
  h ^= h >> 16;
  h *= 0x85EBCA6Bu;
  h ^= h >> 13;
  h *= 0xC2B2AE35u;
  h ^= h >> 16;
  return h;
}

ZEN_HD uint32_t hash32(uint64_t x, const Family& f, int level) {
  return fmix32(static_cast<uint32_t>(x) * f.a[level] + f.b[level]);
}

// Multiply-shift range reduction of a 32-bit hash to [0, range), range < 2^32.
ZEN_HD uint64_t reduce(uint32_t h, uint64_t range) {
  return (static_cast<uint64_t>(h) * range) >> 32;
}

ZEN_HD uint32_t partition_of(uint64_t x, const Family& f, uint32_t n) {
  return static_cast<uint32_t>(reduce(hash32(x, f, 0), n));
}

// Bit pattern of "x != 0" for IEEE floats: every bit but the sign (so -0.0 is zero, NaN is not).
template <typename Bits>
ZEN_HD Bits magnitude_mask() {
  return static_cast<Bits>(~(static_cast<Bits>(1) << (sizeof(Bits) * 8 - 1)));
}

inline Family make_family(const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
  Family f{};
  f.levels = static_cast<int>(a.size());
  for (int i = 0; i < f.levels && i < kMaxLevels; ++i) {
    f.a[i] = static_cast<uint32_t>(a[i]);
    f.b[i] = static_cast<uint32_t>(b[i]);
  }
  return f;
}

}  // namespace zen
