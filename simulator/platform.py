"""SimGrid platforms: this machine's emulated cluster, the paper's cluster and larger ones (written as SimGrid
XML, which every SimGrid 3.x reads the same way).

A rank has a network host (where its messages leave from) and a processor (where its local work runs). On a
GPU cluster both are the rank's GPU. On the emulated cluster (harness/netem.py) every rank has its own network
namespace, a link shaped to the same rate each way and one bridge between them, but all ranks share this
machine's cores: their local work runs on one host of `cores` cores that SimGrid shares among them.

Links are split-duplex (each direction its own capacity) and the switch is full bisection: no backbone link
at all, so a flow is limited by its route's own links only. (A 1 TB/s fat-pipe backbone never bound and gave
the same clocks, but every flow crossed it, which coupled all of them in SimGrid's sharing solver: 64 GPUs'
all-to-all plus all-reduce took 66 s of engine time with it, 4 s without.) The
network model CM02 (max-min sharing with no TCP corrections) without cross-traffic (the acknowledgements'
share of the reverse direction: the emulated links measured 1.00-1.01x the ring formula), so a lone transfer
takes exactly its route's latency plus bytes over the slowest link: the closed form zen/costmodel.py uses.
"""

from __future__ import annotations

from dataclasses import dataclass, field

SPEED = 1e9  # flops per second of one core: local work of s seconds is s * SPEED flops
HEADER = ("<?xml version='1.0'?>\n<!DOCTYPE platform SYSTEM \"https://simgrid.org/simgrid.dtd\">\n"
          "<platform version=\"4.1\">\n")


@dataclass(frozen=True)
class Platform:
    """A SimGrid platform and where each rank lives on it. `all_gather`: the fixed all-gather's algorithm
    ("bruck" as DistComm runs it on gloo, "ring" as NCCL does)."""

    name: str
    xml: str
    net_hosts: tuple[str, ...]
    cpu_hosts: tuple[str, ...]
    all_gather: str = "bruck"
    gpus_per_node: int = 1  # > 1: all-reduces run two-level (NCCL across machines), engine.rounds
    latency_s: float = 0.0  # a message's latency end to end between two ranks on different machines
    intra_latency_s: float = 0.0  # ... between two GPUs of one machine
    collapse: bool = False  # rings as one flow each (engine._ring): for clusters of many ranks
    config: tuple[str, ...] = field(default=("network/model:CM02", "network/crosstraffic:0"))

    @property
    def world_size(self) -> int:
        return len(self.net_hosts)


def _bps(bits_per_s: float) -> str:
    return f"{bits_per_s / 8:.6g}Bps"


def emulated(ranks: int, link_bps: float, cores: int = 2, latency_s: float = 0.0) -> Platform:
    """This machine's emulated cluster: `ranks` namespaces, each with a link of `link_bps` bits per second
    each way to one bridge, and one processor of `cores` cores that every rank's local work shares.
    `latency_s`: one message's latency end to end (half on each side's link)."""
    lat = f"{latency_s / 2:.9g}s"
    xml = (HEADER + '<zone id="world" routing="Full">\n'
           f'  <cluster id="namespaces" prefix="rank" suffix="" radical="0-{ranks - 1}" speed="{SPEED:.0f}f"'
           f' bw="{_bps(link_bps)}" lat="{lat}" sharing_policy="SPLITDUPLEX"/>\n'
           '  <zone id="machine" routing="None">\n'
           f'    <host id="cpu" speed="{SPEED:.0f}f" core="{cores}"/>\n'
           "  </zone>\n</zone>\n</platform>\n")
    return Platform(f"emulated {ranks} x {link_bps / 1e9:g} Gbit/s, {cores} cores", xml,
                    tuple(f"rank{r}" for r in range(ranks)), ("cpu",) * ranks, latency_s=latency_s)


def machines(nodes: int, nic_bps: float, latency_s: float = 10e-6, cores: int = 1) -> Platform:
    """A flat cluster of `nodes` NICs of `nic_bps` each way on a full-bisection switch, one host per machine
    with `cores` cores (gpu_cluster's one GPU per machine; several cores: a machine of GPUs simulated as one
    endpoint, simulator.paper's `per="machine"`, its GPUs' concurrent work not slowing each other)."""
    xml = (HEADER + '<zone id="world" routing="Full">\n'
           f'  <cluster id="nics" prefix="gpu" suffix="" radical="0-{nodes - 1}" speed="{SPEED:.0f}f"'
           f' core="{cores}" bw="{_bps(nic_bps)}" lat="{latency_s / 2:.9g}s" sharing_policy="SPLITDUPLEX"/>\n'
           '</zone>\n</platform>\n')
    hosts = tuple(f"gpu{r}" for r in range(nodes))
    return Platform(f"{nodes} x 1 {'GPU' if cores == 1 else 'machine'}, NIC {nic_bps / 1e9:g} Gbit/s", xml, hosts,
                    hosts, all_gather="ring", latency_s=latency_s, collapse=True)


def gpu_cluster(nodes: int, gpus_per_node: int, nic_bps: float, intra_bps: float, latency_s: float = 10e-6,
                intra_latency_s: float = 2e-6) -> Platform:
    """`nodes` machines of `gpus_per_node` GPUs: inside a machine every GPU has its own link (NVLink) of
    `intra_bps` to the machine's fabric; the machine's GPUs share one NIC of `nic_bps` each way to a
    full-bisection switch. One GPU per machine: a flat cluster of NICs. Ranks are numbered machine by
    machine (as torchrun does). `latency_s`: a message's latency between the NICs end to end (a GPU's link
    in the machine adds `intra_latency_s`). Rings run collapsed (engine._ring)."""
    gpu = f'speed="{SPEED:.0f}f"'
    if gpus_per_node == 1:
        return machines(nodes, nic_bps, latency_s)
    lines = [HEADER + '<zone id="world" routing="Full">']
    for m in range(nodes):
        first = m * gpus_per_node
        lines.append(f'  <cluster id="node{m}" prefix="gpu" suffix="" radical="{first}-{first + gpus_per_node - 1}"'
                     f' {gpu} bw="{_bps(intra_bps)}" lat="{intra_latency_s / 2:.9g}s" sharing_policy="SPLITDUPLEX"'
                     f' router_id="router{m}"/>')
    for m in range(nodes):
        lines.append(f'  <link id="nic{m}" bandwidth="{_bps(nic_bps)}" latency="{latency_s / 2:.9g}s"'
                     ' sharing_policy="SPLITDUPLEX"/>')
    for a in range(nodes):
        for b in range(nodes):
            if a != b:
                lines.append(f'  <zoneRoute src="node{a}" dst="node{b}" gw_src="router{a}" gw_dst="router{b}"'
                             f' symmetrical="NO"><link_ctn id="nic{a}" direction="UP"/>'
                             f'<link_ctn id="nic{b}" direction="DOWN"/></zoneRoute>')
    lines.append("</zone>\n</platform>\n")
    hosts = tuple(f"gpu{r}" for r in range(nodes * gpus_per_node))
    return Platform(f"{nodes} x {gpus_per_node} GPUs, NIC {nic_bps / 1e9:g} Gbit/s", "\n".join(lines), hosts, hosts,
                    all_gather="ring", gpus_per_node=gpus_per_node, latency_s=latency_s + intra_latency_s,
                    intra_latency_s=intra_latency_s, collapse=True)

