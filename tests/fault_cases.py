"""Bodies of real gloo ranks under faults (targets for harness.launch.spawn): a late peer, a skipped call, ranks
configured differently, a refused input on one rank, a re-created process group. Each returns what it saw;
tests/test_faults.py checks that every rank raised, that no sum was wrong, and that nothing hung."""

from __future__ import annotations

import datetime
import os
import time
from typing import Any

import torch
import torch.distributed as dist

import zen


def _grad(rank: int, step: int, numel: int = 4096) -> torch.Tensor:
    """Rank `rank`'s sparse gradient at `step` (values differ per step, so mixed steps give wrong sums)."""
    g = torch.zeros(numel)
    g[torch.arange(rank, numel, 37)] = float(step + 1) * (rank + 1)
    return g


def _expected(P: int, step: int, numel: int = 4096) -> torch.Tensor:
    return sum(_grad(r, step, numel) for r in range(P))


def _summed(scheme: str, step: int, group: dist.ProcessGroup | None = None, **options: Any) -> None:
    """This rank's gradient of `step` through `scheme`; a sum other than the exact one raises."""
    rank, P = dist.get_rank(), dist.get_world_size()
    out = zen.allreduce(_grad(rank, step), scheme, group, **options)
    if not torch.equal(out, _expected(P, step)):
        raise AssertionError(f"wrong sum at step {step} (steps mixed?)")


def _attempt(fn: Any) -> str:
    try:
        fn()
    except zen.ZenCommError as exc:
        return f"ZenCommError: {exc}"
    except zen.ZenInputError as exc:
        return f"ZenInputError: {exc}"
    return "ok"


def late_peer(scheme: str, timeout_s: float, late_s: float) -> dict[str, Any]:
    """The last rank arrives `late_s` after the others, whose calls time out after `timeout_s`; they retry
    once. Every attempt must raise (or give the right sum), and the group must come down at once."""
    rank, P = dist.get_rank(), dist.get_world_size()
    start = time.monotonic()
    seen = []
    if rank == P - 1:
        time.sleep(late_s)
    for step in range(2):
        seen.append(_attempt(lambda step=step: _summed(scheme, step, timeout_s=timeout_s)))
    return {"seen": seen, "elapsed": time.monotonic() - start}


def skipped_call(scheme: str, tagged: bool, group: dist.ProcessGroup | None = None) -> list[str]:
    """Rank 1 skips step 0 and carries on; with `tagged` (the step as the call's tag) every rank must raise
    at once, where untagged calls would pair rank 1's step 1 with the others' step 0."""
    rank = dist.get_rank()
    seen = []
    for step in range(3):
        if rank == 1 and step == 0:
            continue

        tag = step if tagged else None
        seen.append(_attempt(lambda step=step, tag=tag: _summed(scheme, step, group, timeout_s=10, tag=tag)))
        if seen[-1] != "ok":
            break
    return seen


def skipped_calls(schemes: list[str], tagged: bool) -> dict[str, list[str]]:
    """skipped_call of every scheme in one launch, each in a process group of its own (of every rank): what one
    case leaves in its group cannot reach the next."""
    return {scheme: skipped_call(scheme, tagged, dist.new_group()) for scheme in schemes}


def configured_apart(kind: str, group: dist.ProcessGroup | None = None) -> str:
    """Rank 1 differs from the others in one setting of the same call; every rank must raise."""
    rank = dist.get_rank()
    scheme, options, validate, out = "zen", {}, True, None
    grad = _grad(rank, 0)
    if rank == 1:
        if kind == "options":
            options = {"pull": "coo"}
        elif kind == "validate":
            validate = False
        elif kind == "unknown_scheme":
            scheme = "zen-nope"
        elif kind == "bad_out":
            out = torch.zeros(7)
        elif kind == "leaf_out":
            out = torch.zeros(4096, requires_grad=True)
    return _attempt(lambda: zen.allreduce(grad, scheme, group, out=out, validate=validate, timeout_s=10, **options))


