// CUDA kernels for the hot paths of Zen's balanced parallelism; same contracts as the CPU kernels (zen_cpu.h).
//
// Only ATen core headers are included (no c10/cuda, no ATen/cuda): the file must compile with nvcc
// against the headers of a CPU-only torch wheel, which is how CI checks it. The caller passes the
// current CUDA stream as an integer (torch.cuda.current_stream().cuda_stream) and sets the device.
//
// Most kernels are ordered stream compactions built from one pattern: each warp owns a segment of
// positions, a count pass records how many positions of each segment pass a test, an exclusive scan of
// those counts gives every segment its output offset, and a write pass emits the passing positions in
// ascending order using ballots. Values are only tested and copied as raw bits.
#include <ATen/core/Tensor.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/cumsum.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/index_select.h>
#include <ATen/ops/sort.h>
#include <ATen/ops/zeros.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <tuple>
#include <vector>

#include "zen_common.h"

namespace {

using at::Tensor;
using zen::Family;

// The checks and dispatch of zen_common.h, for CUDA tensors.
constexpr c10::DeviceType kDevice = c10::DeviceType::CUDA;
using zen::as_rows;
using zen::check_payload;
using zen::family_of;
using zen::with_bits;
using zen::with_index;

// ---------------------------------------------------------------------------------------------------
// Launch geometry, warp helpers and the ordered stream compaction (count pass, scan, write pass) that most
// kernels below are built from.

constexpr int kWarp = 32;
constexpr int kBlock = 256;  // 8 warps
constexpr int kUnroll = 4;   // positions per lane per step: loads in flight before the ballots
constexpr int64_t kStep = kWarp * kUnroll;
constexpr int64_t kSegment = kStep * 32;  // positions per warp segment (a multiple of 32: ballots are words)
constexpr unsigned kFull = 0xFFFFFFFFu;
constexpr int kMaxSharedPartitions = 1024;

#define ZEN_CUDA_CHECK(expr)                                                                       \
  do {                                                                                             \
    const cudaError_t err__ = (expr);                                                              \
    TORCH_CHECK(err__ == cudaSuccess, "zen native CUDA: ", cudaGetErrorString(err__), " at ", #expr); \
  } while (0)

inline cudaStream_t as_stream(int64_t s) { return reinterpret_cast<cudaStream_t>(s); }

__device__ __forceinline__ unsigned lanemask_lt() {
  unsigned m;
  asm("mov.u32 %0, %%lanemask_lt;" : "=r"(m));
  return m;
}

__device__ __forceinline__ int64_t global_warp() {
  return (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp;
}

inline int64_t segments(int64_t total) { return (total + kSegment - 1) / kSegment; }
inline unsigned blocks_for_warps(int64_t warps) {
  return static_cast<unsigned>((warps + kBlock / kWarp - 1) / (kBlock / kWarp));
}

template <typename Bits>
__device__ __forceinline__ bool row_nonzero(const Bits* row, int64_t D) {
  Bits acc = 0;
  for (int64_t j = 0; j < D; ++j) acc |= row[j];
  return (acc & zen::magnitude_mask<Bits>()) != 0;
}

template <typename Bits>
__device__ __forceinline__ void copy_row(Bits* dst, const Bits* src, int64_t D) {
  for (int64_t j = 0; j < D; ++j) dst[j] = src[j];
}

__device__ __forceinline__ bool bit_at(const uint8_t* bytes, int64_t t) { return (bytes[t >> 3] >> (t & 7)) & 1; }

// A warp's walk over positions [lo, hi), kStep at a time: each lane tests its kUnroll positions (a warp apart, all
// loads issued before any ballot), then body(first, ballot, passed) runs for each of them in order, `first` the
// position of the ballot's lane 0.
template <typename Op, typename Body>
__device__ __forceinline__ void walk_segment(const Op& op, int64_t lo, int64_t hi, int lane, Body&& body) {
  for (int64_t base = lo; base < hi; base += kStep) {
    bool pass[kUnroll];
#pragma unroll
    for (int j = 0; j < kUnroll; ++j) {
      const int64_t i = base + j * kWarp + lane;
      pass[j] = i < hi && op.test(i);
    }
#pragma unroll
    for (int j = 0; j < kUnroll; ++j) body(base + j * kWarp, __ballot_sync(kFull, pass[j]), pass[j]);
  }
}

// Count pass: counts[w] = positions of segment w that pass op.test; op.word(first, ballot) sees every
// 32-position word of test results (the bitmap encoder stores them).
template <typename Op>
__global__ void segment_count(Op op, int64_t total, int64_t* counts) {
  const int64_t w = global_warp();
  const int lane = threadIdx.x % kWarp;
  const int64_t lo = w * kSegment;
  if (lo >= total) return;
  const int64_t hi = min(total, lo + kSegment);
  int64_t count = 0;
  walk_segment(op, lo, hi, lane, [&](int64_t first, unsigned b, bool) {
    op.word(first, b, lane);
    count += __popc(b);
  });
  if (lane == 0) counts[w] = count;
}

// Write pass: op.emit(i, rank) for every passing position i, rank = its place in the ordered output.
template <typename Op>
__global__ void segment_write(Op op, int64_t total, const int64_t* starts) {
  const int64_t w = global_warp();
  const int lane = threadIdx.x % kWarp;
  const int64_t lo = w * kSegment;
  if (lo >= total) return;
  const int64_t hi = min(total, lo + kSegment);
  int64_t at = starts[w];
  const unsigned lt = lanemask_lt();
  walk_segment(op, lo, hi, lane, [&](int64_t first, unsigned b, bool pass) {
    if (pass) op.emit(first + lane, at + __popc(b & lt));
    at += __popc(b);
  });
}

// Runs both passes over positions [0, total); returns the number emitted. `before_write(k)` runs between
// the passes (after the one host sync that learns k) to size the outputs the op writes to.
template <typename Op, typename Alloc>
int64_t compact(Op op, int64_t total, const at::TensorOptions& device, cudaStream_t stream, Alloc before_write) {
  if (total == 0) {
    before_write(0, op);
    return 0;
  }
  const int64_t segs = segments(total);
  Tensor counts = at::empty({segs}, device.dtype(at::kLong));
  segment_count<<<blocks_for_warps(segs), kBlock, 0, stream>>>(op, total, counts.data_ptr<int64_t>());
  ZEN_CUDA_CHECK(cudaGetLastError());
  Tensor ends = at::cumsum(counts, 0);
  const int64_t k = ends[segs - 1].item<int64_t>();
  Tensor starts = ends.sub(counts);
  before_write(k, op);
  if (k > 0) {
    segment_write<<<blocks_for_warps(segs), kBlock, 0, stream>>>(op, total, starts.data_ptr<int64_t>());
    ZEN_CUDA_CHECK(cudaGetLastError());
  }
  return k;
}

struct NoWord {
  __device__ __forceinline__ void word(int64_t, unsigned, int) const {}
};

// ---------------------------------------------------------------------------------------------------
// Non-zero rows: ascending int64 row ids and their rows (values gathered in the write pass).

template <typename Bits>
struct NonzeroRows : NoWord {
  const Bits* data;
  int64_t D;
  int64_t* index;
  Bits* values;
  __device__ __forceinline__ bool test(int64_t r) const { return row_nonzero(data + r * D, D); }
  __device__ __forceinline__ void emit(int64_t r, int64_t k) const {
    index[k] = r;
    copy_row(values + k * D, data + r * D, D);
  }
};

}  // namespace

std::tuple<Tensor, Tensor> nonzero_rows_cuda(const Tensor& dense_in, int64_t stream) {
  const Tensor dense = as_rows<kDevice>(dense_in);
  const int64_t M = dense.size(0), D = dense.size(1);
  return with_bits<kDevice>(dense, [&](auto tag) {
    using Bits = decltype(tag);
    Tensor index, values;
    NonzeroRows<Bits> op{};
    op.data = static_cast<const Bits*>(dense.data_ptr());
    op.D = D;
    compact(op, M, dense.options(), as_stream(stream), [&](int64_t k, NonzeroRows<Bits>& o) {
      index = at::empty({k}, dense.options().dtype(at::kLong));
      values = at::empty({k, D}, dense.options());
      o.index = index.data_ptr<int64_t>();
      o.values = static_cast<Bits*>(values.data_ptr());
    });
    return std::make_tuple(index, values);
  });
}

// ---------------------------------------------------------------------------------------------------
// Hierarchical hashing (Algorithm 1): one thread per index; compare-and-swap claims in the parallel
// region, atomic append in the serial region, atomic append to an overflow list when the serial region is
// full (never dropped). Slots hold position + 1. Extraction compacts the (n, r1 + r2) table row-major,
// which is partition-major; overflow entries (rare) are merged by a stable sort on the partition.

template <typename Idx, bool kSharedHist>
__global__ void hash_kernel(const Idx* idx, int64_t nnz, uint32_t n, Family f, int64_t r1, int64_t r2,
                            uint32_t* table, unsigned* counts, unsigned* serial_fill, unsigned* overflow_fill,
                            uint32_t* spill) {
  extern __shared__ unsigned hist[];
  if (kSharedHist) {
    for (uint32_t p = threadIdx.x; p < n; p += blockDim.x) hist[p] = 0;
    __syncthreads();
  }
  const int64_t W = r1 + r2;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < nnz;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint64_t x = static_cast<uint64_t>(idx[i]);
    const uint32_t p = zen::partition_of(x, f, n);
    atomicAdd(kSharedHist ? &hist[p] : &counts[p], 1u);
    uint32_t* part = table + static_cast<int64_t>(p) * W;
    const uint32_t tag = static_cast<uint32_t>(i + 1);
    bool placed = false;
    for (int l = 1; l < f.levels && !placed; ++l) {
      uint32_t* slot = part + zen::reduce(zen::hash32(x, f, l), static_cast<uint64_t>(r1));
      placed = *slot == 0 && atomicCAS(slot, 0u, tag) == 0u;
    }
    if (placed) continue;
    const unsigned t = atomicAdd(&serial_fill[p], 1u);
    if (t < static_cast<uint64_t>(r2)) {
      part[r1 + t] = tag;
    } else {
      spill[atomicAdd(overflow_fill, 1u)] = static_cast<uint32_t>(i);
    }
  }
  if (kSharedHist) {
    __syncthreads();
    for (uint32_t p = threadIdx.x; p < n; p += blockDim.x)
      if (hist[p]) atomicAdd(&counts[p], hist[p]);
  }
}

namespace {

struct TableSlots : NoWord {
  const uint32_t* table;
  int64_t* order;
  __device__ __forceinline__ bool test(int64_t s) const { return table[s] != 0; }
  __device__ __forceinline__ void emit(int64_t s, int64_t k) const { order[k] = static_cast<int64_t>(table[s]) - 1; }
};

template <typename Idx>
__global__ void partition_kernel(const Idx* idx, const int64_t* order, int64_t len, uint32_t n, Family f,
                                 int32_t* keys) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < len) keys[i] = static_cast<int32_t>(zen::partition_of(static_cast<uint64_t>(idx[order[i]]), f, n));
}

