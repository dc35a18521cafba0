"""The one way a synchronizer is built, for the functional API (`zen.allreduce`, `zen.simulate`, `zen.sync`)
and for each lane of the DDP hook: its communicator, its two-level node groups (checked, with one error text),
its compressor, all from one `SyncConfig`."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist

from zen.comm.base import Communicator, Pending
from zen.comm.dist import DistComm
from zen.comm.sim import SimComm, SimGroup
from zen.compress import Compressor, make_compressor
from zen.core.config import SyncConfig
from zen.core.synchronizer import Synchronizer
from zen.registry import Scheme
from zen.twolevel import NodeComms, dist_node_comms, nodes_of, sim_node_comms
from zen.types import ZenInputError

NEEDS_DEFAULT_GROUP = ("zen: ranks_per_node > 1 needs the default group (group=None): its node groups are made "
                       "of all ranks")


def check_nodes(config: SyncConfig, world_size: int | None, group: dist.ProcessGroup | None = None) -> None:
    """ZenInputError, alike on every rank, for a ranks_per_node the world cannot be cut into (`world_size`
    None: not known yet) or two-level sync over a group other than the default one."""
    if world_size is not None:
        nodes_of(world_size, config.ranks_per_node)
    if config.two_level and group is not None:
        raise ZenInputError(NEEDS_DEFAULT_GROUP)


def agree_nodes(config: SyncConfig, comm: Communicator) -> None:
    """Two-level: every rank must make the same sub-groups, so they compare ranks_per_node first, in one small
    all-gather (a rank with 1 meets it with its first call instead: misaligned calls, a ZenCommError)."""
    if not config.two_level:
        return
    nodes_of(comm.world_size, config.ranks_per_node)
    seen = [row[0] for row in comm.all_gather_fixed([config.ranks_per_node])]
    if len(set(seen)) > 1:
        raise ZenInputError(f"zen: rank {comm.rank}: ranks_per_node differs across ranks ({seen})")


def dist_nodes(config: SyncConfig, comm: DistComm, group: dist.ProcessGroup | None = None) -> NodeComms | None:
    """The two-level sub-groups of the default group for `comm`'s payloads (every rank creates every node's
    and every local rank's group, in one order); None for flat."""
    check_nodes(config, comm.world_size, group)
    if not config.two_level:
        return None
    return dist_node_comms(config.ranks_per_node, comm.timeout_s, config.intra, device=comm.device)


def dist_comm(group: dist.ProcessGroup | None, timeout_s: float | None, device: torch.device) -> DistComm:
    """The communicator over torch.distributed `group` (None: the default) for payloads on `device`."""
    return DistComm(group, timeout_s=timeout_s, device=device)


def compressor_for(config: SyncConfig) -> Compressor | None:
    """A new compressor of the configuration (fresh residuals), or None."""
    if config.compress is None:
        return None
    return make_compressor(config.compress, config.density, **dict(config.compress_options))


def build(config: SyncConfig, comm: Communicator, nodes: NodeComms | None = None, *, instance: Scheme | None = None,
          compressor: Compressor | None = None, on_issue: Callable[[Pending], object] | None = None) -> Synchronizer:
    """A synchronizer of `config` over `comm` (two-level: `nodes`, made for the configuration's `intra`).
    `compressor`: one shared with other synchronizers (the hook's lanes), else the configuration's own;
    `instance`: a scheme object to run (`zen.sync`); `on_issue`: see Synchronizer."""
    check_nodes(config, comm.world_size)
    if config.two_level != (nodes is not None) or (nodes is not None and nodes.mode != config.intra):
        raise ZenInputError(f"zen: ranks_per_node {config.ranks_per_node} and intra {config.intra!r} need node "
                            f"groups of that mode exactly when > 1")
    if compressor is None:
        compressor = compressor_for(config)
    return Synchronizer(config, comm, nodes, instance=instance, compressor=compressor, on_issue=on_issue)


def simulated(config: SyncConfig, devices: Sequence[torch.device], timeout_s: float, seed: int | None
              ) -> tuple[SimGroup, list[Synchronizer]]:
    """len(devices) virtual ranks (zen.comm.sim) and a synchronizer of `config` for each (two-level: over
    sub-groups of the simulated group)."""
    check_nodes(config, len(devices))
    group = SimGroup(len(devices), timeout_s=timeout_s, seed=seed)
    node_comms = sim_node_comms(group, config.ranks_per_node, config.intra) if config.two_level else None
    return group, [build(config, SimComm(group, r, device), node_comms(r, device) if node_comms else None)
                   for r, device in enumerate(devices)]
