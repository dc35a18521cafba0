// CPU kernels (ATen + at::parallel_for) for the hot paths of Zen: non-zero row extraction, hierarchical
// hashing (paper section 3, Algorithm 1), S_j = the rows h0 maps to each server, the hash-bitmap pull
// encoding (section 4, Algorithm 2) with BP's CPU server and pull in one pass each, and the row-set work
// around them: HC's merge of two sorted unions, a checked scatter, and the streamed write of a dense result;
// the gap coding of HC's ids; and a sparsifier's threshold sweep.
//
// Values are tested ("!= 0" as "any magnitude bit set") and copied on their raw bits, so those kernels are
// bit-exact by construction for fp16 / bf16 / fp32 / fp64; the sums (merge_rows, fill_sum) add, and
// fill_sum divides, the way torch does.

// Lean includes (not torch/extension.h): they halve the build time.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/zeros.h>
#include <torch/csrc/utils/pybind.h>

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

namespace {

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

constexpr int64_t kGrain = 1 << 15;         // smallest unit of work worth a task (rows, slots or bytes)
constexpr int64_t kPrefetchBytes = 4096;  // how far ahead the flat scan prefetches

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
int64_t exclusive_scan(std::vector<int64_t>& v) {
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
std::vector<int64_t> chunk_cursors(const std::vector<int64_t>& hist, int64_t chunks, int64_t n,
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

// ---------------------------------------------------------------------------------------------------
// Flat scan (D == 1): one bitmask word per 64 elements, bit e set iff element 64 w + e has a magnitude bit
// set. The extension is built with -march=native for the machine it runs on (zen/native/build.py keys the
// build by CPU), so AVX-512 tests a 64-byte line per instruction where the CPU has it; SSE2 and plain C++
// give the same words elsewhere.

#if defined(__AVX512BW__)
template <typename Bits>
inline uint64_t mask_word(const Bits* p) {
  __m512i mag;
  if constexpr (sizeof(Bits) == 2) mag = _mm512_set1_epi16(0x7FFF);
  else if constexpr (sizeof(Bits) == 4) mag = _mm512_set1_epi32(0x7FFFFFFF);
  else mag = _mm512_set1_epi64(0x7FFFFFFFFFFFFFFFLL);
  uint64_t m = 0;
  for (size_t l = 0; l < sizeof(Bits); ++l) {  // 64 elements = sizeof(Bits) lines of 64 bytes
    const __m512i x = _mm512_loadu_si512(reinterpret_cast<const char*>(p) + 64 * l);
    if constexpr (sizeof(Bits) == 2) m |= static_cast<uint64_t>(_mm512_test_epi16_mask(x, mag)) << (32 * l);
    else if constexpr (sizeof(Bits) == 4) m |= static_cast<uint64_t>(_mm512_test_epi32_mask(x, mag)) << (16 * l);
    else m |= static_cast<uint64_t>(_mm512_test_epi64_mask(x, mag)) << (8 * l);
  }
  return m;
}
#elif defined(__SSE2__)
template <typename Bits>
inline __m128i magnitude_vector() {
  if constexpr (sizeof(Bits) == 2) return _mm_set1_epi16(0x7FFF);
  else if constexpr (sizeof(Bits) == 4) return _mm_set1_epi32(0x7FFFFFFF);
  else return _mm_set1_epi64x(0x7FFFFFFFFFFFFFFFLL);
}

// Zero-element bits of the 16 bytes at q (one bit per element).
template <typename Bits>
inline uint32_t zero_bits(const __m128i* q) {
  const __m128i x = _mm_and_si128(_mm_loadu_si128(q), magnitude_vector<Bits>());
  const __m128i zero = _mm_setzero_si128();
  if constexpr (sizeof(Bits) == 2) {
    const __m128i z = _mm_cmpeq_epi16(x, zero);
    return static_cast<uint32_t>(_mm_movemask_epi8(_mm_packs_epi16(z, z))) & 0xFFu;
  } else if constexpr (sizeof(Bits) == 4) {
    return static_cast<uint32_t>(_mm_movemask_ps(_mm_castsi128_ps(_mm_cmpeq_epi32(x, zero))));
  } else {  // no 64-bit compare in SSE2: an element is zero iff both of its 32-bit halves are
    const __m128i z = _mm_cmpeq_epi32(x, zero);
    const __m128i both = _mm_and_si128(z, _mm_shuffle_epi32(z, _MM_SHUFFLE(2, 3, 0, 1)));
    return static_cast<uint32_t>(_mm_movemask_pd(_mm_castsi128_pd(both)));
  }
}

template <typename Bits>
inline uint64_t mask_word(const Bits* p) {
  constexpr int kPerVec = 16 / sizeof(Bits);
  const __m128i* q = reinterpret_cast<const __m128i*>(p);
  uint64_t m = 0;
  for (int v = 0; v < 64 / kPerVec; ++v)
    m |= static_cast<uint64_t>(~zero_bits<Bits>(q + v) & ((1u << kPerVec) - 1u)) << (v * kPerVec);
  return m;
}
#else
template <typename Bits>
inline uint64_t mask_word(const Bits* p) {
  uint64_t m = 0;
  for (int e = 0; e < 64; ++e) m |= static_cast<uint64_t>((p[e] & zen::magnitude_mask<Bits>()) != 0) << e;
  return m;
}
#endif

// A chunk's non-zeros, in ascending order: element ids and their values (raw bits).
template <typename Bits>
struct Found {
  std::vector<int64_t> ids;
  std::vector<Bits> values;
  int64_t size = 0;
  // Room for `more` entries past size.
  void reserve(int64_t more) {
    if (size + more > static_cast<int64_t>(ids.size())) {
      const size_t cap = std::max<size_t>(2 * ids.size(), std::max<int64_t>(size + more, 1 << 12));
      ids.resize(cap);
      values.resize(cap);
    }
  }
};

constexpr int64_t kWordsPerReserve = 64;

// Full words [lo, hi) of data: every non-zero goes to `found` while its line is still in L1. The
// prefetch a few KB ahead keeps more loads in flight than the hardware prefetcher does on its own.
// A word's first two set bits are written unconditionally (the count advances by whether they exist) and
// only a third starts a loop: at 1-2% density a word holds 0, 1 or 2 non-zeros, and a loop whose trip
// count is that random mispredicts on most words (2.7-2.8 vs 2.9-3.2 ms for 2^24 fp32 at 1%).
template <typename Bits>
void scan_words(const Bits* data, int64_t lo, int64_t hi, Found<Bits>& found) {
  for (int64_t w0 = lo; w0 < hi; w0 += kWordsPerReserve) {
    const int64_t w1 = std::min(hi, w0 + kWordsPerReserve);
    found.reserve((w1 - w0) * 64);
    int64_t* id = found.ids.data();
    Bits* v = found.values.data();
    int64_t n = found.size;
    for (int64_t w = w0; w < w1; ++w) {
      const Bits* p = data + w * 64;
      for (size_t l = 0; l < sizeof(Bits); ++l)
        __builtin_prefetch(reinterpret_cast<const char*>(p) + kPrefetchBytes + 64 * l);
      uint64_t m = mask_word(p);
      const int64_t first = w * 64;
      for (int u = 0; u < 2; ++u) {  // bit 63 stands in when m is empty: written, not counted
        const int e = __builtin_ctzll(m | (1ULL << 63));
        id[n] = first + e;
        v[n] = p[e];
        n += m != 0;
        m &= m - 1;
      }
      for (; m; m &= m - 1) {
        const int e = __builtin_ctzll(m);
        id[n] = first + e;
        v[n++] = p[e];
      }
    }
    found.size = n;
  }
}

template <typename Bits>
inline bool row_nonzero(const Bits* row, int64_t D, Bits mask) {
  Bits acc = 0;
  for (int64_t j = 0; j < D; ++j) acc |= row[j];
  return (acc & mask) != 0;
}

// ---------------------------------------------------------------------------------------------------
// Non-zero rows of a dense (M, D) block: ascending row ids (int64) and their rows; equals
// mask.nonzero() + index_select of LocalGrad.rows().
//
// D == 1 (a flat gradient): ONE read of the data, 64 elements at a time; each chunk appends its non-zeros
// (ids and values, taken while the line is in L1) to a buffer that the calling thread keeps across calls
// (no fresh pages on the hot path), then the buffers are copied into the exactly sized outputs.
// D > 1: rows are tested and copied per chunk, then concatenated.

template <typename Bits>
std::vector<Found<Bits>>& found_buffers(int64_t chunks) {
  thread_local std::vector<Found<Bits>> buffers;
  if (static_cast<int64_t>(buffers.size()) < chunks) buffers.resize(chunks);
  return buffers;
}

template <typename Bits>
std::tuple<Tensor, Tensor> nonzero_flat(const Tensor& dense) {
  const int64_t M = dense.size(0), full = M / 64, nwords = (M + 63) / 64;
  const Bits* data = static_cast<const Bits*>(dense.data_ptr());
  const Chunks chunks(nwords, kGrain);
  std::vector<Found<Bits>>& found = found_buffers<Bits>(chunks.count);
  chunks.run([&](int64_t c, int64_t lo, int64_t hi) {
    Found<Bits>& mine = found[c];
    mine.size = 0;
    const int64_t top = std::min(hi, full);
    scan_words(data, lo, top, mine);
    if (hi > full) {  // the last, partial word
      uint64_t m = 0;
      for (int64_t i = full * 64; i < M; ++i)
        m |= static_cast<uint64_t>((data[i] & zen::magnitude_mask<Bits>()) != 0) << (i - full * 64);
      mine.reserve(64);
      for (; m; m &= m - 1) {
        const int e = __builtin_ctzll(m);
        mine.ids[mine.size] = full * 64 + e;
        mine.values[mine.size++] = data[full * 64 + e];
      }
    }
  });
  std::vector<int64_t> base(chunks.count);
  for (int64_t c = 0; c < chunks.count; ++c) base[c] = found[c].size;
  const int64_t k = exclusive_scan(base);
  Tensor index = at::empty({k}, dense.options().dtype(at::kLong));
  Tensor values = at::empty({k, 1}, dense.options());
  int64_t* iout = index.data_ptr<int64_t>();
  Bits* vout = static_cast<Bits*>(values.data_ptr());
  chunks.run([&](int64_t c, int64_t, int64_t) {
    std::memcpy(iout + base[c], found[c].ids.data(), found[c].size * sizeof(int64_t));
    std::memcpy(vout + base[c], found[c].values.data(), found[c].size * sizeof(Bits));
  });
  return std::make_tuple(index, values);
}

std::tuple<Tensor, Tensor> nonzero_rows(const Tensor& dense_in) {
  const Tensor dense = as_rows<kDevice>(dense_in);
  const int64_t M = dense.size(0), D = dense.size(1);
  return with_bits<kDevice>(dense, [&](auto tag) {
    using Bits = decltype(tag);
    if (D == 1) return nonzero_flat<Bits>(dense);
    const Bits* data = static_cast<const Bits*>(dense.data_ptr());
    const Bits mask = zen::magnitude_mask<Bits>();
    const Chunks chunks(M, std::max<int64_t>(1, (kGrain * 8) / std::max<int64_t>(D, 1)));
    std::vector<std::vector<int64_t>> rows(chunks.count);
    std::vector<std::vector<Bits>> vals(chunks.count);
    chunks.run([&](int64_t c, int64_t lo, int64_t hi) {
      for (int64_t r = lo; r < hi; ++r) {
        const Bits* row = data + r * D;
        if (row_nonzero(row, D, mask)) {
          rows[c].push_back(r);
          vals[c].insert(vals[c].end(), row, row + D);
        }
      }
    });
    std::vector<int64_t> base(chunks.count);
    for (int64_t c = 0; c < chunks.count; ++c) base[c] = static_cast<int64_t>(rows[c].size());
    const int64_t k = exclusive_scan(base);
    Tensor index = at::empty({k}, dense.options().dtype(at::kLong));
    Tensor values = at::empty({k, D}, dense.options());
    int64_t* iout = index.data_ptr<int64_t>();
    Bits* vout = static_cast<Bits*>(values.data_ptr());
    at::parallel_for(0, chunks.count, 1, [&](int64_t b, int64_t e) {
      for (int64_t c = b; c < e; ++c) {
        if (rows[c].empty()) continue;
        std::memcpy(iout + base[c], rows[c].data(), rows[c].size() * sizeof(int64_t));
        std::memcpy(vout + base[c] * D, vals[c].data(), vals[c].size() * sizeof(Bits));
      }
    });
    return std::make_tuple(index, values);
  });
}

// ---------------------------------------------------------------------------------------------------
// Hierarchical hashing (Algorithm 1). Memory: n partitions, each r1 parallel slots followed by r2 serial
// slots; a slot holds position + 1 (0 = empty, so index 0 is safe). Every index: p = h0(idx), then up to
// k probes h_l(idx) in p's parallel region, else an append to p's serial region, else (serial region
// full) an append to p's overflow list: never dropped. Returns (order, counts, serial): positions into
// `index` grouped by partition (order inside a partition is free), rows per partition, and how many rows
// missed all k probes.
//
// A CPU has a few cores, not thousands of threads, so instead of claiming slots of one shared table with
// compare-and-swap (the CUDA kernel's way), the indices are first grouped by partition (a stable counting
// sort by h0), and each thread then runs the probes of whole partitions: its partition's table (r1 + r2
// slots, cache-sized) is private, every claim is a plain load and store, and the claimed slots are
// compacted straight into the partition's place in the output. Same partitions, and the claims of the
// parallel algorithm run in position order (one valid outcome of its race).

// Step 1: p = h0(idx) of every position (part) and, per chunk of positions, how many map to each partition
// (hist[c * n + p]).
template <typename Idx>
std::vector<int64_t> partition_histogram(const Idx* idx, const Chunks& chunks, int64_t n, const Family& f,
                                         std::vector<uint32_t>& part) {
  const uint32_t un = static_cast<uint32_t>(n);
  std::vector<int64_t> hist(chunks.count * n, 0);
  chunks.run([&](int64_t c, int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) part[i] = zen::partition_of(static_cast<uint64_t>(idx[i]), f, un);  // SIMD
    int64_t* h = hist.data() + c * n;
    for (int64_t i = lo; i < hi; ++i) ++h[part[i]];
  });
  return hist;
}

// The positions of `index` grouped by partition: partition p holds [offsets[p], offsets[p + 1]) of pos and
// keys, ascending inside a partition (the probes read them in order).
struct Grouped {
  std::vector<int64_t> offsets;
  std::vector<uint32_t> pos;   // positions into `index`
  std::vector<uint32_t> keys;  // their indices' low 32 bits: all that hash32 reads
};

// Step 2: a stable counting sort of the positions by partition, from the histogram of step 1.
template <typename Idx>
Grouped group_by_partition(const Idx* idx, int64_t nnz, int64_t n, const Family& f) {
  const Chunks chunks(nnz, kGrain / 4);
  std::vector<uint32_t> part(nnz);
  const std::vector<int64_t> hist = partition_histogram(idx, chunks, n, f, part);
  Grouped g{std::vector<int64_t>(n + 1, 0), std::vector<uint32_t>(nnz), std::vector<uint32_t>(nnz)};
  std::vector<int64_t> cursor = chunk_cursors(hist, chunks.count, n, g.offsets);
  chunks.run([&](int64_t c, int64_t lo, int64_t hi) {
    int64_t* cur = cursor.data() + c * n;
    for (int64_t i = lo; i < hi; ++i) {
      const int64_t slot = cur[part[i]]++;
      g.pos[slot] = static_cast<uint32_t>(i);
      g.keys[slot] = static_cast<uint32_t>(idx[i]);
    }
  });
  return g;
}

// Step 3, one thread's private memory for one partition at a time: r1 parallel slots, r2 serial slots and a
// dummy slot that takes the writes of rows placing nothing; `missed` lists the rows that missed all k probes.
struct PartitionTable {
  int64_t r1, r2;
  std::vector<uint32_t> slots;
  std::vector<int64_t> scratch;
  std::vector<uint32_t> missed;

  PartitionTable(int64_t r1_, int64_t r2_) : r1(r1_), r2(r2_), slots(r1_ + r2_ + 1), scratch(r1_ + 1) {}

  // Claims slots for a partition's rows (positions pos, indices keys) in position order, each trying its k
  // probes before the next row (as one thread of the parallel algorithm would), without a branch to
  // mispredict: every probe's slot is read, the first free one (or the dummy slot) gets the write, and only
  // the rare rows that missed all k probes branch.
  void claim(const uint32_t* pos, const uint32_t* keys, int64_t rows, const Family& f) {
    uint32_t* table = slots.data();
    const uint64_t range = static_cast<uint64_t>(r1), dummy = static_cast<uint64_t>(r1 + r2);
    std::fill(slots.begin(), slots.end(), 0u);
    missed.clear();
    for (int64_t j = 0; j < rows; ++j) {
      const uint64_t x = static_cast<uint64_t>(keys[j]);
      uint64_t target = dummy;
      for (int l = f.levels - 1; l >= 1; --l) {
        const uint64_t s = zen::reduce(zen::hash32(x, f, l), range);
        target = table[s] == 0 ? s : target;
      }
      table[target] = pos[j] + 1;
      if (target == dummy) missed.push_back(pos[j]);
    }
  }

  // Writes the claimed positions to dst: the parallel region, then the serial region, then the overflow
  // (missed rows past the r2 serial slots). Returns how many it wrote.
  int64_t emit(int64_t* dst) {
    uint32_t* table = slots.data();
    const int64_t r1 = this->r1, r2 = this->r2;  // locals: the int64 stores to dst cannot alias them
    const int64_t fill = static_cast<int64_t>(missed.size());
    for (int64_t t = 0; t < std::min(fill, r2); ++t) table[r1 + t] = missed[t] + 1;
    int64_t m = 0;
    for (int64_t s = 0; s < r1; ++s) {  // branch-free compaction of the ~half-full parallel region
      const uint32_t v = table[s];
      scratch[m] = static_cast<int64_t>(v) - 1;
      m += v != 0;
    }
    std::memcpy(dst, scratch.data(), m * sizeof(int64_t));
    for (int64_t t = 0; t < std::min(fill, r2); ++t) dst[m++] = static_cast<int64_t>(table[r1 + t]) - 1;
    for (int64_t t = r2; t < fill; ++t) dst[m++] = missed[t];
    return m;
  }
};

template <typename Idx>
std::tuple<Tensor, Tensor, int64_t> hash_impl(const Tensor& index, int64_t n, const Family& f, int64_t r1,
                                               int64_t r2) {
  const int64_t nnz = index.numel();
  const Grouped g = group_by_partition(index.data_ptr<Idx>(), nnz, n, f);
  Tensor order = at::empty({nnz}, index.options().dtype(at::kLong));
  int64_t* out = order.data_ptr<int64_t>();
  std::vector<int64_t> missed(n, 0);
  at::parallel_for(0, n, 1, [&](int64_t b, int64_t e) {
    PartitionTable table(r1, r2);
    for (int64_t p = b; p < e; ++p) {
      const int64_t first = g.offsets[p], rows = g.offsets[p + 1] - first;
      table.claim(g.pos.data() + first, g.keys.data() + first, rows, f);
      const int64_t written = table.emit(out + first);
      TORCH_CHECK(written == rows, "zen native: partition ", p, " lost rows (", written, " of ", rows, ")");
      missed[p] = static_cast<int64_t>(table.missed.size());
    }
  });
  Tensor counts_t = at::empty({n}, at::kLong);
  int64_t serial = 0;
  for (int64_t p = 0; p < n; ++p) {
    counts_t.data_ptr<int64_t>()[p] = g.offsets[p + 1] - g.offsets[p];
    serial += missed[p];
  }
  return std::make_tuple(order, counts_t, serial);
}

std::tuple<Tensor, Tensor, int64_t> hierarchical_hash(const Tensor& index_in, int64_t n, std::vector<int64_t> a,
                                                      std::vector<int64_t> b, int64_t r1, int64_t r2) {
  TORCH_CHECK(index_in.dim() == 1 && index_in.device().is_cpu(), "zen native: index must be a 1-D CPU tensor");
  TORCH_CHECK(n >= 1 && r1 >= 1 && r2 >= 1, "zen native: need n, r1, r2 >= 1");
  TORCH_CHECK(index_in.numel() < (int64_t{1} << 32) - 1, "zen native: too many indices for 32-bit slots");
  const Family f = family_of<kDevice>(a, b);
  const Tensor index = index_in.contiguous();
  if (index.numel() == 0)
    return std::make_tuple(at::empty({0}, index.options().dtype(at::kLong)), at::zeros({n}, at::kLong),
                           int64_t{0});
  return with_index<kDevice>(index, [&](auto tag) { return hash_impl<decltype(tag)>(index, n, f, r1, r2); });
}

#if defined(__AVX512F__)
// The first `left` of 16 lanes (all 16 from 16 on, none from 0 down): a block's rows before an array's end.
inline __mmask16 first_lanes(int64_t left) {
  return static_cast<__mmask16>(left >= 16 ? 0xFFFF : left > 0 ? (1u << left) - 1 : 0);
}

// zen::partition_of of 16 ids' low 32 bits at once, lane for lane (the multiply-shift's high half by 32-bit lane
// pairs).
inline __m512i partitions16(__m512i x, const Family& f, __m512i servers) {
  __m512i h = _mm512_add_epi32(_mm512_mullo_epi32(x, _mm512_set1_epi32(static_cast<int32_t>(f.a[0]))),
                               _mm512_set1_epi32(static_cast<int32_t>(f.b[0])));
  h = _mm512_xor_si512(h, _mm512_srli_epi32(h, 16));
  h = _mm512_mullo_epi32(h, _mm512_set1_epi32(static_cast<int32_t>(zen::kFmixMul1)));
  h = _mm512_xor_si512(h, _mm512_srli_epi32(h, 13));
  h = _mm512_mullo_epi32(h, _mm512_set1_epi32(static_cast<int32_t>(zen::kFmixMul2)));
  h = _mm512_xor_si512(h, _mm512_srli_epi32(h, 16));
  const __m512i even = _mm512_srli_epi64(_mm512_mul_epu32(h, servers), 32);
  const __m512i odd = _mm512_mul_epu32(_mm512_srli_epi64(h, 32), servers);  // high halves already in odd lanes
  return _mm512_mask_mov_epi32(even, 0xAAAA, odd);
}

// Ids [i, i + 16) of idx below `end`, as 32-bit lanes (their low 32 bits), zero past the end.
template <typename Idx>
inline __m512i load_ids16(const Idx* idx, int64_t i, int64_t end) {
  const __mmask16 mask = first_lanes(end - i);
  if constexpr (sizeof(Idx) == 4) {
    return _mm512_maskz_loadu_epi32(mask, idx + i);
  } else {
    const __m256i lo = _mm512_cvtepi64_epi32(_mm512_maskz_loadu_epi64(static_cast<__mmask8>(mask), idx + i));
    const __m256i hi = _mm512_cvtepi64_epi32(_mm512_maskz_loadu_epi64(static_cast<__mmask8>(mask >> 8), idx + i + 8));
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
  }
}

// group_rows for rows of one 32-bit value and int32 wire ids, up to 16 servers: 16 rows at a time, each
// server's rows of the 16 compressed in registers and stored behind its cursor (a compressing store to memory is
// microcoded on Zen 4), with no per-row dependency through the cursors (0.67 ms for 167k rows in 4 groups, 0.26
// here). Histogram and placing both hash, where keeping the partitions would write and read 4 bytes a row.
template <typename Idx>
void group_rows_flat(const Idx* idx, const uint32_t* src, int32_t* ids, uint32_t* dst, int64_t nnz, int64_t n,
                     const Family& f, std::vector<int64_t>& offsets) {
  const Chunks chunks(nnz, kGrain / 4);
  const __m512i servers = _mm512_set1_epi64(n);
  std::vector<int64_t> hist(chunks.count * n, 0);
  chunks.run([&](int64_t c, int64_t lo, int64_t hi) {
    int64_t* h = hist.data() + c * n;
    for (int64_t i = lo; i < hi; i += 16) {
      const __mmask16 valid = first_lanes(hi - i);
      const __m512i part = partitions16(load_ids16(idx, i, hi), f, servers);
      for (int64_t j = 0; j < n; ++j)
        h[j] += __builtin_popcount(_mm512_mask_cmpeq_epi32_mask(valid, part, _mm512_set1_epi32(static_cast<int32_t>(j))));
    }
  });
  std::vector<int64_t> cursor = chunk_cursors(hist, chunks.count, n, offsets);
  chunks.run([&](int64_t c, int64_t lo, int64_t hi) {
    int64_t* cur = cursor.data() + c * n;
    for (int64_t i = lo; i < hi; i += 16) {
      const __mmask16 valid = first_lanes(hi - i);
      const __m512i id = load_ids16(idx, i, hi);
      const __m512i value = _mm512_maskz_loadu_epi32(valid, src + i);
      const __m512i part = partitions16(id, f, servers);
      for (int64_t j = 0; j < n; ++j) {
        const __mmask16 mine = _mm512_mask_cmpeq_epi32_mask(valid, part, _mm512_set1_epi32(static_cast<int32_t>(j)));
        if (!mine) continue;
        const int k = __builtin_popcount(mine);
        const __mmask16 first = first_lanes(k);
        _mm512_mask_storeu_epi32(ids + cur[j], first, _mm512_maskz_compress_epi32(mine, id));
        _mm512_mask_storeu_epi32(dst + cur[j], first, _mm512_maskz_compress_epi32(mine, value));
        cur[j] += k;
      }
    }
  });
}
#endif

// BP's push on the CPU (Algorithm 1's outcome without its slot claims): the rows grouped by server h0(id),
// in input order inside a server, the ids narrowed to the wire's type and the values moved with them, in one
// stable counting sort. The k probes of Algorithm 1 only order the rows inside a partition, which no server
// reads: a few cores need no collision-free slots to write the partitions in parallel (the CUDA kernel does).
template <typename Idx, typename Out, typename Bits>
void group_rows(const Idx* idx, const Bits* src, Out* ids, Bits* dst, int64_t nnz, int64_t D, int64_t n,
                const Family& f, std::vector<int64_t>& offsets) {
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<Out, int32_t> && sizeof(Bits) == 4) {
    if (D == 1 && n <= 16) {
      group_rows_flat(idx, reinterpret_cast<const uint32_t*>(src), ids, reinterpret_cast<uint32_t*>(dst), nnz, n, f,
                      offsets);
      return;
    }
  }
#endif
  const Chunks chunks(nnz, kGrain / 4);
  std::vector<uint32_t> part(nnz);
  const std::vector<int64_t> hist = partition_histogram(idx, chunks, n, f, part);
  std::vector<int64_t> cursor = chunk_cursors(hist, chunks.count, n, offsets);
  chunks.run([&](int64_t c, int64_t lo, int64_t hi) {
    int64_t* cur = cursor.data() + c * n;
    for (int64_t i = lo; i < hi; ++i) {
      const int64_t slot = cur[part[i]]++;
      ids[slot] = static_cast<Out>(idx[i]);
      if (D == 1) dst[slot] = src[i];
      else std::memcpy(dst + slot * D, src + i * D, D * sizeof(Bits));
    }
  });
}

std::tuple<Tensor, Tensor, Tensor> partition_rows(const Tensor& index_in, const Tensor& values_in, int64_t n,
                                                  std::vector<int64_t> a, std::vector<int64_t> b, bool narrow) {
  const Tensor index = index_in.contiguous(), values = values_in.contiguous();
  TORCH_CHECK(index.dim() == 1 && index.device().is_cpu() && values.device().is_cpu() && values.dim() == 2 &&
                  values.size(0) == index.numel(),
              "zen native: partition_rows needs a 1-D CPU index and (nnz, D) CPU values");
  TORCH_CHECK(n >= 1 && n < (int64_t{1} << 31), "zen native: need 1 <= n < 2^31 servers");
  const Family f = family_of<kDevice>(a, b);
  const int64_t nnz = index.numel(), D = values.size(1);
  Tensor ids = at::empty({nnz}, index.options().dtype(narrow ? at::kInt : at::kLong));
  Tensor rows = at::empty_like(values);
  std::vector<int64_t> offsets(n + 1, 0);
  with_index<kDevice>(index, [&](auto itag) {
    using Idx = decltype(itag);
    with_bits<kDevice>(values, [&](auto btag) {
      using Bits = decltype(btag);
      const auto* src = static_cast<const Bits*>(values.data_ptr());
      auto* dst = static_cast<Bits*>(rows.data_ptr());
      if (narrow) group_rows(index.data_ptr<Idx>(), src, ids.data_ptr<int32_t>(), dst, nnz, D, n, f, offsets);
      else group_rows(index.data_ptr<Idx>(), src, ids.data_ptr<int64_t>(), dst, nnz, D, n, f, offsets);
    });
  });
  Tensor counts = at::empty({n}, at::kLong);
  for (int64_t p = 0; p < n; ++p) counts.data_ptr<int64_t>()[p] = offsets[p + 1] - offsets[p];
  return std::make_tuple(ids, rows, counts);
}

// ---------------------------------------------------------------------------------------------------
// S_j for all servers: rows 0..M-1 grouped by h0, ascending inside each group (a stable counting sort,
// identical to the reference's stable sort). Returns (members, offsets[n + 1]).

template <typename Idx>
Tensor server_rows_impl(int64_t M, int64_t n, const Family& f, std::vector<int64_t>& offsets) {
  const Chunks chunks(M, kGrain * 4);
  std::vector<int64_t> hist(chunks.count * n, 0);
  const uint32_t un = static_cast<uint32_t>(n);
  chunks.run([&](int64_t c, int64_t lo, int64_t hi) {
    int64_t* h = hist.data() + c * n;
    for (int64_t x = lo; x < hi; ++x) ++h[zen::partition_of(static_cast<uint64_t>(x), f, un)];
  });
  std::vector<int64_t> base = chunk_cursors(hist, chunks.count, n, offsets);
  Tensor members = at::empty({M}, at::TensorOptions().dtype(c10::CppTypeToScalarType<Idx>::value));
  Idx* out = members.data_ptr<Idx>();
  chunks.run([&](int64_t c, int64_t lo, int64_t hi) {
    int64_t* cur = base.data() + c * n;
    for (int64_t x = lo; x < hi; ++x) out[cur[zen::partition_of(static_cast<uint64_t>(x), f, un)]++] = static_cast<Idx>(x);
  });
  return members;
}

std::tuple<Tensor, Tensor> server_rows(int64_t num_rows, int64_t n, std::vector<int64_t> a, std::vector<int64_t> b,
                                       bool wide) {
  TORCH_CHECK(num_rows >= 0 && num_rows < (int64_t{1} << 32), "zen native: need 0 <= num_rows < 2^32");
  TORCH_CHECK(n >= 1, "zen native: need n >= 1");
  TORCH_CHECK(wide || num_rows < (int64_t{1} << 31), "zen native: int32 members need num_rows < 2^31");
  const Family f = family_of<kDevice>(a, b);
  std::vector<int64_t> offsets(n + 1, 0);
  Tensor members = wide ? server_rows_impl<int64_t>(num_rows, n, f, offsets)
                        : server_rows_impl<int32_t>(num_rows, n, f, offsets);
  Tensor off = at::empty({n + 1}, at::kLong);
  std::memcpy(off.data_ptr<int64_t>(), offsets.data(), (n + 1) * sizeof(int64_t));
  return std::make_tuple(members, off);
}

// ---------------------------------------------------------------------------------------------------
// Hash bitmap (Algorithm 2). Bit t (little-endian inside each byte) says whether row members[t] of the
// server's aggregated block is non-zero; the values of the set bits follow in order.

// Set bits of payload byte B, ignoring bits at positions >= L.
inline int popcount_byte(const uint8_t* bytes, int64_t B, int64_t L) {
  uint32_t v = bytes[B];
  const int64_t valid = L - B * 8;
  if (valid < 8) v &= (1u << valid) - 1u;
  return __builtin_popcount(v);
}

std::vector<int64_t> bitmap_chunk_bases(const uint8_t* bytes, const Chunks& chunks, int64_t L, int64_t* total) {
  std::vector<int64_t> base(chunks.count, 0);
  chunks.run([&](int64_t c, int64_t lo, int64_t hi) {
    int64_t s = 0;
    for (int64_t B = lo; B < hi; ++B) s += popcount_byte(bytes, B, L);
    base[c] = s;
  });
  *total = exclusive_scan(base);
  return base;
}

// Calls visit(t, rank) for every set bit t < L of bytes [lo, hi), rank counting from `rank`.
template <typename F>
inline void for_set_bits(const uint8_t* bytes, int64_t lo, int64_t hi, int64_t L, int64_t rank, F visit) {
  for (int64_t B = lo; B < hi; ++B) {
    uint32_t v = bytes[B];
    const int64_t valid = L - B * 8;
    if (valid < 8) v &= (1u << valid) - 1u;
    while (v) {
      visit(B * 8 + __builtin_ctz(v), rank++);
      v &= v - 1;
    }
  }
}

std::tuple<Tensor, Tensor> encode_hash_bitmap(const Tensor& out_in, const Tensor& members_in) {
  const Tensor out = as_rows<kDevice>(out_in);
  const Tensor members = members_in.contiguous();
  TORCH_CHECK(members.dim() == 1, "zen native: members must be 1-D");
  const int64_t L = members.numel(), D = out.size(1), nbytes = (L + 7) / 8;
  Tensor payload = at::empty({nbytes}, out.options().dtype(at::kByte));
  uint8_t* bytes = payload.data_ptr<uint8_t>();
  return with_bits<kDevice>(out, [&](auto btag) {
    using Bits = decltype(btag);
    return with_index<kDevice>(members, [&](auto itag) {
      using Idx = decltype(itag);
      const Bits* data = static_cast<const Bits*>(out.data_ptr());
      const Idx* rows = members.data_ptr<Idx>();
      const Bits mask = zen::magnitude_mask<Bits>();
      const Chunks chunks(nbytes, std::max<int64_t>(1, kGrain / 8 / std::max<int64_t>(D, 1)));
      chunks.run([&](int64_t, int64_t lo, int64_t hi) {
        for (int64_t B = lo; B < hi; ++B) {
          uint32_t v = 0;
          const int64_t end = std::min<int64_t>(8, L - B * 8);
          for (int64_t j = 0; j < end; ++j)
            v |= static_cast<uint32_t>(row_nonzero(data + static_cast<int64_t>(rows[B * 8 + j]) * D, D, mask)) << j;
          bytes[B] = static_cast<uint8_t>(v);
        }
      });
      int64_t total = 0;
      const std::vector<int64_t> base = bitmap_chunk_bases(bytes, chunks, L, &total);
      Tensor values = at::empty({total, D}, out.options());
      Bits* vout = static_cast<Bits*>(values.data_ptr());
      chunks.run([&](int64_t c, int64_t lo, int64_t hi) {
        for_set_bits(bytes, lo, hi, L, base[c], [&](int64_t t, int64_t r) {
          std::memcpy(vout + r * D, data + static_cast<int64_t>(rows[t]) * D, D * sizeof(Bits));
        });
      });
      return std::make_tuple(payload, values);
    });
  });
}

// Row ids of the received values: members[t] for every set bit t, in order.
Tensor decode_hash_bitmap(const Tensor& payload_in, const Tensor& members_in) {
  const Tensor payload = payload_in.contiguous();
  const Tensor members = members_in.contiguous();
  const int64_t L = members.numel();
  check_payload<kDevice>(payload, L);
  const uint8_t* bytes = payload.data_ptr<uint8_t>();
  const Chunks chunks(payload.numel(), kGrain * 8);  // 8 bits per byte, cheap work per byte
  int64_t total = 0;
  const std::vector<int64_t> base = bitmap_chunk_bases(bytes, chunks, L, &total);
  Tensor ids = at::empty({total}, members.options());
  with_index<kDevice>(members, [&](auto itag) {
    using Idx = decltype(itag);
    const Idx* rows = members.data_ptr<Idx>();
    Idx* dst = ids.data_ptr<Idx>();
    chunks.run([&](int64_t c, int64_t lo, int64_t hi) {
      for_set_bits(bytes, lo, hi, L, base[c], [&](int64_t t, int64_t r) { dst[r] = rows[t]; });
    });
    return 0;
  });
  return ids;
}

// Decode + scatter in one pass: out[members[t]] = values[rank of t] (put_rows without materialising ids).
void scatter_hash_bitmap(Tensor& out, const Tensor& payload_in, const Tensor& members_in, const Tensor& values_in) {
  TORCH_CHECK(out.dim() == 2 && out.is_contiguous() && out.device().is_cpu(),
              "zen native: out must be a contiguous (M, D) CPU tensor");
  const Tensor payload = payload_in.contiguous();
  const Tensor members = members_in.contiguous();
  const Tensor values = values_in.contiguous();
  const int64_t L = members.numel(), D = out.size(1);
  check_payload<kDevice>(payload, L);
  TORCH_CHECK(values.scalar_type() == out.scalar_type(), "zen native: values dtype ", values.scalar_type(),
              " != out dtype ", out.scalar_type());
  const uint8_t* bytes = payload.data_ptr<uint8_t>();
  const Chunks chunks(payload.numel(), std::max<int64_t>(1, kGrain * 8 / std::max<int64_t>(D, 1)));
  int64_t total = 0;
  const std::vector<int64_t> base = bitmap_chunk_bases(bytes, chunks, L, &total);
  TORCH_CHECK(values.numel() == total * D, "zen native: ", values.numel(), " values for ", total, " rows of width ",
              D);
  with_bits<kDevice>(out, [&](auto btag) {
    using Bits = decltype(btag);
    return with_index<kDevice>(members, [&](auto itag) {
      using Idx = decltype(itag);
      const Idx* rows = members.data_ptr<Idx>();
      const Bits* src = static_cast<const Bits*>(values.data_ptr());
      Bits* dst = static_cast<Bits*>(out.data_ptr());
      chunks.run([&](int64_t c, int64_t lo, int64_t hi) {
        for_set_bits(bytes, lo, hi, L, base[c], [&](int64_t t, int64_t r) {
          std::memcpy(dst + static_cast<int64_t>(rows[t]) * D, src + r * D, D * sizeof(Bits));
        });
      });
      return 0;
    });
  });
}

// ---------------------------------------------------------------------------------------------------
// Merge of two row sets (HC): merge_rows.

// Union of two row sets with ascending distinct ids (a step of hierarchical centralization): the ascending
// union of the ids, rows copied where an id is in one set and a + b where it is in both, added in the value
// type as torch adds it (fp16 / bf16 through float), so it equals the torch-op path bit for bit. One
// sequential pass over both inputs instead of scattered reads and writes into a dense buffer.
//
// A merge step depends on the one before (which input advances), so one merge runs at the latency of a
// load and a compare per row. kLanes merges of disjoint id ranges advance together instead (independent
// chains the CPU overlaps), each writing from its worst-case offset; the lanes are then packed.
constexpr int kLanes = 3;

// a + b if both, else whichever is taken, chosen with bit masks: a branch here is mispredicted half the time.
template <typename V>
inline V pick(V a, V b, bool take_a, bool take_b) {
  using Bits = std::conditional_t<sizeof(V) == 2, uint16_t, std::conditional_t<sizeof(V) == 4, uint32_t, uint64_t>>;
  const V sum = a + b;
  Bits ba, bb, bs;
  std::memcpy(&ba, &a, sizeof(V));
  std::memcpy(&bb, &b, sizeof(V));
  std::memcpy(&bs, &sum, sizeof(V));
  const Bits only_a = Bits(0) - Bits(take_a), both = Bits(0) - Bits(take_a & take_b);
  const Bits r = static_cast<Bits>((bs & both) | (((ba & only_a) | (bb & ~only_a)) & ~both));
  V out;
  std::memcpy(&out, &r, sizeof(V));
  return out;
}

template <typename Idx, typename V>
struct MergeLane {
  const Idx *ia, *ea, *ib, *eb;
  const V *va, *vb;
  Idx* io;
  V* vo;
  int64_t D;

