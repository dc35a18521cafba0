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
from zen.twolevel import dist_node_comms

from .cases import CASES, skewed_nodes

TRIAL = 6  # zen's first calls per size: 2 BP, 2 HC with gap-coded ids, 2 with plain ids, then its choice


def _digest(t: torch.Tensor) -> float:
    t = t.to_dense() if t.layout != torch.strided else t
    return t.double().flatten().mul(torch.arange(t.numel()) % 89 + 1).sum().item()


def schemes(names: list[str], cases: list[str], ranks_per_node: int = 1) -> dict[str, Any]:
    """Every scheme on every case: (lossless, digest, host reads the double counted in the last call, exchange
    rounds of that call, host reads the communicator counted). The last of TRIAL + 1 calls per case is
    counted: `zen` decides on the first ones (its one-time trial all-gathers its timings); two-level sync's
    (the default, intra="auto", with its own trial) is checked for its sum after as many calls."""
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
            reads = counts.of(nccl_rules.READ, threading.get_ident())
            ok = matches_reference(out.to_dense() if out.layout != torch.strided else out, total, magnitude, P)
            report[f"{name}/{case}"] = (ok, _digest(out), reads, stats.traffic.rounds, stats.traffic.host_reads)
        if ranks_per_node > 1:  # two-level: the functional path, past zen's choice (its shard groups' together)
            tensors = [CASES["random"](r, P, torch.float32) for r in range(P)]
            total, magnitude = reference_sum(tensors)
            for _ in range(TRIAL + 1):
                out = zen.allreduce(tensors[rank], name, ranks_per_node=ranks_per_node)
            report[f"{name}/two_level"] = (matches_reference(out, total, magnitude, P), _digest(out), 0, 1, 0)
    return report


