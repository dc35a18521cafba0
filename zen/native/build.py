"""`zen build`: compile the native kernels with torch's JIT extension builder (ninja).

The C++ extension always; the CUDA one when torch has CUDA (built for the visible GPUs plus PTX, or
TORCH_CUDA_ARCH_LIST). Builds live in $TORCH_EXTENSIONS_DIR/zen_native, else in the repository's ignored
build/native/ folder, one folder per what a build is for (`build_dir`: the CPU model, as it is compiled with
-march=native; the CUDA architectures, torch and CUDA versions; the sources), so a build is reused where it
fits (later loads take about a second) and never loaded where it does not. A failed build is remembered in
its folder (`FAILED`), so every rank of a job reports it once and falls back, instead of each building again.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import platform
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
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


def cuda_arch_list() -> str:
    """The GPU architectures to build for: $TORCH_CUDA_ARCH_LIST if set, else every visible GPU's, with PTX of
    the newest (a newer GPU then compiles that at load time instead of failing with "no kernel image")."""
    import torch

    if os.environ.get("TORCH_CUDA_ARCH_LIST"):
        return os.environ["TORCH_CUDA_ARCH_LIST"]
    archs = sorted({torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())})
    if not archs:
        raise RuntimeError("no CUDA device visible to pick an architecture; set TORCH_CUDA_ARCH_LIST")
    names = [f"{major}.{minor}" for major, minor in archs]
    return ";".join(names[:-1] + [names[-1] + "+PTX"])


NAMED_ARCHS = {  # the names TORCH_CUDA_ARCH_LIST takes, as torch expands them (compound names first)
    "Kepler+Tesla": "3.7", "Maxwell+Tegra": "5.3", "Volta+Tegra": "7.2", "Ampere+Tegra": "8.7",
    "Blackwell+Tegra": "11.0", "Kepler": "3.5+PTX", "Maxwell": "5.0;5.2+PTX", "Pascal": "6.0;6.1+PTX",
    "Volta": "7.0+PTX", "Turing": "7.5+PTX", "Ampere": "8.0;8.6+PTX", "Ada": "8.9+PTX", "Hopper": "9.0+PTX",
    "Blackwell": "10.0;10.3;12.0;12.1+PTX"}


def arch_covers(arch_list: str, capability: tuple[int, int]) -> bool:
    """Whether kernels built for `arch_list` (TORCH_CUDA_ARCH_LIST's syntax: "8.0;8.6+PTX", "9.0a", "Hopper",
    separated by ";" or spaces) run on a GPU of compute `capability`: machine code for X.Y runs on X.Z with
    Z >= Y (an "a" build, X.Ya, only on X.Y itself); PTX for X.Y is compiled at load time for any newer GPU.
    "native" is built for the visible GPUs."""
    if arch_list.strip() == "native":
        return True
    for name, archs in NAMED_ARCHS.items():
        arch_list = arch_list.replace(name, archs)
    for entry in arch_list.replace(" ", ";").split(";"):
        version, ptx = entry.removesuffix("+PTX"), entry.endswith("+PTX")
        specific = version.endswith("a")
        try:
            major, minor = (int(x) for x in version.rstrip("af").split("."))
        except ValueError:
            continue  # not an architecture (an empty entry); torch's build rejects what it cannot read
        if specific and (major, minor) == capability:
            return True
        if not specific and (major == capability[0] and minor <= capability[1]
                             or ptx and (major, minor) <= capability):
            return True
    return False


def check_arch_coverage(arch_list: str) -> None:
    """RuntimeError naming the GPUs that kernels built for `arch_list` cannot run on: at load, once, instead
    of "no kernel image is available" at the first launch."""
    import torch

    caps = sorted({torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())})
    missing = [f"{major}.{minor}" for major, minor in caps if not arch_covers(arch_list, (major, minor))]
    if missing:
        raise RuntimeError(f"CUDA kernels built for TORCH_CUDA_ARCH_LIST={arch_list!r} cannot run on this "
                           f"machine's GPU(s) of compute capability {', '.join(missing)}; add it (or a lower one "
                           f"with +PTX) to TORCH_CUDA_ARCH_LIST, or unset it to build for the visible GPUs")


def build_dir(kind: str) -> Path:
    """Where the `kind` build lives: keyed by what it was built for, so a build never loads where it does not
    fit. CPU: the CPU's model and flags (-march=native). CUDA: the architecture list, torch's version and
    its CUDA version. Both: the kernels' sources and the headers they share."""
    import torch

    files = [CSRC / s for s in SOURCES[kind]] + sorted(CSRC.glob("*.h"))
    sources = hashlib.sha1(b"".join(f.read_bytes() for f in files)).hexdigest()[:8]
    if kind == "cpu":
        return build_root() / f"cpu-{host_cpu_tag()}-{sources}"
    key = "|".join([cuda_arch_list(), torch.__version__, str(torch.version.cuda)])
    return build_root() / f"cuda-{hashlib.sha1(key.encode()).hexdigest()[:10]}-{sources}"


FAILED = "BUILD_FAILED"  # a marker in a build folder: why its build failed, so no process retries it


def load_extension(kind: str, verbose: bool = False, retry: bool = False) -> ModuleType:
    """Build (if needed) and import the `kind` ("cpu" or "cuda") extension; raises on failure. A failed build
    leaves a marker in its folder, and later calls (other ranks, other runs) raise its reason at once instead
    of building again; `retry` (zen build) tries anyway. CUDA kernels whose architectures do not cover every
    visible GPU raise before anything is built or loaded (zen.native then falls back to the torch ops)."""
    import torch
    from torch.utils import cpp_extension

    if kind == "cuda" and torch.version.cuda is None:
        raise RuntimeError("this torch build has no CUDA")
    if kind == "cuda":
        check_arch_coverage(cuda_arch_list())  # not a failed build: no marker, the folder may fit another GPU
    name = f"zen_native_{kind}"
    directory = build_dir(kind)
    directory.mkdir(parents=True, exist_ok=True)
    marker = directory / FAILED
    if marker.exists() and not retry:
        raise RuntimeError(f"an earlier build in {directory} failed: {marker.read_text().strip()}")
    if not any(directory.glob(f"{name}*.so")):
        _log.info("building zen native %s kernels in %s (one-time, ~30 s)", kind, directory)
    env = {"TORCH_CUDA_ARCH_LIST": cuda_arch_list()} if kind == "cuda" else {}
    try:
        with _environment(env):
            module = _build(cpp_extension, name, kind, directory, verbose)
    except Exception as exc:
        marker.write_text(f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:300]}\n")
        raise
    marker.unlink(missing_ok=True)
    return module


@contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _build(cpp_extension: ModuleType, name: str, kind: str, directory: Path, verbose: bool) -> ModuleType:
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
            module = load_extension(kind, verbose=args.verbose, retry=True)
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
