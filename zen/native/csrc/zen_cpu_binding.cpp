// Python binding of the CPU kernels (zen.native calls these); the kernels are zen_cpu_*.cpp.

#include <torch/csrc/utils/pybind.h>

#include "zen_cpu.h"

using namespace zen::cpu;

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
