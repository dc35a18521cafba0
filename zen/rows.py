"""Row-level helpers shared by schemes: summing COO rows into a dense (M, D) buffer."""

from __future__ import annotations

import torch

from zen import native


def add_rows(out: torch.Tensor, index: torch.Tensor, values: torch.Tensor) -> None:
    """out[index] += values, in the order given (deterministic on CPU); int32 ids need no conversion."""
    if index.numel():
        if index.dtype not in (torch.int32, torch.int64):
            index = index.long()
        if out.shape[1] == 1:
            out.view(-1).index_add_(0, index, values.reshape(-1))
        else:
            out.index_add_(0, index, values)


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
    if index.numel() and not native.put_rows(out, index, values):
        if out.shape[1] == 1:  # 1-D index_put_ beats index_copy_ of (1,)-row slices
            out.view(-1).index_put_((index.long(),), values.reshape(-1))
        else:
            out.index_copy_(0, index.long(), values)


def take_rows(out: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """out[index] as a new (len(index), D) tensor (int32 or int64 index)."""
    if out.shape[1] == 1:  # as in put_rows: 1-D gathers are faster
        return out.view(-1).index_select(0, index).view(-1, 1)
    return out.index_select(0, index)


def concat(parts: list[torch.Tensor]) -> torch.Tensor:
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def merge_rows(a: tuple[torch.Tensor, torch.Tensor], b: tuple[torch.Tensor, torch.Tensor],
               room: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Ascending union of two (ids, (n, D) values) row sets whose ids are ascending and distinct, rows summed
    (a + b) on shared ids. Values must not be -0.0 (the torch-op path adds rows onto zeros). `room`: (ids,
    values) of at least both sets' rows that the union is written into (a reused buffer), on either path: callers
    rely on the bytes after it being theirs (HC writes its gap codes there, zen.comm.pool.after)."""
    if (fast := native.merge_rows(a, b, room)) is not None:
        return fast
    (a_idx, a_val), (b_idx, b_val) = a, b
    ids, inverse = torch.unique(torch.cat([a_idx, b_idx]), sorted=True, return_inverse=True)
    if room is None:
        sums = a_val.new_zeros((ids.numel(), a_val.shape[1]))
    else:
        ids, sums = room[0][: ids.numel()].copy_(ids), room[1][: ids.numel()].zero_()
    add_messages(sums, [(inverse[: a_idx.numel()], a_val), (inverse[a_idx.numel() :], b_val)])
    return ids, sums
