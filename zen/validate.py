"""Cross-rank input checks: every rank learns every rank's verdict, so all raise together, none hangs."""

from __future__ import annotations

import zlib

import torch

from zen.comm.base import Communicator
from zen.grad import LocalGrad
from zen.types import ZenInputError

FIELDS = ("dtype", "rows", "row_width", "shape", "scheme", "non_finite", "bad_index")


def _code(text: str) -> int:
    return zlib.crc32(text.encode())


def all_finite(t: torch.Tensor) -> bool:
    """No NaN or Inf in t, at the cost of one read: a NaN or an Inf anywhere makes the sum non-finite, so a
    finite sum proves every element finite; only a sum that overflows (or a real NaN / Inf) pays for the
    exact elementwise check. isfinite(t).all() alone writes a mask as large as t and costs several reads."""
    if not t.numel():
        return True
    wide = torch.float32 if t.element_size() < 4 else t.dtype
    return bool(torch.isfinite(t.sum(dtype=wide))) or bool(torch.isfinite(t).all())


def local_summary(grad: LocalGrad, shape: tuple[int, ...], scheme: str, check_finite: bool = True) -> list[int]:
    finite = not check_finite or all_finite(grad.values if grad.indices is not None else grad.dense)
    return [_code(str(grad.dtype)), grad.num_rows, grad.row_width, _code(str(tuple(shape))),
            _code(scheme), int(not finite), int(grad.bad_index)]


def check_inputs(grad: LocalGrad, shape: tuple[int, ...], scheme: str, comm: Communicator,
                 check_finite: bool = True) -> None:
    """All-gather a 7-integer summary per rank (phase 'meta') and raise ZenInputError on any issue."""
    mine = local_summary(grad, shape, scheme, check_finite)
    table = comm.all_gather_fixed(torch.tensor(mine, dtype=torch.int64, device=comm.device)).cpu().tolist()
    problems = []
    for r, row in enumerate(table):
        if row[5]:
            problems.append(f"rank {r} has non-finite values (NaN or Inf)")
        if row[6]:
            problems.append(f"rank {r} has sparse indices outside the tensor's shape")
    for f, name in enumerate(FIELDS[:5]):
        values = {row[f] for row in table}
        if len(values) > 1:
            odd = [r for r, row in enumerate(table) if row[f] != table[0][f]]
            problems.append(f"{name} differs across ranks (ranks {odd} disagree with rank 0; "
                            f"this rank {comm.rank} has {_describe(name, grad, shape, scheme)})")
    if problems:
        raise ZenInputError(f"zen: bad input on rank {comm.rank}: " + "; ".join(problems))


def _describe(name: str, grad: LocalGrad, shape: tuple[int, ...], scheme: str) -> str:
    return {"dtype": str(grad.dtype), "rows": str(grad.num_rows), "row_width": str(grad.row_width),
            "shape": str(tuple(shape)), "scheme": scheme}[name]
