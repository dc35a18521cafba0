"""Rank bodies for tests/test_nccl_rules.py: Zen on the NCCL-rules test double (tests.nccl_rules), whose
ranks run Zen's accelerator path (ZEN_EMULATE_ACCELERATOR=1), and the double's own rules."""

from __future__ import annotations

import threading
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import zen
from harness.reference import matches_reference, reference_sum
from tests import nccl_rules
from tests.compress_cases import chosen_sums
from tests.ddp_cases import train
from zen.comm.dist import DistComm
from zen.registry import make_scheme

from .cases import CASES

TRIAL = 6  # zen's first calls per size: 2 BP, 2 HC with gap-coded ids, 2 with plain ids, then its choice


def _digest(t: torch.Tensor) -> float:
    t = t.to_dense() if t.layout != torch.strided else t
    return t.double().flatten().mul(torch.arange(t.numel()) % 89 + 1).sum().item()


def schemes(names: list[str], cases: list[str], ranks_per_node: int = 1) -> dict[str, Any]:
    """Every scheme on every case: (lossless, digest, host reads the double counted in the last call, exchange
    rounds of that call, host reads the communicator counted). The last of TRIAL + 1 calls per case is
    counted: `zen` decides on the first ones (its one-time trial all-gathers its timings)."""
    rank, P = dist.get_rank(), dist.get_world_size()
    comm = DistComm()
    report: dict[str, Any] = {}
    for name in names:
        scheme = make_scheme(name)
        for case in cases:
            tensors = [CASES[case](r, P, torch.float32) for r in range(P)]
            total, magnitude = reference_sum(tensors)
            for _ in range(TRIAL):
                zen.sync(scheme, tensors[rank], comm)
            with nccl_rules.counting() as counts:
                out, stats = zen.sync(scheme, tensors[rank], comm)
            reads = counts.get(threading.get_ident(), 0)
            ok = matches_reference(out.to_dense() if out.layout != torch.strided else out, total, magnitude, P)
            report[f"{name}/{case}"] = (ok, _digest(out), reads, stats.traffic.rounds, stats.traffic.host_reads)
        if ranks_per_node > 1:  # two-level: the functional path
            tensors = [CASES["random"](r, P, torch.float32) for r in range(P)]
            total, magnitude = reference_sum(tensors)
            out = zen.allreduce(tensors[rank], name, ranks_per_node=ranks_per_node)
            report[f"{name}/two_level"] = (matches_reference(out, total, magnitude, P), _digest(out), 0, 1, 0)
    return report


def hooks(cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """DDP training through the hook on the double, and the reference: DDP's own allreduce on a gloo group
    (DDP's built-in hook reads its future's value, which the double, like NCCL, completes at enqueue)."""
    gloo = dist.new_group(backend="gloo")
    out = []
    for case in cases:
        if case["scheme"] == "ddp":
            case = {**case, "ddp": {**case.get("ddp", {}), "process_group": gloo}}
        out.append(train(**case))
    return out


def compressors(cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [chosen_sums(**case) for case in cases]


class _Tables(nn.Module):
    def __init__(self, sparse: bool):
        super().__init__()
        self.words = nn.Embedding(4000, 16, sparse=sparse)
        self.head = nn.Linear(16, 1)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.words(ids).mean(1))


def hook_reads(scheme: str, sparse: bool, steps: int = TRIAL + 1) -> dict[str, int]:
    """Host reads in one steady-state step's backward (no input check, the scheme's choice made), as the
    double counts them, against the exchange rounds and the communicator's own count that step."""
    torch.manual_seed(0)
    model = _Tables(sparse)
    ddp = DDP(model)
    state = zen.ZenHookState(scheme=scheme, sparse_params=model, check_every=0)
    ddp.register_comm_hook(state, zen.ddp_hook)
    gen = torch.Generator().manual_seed(dist.get_rank())
    reads = 0
    for step in range(steps):
        loss = ddp(torch.randint(0, 4000, (32, 8), generator=gen)).pow(2).mean()
        if step == steps - 1:
            with nccl_rules.counting() as counts:
                loss.backward()
            reads = sum(counts.values())
        else:
            loss.backward()
    stats = state.last_step.stats
    return {"reads": reads, "rounds": sum(s.traffic.rounds for s in stats),
            "counted": sum(s.traffic.host_reads for s in stats), "buckets": len(state.last_step.spans)}


# ---- the double's own rules ----------------------------------------------------------------------
def recv_then_send() -> str:
    """Both ranks receive first, then send: NCCL deadlocks; the double says so."""
    pg, peer = dist.group.WORLD, 1 - dist.get_rank()
    gloo = dist.new_group(backend="gloo")  # to leave together: rank 0 hosts the store
    got, mine = torch.empty(4), torch.ones(4)
    works = [pg.recv([got], peer, 0), pg.send([mine], peer, 0)]
    errors = []
    for w in works:  # both waited for: nothing may still run when the process exits
        try:
            w.wait()
        except nccl_rules.RulesViolation as exc:
            errors.append(str(exc))
    dist.barrier(group=gloo)
    return errors[0] if errors else "no error"


def send_then_recv_pairs() -> list[float]:
    """Rank 0 sends first, rank 1 receives first: the pair meets in order."""
    pg, rank = dist.group.WORLD, dist.get_rank()
    got, mine = torch.empty(4), torch.full((4,), float(rank))
    ops = [pg.send([mine], 1, 0), pg.recv([got], 1, 0)] if rank == 0 else \
        [pg.recv([got], 0, 0), pg.send([mine], 0, 0)]
    for w in ops:
        w.wait()
    return got.tolist()


def read_before_wait() -> dict[str, Any]:
    """An all-reduce's output read before its wait is poison; after the wait it is the sum."""
    t = torch.ones(5)
    work = dist.group.WORLD.allreduce([t], dist.AllreduceOptions())
    before = t.clone()
    completed = work.is_completed() and work.get_future().done()
    work.wait()
    return {"before_nan": bool(torch.isnan(before).all()), "after": t.tolist(), "completed_at_enqueue": completed}


def refused() -> dict[str, str]:
    """What NCCL lacks: an unequal all-gather, a receive from any source, a sparse all-reduce; and two ranks
    issuing different collectives."""
    pg, rank = dist.group.WORLD, dist.get_rank()
    out: dict[str, str] = {}
    attempts = {
        "unequal_allgather": lambda: pg.allgather([[torch.empty(3), torch.empty(4)]], [torch.ones(3 + rank)]),
        "recv_anysource": lambda: pg.recv_anysource([torch.empty(2)], 0),
        "sparse": lambda: pg.allreduce([torch.sparse_coo_tensor(torch.tensor([[0]]), torch.ones(1), (3,))]),
    }
    for name, attempt in attempts.items():
        try:
            attempt().wait()
            out[name] = "no error"
        except nccl_rules.RulesViolation as exc:
            out[name] = str(exc)
    work = pg.allreduce([torch.ones(2)]) if rank == 0 else pg.barrier()
    try:
        work.wait()
        out["mismatch"] = "no error"
    except nccl_rules.RulesViolation as exc:
        out["mismatch"] = str(exc)
    return out
