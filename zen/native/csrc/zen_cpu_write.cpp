// CPU kernels that write row sets: the interleaved split of two-level sync, the checked scatter into a dense
// result (put_rows), and the streamed dense sum of row sets (fill_sum).

#include "zen_cpu.h"

namespace zen::cpu {

namespace {

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

}  // namespace

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

namespace {

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

}  // namespace

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

}  // namespace zen::cpu
