// CPU kernel: HC's merge of two row sets with ascending ids (merge_rows), scalar lanes and a 16-row vector
// merge; the vector merge also serves the hash-bitmap aggregate (zen_cpu_bitmap.cpp).

#include "zen_cpu.h"

namespace zen::cpu {

namespace {

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

#endif

}  // namespace

#if defined(__AVX512F__)
// Whether ids [0, n) ascend strictly and stay below kMergeEnd.
bool strictly_ascending(const int32_t* id, int64_t n) {
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

}  // namespace zen::cpu