unsigned grid_for(int64_t items, int64_t per_block) {
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>((items + per_block - 1) / per_block, 65535)));
}

template <typename Idx>
std::tuple<Tensor, Tensor, int64_t> hash_impl(const Tensor& index, int64_t n, const Family& f, int64_t r1,
                                               int64_t r2, cudaStream_t stream) {
  const int64_t nnz = index.numel();
  const auto dev = index.options();
  Tensor table = at::zeros({n * (r1 + r2)}, dev.dtype(at::kInt));
  Tensor aux = at::zeros({2 * n + 1}, dev.dtype(at::kInt));  // counts, serial fills, overflow fill
  Tensor spill = at::empty({nnz}, dev.dtype(at::kInt));
  unsigned* a = reinterpret_cast<unsigned*>(aux.data_ptr<int32_t>());
  const bool shared = n <= kMaxSharedPartitions;
  const size_t smem = shared ? n * sizeof(unsigned) : 0;
  auto kernel = shared ? hash_kernel<Idx, true> : hash_kernel<Idx, false>;
  kernel<<<grid_for(nnz, kBlock * 4), kBlock, smem, stream>>>(
      index.data_ptr<Idx>(), nnz, static_cast<uint32_t>(n), f, r1, r2,
      reinterpret_cast<uint32_t*>(table.data_ptr<int32_t>()), a, a + n, a + 2 * n,
      reinterpret_cast<uint32_t*>(spill.data_ptr<int32_t>()));
  ZEN_CUDA_CHECK(cudaGetLastError());
  const Tensor host = aux.to(at::kLong).cpu();  // the one sync: counts go back to Python as a list
  const int64_t* h = host.data_ptr<int64_t>();
  int64_t serial = 0;
  for (int64_t p = 0; p < n; ++p) serial += h[n + p];
  const int64_t spilled = h[2 * n];

  Tensor order = at::empty({nnz}, dev.dtype(at::kLong));
  TableSlots op{};
  op.table = reinterpret_cast<const uint32_t*>(table.data_ptr<int32_t>());
  op.order = order.data_ptr<int64_t>();
  const int64_t placed = compact(op, table.numel(), dev, stream, [](int64_t, TableSlots&) {});
  TORCH_CHECK(placed + spilled == nnz, "zen native CUDA: hashing lost rows (", placed, " + ", spilled, " of ",
              nnz, ")");
  if (spilled > 0) {
    order.narrow(0, placed, spilled).copy_(spill.narrow(0, 0, spilled));
    Tensor keys = at::empty({nnz}, dev.dtype(at::kInt));
    partition_kernel<Idx><<<static_cast<unsigned>((nnz + kBlock - 1) / kBlock), kBlock, 0, stream>>>(
        index.data_ptr<Idx>(), order.data_ptr<int64_t>(), nnz, static_cast<uint32_t>(n), f, keys.data_ptr<int32_t>());
    ZEN_CUDA_CHECK(cudaGetLastError());
    const Tensor perm = std::get<1>(at::sort(keys, /*stable=*/true, /*dim=*/0, /*descending=*/false));
    order = order.index_select(0, perm);
  }
  return std::make_tuple(order, host.narrow(0, 0, n).clone(), serial);
}

}  // namespace

