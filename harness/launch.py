"""Spawn P real torch.distributed ranks on this machine and collect what each returns.

Each rank is a fresh `python -m harness.launch` process (no fork of a process that already runs OpenMP
threads) that initialises the process group, calls `module:function(**kwargs)` and pickles the
return value. A rank that fails or overruns kills the whole group with a clear error. A `wrap`
callable may prefix each rank's command line (e.g. `nsenter -t <holder> -n`), and `env` per rank lets
the caller bind ranks to interfaces; this is how the emulated cluster plugs in.

Ranks never outlive their launcher, whatever killed it (SIGKILL included): each rank starts under
`setpriv --pdeathsig KILL` (util-linux), so the kernel kills it when its parent dies, even while it is still
importing torch; without setpriv the rank sets the same signal itself once it runs. The temporary
folder of a launcher that could not remove it (SIGKILL) is removed by the next launch on this machine.

gloo ranks put gloo's event-loop threads under SCHED_BATCH (see `calm_gloo_event_loop`; ZEN_GLOO_BATCH=0
keeps the default policy): on a box with fewer cores than ranks this stops the loop of one rank from
preempting, on every wake-up, the thread of another that holds a gloo lock.
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import faulthandler
import importlib
import os
import pickle
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any, TextIO

from zen.comm.scheduling import calm_gloo
from zen.types import ZenCommError

FOLDER_PREFIX = "zen-launch-"  # + the launcher's pid + "-": a temporary folder per launch
PR_SET_PDEATHSIG = 1  # prctl option (linux/prctl.h)
DIE_WITH_PARENT = ["setpriv", "--pdeathsig", "KILL", "--"] if shutil.which("setpriv") else []


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def spawn(target: str, world_size: int, kwargs: dict[str, Any] | None = None, *, backend: str = "gloo",
          timeout_s: float = 600.0, pg_timeout_s: float = 120.0, master_addr: str = "127.0.0.1",
          wrap: Callable[[int], list[str]] | None = None,
          env: Callable[[int], dict[str, str]] | None = None, echo: TextIO | None = None) -> list[Any]:
    """Run `target` ("pkg.module:function") on `world_size` ranks; returns each rank's result. `echo`
    receives rank 0's output as it comes (progress of a long run), besides its log."""
    port = free_port() if master_addr == "127.0.0.1" else 29500 + os.getpid() % 1000
    sweep_stale_folders()
    with tempfile.TemporaryDirectory(prefix=f"{FOLDER_PREFIX}{os.getpid()}-") as tmp:
        args_file = Path(tmp, "kwargs.pkl")
        args_file.write_bytes(pickle.dumps(kwargs or {}))
        procs = []
        for rank in range(world_size):
            rank_env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank),
                            MASTER_ADDR=master_addr, MASTER_PORT=str(port), OMP_NUM_THREADS="1",
                            ZEN_LAUNCHER_PID=str(os.getpid()))
            rank_env.update(env(rank) if env else {})
            cmd = [*(wrap(rank) if wrap else []), *DIE_WITH_PARENT, sys.executable, "-m", "harness.launch",
                   "--target", target, "--kwargs", str(args_file), "--out", str(Path(tmp, f"rank{rank}.pkl")),
                   "--backend", backend, "--pg-timeout", str(pg_timeout_s)]
            log = open(Path(tmp, f"rank{rank}.log"), "w+b")  # noqa: SIM115 - closed below
            procs.append((subprocess.Popen(cmd, env=rank_env, stdout=log, stderr=subprocess.STDOUT), log))
        with _Tail(Path(tmp, "rank0.log"), echo) as tail:
            _wait_all(procs, timeout_s, tail.pump)
        return [pickle.loads(Path(tmp, f"rank{r}.pkl").read_bytes()) for r in range(world_size)]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def sweep_stale_folders(root: str | None = None) -> list[str]:
    """Remove the temporary folders of launchers that are no longer running; returns what was removed."""
    base = Path(root or tempfile.gettempdir())
    removed = []
    for folder in base.glob(f"{FOLDER_PREFIX}*-*"):
        pid = folder.name[len(FOLDER_PREFIX):].split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)) and folder.is_dir() and folder.stat().st_uid == os.getuid():
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(str(folder))
    return removed


