"""A training step's compute timeline: forward, when each DDP bucket's gradient is ready, the rest of backward,
the optimizer (paper section 5 step 1: the hook syncs each bucket as it becomes ready, overlapping backward).

`measure` takes it on this machine: the workload under DDP on a one-rank process group in this process, one
thread (as each rank of `zen train` runs), a hook that notes when each bucket arrives and what it holds and
returns at once; medians over steps after DDP's bucket rebuild. Times are the thread's CPU time (backward and the
hook run on the calling thread on CPU), so other processes on the machine do not stretch them: they are what
one core's work costs, and the simulator shares the cores. A GPU cluster's timeline comes from a stated
roofline instead (`roofline`).
"""

from __future__ import annotations

import json
import math
import os
import socket
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch


@dataclass(frozen=True)
class Param:
    name: str
    shape: tuple[int, ...]
    sparse: bool  # an embedding table whose rows go through the sparse scheme

    @property
    def width(self) -> int:
        return math.prod(self.shape[1:])


@dataclass(frozen=True)
class Part:
    """A piece of a bucket as the hook routes it (zen.ddp.router): table rows (`rows` x `width`, the tables'
    rows stacked) or a flat dense run of `numel` elements."""

    sparse: bool
    params: tuple[Param, ...]

    @property
    def numel(self) -> int:
        return sum(math.prod(p.shape) for p in self.params)

    @property
    def rows(self) -> int:
        return sum(p.shape[0] for p in self.params)

    @property
    def width(self) -> int:
        return self.params[0].width


@dataclass(frozen=True)
class Bucket:
    ready_s: float  # seconds after backward started
    params: tuple[Param, ...]  # in buffer order

    def parts(self) -> list[Part]:
        """Runs of embedding tables of one row width, and runs of other parameters (BucketRouter's split)."""
        out: list[list[Param]] = []
        for p in self.params:
            key = (p.sparse, p.width if p.sparse else None)
            if out and (out[-1][0].sparse, out[-1][0].width if out[-1][0].sparse else None) == key:
                out[-1].append(p)
            else:
                out.append([p])
        return [Part(run[0].sparse, tuple(run)) for run in out]

    @property
    def nbytes(self) -> int:
        return 4 * sum(math.prod(p.shape) for p in self.params)


@dataclass
class Timeline:
    """Seconds of one rank's step on one core (or one GPU): forward, backward (buckets ready inside it),
    optimizer."""

    forward_s: float
    backward_s: float
    optimizer_s: float
    buckets: list[Bucket] = field(default_factory=list)
    source: str = ""

    @property
    def compute_s(self) -> float:
        return self.forward_s + self.backward_s + self.optimizer_s


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def measure(workload: str, preset: str, steps: int = 8, warmup: int = 3, seed: int = 0) -> Timeline:
    """The timeline of `workload` on this machine, one thread (see the module's docstring)."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from workloads.base import build_workload

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(_free_port())
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        work = build_workload(workload, preset, seed)
        sparse = set(work.sparse_params)
        names = {p.data_ptr(): n for n, p in work.model.named_parameters()}
        ddp = DistributedDataParallel(work.model, gradient_as_bucket_view=True)
        arrivals: list[tuple[float, int, tuple[Param, ...]]] = []

        def hook(_, bucket):  # noqa: ANN001 - DDP refuses a hook whose annotations are strings
            params = tuple(Param(names[p.data_ptr()], tuple(p.shape), names[p.data_ptr()] in sparse)
                           for p in bucket.parameters())
            arrivals.append((time.thread_time(), bucket.index(), params))
            done: torch.futures.Future[torch.Tensor] = torch.futures.Future()
            done.set_result(bucket.buffer())
            return done

        ddp.register_comm_hook(None, hook)
        opt = torch.optim.SGD(ddp.parameters(), lr=work.lr)
        batches = work.batches(0, 1, seed)
        rows: list[tuple[float, float, float, list[float]]] = []
        layout: tuple[tuple[Param, ...], ...] = ()
        for step in range(warmup + steps):
            batch = next(batches)
            arrivals.clear()
            t0 = time.thread_time()
            opt.zero_grad(set_to_none=True)
            loss = work.loss(ddp, batch)
            t1 = time.thread_time()
            loss.backward()
            t2 = time.thread_time()
            opt.step()
            t3 = time.thread_time()
            if step >= warmup:
                order = sorted(arrivals, key=lambda a: a[1])
                layout = tuple(a[2] for a in order)
                rows.append((t1 - t0, t2 - t1, t3 - t2, [a[0] - t1 for a in order]))
    finally:
        dist.destroy_process_group()
        torch.set_num_threads(threads)
    med = [statistics.median(r[k] for r in rows) for k in range(3)]
    ready = [statistics.median(r[3][b] for r in rows) for b in range(len(layout))]
    return Timeline(med[0], med[1], med[2], [Bucket(t, ps) for t, ps in zip(ready, layout, strict=True)],
                    source=f"measured here: {workload} {preset}, one thread, median of {steps} steps")


def save(t: Timeline, path: Path) -> None:
    path.write_text(json.dumps(asdict(t), indent=1) + "\n")


def load(path: Path) -> Timeline:
    raw = json.loads(path.read_text())
    buckets = [Bucket(b["ready_s"], tuple(Param(p["name"], tuple(p["shape"]), p["sparse"]) for p in b["params"]))
               for b in raw.pop("buckets")]
    return Timeline(**raw, buckets=buckets)
