"""Where the native kernels' sources and builds live, shared by the JIT build (zen/native/build.py) and the
nvcc compile-only check (zen/native/compile_check.py)."""

from __future__ import annotations

import os
from pathlib import Path

CSRC = Path(__file__).resolve().parent / "csrc"
# The CPU kernels, one file per family (zen_cpu.h says which), and the binding that exposes them.
CPU_SOURCES = ("zen_cpu_binding.cpp", "zen_cpu_scan.cpp", "zen_cpu_hash.cpp", "zen_cpu_bitmap.cpp", "zen_cpu_pull.cpp",
               "zen_cpu_merge.cpp", "zen_cpu_write.cpp", "zen_cpu_sweep.cpp", "zen_cpu_gaps.cpp")
SOURCES = {"cpu": CPU_SOURCES, "cuda": ("zen_cuda_binding.cpp", "zen_cuda.cu")}
NVCC_FLAGS = ["-O3"]  # torch adds -std=c++20, its COMMON_NVCC_FLAGS and the -gencode flags


def build_root() -> Path:
    env = os.environ.get("TORCH_EXTENSIONS_DIR")
    if env:
        return Path(env) / "zen_native"
    repo = Path(__file__).resolve().parents[2]
    if (repo / "pyproject.toml").exists():
        return repo / "build" / "native"
    from torch.utils.cpp_extension import get_default_build_root

    return Path(get_default_build_root()) / "zen_native"
