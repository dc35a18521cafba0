"""What a rank does in one simulated step: streams of local work, communication and hand-overs (a leaf module:
no torch, so the SimGrid worker process starts fast).

A rank runs several streams at once (its training thread, the DDP hook's communication lanes, each issued
asynchronous all-reduce), as the real process runs threads. Items of one stream run in order; streams of one
rank meet through named events (`Signal` / `Wait`). A `Comm` is one backend primitive of a recorded call: the
bytes it sends to and receives from each peer, exactly as the communicator moved them, or a collective the
engine expands into its algorithm's messages (a ring all-reduce, a Bruck all-gather). Messages are matched by
(call, sender, receiver, their order between the two), as a transport matches them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

P2P = ("all_to_all", "all_gather_bytes")
COLLECTIVES = ("all_reduce", "all_gather")


@dataclass(frozen=True)
class Compute:
    """Local work: seconds of one core of the rank's processor (this machine's core, or the platform's GPU)."""

    seconds: float


@dataclass(frozen=True)
class Comm:
    """One backend primitive. P2P kinds: `sends` / `recvs` map peer -> bytes, all posted at once, done when
    all are. Collectives: `nbytes` is this rank's tensor (all_reduce: the summed tensor; all_gather: one
    rank's block), the engine picks the algorithm, among `group`. `call` names the recorded call the messages
    belong to. `cpu_s`: what its messages cost the rank's processor (the backend's threads, the kernel),
    spent alongside the transfers, spread over the primitive's rounds."""

    kind: str
    call: str
    sends: dict[int, int] = field(default_factory=dict)
    recvs: dict[int, int] = field(default_factory=dict)
    nbytes: int = 0
    itemsize: int = 4
    group: tuple[int, ...] | None = None  # a collective's ranks, in their order (None: every rank)
    cpu_s: float = 0.0

    def __post_init__(self) -> None:
        if self.kind not in P2P + COLLECTIVES:
            raise ValueError(f"unknown primitive {self.kind!r}")


@dataclass(frozen=True)
class Signal:
    event: str


@dataclass(frozen=True)
class Wait:
    event: str


Item = Compute | Comm | Signal | Wait


@dataclass
class Stream:
    """One thread of a rank. `main`: the step ends when every rank's main stream has; `comm`: its time counts
    as communication (busy time)."""

    rank: int
    name: str
    items: list[Item] = field(default_factory=list)
    main: bool = False
    comm: bool = False


@dataclass
class StepResult:
    """Simulated seconds: the step (slowest rank), each rank's end and the time its comm streams were busy."""

    step_s: float
    rank_end_s: list[float]
    comm_busy_s: list[float]
    messages: int
