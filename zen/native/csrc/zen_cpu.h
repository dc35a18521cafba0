// CPU kernels (ATen + at::parallel_for) for the hot paths of Zen, one file per kernel family: non-zero row
// extraction (zen_cpu_scan.cpp); hierarchical hashing, BP's push and S_j (paper section 3, Algorithm 1:
// zen_cpu_hash.cpp); the hash-bitmap pull encoding and BP's CPU server (section 4, Algorithm 2:
// zen_cpu_bitmap.cpp) and its pull in one pass (zen_cpu_pull.cpp); HC's merge of two sorted unions
// (zen_cpu_merge.cpp); the interleaved split, the checked scatter and the streamed write of a dense result
// (zen_cpu_write.cpp); the gap coding of HC's ids (zen_cpu_gaps.cpp); a sparsifier's threshold sweep
// (zen_cpu_sweep.cpp). zen_cpu_binding.cpp binds the entry points declared at the end of this header.
//
// This header is what more than one family uses: the includes, the CPU form of zen_common.h's checks, work
// splitting for at::parallel_for, and a few small helpers. Each family keeps its own helpers in an anonymous
// namespace, so the compiler sees them as it did when all families were one file.
//
// Values are tested ("!= 0" as "any magnitude bit set") and copied on their raw bits, so those kernels are
// bit-exact by construction for fp16 / bf16 / fp32 / fp64; the sums (merge_rows, fill_sum) add, and
// fill_sum divides, the way torch does.
#pragma once

// Lean includes (not torch/extension.h): they halve the build time.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/zeros.h>

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#if defined(__x86_64__)
#include <immintrin.h>
#elif defined(__SSE2__)
#include <emmintrin.h>
#endif

#include <algorithm>
#include <climits>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <optional>
#include <tuple>
#include <type_traits>
#include <span>
#include <vector>

#include "zen_common.h"

namespace zen::cpu {

using at::Tensor;
using zen::Family;

// The checks and dispatch of zen_common.h, for CPU tensors.
constexpr c10::DeviceType kDevice = c10::DeviceType::CPU;
using zen::as_rows;
using zen::check_payload;
using zen::family_of;
using zen::with_bits;
using zen::with_index;

// ---------------------------------------------------------------------------------------------------
// Work splitting: ordered chunks for at::parallel_for, prefix sums, partition-major cursors.

constexpr int64_t kGrain = 1 << 15;  // smallest unit of work worth a task (rows, slots or bytes)

// Splits `work` items into ordered chunks (a few per thread) so that per-chunk results concatenate in
// order: outputs stay deterministic and ascending whatever the thread count.
struct Chunks {
  int64_t count, step, work;
  Chunks(int64_t work_, int64_t grain) : work(work_) {
    const int64_t threads = std::max<int64_t>(1, at::get_num_threads());
    count = std::max<int64_t>(1, std::min<int64_t>((work + grain - 1) / grain, threads * 4));
    step = (work + count - 1) / count;
    if (step == 0) step = 1;
  }
  int64_t lo(int64_t c) const { return std::min(work, c * step); }
  int64_t hi(int64_t c) const { return std::min(work, (c + 1) * step); }
  template <typename F>
  void run(F f) const {
    at::parallel_for(0, count, 1, [&](int64_t b, int64_t e) {
      for (int64_t c = b; c < e; ++c) f(c, lo(c), hi(c));
    });
  }
};

// Exclusive prefix sum in place; returns the total.
inline int64_t exclusive_scan(std::vector<int64_t>& v) {
  int64_t acc = 0;
  for (auto& x : v) {
    const int64_t t = x;
    x = acc;
    acc += t;
  }
  return acc;
}

// Stable partition-major placement from per-chunk histograms hist[c * n + p]: returns the first output
// slot of (chunk c, partition p) at [c * n + p] = rows of partitions < p + rows of p in chunks < c, and
// sets offsets[p] = first slot of partition p (offsets[n] = total).
inline std::vector<int64_t> chunk_cursors(const std::vector<int64_t>& hist, int64_t chunks, int64_t n,
                                          std::vector<int64_t>& offsets) {
  std::vector<int64_t> cursor(chunks * n);
  int64_t acc = 0;
  for (int64_t p = 0; p < n; ++p) {
    offsets[p] = acc;
    for (int64_t c = 0; c < chunks; ++c) {
      cursor[c * n + p] = acc;
      acc += hist[c * n + p];
    }
  }
  offsets[n] = acc;
  return cursor;
}

// Whether a row of D raw values has a magnitude bit set (is non-zero).
template <typename Bits>
inline bool row_nonzero(const Bits* row, int64_t D, Bits mask) {
  Bits acc = 0;
  for (int64_t j = 0; j < D; ++j) acc |= row[j];
  return (acc & mask) != 0;
}

// dst[0, bytes) := src: non-temporal stores for the whole 64-byte lines of dst, plain stores at the ends.
inline void stream_block(char* dst, const char* src, int64_t bytes) {
#if defined(__AVX512F__) || defined(__SSE2__)
#if defined(__AVX512F__)
  constexpr int64_t kVec = 64;
#else
  constexpr int64_t kVec = 16;
#endif
  const int64_t head = std::min<int64_t>(bytes, (-reinterpret_cast<intptr_t>(dst)) & 63);
  const int64_t body = (bytes - head) / 64 * 64;
  std::memcpy(dst, src, head);
  for (int64_t b = head; b < head + body; b += kVec) {
#if defined(__AVX512F__)
    _mm512_stream_si512(reinterpret_cast<__m512i*>(dst + b), _mm512_loadu_si512(src + b));
#else
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + b), _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + b)));
#endif
  }
  std::memcpy(dst + head + body, src + head + body, bytes - head - body);