  bool live() const { return ia < ea && ib < eb; }
  void step() {
    const Idx x = *ia, y = *ib;
    const bool take_a = x <= y, take_b = y <= x;
    *io++ = std::min(x, y);
    if (D == 1) {
      *vo++ = pick(*va, *vb, take_a, take_b);
    } else if (take_a && take_b) {
      for (int64_t d = 0; d < D; ++d) vo[d] = va[d] + vb[d];
      vo += D;
    } else {
      std::memcpy(vo, take_a ? va : vb, D * sizeof(V));
      vo += D;
    }
    ia += take_a, va += take_a * D;
    ib += take_b, vb += take_b * D;
  }
  void finish() {
    while (live()) step();
    for (; ia < ea; ++ia, va += D, vo += D) *io++ = *ia, std::memcpy(vo, va, D * sizeof(V));
    for (; ib < eb; ++ib, vb += D, vo += D) *io++ = *ib, std::memcpy(vo, vb, D * sizeof(V));
  }
};

// The lanes of a D == 1 merge, stepped together without a branch while every lane has rows left in both
// inputs. Each lane is three pointers (its next id of a and of b, its next output id), and a row's value sits
// at a fixed distance from its id where ids and values have one size (int32 and float32): no index is kept or
// scaled, so three lanes' pointers and the distances fit in registers (1.5 ms for 2 x 167k rows with indices
// spilled to the stack, 0.67 ms so).
template <typename Idx, typename V>
void merge_flat(MergeLane<Idx, V>* lanes) {
  const Idx *a0 = lanes[0].ia, *b0 = lanes[0].ib;
  const V *va = lanes[0].va, *vb = lanes[0].vb;
  Idx* o0 = lanes[0].io;
  V* vo = lanes[0].vo;
  const Idx *pa[kLanes], *pb[kLanes], *ea[kLanes], *eb[kLanes];
  Idx* po[kLanes];
  for (int l = 0; l < kLanes; ++l) {
    pa[l] = lanes[l].ia, pb[l] = lanes[l].ib, po[l] = lanes[l].io, ea[l] = lanes[l].ea, eb[l] = lanes[l].eb;
  }
  const std::ptrdiff_t da = reinterpret_cast<const char*>(va) - reinterpret_cast<const char*>(a0);
  const std::ptrdiff_t db = reinterpret_cast<const char*>(vb) - reinterpret_cast<const char*>(b0);
  const std::ptrdiff_t dout = reinterpret_cast<char*>(vo) - reinterpret_cast<char*>(o0);
  for (;;) {
    std::ptrdiff_t safe = PTRDIFF_MAX;  // steps every lane can take before either of its inputs may run out
    for (int l = 0; l < kLanes; ++l) safe = std::min({safe, ea[l] - pa[l], eb[l] - pb[l]});
    if (safe <= 0) break;
    for (std::ptrdiff_t t = 0; t < safe; ++t) {
#pragma GCC unroll 4
      for (int l = 0; l < kLanes; ++l) {
        const Idx x = *pa[l], y = *pb[l];
        const bool take_a = x <= y, take_b = y <= x;
        *po[l] = std::min(x, y);
        if constexpr (sizeof(Idx) == sizeof(V)) {
          const V a = *reinterpret_cast<const V*>(reinterpret_cast<const char*>(pa[l]) + da);
          const V b = *reinterpret_cast<const V*>(reinterpret_cast<const char*>(pb[l]) + db);
          *reinterpret_cast<V*>(reinterpret_cast<char*>(po[l]) + dout) = pick(a, b, take_a, take_b);
        } else {
          vo[po[l] - o0] = pick(va[pa[l] - a0], vb[pb[l] - b0], take_a, take_b);
        }
        pa[l] += take_a, pb[l] += take_b, ++po[l];
      }
    }
  }
  for (int l = 0; l < kLanes; ++l) {
    lanes[l].ia = pa[l], lanes[l].va = va + (pa[l] - a0);
    lanes[l].ib = pb[l], lanes[l].vb = vb + (pb[l] - b0);
    lanes[l].io = po[l], lanes[l].vo = vo + (po[l] - o0);
  }
}

#if defined(__AVX512F__)
// The merge of int32 ids with one float32 each (HC's flat gradients), 16 rows a step: the 16 smallest rows not
// yet written are the lower half of a bitonic merge of the block carried from the step before with the next
// block of whichever input's next id is smaller (Batcher's network on two registers, ids and values moved
// together): no compare per row decides what comes next. 0.48 ms for 2 x 167k random rows of 2^24 on one thread
// here, against 0.83 for the scalar lanes. An id in both inputs leaves the network as two neighbours (in
// one block or across two); their values are added (a + b and b + a are the same float) and one row is written.
// Exhausted inputs feed kMergeEnd, which no id may equal (the caller checks), and such lanes are never written.
constexpr int32_t kMergeEnd = INT32_MAX;

struct MergeBlock {
  __m512i id;
  __m512 value;
};

// Lanes i and i ^ d compared; the lower lane keeps the smaller id, the upper the larger (ties keep their own).
inline MergeBlock merge_level(MergeBlock x, __m512i partner_lane, __mmask16 upper) {
  const __m512i id = _mm512_permutexvar_epi32(partner_lane, x.id);
  const __m512 value = _mm512_permutexvar_ps(partner_lane, x.value);
  const __mmask16 take = _mm512_mask_cmplt_epi32_mask(static_cast<__mmask16>(~upper), id, x.id) |
                         _mm512_mask_cmpgt_epi32_mask(upper, id, x.id);
  return {_mm512_mask_mov_epi32(x.id, take, id), _mm512_mask_mov_ps(x.value, take, value)};
}

// A bitonic block of 16 sorted ascending.
inline MergeBlock sort_bitonic(MergeBlock x) {
  const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  for (int d = 8; d >= 1; d >>= 1) {
    const __mmask16 upper = _mm512_test_epi32_mask(lane, _mm512_set1_epi32(d));
    x = merge_level(x, _mm512_xor_si512(lane, _mm512_set1_epi32(d)), upper);
  }
  return x;
}

// Two ascending blocks -> (their 16 smallest, their 16 largest), each ascending.
inline void merge_blocks(MergeBlock a, MergeBlock b, MergeBlock& low, MergeBlock& high) {
  const __m512i reverse = _mm512_set_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  b = {_mm512_permutexvar_epi32(reverse, b.id), _mm512_permutexvar_ps(reverse, b.value)};
  const __mmask16 a_low = _mm512_cmple_epi32_mask(a.id, b.id);
  low = sort_bitonic({_mm512_mask_mov_epi32(b.id, a_low, a.id), _mm512_mask_mov_ps(b.value, a_low, a.value)});
  high = sort_bitonic({_mm512_mask_mov_epi32(a.id, a_low, b.id), _mm512_mask_mov_ps(a.value, a_low, b.value)});
}

// The next block of rows [at, n) of one input, kMergeEnd past its end.
inline MergeBlock load_block(const int32_t* id, const float* value, int64_t at, int64_t n) {
  const __mmask16 mask = first_lanes(n - at);
  return {_mm512_mask_loadu_epi32(_mm512_set1_epi32(kMergeEnd), mask, id + at),
          _mm512_mask_loadu_ps(_mm512_setzero_ps(), mask, value + at)};
}

// Writes a block's rows after the n written so far (of `room` at io / vo). `last`: the last id written, in every
// lane (kMergeEnd before any): a first id equal to it (its twin ended the block before) adds its value there; an
// id equal to its right neighbour takes that neighbour's value into its own.
inline void write_block(MergeBlock x, int32_t* io, float* vo, int64_t& n, int64_t room, __m512i& last) {
  const __m512i next_lane = _mm512_set_epi32(15, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1);
  const __mmask16 real = _mm512_cmpneq_epi32_mask(x.id, _mm512_set1_epi32(kMergeEnd));
  const __mmask16 twin = _mm512_mask_cmpeq_epi32_mask(real & 0x7FFF, x.id, _mm512_permutexvar_epi32(next_lane, x.id));
  const __m512 value = _mm512_mask_add_ps(x.value, twin, x.value, _mm512_permutexvar_ps(next_lane, x.value));
  __mmask16 keep = real & static_cast<__mmask16>(~(twin << 1));
  if (_mm512_mask_cmpeq_epi32_mask(keep & 1, x.id, last)) {
    vo[n - 1] += _mm512_cvtss_f32(value);
    keep &= 0xFFFE;
  }
  // compressed in registers, then stored whole where the room allows (a compressing store to memory is
  // microcoded on some CPUs, Zen 4 among them: 3x slower here); lanes past the kept ones are overwritten later
  const int kept_rows = __builtin_popcount(keep);
  const __m512i id = _mm512_maskz_compress_epi32(keep, x.id);
  const __m512 kept = _mm512_maskz_compress_ps(keep, value);
  if (n + 16 <= room) {
    _mm512_storeu_si512(io + n, id);
    _mm512_storeu_ps(vo + n, kept);
  } else {
    const __mmask16 first = first_lanes(kept_rows);
    _mm512_mask_storeu_epi32(io + n, first, id);
    _mm512_mask_storeu_ps(vo + n, first, kept);
  }
  if (kept_rows) last = _mm512_permutexvar_epi32(_mm512_set1_epi32(kept_rows - 1), id);
  n += kept_rows;
}

// Whether ids [0, n) ascend strictly and stay below kMergeEnd.
inline bool strictly_ascending(const int32_t* id, int64_t n) {
  __mmask16 bad = 0;
  int64_t i = 0;
  for (; i + 17 <= n; i += 16)
    bad |= _mm512_cmpge_epi32_mask(_mm512_loadu_si512(id + i), _mm512_loadu_si512(id + i + 1));
  for (; i + 1 < n; ++i) bad |= id[i] >= id[i + 1];
  return !bad && (n == 0 || id[n - 1] != kMergeEnd);
}

// The union of a[0, na) and b[0, nb) into io / vo; returns its rows.
int64_t merge_flat_simd(const int32_t* ia, const float* va, int64_t na, const int32_t* ib, const float* vb, int64_t nb,
                        int32_t* io, float* vo) {
  const int32_t end = kMergeEnd;
  int64_t at_a = 16, at_b = 16, n = 0;
  __m512i last = _mm512_set1_epi32(kMergeEnd);
  MergeBlock carried = load_block(ia, va, 0, na), low;
  MergeBlock incoming = load_block(ib, vb, 0, nb);
  for (;;) {
    merge_blocks(carried, incoming, low, carried);
    write_block(low, io, vo, n, na + nb, last);
    if (at_a >= na && at_b >= nb) break;
    const int32_t next_a = *(at_a < na ? ia + at_a : &end), next_b = *(at_b < nb ? ib + at_b : &end);
    const int64_t take_a = next_a <= next_b;  // which input, without a branch mispredicted half the time
    incoming = load_block(take_a ? ia : ib, take_a ? va : vb, take_a ? at_a : at_b, take_a ? na : nb);
    at_a += 16 * take_a, at_b += 16 * (1 - take_a);
  }
  write_block(carried, io, vo, n, na + nb, last);
  return n;
}
#endif

// `room_idx` / `room_val` (optional, both or neither): where to write the union, at least na + nb rows of the
// inputs' dtypes and width, contiguous (a caller's reused buffer: no fresh pages); views of them are returned.
std::tuple<Tensor, Tensor> merge_rows(const Tensor& a_idx_in, const Tensor& a_val_in, const Tensor& b_idx_in,
                                      const Tensor& b_val_in, const std::optional<Tensor>& room_idx,
                                      const std::optional<Tensor>& room_val) {
  const Tensor a_idx = a_idx_in.contiguous(), b_idx = b_idx_in.contiguous();
  const Tensor a_val = a_val_in.contiguous(), b_val = b_val_in.contiguous();
  TORCH_CHECK(a_idx.dim() == 1 && b_idx.dim() == 1 && a_idx.scalar_type() == b_idx.scalar_type(),
              "zen native: merge_rows needs 1-D ids of one dtype");
  TORCH_CHECK(a_val.dim() == 2 && b_val.dim() == 2 && a_val.size(1) == b_val.size(1) &&
                  a_val.scalar_type() == b_val.scalar_type() && a_val.size(0) == a_idx.numel() &&
                  b_val.size(0) == b_idx.numel(),
              "zen native: merge_rows needs (n, D) values of one dtype and width, one row per id");
  TORCH_CHECK(a_idx.device().is_cpu() && b_idx.device().is_cpu() && a_val.device().is_cpu() &&
                  b_val.device().is_cpu(), "zen native: merge_rows runs on CPU tensors");
  const int64_t na = a_idx.numel(), nb = b_idx.numel(), D = a_val.size(1);
  TORCH_CHECK(room_idx.has_value() == room_val.has_value(), "zen native: merge_rows needs room for ids and values");
  Tensor idx = room_idx ? *room_idx : at::empty({na + nb}, a_idx.options());
  Tensor val = room_val ? *room_val : at::empty({na + nb, D}, a_val.options());
  if (room_idx)
    TORCH_CHECK(idx.dim() == 1 && idx.is_contiguous() && idx.scalar_type() == a_idx.scalar_type() &&
                    idx.numel() >= na + nb && idx.device().is_cpu() && val.dim() == 2 && val.is_contiguous() &&
                    val.scalar_type() == a_val.scalar_type() && val.size(0) >= na + nb && val.size(1) == D &&
                    val.device().is_cpu(),
                "zen native: merge_rows' room must be contiguous ids and values of the inputs' dtypes, width and "
                "at least both inputs' rows");
  int64_t n = 0;
  bool ordered = false;  // the inputs were checked ascending and distinct (so is the union)
  with_index<kDevice>(a_idx, [&](auto itag) {
    using Idx = decltype(itag);
    const Idx* ia = a_idx.data_ptr<Idx>();
    const Idx* ib = b_idx.data_ptr<Idx>();
    Idx* io = idx.data_ptr<Idx>();
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, a_val.scalar_type(), "merge_rows", [&] {
      const scalar_t* va = a_val.data_ptr<scalar_t>();
      const scalar_t* vb = b_val.data_ptr<scalar_t>();
      scalar_t* vo = val.data_ptr<scalar_t>();
#if defined(__AVX512F__)
      if constexpr (std::is_same_v<Idx, int32_t> && std::is_same_v<scalar_t, float>) {
        if (D == 1 && strictly_ascending(ia, na) && strictly_ascending(ib, nb)) {
          n = merge_flat_simd(ia, va, na, ib, vb, nb, io, vo);
          ordered = true;
          return;
        }
      }
#endif
      MergeLane<Idx, scalar_t> lanes[kLanes];
      int64_t first[kLanes];  // lane l writes from row first[l] = (rows of a and b before it)
      int64_t a_lo = 0, b_lo = 0;
      for (int l = 0; l < kLanes; ++l) {  // lane l: a[a_lo, a_hi) and the ids of b below a[a_hi]
        const int64_t a_hi = l + 1 == kLanes ? na : na * (l + 1) / kLanes;
        const int64_t b_hi = a_hi == na ? nb : std::lower_bound(ib + b_lo, ib + nb, ia[a_hi]) - ib;
        first[l] = a_lo + b_lo;
        lanes[l] = {ia + a_lo, ia + a_hi, ib + b_lo, ib + b_hi, va + a_lo * D, vb + b_lo * D,
                    io + first[l], vo + first[l] * D, D};
        a_lo = a_hi, b_lo = b_hi;
      }
      if (D == 1) merge_flat(lanes);
      for (int l = 0; l < kLanes; ++l) {  // finish each lane, then pack it right after the lanes before
        lanes[l].finish();
        const int64_t rows = lanes[l].io - (io + first[l]);
        std::memmove(io + n, io + first[l], rows * sizeof(Idx));
        std::memmove(vo + n * D, vo + first[l] * D, rows * D * sizeof(scalar_t));
        n += rows;
      }
    });
    for (int64_t k = 1; k < n && !ordered; ++k)  // unsorted or repeated input ids would silently lose rows
      TORCH_CHECK(io[k - 1] < io[k], "zen native: merge_rows ids must be ascending and distinct");
    return 0;
  });
  return {idx.narrow(0, 0, n), val.narrow(0, 0, n)};
}

