"""Faults against real gloo ranks: a late peer, a skipped call, ranks configured apart, a re-created group,
a killed launcher. Every rank must raise a clear error (or return the right sum), none may hang, abort or
outlive its launcher."""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

import zen
from harness.launch import FOLDER_PREFIX, spawn, sweep_stale_folders

from .helpers import at_once, processes_in, selected, value


@pytest.mark.slow
@pytest.mark.parametrize("scheme", ["allreduce", "zen", "agsparse"])
def test_late_peer_poisons_instead_of_pairing_with_a_stale_call(scheme: str) -> None:
    """A peer late by more than the timeout: survivors raise ZenCommError, their retry is refused at once
    naming the first failure, the late rank raises too (no wrong sum, no abort), and all exit promptly."""
    start = time.monotonic()
    out = spawn("tests.fault_cases:late_peer", 3, {"scheme": scheme, "timeout_s": 3.0, "late_s": 6.0},
                timeout_s=120)
    assert time.monotonic() - start < 40
    for r, seen in enumerate(out):
        assert all(s == "ok" or s.startswith("ZenCommError") for s in seen["seen"]), (r, seen)
    for survivor in out[:2]:
        first, retry = survivor["seen"]
        assert first.startswith("ZenCommError") and "failed earlier" in retry, survivor
        assert survivor["elapsed"] < 12, survivor
    assert out[2]["seen"][0].startswith("ZenCommError"), out[2]


SKIPPED = ["allreduce", "zen", "agsparse", "sparcml"]
APART = ["options", "validate", "unknown_scheme", "bad_out", "leaf_out"]


@pytest.fixture(scope="module")
def skipped_calls() -> list[dict[str, list[str]]]:
    """Every scheme of test_skipped_call_raises_on_every_rank_with_a_tag in one launch of 3 ranks."""
    return spawn("tests.fault_cases:skipped_calls", 3, {"schemes": SKIPPED, "tagged": True}, timeout_s=240)


@pytest.fixture(scope="module")
def configured_apart() -> list[dict[str, str]]:
    """Every kind of test_configured_apart_raises_on_every_rank in one launch of 3 ranks (validate last: its
    rank skips the check, so the others may wait out their timeout)."""
    kinds = sorted(APART, key=lambda kind: kind == "validate")
    return spawn("tests.fault_cases:configured_apart_each", 3, {"kinds": kinds}, timeout_s=240)


@pytest.mark.slow
@pytest.mark.parametrize("scheme", SKIPPED)
def test_skipped_call_raises_on_every_rank_with_a_tag(scheme: str, skipped_calls: list[dict[str, list[str]]]) -> None:
    """Rank 1 skips step 0 and tags its calls with the step: every rank raises at its first call."""
    out = [per_rank[scheme] for per_rank in skipped_calls]
    for r, seen in enumerate(out):
        assert seen and seen[0].startswith("ZenInputError"), (r, seen)


@pytest.mark.slow
@pytest.mark.parametrize("kind", APART)
def test_configured_apart_raises_on_every_rank(kind: str, configured_apart: list[dict[str, str]]) -> None:
    """One rank differs (scheme options, validate, an unknown scheme, a bad or a leaf `out=`): every rank gets
    ZenInputError (ZenCommError at worst for validate, whose rank skips the check), none hangs or aborts."""
    out = [per_rank[kind] for per_rank in configured_apart]
    allowed = ("ZenInputError", "ZenCommError") if kind == "validate" else ("ZenInputError",)
    for r, seen in enumerate(out):
        assert seen.startswith(allowed), (kind, r, seen)
    if kind != "validate":
        assert "dead or missing peer" not in " ".join(out)


@pytest.mark.slow
def test_recreated_group_gets_a_new_communicator(tmp_path: Path) -> None:
    """After destroy + init with permuted ranks, and with one rank fewer, every scheme sums right."""
    out = spawn("tests.fault_cases:regroup", 3, {"schemes": zen.schemes(), "store_dir": str(tmp_path)},
                timeout_s=300)
    for r, ok in enumerate(out):
        bad = [k for k, v in ok.items() if not v]
        assert not bad, (r, bad)


def test_timeouts_are_checked() -> None:
    with pytest.raises(zen.ZenInputError):
        zen.ZenHookState(timeout_s=0)
    from zen.comm.dist import timeout_seconds

    with pytest.raises(zen.ZenInputError):
        timeout_seconds(0)
    os.environ["ZEN_TIMEOUT_S"] = "7"
    try:
        assert timeout_seconds() == 7.0  # read at call time
    finally:
        del os.environ["ZEN_TIMEOUT_S"]


