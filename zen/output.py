"""Where a scheme writes the sum over ranks, and in which form: the output side of a sync.

A scheme receives the input rows (`LocalGrad`) and one `Output`, and says what the result is: either row
sets whose sum it is (`write`, the common case), or, for schemes that aggregate in a dense (M, D) buffer,
that buffer (`buffer`, `zero`, `own`). Two outputs:

- `DenseOutput`: a dense (M, D) tensor, possibly the input itself (in place, as DDP's buckets are); row
  sets are streamed into it in one pass (native `fill_sum`), divided on the way when the caller wants a mean.
- `RowsOutput`: the result as (ascending row ids, rows), never a dense table: what a sparse COO gradient
  (nn.Embedding(sparse=True)) gets back, in memory and work proportional to the union's rows. A scheme
  that asks it for a dense `buffer` gets one (allocated then), and its non-zero rows are extracted at the end.

`finish()` applies the divisor where the write did not, and returns the result.
"""

from __future__ import annotations

import math

import torch

from zen import native
from zen.grad import LocalGrad, extract_rows
from zen.rows import add_messages, add_rows, merge_rows
from zen.types import ZenInputError

RowSet = tuple[torch.Tensor, torch.Tensor]  # (ascending distinct row ids, (n, D) values)


class Output:
    """What every output offers a scheme; `rows_wanted` tells it whether a dense buffer is a detour."""

    rows_wanted = False

    def __init__(self, divisor: int = 1):
        self.divisor = divisor

    @property
    def buffer(self) -> torch.Tensor:
        """The dense (M, D) buffer a scheme may aggregate in directly."""
        raise NotImplementedError

    def zero(self) -> None:
        """buffer := 0."""
        raise NotImplementedError

    def own(self, index: torch.Tensor, values: torch.Tensor) -> None:
        """buffer := our rows (`index`, `values`) on zeros."""
        raise NotImplementedError

    def write(self, sets: list[RowSet], disjoint: bool = False) -> None:
        """The result is the sum of the row sets, added in list order (ids ascending within a set;
        `disjoint`: no id is in two sets). Nothing else the scheme wrote counts."""
        raise NotImplementedError

    def write_bitmaps(self, messages: list[tuple[torch.Tensor, torch.Tensor]], bits: torch.Tensor) -> bool:
        """`write` of every server's hash-bitmap message (payload over S_j, values), decoded on the way;
        `bits`: hashing.server_bits. False where this output cannot (the caller decodes and writes)."""
        return False


