"""The input side of a sync: one rank's gradient as M rows of width D, from a user tensor (dense of any
shape, or sparse COO)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from zen import native
from zen.device import accelerated
from zen.types import ZenInputError

SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


@dataclass
class LocalGrad:
    """One rank's gradient seen as M rows of width D (D = 1 for a flattened dense tensor).

    Dense inputs keep `dense` (M, D); sparse COO inputs keep coalesced (`indices`, `values`).
    `rows()` extracts the non-zero rows once, ids ascending, and caches them, so schemes never scan twice.
    """

    num_rows: int
    row_width: int
    dtype: torch.dtype
    device: torch.device
    dense: torch.Tensor | None = None
    indices: torch.Tensor | None = None
    values: torch.Tensor | None = None
    bad_index: bool | torch.Tensor = False  # a 0-d bool tensor on the accelerator path (read by the check)

    def rows(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.indices is None:
            assert self.dense is not None
            self.indices, self.values = extract_rows(self.dense)
        assert self.values is not None
        return self.indices, self.values

    @property
    def nnz(self) -> int:
        return int(self.rows()[0].numel())

    def index_dtype(self) -> torch.dtype:
        """Wire dtype for row indices: int32 whenever it can hold every row id."""
        return torch.int32 if self.num_rows < 2**31 else torch.int64


def extract_rows(dense: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(ascending int64 ids of the non-zero rows, those rows) of an (M, D) tensor, in one read where the
    native kernel runs."""
    if (fast := native.nonzero_rows(dense)) is not None:
        return fast
    mask = dense.view(-1) != 0 if dense.shape[1] == 1 else (dense != 0).any(dim=1)
    ids = mask.nonzero().view(-1)
    return ids, dense.index_select(0, ids)


def to_local_grad(tensor: torch.Tensor, rows: bool = False) -> LocalGrad:
    """Dense tensors become M = numel rows of width 1 (the paper's flat view of a bucket), or with `rows`
    M = tensor.shape[0] rows of the remaining elements (an embedding table's gradient: one index per
    row on the wire, not one per element); sparse COO tensors become rows over their sparse dims
    (nn.Embedding(sparse=True): one row per embedding row), duplicates summed."""
    if tensor.dtype not in SUPPORTED_DTYPES:
        raise ZenInputError(f"unsupported dtype {tensor.dtype}; use one of {SUPPORTED_DTYPES}")
    if tensor.layout == torch.sparse_coo:
        return _from_coo(tensor)
    if tensor.layout != torch.strided:
        raise ZenInputError(f"unsupported layout {tensor.layout}; pass a dense or sparse COO tensor")
    if rows and tensor.dim() >= 1:
        width = math.prod(tensor.shape[1:])
        if width == 0:
            raise ZenInputError(f"tensor of shape {tuple(tensor.shape)} has rows of zero elements: nothing to sum")
        flat = tensor.reshape(tensor.shape[0], width)
    else:
        flat = tensor.reshape(-1, 1)
    return LocalGrad(flat.shape[0], flat.shape[1], tensor.dtype, tensor.device, dense=flat)


def _from_coo(tensor: torch.Tensor) -> LocalGrad:
    sparse_shape = tuple(tensor.shape[: tensor.sparse_dim()])
    dense_shape = tuple(tensor.shape[tensor.sparse_dim() :])
    num_rows = math.prod(sparse_shape)
    width = math.prod(dense_shape)
    if width == 0:
        raise ZenInputError(f"sparse tensor of shape {tuple(tensor.shape)} has rows of zero elements: nothing to sum")
    idx = tensor._indices()
    vals = tensor._values().reshape(-1, width)
    if accelerated(tensor.device):  # no host read: out-of-range entries are flagged (the check reads the flag)
        limits = torch.tensor(sparse_shape, dtype=idx.dtype).to(idx.device).view(-1, 1)
        valid = ((idx >= 0) & (idx < limits)).all(0)
        bad: bool | torch.Tensor = ~valid.all()
        idx = idx * valid  # and dropped from the sum: invalid rows read row 0 with a zero value
        vals = vals * valid.view(-1, 1).to(vals.dtype)
    else:
        bad = bool(idx.numel()) and (bool((idx.min() < 0).item()) or any(
            int(idx[d].max()) >= s for d, s in enumerate(sparse_shape)))
        if bad:
            grad = LocalGrad(num_rows, width, tensor.dtype, tensor.device)
            grad.indices = torch.empty(0, dtype=torch.int64, device=tensor.device)
            grad.values = vals[:0]
            grad.bad_index = True
            return grad
    strides = torch.tensor(_row_strides(sparse_shape), dtype=torch.int64, device=idx.device)
    rows = (idx * strides.view(-1, 1)).sum(0) if len(sparse_shape) > 1 else idx[0]
    rows, inverse = torch.unique(rows, sorted=True, return_inverse=True)
    summed = vals.new_zeros((rows.numel(), width)).index_add_(0, inverse, vals)
    return LocalGrad(num_rows, width, tensor.dtype, tensor.device, indices=rows, values=summed, bad_index=bad)


def _row_strides(shape: tuple[int, ...]) -> list[int]:
    strides, acc = [], 1
    for s in reversed(shape):
        strides.append(acc)
        acc *= s
    return list(reversed(strides))