_LAUNCHER = textwrap.dedent("""
    import sys
    from harness.launch import spawn
    if sys.argv[1] == "netem":
        from harness.netem import emulated_cluster
        with emulated_cluster(2, "1gbit") as spec:
            print(" ".join(spec.netns_ids()), flush=True)
            spawn("tests.fault_cases:sleeper", 2, {"seconds": 120}, **spec.spawn_kwargs())
    else:
        print("", flush=True)
        spawn("tests.fault_cases:sleeper", 2, {"seconds": 120})
""")


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if entry.isdigit() and int(fields[1]) == pid and fields[0] != "Z":
            found.append(int(entry))
    return found


def _running(pids: list[int]) -> list[int]:
    alive = []
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            alive.append(pid)
    return alive


@pytest.mark.slow
@pytest.mark.parametrize("where", ["loopback", "netem"])
def test_ranks_die_with_a_killed_launcher(where: str, request: pytest.FixtureRequest) -> None:
    """SIGKILL of the launcher: its ranks are gone within 2 s, so are the namespaces; its folder goes at the
    next launch."""
    if where == "netem":
        request.getfixturevalue("netem")
    proc = subprocess.Popen([sys.executable, "-c", _LAUNCHER, where], stdout=subprocess.PIPE, text=True,
                            cwd=Path(__file__).parent.parent)
    try:
        ids = set(proc.stdout.readline().split())
        deadline = time.monotonic() + 60
        while len(ranks := [p for p in _children(proc.pid) if "harness.launch" in Path(f"/proc/{p}/cmdline").read_text()
                            ]) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(ranks) == 2
        time.sleep(1.0)  # the ranks are past start-up
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        killed = time.monotonic()
        while _running(ranks) and time.monotonic() < killed + 2.0:
            time.sleep(0.05)
        assert not _running(ranks), "ranks outlived their launcher by 2 s"
        while ids and processes_in(ids) and time.monotonic() < killed + 2.0:  # the namespaces' holders too
            time.sleep(0.05)
        if ids:
            assert not processes_in(ids)
        sweep_stale_folders()  # what the next launch does first
        assert not list(Path(tempfile.gettempdir()).glob(f"{FOLDER_PREFIX}{proc.pid}-*"))
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.slow
def test_stale_folders_are_swept(tmp_path: Path) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f"{FOLDER_PREFIX}{dead.pid}-abc"
    live = tmp_path / f"{FOLDER_PREFIX}{os.getpid()}-abc"
    stale.mkdir()
    live.mkdir()
    assert sweep_stale_folders(str(tmp_path)) == [str(stale)]
    assert live.is_dir() and not stale.exists()


PEER_TIMEOUT_S = 3.0


@pytest.fixture(scope="module")
def peer_faults(request: pytest.FixtureRequest) -> dict[tuple[str, str], Any]:
    """The selected cases of test_dead_or_frozen_peer, two launches at a time: their ranks mostly wait (out the
    timeout, or for the frozen peer's SIGCONT), so the waits overlap."""
    cases = [(item.callspec.params["kind"], item.callspec.params["scheme"])
             for item in selected(request, "test_dead_or_frozen_peer")]
    return at_once({(kind, scheme): functools.partial(
        spawn, "tests.fault_cases:peer_fault", 3, {"kind": kind, "scheme": scheme, "timeout_s": PEER_TIMEOUT_S},
        timeout_s=120) for kind, scheme in cases}, workers=2)


@pytest.mark.slow
@pytest.mark.parametrize("scheme", ["allreduce", "zen", "sparcml"])
@pytest.mark.parametrize("kind", ["before", "during", "after", "frozen"])
def test_dead_or_frozen_peer(kind: str, scheme: str, peer_faults: dict[tuple[str, str], Any]) -> None:
    """Rank 1 killed before / during / after a call, or frozen (SIGSTOP) mid-call: the survivors' calls
    raise ZenCommError within the timeout + 5 s (or sum right, before the fault), none hangs."""
    timeout_s = PEER_TIMEOUT_S
    out = value(peer_faults[(kind, scheme)])
    for r in (0, 2):
        seen = out[r]["seen"]
        assert all(s == "ok" or s.startswith("ZenCommError") for s in seen), (r, seen)
        assert seen[-1].startswith("ZenCommError"), (r, seen)  # the fault shows by the second call
        assert out[r]["elapsed"] < 2 * timeout_s + 5, (r, out[r])