std::tuple<Tensor, Tensor, int64_t> hierarchical_hash_cuda(const Tensor& index_in, int64_t n, std::vector<int64_t> a,
                                                           std::vector<int64_t> b, int64_t r1, int64_t r2,
                                                           int64_t stream) {
  TORCH_CHECK(index_in.dim() == 1 && index_in.is_cuda(), "zen native CUDA: index must be a 1-D CUDA tensor");
  TORCH_CHECK(n >= 1 && r1 >= 1 && r2 >= 1, "zen native CUDA: need n, r1, r2 >= 1");
  TORCH_CHECK(index_in.numel() < (int64_t{1} << 31), "zen native CUDA: too many indices");
  const Family f = family_of<kDevice>(a, b);
  const Tensor index = index_in.contiguous();
  if (index.numel() == 0)
    return std::make_tuple(at::empty({0}, index.options().dtype(at::kLong)), at::zeros({n}, at::kLong), int64_t{0});
  return with_index<kDevice>(index, [&](auto tag) {
    return hash_impl<decltype(tag)>(index, n, f, r1, r2, as_stream(stream));
  });
}

// ---------------------------------------------------------------------------------------------------
// S_j of every server: a stable counting sort of rows 0..M-1 by h0. Each warp owns a segment of rows;
// pass 1 counts its rows per partition, an exclusive scan over (partition, segment) gives each warp a
// cursor per partition, and pass 2 writes rows in ascending order: lanes with the same partition find
// each other with __match_any_sync and take consecutive slots.

