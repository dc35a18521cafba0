"""Bodies of real multi-process ranks (targets for harness.launch.spawn); each runs many cases per spawn
so process start-up is paid once."""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist

import zen
from harness.reference import matches_reference, reference_sum

from .cases import CASES


def lossless_all(schemes: list[str], cases: list[str], dtypes: list[str]) -> dict[str, Any]:
    rank, P = dist.get_rank(), dist.get_world_size()
    report: dict[str, Any] = {}
    for dt in dtypes:
        dtype = getattr(torch, dt)
        for case in cases:
            tensors = [CASES[case](r, P, dtype) for r in range(P)]
            total, magnitude = reference_sum(tensors)
            for scheme in schemes:
                for _ in range(2):  # twice: the selector decides on the first call
                    out = zen.allreduce(tensors[rank], scheme)
                ok = out.shape == tensors[0].shape and matches_reference(out, total, magnitude, P)
                digest = out.double().flatten().mul(torch.arange(out.numel()) % 89 + 1).sum().item()
                report[f"{scheme}/{case}/{dt}"] = (ok, digest)
    return report


def dense_trial() -> dict[str, Any]:
    """`zen` on every row full (tests/test_plans.py): each call's plan, whether every call was lossless, and the
    trial's timings once it decided."""
    from zen.comm.dist import DistComm
    from zen.registry import make_scheme

    rank, P = dist.get_rank(), dist.get_world_size()
    tensors = [CASES["full"](r, P, torch.float32) for r in range(P)]
    total, magnitude = reference_sum(tensors)
    scheme, comm = make_scheme("zen"), DistComm()
    choices, correct, extra = [], True, {}
    for _ in range(8):
        out, stats = zen.sync(scheme, tensors[rank], comm)
        choices.append(stats.choice)
        correct &= matches_reference(out, total, magnitude, P)
        extra.update({k: v for k, v in stats.extra.items() if k.endswith("_trial_s")})
    return {"choices": tuple(choices), "correct": bool(correct), "extra": extra}


def bad_input(kind: str, scheme: str) -> str:
    """Returns the error message this rank got (every rank must get one, none may hang)."""
    rank = dist.get_rank()
    t = torch.zeros(100)
    t[rank] = 1.0
    if kind == "shape" and rank == 1:
        t = torch.zeros(101)
    if kind == "dtype" and rank == 1:
        t = t.double()
    if kind == "nan" and rank == 1:
        t[5] = float("nan")
    if kind == "inf" and rank == 0:
        t[5] = float("inf")
    if kind == "scheme_mismatch" and rank == 1:
        scheme = "agsparse"
    if kind == "index" and rank == 1:
        t = torch.sparse_coo_tensor(torch.tensor([[0, 100]]), torch.ones(2), (100,))
    try:
        zen.allreduce(t, scheme)
    except zen.ZenInputError as exc:
        return str(exc)
    return "no error"


def bad_inputs(kinds: list[str], scheme: str) -> dict[str, str]:
    """bad_input of every kind, one after another in one process group (an input error leaves the group usable)."""
    return {kind: bad_input(kind, scheme) for kind in kinds}


def dead_peer(scheme: str, timeout_s: float) -> str:
    """Rank 1 leaves before the collective; the others must fail fast with a clear error."""
    if dist.get_rank() == 1:
        return "left"
    start = time.monotonic()
    try:
        zen.allreduce(torch.ones(1000), scheme, timeout_s=timeout_s)
    except zen.ZenCommError as exc:
        return f"error after {time.monotonic() - start:.1f}s: {exc}"
    return "no error"


def gloo_loop() -> str:
    """This rank's gloo event-loop policy, as harness.launch left it."""
    from zen.comm.scheduling import gloo_loop_policy

    return gloo_loop_policy()


def kept_results(scheme: str) -> bool:
    """A sparse result that is one received message (rank 0 sends nothing, so its result is rank 1's rows as
    they came) must survive later calls on the same communicator, whose wire buffers come from its pool."""
    rank = dist.get_rank()

    def grad(seed: int) -> torch.Tensor:
        t = torch.zeros(1 << 16)
        if rank == 1:
            t[::2] = torch.arange(1 << 15, dtype=torch.float32) + seed
        return t

    first = zen.allreduce(grad(1), scheme, sparse_result=True)
    kept = first.coalesce().values().clone()
    for seed in range(2, 5):
        zen.allreduce(grad(seed), scheme, sparse_result=True)
    return torch.equal(first.coalesce().values(), kept)


def kept_results_of(schemes: list[str]) -> dict[str, bool]:
    """kept_results of each scheme, in one process group."""
    return {scheme: kept_results(scheme) for scheme in schemes}


def _counted(move: Any, waits: list[int]) -> Any:
    """`move` (a communicator's backend primitive), counting its calls in waits[0]."""
    def counted(*args: Any, **kwargs: Any) -> Any:
        waits[0] += 1
        return move(*args, **kwargs)
    return counted