def shard_group_mix(seed: int, ranks_per_node: int, rows: int, width: int) -> tuple[bool, float, str]:
    """Two-level zen on nodes whose shard groups take different BP partitionings (tests.cases.skewed_nodes; bytes
    decide, so the choice does not hang on the clock; hash partitions from seed 0, as the test predicts them):
    (lossless, digest, this rank's plan) after its choice."""
    rank, P = dist.get_rank(), dist.get_world_size()
    _, tensors = skewed_nodes(seed, P // ranks_per_node, ranks_per_node, rows, width)
    total, magnitude = reference_sum(tensors)
    comm, nodes = DistComm(), dist_node_comms(ranks_per_node, mode="dense", seed=0)
    scheme = make_scheme("zen", local_cost=False, select="bytes")
    for _ in range(scheme.measure_iters + 1):
        out, stats = zen.sync(scheme, tensors[rank], comm, rows=True, nodes=nodes)
    return matches_reference(out, total, magnitude, P), _digest(out), str(stats.choice)


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
            reads = {kind: counts.of(kind) for kind in (nccl_rules.READ, nccl_rules.SHAPE, nccl_rules.SYNC)}
        else:
            loss.backward()
    stats = state.last_step.stats
    return {**reads, "rounds": sum(s.traffic.rounds for s in stats),
            "counted": sum(s.traffic.host_reads for s in stats), "buckets": len(state.last_step.spans)}


def hook_reads_of(cases: list[dict[str, Any]]) -> list[dict[str, int]]:
    """hook_reads of every case, one after another in one launch (each its own model, hook and lane groups)."""
    return [hook_reads(**case) for case in cases]


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
    work.wait()
    return {"before_nan": bool(torch.isnan(before).all()), "after": t.tolist()}


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


def per_rank_poison() -> dict[str, Any]:
    """An agreement check that reads a gathered table before the all-gather's wait: the poison differs per rank,
    so the ranks' tables disagree (with one poison for all they would agree, and the check pass wrongly)."""
    pg, rank = dist.group.WORLD, dist.get_rank()
    table = torch.empty(2 * 4, dtype=torch.int64)
    work = pg._allgather_base(table, torch.full((4,), 7, dtype=torch.int64))
    early = table.tolist()  # the bug: no wait before the read
    seen = torch.empty(2 * 8, dtype=torch.int64)
    dist.all_gather_into_tensor(seen, torch.tensor(early, dtype=torch.int64), group=dist.new_group(backend="gloo"))
    work.wait()
    halves = seen.view(2, -1).tolist()
    return {"agree": halves[0] == halves[1], "after": table.tolist(), "rank": rank}


def completes_with_peers() -> dict[str, bool]:
    """Rank 1 joins an all-reduce a second late: rank 0's work is not complete until then."""
    import time

    rank = dist.get_rank()
    if rank == 1:
        time.sleep(1.5)
    work = dist.group.WORLD.allreduce([torch.ones(3)], dist.AllreduceOptions())
    early = work.is_completed()
    work.wait()
    return {"early": early, "late": work.is_completed()}


def written_before_wait(what: str) -> str:
    """A buffer written after its operation was issued, before its wait: an all-to-all's send buffer reused
    ("input"), or a receive buffer filled by hand ("output"). The double reports it at the run or the wait."""
    pg, rank = dist.group.WORLD, dist.get_rank()
    send, recv = torch.full((8,), float(rank)), torch.empty(8)
    if what == "input":
        works = [pg.alltoall_base(recv, send, [4, 4], [4, 4])]
    else:  # rank 0 sends first, rank 1 receives first: the pair meets in order
        works = [pg.send([send], 1, 0), pg.recv([recv], 1, 0)] if rank == 0 else \
            [pg.recv([recv], 0, 0), pg.send([send], 0, 0)]
    (send if what == "input" else recv).fill_(42.0)  # the bug (not add_: NaN poison plus one is the same NaN)
    errors = []
    for work in works:
        try:
            work.wait()
        except nccl_rules.RulesViolation as exc:
            errors.append(str(exc))
    return errors[0] if errors else "no error"


def interleaved_communicators() -> str:
    """Two communicators' all-reduces issued in a rank-dependent order: with every communicator on one stream (NCCL
    on one device) the ranks wait for each other forever; the double names the deadlock."""
    first, second = dist.group.WORLD, dist.new_group()
    gloo = dist.new_group(backend="gloo")  # to leave together: rank 0 hosts the store the other still reads
    order = (first, second) if dist.get_rank() == 0 else (second, first)
    works = [g.allreduce([torch.ones(2)], dist.AllreduceOptions()) for g in order]
    errors = []
    for w in works:
        try:
            w.wait()
        except Exception as exc:  # noqa: BLE001 - the violation; then both groups are aborted, as Zen would
            errors.append(str(exc))
            first.abort()
            second.abort()
    dist.barrier(group=gloo)
    return next((e for e in errors if "deadlock" in e), errors[0] if errors else "no error")


def outlives_group_timeout() -> str:
    """Rank 1 joins an all-reduce after the group's timeout: the double's watchdog tears rank 0 down first."""
    import time

    if dist.get_rank() == 1:
        time.sleep(8)  # twice the group's timeout (4 s); the watchdog looks every 0.25 s
    work = dist.group.WORLD.allreduce([torch.ones(2)], dist.AllreduceOptions())
    work.wait()
    return "completed"


def stalled_peer(scheme: str, steps: int = 3) -> str:
    """DDP with the hook; the last rank stops taking part in the second step's backward (alive, silent in the hook's
    groups until the others have raised, or for ever; it joins DDP's own collectives of the forward, which would
    otherwise be the ones stuck): the others must raise ZenCommError from backward, Zen's deadline before the hook's
    groups' watchdog."""
    import time

    torch.manual_seed(0)
    gloo = dist.new_group(backend="gloo")  # the stalled rank stays silent in the hook's groups until the others leave
    model = _Tables(True)
    ddp = DDP(model)
    ddp.register_comm_hook(zen.ZenHookState(scheme=scheme, sparse_params=model), zen.ddp_hook)
    gen = torch.Generator().manual_seed(dist.get_rank())
    start, seen = time.monotonic(), "no error"
    for step in range(steps):
        loss = ddp(torch.randint(0, 4000, (32, 8), generator=gen)).pow(2).mean()
        if step == 1 and dist.get_rank() == dist.get_world_size() - 1:
            seen = "stalled"  # alive, in no collective of the hook's: past every timeout unless the others raise
            break
        try:
            loss.backward()
        except Exception as exc:  # noqa: BLE001 - what the user sees
            seen = f"{type(exc).__name__} after {time.monotonic() - start:.0f}s: {exc}"
            break
    dist.barrier(group=gloo)  # the group's timeout (120 s) is past the hook's groups' watchdog (33 s)
    return seen


def thread_sleeps(scheme: str, sparse: bool, steps: int = TRIAL + 1) -> dict[str, int]:
    """Sleeps (polling) in a steady-state step's backward, by thread: the hook's lanes and backward's thread wait
    on something (a future, a queue), never in a sleep loop."""
    import time

    torch.manual_seed(0)
    model = _Tables(sparse)
    ddp = DDP(model)
    ddp.register_comm_hook(zen.ZenHookState(scheme=scheme, sparse_params=model, check_every=0), zen.ddp_hook)
    gen = torch.Generator().manual_seed(dist.get_rank())
    seen: dict[str, int] = {}
    original = time.sleep

    def counted(seconds: float) -> None:
        name = threading.current_thread().name
        if name.startswith("zen-") or threading.current_thread() is threading.main_thread():
            seen[name] = seen.get(name, 0) + 1
        original(seconds)

    for step in range(steps):
        loss = ddp(torch.randint(0, 4000, (32, 8), generator=gen)).pow(2).mean()
        if step == steps - 1:
            time.sleep = counted
            try:
                loss.backward()
            finally:
                time.sleep = original
        else:
            loss.backward()
    return seen


def thread_sleeps_of(cases: list[dict[str, Any]]) -> list[dict[str, int]]:
    """thread_sleeps of every case, one after another in one launch (each its own model and hook)."""
    return [thread_sleeps(**case) for case in cases]


def timeout_against_group(zen_timeout_s: float | None) -> str:
    """Zen's timeout against a group whose own (the watchdog's) is 20 s: the default is shortened to end first,
    a longer one the user chose is refused at the first call, on every rank."""
    comm = DistComm(timeout_s=zen_timeout_s)
    try:
        zen.sync(make_scheme("zen"), torch.ones(10), comm)
    except zen.ZenInputError as exc:
        return f"ZenInputError: {exc}"
    return f"{comm.seconds:.1f}"


def timeouts_against_group(cases: list[float | None]) -> list[str]:
    """timeout_against_group of every case in one launch: each its own communicator, refused (if it is) at its
    first call, before any operation."""
    return [timeout_against_group(zen_timeout_s) for zen_timeout_s in cases]