namespace {

constexpr int kRowWarps = 4;  // warps per block in the S_j kernels (shared cursors: warps * n)

// Walks segment [lo, hi) one warp-wide stride at a time: body(x, p, active, peers) for this lane's position x,
// p = h0(x), `peers` the lanes of `active` with the same p. Both passes walk the same way, so they agree on order.
template <typename Body>
__device__ __forceinline__ void walk_partitions(int64_t lo, int64_t hi, int lane, uint32_t n, Family f, Body&& body) {
  for (int64_t base = lo; base < hi; base += kWarp) {
    const int64_t x = base + lane;
    const unsigned active = __ballot_sync(kFull, x < hi);
    if (x < hi) {
      const uint32_t p = zen::partition_of(static_cast<uint64_t>(x), f, n);
      body(x, p, active, __match_any_sync(active, p));
    }
    __syncwarp();
  }
}

__global__ void rows_count(int64_t M, int64_t seg, int64_t segs, uint32_t n, Family f, int64_t* hist) {
  extern __shared__ unsigned long long cursors[];
  const int64_t w = global_warp();
  const int lane = threadIdx.x % kWarp;
  unsigned long long* mine = cursors + (threadIdx.x / kWarp) * n;
  for (uint32_t p = lane; p < n; p += kWarp) mine[p] = 0;
  __syncwarp();
  const int64_t lo = w * seg;
  if (lo >= M) return;
  const unsigned lt = lanemask_lt();
  walk_partitions(lo, min(M, lo + seg), lane, n, f, [&](int64_t, uint32_t p, unsigned, unsigned peers) {
    if ((peers & lt) == 0) mine[p] += __popc(peers);
  });
  for (uint32_t p = lane; p < n; p += kWarp) hist[static_cast<int64_t>(p) * segs + w] = static_cast<int64_t>(mine[p]);
}

template <typename Idx>
__global__ void rows_write(int64_t M, int64_t seg, int64_t segs, uint32_t n, Family f, const int64_t* starts,
                           Idx* members) {
  extern __shared__ unsigned long long cursors[];
  const int64_t w = global_warp();
  const int lane = threadIdx.x % kWarp;
  unsigned long long* mine = cursors + (threadIdx.x / kWarp) * n;
  const int64_t lo = w * seg;
  if (lo >= M) return;
  for (uint32_t p = lane; p < n; p += kWarp) mine[p] = static_cast<unsigned long long>(starts[static_cast<int64_t>(p) * segs + w]);
  __syncwarp();
  const unsigned lt = lanemask_lt();
  walk_partitions(lo, min(M, lo + seg), lane, n, f, [&](int64_t x, uint32_t p, unsigned active, unsigned peers) {
    const unsigned long long at = mine[p];
    members[at + __popc(peers & lt)] = static_cast<Idx>(x);
    __syncwarp(active);
    if ((peers & lt) == 0) mine[p] = at + __popc(peers);
  });
}

}  // namespace

