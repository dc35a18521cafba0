"""Leaf types shared by the communicator, the schemes and the harness: errors, traffic and stats records,
wire sizes, measured constants. Imports nothing of zen (and makes no distributed calls)."""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Self


class ZenError(RuntimeError):
    """Base class for errors the library raises on purpose."""


class ZenInputError(ValueError):
    """Bad input: raised on every rank, before any payload is exchanged."""


class ZenCommError(ZenError):
    """A collective failed: a dead or missing peer, or a timeout."""


@dataclass
class Traffic:
    """Exact payload bytes one rank sent and received, and collectives it joined, per phase; and how many
    times the communicator read (possibly device) data on the host (`Communicator.host`)."""

    sent: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    received: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    calls: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    host_reads: int = 0
    rounds: int = 0  # exchange rounds that brought a header (each may cost at most one host read)

    def add(self, phase: str, sent: int, received: int) -> None:
        self.sent[phase] += int(sent)
        self.received[phase] += int(received)
        self.calls[phase] += 1

    def absorb(self, other: Traffic) -> None:
        """Count `other`'s bytes, collectives, host reads and rounds in this record too."""
        for mine, theirs in ((self.sent, other.sent), (self.received, other.received), (self.calls, other.calls)):
            for phase, n in theirs.items():
                mine[phase] += n
        self.host_reads += other.host_reads
        self.rounds += other.rounds

    def under(self, prefix: str) -> Traffic:
        """A view of this record that files every phase under `prefix` (e.g. "intra:"): a communicator of a
        sub-group counts into the call's record, its link class readable in the phase names."""
        return _Prefixed(self, prefix)

    @property
    def bytes_sent(self) -> int:
        return sum(self.sent.values())

    @property
    def bytes_received(self) -> int:
        return sum(self.received.values())


class _OnTarget:
    """A counter of `_Prefixed` kept on its target, so what a sub-group's communicator reads or rounds counts once
    in the call's record. Ignores the dataclass __init__'s zeroing, which runs before the target is set."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, view: _Prefixed | None, owner: type | None = None) -> int:
        return getattr(view.target, self.name) if view is not None else self  # type: ignore[return-value]

    def __set__(self, view: _Prefixed, value: int) -> None:
        if hasattr(view, "target"):
            setattr(view.target, self.name, value)


class _Prefixed(Traffic):
    """`Traffic.under`: shares the target's counters, adds the prefix to each phase."""

    host_reads = _OnTarget()  # type: ignore[assignment]
    rounds = _OnTarget()  # type: ignore[assignment]

    def __init__(self, target: Traffic, prefix: str):
        super().__init__(target.sent, target.received, target.calls)
        self.prefix = prefix
        self.target = target

    def add(self, phase: str, sent: int, received: int) -> None:
        super().add(self.prefix + phase, sent, received)


@dataclass
class SyncStats:
    """What one rank observed in one synchronization: traffic plus partition loads.

    `push_counts[j]` is the number of non-zero rows this rank sent to server j (its own included);
    `server_count` is the number of non-zero rows of the aggregated partition this rank served.
    Partition-free schemes leave both unset. `choice`: the path zen's selector took (bp, hc); `intra`: the
    node steps two-level sync ran (dense, sparse).
    """

    traffic: Traffic = field(default_factory=Traffic)
    nnz: int = 0
    push_counts: list[int] | None = None
    server_count: int | None = None
    choice: str | None = None
    intra: str | None = None
    extra: dict[str, float] = field(default_factory=dict)

    def resolved(self) -> SyncStats:
        """These stats with every value left on the device (a 0-d tensor, not read during the call) read now."""
        for key, value in list(self.extra.items()):
            if not isinstance(value, float | int):
                self.extra[key] = float(value)
        return self


@dataclass(frozen=True)
class WireLayout:
    """What a traffic prediction needs besides the index sets: sizes on the wire and the hash seed."""

    world_size: int
    rows: int
    width: int = 1
    value_bytes: int = 4
    index_bytes: int = 4
    seed: int = 0

    @property
    def coo_row(self) -> int:
        return self.index_bytes + self.width * self.value_bytes


PhaseBytes = dict[str, int]


class Measured:
    """Constants measured once on a machine and kept as JSON, so every rank and every simulation reads the same
    numbers (a frozen dataclass's fields, by name)."""

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=1) + "\n")

    @classmethod
    def load(cls, path: Path) -> Self:
        return cls(**json.loads(path.read_text()))