class DenseOutput(Output):
    """A dense result tensor seen as (M, D) rows; `grad` is the input when the result overwrites it (in place)."""

    def __init__(self, result: torch.Tensor, num_rows: int, row_width: int, grad: LocalGrad | None = None,
                 divisor: int = 1):
        super().__init__(divisor)
        self.result = result
        self.out = result.view(num_rows, row_width)
        self.grad = grad  # in place: `out` is grad.dense, non-zero only at grad's rows
        self.divided = False

    @property
    def in_place(self) -> bool:
        return self.grad is not None

    @property
    def buffer(self) -> torch.Tensor:
        return self.out

    def zero(self) -> None:
        """In place, `out` is the input, non-zero only at our rows: clearing those costs O(nnz), not a write
        of all M rows (a write as large as the dense gradient is most of a sparse sync's CPU time)."""
        if self.grad is None:
            self.out.zero_()
            return
        index, _ = self.grad.rows()
        if self.out.shape[1] == 1:
            self.out.view(-1).index_fill_(0, index, 0)
        else:
            self.out.index_fill_(0, index, 0)

    def own(self, index: torch.Tensor, values: torch.Tensor) -> None:
        """Free in place, where `out` holds our rows already (a -0.0 stays -0.0 there; it equals 0.0)."""
        if self.grad is None:
            self.out.zero_()
            add_rows(self.out, index, values)  # == put_rows on zeros (0 + v is v for v != 0), and faster on CPU

    def write(self, sets: list[RowSet], disjoint: bool = False) -> None:
        """In place and when the rows touched are a small part of the output (a table's gradient), only
        those rows are written. Otherwise the native pass streams the whole output out once without reading
        it: cheaper than zeroing it and scattering the rows, and even than scattering the rows alone (in
        place, at a bucket's flat 1% density); it also divides on the way where it can, saving a pass
        over the output. In place `out` may hold, besides our input rows, rows of the sets (a scheme may
        have summed some there already)."""
        if self.in_place and self._few_rows(sets):
            self._scatter(sets, divide=True)
        elif native.fill_sum(self.out, sets, self.divisor):
            self.divided = self.divisor != 1
        else:
            self._scatter(sets, divide=False)

    def write_bitmaps(self, messages: list[tuple[torch.Tensor, torch.Tensor]], bits: torch.Tensor) -> bool:
        """The native pass decodes and streams every server's rows at once (disjoint partitions), unless
        in place with few rows touched, where `write`'s scatter of the decoded rows is cheaper."""
        if self.in_place:
            assert self.grad is not None
            touched = self.grad.nnz + sum(int(values.shape[0]) for _, values in messages)
            if self._few(touched):
                return False
        if not native.fill_hash_bitmap(self.out, messages, bits, self.divisor):
            return False
        self.divided = self.divisor != 1
        return True

    def write_shards(self, shards: list[RowSet]) -> None:
        """`write` of the k disjoint row sets of k interleaved shards, shard j's id i standing for row
        i * k + j (zen.twolevel): streamed from the shard ids as they came, without mapping them first."""
        k = len(shards)
        if self.in_place and self._few_rows(shards):
            self._scatter(_interleaved(shards), divide=True)
        elif native.fill_sum(self.out, shards, self.divisor, stride=k):
            self.divided = self.divisor != 1
        else:
            self._scatter(_interleaved(shards), divide=False)

    def _few_rows(self, sets: list[RowSet]) -> bool:
        """Whether scattering the touched rows beats streaming all M rows: a scatter pays per row touched, a
        stream per row of the output, and a wide row spreads a scatter's random access over more bytes
        (`_few`'s break-even points were measured; the timings are in BENCHMARKS.md)."""
        assert self.grad is not None
        return self._few(self.grad.nnz + sum(int(index.numel()) for index, _ in sets))

    def _few(self, touched: int) -> bool:
        wide = self.out.shape[1] * self.out.element_size() >= 256
        return touched * (32 if wide else 256) <= self.out.shape[0]

    def _scatter(self, sets: list[RowSet], divide: bool) -> None:
        """out := 0 (O(nnz) in place), the sets' rows added in order; with `divide` those rows are divided
        here (the same bits as out.div_), so `finish` need not pass over the whole output."""
        self.zero()
        if self.in_place:
            for index, _ in sets:
                self.out.index_fill_(0, index.long(), 0)
        add_messages(self.out, sets)
        if divide and self.divisor != 1:
            rows = torch.unique(torch.cat([index.long() for index, _ in sets] or [self.out.new_zeros(0).long()]))
            self.out.index_copy_(0, rows, self.out.index_select(0, rows).div_(self.divisor))
            self.divided = True

    def finish(self) -> torch.Tensor:
        """The result tensor (shaped like the input), divided."""
        if self.divisor != 1 and not self.divided:
            self.out.div_(self.divisor)
        return self.result


