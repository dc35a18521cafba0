"""Which part of a DDP bucket takes which path (paper §5 step 1): embedding rows through the sparse scheme,
everything else through dense allreduce.

DDP decides the buckets (and rebuilds them after iteration 1), so instead of isolating the embeddings in
buckets of their own, a bucket is split into parts: each run of embedding parameters of one row width is
one part synchronized as rows of its table (one index per row on the wire, not per element; neighbouring
tables form one fused table), and each run of other parameters between them is one flat dense part. The
split depends only on which parameters a bucket holds, which DDP keeps identical on all ranks.
Parameters of nn.Embedding(sparse=True) have sparse COO gradients, which DDP always puts alone in a
bucket: that bucket is one part, handed back to DDP as COO over the union's rows.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch import nn

from zen.sync import Part

EMBEDDING_MODULES = (nn.Embedding, nn.EmbeddingBag)  # torchrec's unsharded collections hold these too
TAGS_PER_BUCKET = 1_024  # a part's tag: bucket index * this + its place in the bucket (the same on every rank)


def embedding_params(sources: nn.Module | Iterable[nn.Module | torch.Tensor]) -> list[torch.Tensor]:
    """The weights of every nn.Embedding / nn.EmbeddingBag inside the given modules (torchrec's
    EmbeddingBagCollection and EmbeddingCollection included: their tables are such modules), plus any
    parameters passed directly."""
    items = [sources] if isinstance(sources, nn.Module) else list(sources)
    found: dict[int, torch.Tensor] = {}
    for item in items:
        if isinstance(item, torch.Tensor):
            found[id(item)] = item
            continue
        for module in item.modules():
            if isinstance(module, EMBEDDING_MODULES) and module.weight.requires_grad:
                found[id(module.weight)] = module.weight
    return list(found.values())


class BucketRouter:
    """Splits buckets into `zen.sync.Part`s, views of the bucket synchronized in place, given the embedding
    parameters (none: every bucket is one dense part through the scheme, the paper's flat view). A part's
    `key` is its parameters' addresses on this rank (its scheme instance and compressor memory)."""

    def __init__(self, sparse_params: Iterable[torch.Tensor] | None):
        self.everything_sparse = sparse_params is None
        self.sparse = {p.data_ptr() for p in sparse_params or ()}

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
            p_width = math.prod(p.shape[1:]) if p.data_ptr() in self.sparse and p.dim() >= 1 else None
            if offset > start and p_width != width:
                parts.append(self._part(buffer[start:offset], width, key))
                start, key = offset, []
            width = p_width
            offset += g.numel()
            key.append(p.data_ptr())
        if offset > start:
            parts.append(self._part(buffer[start:offset], width, key))
        return parts

    @staticmethod
    def _part(flat: torch.Tensor, width: int | None, key: list[int]) -> Part:
        if width is None:
            return Part(flat, sparse=False, key=tuple(key))
        return Part(flat.view(-1, width), rows=True, sparse=True, key=tuple(key))