// ---------------------------------------------------------------------------------------------------
// The sparse reduce-scatter's split (two-level sync): split_interleaved.

// Row id r goes to interleaved shard r % k as row r / k there; returns (offsets[k + 1], shard ids, rows):
// shard s's rows are [offsets[s], offsets[s + 1]), in input order (so ascending ids stay ascending). One
// counting pass and one placing pass, by shift and mask when k is a power of two (a division per row costs
// more than the rest of the split).
template <bool kPow2, typename Idx, typename Bits>
void place_interleaved(const Idx* id, const Bits* src, Idx* local, Bits* dst, int64_t n, int64_t D, int64_t k,
                       std::vector<int64_t>& cursor) {
  const int shift = kPow2 ? __builtin_ctzll(static_cast<uint64_t>(k)) : 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t r = static_cast<int64_t>(id[i]);
    const int64_t shard = kPow2 ? (r & (k - 1)) : r % k;
    const int64_t at = cursor[shard]++;
    local[at] = static_cast<Idx>(kPow2 ? (r >> shift) : r / k);
    if (D == 1) dst[at] = src[i];
    else std::memcpy(dst + at * D, src + i * D, D * sizeof(Bits));
  }
}

std::tuple<Tensor, Tensor, Tensor> split_interleaved(const Tensor& ids_in, const Tensor& values_in, int64_t k) {
  const Tensor ids = ids_in.contiguous();
  const Tensor values = values_in.contiguous();
  TORCH_CHECK(k >= 1, "zen native: split_interleaved needs k >= 1, got ", k);
  TORCH_CHECK(ids.dim() == 1 && values.dim() == 2 && values.size(0) == ids.numel() && ids.device().is_cpu() &&
                  values.device().is_cpu(), "zen native: split_interleaved needs 1-D CPU ids and one CPU row per id");
  const int64_t n = ids.numel(), D = values.size(1);
  Tensor offsets = at::zeros({k + 1}, ids.options().dtype(at::kLong));
  Tensor local = at::empty({n}, ids.options());
  Tensor grouped = at::empty_like(values);
  with_index<kDevice>(ids, [&](auto itag) {
    using Idx = decltype(itag);
    const Idx* id = ids.data_ptr<Idx>();
    int64_t* off = offsets.data_ptr<int64_t>();
    const bool pow2 = (k & (k - 1)) == 0;
    for (int64_t i = 0; i < n; ++i) {
      TORCH_CHECK(id[i] >= 0, "zen native: split_interleaved row id ", static_cast<int64_t>(id[i]), " < 0");
      ++off[1 + (pow2 ? (static_cast<int64_t>(id[i]) & (k - 1)) : static_cast<int64_t>(id[i]) % k)];
    }
    for (int64_t s = 0; s < k; ++s) off[s + 1] += off[s];
    std::vector<int64_t> cursor(off, off + k);
    return with_bits<kDevice>(values, [&](auto btag) {
      using Bits = decltype(btag);
      const Bits* src = static_cast<const Bits*>(values.data_ptr());
      Bits* dst = static_cast<Bits*>(grouped.data_ptr());
      if (pow2) place_interleaved<true>(id, src, local.data_ptr<Idx>(), dst, n, D, k, cursor);
      else place_interleaved<false>(id, src, local.data_ptr<Idx>(), dst, n, D, k, cursor);
      return 0;
    });
  });
  return {offsets, local, grouped};
}

