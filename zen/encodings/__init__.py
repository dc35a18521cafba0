"""Pull encodings (paper section 4, Algorithm 2): how a BP server ships its aggregated partition.

A server's message is (payload, values): the payload says which rows the non-zero values belong to.
Each encoding is one module of this package, a subclass of `Encoding` registered with
`@register_encoding("name")`; every module here is imported on the first lookup, so a new encoding is
one new file. `encode` scans the server's rows S_j in the aggregate; `encode_rows` builds the same
message from the server's non-zero rows when it already knows them (work proportional to those rows,
not to |S_j|). `payload_bytes` and `pull_bytes` are what BP's `predict` and the cost model charge.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TypeVar

import torch

from zen.rows import put_rows
from zen.types import WireLayout

Message = tuple[torch.Tensor, torch.Tensor]  # (payload, values)
Positions = Callable[[torch.Tensor], torch.Tensor]  # rows -> their index in S_j (hashing.ServerRanks)
_BIT_WEIGHTS: dict[torch.device, torch.Tensor] = {}


def pack_bits(mask: torch.Tensor) -> torch.Tensor:
    """Bool vector -> uint8 bytes, little-endian bit order, ceil(len / 8) bytes."""
    n = int(mask.numel())
    pad = (-n) % 8
    if pad:
        mask = torch.cat([mask, mask.new_zeros(pad)])
    w = _BIT_WEIGHTS.get(mask.device)
    if w is None:
        w = _BIT_WEIGHTS.setdefault(mask.device, (1 << torch.arange(8, device=mask.device)).to(torch.uint8))
    return (mask.view(-1, 8).to(torch.uint8) * w).sum(dim=1, dtype=torch.uint8)


def unpack_bits(packed: torch.Tensor, length: int) -> torch.Tensor:
    shifts = torch.arange(8, device=packed.device, dtype=torch.uint8)
    bits = (packed.view(-1, 1) >> shifts) & 1
    return bits.view(-1)[:length].bool()


def set_bits(positions: torch.Tensor, length: int) -> torch.Tensor:
    """pack_bits of a mask given its distinct set positions (distinct bits, so the sum is an or)."""
    packed = torch.zeros(-(-length // 8), dtype=torch.uint8, device=positions.device)
    return packed.index_add_(0, positions >> 3, (1 << (positions & 7)).to(torch.uint8))


def nonzero_rows(block: torch.Tensor) -> torch.Tensor:
    """Row mask of a (rows, D) block: a row is non-zero if any of its elements is."""
    return block.view(-1) != 0 if block.shape[1] == 1 else (block != 0).any(dim=1)


class Encoding(ABC):
    """One pull encoding. Subclasses say how the payload is built from the non-zero rows (from a scan or
    from the rows themselves), how it is decoded, and what it costs on the wire."""

    name: str

    def encode(self, out: torch.Tensor, members: torch.Tensor, index_dtype: torch.dtype) -> tuple[Message, int]:
        """Encode the server's aggregated rows `out[members]`; returns (message, non-zero row count)."""
        block = out.index_select(0, members)
        mask = nonzero_rows(block)
        values = block[mask]
        return (self.scan_payload(mask, members, int(out.shape[0]), index_dtype), values), int(values.shape[0])

    def encode_rows(self, rows: torch.Tensor, block: torch.Tensor, members: torch.Tensor, num_rows: int,
                    positions: Positions, index_dtype: torch.dtype) -> tuple[Message, int]:
        """`encode` of a server whose non-zero rows are exactly `rows` (ascending, distinct, all in
        `members`), with values `block`: the same message bit for bit, with work proportional to len(rows)
        instead of len(members). `num_rows` is M."""
        return (self.rows_payload(rows, members, num_rows, positions, index_dtype), block), int(block.shape[0])

    def scatter(self, out: torch.Tensor, payload: torch.Tensor, members: torch.Tensor, values: torch.Tensor,
                num_rows: int) -> None:
        """out[decoded rows] = values: the GPU pull writes every other server's partition this way."""
        put_rows(out, self.decode(payload, members, num_rows), values)

    @abstractmethod
    def scan_payload(self, mask: torch.Tensor, members: torch.Tensor, num_rows: int,
                     index_dtype: torch.dtype) -> torch.Tensor:
        """Payload for the non-zero rows members[mask]."""

    @abstractmethod
    def rows_payload(self, rows: torch.Tensor, members: torch.Tensor, num_rows: int, positions: Positions,
                     index_dtype: torch.dtype) -> torch.Tensor:
        """The same payload for the non-zero rows `rows` (ascending, all in `members`)."""

    @abstractmethod
    def decode(self, payload: torch.Tensor, members: torch.Tensor, num_rows: int) -> torch.Tensor:
        """Row ids of the received values, ascending, from a server whose rows S_j are `members`."""

    @abstractmethod
    def payload_bytes(self, owned: int, nonzero: int, layout: WireLayout) -> int:
        """Exact bytes of one server's message (payload + values) for |S_j| = `owned` rows of which
        `nonzero` are non-zero: what BP's `predict` charges."""

    @abstractmethod
    def pull_bytes(self, w: WireLayout, union: float) -> float:
        """Closed form (section 5) of the bytes one rank pulls from the n - 1 other servers when the
        aggregate has `union` non-zero rows spread evenly over the partitions: what `costmodel.bp` charges."""


_REGISTRY: dict[str, Encoding] = {}
E = TypeVar("E", bound=Encoding)


def register_encoding(name: str) -> Callable[[type[E]], type[E]]:
    """Class decorator: registers one (stateless) instance under `name`; names are unique."""

    def deco(cls: type[E]) -> type[E]:
        if name in _REGISTRY:
            raise ValueError(f"pull encoding {name!r} registered twice")
        cls.name = name
        _REGISTRY[name] = cls()
        return cls

    return deco


@functools.cache
def _load() -> None:
    """Import every module of this package once; each registers its encoding."""
    for info in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{info.name}")


def encodings() -> list[str]:
    """Names of every registered pull encoding."""
    _load()
    return sorted(_REGISTRY)


def get_encoding(name: str) -> Encoding:
    _load()
    if name not in _REGISTRY:
        raise ValueError(f"unknown pull encoding {name!r}; choose one of {', '.join(sorted(_REGISTRY))}")
    return _REGISTRY[name]
