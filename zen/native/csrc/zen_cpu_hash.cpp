// CPU kernels of the hash family (paper section 3): Algorithm 1, BP's push grouped by server, S_j of every
// server, and the raw hash values for checks against zen/hashing.py.

#include "zen_cpu.h"

namespace zen::cpu {

namespace {

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

}  // namespace

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

namespace {

#if defined(__AVX512F__)
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

}  // namespace

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

namespace {

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

}  // namespace

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

}  // namespace zen::cpu
