"""From a user tensor (dense of any shape, or sparse COO) to one rank's rows, and back."""

from __future__ import annotations

import math

import torch

from zen.types import LocalGrad, ZenInputError

SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def to_local_grad(tensor: torch.Tensor) -> LocalGrad:
    """Dense tensors become M = numel rows of width 1 (the paper's flat view of a bucket);
    sparse COO tensors become rows over their sparse dims (nn.Embedding(sparse=True): one row per
    embedding row), duplicates summed."""
    if tensor.dtype not in SUPPORTED_DTYPES:
        raise ZenInputError(f"unsupported dtype {tensor.dtype}; use one of {SUPPORTED_DTYPES}")
    if tensor.layout == torch.sparse_coo:
        return _from_coo(tensor)
    if tensor.layout != torch.strided:
        raise ZenInputError(f"unsupported layout {tensor.layout}; pass a dense or sparse COO tensor")
    flat = tensor.reshape(-1, 1)
    return LocalGrad(flat.shape[0], 1, tensor.dtype, tensor.device, dense=flat)


def _from_coo(tensor: torch.Tensor) -> LocalGrad:
    sparse_shape = tuple(tensor.shape[: tensor.sparse_dim()])
    dense_shape = tuple(tensor.shape[tensor.sparse_dim() :])
    num_rows = math.prod(sparse_shape)
    width = math.prod(dense_shape)
    if width == 0:
        raise ZenInputError(f"sparse tensor of shape {tuple(tensor.shape)} has rows of zero elements: nothing to sum")
    idx = tensor._indices()
    vals = tensor._values().reshape(-1, width)
    bad = False
    if idx.numel():
        bad = bool((idx.min() < 0).item()) or any(
            int(idx[d].max()) >= s for d, s in enumerate(sparse_shape)
        )
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
    return LocalGrad(num_rows, width, tensor.dtype, tensor.device, indices=rows, values=summed)


def _row_strides(shape: tuple[int, ...]) -> list[int]:
    strides, acc = [], 1
    for s in reversed(shape):
        strides.append(acc)
        acc *= s
    return list(reversed(strides))


def output_like(tensor: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    """The dense result tensor: `out` if given (reused buffers avoid page faults), else a new one."""
    shape = tensor.shape
    if out is None:
        return torch.empty(shape, dtype=tensor.dtype, device=tensor.device)
    if out.shape != shape or out.dtype != tensor.dtype or not out.is_contiguous():
        raise ZenInputError(f"out must be a contiguous {tensor.dtype} tensor of shape {tuple(shape)}")
    same = tensor.layout == torch.strided and (out.data_ptr(), out.stride()) == (tensor.data_ptr(), tensor.stride())
    if tensor.layout == torch.strided and not same and _overlap(out, tensor):
        raise ZenInputError("out overlaps the input without being the input itself; pass the input or another buffer")
    return out


def _overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether the memory spans of a's and b's elements intersect."""
    (a_lo, a_hi), (b_lo, b_hi) = _span(a), _span(b)
    return a_lo < b_hi and b_lo < a_hi


def _span(t: torch.Tensor) -> tuple[int, int]:
    if not t.numel():
        return 0, 0
    last = sum((n - 1) * st for n, st in zip(t.shape, t.stride(), strict=True))
    return t.data_ptr(), t.data_ptr() + (last + 1) * t.element_size()
