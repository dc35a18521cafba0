"""An emulated bandwidth-limited cluster on one machine: one network namespace per node, of one rank or of
`ranks_per_node` consecutive ranks.

Why: on one machine gloo talks over loopback, where communication is CPU-bound (~6-10 Gbit/s bus
bandwidth) and far from the links the paper's cost model (section 5) is about. Here every node gets
its own NIC with a set rate, so a scheme's bytes turn into the time they would take on a real link.

How (the recipe of ../shared/spec/environment.md):
- a "switch" namespace holds a Linux bridge `br0` (STP off, bridge netfilter hooks off);
- each node namespace has `eth0`, one end of a veth pair whose other end `v<node>` is a bridge port,
  with MTU 65535 (the veth maximum: fewer packets, less CPU per byte); address 10.213.0.<node+1>/24,
  a subnet that exists only inside these namespaces (no route leads anywhere else);
- the ranks of one node share its namespace: what they send each other goes over its loopback (the
  kernel routes a packet to the node's own address through `lo`), the node's fast local link, unshaped;
  only the node's uplink is shaped, and all its ranks share it;
- both directions of each link are shaped: egress of the node's `eth0` (node -> switch) and egress of
  its bridge port `v<node>` (switch -> node), each with `htb rate R ceil R burst B` (B = 0.5 ms of
  traffic, at least 128 KiB) over a deep `bfifo` of 16 MiB. There is no latency emulation (netem
  delay is not in this kernel): latency belongs in the cost model.
- A namespace lives as long as a process inside it: each is held by a `sleep` started with
  `unshare -n` and the parent-death signal SIGKILL, so nothing is named, nothing can collide between
  concurrent runs, and nothing survives the launcher, even when it is SIGKILLed. On exit (normal,
  exception, Ctrl-C, or SIGTERM, which is turned into SystemExit meanwhile) every process still in
  these namespaces is killed, then the holders; the kernel then frees the namespaces and their links.
  Ranks join with `nsenter -t <holder> -n` (`ClusterSpec.wrap`); so can tools, e.g.
  `subprocess.run([*spec.wrap(0), "tc", "-s", "qdisc"])`, and `ClusterSpec.link_bytes` reads the shapers.

Privileges: namespaces need CAP_SYS_ADMIN and links/tc need CAP_NET_ADMIN. As root the namespaces are
created directly. Otherwise the switch holder is started with `unshare -U -r -n`: an unprivileged user
namespace (where the kernel allows it) in which we are root; node namespaces are created inside it and
ranks enter it with `nsenter -U --preserve-credentials` (files they write stay owned by the caller).
Where neither works, `NetemError` says what is missing (root or user namespaces; `ip`, `tc`,
`nsenter`, `unshare`, `setpriv`).

How close a shaped link comes to its rate (`scripts/netem_check.py`: gloo's dense all_reduce against the ring
bound) is in BENCHMARKS.md. Keep per-link rates low and messages large for clean timings: the shaper and the
ranks share the CPUs, and small collectives cost milliseconds in software.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import re
import shlex
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from zen.types import ZenError

log = logging.getLogger(__name__)

SUBNET = "10.213.0"
MAX_MTU = 65535  # the largest MTU a veth accepts
_TOOLS = ("ip", "tc", "nsenter", "unshare", "setpriv")
_HOLD = ["setpriv", "--pdeathsig", "KILL", "--", "sh", "-c", "echo ready; exec sleep infinity"]
_UNITS = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}


class NetemError(ZenError):
    """The emulated cluster cannot be built here (privileges, tools or kernel support missing)."""


def parse_rate(rate: str | float) -> float:
    """"1gbit", "2.5gbit", "500mbit", "1e9" (or a number) -> bits per second, as tc reads them."""
    if isinstance(rate, (int, float)):
        bits = float(rate)
    else:
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*(?:([kmgt]?)bit)?(?:/s)?\s*", rate.lower())
        if not m:
            raise ValueError(f"bad rate {rate!r}: use bits/s like '1gbit', '500mbit', '2.5gbit' or '1e9' "
                             "('mbps' is ambiguous: tc reads it as megabytes/s)")
        bits = float(m.group(1)) * _UNITS[m.group(2) or ""]
    if not bits > 0:
        raise ValueError(f"rate must be positive, got {rate!r}")
    return bits


def rate(text: str) -> str:
    """An argparse type: a link rate the emulated cluster accepts (1gbit, 500mbit, ...), kept as written."""
    try:
        parse_rate(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def ring_allreduce_seconds(nbytes: float, world_size: int, rate_bps: float) -> float:
    """The bandwidth bound of a ring all-reduce: each link carries 2(n-1)/n of the message."""
    return 2 * (world_size - 1) / world_size * nbytes * 8 / rate_bps


@dataclass
class ClusterSpec:
    """What `harness.launch.spawn` needs to run rank r in node r // ranks_per_node:
    `spawn(..., **spec.spawn_kwargs())`."""

    world_size: int  # ranks
    rate_bps: float
    mtu: int
    userns: bool  # True when the namespaces live in an unprivileged user namespace
    nodes: list[subprocess.Popen] = field(default_factory=list)  # holders of node 0..n-1's namespaces
    switch: subprocess.Popen | None = None  # holder of the switch's namespace (and the user namespace)
    ranks_per_node: int = 1

    @property
    def num_nodes(self) -> int:
        return self.world_size // self.ranks_per_node

    def address(self, node: int) -> str:
        return f"{SUBNET}.{node + 1}"

    @property
    def master_addr(self) -> str:
        return self.address(0)

    def wrap(self, rank: int) -> list[str]:
        return _enter(self.nodes[rank // self.ranks_per_node].pid, self.userns, net=True)

    def env(self, rank: int) -> dict[str, str]:
        return {"GLOO_SOCKET_IFNAME": "eth0"}  # else gloo binds 127.0.0.1 and peers get "refused"

    def spawn_kwargs(self) -> dict[str, Any]:
        return {"wrap": self.wrap, "env": self.env, "master_addr": self.master_addr}

    def link_bytes(self, node: int) -> tuple[int, int]:
        """Bytes the shaper passed (node -> switch, switch -> node) so far: proof traffic was shaped."""
        up = _run(self.wrap(node * self.ranks_per_node), ["tc", "-s", "class", "show", "dev", "eth0"])
        switch = _enter(self.switch.pid, self.userns, net=True)
        down = _run(switch, ["tc", "-s", "class", "show", "dev", f"v{node}"])
        return _sent_bytes(up), _sent_bytes(down)

    def netns_ids(self) -> set[str]:
        """Kernel ids ("net:[inode]") of the switch and node namespaces, while they exist."""
        return {os.readlink(f"/proc/{p.pid}/ns/net") for p in self._holders()}

    def _holders(self) -> list[subprocess.Popen]:
        return [*self.nodes, *([self.switch] if self.switch else [])]


@contextlib.contextmanager
def emulated_cluster(world_size: int, rate: str | float, mtu: int = MAX_MTU, userns: bool | None = None,
                     ranks_per_node: int = 1) -> Iterator[ClusterSpec]:
    """Build world_size / ranks_per_node nodes with links shaped to `rate` in both directions (a node's
    ranks share its namespace and link); always tear them down.

    `userns`: None tries root first, then an unprivileged user namespace; True/False forces one.
    """
    if ranks_per_node < 1 or world_size % ranks_per_node:
        raise ValueError(f"ranks_per_node must be >= 1 and divide world_size {world_size}, got {ranks_per_node}")
    if not 1 <= world_size // ranks_per_node <= 250:
        raise ValueError(f"the number of nodes must be in 1..250, got {world_size // ranks_per_node}")
    if not 68 <= mtu <= MAX_MTU:
        raise ValueError(f"mtu must be in 68..{MAX_MTU} (the veth maximum), got {mtu}")
    rate_bps = parse_rate(rate)
    missing = [t for t in _TOOLS if shutil.which(t) is None]
    if missing:
        raise NetemError(f"emulated cluster needs {', '.join(missing)} on PATH (iproute2, util-linux)")
    spec = ClusterSpec(world_size, rate_bps, mtu, userns=False, ranks_per_node=ranks_per_node)
    guard = _SigtermGuard()
    try:
        _start_switch(spec, userns)
        for _ in range(spec.num_nodes):
            spec.nodes.append(_hold(_enter(spec.switch.pid, spec.userns, net=False)))
        _build(spec)
        log.info("emulated cluster: %d nodes of %d ranks at %.3g bit/s%s", spec.num_nodes, ranks_per_node,
                 rate_bps, " (user namespace)" if spec.userns else "")
        yield spec
    finally:
        guard.deferring = True
        try:
            _teardown(spec)
        finally:
            guard.restore()


def _enter(pid: int, userns: bool, net: bool) -> list[str]:
    """Command prefix that enters `pid`'s user namespace (if any) and, with `net`, its network namespace."""
    if not userns and not net:
        return []
    return ["nsenter", "-t", str(pid), *(["-U", "--preserve-credentials"] if userns else []),
            *(["-n"] if net else []), "--"]