def die_with_parent(parent: int) -> None:
    """Have the kernel SIGKILL this process when its parent (pid `parent`: a launcher, a pipeline's job
    shell) dies; exit now if it already has. Linux only (elsewhere a no-op)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:
        os._exit(1)


def exit_with(pid: int, every_s: float = 0.5) -> None:
    """Exit this process soon after process `pid` has gone (a thread polls it; a job of a killed pipeline
    stops computing, and its ranks die with it)."""
    def watch() -> None:
        while _alive(pid):
            time.sleep(every_s)
        os._exit(1)

    threading.Thread(target=watch, name="zen-exit-with", daemon=True).start()


class _Tail:
    """Copies what is appended to a file to a stream (nothing without one)."""

    def __init__(self, path: Path, stream: TextIO | None):
        self.path, self.stream, self.offset = path, stream, 0

    def __enter__(self) -> _Tail:
        return self

    def __exit__(self, *exc: object) -> None:
        self.pump()

    def pump(self) -> None:
        if self.stream is None:
            return
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                chunk = f.read()
        except OSError:
            return
        end = chunk.rfind(b"\n") + 1  # whole lines only
        if end:
            self.offset += end
            self.stream.write(chunk[:end].decode(errors="replace"))
            self.stream.flush()


def _wait_all(procs: list[tuple[subprocess.Popen, Any]], timeout_s: float,
              pump: Callable[[], None] = lambda: None) -> None:
    deadline = time.monotonic() + timeout_s
    failed: list[int] = []
    try:
        while any(p.poll() is None for p, _ in procs):
            pump()
            failed = [r for r, (p, _) in enumerate(procs) if p.returncode not in (None, 0)]
            if failed or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        failed = [r for r, (p, _) in enumerate(procs) if p.returncode not in (None, 0)]
        overran = any(p.poll() is None for p, _ in procs)
        if failed or overran:
            if not failed:  # a hang: give the ranks a moment to report their own timeout first
                time.sleep(1.0)
            for p, _ in procs:
                if p.poll() is None:
                    p.kill()
            first = failed[0] if failed else 0
            _, log = procs[first]
            log.seek(0)
            tail = log.read().decode(errors="replace")[-3000:]
            why = f"rank {first} exited with {procs[first][0].returncode}" if failed else \
                f"ranks still running after {timeout_s:.0f}s"
            raise ZenCommError(f"harness.launch: {why}; its output ends with:\n{tail}")
    finally:
        for p, log in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
            log.close()


def rank_device(backend: str) -> Any:
    """This rank's GPU when its backend carries CUDA tensors (NCCL): cuda:LOCAL_RANK, made current, so that
    every rank of a node gets its own device; None otherwise. A LOCAL_RANK without a GPU of its own is a
    RuntimeError here, before the group is made: NCCL does not run two ranks on one GPU, and wrapping ranks
    around the visible devices would only fail later, inside NCCL. (A caller that binds each rank to one GPU
    through CUDA_VISIBLE_DEVICES sets that rank's LOCAL_RANK to 0 in spawn's `env`.)"""
    import torch

    if "nccl" not in backend.replace(",", ":").split(":") or not torch.cuda.is_available():
        return None  # gloo, or a backend merely named like NCCL (the tests' "ncclrules" double: host tensors)
    local, count = int(os.environ.get("LOCAL_RANK", "0")), torch.cuda.device_count()
    if not 0 <= local < count:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "unset")
        raise RuntimeError(f"harness.launch: the rank with LOCAL_RANK={local} needs a GPU of its own under "
                           f"{backend}, and this process sees {count} (CUDA_VISIBLE_DEVICES={visible}); NCCL does "
                           f"not run two ranks on one GPU: start at most {count} ranks on this machine")
    device = torch.device("cuda", local)
    torch.cuda.set_device(device)
    return device


def _all_connected(dist: ModuleType) -> None:
    """Wait (on the group's store, no collective) until every rank's group is made: a rank whose target returns at
    once, or that leaves on purpose, must not close its connections while a peer is still connecting to it (gloo
    then fails that peer in connectFullMesh with "Connection closed by peer", seen with tests run side by side)."""
    store = dist.distributed_c10d._get_default_store()
    store.set(f"zen-launch/connected/{dist.get_rank()}", "1")
    store.wait([f"zen-launch/connected/{r}" for r in range(dist.get_world_size())])


def worker_main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="one rank of harness.launch.spawn (internal)")
    parser.add_argument("--target", required=True)
    parser.add_argument("--kwargs", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--backend", default="gloo")
    parser.add_argument("--pg-timeout", type=float, default=120.0)
    args = parser.parse_args(argv)
    faulthandler.enable(all_threads=True)  # a crash (an abort in native code) shows every thread's Python stack
    launcher = int(os.environ.get("ZEN_LAUNCHER_PID", "0"))
    if launcher:
        die_with_parent(launcher)
    import torch.distributed as dist

    kwargs = pickle.loads(Path(args.kwargs).read_bytes())
    module, func = args.target.split(":")
    fn = getattr(importlib.import_module(module), func)
    device = rank_device(args.backend)
    dist.init_process_group(args.backend, timeout=datetime.timedelta(seconds=args.pg_timeout), device_id=device)
    _all_connected(dist)
    calm_gloo(args.backend)
    try:
        result = fn(**kwargs)
        tmp = Path(args.out + ".tmp")
        tmp.write_bytes(pickle.dumps(result))
        tmp.rename(args.out)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    worker_main(sys.argv[1:])
