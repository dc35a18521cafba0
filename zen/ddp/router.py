"""Which part of a DDP bucket takes which path (paper §5 step 1): embedding rows through the sparse scheme,
everything else through dense allreduce.

DDP decides the buckets (and rebuilds them after iteration 1), so instead of isolating the embeddings in
buckets of their own, a bucket is split into parts: each run of embedding parameters of one row width is
one part synchronized as rows of its table (one index per row on the wire, not per element; neighbouring
tables form one fused table), and each run of other parameters between them is one flat dense part. The
split depends only on which parameters a bucket holds, which DDP keeps identical on all ranks.
Parameters of nn.Embedding(sparse=True) have sparse COO gradients, which DDP always puts alone in a
bucket: that bucket is one part, handed back to DDP as COO over the union's rows.

A sparse parameter may also be a (rows, width) view into a larger parameter (torchrec's data-parallel
tables: every table a view into one flat fbgemm weight, tables of different widths back to back). Each is
found by its storage offset and cuts that parameter into table runs of its own width, the rest of it
staying dense; so the layout comes from the views, never from the flat weight's private fields.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from itertools import pairwise

import torch
import torch.distributed as dist
from torch import nn

from zen.core import Part
from zen.types import ZenInputError

EMBEDDING_MODULES = (nn.Embedding, nn.EmbeddingBag)  # torchrec's unsharded collections hold these too
TAGS_PER_BUCKET = 1_024  # a part's tag: bucket index * this + its place in the bucket (the same on every rank)


TableFinder = Callable[[nn.Module], list[torch.Tensor]]
TABLE_FINDERS: list[TableFinder] = []  # integrations add theirs (zen.integrations.torchrec: sharded tables)


def register_table_finder(finder: TableFinder) -> TableFinder:
    """`finder(module)` gives the embedding tables of a kind of model this module cannot see by itself (an
    integration registers one when it is imported; the router never imports an integration)."""
    if finder not in TABLE_FINDERS:
        TABLE_FINDERS.append(finder)
    return finder


def embedding_params(sources: nn.Module | Iterable[nn.Module | torch.Tensor]) -> list[torch.Tensor]:
    """The weights of every nn.Embedding / nn.EmbeddingBag inside the given modules (torchrec's unsharded
    EmbeddingBagCollection and EmbeddingCollection included: their tables are such modules), the tables the
    registered finders see (a torchrec-sharded model's data-parallel tables, once zen.integrations.torchrec is
    imported; a sharded model without it is a ZenInputError), plus any parameters passed directly."""
    items = [sources] if isinstance(sources, nn.Module) else list(sources)
    found: dict[int, torch.Tensor] = {}
    for item in items:
        if isinstance(item, torch.Tensor):
            found[id(item)] = item
            continue
        for module in item.modules():
            if isinstance(module, EMBEDDING_MODULES) and module.weight.requires_grad:
                found[id(module.weight)] = module.weight
        for finder in TABLE_FINDERS:
            found.update((id(table), table) for table in finder(item))
        if not TABLE_FINDERS and any(type(m).__module__.startswith("torchrec.distributed") for m in item.modules()):
            raise ZenInputError("zen: a torchrec-sharded model: import zen.integrations.torchrec (or use its "
                                "ZenDataParallelWrapper) so that its data-parallel tables are found")
    return list(found.values())


@dataclass(frozen=True)
class Table:
    """A sparse parameter as a run of rows in its storage (elements, not bytes)."""

    start: int  # storage offset of its first element
    numel: int
    width: int  # elements per row
    address: int  # data_ptr(): names the table on this rank (Part.key)
    dtype: torch.dtype


class TableLayout:
    """Where the sparse parameters lie, per storage: a bucket parameter is cut at the tables inside it (a
    whole embedding weight is one table covering it; torchrec's flat weight holds several, found from its
    table views by storage offset)."""

    def __init__(self, sparse_params: Iterable[torch.Tensor]):
        by_storage: dict[int, dict[tuple[int, int], Table]] = {}
        for t in sparse_params:
            if t.dim() == 0 or t.numel() == 0:  # no rows: a scalar stays dense
                continue
            if not t.is_contiguous():
                raise ZenInputError(f"zen: a sparse parameter of shape {tuple(t.shape)} is not contiguous, so its "
                                    f"rows are not rows of a DDP bucket")
            table = Table(t.storage_offset(), t.numel(), math.prod(t.shape[1:]), t.data_ptr(), t.dtype)
            by_storage.setdefault(t.untyped_storage().data_ptr(), {})[table.start, table.numel] = table
        self._by_storage = {ptr: sorted(tables.values(), key=lambda t: t.start) for ptr, tables in by_storage.items()}
        for tables in self._by_storage.values():
            for a, b in pairwise(tables):
                if b.start < a.start + a.numel:
                    raise ZenInputError(f"zen: two sparse parameters overlap in memory (elements {a.start}+{a.numel} "
                                        f"and {b.start}+{b.numel} of one storage)")

    def pieces(self, p: torch.Tensor) -> Iterator[tuple[int, int | None, int]]:
        """(elements, row width or None for dense, address) runs covering bucket parameter `p` in order."""
        tables = self._by_storage.get(p.untyped_storage().data_ptr())
        if not tables:
            yield p.numel(), None, p.data_ptr()
            return
        lo, size = p.storage_offset(), p.element_size()
        hi, base, cursor = lo + p.numel(), p.data_ptr() - lo * size, lo
        for t in tables:
            if t.start + t.numel <= lo or t.start >= hi:
                continue
            if t.start < lo or t.start + t.numel > hi or t.dtype != p.dtype:
                raise ZenInputError(f"zen: a sparse parameter (elements {t.start}+{t.numel}, {t.dtype}) is not a run "
                                    f"of rows inside the parameter it shares memory with ({lo}+{p.numel()}, {p.dtype})")
            if t.start > cursor:
                yield t.start - cursor, None, base + cursor * size
            yield t.numel, t.width, t.address
            cursor = t.start + t.numel
        if cursor < hi:
            yield hi - cursor, None, base + cursor * size


class BucketRouter:
    """Splits buckets into `zen.core.Part`s, views of the bucket synchronized in place, given the embedding
    parameters (none: every bucket is one dense part through the scheme, the paper's flat view). A part's
    `key` is its parameters' addresses on this rank (its scheme instance and compressor memory)."""

    def __init__(self, sparse_params: Iterable[torch.Tensor] | None):
        self.everything_sparse = sparse_params is None
        self.tables = TableLayout(sparse_params or ())

    def split(self, bucket: dist.GradBucket) -> list[Part]:
        buffer = bucket.buffer()
        params = bucket.parameters()
        tag = bucket.index() * TAGS_PER_BUCKET
        key = tuple(p.data_ptr() for p in params)
        if buffer.layout != torch.strided:  # COO: always alone in its bucket, handed back as COO
            return [Part(buffer, sparse=True, key=key, tag=tag, sparse_result=True)]
        if self.everything_sparse:
            return [Part(buffer, sparse=True, key=key, tag=tag, out=buffer)]
        parts = self._split_dense(buffer, params, bucket.gradients())
        return [Part(p.tensor, rows=p.rows, sparse=p.sparse, key=p.key, tag=tag + i, out=p.tensor)
                for i, p in enumerate(parts)]

    def _split_dense(self, buffer: torch.Tensor, params: list[torch.Tensor],
                     grads: list[torch.Tensor]) -> list[Part]:
        """Parts in buffer order: DDP's gradient views lie back to back in the bucket, so neighbouring
        embedding tables of one row width form one (rows, width) part and the parameters between them
        one flat part."""
        parts: list[Part] = []
        start = offset = 0
        width: int | None = None  # row width of the pending embedding run; None: a dense run
        key: list[int] = []
        for p, g in zip(params, grads, strict=True):
            if (g.data_ptr() - buffer.data_ptr()) != offset * buffer.element_size() or not g.is_contiguous():
                raise RuntimeError("zen: DDP's gradient views are not back to back in the bucket")
            for numel, p_width, address in self.tables.pieces(p):
                if offset > start and p_width != width:
                    parts.append(self._part(buffer[start:offset], width, key))
                    start, key = offset, []
                width = p_width
                offset += numel
                key.append(address)
        if offset > start:
            parts.append(self._part(buffer[start:offset], width, key))
        return parts

    @staticmethod
    def _part(flat: torch.Tensor, width: int | None, key: list[int]) -> Part:
        if width is None:
            return Part(flat, sparse=False, key=tuple(key))
        return Part(flat.view(-1, width), rows=True, sparse=True, key=tuple(key))