def _hold(prefix: list[str], new_user: bool = False) -> subprocess.Popen:
    """Start a process in a new network (and user) namespace that lives until we, or it, are killed."""
    cmd = [*prefix, "unshare", *(["-U", "-r"] if new_user else []), "-n", "--", *_HOLD]
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    ready = proc.stdout.readline()
    proc.stdout.close()
    if ready != b"ready\n":
        proc.wait()
        why = proc.stderr.read().decode(errors="replace").strip()
        proc.stderr.close()
        raise NetemError(f"`{shlex.join(cmd)}` failed: {why}")
    proc.stderr.close()
    if os.readlink(f"/proc/{proc.pid}/ns/net") == os.readlink("/proc/self/ns/net"):
        proc.kill()  # never configure the host's own network namespace
        proc.wait()
        raise NetemError("namespace holder is not in a new network namespace")
    return proc


def _start_switch(spec: ClusterSpec, userns: bool | None) -> None:
    errors = []
    for use in ([False, True] if userns is None else [userns]):
        try:
            spec.switch, spec.userns = _hold([], new_user=use), use
            return
        except NetemError as e:
            errors.append(str(e))
    raise NetemError("emulated cluster needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN) or unprivileged user "
                     "namespaces (sysctl kernel.unprivileged_userns_clone=1, user.max_user_namespaces > 0, "
                     "not blocked by AppArmor or seccomp); tried: " + "; ".join(errors))