// ---------------------------------------------------------------------------------------------------
// Writes into the dense result: put_rows (scatter of one row set), fill_sum (streamed sum of row sets).

// out[ids[k]] = values[k] (distinct ids): the final write of a sum into the dense result. Raw bits, checked
// ids (a bad peer message must not write outside `out`), no int64 copy of int32 ids as index_put_ needs.
void put_rows(Tensor& out, const Tensor& ids_in, const Tensor& values_in) {
  TORCH_CHECK(out.dim() == 2 && out.is_contiguous() && out.device().is_cpu(),
              "zen native: out must be a contiguous (M, D) CPU tensor");
  const Tensor ids = ids_in.contiguous();
  const Tensor values = values_in.contiguous();
  const int64_t M = out.size(0), D = out.size(1), n = ids.numel();
  TORCH_CHECK(ids.dim() == 1 && ids.device().is_cpu() && values.scalar_type() == out.scalar_type() &&
                  values.numel() == n * D, "zen native: put_rows needs 1-D ids and one row of out's dtype per id");
  with_bits<kDevice>(out, [&](auto btag) {
    using Bits = decltype(btag);
    return with_index<kDevice>(ids, [&](auto itag) {
      using Idx = decltype(itag);
      const Idx* id = ids.data_ptr<Idx>();
      const Bits* src = static_cast<const Bits*>(values.data_ptr());
      Bits* dst = static_cast<Bits*>(out.data_ptr());
      at::parallel_for(0, n, kGrain, [&](int64_t lo, int64_t hi) {
        for (int64_t k = lo; k < hi; ++k) {
          const int64_t r = static_cast<int64_t>(id[k]);
          TORCH_CHECK(r >= 0 && r < M, "zen native: row id ", r, " outside [0, ", M, ")");
          if (D == 1) dst[r] = src[k];
          else std::memcpy(dst + r * D, src + k * D, D * sizeof(Bits));
        }
      });
      return 0;
    });
  });
}

// out := the dense sum of row sets (ids ascending and distinct within a set), added in the order given, in one
// sequential pass: each 16 KB block of `out` is summed in an L1 staging buffer from zero and streamed out
// with non-temporal stores, so the output is written once and never read, where zero_() then scattered
// adds read and write it, and the touched lines once more. 0 + v is v, so one set is copied exactly, and the
// adds are torch's (fp16 / bf16 through float): the result equals add_messages into a zeroed buffer. With
// divisor != 1 (fp32 / fp64 only) each sum is then divided by it: the mean a DDP hook returns.
// 16 KB: a block's loop over each set ends on a mispredicted branch, so small blocks cost per set (1 KB blocks,
// 2^24 float32 rows at 1%: 3.9 ms for two sets, 5.6 for four; 16 KB: 2.6 and 2.7). The stage sits half a page
// from dst modulo 4 KB: a load from it that shared its low 12 address bits with the streaming store just
// issued would wait on a false dependency (it halved the store rate of a page-aligned stage).
constexpr int64_t kStageBytes = 16384;
constexpr int64_t kPullStageBytes = 1024;  // fill_hash_bitmap's general path (its stage is not set off dst)

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

// The row sets of a fill_sum, contiguous and checked: 1-D CPU ids of one dtype, one row of out's dtype per id.
struct SetTensors {
  std::vector<Tensor> ids, values;
};

SetTensors checked_sets(const Tensor& out, const std::vector<Tensor>& ids_in, const std::vector<Tensor>& values_in) {
  const int64_t D = out.size(1);
  SetTensors sets;
  for (size_t s = 0; s < ids_in.size(); ++s) {
    const Tensor& ids = sets.ids.emplace_back(ids_in[s].contiguous());
    const Tensor& values = sets.values.emplace_back(values_in[s].contiguous());
    TORCH_CHECK(ids.dim() == 1 && ids.device().is_cpu() && ids.scalar_type() == sets.ids[0].scalar_type() &&
                    values.scalar_type() == out.scalar_type() && values.numel() == ids.numel() * D,
                "zen native: fill_sum needs 1-D ids of one dtype and one row of out's dtype per id");
  }
  return sets;
}

// The sets as raw pointers, taken once: data_ptr<T>() checks the dtype on every call.
template <typename Idx, typename V>
struct RawSets {
  std::vector<const Idx*> ids;
  std::vector<const V*> values;
  std::vector<int64_t> sizes;
  int64_t stride;                // set s's id i is row i * stride + offsets[s]
  std::vector<int64_t> offsets;
  int64_t M;                     // rows of the output

  RawSets(const SetTensors& sets, int64_t stride_, std::vector<int64_t> offsets_, int64_t M_)
      : stride(stride_), offsets(std::move(offsets_)), M(M_) {
    for (size_t s = 0; s < sets.ids.size(); ++s) {
      ids.push_back(sets.ids[s].data_ptr<Idx>());
      values.push_back(sets.values[s].data_ptr<V>());
      sizes.push_back(sets.ids[s].numel());
    }
  }
  int64_t count() const { return static_cast<int64_t>(ids.size()); }
};

// out's rows cut into blocks that fit the staging buffer (one row per block if a row is wider than it).
struct StageBlocks {
  int64_t M, D, row_bytes, rows_per_block, count, stage_bytes;
  StageBlocks(int64_t M_, int64_t D_, int64_t row_bytes_)
      : M(M_), D(D_), row_bytes(row_bytes_), rows_per_block(std::max<int64_t>(1, kStageBytes / row_bytes_)),
        count((M_ + rows_per_block - 1) / rows_per_block), stage_bytes(rows_per_block * row_bytes_) {}
};

