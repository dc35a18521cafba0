// CPU kernel: the non-zero rows of a dense gradient (LocalGrad.rows()), one read of the data.

#include "zen_cpu.h"

namespace zen::cpu {

namespace {

constexpr int64_t kPrefetchBytes = 4096;  // how far ahead the flat scan prefetches

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

}  // namespace

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

}  // namespace zen::cpu