def _shape(dev: str, rate_bps: float, mtu: int) -> str:
    """tc batch: htb with burst of 0.5 ms of traffic (>= 128 KiB) over a 16 MiB bfifo on `dev` egress."""
    burst = max(128 * 1024, int(rate_bps / 8 * 0.5e-3))
    quantum = min(200_000, 2 * (mtu + 14))
    rate = f"{int(rate_bps)}bit"
    return (f"qdisc add dev {dev} root handle 1: htb default 10\n"
            f"class add dev {dev} parent 1: classid 1:10 htb rate {rate} ceil {rate} burst {burst} "
            f"cburst {burst} quantum {quantum}\n"
            f"qdisc add dev {dev} parent 1:10 handle 10: bfifo limit {16 * 1024 * 1024}\n")


def _build(spec: ClusterSpec) -> None:
    sw = _enter(spec.switch.pid, spec.userns, net=True)
    links = "".join(f"link add v{n} mtu {spec.mtu} type veth peer name eth0 mtu {spec.mtu} netns {p.pid}\n"
                    f"link set v{n} master br0\nlink set v{n} up\n" for n, p in enumerate(spec.nodes))
    _run(sw, ["ip", "-batch", "-"], f"link add br0 type bridge stp_state 0\n{links}link set br0 up\n")
    _run(sw, ["tc", "-batch", "-"], "".join(_shape(f"v{n}", spec.rate_bps, spec.mtu)
                                           for n in range(spec.num_nodes)))
    try:  # bridged frames must not traverse iptables (empty here anyway, but costs CPU per packet)
        _run(sw, ["sh", "-c", "for f in /proc/sys/net/bridge/bridge-nf-call-*; do "
                              "[ ! -e $f ] || echo 0 > $f || exit 1; done"])
    except NetemError as e:
        log.warning("could not turn bridge netfilter off in the switch namespace: %s", e)
    for n in range(spec.num_nodes):
        node = spec.wrap(n * spec.ranks_per_node)
        _run(node, ["ip", "-batch", "-"],
             f"link set lo up\naddr add {spec.address(n)}/24 dev eth0\nlink set eth0 up\n")
        _run(node, ["tc", "-batch", "-"], _shape("eth0", spec.rate_bps, spec.mtu))


