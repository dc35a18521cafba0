// CPU kernels of the hash-bitmap pull encoding (paper section 4, Algorithm 2): encode, decode, decode and
// scatter, and a BP server's aggregate encoded straight from its pushes. The pull's fused decode and write
// is zen_cpu_pull.cpp.

#include "zen_cpu.h"

namespace zen::cpu {

namespace {

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

}  // namespace

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

namespace {

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

}  // namespace

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

}  // namespace zen::cpu
