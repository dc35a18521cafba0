"""The fold to a power of two and recursive doubling over it (paper section 5.2; SparCML, SC'19).

With P ranks and p' = 2^floor(log2 P), the first 2 (P - p') ranks pair up: the even one of each pair
hands its data to its odd neighbour before the rounds (phase "fold"), sits the rounds out and gets the
result back after them (phase "unfold"). The p' ranks left take virtual ranks 0..p'-1 in rank order; in
round `level` virtual rank v exchanges with v XOR 2^level. Zen's HC and the SparCML baseline both run
this choreography, and their `predict`s replay it, from this one description.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Fold:
    world_size: int

    @property
    def p2(self) -> int:
        """p': the largest power of two <= P."""
        return 1 << (self.world_size.bit_length() - 1)

    @property
    def extra(self) -> int:
        """How many ranks sit out (and as many hold their data)."""
        return self.world_size - self.p2

    @property
    def levels(self) -> int:
        """Rounds of recursive doubling: log2 p'."""
        return self.p2.bit_length() - 1

    @property
    def pairs(self) -> list[tuple[int, int]]:
        """(rank that sits out, rank that holds its data) for every folded pair, in rank order."""
        return [(2 * i, 2 * i + 1) for i in range(self.extra)]

    @property
    def active(self) -> list[int]:
        """Real rank of every virtual rank 0..p'-1."""
        return [self.real(v) for v in range(self.p2)]

    def folded(self, r: int) -> bool:
        """Whether r is one of a folded pair (sits out or holds the data of one that does)."""
        return r < 2 * self.extra

    def sits_out(self, r: int) -> bool:
        return self.folded(r) and r % 2 == 0

    def partner(self, r: int) -> int:
        """The other rank of folded rank r's pair."""
        return r + 1 if r % 2 == 0 else r - 1

    def vrank(self, r: int) -> int:
        """Virtual rank of a rank that takes part in the rounds."""
        return r // 2 if self.folded(r) else r - self.extra

    def real(self, v: int) -> int:
        """Real rank of virtual rank v."""
        return 2 * v + 1 if v < self.extra else v + self.extra

    def peer(self, v: int, level: int) -> int:
        """Real rank virtual rank v exchanges with in round `level`."""
        return self.real(v ^ (1 << level))
