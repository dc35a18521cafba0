"""Bodies of real FSDP2 ranks for tests/test_fsdp.py and tests/test_fsdp_nccl_rules.py: a small model with an
embedding trained by fully_shard, with FSDP's own reduce-scatter or with zen.fsdp, returning the full parameters
after N steps and, per reduce-scatter call, the bytes the rank sent next to what its input says it should send."""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

import zen.fsdp
from tests import nccl_rules  # registers the "ncclrules" backend (tests/test_fsdp_nccl_rules.py)
from zen.types import ZenInputError

INDEX_BYTES = 4


class Net(nn.Module):
    """An embedding (its own FSDP group: rows of `width`) and a small dense head (the root's group)."""

    def __init__(self, rows: int, width: int):
        super().__init__()
        self.emb = nn.Embedding(rows, width)
        self.head = nn.Linear(width, 3)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.emb(ids).mean(1))


class Expect:
    """Wraps a reduce-scatter: the push bytes each call must send, from its input alone (per destination its non-zero
    rows as int32 id + row, or its dense chunk where that is no dearer), read after the call: a compressor leaves
    exactly what it sent in the input."""

    def __init__(self, inner: zen.fsdp.ZenReduceScatter, dense: bool):
        self.inner, self.dense, self.calls = inner, dense, []

    def allocate(self, size: Any, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return self.inner.allocate(size, dtype=dtype, device=device)

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: Any, op: Any,
                 async_op: bool = False) -> Any:
        result = self.inner(output_tensor, input_tensor, group, op, async_op)
        P, r = dist.get_world_size(group), dist.get_rank(group)
        w = self.inner.width
        chunks = input_tensor.detach().view(P, -1, w)
        R, row = chunks.shape[1], w * input_tensor.element_size()
        expected = 0
        for j in range(P):
            if j != r:
                k = int((chunks[j] != 0).any(dim=1).sum())
                coo = k * (INDEX_BYTES + row)
                expected += R * row if self.dense or coo >= R * row else coo
        stats = self.inner.runtime.last_step.parts[-1][0]
        self.calls.append({"expected": expected, "sent": stats.traffic.sent.get("push", 0), "choice": stats.choice,
                           "meta": stats.traffic.sent.get("meta", 0), "dense_bytes": (P - 1) * R * row})
        return result


def _mesh() -> DeviceMesh:
    """The ranks' 1-D mesh. Under the NCCL-rules double, whose groups carry no name (DeviceMesh needs one), FSDP's
    own collectives go over a gloo group and zen.fsdp's exchange over the double (the group `shard` makes)."""
    if dist.get_backend() == nccl_rules.NAME:
        return DeviceMesh.from_group(dist.new_group(backend="gloo"), "cpu")
    return init_device_mesh("cpu", (dist.get_world_size(),))


def _ids(gen: torch.Generator, rows: int, used: int) -> torch.Tensor:
    """A batch touching at most `used` of the table's rows, zipf-like (ranks overlap on the popular ones)."""
    weights = 1.0 / torch.arange(1, used + 1, dtype=torch.float64) ** 1.1
    return torch.multinomial(weights.expand(6, -1), 4, replacement=True, generator=gen) * (rows // used)


def train(case: dict[str, Any]) -> dict[str, Any]:
    """One case: `scheme` "fsdp" (FSDP's own reduce-scatter) or a zen.fsdp scheme, `rows`/`width`/`used` of the
    embedding, `reduce_dtype`, `compress`, `steps`. Returns the full parameters and the zen calls' bytes."""
    torch.manual_seed(0)
    model = Net(case["rows"], case["width"])
    mesh = _mesh()
    dtype = getattr(torch, case.get("reduce_dtype", "float32"))
    kwargs = {"mesh": mesh, "mp_policy": MixedPrecisionPolicy(reduce_dtype=dtype)}
    calls: list[Expect] = []
    if case["scheme"] == "fsdp":
        fully_shard(model.emb, **kwargs)
        fully_shard(model, **kwargs)
    else:
        state = zen.fsdp.shard(model, scheme=case["scheme"], compress=case.get("compress"), density=0.1,
                               gather=case.get("gather"),
                               compress_options={"momentum": 0.0} if case.get("compress") == "dgc" else None,
                               **kwargs)
        for name, comm in state.comms.items():
            calls.append(Expect(comm, case["scheme"] == "dense"))
            model.get_submodule(name).set_custom_reduce_scatter(calls[-1])
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(100 + dist.get_rank())
    for _ in range(case.get("steps", 4)):
        opt.zero_grad()
        model(_ids(gen, case["rows"], case.get("used", case["rows"]))).pow(2).mean().backward()
        opt.step()
    params = {n: p.full_tensor().detach().clone() for n, p in model.named_parameters()}
    gathered = sum(s.traffic.sent.get("gather", 0) for s in state.last_step.stats) if calls else 0
    squeeze = state.runtime.compressor if calls else None
    residuals = {k: float(v.norm()) for k, v in squeeze.memory.items()} if squeeze is not None else {}
    return {"params": params, "calls": [c for e in calls for c in e.calls], "gather_sent": gathered,
            "residuals": residuals}


def cases(cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Many cases in one launch (each trains a fresh model)."""
    return [train(c) for c in cases]


def other_mesh() -> str:
    """A zen reduce-scatter made for one mesh, set on a module sharded with another: every rank raises."""
    torch.manual_seed(0)
    P = dist.get_world_size()
    first, second = Net(40, 4), Net(40, 4)
    state = zen.fsdp.shard(first, mesh=init_device_mesh("cpu", (P,)))
    mesh = DeviceMesh.from_group(dist.new_group(list(range(P))), "cpu")
    fully_shard(second, mesh=mesh)
    second.set_custom_reduce_scatter(next(iter(state.comms.values())))
    try:
        second(torch.zeros(2, 3, dtype=torch.long)).sum().backward()
    except ZenInputError as exc:
        return str(exc)
    return "no error"


def bad_scheme() -> str:
    try:
        zen.fsdp.shard(Net(8, 2), scheme="allreduce", mesh=init_device_mesh("cpu", (dist.get_world_size(),)))
    except ZenInputError as exc:
        return str(exc)
    return "no error"


def refusals() -> dict[str, str]:
    """bad_scheme, then other_mesh, in one launch (the first is refused before any collective)."""
    return {"bad_scheme": bad_scheme(), "other_mesh": other_mesh()}


def padded_rows(rows: int, world: int) -> int:
    """FSDP's dim-0 padding: every rank's shard has ceil(rows / world) rows."""
    return math.ceil(rows / world) * world
