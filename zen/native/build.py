"""`zen build`: compile the native kernels with torch's JIT extension builder (ninja).

The C++ extension always; the CUDA one when torch has CUDA (built for the visible GPUs plus PTX, or
TORCH_CUDA_ARCH_LIST). Builds live in $TORCH_EXTENSIONS_DIR/zen_native, else in the repository's ignored
build/native/ folder (the CPU build per CPU model: it is compiled with -march=native), and are reused until a
source changes, so later loads take about a second.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import platform
import subprocess
import time
from pathlib import Path
from types import ModuleType

from zen.native.sources import CSRC, NVCC_FLAGS, SOURCES, build_root

CFLAGS = ["-O3", "-fopenmp"]  # at::parallel_for is OpenMP inline code: without -fopenmp it runs serially
LDFLAGS = ["-fopenmp"]  # resolves to the libgomp.so.1 that torch already loaded

_log = logging.getLogger(__name__)


def cpu_cflags() -> list[str]:
    """["-march=native"] when the C++ compiler takes it (the CPU kernels then use the vector width of the
    machine they are built on), else nothing: a compiler without the flag still gets a portable build."""
    cxx = os.environ.get("CXX", "c++")
    try:
        probe = subprocess.run([cxx, "-march=native", "-x", "c++", "-E", "-"], input=b"", capture_output=True,
                               timeout=60)
    except (OSError, subprocess.SubprocessError):
        return []
    return ["-march=native"] if probe.returncode == 0 else []


def host_cpu_tag() -> str:
    """Short hash of this CPU's model and instruction-set flags: a -march=native build made on another
    CPU (a shared home directory, a copied build/ folder) is never loaded here, it is rebuilt."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        lines = [platform.processor()]
    wanted = sorted({line for line in lines if line.startswith(("model name", "flags", "Features"))})
    return hashlib.sha1("\n".join([platform.machine(), *wanted]).encode()).hexdigest()[:10]


def load_extension(kind: str, verbose: bool = False) -> ModuleType:
    """Build (if needed) and import the `kind` ("cpu" or "cuda") extension; raises on failure."""
    import torch
    from torch.utils import cpp_extension

    if kind == "cuda" and torch.version.cuda is None:
        raise RuntimeError("this torch build has no CUDA")
    name = f"zen_native_{kind}"
    directory = build_root() / (f"cpu-{host_cpu_tag()}" if kind == "cpu" else kind)
    directory.mkdir(parents=True, exist_ok=True)
    if not any(directory.glob(f"{name}*.so")):
        _log.info("building zen native %s kernels in %s (one-time, ~30 s)", kind, directory)
    return cpp_extension.load(
        name=name,
        sources=[str(CSRC / s) for s in SOURCES[kind]],
        extra_cflags=CFLAGS + (cpu_cflags() if kind == "cpu" else []),
        extra_ldflags=LDFLAGS,
        extra_cuda_cflags=NVCC_FLAGS,
        extra_include_paths=[str(CSRC)],
        build_directory=str(directory),
        with_cuda=kind == "cuda",
        verbose=verbose,
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cuda", choices=("auto", "yes", "no"), default="auto",
                        help="build the CUDA kernels too (auto: when torch has CUDA)")
    parser.add_argument("--nvcc-check", action="store_true",
                        help="also compile every .cu file with nvcc -c (compile-only, works without a GPU)")
    parser.add_argument("--verbose", action="store_true", help="show the compiler commands and output")


def run(args: argparse.Namespace) -> int:
    import torch

    kinds = ["cpu"]
    if args.cuda == "yes" or (args.cuda == "auto" and torch.cuda.is_available()):
        kinds.append("cuda")
    failed = 0
    for kind in kinds:
        start = time.perf_counter()
        try:
            module = load_extension(kind, verbose=args.verbose)
        except Exception as exc:  # report every failure, then the exit status says it
            print(f"{kind}: FAILED ({type(exc).__name__}: {exc})")
            failed += 1
            continue
        print(f"{kind}: ok in {time.perf_counter() - start:.1f} s -> {module.__file__}")
    if args.nvcc_check:
        from zen.native import compile_check

        outcome = compile_check.check(verbose=args.verbose)
        print(("nvcc check: ok, " if outcome.ok else "nvcc check: FAILED, ") + outcome.message)
        failed += not outcome.ok
    return 1 if failed else 0
