// Shared by the CPU and CUDA kernels (header-only): the hash family of zen/hashing.py in uint32 arithmetic,
// and the host-side argument checks and dtype dispatch that both backends run before a kernel.
//
// hash32(x, level) = fmix32(x * a_level + b_level) mod 2^32 (murmur3 finaliser over a seeded
// multiply-add); h0 and the probes reduce it to a range with a 64-bit multiply-shift. These must stay
// bit-identical to HashFamily.hash32 / h0 / probe, which emulate the same uint32 arithmetic with int64 ops.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#if defined(__CUDACC__)
#define ZEN_HD __host__ __device__ __forceinline__
#else
#define ZEN_HD inline
#endif

namespace zen {

// ---------------------------------------------------------------------------------------------------
// Hash family (paper section 3): h0 picks a row's partition (server), h1..hk its probe slots.

constexpr int kMaxLevels = 16;  // h0 plus up to 15 probes

// Coefficients of h0..hk, passed by value to kernels.
struct Family {
  uint32_t a[kMaxLevels];
  uint32_t b[kMaxLevels];
  int levels;  // k + 1
};

// MurmurHash3's 32-bit finalizer multipliers (fmix32; the CPU's 16-lane form in zen_cpu_hash.cpp uses them too).
constexpr uint32_t kFmixMul1 = 0x85EBCA6Bu;
constexpr uint32_t kFmixMul2 = 0xC2B2AE35u;

ZEN_HD uint32_t fmix32(uint32_t h) {
  h ^= h >> 16;
  h *= kFmixMul1;
  h ^= h >> 13;
  h *= kFmixMul2;
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

// ---------------------------------------------------------------------------------------------------
// Host-side checks and dispatch. kDevice is the device a backend's tensors must be on (CPU for
// zen_cpu_*.cpp, CUDA for zen_cuda.cu); it also names the backend in error messages.

template <c10::DeviceType kDevice>
constexpr const char* backend_name() {
  return kDevice == c10::DeviceType::CUDA ? "zen native CUDA" : "zen native";
}

// The family of the coefficient lists zen.native passes (one (a, b) pair per level), checked.
template <c10::DeviceType kDevice>
Family family_of(const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
  TORCH_CHECK(!a.empty() && a.size() == b.size() && a.size() <= static_cast<size_t>(kMaxLevels),
              backend_name<kDevice>(), ": need 1..", kMaxLevels, " hash levels, got ", a.size());
  return make_family(a, b);
}

// Calls f(Bits{}) with the unsigned integer type of the tensor's element width: kernels test and copy
// values as raw bits.
template <c10::DeviceType kDevice, typename F>
auto with_bits(const at::Tensor& t, F f) {
  TORCH_CHECK(at::isFloatingType(t.scalar_type()), backend_name<kDevice>(),
              ": values must be floating point, got ", t.scalar_type());
  const auto size = t.element_size();
  TORCH_CHECK(size == 2 || size == 4 || size == 8, backend_name<kDevice>(), ": unsupported element size ", size);
  if (size == 2) return f(uint16_t{});
  if (size == 4) return f(uint32_t{});
  return f(uint64_t{});
}

// Calls f(Idx{}) with the index type of an int32 or int64 tensor.
template <c10::DeviceType kDevice, typename F>
auto with_index(const at::Tensor& t, F f) {
  if (t.scalar_type() == at::kInt) return f(int32_t{});
  TORCH_CHECK(t.scalar_type() == at::kLong, backend_name<kDevice>(), ": indices must be int32 or int64, got ",
              t.scalar_type());
  return f(int64_t{});
}

// A contiguous (M, D) block on the backend's device.
template <c10::DeviceType kDevice>
at::Tensor as_rows(const at::Tensor& t) {
  TORCH_CHECK(t.dim() == 2, backend_name<kDevice>(), ": expected an (M, D) tensor, got ", t.dim(), " dims");
  TORCH_CHECK(t.device().type() == kDevice, backend_name<kDevice>(), ": expected a ", c10::DeviceTypeName(kDevice),
              " tensor, got one on ", t.device());
  return t.contiguous();
}

// A hash bitmap (Algorithm 2) for a server with L rows: 1-D uint8 on the backend's device, one bit per row.
template <c10::DeviceType kDevice>
void check_payload(const at::Tensor& payload, int64_t L) {
  TORCH_CHECK(payload.device().type() == kDevice && payload.scalar_type() == at::kByte && payload.dim() == 1,
              backend_name<kDevice>(), ": payload must be a 1-D uint8 ", c10::DeviceTypeName(kDevice), " tensor");
  TORCH_CHECK(payload.numel() == (L + 7) / 8, backend_name<kDevice>(), ": hash bitmap of ", payload.numel(),
              " bytes does not match a server with ", L, " rows");
}

}  // namespace zen