def configured_apart_each(kinds: list[str]) -> dict[str, str]:
    """configured_apart of every kind in one launch, each in a process group of its own (of every rank)."""
    return {kind: configured_apart(kind, dist.new_group()) for kind in kinds}


def regroup(schemes: list[str], store_dir: str) -> dict[str, bool]:
    """Sum, then re-create the process group with the ranks permuted, then with one rank fewer: each sum must
    be right (a communicator cached for the old group would pair the wrong ranks)."""
    rank, P = dist.get_rank(), dist.get_world_size()
    ok: dict[str, bool] = {}

    def check(label: str, me: int, size: int) -> None:
        for scheme in schemes:
            out = zen.allreduce(_grad(me, 0), scheme, timeout_s=20)
            ok[f"{label}/{scheme}"] = bool(torch.equal(out, _expected(size, 0)))

    check("first", rank, P)
    timeout = datetime.timedelta(seconds=30)
    for label, size in (("permuted", P), ("smaller", P - 1)):
        dist.destroy_process_group()
        me = (rank + 1) % P
        if me < size:
            store = dist.FileStore(os.path.join(store_dir, label), size)
            dist.init_process_group("gloo", store=store, rank=me, world_size=size, timeout=timeout)
            check(label, me, size)
        else:
            store = dist.FileStore(os.path.join(store_dir, label + "-idle"), 1)
            dist.init_process_group("gloo", store=store, rank=0, world_size=1, timeout=timeout)
    return ok


def sleeper(seconds: float) -> str:
    """A rank that only waits (its launcher is killed meanwhile)."""
    time.sleep(seconds)
    return "slept"


def _fail_at_op(n: int, action: Any) -> None:
    """Make this rank run `action` when it reaches its n-th guarded backend operation (mid-call)."""
    from zen.comm import base

    original = base.Communicator._guard
    seen = [0]

    def guard(self: Any, what: str, phase: str, fn: Any) -> Any:
        seen[0] += 1
        if seen[0] == n:
            action()
        return original(self, what, phase, fn)

    base.Communicator._guard = guard  # type: ignore[method-assign]


def _leave_now(result: str) -> None:
    """Vanish as a killed process does (no cleanup, sockets closed by the kernel); the result file is
    written first only so that the launcher, which wants one from every rank, can report the others."""
    import pickle
    import sys
    from pathlib import Path

    out = sys.argv[sys.argv.index("--out") + 1]
    Path(out).write_bytes(pickle.dumps({"seen": [result], "elapsed": 0.0}))
    os._exit(0)


def _freeze_for(seconds: float) -> None:
    """SIGSTOP this rank; a helper process sends SIGCONT after `seconds`."""
    import signal
    import subprocess

    subprocess.Popen(["sh", "-c", f"sleep {seconds}; kill -CONT {os.getpid()}"])
    os.kill(os.getpid(), signal.SIGSTOP)


def peer_fault(kind: str, scheme: str, timeout_s: float) -> dict[str, Any]:
    """Rank 1 dies before, during or after a call, or freezes mid-call; the others call twice. Every
    attempt must give the right sum or raise, within the timeout (+ slack), never hang."""
    rank = dist.get_rank()
    if rank == 1:
        if kind == "before":
            return {"seen": ["left"], "elapsed": 0.0}
        if kind == "during":
            _fail_at_op(2, lambda: _leave_now("died"))
        if kind == "frozen":
            _fail_at_op(2, lambda: _freeze_for(timeout_s + 4))
    seen, start = [], time.monotonic()
    for step in range(2):
        seen.append(_attempt(lambda step=step: _summed(scheme, step, timeout_s=timeout_s)))
        if rank == 1 and kind == "after":
            return {"seen": [*seen, "left"], "elapsed": time.monotonic() - start}
    return {"seen": seen, "elapsed": time.monotonic() - start}
