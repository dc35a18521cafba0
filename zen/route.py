"""A scheme as the synchronizer runs it on one part, and the schemes that wrap a scheme.

`Flat` runs the configured scheme over every rank of the call's communicator on the part's rows. Two-level
sync (zen.twolevel.TwoLevel: the scheme across nodes, between steps inside each node) and a compressor
(zen.compress.base.Compressed: the scheme on the compressor's choice; a quantizer's codes by an all-gather
instead) wrap a scheme the same way, so the synchronizer asks every one the same three things: how to make
the part's rows (`prepare`), whether its messages may be bounded by the tensor's rows (`bounded_by_rows`), and
to run (`__call__`, `predict`)."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

import torch

from zen.comm.base import Communicator
from zen.grad import LocalGrad, to_local_grad
from zen.output import Output
from zen.registry import Scheme
from zen.types import PhaseBytes, SyncStats, WireLayout


@dataclass(frozen=True)
class PartContext:
    """Where a part stands: `key` names its parameters on this rank (a compressor's residual), `tag` is the
    same on every rank (seeds for choices that must agree), `step` counts optimizer steps, `world` ranks."""

    key: Hashable
    tag: int
    step: int
    world: int


class Flat:
    """`inner` over all ranks as it is. `bounded_by_rows`: where the ranks' tensors are known alike and no input
    check counted their rows, the tensor's rows bound every rank's message (zen.core.synchronizer.row_bound)."""

    bounded_by_rows = True

    def __init__(self, inner: Scheme):
        self.inner = inner
        self.name: str = getattr(inner, "name", "scheme")

    def takes_rows(self, grad: LocalGrad, comm: Communicator) -> bool:
        """Whether this call sends the rank's non-zero rows: then they are extracted before the input check,
        whose NaN test reads those rows instead of the dense tensor."""
        return sends_rows(self.inner)

    def prepare(self, tensor: torch.Tensor, rows: bool, ctx: PartContext, comm: Communicator) -> LocalGrad:
        """The part as this rank's rows (`rows`: a table, one index per row; else flat), extracted once when
        the call sends them."""
        grad = to_local_grad(tensor, rows)
        if self.takes_rows(grad, comm):
            grad.rows()
        return grad

    def __call__(self, grad: LocalGrad, comm: Communicator, out: Output, stats: SyncStats) -> None:
        self.inner(grad, comm, out, stats)

    def predict(self, sets: list[torch.Tensor], layout: WireLayout) -> list[PhaseBytes]:
        return self.inner.predict(sets, layout)


def sends_rows(scheme: Scheme) -> bool:
    """Whether `scheme` takes the rank's non-zero rows (`Scheme.sparse_input`; a scheme object that does not
    say, given to `zen.sync`, is taken to)."""
    return getattr(scheme, "sparse_input", True)
