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


def add_messages(out: torch.Tensor, messages: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    """out += every (index, values) message, one message at a time in the order given.

    Ids are distinct within a message, so each index_add_ is race-free even with CUDA atomics; summing
    message by message fixes the order of the floating-point sum (source-rank order), which makes the
    result bit-identical across runs and between CPU and CUDA. One concatenated index_add_ would let
    CUDA atomics add duplicate ids across messages in any order.
    """
    for index, values in messages:
        add_rows(out, index, values)


def put_rows(out: torch.Tensor, index: torch.Tensor, values: torch.Tensor) -> None:
    """out[index] = values for distinct indices."""
    if index.numel():
        out.index_copy_(0, index.long(), values)


def concat(parts: list[torch.Tensor]) -> torch.Tensor:
    return parts[0] if len(parts) == 1 else torch.cat(parts)