std::tuple<Tensor, Tensor> server_rows_cuda(int64_t num_rows, int64_t n, std::vector<int64_t> a,
                                            std::vector<int64_t> b, bool wide, const Tensor& like, int64_t stream) {
  TORCH_CHECK(num_rows >= 0 && num_rows < (int64_t{1} << 32), "zen native CUDA: need 0 <= num_rows < 2^32");
  TORCH_CHECK(n >= 1 && n <= kMaxSharedPartitions, "zen native CUDA: S_j needs 1 <= n <= ", kMaxSharedPartitions);
  TORCH_CHECK(wide || num_rows < (int64_t{1} << 31), "zen native CUDA: int32 members need num_rows < 2^31");
  const Family f = family_of<kDevice>(a, b);
  const auto dev = like.options();
  Tensor members = at::empty({num_rows}, dev.dtype(wide ? at::kLong : at::kInt));
  if (num_rows == 0) return std::make_tuple(members, at::zeros({n + 1}, at::kLong));
  // Rows per warp: large enough that the (n, segments) histogram stays ~M/64 entries.
  const int64_t seg = std::max<int64_t>(4096, ((n * 64 + kWarp - 1) / kWarp) * kWarp);
  const int64_t segs = (num_rows + seg - 1) / seg;
  const unsigned blocks = static_cast<unsigned>((segs + kRowWarps - 1) / kRowWarps);
  const size_t smem = kRowWarps * n * sizeof(unsigned long long);
  const cudaStream_t s = as_stream(stream);
  Tensor hist = at::empty({n * segs}, dev.dtype(at::kLong));
  rows_count<<<blocks, kRowWarps * kWarp, smem, s>>>(num_rows, seg, segs, static_cast<uint32_t>(n), f,
                                                     hist.data_ptr<int64_t>());
  ZEN_CUDA_CHECK(cudaGetLastError());
  const Tensor starts = at::cumsum(hist, 0).sub(hist);
  with_index<kDevice>(members, [&](auto tag) {
    using Idx = decltype(tag);
    rows_write<Idx><<<blocks, kRowWarps * kWarp, smem, s>>>(num_rows, seg, segs, static_cast<uint32_t>(n), f,
                                                           starts.data_ptr<int64_t>(), members.data_ptr<Idx>());
    ZEN_CUDA_CHECK(cudaGetLastError());
    return 0;
  });
  const Tensor firsts = starts.view({n, segs}).select(1, 0).cpu().contiguous();  // partition p starts where its segment 0 does
  Tensor offsets = at::empty({n + 1}, at::kLong);
  for (int64_t p = 0; p < n; ++p) offsets.data_ptr<int64_t>()[p] = firsts.data_ptr<int64_t>()[p];
  offsets.data_ptr<int64_t>()[n] = num_rows;
  return std::make_tuple(members, offsets);
}