def _run(prefix: list[str], cmd: list[str], stdin: str | None = None) -> str:
    full = [*prefix, *cmd]
    log.debug("%s", shlex.join(full))
    done = subprocess.run(full, input=stdin, capture_output=True, text=True)
    if done.returncode != 0:
        raise NetemError(f"`{shlex.join(full)}` failed ({done.returncode}): {done.stderr.strip()}\n"
                         f"input:\n{stdin or ''}")
    return done.stdout


def _sent_bytes(tc_stats: str) -> int:
    m = re.search(r"Sent (\d+) bytes", tc_stats)
    return int(m.group(1)) if m else 0


def _teardown(spec: ClusterSpec) -> None:
    """Kill every process still inside our namespaces, then their holders; the kernel frees the rest."""
    holders = spec._holders()  # switch last: in the user-namespace case it holds the user namespace
    ours = set()
    for p in holders:
        with contextlib.suppress(OSError):
            ours.add(os.readlink(f"/proc/{p.pid}/ns/net"))
    for pid in _pids_in(ours) - {p.pid for p in holders}:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for p in holders:
        p.kill()  # a no-op once reaped, so a recycled pid is never hit
        p.wait()


def _pids_in(netns_ids: set[str]) -> set[int]:
    """Pids of the processes we can see whose network namespace is one of `netns_ids`."""
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{entry}/ns/net") in netns_ids:
                    found.add(int(entry))
    return found


class _SigtermGuard:
    """Turn SIGTERM into SystemExit(143) so the teardown runs; while it runs, defer SIGTERM until its end.

    Only in the main thread and only where SIGTERM has its default action (an application's own handler
    wins); the previous action is restored on exit.
    """

    def __init__(self) -> None:
        self.deferring = self.pending = False
        self.active = threading.current_thread() is threading.main_thread() and \
            signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
        if self.active:
            signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum: int, frame: Any) -> None:
        if self.deferring:
            self.pending = True
            return
        self.deferring = True
        raise SystemExit(128 + signum)

    def restore(self) -> None:
        if self.active:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            if self.pending:
                raise SystemExit(128 + signal.SIGTERM)


def time_allreduce(nbytes: int, iters: int = 5, warmup: int = 1) -> list[float]:
    """Rank target for `spawn`: seconds of each dense float32 gloo all_reduce of `nbytes` (max over ranks)."""
    import torch
    import torch.distributed as dist

    t = torch.ones(nbytes // 4)
    times = []
    for i in range(warmup + iters):
        dist.barrier()
        start = time.perf_counter()
        dist.all_reduce(t)
        elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        if i >= warmup:
            times.append(float(elapsed))
    return times
