"""The emulated cluster (harness/netem.py): rate parsing, shaped links, and namespaces always torn down."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from harness.launch import spawn
from harness.netem import NetemError, emulated_cluster, parse_rate, ring_allreduce_seconds
from zen.types import ZenCommError

from .helpers import netem_unavailable, processes_in

RATE = "200mbit"
NBYTES = 5_000_000


@pytest.mark.parametrize("text, bits", [
    ("1gbit", 1e9), ("2.5gbit", 2.5e9), ("500mbit", 5e8), ("1e9", 1e9), ("750kbit", 7.5e5),
    ("1Gbit/s", 1e9), (" 10 mbit ", 1e7), ("12345", 12345.0), (2e9, 2e9), (100, 100.0),
])
def test_parse_rate(text: str | float, bits: float) -> None:
    assert parse_rate(text) == pytest.approx(bits)


@pytest.mark.parametrize("text", ["1mbps", "fast", "0", "-1gbit", "1 gb", "", 0])
def test_parse_rate_rejects(text: str | float) -> None:
    with pytest.raises(ValueError):
        parse_rate(text)


def test_ring_bound() -> None:
    assert ring_allreduce_seconds(100e6, 4, 1e9) == pytest.approx(1.2)


def test_missing_tools_are_named(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(NetemError, match="ip, tc, nsenter, unshare, setpriv"), emulated_cluster(2, "1gbit"):
        pass


def _assert_gone(netns_ids: set[str], wait_s: float = 0.0) -> None:
    deadline = time.monotonic() + wait_s
    while processes_in(netns_ids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(netns_ids) >= 2 and not processes_in(netns_ids)


def _allreduce(nbytes: int, reps: int, fail_rank: int = -1) -> tuple[float, bool]:
    """Rank target: `reps` all_reduces of rank+1 everywhere; seconds taken and whether every sum is right."""
    import torch
    import torch.distributed as dist

    rank, n = dist.get_rank(), dist.get_world_size()
    if rank == fail_rank:
        raise RuntimeError("rank failed on purpose")
    t = torch.empty(nbytes // 4)
    ok = True
    dist.barrier()
    start = time.perf_counter()
    for _ in range(reps):
        t.fill_(rank + 1)
        dist.all_reduce(t)
        ok &= bool((t == n * (n + 1) / 2).all())
    return time.perf_counter() - start, ok


@pytest.mark.slow
def test_shaped_allreduce(netem: None) -> None:
    reps = 2
    with emulated_cluster(2, RATE) as spec:
        ids = spec.netns_ids()
        results = spawn("tests.test_netem:_allreduce", 2, {"nbytes": NBYTES, "reps": reps}, timeout_s=120,
                        **spec.spawn_kwargs())
        links = [spec.link_bytes(r) for r in range(2)]
    _assert_gone(ids)
    assert all(ok for _, ok in results)
    bound = reps * ring_allreduce_seconds(NBYTES, 2, parse_rate(RATE))
    assert min(s for s, _ in results) >= 0.8 * bound, (results, bound)
    for up, down in links:  # each rank sends S per all_reduce of S bytes (n = 2), both ways through htb
        assert up >= reps * NBYTES and down >= reps * NBYTES, links


@pytest.mark.slow
@pytest.mark.parametrize("userns", [None, True], ids=["default", "user-namespace"])
def test_torn_down_when_a_rank_raises(netem: None, userns: bool | None) -> None:
    why = userns and netem_unavailable(userns)
    if why:
        pytest.skip(f"no unprivileged user namespaces here: {why}")
    with pytest.raises(ZenCommError, match="on purpose"), emulated_cluster(2, "1gbit", userns=userns) as spec:
        ids = spec.netns_ids()
        spawn("tests.test_netem:_allreduce", 2, {"nbytes": 4096, "reps": 1, "fail_rank": 0}, timeout_s=120,
              **spec.spawn_kwargs())
    _assert_gone(ids)


@pytest.mark.slow
def test_concurrent_clusters_are_separate(netem: None) -> None:
    with emulated_cluster(2, "1gbit") as a, emulated_cluster(2, "1gbit") as b:
        ids_a, ids_b = a.netns_ids(), b.netns_ids()
        assert not ids_a & ids_b and len(ids_a) == len(ids_b) == 3
    _assert_gone(ids_a | ids_b)


_HOLD_OPEN = """
import sys, time
from harness.netem import emulated_cluster
with emulated_cluster(2, "1gbit") as spec:
    print(*spec.netns_ids(), flush=True)
    time.sleep(60)
"""


@pytest.mark.slow
@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGKILL, -9)])
def test_torn_down_when_launcher_is_killed(netem: None, sig: int, code: int) -> None:
    proc = subprocess.Popen([sys.executable, "-c", _HOLD_OPEN], stdout=subprocess.PIPE, text=True)
    try:
        ids = set(proc.stdout.readline().split())
        proc.send_signal(sig)
        assert proc.wait(timeout=30) == code
    finally:
        proc.kill()
        proc.wait()
    _assert_gone(ids, wait_s=5.0)  # after SIGKILL the holders die by their parent-death signal
