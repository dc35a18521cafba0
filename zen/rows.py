"""Row-level helpers shared by schemes: summing COO rows into a dense (M, D) buffer."""

from __future__ import annotations

import torch


def add_rows(out: torch.Tensor, index: torch.Tensor, values: torch.Tensor) -> None:
    """out[index] += values, in the order given (deterministic on CPU)."""
    if index.numel():
        if out.shape[1] == 1:
            out.view(-1).index_add_(0, index.long(), values.view(-1))
        else:
            out.index_add_(0, index.long(), values)


def put_rows(out: torch.Tensor, index: torch.Tensor, values: torch.Tensor) -> None:
    """out[index] = values for distinct indices."""
    if index.numel():
        out.index_copy_(0, index.long(), values)


def concat(parts: list[torch.Tensor]) -> torch.Tensor:
    return parts[0] if len(parts) == 1 else torch.cat(parts)
