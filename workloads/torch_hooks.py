"""PyTorch's own DDP communication hooks, used as they are: the baselines a user with a dense model would
pick instead of a sparse scheme. Each name in `zen train --scheme` that is not a registered Zen scheme is one
of these:

- `none`: DDP's no-op hook (no communication: compute-only headroom; ranks drift apart);
- `ddp`: no hook at all, DDP's built-in allreduce (the default people run). With COO gradients
  (nn.Embedding(sparse=True)) on gloo it is memory-unsafe in torch 2.13.0+cpu: 3 ranks of the tests' toy
  model with `--scheme ddp` alone (no Zen code on the path) aborted with a corrupted heap ("malloc():
  unaligned tcache chunk detected", "free(): invalid pointer", a SIGSEGV) in gloo's threads (in
  AsyncSparseAllreduceWork's coalesce, or in later gloo work) in 4 of 4 launches of 20,000 steps, whether or
  not two gradients share their values; 2 ranks in 1 of 2. So it warns; Zen's schemes and `allreduce` take
  COO gradients through the hook, apart from DDP's sparse path;
- `fp16` / `bf16`: `default_hooks.fp16_compress_hook` / `bf16_compress_hook` (allreduce in half precision,
  half the bytes; DDP accepts bf16 only with NCCL or XCCL, so on gloo it is fp16);
- `powersgd-R`: `powerSGD_hook` with matrix approximation rank R (error feedback and warm start on; plain
  allreduce for the first two steps, as it requires around DDP's bucket rebuild). On gloo each bucket's hook
  is waited for before the next bucket's starts: the hook issues its second all-reduce from the first's
  completion callback, and with two buckets in flight gloo's callback threads then issue them in a different
  order on different ranks (seen here: "Received data size doesn't match" on GPT-2 and a timeout on BERT).

Their bytes are not counted (they do not go through zen.comm), so their records carry time only.
No `from __future__ import annotations`: DDP's register_comm_hook compares a hook's annotations with the real
classes.
"""


import re
import warnings
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd
from torch.distributed.algorithms.ddp_comm_hooks.debugging_hooks import noop_hook
from torch.nn.parallel import DistributedDataParallel

NO_COMM = "none"  # DDP's no-op hook: headroom without communication
NATIVE = "ddp"  # no comm hook: DDP's built-in allreduce
BF16, FP16 = "bf16", "fp16"
POWERSGD = re.compile(r"powersgd-(\d+)$")
EXAMPLES = (NO_COMM, NATIVE, FP16, BF16, "powersgd-4", "powersgd-32")
POWERSGD_START = 2  # the first step PowerSGD compresses (it needs > 1)


def is_torch_hook(name: str) -> bool:
    rank = POWERSGD.match(name)
    return name in (NO_COMM, NATIVE, FP16, BF16) or (rank is not None and int(rank[1]) > 0)


def _one_bucket_at_a_time(state: powersgd.PowerSGDState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """powerSGD_hook, finished before the hook returns (see the module docstring)."""
    fut = powersgd.powerSGD_hook(state, bucket)
    fut.wait()
    return fut


def _warn_if_sparse_on_gloo(ddp: DistributedDataParallel) -> None:
    """DDP's own all-reduce of COO gradients over gloo can crash the process (see the module docstring)."""
    sparse = any(getattr(m, "sparse", False) for m in ddp.module.modules()
                 if isinstance(m, (nn.Embedding, nn.EmbeddingBag)))
    if sparse and dist.get_backend() == "gloo" and dist.get_rank() == 0:
        warnings.warn("`ddp` (DDP's built-in all-reduce) with sparse embedding gradients on gloo: its sparse "
                      "all-reduce has corrupted the heap and aborted runs here (torch 2.13.0+cpu); Zen's schemes "
                      "and `allreduce` take COO gradients through the hook instead", RuntimeWarning, stacklevel=2)


def register(ddp: DistributedDataParallel, name: str) -> None:
    """Register the named PyTorch hook on `ddp` (nothing for `ddp`, DDP's built-in allreduce)."""
    hooks: dict[str, Callable[[], None]] = {
        NO_COMM: lambda: ddp.register_comm_hook(None, noop_hook),
        NATIVE: lambda: _warn_if_sparse_on_gloo(ddp),
        FP16: lambda: ddp.register_comm_hook(None, default_hooks.fp16_compress_hook),
        BF16: lambda: ddp.register_comm_hook(None, default_hooks.bf16_compress_hook),
    }
    if (match := POWERSGD.match(name)) is not None:
        state = powersgd.PowerSGDState(process_group=None, matrix_approximation_rank=int(match[1]),
                                       start_powerSGD_iter=POWERSGD_START)
        on_gloo = dist.get_backend(state.process_group) == "gloo"
        ddp.register_comm_hook(state, _one_bucket_at_a_time if on_gloo else powersgd.powerSGD_hook)
        return
    hooks[name]()
