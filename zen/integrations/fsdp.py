"""Zen as FSDP2's reduce-scatter: only the non-zero rows of each destination's shard cross the network.

FSDP2 (`torch.distributed.fsdp.fully_shard`) reduce-scatters every parameter group's flat gradient dense, even an
embedding's whose batch touched a few rows, or one a compressor already cut to 5%. `ZenReduceScatter` is the
`ReduceScatter` FSDP calls instead (`FSDPModule.set_custom_reduce_scatter`): Zen's push (paper section 5.3) with
FSDP's contiguous ownership, where the rank that owns a shard is its server and sums it. Each rank sends rank j
the non-zero rows of chunk j of its input (ids within the chunk, int32) in one `all_to_all_v` of the communicator
(phase `push`, every byte counted there), and rank j adds the P chunks in rank order into its output, then applies
FSDP's divide (ReduceOp.AVG: / P), as FSDP's own reduce-scatter does. A destination whose rows would cost at least
its dense chunk gets the dense chunk in the same message (the cost model per message: no extra round).

With a compressor (`compress="dgc"`) the group's flat gradient goes through it first (error feedback kept per
rank and group, as in the DDP hook): what crosses the network is what it chose.

Every rank must shard the same modules in the same order (FSDP requires it too); the process group of the
communicator is made once by `shard` over the mesh's ranks, so Zen's point-to-point traffic never mixes with
FSDP's own collectives on the mesh's group.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FSDPModule, fully_shard

from zen.comm.base import Deferred, Message, code_of
from zen.compress.base import PartContext
from zen.core import SyncConfig
from zen.core.build import compressor_for, dist_comm
from zen.core.synchronizer import ROW_BOUND_BYTES
from zen.ddp.hook import StepRecord
from zen.ddp.router import embedding_params
from zen.device import Clock
from zen.grad import extract_rows
from zen.integrations.fsdp_gather import DeltaAllGather
from zen.integrations.fsdp_plan import INDEX, ChunkPlan, Runtime
from zen.types import SyncStats, ZenInputError

try:  # public from torch 2.14; torch 2.13 keeps the base class in the private module
    from torch.distributed.fsdp import ReduceScatter
except ImportError:  # pragma: no cover - depends on the torch version
    from torch.distributed.fsdp._fully_shard._fsdp_api import ReduceScatter

SCHEMES = ("zen", "dense")  # zen: non-zero rows (dense chunks where cheaper); dense: every chunk dense, counted
PUSH = "push"
GATHERS = (None, "delta")  # the parameters' all-gather: FSDP's own, or only the rows changed since the last


class ZenReduceScatter(ReduceScatter):
    """FSDP2's reduce-scatter of one parameter group through Zen (see the module docstring). `width`: elements
    per row (an embedding group's row width; 1 for a group of mixed parameters or a compressed one); `sparse`:
    whether the group is embedding rows (not compressed); `group_name`: the process group FSDP was given for it."""

    def __init__(self, runtime: Runtime, key: str, group_name: str, width: int = 1, sparse: bool = False):
        self.runtime, self.key, self.group_name = runtime, key, group_name
        self.width = 1 if runtime.compressor is not None and not sparse else width
        self.sparse = sparse
        self._residual: torch.Tensor | float | None = None  # the compressor's residual norm after the last call

    def allocate(self, size: Any, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: dist.ProcessGroup,
                 op: Any, async_op: bool = False) -> Any:
        rt, comm = self.runtime, self.runtime.comm
        self._check(output_tensor, input_tensor, group, op)
        stats = SyncStats()
        clock = Clock(input_tensor.device).start()
        comm.begin_call(code_of(self._config(input_tensor)), sizes_agreed=True)
        comm.traffic = stats.traffic
        ids, values = self._rows(input_tensor)
        stats.nnz = int(ids.numel())
        if self._residual is not None:
            stats.extra["residual_norm"] = self._residual
        chunks = input_tensor.view(comm.world_size, -1, self.width)
        got = self._push(chunks, ids, values, stats)
        _sum_in_rank_order(output_tensor.view(-1, self.width), got)
        if op == dist.ReduceOp.AVG:
            output_tensor.div_(comm.world_size)
        return rt.finish(stats, self.sparse, clock.stop(), output_tensor, async_op)

    def _config(self, input_tensor: torch.Tensor) -> str:
        """What every rank must agree on for this call: the scheme, the row width, the size, the compressor."""
        squeeze = self.runtime.compressor.config if self.runtime.compressor is not None and not self.sparse else ""
        return f"fsdp|{self.runtime.scheme}|{self.width}|{input_tensor.numel()}|{input_tensor.dtype}|{squeeze}"

    def _check(self, output: torch.Tensor, input_tensor: torch.Tensor, group: dist.ProcessGroup, op: Any) -> None:
        """Refuse, alike on every rank, what this reduce-scatter was not made for (before any traffic)."""
        where = f"zen.fsdp: rank {self.runtime.comm.rank}, module {self.key!r}"
        if group.group_name != self.group_name:
            raise ZenInputError(f"{where}: FSDP handed a process group ({group.group_name}) other than the mesh's "
                                f"this reduce-scatter was made for ({self.group_name}); a group made with another "
                                f"mesh: call zen.fsdp.shard with the mesh the module was sharded with")
        P = self.runtime.comm.world_size
        if input_tensor.numel() != P * output.numel() or output.numel() % self.width \
                or output.dtype != input_tensor.dtype:
            raise ZenInputError(f"{where}: input of {input_tensor.numel()} elements and output of {output.numel()} "
                                f"({output.dtype}) do not make {P} chunks of rows of width {self.width}")
        if op not in (dist.ReduceOp.SUM, dist.ReduceOp.AVG):
            raise ZenInputError(f"{where}: reduce op {op} is not supported (SUM or AVG; a custom divide factor: "
                                f"set_force_sum_reduction_for_comms(True) lets FSDP divide after the sum)")

    def _rows(self, flat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's non-zero rows of the whole input (ascending ids over all chunks), or the compressor's choice
        (which also overwrites `flat` with exactly what it sent)."""
        rt = self.runtime
        if rt.compressor is not None and not self.sparse:
            ctx = PartContext(self.key, code_of(self.key), rt.step, rt.comm.world_size)
            rows = rt.compressor.compress(flat, ctx).rows()
            self._residual = rt.compressor.residual_norm(self.key, lazy=True)
            return rows
        return extract_rows(flat.view(-1, self.width))

    def _push(self, chunks: torch.Tensor, ids: torch.Tensor, values: torch.Tensor, stats: SyncStats
              ) -> list[Message]:
        """Every rank's message for our chunk, in rank order (our own: our dense chunk, never sent)."""
        comm = self.runtime.comm
        P, r, R = comm.world_size, comm.rank, chunks.shape[1]
        if P == 1:
            return [(ids[:0].to(INDEX), chunks[0])]
        cuts = torch.searchsorted(ids, torch.arange(P + 1, device=ids.device) * R)
        plan = ChunkPlan(R, self.width, chunks.element_size(), self.runtime.scheme)
        if comm.short_receives and not chunks.is_cuda:
            rows = comm.host(cuts)
            messages = [plan.message(chunks, ids, values, rows, j) for j in range(P)]
            bound = plan.bound if (P - 1) * plan.bound_bytes <= ROW_BOUND_BYTES else None
            got = comm.all_to_all_v(messages, PUSH, bound=bound)
        else:
            deferred = Deferred((ids[:0].to(INDEX), values[:0]), plan.counts(cuts),
                                lambda rows: [plan.built(chunks, ids, values, row, j) for j, row in enumerate(rows)])
            got = comm.all_to_all_v(deferred, PUSH)
        stats.extra["dense_peers"] = float(sum(1 for j, m in enumerate(got) if j != r and plan.is_dense(m)))
        stats.choice = "dense" if stats.extra["dense_peers"] == P - 1 else "rows"
        got[r] = (ids[:0].to(INDEX), chunks[r])
        return got


def _sum_in_rank_order(out: torch.Tensor, got: list[Message]) -> None:
    """out = the P chunks added in rank order (a COO message adds its rows; a zero row adds nothing, exactly)."""
    out.zero_()
    for ids, rows in got:
        if ids.shape[0] == 0 and rows.shape[0] == out.shape[0]:
            out.add_(rows)
        elif ids.shape[0]:
            out.index_add_(0, ids.long(), rows)


# ---------------------------------------------------------------- one line for the user


@dataclass
class ZenFSDP:
    """What `shard` installed: the reduce-scatter per FSDP module (by its name in the model) and the shared
    runtime; `last_step` is the record of the last backward (per call its bytes per phase)."""

    comms: dict[str, ZenReduceScatter]
    runtime: Runtime

    @property
    def last_step(self) -> StepRecord:
        return self.runtime.last_step


def shard(model: nn.Module, scheme: str = "zen", compress: str | None = None, density: float = 0.05,
          compress_options: dict[str, Any] | None = None, sparse_params: Any = None, gather: str | None = None,
          **fsdp_kwargs: Any) -> ZenFSDP:
    """Zen as the reduce-scatter of every FSDP module of `model`, in one line.

    A model not yet sharded is sharded here: `fully_shard` on each largest module of embedding tables of one width
    (`table_units`: its own parameter group, so its flat gradient is rows of that width), then on the model, with
    `fsdp_kwargs` (mesh, mp_policy, ...). A model the user sharded keeps its modules. `sparse_params`: the
    embeddings (as `zen.ZenHookState`'s; default: every nn.Embedding / nn.EmbeddingBag); their groups keep their
    natural sparsity, `compress` acts on the others. `gather="delta"`: the parameters' all-gathers send only the
    rows changed since the last one (zen.integrations.fsdp_gather; one unsharded copy per group and rank); None:
    FSDP's own. Every rank must call it alike; it makes one process group over the mesh's ranks."""
    if scheme not in SCHEMES or gather not in GATHERS:
        raise ZenInputError(f"zen.fsdp: unknown scheme {scheme!r} or gather {gather!r}; choose a scheme of "
                            f"{', '.join(SCHEMES)} and a gather of {GATHERS}")
    tables = slots(model, {id(p) for p in embedding_params(model if sparse_params is None else sparse_params)})
    if not any(isinstance(m, FSDPModule) for m in model.modules()):
        for m in table_units(model, tables):
            fully_shard(m, **fsdp_kwargs)
        fully_shard(model, **fsdp_kwargs)
    elif fsdp_kwargs:
        raise ZenInputError(f"zen.fsdp: {sorted(fsdp_kwargs)} apply only to a model not yet sharded")
    modules = [(name, m) for name, m in model.named_modules() if isinstance(m, FSDPModule)]
    groups = {_mesh_group(m).group_name: _mesh_group(m) for _, m in modules}
    if len(groups) != 1:
        raise ZenInputError(f"zen.fsdp: the model's FSDP modules use {len(groups)} process groups; shard one mesh")
    fsdp_group = next(iter(groups.values()))
    comm = dist_comm(dist.new_group(dist.get_process_group_ranks(fsdp_group)), None, _device_of(model))
    compressor = compressor_for(SyncConfig(compress=compress, density=density, compress_options=compress_options))
    runtime = Runtime(comm, scheme, compressor)
    comms = {}
    for name, m in modules:
        params = _group_params(m)
        sparse = bool(params) and all(slot in tables for slot, _ in params)
        width = _row_width([p for _, p in params])
        comms[name] = ZenReduceScatter(runtime, name or "<root>", fsdp_group.group_name, width, sparse)
        m.set_custom_reduce_scatter(comms[name])
        if gather == "delta":
            m.set_custom_all_gather(DeltaAllGather(runtime, name or "<root>", fsdp_group.group_name, width))
    model.register_forward_pre_hook(runtime.next_step, prepend=True)
    return ZenFSDP(comms, runtime)


Slot = tuple[int, str]  # a parameter's place: its module (by id) and its name there, which FSDP keeps


def slots(model: nn.Module, ids: set[int]) -> set[Slot]:
    """Where the parameters `ids` sit in the model: FSDP swaps the tensors, not their places."""
    return {(id(m), name) for m in model.modules() for name, p in m.named_parameters(recurse=False) if id(p) in ids}


def table_units(model: nn.Module, tables: set[Slot]) -> list[nn.Module]:
    """The largest modules below `model` whose parameters are all embedding tables of one row width: each becomes
    one FSDP group (one reduce-scatter and one all-gather for all its tables, rows of that width)."""
    units = []
    for child in model.children():
        slots = {(id(m), n): p for m in child.modules() for n, p in m.named_parameters(recurse=False)}
        widths = {math.prod(p.shape[1:]) for p in slots.values()}
        if slots and set(slots) <= tables and len(widths) == 1:
            units.append(child)
        else:
            units += table_units(child, tables)
    return units


def _fsdp_state(module: nn.Module) -> Any:
    return module._get_fsdp_state()  # type: ignore[operator]


def _mesh_group(module: nn.Module) -> dist.ProcessGroup:
    """The process group FSDP reduce-scatters this module's gradients over."""
    group = _fsdp_state(module)._fsdp_param_group
    if group is None:
        return dist.group.WORLD
    return group.mesh_info.shard_process_group


def _group_params(module: nn.Module) -> list[tuple[Slot, torch.Tensor]]:
    """The parameters of the module's FSDP parameter group with their places (none for a module without one)."""
    group = _fsdp_state(module)._fsdp_param_group
    if group is None:
        return []
    return [((id(p._module_info.module), p._module_info.param_name), p.sharded_param) for p in group.fsdp_params]


def _row_width(params: list[torch.Tensor]) -> int:
    """Elements per row common to every parameter's dim-0 rows: each one's chunk of the flat gradient is whole
    rows of its own width, so the greatest common divisor tiles them all."""
    widths = [math.prod(p.shape[1:]) for p in params if p.dim() >= 1]
    return math.gcd(*widths) if widths else 1


def _device_of(model: nn.Module) -> torch.device:
    for p in model.parameters():
        return p.device
    return torch.device("cpu")
