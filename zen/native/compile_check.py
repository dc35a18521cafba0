"""Compile-only check of the CUDA kernels, for machines without a GPU (CI).

A CUDA extension cannot be linked against a CPU torch wheel, but its headers suffice to compile: every
.cu file goes through `nvcc -c` (sm_90 code plus compute_90 PTX, torch's own nvcc flags), the binding
.cpp files through the host compiler, and every `*_cuda(...)` function the bindings call must be defined,
with the same signature, by the compiled .cu objects (compared with `nm`). A passing check is remembered
per source/flag/compiler hash, so reruns are instant until something changes.

    python -m zen.native.compile_check [--force] [--verbose]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from dataclasses import dataclass
from pathlib import Path

from zen.native.sources import CSRC, NVCC_FLAGS, SOURCES, build_root

STD = "c++20"  # what torch.utils.cpp_extension uses for torch >= 2.10; its headers warn under c++17
GENCODE = ["-gencode", "arch=compute_90,code=sm_90", "-gencode", "arch=compute_90,code=compute_90"]


@dataclass
class Outcome:
    ok: bool
    message: str


def find_nvcc() -> str | None:
    found = shutil.which("nvcc")
    if found:
        return found
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
    candidate = Path(home) / "bin" / "nvcc"
    return str(candidate) if candidate.exists() else None


def _includes() -> list[str]:
    from torch.utils.cpp_extension import include_paths

    return [f"-I{p}" for p in [*include_paths(), sysconfig.get_paths()["include"], str(CSRC)]]


def commands(nvcc: str, out_dir: Path) -> list[tuple[Path, list[str]]]:
    """(object file, compile command) for every CUDA-extension source."""
    from torch.utils.cpp_extension import COMMON_NVCC_FLAGS

    cxx = os.environ.get("CXX", "c++")
    jobs = []
    for name in SOURCES["cuda"]:
        src, obj = CSRC / name, out_dir / f"{name}.o"
        if name.endswith(".cu"):
            cmd = [nvcc, "-c", str(src), "-o", str(obj), f"-std={STD}", *_includes(), *COMMON_NVCC_FLAGS,
                   *NVCC_FLAGS, *GENCODE, "-Xcompiler", "-fPIC"]
        else:
            cmd = [cxx, "-c", str(src), "-o", str(obj), f"-std={STD}", "-fPIC", "-O0", *_includes(),
                   "-DTORCH_EXTENSION_NAME=zen_native_cuda", "-DTORCH_API_INCLUDE_EXTENSION_H"]
        jobs.append((obj, cmd))
    return jobs


def _fingerprint(nvcc: str, jobs: list[tuple[Path, list[str]]]) -> str:
    h = hashlib.sha256()
    for path in sorted(CSRC.iterdir()):
        if path.name in SOURCES["cuda"] or path.suffix in (".h", ".cuh"):
            h.update(path.name.encode() + path.read_bytes())
    for _, cmd in jobs:
        h.update(" ".join(cmd).encode())
    h.update(subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout.encode())
    return h.hexdigest()[:16]


def _cuda_symbols(obj: Path, defined: bool) -> set[str]:
    """Demangled `*_cuda(...)` signatures an object defines (or needs)."""
    flag = "--defined-only" if defined else "--undefined-only"
    out = subprocess.run(["nm", "-C", flag, str(obj)], capture_output=True, text=True, check=True).stdout
    names = {line.split(maxsplit=2 if defined else 1)[-1] for line in out.splitlines() if line.strip()}
    return {n for n in names if "_cuda(" in n}


def check(verbose: bool = False, force: bool = False) -> Outcome:
    """Compile every CUDA source concurrently; returns whether all compiled and the bindings link."""
    nvcc = find_nvcc()
    if nvcc is None:
        return Outcome(False, "nvcc not found (PATH, CUDA_HOME): cannot check the CUDA kernels")
    out_dir = build_root() / "nvcc_check"
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = out_dir / f"{_fingerprint(nvcc, commands(nvcc, out_dir))}.ok"
    if stamp.exists() and not force:
        return Outcome(True, f"unchanged since the last passing check ({stamp.name})")
    with tempfile.TemporaryDirectory(dir=out_dir) as tmp:  # private objects: concurrent checks never collide
        outcome = _compile(commands(nvcc, Path(tmp)), verbose)
    if outcome.ok:
        stamp.touch()
    return outcome


def _compile(jobs: list[tuple[Path, list[str]]], verbose: bool) -> Outcome:
    procs = []
    for obj, cmd in jobs:
        if verbose:
            print(" ".join(cmd), flush=True)
        procs.append((obj, subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)))
    failures = []
    for obj, proc in procs:
        log = proc.communicate()[0]
        if verbose and log.strip():
            print(log)
        if proc.returncode != 0:
            failures.append(f"{obj.name[:-2]} failed (exit {proc.returncode}):\n{log[-6000:]}")
    if failures:
        return Outcome(False, "\n".join(failures))
    try:
        defined = set().union(*(_cuda_symbols(o, defined=True) for o, _ in jobs if o.name.endswith(".cu.o")))
        called = set().union(*(_cuda_symbols(o, defined=False) for o, _ in jobs if not o.name.endswith(".cu.o")))
    except (OSError, subprocess.CalledProcessError) as exc:
        return Outcome(False, f"could not list symbols with nm: {exc}")
    if missing := sorted(called - defined):
        return Outcome(False, "binding calls functions the .cu files do not define:\n  " + "\n  ".join(missing))
    return Outcome(True, f"compiled {', '.join(SOURCES['cuda'])} for sm_90 + compute_90 PTX; {len(called)} "
                   "bound functions resolved")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m zen.native.compile_check", description=__doc__.splitlines()[0])
    parser.add_argument("--force", action="store_true", help="recompile even if this exact check passed before")
    parser.add_argument("--verbose", action="store_true", help="print the commands and compiler output")
    args = parser.parse_args(argv)
    outcome = check(verbose=args.verbose, force=args.force)
    print(("ok: " if outcome.ok else "FAILED: ") + outcome.message)
    return 0 if outcome.ok else 1


if __name__ == "__main__":
    sys.exit(main())