#else
  std::memcpy(dst, src, bytes);
#endif
}

#if defined(__AVX512F__)
// The first `left` of 16 lanes (all 16 from 16 on, none from 0 down): a block's rows before an array's end.
inline __mmask16 first_lanes(int64_t left) {
  return static_cast<__mmask16>(left >= 16 ? 0xFFFF : left > 0 ? (1u << left) - 1 : 0);
}

// The vector merge of zen_cpu_merge.cpp, which the hash-bitmap aggregate (zen_cpu_bitmap.cpp) also runs.
// Whether ids [0, n) ascend strictly and stay below the merge's end marker (INT32_MAX).
bool strictly_ascending(const int32_t* id, int64_t n);
// The union of a[0, na) and b[0, nb) (int32 ids, one float32 each) into io / vo; returns its rows.
int64_t merge_flat_simd(const int32_t* ia, const float* va, int64_t na, const int32_t* ib, const float* vb, int64_t nb,
                        int32_t* io, float* vo);
#endif

// ---------------------------------------------------------------------------------------------------
// The entry points (zen_cpu_binding.cpp binds them; zen.native calls them), by family.

// zen_cpu_scan.cpp
std::tuple<Tensor, Tensor> nonzero_rows(const Tensor& dense_in);
// zen_cpu_hash.cpp
std::tuple<Tensor, Tensor, int64_t> hierarchical_hash(const Tensor& index_in, int64_t n, std::vector<int64_t> a,
                                                      std::vector<int64_t> b, int64_t r1, int64_t r2);
std::tuple<Tensor, Tensor, Tensor> partition_rows(const Tensor& index_in, const Tensor& values_in, int64_t n,
                                                  std::vector<int64_t> a, std::vector<int64_t> b, bool narrow);
std::tuple<Tensor, Tensor> server_rows(int64_t num_rows, int64_t n, std::vector<int64_t> a, std::vector<int64_t> b,
                                       bool wide);
Tensor hash_values(const Tensor& index_in, std::vector<int64_t> a, std::vector<int64_t> b);
// zen_cpu_bitmap.cpp
std::tuple<Tensor, Tensor> encode_hash_bitmap(const Tensor& out_in, const Tensor& members_in);
Tensor decode_hash_bitmap(const Tensor& payload_in, const Tensor& members_in);
void scatter_hash_bitmap(Tensor& out, const Tensor& payload_in, const Tensor& members_in, const Tensor& values_in);
std::tuple<Tensor, Tensor> aggregate_hash_bitmap(const std::vector<Tensor>& ids_in, const std::vector<Tensor>& values_in,
                                                 const Tensor& words_in, int64_t num_rows);
// zen_cpu_pull.cpp
void fill_hash_bitmap(Tensor& out, const std::vector<Tensor>& payloads_in, const std::vector<Tensor>& values_in,
                      const Tensor& bits_in, int64_t divisor);
// zen_cpu_merge.cpp
std::tuple<Tensor, Tensor> merge_rows(const Tensor& a_idx_in, const Tensor& a_val_in, const Tensor& b_idx_in,
                                      const Tensor& b_val_in, const std::optional<Tensor>& room_idx,
                                      const std::optional<Tensor>& room_val);
// zen_cpu_write.cpp
std::tuple<Tensor, Tensor, Tensor> split_interleaved(const Tensor& ids_in, const Tensor& values_in, int64_t k);
void put_rows(Tensor& out, const Tensor& ids_in, const Tensor& values_in);
void fill_sum(Tensor& out, const std::vector<Tensor>& ids_in, const std::vector<Tensor>& values_in,
              int64_t divisor, int64_t stride, std::vector<int64_t> offsets);
// zen_cpu_sweep.cpp
std::tuple<Tensor, Tensor> sweep_threshold(Tensor& res, const Tensor& src, Tensor& out, double threshold,
                                           bool strict);
std::tuple<Tensor, Tensor> trim_largest(Tensor& res, Tensor& out, const Tensor& ids, const Tensor& values,
                                        int64_t k);
// zen_cpu_gaps.cpp
Tensor encode_gaps(const Tensor& ids_in, const std::optional<Tensor>& room);
Tensor decode_gaps(const Tensor& codes_in, int64_t count, int64_t rows, const Tensor& like);

}  // namespace zen::cpu
