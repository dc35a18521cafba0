"""Cross-rank input checks: every rank learns every rank's verdict, so all raise together, none hangs. The check
also carries each part's row count (up to ANNOUNCED parts), so a scheme can bound its messages by them and
skip a header round (zen.comm.base): the call's one small message does both jobs."""

from __future__ import annotations

import zlib

import torch

from zen.comm.base import FIXED_VALUES, Communicator
from zen.device import accelerated
from zen.grad import LocalGrad
from zen.types import ZenInputError

FIELDS = ("dtype", "rows", "row_width", "shape", "scheme", "non_finite", "bad_index", "failed")
ANNOUNCED = FIXED_VALUES - len(FIELDS)  # parts whose row counts ride in the check, after the fields


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


def finite_flag(t: torch.Tensor) -> torch.Tensor:
    """`all_finite` on the device, without a host read: the sum in float64 (no float32, float16 or bfloat16
    tensor overflows it), the elementwise test for float64 tensors."""
    if not t.numel():
        return torch.ones((), dtype=torch.bool, device=t.device)
    if t.dtype == torch.float64:
        return torch.isfinite(t).all()
    return torch.isfinite(t.sum(dtype=torch.float64))


Checked = tuple[LocalGrad, tuple[int, ...], str]  # what the check sees of a tensor: its rows, its shape, its scheme


def _describe(name: str, part: Checked) -> str:
    grad, shape, scheme = part
    return {"dtype": str(grad.dtype), "rows": str(grad.num_rows), "row_width": str(grad.row_width),
            "shape": str(tuple(shape)), "scheme": scheme}[name]


def _describe_all(name: str, parts: list[Checked]) -> str:
    return "; ".join(_describe(name, part) for part in parts)


def row_counts(parts: list[Checked] | None) -> list[int]:
    """ANNOUNCED numbers: the rows each of the first parts is about to send (-1: not extracted yet, or no part)."""
    counts = [int(grad.indices.shape[0]) if grad.indices is not None else -1 for grad, _, _ in (parts or [])]
    return (counts + [-1] * ANNOUNCED)[:ANNOUNCED]


def local_summary(parts: list[Checked], nonfinite: str = "raise") -> list[int] | torch.Tensor:
    """8 integers saying what this rank is about to sync: a code per descriptive field (over every part),
    then whether any part holds a NaN / Inf (only with `nonfinite="raise"`) or an out-of-range sparse index, and
    0 (the rank's local checks passed); then `row_counts`. On the accelerator path a tensor there, the
    verdicts computed without a host read (the all-gather's one read brings them)."""
    codes = [_code(_describe_all(name, parts)) for name in FIELDS[:5]]
    device = parts[0][0].device if parts else torch.device("cpu")
    raising = nonfinite == "raise"
    if not accelerated(device):
        non_finite = raising and not all(
            all_finite(grad.values if grad.indices is not None else grad.dense) for grad, _, _ in parts)
        return [*codes, int(non_finite), int(any(bool(grad.bad_index) for grad, _, _ in parts)), 0,
                *row_counts(parts)]
    ok = torch.ones((), dtype=torch.bool, device=device)
    bad = torch.zeros((), dtype=torch.bool, device=device)
    for grad, _, _ in parts:
        if raising:
            ok = ok & finite_flag(grad.values if grad.indices is not None else grad.dense)
        bad = bad | torch.as_tensor(grad.bad_index, device=device)
    flags = torch.stack([~ok, bad, torch.zeros((), dtype=torch.bool, device=device)]).to(torch.int64)
    return torch.cat([torch.tensor(codes, dtype=torch.int64).to(device), flags,
                      torch.tensor(row_counts(parts), dtype=torch.int64).to(device)])


def check_parts(parts: list[Checked] | None, comm: Communicator, nonfinite: str = "raise") -> list[list[int] | None]:
    """One check for several tensors synced back to back (a DDP bucket's parts): all-gather a summary per rank
    (phase 'meta') and raise ZenInputError on every rank on any issue. `parts=None`: this rank failed its local
    checks (it raises its own error; the others learn that it did). Returns each part's row count on every rank
    where every rank announced one (else None): the counts every rank now agrees on."""
    mine = local_summary(parts, nonfinite) if parts is not None else [0] * (len(FIELDS) - 1) + [1, *row_counts(None)]
    table = comm.all_gather_fixed(mine)
    failed = [r for r, row in enumerate(table) if row[7]]
    if failed:
        raise ZenInputError(f"zen: bad input on rank {comm.rank}: ranks {failed} refused their input or "
                            f"options locally (their own errors say why)")
    assert parts is not None
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
                            f"this rank {comm.rank} has {_describe_all(name, parts)})")
    if problems:
        raise ZenInputError(f"zen: bad input on rank {comm.rank}: " + "; ".join(problems))
    counts = [[row[len(FIELDS) + k] for row in table] for k in range(min(len(parts), ANNOUNCED))]
    return [rows if min(rows) >= 0 else None for rows in counts] + [None] * (len(parts) - len(counts))