// acc (the block of rows [r0, r1)) += every set's rows in it, set by set in the order given; cursor[s] moves
// past the rows of set s that it added. The ids are checked on the way (ascending, distinct, none before r0),
// where a separate pass would read them all once more; fill_sum checks that the chunks met end to end.
template <typename Idx, typename V>
inline void add_sets(V* acc, const RawSets<Idx, V>& sets, std::vector<int64_t>& cursor, int64_t r0, int64_t r1,
                     int64_t D) {
  for (int64_t s = 0; s < sets.count(); ++s) {
    const Idx* id = sets.ids[s];
    const V* src = sets.values[s];
    const int64_t n = sets.sizes[s], stride = sets.stride, base = sets.offsets[s] - r0;
    const int64_t start = cursor[s];
    int64_t k = start;
    bool ordered = true;
    if (D == 1) {
      for (int64_t at; k < n && (at = static_cast<int64_t>(id[k]) * stride + base) < r1 - r0; ++k) {
        ordered &= at >= 0 && (k == start || id[k - 1] < id[k]);
        acc[at < 0 ? 0 : at] = acc[at < 0 ? 0 : at] + src[k];
      }
    } else {
      for (int64_t at; k < n && (at = static_cast<int64_t>(id[k]) * stride + base) < r1 - r0; ++k) {
        ordered &= at >= 0 && (k == start || id[k - 1] < id[k]);
        V* row = acc + (at < 0 ? 0 : at) * D;
        for (int64_t d = 0; d < D; ++d) row[d] = row[d] + src[k * D + d];
      }
    }
    TORCH_CHECK(ordered, "zen native: fill_sum ids must be ascending, distinct and in [0, ", sets.M, ")");
    cursor[s] = k;
  }
}

// Where a thread's chunk of blocks started and ended in each set: fill_sum checks that they meet end to end.
struct ChunkCursors {
  int64_t b_lo;
  std::vector<int64_t> first, last;
};

// Blocks [b_lo, b_hi) of out (dst), one after another through this thread's staging buffer: zeroed, summed
// into, divided (the mean, as out.div_(divisor) computes it, without another pass over out), streamed out;
// `seen` gets the chunk's first and last cursor in each set.
template <typename Idx, typename V>
void fill_blocks(char* dst, const RawSets<Idx, V>& sets, const StageBlocks& blocks, int64_t divisor, int64_t b_lo,
                 int64_t b_hi, ChunkCursors& seen) {
  const int64_t M = blocks.M, D = blocks.D, row_bytes = blocks.row_bytes, rows_per_block = blocks.rows_per_block;
  std::vector<char> stage_wide(blocks.stage_bytes > kStageBytes ? blocks.stage_bytes : 0);
  alignas(4096) char stage_small[kStageBytes + 4096];
  // half a page away from dst modulo 4 KB, for every block (blocks are whole pages): a load from the stage never
  // shares its low 12 address bits with the streaming store just issued
  char* stage = stage_wide.empty()
                    ? stage_small + ((reinterpret_cast<uintptr_t>(dst) + 2048) & 4095 & ~uintptr_t(63))
                    : stage_wide.data();
  std::vector<int64_t> cursor(sets.count());  // each set's first row at or after block b_lo
  for (int64_t s = 0; s < sets.count(); ++s) {  // the first id whose row is at or after row r0
    const int64_t ahead = b_lo * rows_per_block - sets.offsets[s];
    const int64_t first = ahead <= 0 ? 0 : (ahead + sets.stride - 1) / sets.stride;
    cursor[s] = std::lower_bound(sets.ids[s], sets.ids[s] + sets.sizes[s], first,
                                 [](Idx id, int64_t x) { return static_cast<int64_t>(id) < x; }) - sets.ids[s];
  }
  seen.first = cursor;
  for (int64_t b = b_lo; b < b_hi; ++b) {
    const int64_t r0 = b * rows_per_block, r1 = std::min(M, r0 + rows_per_block);
    if ((r1 - r0) * row_bytes == kStageBytes) std::memset(stage, 0, kStageBytes);  // inlined vector stores
    else std::memset(stage, 0, (r1 - r0) * row_bytes);
    auto* acc = reinterpret_cast<V*>(stage);
    add_sets(acc, sets, cursor, r0, r1, D);
    if (divisor != 1) {
      const int64_t elements = (r1 - r0) * D;
      const auto by = static_cast<V>(divisor);
      for (int64_t e = 0; e < elements; ++e) acc[e] = acc[e] / by;
    }
    stream_block(dst + r0 * row_bytes, stage, (r1 - r0) * row_bytes);
  }
  seen.last = cursor;
}

// `stride` > 1 with one offset per set: set s holds rows id * stride + offsets[s] (the k interleaved shards of
// two-level sync, written straight from their shard ids); stride 1 and no offsets: the ids are the rows.
void fill_sum(Tensor& out, const std::vector<Tensor>& ids_in, const std::vector<Tensor>& values_in,
              int64_t divisor, int64_t stride, std::vector<int64_t> offsets) {
  TORCH_CHECK(out.dim() == 2 && out.is_contiguous() && out.device().is_cpu(),
              "zen native: out must be a contiguous (M, D) CPU tensor");
  TORCH_CHECK(ids_in.size() == values_in.size(), "zen native: fill_sum needs one values tensor per ids tensor");
  if (offsets.empty()) offsets.assign(ids_in.size(), 0);
  TORCH_CHECK(stride >= 1 && offsets.size() == ids_in.size() &&
                  std::all_of(offsets.begin(), offsets.end(), [&](int64_t o) { return o >= 0 && o < stride; }),
              "zen native: fill_sum needs stride >= 1 and one offset in [0, stride) per set");
  const int64_t M = out.size(0), D = out.size(1);
  const SetTensors sets = checked_sets(out, ids_in, values_in);
  const int64_t row_bytes = D * out.element_size();
  if (M == 0 || row_bytes == 0) return;
  const StageBlocks blocks(M, D, row_bytes);
  TORCH_CHECK(divisor == 1 || out.scalar_type() == at::kFloat || out.scalar_type() == at::kDouble,
              "zen native: fill_sum divides fp32 / fp64 sums only");
  if (sets.ids.empty()) {
    out.zero_();
    return;
  }
  with_index<kDevice>(sets.ids[0], [&](auto itag) {
    using Idx = decltype(itag);
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, out.scalar_type(), "fill_sum", [&] {
      const RawSets<Idx, scalar_t> raw(sets, stride, offsets, M);
      char* dst = static_cast<char*>(out.data_ptr());
      std::vector<ChunkCursors> chunks;
      std::mutex taken;
      at::parallel_for(0, blocks.count, 16, [&](int64_t b_lo, int64_t b_hi) {
        ChunkCursors seen{b_lo, {}, {}};
        fill_blocks(dst, raw, blocks, divisor, b_lo, b_hi, seen);
        const std::lock_guard<std::mutex> lock(taken);
        chunks.push_back(std::move(seen));
      });
      std::sort(chunks.begin(), chunks.end(), [](const ChunkCursors& a, const ChunkCursors& b) { return a.b_lo < b.b_lo; });
      // every id was added exactly once: the chunks' ranges meet end to end from the first id to the last
      // (an id below 0 or at M or beyond, or out of order, breaks the chain or was refused in add_sets)
      for (int64_t s = 0; s < raw.count(); ++s) {
        int64_t expect = 0;
        for (const ChunkCursors& c : chunks) {
          TORCH_CHECK(c.first[s] == expect, "zen native: fill_sum ids must be ascending, distinct and in [0, ", M, ")");
          expect = c.last[s];
        }
        TORCH_CHECK(expect == raw.sizes[s], "zen native: fill_sum ids must be ascending, distinct and in [0, ", M, ")");
      }
    });
    return 0;
  });
#if defined(__SSE2__) || defined(__AVX512F__)
  _mm_sfence();  // non-temporal stores are weakly ordered: make them visible before anyone reads `out`
#endif
}

// BP's pull on the CPU, decoded and written in one pass (paper section 4, Algorithm 2's decode fused with the
// write): out := the rows of every server's hash-bitmap message (payload j over S_j, values j in S_j's order),
// S_j given as membership words (bit b of bits[j][w] set iff row 64w + b is in S_j). The servers' rows are
// disjoint, so each row is 0 + its value (then / divisor), exactly what fill_sum writes from the decoded
// sets; but no row id is materialised and S_j's member list (4 bytes a row) is never read: a word of 64 rows
// consumes popcount(bits[j][w]) payload bits of each server j, and the set ones land on its members (pdep).

// The bits of x deposited, in order, on the set bits of m (BMI2's pdep where the CPU has it).
inline uint64_t deposit_bits(uint64_t x, uint64_t m) {
#if defined(__BMI2__)
  return _pdep_u64(x, m);
#else
  uint64_t r = 0;
  for (uint64_t b = 1; m; b <<= 1, m &= m - 1)
    if (x & b) r |= m & (~m + 1);
  return r;
#endif
}

// The low k bits of x, 1 <= k <= 64.
inline uint64_t low_bits(uint64_t x, int k) {
#if defined(__BMI2__)
  return _bzhi_u64(x, static_cast<unsigned>(k));
#else
  return k == 64 ? x : x & ((uint64_t{1} << k) - 1);
#endif
}

// take_bits where one unaligned load does not hold them, or would read past the stream.
__attribute__((noinline)) uint64_t take_bits_slow(const uint8_t* bytes, int64_t nbytes, int64_t at, int k) {
  const int64_t B = at >> 3;
  const int shift = static_cast<int>(at & 7);
  uint64_t lo = 0, hi = 0;
  if (B + 9 <= nbytes) {
    std::memcpy(&lo, bytes + B, 8);
    hi = bytes[B + 8];
  } else {
    for (int64_t i = B; i < nbytes && i < B + 8; ++i) lo |= uint64_t{bytes[i]} << (8 * (i - B));
    if (B + 8 < nbytes) hi = bytes[B + 8];
  }
  return low_bits(shift ? (lo >> shift) | (hi << (64 - shift)) : lo, k);
}

// Bits [at, at + k) of a little-endian bit stream of `nbytes` bytes, 1 <= k <= 64 and at + k <= 8 * nbytes.
// Always inlined: the pull's word loop calls it once per server and word, and a call there (the compiler kept
// the slow path's body out of line with it) cost 4% of the loop and its registers.
__attribute__((always_inline)) inline uint64_t take_bits(const uint8_t* bytes, int64_t nbytes, int64_t at, int k) {
  const int64_t B = at >> 3;
  const int shift = static_cast<int>(at & 7);
  if (__builtin_expect(shift + k <= 64 && B + 8 <= nbytes, 1)) {  // the common case: one unaligned load holds them all
    uint64_t lo;
    std::memcpy(&lo, bytes + B, 8);
    return low_bits(lo >> shift, k);
  }
  return take_bits_slow(bytes, nbytes, at, k);
}

// Set bits in bit positions [from, to) of a little-endian bit stream.
inline int64_t popcount_range(const uint8_t* bytes, int64_t from, int64_t to) {
  int64_t count = 0;
  while (from < to && (from & 63)) {
    const int k = static_cast<int>(std::min<int64_t>(to - from, 64 - (from & 63)));
    count += __builtin_popcountll(take_bits(bytes, (to + 7) / 8, from, k));
    from += k;
  }
  for (; from + 64 <= to; from += 64) {
    uint64_t w;
    std::memcpy(&w, bytes + (from >> 3), 8);
    count += __builtin_popcountll(w);
  }
  if (from < to) count += __builtin_popcountll(take_bits(bytes, (to + 7) / 8, from, static_cast<int>(to - from)));
  return count;
}

constexpr int64_t kBitmapServers = 8;  // zen.algorithms.bp.BITS_SERVERS

// Where each server's message is read from: its membership words, payload stream, values, and cursors.
template <typename V>
struct BitmapCursor {
  const uint64_t* words;
  int64_t W;
  const uint8_t* const* stream;
  const int64_t* nbytes;
  const V* const* src;
  const int64_t* rows;  // value rows of each server
  int64_t* at;          // next payload bit of each server
  int64_t* next;        // next value row of each server
  char* bad;            // of each server: set where its payload asks for more rows than its values hold
};

// Server j's rows among the 64 of a word whose members in S_j are m: its next popcount(m) payload bits
// deposited on m (pdep), the cursor moved past them. None where they would read past the server's values
// (a payload at odds with its values or with the membership words): `bad` is set, the caller reports it.
template <typename V>
inline uint64_t landed_rows(const BitmapCursor<V>& c, int64_t j, uint64_t m, int64_t& at, int64_t next) {
  const int k = __builtin_popcountll(m);
  const uint64_t landed = k ? deposit_bits(take_bits(c.stream[j], c.nbytes[j], at, k), m) : 0;
  at += k;
  const bool over = next + __builtin_popcountll(landed) > c.rows[j];
  c.bad[j] |= over;
  return over ? 0 : landed;
}

// Exclusive prefix over the chunks of server j's entries base[c * n + j], in place; returns the total.
int64_t exclusive_scan_servers(std::vector<int64_t>& base, int64_t chunks, int64_t n, int64_t j) {
  int64_t total = 0;
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t here = base[c * n + j];
    base[c * n + j] = total;
    total += here;
  }
  return total;
}

// Calls f(std::integral_constant<int, n>) for 1 <= n <= kBitmapServers: the word loop unrolled per server count.
template <typename F>
void with_servers(int64_t n, F f) {
  switch (n) {
    case 1: return f(std::integral_constant<int, 1>{});
    case 2: return f(std::integral_constant<int, 2>{});
    case 3: return f(std::integral_constant<int, 3>{});
    case 4: return f(std::integral_constant<int, 4>{});
    case 5: return f(std::integral_constant<int, 5>{});
    case 6: return f(std::integral_constant<int, 6>{});
    case 7: return f(std::integral_constant<int, 7>{});
    default: return f(std::integral_constant<int, 8>{});
  }
}

// acc (rows from 64 w_lo - r0 on) += every server's rows in words [w_lo, w_hi), ascending; a row belongs to
// exactly one server. Per word: each server's landed rows without a branch per server, then one pass over
// their union.
template <int N, bool kNarrow, typename V>
inline void pull_words(V* acc, int64_t D, int64_t w_lo, int64_t w_hi, int64_t r0, const BitmapCursor<V>& c) {
  int64_t at[N], next[N];
  for (int j = 0; j < N; ++j) at[j] = c.at[j], next[j] = c.next[j];
  for (int64_t w = w_lo; w < w_hi; ++w) {
    uint64_t landed[N], any = 0;
    for (int j = 0; j < N; ++j) {
      landed[j] = landed_rows(c, j, c.words[j * c.W + w], at[j], next[j]);
      any |= landed[j];
    }
    V* base = acc + (w * 64 - r0) * D;
    const V* from[N];  // each server's values for this word start here: no counter carried from row to row
    for (int j = 0; j < N; ++j) {
      from[j] = c.src[j] + next[j] * D;
      next[j] += __builtin_popcountll(landed[j]);
    }
    for (; any; any &= any - 1) {
      const int bit = __builtin_ctzll(any);
      int j = 0;
      for (int s = 1; s < N; ++s) j += static_cast<int>((landed[s] >> bit) & 1) * s;
      const V* v = from[j] + __builtin_popcountll(landed[j] & ((uint64_t{1} << bit) - 1)) * D;
      if constexpr (kNarrow) {
        base[bit] = base[bit] + v[0];
      } else {
        V* row = base + bit * D;
        for (int64_t d = 0; d < D; ++d) row[d] = row[d] + v[d];
      }
    }
  }
  for (int j = 0; j < N; ++j) c.at[j] = at[j], c.next[j] = next[j];
}