// ---------------------------------------------------------------------------------------------------
// Hash bitmap (Algorithm 2). Encode: the count pass tests rows members[t] of the aggregated block and
// stores each 32-bit ballot as 4 little-endian payload bytes; the write pass copies the rows of set bits.
// Decode / scatter: the set bits of the payload, compacted in order.

namespace {

template <typename Bits, typename Idx>
struct EncodeRows {
  const Bits* data;
  const Idx* rows;
  int64_t D;
  uint8_t* payload;
  int64_t nbytes;
  Bits* values;
  bool from_payload;  // write pass: re-read the bits instead of the rows
  __device__ __forceinline__ bool test(int64_t t) const {
    return from_payload ? bit_at(payload, t) : row_nonzero(data + static_cast<int64_t>(rows[t]) * D, D);
  }
  __device__ __forceinline__ void word(int64_t first, unsigned ballot, int lane) const {
    const int64_t byte = first / 8 + lane;
    if (lane < 4 && byte < nbytes) payload[byte] = static_cast<uint8_t>(ballot >> (8 * lane));
  }
  __device__ __forceinline__ void emit(int64_t t, int64_t k) const {
    copy_row(values + k * D, data + static_cast<int64_t>(rows[t]) * D, D);
  }
};

template <typename Idx>
struct DecodeIds : NoWord {
  const uint8_t* payload;
  const Idx* rows;
  Idx* ids;
  __device__ __forceinline__ bool test(int64_t t) const { return bit_at(payload, t); }
  __device__ __forceinline__ void emit(int64_t t, int64_t k) const { ids[k] = rows[t]; }
};

template <typename Bits, typename Idx>
struct ScatterRows : NoWord {
  const uint8_t* payload;
  const Idx* rows;
  const Bits* values;
  Bits* out;
  int64_t D;
  __device__ __forceinline__ bool test(int64_t t) const { return bit_at(payload, t); }
  __device__ __forceinline__ void emit(int64_t t, int64_t k) const {
    copy_row(out + static_cast<int64_t>(rows[t]) * D, values + k * D, D);
  }
};

}  // namespace

std::tuple<Tensor, Tensor> encode_hash_bitmap_cuda(const Tensor& out_in, const Tensor& members_in, int64_t stream) {
  const Tensor out = as_rows<kDevice>(out_in);
  const Tensor members = members_in.contiguous();
  const int64_t L = members.numel(), D = out.size(1), nbytes = (L + 7) / 8;
  Tensor payload = at::empty({nbytes}, out.options().dtype(at::kByte));
  Tensor values;
  with_bits<kDevice>(out, [&](auto btag) {
    using Bits = decltype(btag);
    return with_index<kDevice>(members, [&](auto itag) {
      using Idx = decltype(itag);
      EncodeRows<Bits, Idx> op{};
      op.data = static_cast<const Bits*>(out.data_ptr());
      op.rows = members.data_ptr<Idx>();
      op.D = D;
      op.payload = payload.data_ptr<uint8_t>();
      op.nbytes = nbytes;
      compact(op, L, out.options(), as_stream(stream), [&](int64_t k, EncodeRows<Bits, Idx>& o) {
        values = at::empty({k, D}, out.options());
        o.values = static_cast<Bits*>(values.data_ptr());
        o.from_payload = true;
      });
      return 0;
    });
  });
  return std::make_tuple(payload, values);
}

