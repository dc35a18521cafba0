// Python binding of the CUDA kernels in zen_cuda.cu. Every function takes the current CUDA stream as an
// integer last argument (zen.native passes torch.cuda.current_stream().cuda_stream and sets the device),
// so neither file needs the c10/cuda headers that a CPU-only torch wheel lacks.
// Lean includes (not torch/extension.h): they halve the build time.
#include <ATen/core/Tensor.h>
#include <torch/csrc/utils/pybind.h>

#include <tuple>
#include <vector>

using at::Tensor;

std::tuple<Tensor, Tensor> nonzero_rows_cuda(const Tensor& dense, int64_t stream);
std::tuple<Tensor, Tensor, int64_t> hierarchical_hash_cuda(const Tensor& index, int64_t n, std::vector<int64_t> a,
                                                           std::vector<int64_t> b, int64_t r1, int64_t r2,
                                                           int64_t stream);
std::tuple<Tensor, Tensor> server_rows_cuda(int64_t num_rows, int64_t n, std::vector<int64_t> a,
                                            std::vector<int64_t> b, bool wide, const Tensor& like, int64_t stream);
std::tuple<Tensor, Tensor> encode_hash_bitmap_cuda(const Tensor& out, const Tensor& members, int64_t stream);
Tensor decode_hash_bitmap_cuda(const Tensor& payload, const Tensor& members, int64_t stream);
void scatter_hash_bitmap_cuda(Tensor& out, const Tensor& payload, const Tensor& members, const Tensor& values,
                              int64_t stream);
Tensor hash_values_cuda(const Tensor& index, std::vector<int64_t> a, std::vector<int64_t> b, int64_t stream);

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "Zen native CUDA kernels";
  // No kernel touches a Python object: release the GIL, so simulated ranks (threads) run them in parallel.
  m.def("nonzero_rows", &nonzero_rows_cuda, "ascending non-zero row ids (int64) and their rows",
        py::call_guard<py::gil_scoped_release>());
  m.def("hierarchical_hash", &hierarchical_hash_cuda, "Algorithm 1: (order, counts, serial)",
        py::call_guard<py::gil_scoped_release>());
  m.def("server_rows", &server_rows_cuda, "S_j of every server: (members, offsets)",
        py::call_guard<py::gil_scoped_release>());
  m.def("encode_hash_bitmap", &encode_hash_bitmap_cuda, "Algorithm 2 encode: (payload, values)",
        py::call_guard<py::gil_scoped_release>());
  m.def("decode_hash_bitmap", &decode_hash_bitmap_cuda, "row ids of the set bits",
        py::call_guard<py::gil_scoped_release>());
  m.def("scatter_hash_bitmap", &scatter_hash_bitmap_cuda, "out[members[set bits]] = values",
        py::call_guard<py::gil_scoped_release>());
  m.def("hash_values", &hash_values_cuda, "(levels, N) hash32 values, for checks",
        py::call_guard<py::gil_scoped_release>());
}