#if defined(__AVX512F__) && defined(__BMI2__)
// One 64-row word of float32 rows written (rows < 64 only for the last, partial word of `out`): each server's
// landed rows take their values in order from vp[j], which moves past them. Each row is 0 + its value
// (then / divisor), as in pull_words.
template <int N>
inline void write_word_f32(float* row, int64_t rows, bool aligned, int64_t divisor, const uint64_t* landed,
                           const float** vp) {
  const __m512 zero = _mm512_setzero_ps();
  const __m512i iota = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  __m512 lane[4] = {zero, zero, zero, zero};
  uint64_t any = 0;
  for (int j = 0; j < N; ++j) any |= landed[j];
  if (__builtin_popcountll(any) <= 16) {
    // at most 16 rows land in this word (every word of a sparse result): each server's values go once into their
    // places among the word's landed rows (one expanding load per server, its lanes picked by pext over the union),
    // and the four quarters of the word are spread from that one vector (a permute and a register expand each)
    __m512 packed = zero;
    for (int j = 0; j < N; ++j) {
      packed = _mm512_mask_expandloadu_ps(packed, static_cast<__mmask16>(_pext_u64(landed[j], any)), vp[j]);
      vp[j] += __builtin_popcountll(landed[j]);
    }
    int skip = 0;
    for (int q = 0; q < 4; ++q) {
      const auto piece = static_cast<__mmask16>(any >> (16 * q));
      const __m512 from = _mm512_permutexvar_ps(_mm512_add_epi32(iota, _mm512_set1_epi32(skip)), packed);
      lane[q] = _mm512_maskz_expand_ps(piece, from);
      skip += __builtin_popcount(piece);
    }
  } else {
    for (int j = 0; j < N; ++j)
      for (int q = 0; q < 4; ++q) {
        const auto piece = static_cast<__mmask16>(landed[j] >> (16 * q));
        lane[q] = _mm512_mask_expandloadu_ps(lane[q], piece, vp[j]);
        vp[j] += __builtin_popcount(piece);
      }
  }
  const __m512 by = _mm512_set1_ps(static_cast<float>(divisor));
  for (int q = 0; q < 4; ++q) {
    __m512 x = _mm512_add_ps(zero, lane[q]);
    if (divisor != 1) x = _mm512_div_ps(x, by);
    if (rows == 64 && aligned) _mm512_stream_ps(row + 16 * q, x);
    else if (rows == 64) _mm512_storeu_ps(row + 16 * q, x);
    else if (rows > 16 * q)  // the last, partial word: its rows past M are not out's
      _mm512_mask_storeu_ps(row + 16 * q, static_cast<__mmask16>((1u << std::min<int64_t>(16, rows - 16 * q)) - 1), x);
  }
}

constexpr int64_t kUncheckedWords = 64;  // words between two checks of the payloads' room

// pull_words for one-element float32 rows, without the staging block: a word's 64 rows are four vectors, each
// server's landed rows are loaded straight into their lanes, and the four vectors are written once, streamed where
// `out` is 64-byte aligned. With kGuard the reads of every server's values are checked (landed_rows). Without it,
// blocks of kUncheckedWords words whose payload bits all lie 16 bytes or more before their streams' ends read them
// unchecked, each server's place as one bit address (its stream's address x 8 + its cursor): two registers a server
// where the checked words keep five values, which spilled the word loop's state to vector registers (4.23-4.37 ->
// 3.78-3.83 ms on one thread at 4 servers and 4% union density, 2^24 rows).
template <int N, bool kGuard>
inline void pull_words_f32(float* out, int64_t M, int64_t w_lo, int64_t w_hi, int64_t divisor,
                           const BitmapCursor<float>& c) {
  const bool aligned = (reinterpret_cast<uintptr_t>(out) & 63) == 0;
  int64_t at[N], next[N];
  const float* vp[N];
  for (int j = 0; j < N; ++j) at[j] = c.at[j], next[j] = c.next[j], vp[j] = c.src[j] + next[j];
  for (int64_t w = w_lo; w < w_hi;) {
    const int64_t end = std::min(w_hi, w + kUncheckedWords);
    bool room = !kGuard && end * 64 <= M;  // whole words only, and every read of this block inside its stream
    for (int j = 0; j < N; ++j) room &= ((at[j] + 64 * (end - w)) >> 3) + 16 <= c.nbytes[j];
    if (room) {
      uint64_t bit[N];
      for (int j = 0; j < N; ++j) bit[j] = (reinterpret_cast<uintptr_t>(c.stream[j]) << 3) + static_cast<uint64_t>(at[j]);
      const uint64_t* word = c.words + w;
      for (; w < end; ++w, ++word) {
        uint64_t landed[N];
        for (int j = 0; j < N; ++j) {
          const uint64_t m = word[j * c.W];
          uint64_t lo, hi;  // a word's bits may span 9 bytes: its 64 after a cursor 1-7 bits into a byte
          std::memcpy(&lo, reinterpret_cast<const uint8_t*>(bit[j] >> 3), 8);
          std::memcpy(&hi, reinterpret_cast<const uint8_t*>(bit[j] >> 3) + 8, 8);
          const unsigned shift = bit[j] & 7;
          landed[j] = _pdep_u64((lo >> shift) | ((hi << 1) << (63 - shift)), m);
          bit[j] += __builtin_popcountll(m);
        }
        write_word_f32<N>(out + w * 64, 64, aligned, divisor, landed, vp);
      }
      for (int j = 0; j < N; ++j) at[j] = static_cast<int64_t>(bit[j] - (reinterpret_cast<uintptr_t>(c.stream[j]) << 3));
      continue;
    }
    for (; w < end; ++w) {
      uint64_t landed[N];
      for (int j = 0; j < N; ++j) {
        next[j] = vp[j] - c.src[j];
        if constexpr (kGuard) {
          landed[j] = landed_rows(c, j, c.words[j * c.W + w], at[j], next[j]);
        } else {  // the payloads hold no more set bits than their values: nothing to guard
          const uint64_t m = c.words[j * c.W + w];
          const int k = __builtin_popcountll(m);
          landed[j] = _pdep_u64(take_bits(c.stream[j], c.nbytes[j], at[j], k), m);
          at[j] += k;
        }
      }
      write_word_f32<N>(out + w * 64, std::min<int64_t>(64, M - w * 64), aligned, divisor, landed, vp);
    }
  }
  for (int j = 0; j < N; ++j) c.at[j] = at[j], c.next[j] = vp[j] - c.src[j];
}
#endif

void fill_hash_bitmap(Tensor& out, const std::vector<Tensor>& payloads_in, const std::vector<Tensor>& values_in,
                      const Tensor& bits_in, int64_t divisor) {
  TORCH_CHECK(out.dim() == 2 && out.is_contiguous() && out.device().is_cpu(),
              "zen native: out must be a contiguous (M, D) CPU tensor");
  const Tensor bits = bits_in.contiguous();
  const int64_t M = out.size(0), D = out.size(1), W = (M + 63) / 64;
  const int64_t n = static_cast<int64_t>(payloads_in.size());
  TORCH_CHECK(bits.dim() == 2 && bits.device().is_cpu() && bits.scalar_type() == at::kLong && bits.size(0) == n &&
                  bits.size(1) == W && static_cast<int64_t>(values_in.size()) == n,
              "zen native: fill_hash_bitmap needs one (payload, values) per server and (n, ceil(M / 64)) int64 bits");
  TORCH_CHECK(n >= 1 && n <= kBitmapServers, "zen native: fill_hash_bitmap takes 1 to ", kBitmapServers, " servers");
  TORCH_CHECK(divisor == 1 || out.scalar_type() == at::kFloat || out.scalar_type() == at::kDouble,
              "zen native: fill_hash_bitmap divides fp32 / fp64 sums only");
  const int64_t row_bytes = D * out.element_size();
  if (M == 0 || row_bytes == 0) return;
  const auto* words = reinterpret_cast<const uint64_t*>(bits.data_ptr<int64_t>());
  if (M % 64)
    for (int64_t j = 0; j < n; ++j)
      TORCH_CHECK((words[j * W + W - 1] >> (M % 64)) == 0, "zen native: membership bits beyond row ", M);
  std::vector<Tensor> payloads, values;
  for (int64_t j = 0; j < n; ++j) {
    payloads.push_back(payloads_in[j].contiguous());
    values.push_back(values_in[j].contiguous());
    TORCH_CHECK(payloads[j].dim() == 1 && payloads[j].device().is_cpu() && payloads[j].scalar_type() == at::kByte &&
                    values[j].scalar_type() == out.scalar_type() && values[j].device().is_cpu(),
                "zen native: fill_hash_bitmap needs 1-D uint8 payloads and values of out's dtype");
  }
  // A block is whole words of rows, at least the staging buffer's 1 KB where rows are narrow. One thread runs
  // one chunk and checks the payloads' sizes where it ends: a pre-pass over every membership word, to learn
  // where each chunk starts in each server's stream, costs a sixth of the kernel.
  const int64_t block_words = std::max<int64_t>(1, kPullStageBytes / (64 * row_bytes));
  const int64_t blocks = (W + block_words - 1) / block_words;
  const Chunks chunks(blocks, at::get_num_threads() == 1 ? blocks : std::max<int64_t>(1, kGrain / (64 * block_words * D)));
  // Each chunk's cursors: where it starts in each server's bit stream (members of S_j before it) and values.
  std::vector<int64_t> at(chunks.count * n, 0), next(chunks.count * n, 0), nbytes(n), rows(n);
  std::vector<char> bad(chunks.count * n, 0);
  std::vector<const uint8_t*> stream(n);
  for (int64_t j = 0; j < n; ++j) {
    stream[j] = payloads[j].data_ptr<uint8_t>();
    nbytes[j] = payloads[j].numel();  // no read of a stream leaves it (take_bits)
    rows[j] = values[j].numel() / D;  // nor of the values (landed_rows)
    TORCH_CHECK(values[j].numel() == rows[j] * D, "zen native: ", values[j].numel(), " values from server ", j,
                " are not rows of width ", D);
  }
  // One chunk, unchecked beforehand, needs a guard on every read of the values only where a payload sets more
  // bits than its values have rows (padding bits set, or a message at odds with its values): a popcount of the
  // payloads tells. Several chunks start where the pre-pass counted, each reading exactly its own rows.
  bool guard = false;
  if (chunks.count == 1)
    for (int64_t j = 0; j < n; ++j) guard |= popcount_range(stream[j], 0, 8 * nbytes[j]) > rows[j];
  if (chunks.count > 1) {
    chunks.run([&](int64_t c, int64_t lo, int64_t hi) {
      for (int64_t j = 0; j < n; ++j) {
        int64_t s = 0;
        for (int64_t w = lo * block_words; w < std::min(W, hi * block_words); ++w) s += __builtin_popcountll(words[j * W + w]);
        at[c * n + j] = s;
      }
    });
    std::vector<int64_t> members(n);
    for (int64_t j = 0; j < n; ++j) {
      members[j] = exclusive_scan_servers(at, chunks.count, n, j);
      check_payload<kDevice>(payloads[j], members[j]);
    }
    chunks.run([&](int64_t c, int64_t, int64_t) {
      for (int64_t j = 0; j < n; ++j) {
        const int64_t to = c + 1 < chunks.count ? at[(c + 1) * n + j] : members[j];
        next[c * n + j] = popcount_range(stream[j], at[c * n + j], to);
      }
    });
    for (int64_t j = 0; j < n; ++j) {
      const int64_t set = exclusive_scan_servers(next, chunks.count, n, j);
      TORCH_CHECK(rows[j] == set, "zen native: ", values[j].numel(), " values for ", set, " rows of width ", D,
                  " from server ", j);
    }
  }
  const int64_t block_rows = block_words * 64;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, out.scalar_type(), "fill_hash_bitmap", [&] {
    std::vector<const scalar_t*> src(n);
    for (int64_t j = 0; j < n; ++j) src[j] = values[j].data_ptr<scalar_t>();
    char* dst = static_cast<char*>(out.data_ptr());
#if defined(__AVX512F__) && defined(__BMI2__)
    if constexpr (std::is_same_v<scalar_t, float>) {
      if (D == 1) {
        chunks.run([&](int64_t c, int64_t lo, int64_t hi) {
          const BitmapCursor<float> cursor{words, W, stream.data(), nbytes.data(),
                                           reinterpret_cast<const float* const*>(src.data()), rows.data(),
                                           &at[c * n], &next[c * n], &bad[c * n]};
          with_servers(n, [&](auto servers) {
            constexpr int N = decltype(servers)::value;
            float* const o = out.data_ptr<float>();
            const int64_t w_lo = lo * block_words, w_hi = std::min(W, hi * block_words);
            if (guard) pull_words_f32<N, true>(o, M, w_lo, w_hi, divisor, cursor);
            else pull_words_f32<N, false>(o, M, w_lo, w_hi, divisor, cursor);
          });
        });
        return;
      }
    }
#endif
    chunks.run([&](int64_t c, int64_t lo, int64_t hi) {
      std::vector<char> stage_buf(block_rows * row_bytes + 64);
      char* stage = stage_buf.data() + ((-reinterpret_cast<intptr_t>(stage_buf.data())) & 63);
      auto* acc = reinterpret_cast<scalar_t*>(stage);
      for (int64_t b = lo; b < hi; ++b) {
        const int64_t r0 = b * block_rows, r1 = std::min(M, r0 + block_rows);
        if ((r1 - r0) * row_bytes == kPullStageBytes) std::memset(stage, 0, kPullStageBytes);  // inlined stores
        else std::memset(stage, 0, (r1 - r0) * row_bytes);
        const BitmapCursor<scalar_t> cursor{words, W, stream.data(), nbytes.data(), src.data(), rows.data(),
                                            &at[c * n], &next[c * n], &bad[c * n]};
        const int64_t w_lo = b * block_words, w_hi = std::min(W, (b + 1) * block_words);
        with_servers(n, [&](auto servers) {
          if (D == 1) pull_words<decltype(servers)::value, true>(acc, 1, w_lo, w_hi, r0, cursor);
          else pull_words<decltype(servers)::value, false>(acc, D, w_lo, w_hi, r0, cursor);
        });
        if (divisor != 1) {
          const auto by = static_cast<scalar_t>(divisor);
          for (int64_t e = 0; e < (r1 - r0) * D; ++e) acc[e] = acc[e] / by;
        }
        stream_block(dst + r0 * row_bytes, stage, (r1 - r0) * row_bytes);
      }
    });
  });
#if defined(__SSE2__) || defined(__AVX512F__)
  _mm_sfence();  // non-temporal stores are weakly ordered: make them visible before anyone reads `out`
#endif
  if (chunks.count == 1)  // the pre-pass's checks, on the cursors the one chunk ended at (`out` is then garbage)
    for (int64_t j = 0; j < n; ++j) {
      check_payload<kDevice>(payloads[j], at[j]);
      TORCH_CHECK(!bad[j] && next[j] == rows[j], "zen native: ", values[j].numel(), " values for ",
                  popcount_range(stream[j], 0, at[j]), " rows of width ", D, " from server ", j);
    }
}