def bounded_rounds() -> dict[str, Any]:
    """Bounded one-round exchanges (gloo takes a message shorter than its receive) against the two-round ones, on
    messages of different sizes per rank, some empty: the same messages arrive, the same bytes are counted, in
    fewer rounds; a message over its bound raises on its sender before anything is sent."""
    from zen.comm.base import Packed
    from zen.comm.dist import DistComm

    comm = DistComm()
    P, r = comm.world_size, comm.rank

    def rows(j: int, salt: int) -> tuple[torch.Tensor, torch.Tensor]:
        n = (3 * j + salt) % 5  # 0..4 rows, one rank empty
        return torch.arange(n, dtype=torch.int32) + 10 * j, torch.arange(2 * n, dtype=torch.float32).view(n, 2) + j

    def bound(j: int) -> list[int]:
        return [4, 4]

    waits = [0]  # the backend's collectives and point-to-point rounds, each a wait for the peers
    for name in ("_all_to_all", "_all_gather", "_all_gather_bytes"):
        setattr(comm, name, _counted(getattr(comm, name), waits))

    def run(bounded: bool) -> tuple[list[Any], dict[str, dict[str, int]], int]:
        comm.short_receives = bounded
        comm.begin_call(7)
        start = waits[0]
        got: list[Any] = []
        to, source = (r + 1) % P, (r - 1) % P
        got.append(comm.exchange({to: rows(r, 1)}, {source: rows(r, 1)}, "ring", bound)[source])
        got.append(comm.all_gather_v(rows(r, 2), "gather", bound))
        parts = [rows(r, 3 + j) for j in range(P)]
        packed = Packed(tuple(torch.cat([p[k] for p in parts]) for k in range(2)), [len(p[0]) for p in parts])
        got.append(comm.all_to_all_v(packed, "push", lambda j: [4 * P, 4 * P]))
        return got, {"sent": dict(comm.traffic.sent), "received": dict(comm.traffic.received)}, waits[0] - start

    def flat(got: Any) -> list[torch.Tensor]:
        return [got] if isinstance(got, torch.Tensor) else [t for g in got for t in flat(g)]

    base = comm.traffic
    two, two_bytes, two_rounds = run(False)
    comm.traffic = type(base)()
    one, one_bytes, one_rounds = run(True)
    same = all(torch.equal(a, b) for a, b in zip(flat(two), flat(one), strict=True))
    refused = ""
    try:
        comm.exchange({(r + 1) % P: rows(r, 1)}, {(r - 1) % P: rows(r, 1)}, "ring", lambda j: [0, 0])  # 1-4 rows
    except ValueError as exc:
        refused = str(exc)
    return {"same": same, "bytes": one_bytes == two_bytes, "rounds": (two_rounds, one_rounds), "refused": refused}


def agreed_sizes_bound_rows(schemes: list[str], cases: list[str]) -> dict[str, Any]:
    """Calls as DDP's hook makes them between its checks (sizes agreed, no input check): every rank's rows bounded
    by the tensor's M, so exchanges take one round. Per scheme and case: the sum is the reference's and bit for bit
    the checked call's, in fewer rounds than the same call without the bound (ROW_BOUND_BYTES 0)."""
    from zen.comm.dist import DistComm
    from zen.core import Part, SyncConfig, Synchronizer, synchronizer
    from zen.core.build import build
    from zen.registry import make_scheme, scheme_config
    from zen.twolevel import settling_calls

    comm = DistComm()
    rank, P = comm.rank, comm.world_size
    waits = [0]  # the backend's collectives and point-to-point rounds, each a wait for the peers
    for name in ("_all_to_all", "_all_gather", "_all_gather_bytes"):
        setattr(comm, name, _counted(getattr(comm, name), waits))

    def call(syncer: Synchronizer, part: Part, limit: int) -> tuple[torch.Tensor, int, str | None]:
        synchronizer.ROW_BOUND_BYTES, kept, start = limit, synchronizer.ROW_BOUND_BYTES, waits[0]
        try:
            done = syncer.run([part])
        finally:
            synchronizer.ROW_BOUND_BYTES = kept
        return done.outcomes[0].result, waits[0] - start, done.stats(0).choice

    report: dict[str, Any] = {}
    for case in cases:
        tensors = [CASES[case](r, P, torch.float32) for r in range(P)]
        total, magnitude = reference_sum(tensors)
        part = Part(tensors[rank], key=case, out=torch.empty_like(tensors[rank]))
        for scheme in schemes:
            instance = make_scheme(scheme)
            config = SyncConfig(scheme=scheme_config(instance), sizes_agreed=True)
            checking = build(config, comm, instance=instance)
            unchecked = build(config.but(validate=False), comm, instance=instance)
            limit = synchronizer.ROW_BOUND_BYTES
            for _ in range(1 + settling_calls(instance, comm)):  # the selector decides on its first calls
                checked = call(checking, part, limit)[0].clone()
            bounded, one, plan = call(unchecked, part, limit)
            bounded = bounded.clone()
            headed, two, _ = call(unchecked, part, 0)
            ok = matches_reference(bounded, total, magnitude, P)
            report[f"{scheme}/{case}"] = (ok, torch.equal(bounded, checked) and torch.equal(bounded, headed), one, two,
                                          plan)
    return report


def aligned_gather() -> list[bool]:
    """all_gather_v of (float32 values, an odd number of bytes) from ranks of different sizes: every message's values
    come back equal to what was sent and as views of one receive buffer (each message on its own 64-byte line),
    not copies made to align them."""
    from zen.comm.dist import DistComm

    comm = DistComm()
    P = comm.world_size
    values = torch.arange(3 * comm.rank + 5, dtype=torch.float32) + 100 * comm.rank
    odd = torch.arange(2 * comm.rank + 7, dtype=torch.uint8)
    comm.begin_call(1)
    got = comm.all_gather_v((values, odd), phase="pull")
    others = [j for j in range(P) if j != comm.rank]
    storage = {got[j][0].untyped_storage().data_ptr() for j in others}
    return [all(torch.equal(got[j][0], torch.arange(3 * j + 5, dtype=torch.float32) + 100 * j)
                and torch.equal(got[j][1], torch.arange(2 * j + 7, dtype=torch.uint8)) for j in range(P)),
            len(storage) == 1, all(got[j][0].data_ptr() % 64 == 0 for j in others)]
