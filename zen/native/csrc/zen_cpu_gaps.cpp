// CPU kernels: the gap coding of HC's ascending ids (zen.gaps), both directions.

#include "zen_cpu.h"

namespace zen::cpu {

namespace {

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

}  // namespace

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

namespace {

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

}  // namespace

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

}  // namespace zen::cpu