#if defined(__AVX512F__)
// aggregate_hash_bitmap where every push is int32 ids, ascending, with one float32 each (BP's CPU push: the
// extraction's order, kept by partition_rows): the pushes merged one after another in rank order (the vector
// merge), so each sum is added in the same order as onto zero, and the union comes out ascending, which is its
// rows' order in S_r: the sums are the message's values as they lie, each row's bit set in one pass. Nothing is
// bucketed, scattered or summed out of place (0.9 ms for 4 pushes of 42k rows here, against 1.8). nullopt where a
// push is not of that form.
std::optional<std::tuple<Tensor, Tensor>> aggregate_merged(const std::vector<Tensor>& ids, const std::vector<Tensor>& values,
                                                          const uint64_t* words, const int64_t* below, int64_t num_rows,
                                                          int64_t L, int64_t total) {
  if (ids[0].scalar_type() != at::kInt || values[0].scalar_type() != at::kFloat || values[0].size(1) != 1 || total == 0)
    return std::nullopt;
  for (const Tensor& t : ids)
    if (!strictly_ascending(t.data_ptr<int32_t>(), t.numel())) return std::nullopt;
  const int64_t payload_bytes = (L + 7) / 8;
  // sums first, the payload right behind the kept ones: the message goes out as it lies (`pack`)
  Tensor wire = at::empty({total * 4 + payload_bytes}, at::TensorOptions().dtype(at::kByte));
  auto* sums = reinterpret_cast<float*>(wire.data_ptr<uint8_t>());
  std::unique_ptr<int32_t[]> id_room[2] = {std::unique_ptr<int32_t[]>(new int32_t[total]),
                                           std::unique_ptr<int32_t[]>(new int32_t[total])};
  const int64_t between = ids.size() > 2 ? total : 1;  // merges before the last write here
  std::unique_ptr<float[]> value_room[2] = {std::unique_ptr<float[]>(new float[between]),
                                            std::unique_ptr<float[]>(new float[between])};
  const int32_t* id = ids[0].data_ptr<int32_t>();
  const float* value = values[0].data_ptr<float>();
  int64_t count = ids[0].numel();
  for (size_t s = 1; s < std::max<size_t>(2, ids.size()); ++s) {  // the last merge writes into the message
    const bool last = s + 1 >= ids.size();
    int32_t* io = id_room[s % 2].get();
    float* vo = last ? sums : value_room[s % 2].get();
    if (s < ids.size()) count = merge_flat_simd(id, value, count, ids[s].data_ptr<int32_t>(), values[s].data_ptr<float>(),
                                                ids[s].numel(), io, vo);
    else count = merge_flat_simd(id, value, count, id, value, 0, io, vo);  // one push: copied into place
    id = io, value = vo;
  }
  TORCH_CHECK(count == 0 || (id[0] >= 0 && id[count - 1] < num_rows), "zen native: row id ",
              count && id[0] < 0 ? id[0] : id[count - 1], " outside [0, ", num_rows, ")");
  std::vector<uint64_t> bitmap((L + 63) / 64, 0);
  int64_t kept = 0;  // sums that cancelled to exactly zero are not sent: no bit, their row closed up
  for (int64_t i = 0; i < count; ++i) {
    const int64_t row = id[i];
    const uint64_t word = words[row >> 6], bit = uint64_t{1} << (row & 63);
    TORCH_CHECK(word & bit, "zen native: row ", row, " was pushed to a server that does not own it");
    uint32_t magnitude;
    std::memcpy(&magnitude, &sums[i], 4);
    if (!(magnitude & zen::magnitude_mask<uint32_t>())) continue;
    const int64_t at = below[row >> 6] + __builtin_popcountll(word & (bit - 1));
    bitmap[at >> 6] |= uint64_t{1} << (at & 63);
    sums[kept++] = sums[i];
  }
  wire = wire.narrow(0, 0, kept * 4 + payload_bytes);
  Tensor payload = wire.narrow(0, kept * 4, payload_bytes);
  std::memcpy(payload.data_ptr<uint8_t>(), bitmap.data(), payload_bytes);  // little-endian words
  return std::make_tuple(payload, wire.narrow(0, 0, kept * 4).view(at::kFloat).view({kept, 1}));
}
#endif

// A BP server's aggregate, encoded (Algorithm 2) straight from what the ranks pushed to it: the rows of S_r
// are given as membership words (bit b of words[w] set iff row 64w + b is in S_r), so a row's bit in the
// hash bitmap is its rank among S_r's members, counted per word. Two passes over the pushed rows: the first
// sets their bits (and checks each is a member), the second adds each value, message by message in rank
// order onto zero, at its row's place among the set bits; rows whose sums are exactly zero are then dropped.
// The passes visit the rows bucket by bucket of the row space, so each stays within a few KB of the words.
// The same message as summing into a compact buffer over the sorted distinct ids and encoding it, without
// the sort.
std::tuple<Tensor, Tensor> aggregate_hash_bitmap(const std::vector<Tensor>& ids_in, const std::vector<Tensor>& values_in,
                                                 const Tensor& words_in, int64_t num_rows) {
  const Tensor words_t = words_in.contiguous();
  const int64_t W = (num_rows + 63) / 64;
  TORCH_CHECK(words_t.dim() == 1 && words_t.device().is_cpu() && words_t.scalar_type() == at::kLong &&
                  words_t.numel() == W && !ids_in.empty() && ids_in.size() == values_in.size(),
              "zen native: aggregate_hash_bitmap needs (ids, values) messages and ceil(M / 64) int64 words");
  const auto* words = reinterpret_cast<const uint64_t*>(words_t.data_ptr<int64_t>());
  std::vector<Tensor> ids, values;
  int64_t total = 0;
  for (size_t s = 0; s < ids_in.size(); ++s) {
    ids.push_back(ids_in[s].contiguous());
    values.push_back(values_in[s].contiguous());
    TORCH_CHECK(ids[s].dim() == 1 && ids[s].device().is_cpu() && ids[s].scalar_type() == ids[0].scalar_type() &&
                    values[s].dim() == 2 && values[s].size(0) == ids[s].numel() &&
                    values[s].size(1) == values[0].size(1) && values[s].scalar_type() == values[0].scalar_type(),
                "zen native: aggregate_hash_bitmap needs 1-D ids of one dtype and one row of one dtype per id");
    total += ids[s].numel();
  }
  const int64_t D = values[0].size(1);
  // working arrays left uninitialised (new T[n], not a vector's zeroing): every entry is written before it is read
  std::unique_ptr<int64_t[]> below(new int64_t[W + 1]);  // members of S_r in words before w
  below[0] = 0;
  for (int64_t w = 0; w < W; ++w) below[w + 1] = below[w] + __builtin_popcountll(words[w]);
  const int64_t L = below[W], PW = (L + 63) / 64;
#if defined(__AVX512F__)
  if (auto merged = aggregate_merged(ids, values, words, below.get(), num_rows, L, total)) return *merged;
#endif
  // The pushed rows in the order of their bucket of 2^14 rows, stable (message order kept within a bucket):
  // the lookups in words and below, the bits set and the adds then stay within a few KB at a time, where
  // the pushes' own order (hash slots) would miss the cache at every row.
  constexpr int kBucketShift = 14;
  const int64_t row_bytes = D * values[0].element_size();
  struct Pushed {
    int64_t row;  // then its bit in the hash bitmap
    union {
      const char* value;  // where its values are
      uint64_t bits;      // or the values themselves, rows of up to 8 bytes: the adds then read in order
    };
  };
  const bool inline_rows = row_bytes <= 8;
  std::unique_ptr<Pushed[]> owned_pushed(new Pushed[total]);
  Pushed* const pushed = owned_pushed.get();
  with_index<kDevice>(ids[0], [&](auto itag) {
    using Idx = decltype(itag);
    std::vector<int64_t> cursor((num_rows >> kBucketShift) + 1, 0);
    for (const Tensor& t : ids) {
      const Idx* id = t.data_ptr<Idx>();
      for (int64_t k = 0; k < t.numel(); ++k) {
        const int64_t row = static_cast<int64_t>(id[k]);
        TORCH_CHECK(row >= 0 && row < num_rows, "zen native: row id ", row, " outside [0, ", num_rows, ")");
        ++cursor[row >> kBucketShift];
      }
    }
    exclusive_scan(cursor);
    for (size_t s = 0; s < ids.size(); ++s) {
      const Idx* id = ids[s].data_ptr<Idx>();
      const char* src = static_cast<const char*>(values[s].data_ptr());
      for (int64_t k = 0; k < ids[s].numel(); ++k) {
        const int64_t row = static_cast<int64_t>(id[k]);
        Pushed& p = pushed[cursor[row >> kBucketShift]++];
        p.row = row;
        if (inline_rows) std::memcpy(&p.bits, src + k * row_bytes, row_bytes);
        else p.value = src + k * row_bytes;
      }
    }
    return 0;
  });
  std::vector<uint64_t> bitmap(PW, 0);
  for (Pushed& p : std::span<Pushed>(pushed, total)) {
    const uint64_t word = words[p.row >> 6], bit = uint64_t{1} << (p.row & 63);
    TORCH_CHECK(word & bit, "zen native: row ", p.row, " was pushed to a server that does not own it");
    p.row = below[p.row >> 6] + __builtin_popcountll(word & (bit - 1));
    bitmap[p.row >> 6] |= uint64_t{1} << (p.row & 63);
  }
  std::unique_ptr<int64_t[]> before(new int64_t[PW + 1]);  // set bits in bitmap words before p
  before[0] = 0;
  for (int64_t p = 0; p < PW; ++p) before[p + 1] = before[p] + __builtin_popcountll(bitmap[p]);
  const int64_t count = before[PW];
  // the sums and the payload in one buffer, the sums first: the message then goes out as it lies (`pack`), and
  // its values land aligned at the receivers
  const int64_t sums_bytes = count * D * values[0].element_size(), payload_bytes = (L + 7) / 8;
  Tensor wire = at::empty({sums_bytes + payload_bytes}, at::TensorOptions().dtype(at::kByte));
  Tensor sums = wire.narrow(0, 0, sums_bytes).zero_().view(values[0].scalar_type()).view({count, D});
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, sums.scalar_type(), "aggregate_hash_bitmap", [&] {
    scalar_t* acc = sums.data_ptr<scalar_t>();
    for (const Pushed& p : std::span<const Pushed>(pushed, total)) {
      const int64_t at = before[p.row >> 6] + __builtin_popcountll(bitmap[p.row >> 6] & ((uint64_t{1} << (p.row & 63)) - 1));
      const auto* v = reinterpret_cast<const scalar_t*>(inline_rows ? reinterpret_cast<const char*>(&p.bits) : p.value);
      for (int64_t d = 0; d < D; ++d) acc[at * D + d] = acc[at * D + d] + v[d];
    }
  });
  // sums that cancelled to exactly zero are not sent: their bits cleared, their rows closed up
  int64_t kept = 0;
  with_bits<kDevice>(sums, [&](auto btag) {
    using Bits = decltype(btag);
    Bits* rows = static_cast<Bits*>(sums.data_ptr());
    const Bits mask = zen::magnitude_mask<Bits>();
    int64_t r = 0;
    while (r < count && row_nonzero(rows + r * D, D, mask)) ++r;
    if (r == count) {  // nothing cancelled (the common case): no walk over the bits
      kept = count;
      return 0;
    }
    r = 0;
    for (int64_t p = 0; p < PW; ++p)
      for (uint64_t set = bitmap[p]; set; set &= set - 1, ++r) {
        if (!row_nonzero(rows + r * D, D, mask)) {
          bitmap[p] &= ~(set & (~set + 1));
          continue;
        }
        if (kept != r) std::memmove(rows + kept * D, rows + r * D, D * sizeof(Bits));
        ++kept;
      }
    return 0;
  });
  if (kept != count) {  // rows closed up: the payload moves down behind the kept sums
    wire = wire.narrow(0, 0, kept * D * values[0].element_size() + payload_bytes);
    sums = sums.narrow(0, 0, kept);
  }
  Tensor payload = wire.narrow(0, wire.numel() - payload_bytes, payload_bytes);
  std::memcpy(payload.data_ptr<uint8_t>(), bitmap.data(), payload_bytes);  // little-endian words
  return std::make_tuple(payload, sums);
}

// ---------------------------------------------------------------------------------------------------
// Checks against zen/hashing.py.

// hash32 of every index at every level of the family: (levels, N) int64 in [0, 2^32), for checks
// against HashFamily.hash32.
Tensor hash_values(const Tensor& index_in, std::vector<int64_t> a, std::vector<int64_t> b) {
  const Family f = family_of<kDevice>(a, b);
  const Tensor index = index_in.contiguous();
  TORCH_CHECK(index.dim() == 1 && index.device().is_cpu(), "zen native: index must be a 1-D CPU tensor");
  const int64_t N = index.numel();
  Tensor out = at::empty({f.levels, N}, index.options().dtype(at::kLong));
  int64_t* h = out.data_ptr<int64_t>();
  with_index<kDevice>(index, [&](auto tag) {
    using Idx = decltype(tag);
    const Idx* idx = index.data_ptr<Idx>();
    at::parallel_for(0, N, kGrain, [&](int64_t lo, int64_t hi) {
      for (int l = 0; l < f.levels; ++l)
        for (int64_t i = lo; i < hi; ++i) h[l * N + i] = zen::hash32(static_cast<uint64_t>(idx[i]), f, l);
    });
    return 0;
  });
  return out;
}

// ---------------------------------------------------------------------------------------------------
// A sparsifier's threshold sweep (zen.compress.topk): acc = res + src element by element (as res.add_(src)
// rounds it); the elements with |acc| >= threshold (> threshold when `strict`) go to `out` and leave the
// residual, the rest stay in `res` and are zero in `out`. One pass instead of an add, an abs, a compare, a
// nonzero, two gathers, a fill and a zeroing. `src` may be `out` (elementwise, in place). Returns the
// chosen (ascending int64 ids, values).

template <bool kStrict, typename V>
void sweep_chunk(V* res, const V* src, V* out, int64_t lo, int64_t hi, V t, std::vector<int64_t>& ids,
                 std::vector<V>& vals) {
  for (int64_t base = lo; base < hi; base += 64) {
    const int64_t len = std::min<int64_t>(64, hi - base);
    uint64_t m = 0;
    for (int64_t j = 0; j < len; ++j) {
      const V v = res[base + j] + src[base + j];
      const V a = v < V(0) ? -v : v;
      const bool take = kStrict ? a > t : a >= t;
      res[base + j] = take ? V(0) : v;
      out[base + j] = take ? v : V(0);
      m |= static_cast<uint64_t>(take) << j;
    }
    for (; m; m &= m - 1) {
      const int64_t i = base + __builtin_ctzll(m);
      ids.push_back(i);
      vals.push_back(out[i]);
    }
  }
}

std::tuple<Tensor, Tensor> sweep_threshold(Tensor& res, const Tensor& src, Tensor& out, double threshold,
                                           bool strict) {
  for (const Tensor* t : std::initializer_list<const Tensor*>{&res, &src, &out})
    TORCH_CHECK(t->device().is_cpu() && t->dim() == 1 && t->is_contiguous() && t->numel() == res.numel() &&
                    t->scalar_type() == res.scalar_type(),
                "zen native: sweep_threshold needs contiguous 1-D CPU tensors of one size and dtype");
  TORCH_CHECK(res.scalar_type() == at::kFloat || res.scalar_type() == at::kDouble,
              "zen native: sweep_threshold takes fp32 or fp64, got ", res.scalar_type());
  return AT_DISPATCH_FLOATING_TYPES(res.scalar_type(), "sweep_threshold", [&] {
    using V = scalar_t;
    const int64_t n = res.numel();
    V* r = res.data_ptr<V>();
    const V* s = src.data_ptr<V>();
    V* o = out.data_ptr<V>();
    const V t = static_cast<V>(threshold);
    const Chunks chunks(n, kGrain);
    std::vector<std::vector<int64_t>> ids(chunks.count);
    std::vector<std::vector<V>> vals(chunks.count);
    chunks.run([&](int64_t c, int64_t lo, int64_t hi) {
      if (strict)
        sweep_chunk<true>(r, s, o, lo, hi, t, ids[c], vals[c]);
      else
        sweep_chunk<false>(r, s, o, lo, hi, t, ids[c], vals[c]);
    });
    std::vector<int64_t> base(chunks.count);
    for (int64_t c = 0; c < chunks.count; ++c) base[c] = static_cast<int64_t>(ids[c].size());
    const int64_t k = exclusive_scan(base);
    Tensor index = at::empty({k}, res.options().dtype(at::kLong));
    Tensor values = at::empty({k}, res.options());
    for (int64_t c = 0; c < chunks.count; ++c) {
      std::memcpy(index.data_ptr<int64_t>() + base[c], ids[c].data(), ids[c].size() * sizeof(int64_t));
      std::memcpy(values.data_ptr<V>() + base[c], vals[c].data(), vals[c].size() * sizeof(V));
    }
    return std::make_tuple(index, values);
  });
}

