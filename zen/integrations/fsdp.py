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
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FSDPModule, fully_shard

from zen.comm.base import Communicator, Deferred, Message, code_of
from zen.comm.dist import DistComm
from zen.compress import make_compressor
from zen.compress.base import Compressor, PartContext
from zen.ddp.hook import StepRecord
from zen.ddp.router import embedding_params
from zen.device import Clock
from zen.grad import extract_rows
from zen.sync.synchronizer import ROW_BOUND_BYTES
from zen.types import SyncStats, ZenInputError

try:  # public from torch 2.14; torch 2.13 keeps the base class in the private module
    from torch.distributed.fsdp import ReduceScatter
except ImportError:  # pragma: no cover - depends on the torch version
    from torch.distributed.fsdp._fully_shard._fsdp_api import ReduceScatter

SCHEMES = ("zen", "dense")  # zen: non-zero rows (dense chunks where cheaper); dense: every chunk dense, counted
PUSH = "push"
INDEX = torch.int32  # a row id within a chunk: FSDP's chunks stay far below 2**31 rows


@dataclass
class Runtime:
    """What every ZenReduceScatter of one sharded model shares: the communicator (its own process group), the
    compressor and its step counter, and the record of the last backward's calls."""

    comm: Communicator
    scheme: str
    compressor: Compressor | None = None
    step: int = 0
    last_step: StepRecord = field(default_factory=StepRecord)
    _seen: set[str] = field(default_factory=set)

    def begin(self, key: str) -> None:
        """A group's call: a key seen again starts the next backward (a new record, the compressor's next step)."""
        if key in self._seen:
            self._seen.clear()
            self.step += 1
            self.last_step = StepRecord()
        self._seen.add(key)


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
        rt.begin(self.key)
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
        rt.last_step.parts.append((stats, self.sparse))
        rt.last_step.spans.append(clock.stop())
        if async_op:
            done: torch.futures.Future = torch.futures.Future()
            done.set_result([output_tensor])
            return torch._C._distributed_c10d._create_work_from_future(done)
        return None

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
        plan = _Plan(R, self.width, chunks.element_size(), self.runtime.scheme)
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


@dataclass(frozen=True)
class _Plan:
    """The cost model of one call, per destination: its rows as COO (int32 id + the row) while that is cheaper
    than its dense chunk of R rows, else the chunk. A dense message carries no ids and R rows."""

    R: int
    width: int
    value_bytes: int
    scheme: str

    @property
    def most_ids(self) -> int:
        """The most rows a COO message can have (one more and the dense chunk is no dearer)."""
        if self.scheme == "dense":
            return 0
        row = self.width * self.value_bytes
        return min(self.R, max(0, math.ceil(self.R * row / (INDEX.itemsize + row)) - 1))

    def bound(self, _rank: int) -> list[int]:
        return [self.most_ids, self.R]

    @property
    def bound_bytes(self) -> int:
        return self.most_ids * INDEX.itemsize + self.R * self.width * self.value_bytes

    def is_dense(self, m: Message) -> bool:
        return m[0].shape[0] == 0 and m[1].shape[0] == self.R and self.R > 0

    def message(self, chunks: torch.Tensor, ids: torch.Tensor, values: torch.Tensor, cuts: list[int], j: int
                ) -> Message:
        a, b = cuts[j], cuts[j + 1]
        return self.built(chunks, ids, values, [0, 0, a, b - a], j)

    def counts(self, cuts: torch.Tensor) -> torch.Tensor:
        """(P, 4) on the device: per destination the ids and rows to send, and where its rows start and how many."""
        k = cuts[1:] - cuts[:-1]
        dense = k > self.most_ids if self.scheme != "dense" else torch.ones_like(k, dtype=torch.bool)
        ids = torch.where(dense, torch.zeros_like(k), k)
        rows = torch.where(dense, torch.full_like(k, self.R), k)
        return torch.stack([ids, rows, cuts[:-1], k], dim=1)

    def built(self, chunks: torch.Tensor, ids: torch.Tensor, values: torch.Tensor, row: list[int], j: int
              ) -> Message:
        """Destination j's message from its (ids, rows, start, k) numbers (`counts`'s row, or made on the host)."""
        start, k = row[2], row[3]
        if k > self.most_ids or self.scheme == "dense":
            return ids[:0].to(INDEX), chunks[j]
        return (ids[start : start + k] - j * self.R).to(INDEX), values[start : start + k]


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
          compress_options: dict[str, Any] | None = None, sparse_params: Any = None, **fsdp_kwargs: Any) -> ZenFSDP:
    """Zen as the reduce-scatter of every FSDP module of `model`, in one line.

    A model not yet sharded is sharded here: `fully_shard` on each embedding module (its own parameter group, so
    its flat gradient is rows of one width), then on the model, with `fsdp_kwargs` (mesh, mp_policy, ...). A model
    the user sharded keeps its modules. `sparse_params`: the embeddings (as `zen.ZenHookState`'s; default: every
    nn.Embedding / nn.EmbeddingBag); their groups keep their natural sparsity, `compress` acts on the others.
    Every rank must call it alike; it makes one process group over the mesh's ranks."""
    if scheme not in SCHEMES:
        raise ZenInputError(f"zen.fsdp: unknown scheme {scheme!r}; choose one of {', '.join(SCHEMES)}")
    tables = _slots(model, {id(p) for p in embedding_params(model if sparse_params is None else sparse_params)})
    if not any(isinstance(m, FSDPModule) for m in model.modules()):
        for m in [m for m in model.modules() if m is not model and _owns_only(m, tables)]:
            fully_shard(m, **fsdp_kwargs)
        fully_shard(model, **fsdp_kwargs)
    elif fsdp_kwargs:
        raise ZenInputError(f"zen.fsdp: {sorted(fsdp_kwargs)} apply only to a model not yet sharded")
    modules = [(name, m) for name, m in model.named_modules() if isinstance(m, FSDPModule)]
    groups = {_mesh_group(m).group_name: _mesh_group(m) for _, m in modules}
    if len(groups) != 1:
        raise ZenInputError(f"zen.fsdp: the model's FSDP modules use {len(groups)} process groups; shard one mesh")
    fsdp_group = next(iter(groups.values()))
    comm = DistComm(dist.new_group(dist.get_process_group_ranks(fsdp_group)), device=_device_of(model))
    compressor = make_compressor(compress, density, **(compress_options or {})) if compress else None
    runtime = Runtime(comm, scheme, compressor)
    comms = {}
    for name, m in modules:
        params = _group_params(m)
        sparse = bool(params) and all(slot in tables for slot, _ in params)
        width = _row_width([p for _, p in params])
        comms[name] = ZenReduceScatter(runtime, name or "<root>", fsdp_group.group_name, width, sparse)
        m.set_custom_reduce_scatter(comms[name])
    return ZenFSDP(comms, runtime)


Slot = tuple[int, str]  # a parameter's place: its module (by id) and its name there, which FSDP keeps


def _slots(model: nn.Module, ids: set[int]) -> set[Slot]:
    """Where the parameters `ids` sit in the model: FSDP swaps the tensors, not their places."""
    return {(id(m), name) for m in model.modules() for name, p in m.named_parameters(recurse=False) if id(p) in ids}


def _owns_only(module: nn.Module, tables: set[Slot]) -> bool:
    """Whether a module's own parameters are all embedding tables (it becomes an FSDP module of its own)."""
    own = [name for name, _ in module.named_parameters(recurse=False)]
    return bool(own) and all((id(module), name) in tables for name in own)


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
