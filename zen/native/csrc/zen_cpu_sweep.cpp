// CPU kernels of the sparsifiers (zen.compress.topk): the threshold sweep and the trim to the k largest.

#include "zen_cpu.h"

namespace zen::cpu {

namespace {

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

}  // namespace

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

}  // namespace zen::cpu
