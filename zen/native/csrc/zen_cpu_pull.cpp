// CPU kernel: BP's pull decoded and written into the dense result in one pass (fill_hash_bitmap).

#include "zen_cpu.h"

namespace zen::cpu {

namespace {

constexpr int64_t kPullStageBytes = 1024;  // fill_hash_bitmap's general path (its stage is not set off dst)

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

}  // namespace

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

}  // namespace zen::cpu