class RowsOutput(Output):
    """The result as a sparse COO tensor over the union's rows of a table shaped `shape` whose first
    `sparse_dim` dims index the M rows; a dense buffer only if a scheme asks for one."""

    rows_wanted = True

    def __init__(self, shape: tuple[int, ...], sparse_dim: int, like: torch.Tensor, divisor: int = 1):
        super().__init__(divisor)
        self.table = shape
        self.sparse_dim = sparse_dim
        self.shape = (math.prod(shape[:sparse_dim]), math.prod(shape[sparse_dim:]))
        self.like = like  # dtype and device of the rows
        self._dense: torch.Tensor | None = None
        self._rows: RowSet | None = None

    @property
    def buffer(self) -> torch.Tensor:
        if self._dense is None:
            self._dense = self.like.new_zeros(self.shape)
        self._rows = None
        return self._dense

    def zero(self) -> None:
        self.buffer.zero_()

    def own(self, index: torch.Tensor, values: torch.Tensor) -> None:
        self.zero()
        add_rows(self.buffer, index, values)

    def write(self, sets: list[RowSet], disjoint: bool = False) -> None:
        self._dense = None
        self._rows = union_rows(sets, self.like, self.shape[1], disjoint)

    def rows(self, index_dtype: torch.dtype | None = torch.int64) -> RowSet:
        """(ascending row ids, their (n, D) sums divided by the divisor); ids as int64, or with `index_dtype`
        None as the scheme wrote them (int32 for tables of fewer than 2^31 rows: what a wire carries)."""
        if self._rows is None:
            self._rows = extract_rows(self.buffer)
        ids, values = self._rows
        if index_dtype is not None:
            ids = ids.to(index_dtype)
        return ids, values / self.divisor if self.divisor != 1 else values

    def finish(self) -> torch.Tensor:
        """The result as a coalesced COO tensor shaped like the input."""
        ids, values = self.rows()
        sparse_shape = self.table[: self.sparse_dim]
        index = torch.stack(torch.unravel_index(ids, sparse_shape)) if self.sparse_dim > 1 else ids.view(1, -1)
        return torch.sparse_coo_tensor(index, values.reshape(-1, *self.table[self.sparse_dim :]), self.table,
                                       is_coalesced=True, check_invariants=False)


def union_rows(sets: list[RowSet], like: torch.Tensor, width: int, disjoint: bool = False) -> RowSet:
    """Ascending union of row sets, rows summed in list order (the same float operations as streaming
    them onto zeros in that order, but for the sign of a zero)."""
    sets = [(i, v) for i, v in sets if i.numel()]
    if not sets:
        return torch.empty(0, dtype=torch.int64, device=like.device), like.new_zeros((0, width))
    if len(sets) == 1:
        return sets[0]
    if disjoint:
        ids = torch.cat([i.long() for i, _ in sets])
        values = torch.cat([v for _, v in sets])
        ids, order = torch.sort(ids)
        return ids, values.index_select(0, order)
    dtype = torch.int64 if len({i.dtype for i, _ in sets}) > 1 else sets[0][0].dtype
    acc = (sets[0][0].to(dtype), sets[0][1] + 0.0)  # + 0.0: merge_rows wants no -0.0 (as a sum of rows has)
    for ids, values in sets[1:]:
        acc = merge_rows(acc, (ids.to(dtype), values))
    return acc


def _interleaved(shards: list[RowSet]) -> list[RowSet]:
    """The row sets of k interleaved shards with their rows' ids: shard j's id i is row i * k + j (by bits
    where k is a power of two)."""
    k = len(shards)
    if k & (k - 1) == 0:
        shift = k.bit_length() - 1
        return [((ids.long() << shift) | j, values) for j, (ids, values) in enumerate(shards)]
    return [(ids.long() * k + j, values) for j, (ids, values) in enumerate(shards)]


def make_output(tensor: torch.Tensor, grad: LocalGrad, out: torch.Tensor | None, divisor: int = 1,
                sparse_result: bool = False) -> DenseOutput | RowsOutput:
    """The output of one sync of `tensor` (seen as `grad`): a COO tensor over the union's rows
    (`sparse_result`), else `out` or a new dense tensor shaped like `tensor`."""
    if sparse_result:
        if out is not None:
            raise ZenInputError("out= is a dense buffer; a sparse result is a new COO tensor: pass one or the other")
        sparse_dim = tensor.sparse_dim() if tensor.layout == torch.sparse_coo else 1
        like = grad.values if grad.values is not None else grad.dense
        assert like is not None
        return RowsOutput(tuple(tensor.shape), sparse_dim, like, divisor)
    result = output_like(tensor, out)
    in_place = grad.dense is not None and result.data_ptr() == grad.dense.data_ptr()
    return DenseOutput(result, grad.num_rows, grad.row_width, grad if in_place else None, divisor)


def output_like(tensor: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    """The dense result tensor: `out` if given (reused buffers avoid page faults), else a new one."""
    shape = tensor.shape
    if out is None:
        return torch.empty(shape, dtype=tensor.dtype, device=tensor.device)
    if out.requires_grad and out.is_leaf:
        raise ZenInputError("out is a leaf tensor that requires grad (autograd forbids writing into it); "
                            "pass a buffer without requires_grad, e.g. out=param.grad")
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