// A sweep that passed more than k is trimmed to the k largest |values|, ties to the lower ids (a rule
// that does not depend on a selection algorithm, so the torch path chooses the same); the rest go back
// to the residual. The k-th largest magnitude comes from nth_element: linear, where a top-k of nearly
// all candidates costs a sort's worth.
std::tuple<Tensor, Tensor> trim_largest(Tensor& res, Tensor& out, const Tensor& ids, const Tensor& values,
                                        int64_t k) {
  TORCH_CHECK(res.device().is_cpu() && res.dim() == 1 && res.is_contiguous() && out.device().is_cpu() &&
                  out.dim() == 1 && out.is_contiguous() && out.numel() == res.numel() &&
                  out.scalar_type() == res.scalar_type(),
              "zen native: trim_largest needs contiguous 1-D CPU res and out of one size and dtype");
  TORCH_CHECK(ids.device().is_cpu() && ids.dim() == 1 && ids.is_contiguous() && ids.scalar_type() == at::kLong &&
                  values.device().is_cpu() && values.dim() == 1 && values.is_contiguous() &&
                  values.numel() == ids.numel() && values.scalar_type() == res.scalar_type(),
              "zen native: trim_largest needs contiguous 1-D CPU int64 ids and values of res's dtype, one per id");
  const int64_t n = ids.numel();
  TORCH_CHECK(k > 0 && k < n, "zen native: trim_largest keeps 0 < k < candidates, got k = ", k, " of ", n);
  TORCH_CHECK(res.scalar_type() == at::kFloat || res.scalar_type() == at::kDouble,
              "zen native: trim_largest takes fp32 or fp64, got ", res.scalar_type());
  return AT_DISPATCH_FLOATING_TYPES(res.scalar_type(), "trim_largest", [&] {
    using V = scalar_t;
    const int64_t* id = ids.data_ptr<int64_t>();
    const V* v = values.data_ptr<V>();
    V* r = res.data_ptr<V>();
    V* o = out.data_ptr<V>();
    const int64_t size = res.numel();
    std::vector<V> mag(n);
    for (int64_t i = 0; i < n; ++i) {  // checked before anything is written
      TORCH_CHECK(id[i] >= 0 && id[i] < size, "zen native: trim_largest: id ", id[i], " outside ", size);
      mag[i] = v[i] < V(0) ? -v[i] : v[i];
      TORCH_CHECK(mag[i] == mag[i], "zen native: trim_largest: a NaN among the values");
    }
    std::nth_element(mag.begin(), mag.begin() + (k - 1), mag.end(), std::greater<V>());
    const V tau = mag[k - 1];  // the k - 1 before it are >= tau: the ones above it are all among them
    const int64_t above = std::count_if(mag.begin(), mag.begin() + (k - 1), [tau](V a) { return a > tau; });
    int64_t ties = k - above;  // of the magnitudes equal to tau, this many (the first) stay sent
    Tensor kept_ids = at::empty({k}, ids.options());
    Tensor kept_values = at::empty({k}, values.options());
    int64_t* ki = kept_ids.data_ptr<int64_t>();
    V* kv = kept_values.data_ptr<V>();
    int64_t j = 0;
    for (int64_t i = 0; i < n; ++i) {
      const V a = v[i] < V(0) ? -v[i] : v[i];
      const bool keep = a > tau || (a == tau && ties > 0);
      ties -= keep && a == tau;
      if (keep) {
        ki[j] = id[i];
        kv[j++] = v[i];
      } else {
        r[id[i]] = v[i];
        o[id[i]] = V(0);
      }
    }
    return std::make_tuple(kept_ids, kept_values);
  });
}

// ---------------------------------------------------------------------------------------------------
// The gap coding of ascending ids (zen.gaps): each id as LEB128 of (id - previous id - 1), the first as
// itself. At the densities HC codes nearly every gap is under 2^14, one or two bytes, so both directions
// take that case without a branch on the length (a mispredicted branch per id cost more than the coding):
// encode writes a two-byte word and moves by its length, 16 int32 ids at a time where AVX-512 VBMI2 can
// compress the words' bytes; decode reads a two-byte word and keeps one or both bytes. Longer codes go one
// byte at a time. Both ends check what a peer's stream must satisfy.

// One id's code at `o` (at least 2 bytes of room past the code); returns the byte after it.
inline uint8_t* put_code(uint8_t* o, uint64_t gap) {
  if (gap < (1u << 14)) {
    const uint32_t g = static_cast<uint32_t>(gap), two = g >= 128;
    const uint16_t word = static_cast<uint16_t>(two ? (g & 127) | 128 | ((g >> 7) << 8) : g);
    std::memcpy(o, &word, 2);
    return o + 1 + two;
  }
  while (gap >= 128) {
    *o++ = static_cast<uint8_t>(gap & 127) | 128;
    gap >>= 7;
  }
  *o++ = static_cast<uint8_t>(gap);
  return o;
}

template <typename Idx>
int64_t encode_ids(const Idx* id, int64_t n, uint8_t* out) {
  uint8_t* o = out;
  int64_t prev = -1, i = 0;
  auto scalar = [&](int64_t hi) {
    for (; i < hi; ++i) {
      const int64_t cur = static_cast<int64_t>(id[i]);
      TORCH_CHECK(cur > prev, "zen native: encode_gaps needs ascending distinct ids >= 0 (", cur, " after ", prev, ")");
      o = put_code(o, static_cast<uint64_t>(cur - prev - 1));
      prev = cur;
    }
  };
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512VBMI2__) && \
    defined(__BMI2__)
  if constexpr (sizeof(Idx) == 4) {  // 16 gaps as 16 two-byte words, the unused high bytes squeezed out
    const __m512i one = _mm512_set1_epi32(1), low = _mm512_set1_epi32(127), more = _mm512_set1_epi32(128);
    const __m512i limit = _mm512_set1_epi32(1 << 14);
    for (; i + 16 <= n;) {
      const __m512i cur = _mm512_loadu_si512(id + i);
      const __m512i before = _mm512_alignr_epi32(cur, _mm512_set1_epi32(static_cast<int32_t>(prev)), 15);
      const __m512i gap = _mm512_sub_epi32(_mm512_sub_epi32(cur, before), one);
      if (_mm512_cmplt_epu32_mask(gap, limit) != 0xFFFF) {  // a long code, or ids not ascending: one by one
        scalar(i + 16);
        continue;
      }
      const __mmask16 two = _mm512_cmpge_epu32_mask(gap, more);
      __m512i word = _mm512_or_si512(_mm512_and_si512(gap, low), _mm512_slli_epi32(_mm512_srli_epi32(gap, 7), 8));
      word = _mm512_mask_or_epi32(word, two, word, more);
      const uint32_t keep = 0x55555555u | static_cast<uint32_t>(_pdep_u64(two, 0xAAAAAAAAull));
      // 32 bytes stored, 16 + popcount(two) of them the codes: room, as the output holds 5 bytes an id
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(o), _mm256_maskz_compress_epi8(keep, _mm512_cvtepi32_epi16(word)));
      o += 16 + __builtin_popcount(two), i += 16;
      prev = static_cast<int64_t>(id[i - 1]);
    }
  }
#endif
  scalar(n);
  return o - out;
}

// `room` (optional): bytes to write the codes into (HC's send, right after its values: one wire buffer).
Tensor encode_gaps(const Tensor& ids_in, const std::optional<Tensor>& room) {
  const Tensor ids = ids_in.contiguous();
  TORCH_CHECK(ids.dim() == 1 && ids.device().is_cpu(), "zen native: encode_gaps needs 1-D CPU ids");
  const int64_t n = ids.numel();
  return with_index<kDevice>(ids, [&](auto itag) {
    using Idx = decltype(itag);
    const int64_t longest = (8 * static_cast<int64_t>(sizeof(Idx)) + 6) / 7;  // bytes of the largest gap
    // room for every id's longest code and a word's spare byte; pages past the codes stay untouched
    const int64_t need = n * longest + 2;
    Tensor out;
    if (room.has_value()) {
      out = *room;
      TORCH_CHECK(out.dim() == 1 && out.is_contiguous() && out.device().is_cpu() && out.scalar_type() == at::kByte &&
                      out.numel() >= need,
                  "zen native: encode_gaps' room must be ", need, " contiguous CPU bytes or more");
    } else {
      out = at::empty({need}, ids.options().dtype(at::kByte));
    }
    return out.narrow(0, 0, encode_ids(ids.data_ptr<Idx>(), n, out.data_ptr<uint8_t>()));
  });
}

// The id after `prev` from the code at b[pos] (pos moves past it), checked: whole, at most 64 bits, below rows.
inline int64_t next_id(const uint8_t* b, int64_t len, int64_t& pos, int64_t prev, int64_t rows, int64_t i,
                       int64_t count) {
  uint64_t gap = 0;
  if (pos + 2 <= len) {  // a one- or two-byte code, read as one word without a branch on its length
    uint16_t word;
    std::memcpy(&word, b + pos, 2);
    if ((word & 0x8080) != 0x8080) {
      const uint32_t two = (word >> 7) & 1;
      gap = (word & 127) | (two ? (word >> 1) & (127 << 7) : 0);
      pos += 1 + two;
      TORCH_CHECK(static_cast<int64_t>(gap) < rows - 1 - prev, "zen native: a gap-coded id is out of range (rows ",
                  rows, ")");
      return prev + static_cast<int64_t>(gap) + 1;
    }
  }
  for (int shift = 0;; shift += 7) {
    TORCH_CHECK(pos < len && shift < 64, "zen native: gap-coded ids end early or overflow (", i, " of ", count, ")");
    const uint8_t byte = b[pos++];
    gap |= static_cast<uint64_t>(byte & 127) << shift;
    if (!(byte & 128)) break;
  }
  TORCH_CHECK(gap < static_cast<uint64_t>(rows) && static_cast<int64_t>(gap) < rows - 1 - prev,
              "zen native: a gap-coded id is out of range (rows ", rows, ")");
  return prev + static_cast<int64_t>(gap) + 1;
}

// The `count` ids of a gap-coded stream into `id`; a stream that is not exactly `count` whole codes, or an id
// >= rows, is an error (a peer's message must not write outside the result).
template <typename Idx>
void decode_ids(const uint8_t* b, int64_t len, int64_t count, int64_t rows, Idx* id) {
  int64_t pos = 0, prev = -1, i = 0;
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512VBMI2__) && \
    defined(__BMI2__)
  if constexpr (sizeof(Idx) == 4) {  // 16 codes of one or two bytes from a 32-byte window, without a branch each
    const __m512i one = _mm512_set1_epi32(1), zero = _mm512_setzero_si512();
    const __m256i low = _mm256_set1_epi16(127), high = _mm256_set1_epi16(127 << 8);
    while (i + 16 <= count && pos + 32 <= len) {
      const __m256i bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + pos));
      const uint32_t more = static_cast<uint32_t>(_mm256_movemask_epi8(bytes)), ends = ~more;
      const uint32_t end16 = static_cast<uint32_t>(_pdep_u64(1u << 15, ends));  // the 16th code's last byte
      const uint32_t used = end16 ? (end16 << 1) - 1 : 0;  // its bytes (0: fewer than 16 codes end here)
      if (!used || (more & (more << 1) & used)) {  // a code of three bytes or more among them: one by one
        const int64_t stop = i + 16;
        for (; i < stop; ++i) prev = id[i] = static_cast<Idx>(next_id(b, len, pos, prev, rows, i, count));
        continue;
      }
      const uint32_t starts = ((ends << 1) | 1) & used;
      const uint32_t two = static_cast<uint32_t>(_pext_u64(more, starts));  // which of the 16 take two bytes
      const uint32_t slots = 0x55555555u | static_cast<uint32_t>(_pdep_u64(two, 0xAAAAAAAAull));
      const __m256i words = _mm256_maskz_expand_epi8(slots, bytes);  // code k in 16-bit lane k
      const __m256i gaps16 = _mm256_or_si256(_mm256_and_si256(words, low),
                                             _mm256_srli_epi16(_mm256_and_si256(words, high), 1));
      __m512i x = _mm512_add_epi32(_mm512_cvtepu16_epi32(gaps16), one);  // ids = prev + running sums of gap + 1
      const int64_t last = prev + _mm512_reduce_add_epi32(x);
      TORCH_CHECK(last < rows, "zen native: a gap-coded id is out of range (rows ", rows, ")");
      x = _mm512_add_epi32(x, _mm512_alignr_epi32(x, zero, 15));
      x = _mm512_add_epi32(x, _mm512_alignr_epi32(x, zero, 14));
      x = _mm512_add_epi32(x, _mm512_alignr_epi32(x, zero, 12));
      x = _mm512_add_epi32(x, _mm512_alignr_epi32(x, zero, 8));
      _mm512_storeu_si512(id + i, _mm512_add_epi32(x, _mm512_set1_epi32(static_cast<int32_t>(prev))));
      prev = last, i += 16;
      pos += 32 - __builtin_clz(used);
    }
  }
#endif
  for (; i < count; ++i) prev = id[i] = static_cast<Idx>(next_id(b, len, pos, prev, rows, i, count));
  TORCH_CHECK(pos == len, "zen native: gap-coded ids: ", len - pos, " bytes left after ", count, " ids");
}

Tensor decode_gaps(const Tensor& codes_in, int64_t count, int64_t rows, const Tensor& like) {
  const Tensor codes = codes_in.contiguous();
  TORCH_CHECK(codes.dim() == 1 && codes.scalar_type() == at::kByte && codes.device().is_cpu() && count >= 0,
              "zen native: decode_gaps needs a 1-D CPU uint8 stream");
  Tensor out = at::empty({count}, like.options());
  with_index<kDevice>(out, [&](auto itag) {
    using Idx = decltype(itag);
    decode_ids(codes.data_ptr<uint8_t>(), codes.numel(), count, rows, out.data_ptr<Idx>());
    return 0;
  });
  return out;
}

}  // namespace

// ---------------------------------------------------------------------------------------------------
// Python binding (zen.native calls these).

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "Zen native CPU kernels";
  // No kernel touches a Python object: release the GIL, so simulated ranks (threads) run them in parallel.
  m.def("nonzero_rows", &nonzero_rows, "ascending non-zero row ids (int64) and their rows",
        py::call_guard<py::gil_scoped_release>());
  m.def("hierarchical_hash", &hierarchical_hash, "Algorithm 1: (order, counts, serial)",
        py::call_guard<py::gil_scoped_release>());
  m.def("partition_rows", &partition_rows, "BP's push: (ids, rows, counts) grouped by server h0, stable",
        py::call_guard<py::gil_scoped_release>());
  m.def("server_rows", &server_rows, "S_j of every server: (members, offsets)",
        py::call_guard<py::gil_scoped_release>());
  m.def("encode_hash_bitmap", &encode_hash_bitmap, "Algorithm 2 encode: (payload, values)",
        py::call_guard<py::gil_scoped_release>());
  m.def("decode_hash_bitmap", &decode_hash_bitmap, "row ids of the set bits",
        py::call_guard<py::gil_scoped_release>());
  m.def("scatter_hash_bitmap", &scatter_hash_bitmap, "out[members[set bits]] = values",
        py::call_guard<py::gil_scoped_release>());
  m.def("fill_sum", &fill_sum, "out = dense sum of row sets with ascending ids, one streaming pass",
        py::arg("out"), py::arg("ids"), py::arg("values"), py::arg("divisor"), py::arg("stride") = 1,
        py::arg("offsets") = std::vector<int64_t>{}, py::call_guard<py::gil_scoped_release>());
  m.def("fill_hash_bitmap", &fill_hash_bitmap, "out = every server's hash-bitmap message decoded, one streaming pass",
        py::call_guard<py::gil_scoped_release>());
  m.def("aggregate_hash_bitmap", &aggregate_hash_bitmap, "a BP server's pushed rows summed and hash-bitmap encoded",
        py::call_guard<py::gil_scoped_release>());
  m.def("split_interleaved", &split_interleaved, "(offsets, shard ids, rows) of the k interleaved shards",
        py::call_guard<py::gil_scoped_release>());
  m.def("put_rows", &put_rows, "out[ids] = values for distinct ids",
        py::call_guard<py::gil_scoped_release>());
  m.def("merge_rows", &merge_rows, "ascending union of two row sets, a + b on shared ids", py::arg("a_idx"),
        py::arg("a_val"), py::arg("b_idx"), py::arg("b_val"), py::arg("room_idx") = py::none(),
        py::arg("room_val") = py::none(), py::call_guard<py::gil_scoped_release>());
  m.def("sweep_threshold", &sweep_threshold, "a sparsifier's threshold sweep: (ids, values) chosen from res + src",
        py::call_guard<py::gil_scoped_release>());
  m.def("trim_largest", &trim_largest, "a sweep's candidates cut to the k largest, the rest back to the residual",
        py::call_guard<py::gil_scoped_release>());
  m.def("encode_gaps", &encode_gaps, "ascending ids as LEB128 gaps (uint8)", py::arg("ids"),
        py::arg("room") = py::none(), py::call_guard<py::gil_scoped_release>());
  m.def("decode_gaps", &decode_gaps, "the ids of a gap-coded stream, checked",
        py::call_guard<py::gil_scoped_release>());
  m.def("hash_values", &hash_values, "(levels, N) hash32 values, for checks",
        py::call_guard<py::gil_scoped_release>());
}
