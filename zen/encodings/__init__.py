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
from abc import ABC, abstractmethod
from collections.abc import Callable

import torch

from zen.plugins import Registry
from zen.rows import put_rows
from zen.types import WireLayout

PullMessage = tuple[torch.Tensor, torch.Tensor]  # a server's pull message: (payload, values)
Positions = Callable[[torch.Tensor], torch.Tensor]  # rows -> their index in S_j (hashing.ServerRanks)


def nonzero_rows(block: torch.Tensor) -> torch.Tensor:
    """Row mask of a (rows, D) block: a row is non-zero if any of its elements is."""
    return block.view(-1) != 0 if block.shape[1] == 1 else (block != 0).any(dim=1)


class Encoding(ABC):
    """One pull encoding. Subclasses say how the payload is built from the non-zero rows (from a scan or
    from the rows themselves), how it is decoded, and what it costs on the wire."""

    name: str
    words = False  # whether its messages are hash bitmaps, which Output.write_bitmaps decodes from S_j's words

    def encode(self, out: torch.Tensor, members: torch.Tensor, index_dtype: torch.dtype) -> tuple[PullMessage, int]:
        """Encode the server's aggregated rows `out[members]`; returns (message, non-zero row count)."""
        block = out.index_select(0, members)
        mask = nonzero_rows(block)
        values = block[mask]
        return (self.scan_payload(mask, members, int(out.shape[0]), index_dtype), values), int(values.shape[0])

    def encode_rows(self, rows: torch.Tensor, block: torch.Tensor, members: torch.Tensor, num_rows: int,
                    positions: Positions, index_dtype: torch.dtype) -> tuple[PullMessage, int]:
        """`encode` of a server whose non-zero rows are exactly `rows` (ascending, distinct, all in
        `members`), with values `block`: the same message bit for bit, with work proportional to len(rows)
        instead of len(members). `num_rows` is M."""
        return (self.rows_payload(rows, members, num_rows, positions, index_dtype), block), int(block.shape[0])

    def aggregate(self, received: list[PullMessage], words: torch.Tensor, num_rows: int
                  ) -> tuple[PullMessage, int] | None:
        """A server's message straight from the (ids, values) pushed to it (summed in the order given; rows
        that cancel to zero left out), its rows S_j given as membership words (a row of hashing.server_bits);
        None where this encoding has no such path (the caller sums, then `encode_rows`)."""
        return None

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

    def payload_rows(self, owned: int, nonzero: int, num_rows: int) -> int | None:
        """Length of the payload of a server owning `owned` rows, `nonzero` of them non-zero (it never shrinks as
        `nonzero` grows): what bounds a pull message before it is sent (zen.comm.base). None: not known."""
        return None

    @abstractmethod
    def pull_bytes(self, w: WireLayout, union: float) -> float:
        """Closed form (section 5) of the bytes one rank pulls from the n - 1 other servers when the
        aggregate has `union` non-zero rows spread evenly over the partitions: what `costmodel.bp` charges."""


ENCODINGS: Registry[Encoding] = Registry("pull encoding", ("zen.encodings",))
register_encoding = ENCODINGS.register


def encodings() -> list[str]:
    """Names of every registered pull encoding."""
    return ENCODINGS.names()


@functools.cache
def get_encoding(name: str) -> Encoding:
    """The (stateless) encoding `name`, one instance per name; unknown names list the choices."""
    return ENCODINGS.make(name)