Tensor decode_hash_bitmap_cuda(const Tensor& payload_in, const Tensor& members_in, int64_t stream) {
  const Tensor payload = payload_in.contiguous();
  const Tensor members = members_in.contiguous();
  const int64_t L = members.numel();
  check_payload<kDevice>(payload, L);
  Tensor ids;
  with_index<kDevice>(members, [&](auto itag) {
    using Idx = decltype(itag);
    DecodeIds<Idx> op{};
    op.payload = payload.data_ptr<uint8_t>();
    op.rows = members.data_ptr<Idx>();
    compact(op, L, members.options(), as_stream(stream), [&](int64_t k, DecodeIds<Idx>& o) {
      ids = at::empty({k}, members.options());
      o.ids = ids.data_ptr<Idx>();
    });
    return 0;
  });
  return ids;
}

void scatter_hash_bitmap_cuda(Tensor& out, const Tensor& payload_in, const Tensor& members_in, const Tensor& values_in,
                              int64_t stream) {
  TORCH_CHECK(out.dim() == 2 && out.is_contiguous() && out.is_cuda(),
              "zen native CUDA: out must be a contiguous (M, D) CUDA tensor");
  const Tensor payload = payload_in.contiguous();
  const Tensor members = members_in.contiguous();
  const Tensor values = values_in.contiguous();
  const int64_t L = members.numel(), D = out.size(1);
  check_payload<kDevice>(payload, L);
  TORCH_CHECK(values.scalar_type() == out.scalar_type(), "zen native CUDA: values dtype != out dtype");
  with_bits<kDevice>(out, [&](auto btag) {
    using Bits = decltype(btag);
    return with_index<kDevice>(members, [&](auto itag) {
      using Idx = decltype(itag);
      ScatterRows<Bits, Idx> op{};
      op.payload = payload.data_ptr<uint8_t>();
      op.rows = members.data_ptr<Idx>();
      op.values = static_cast<const Bits*>(values.data_ptr());
      op.out = static_cast<Bits*>(out.data_ptr());
      op.D = D;
      compact(op, L, out.options(), as_stream(stream), [&](int64_t k, ScatterRows<Bits, Idx>&) {
        TORCH_CHECK(values.numel() == k * D, "zen native CUDA: ", values.numel(), " values for ", k,
                    " rows of width ", D);
      });
      return 0;
    });
  });
}

// ---------------------------------------------------------------------------------------------------
// hash32 of every index at every level: (levels, N) int64, for checks against HashFamily.hash32.

namespace {

template <typename Idx>
__global__ void hash_values_kernel(const Idx* idx, int64_t N, Family f, int64_t* out) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= N) return;
  for (int l = 0; l < f.levels; ++l) out[l * N + i] = zen::hash32(static_cast<uint64_t>(idx[i]), f, l);
}

}  // namespace

Tensor hash_values_cuda(const Tensor& index_in, std::vector<int64_t> a, std::vector<int64_t> b, int64_t stream) {
  const Family f = family_of<kDevice>(a, b);
  const Tensor index = index_in.contiguous();
  TORCH_CHECK(index.dim() == 1 && index.is_cuda(), "zen native CUDA: index must be a 1-D CUDA tensor");
  const int64_t N = index.numel();
  Tensor out = at::empty({f.levels, N}, index.options().dtype(at::kLong));
  if (N == 0) return out;
  with_index<kDevice>(index, [&](auto tag) {
    using Idx = decltype(tag);
    hash_values_kernel<Idx><<<static_cast<unsigned>((N + kBlock - 1) / kBlock), kBlock, 0, as_stream(stream)>>>(
        index.data_ptr<Idx>(), N, f, out.data_ptr<int64_t>());
    ZEN_CUDA_CHECK(cudaGetLastError());
    return 0;
  });
  return out;
}
