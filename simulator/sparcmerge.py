"""SparCML's merges at the paper's setting: the local work its byte-faithful recording leaves out.

SSAR_Recursive_double (the variant the paper compares against) sums two streams every round: the rank's own and
its partner's, both ascending (index, value) lists, merged in one linear pass (SparCML's sum of two sparse
streams; baselines/sparcml.py sums by a sort, whose time is not SparCML's). The next round sends the merged
stream, so each merge lies on the critical path, where OmniReduce's aggregation runs alongside its transfers
(simulator.omnistream).

`measure` times that merge on this machine as zen's own local cost is timed (zen.algorithms.localcost):
zen.rows.merge_rows (a native linear merge of two ascending row sets, rows summed on shared ids) on one thread,
at two row widths, which gives a cost per row (its id compared and copied) and per value (added or copied).
`priced` adds, after each exchange of a rank's recorded call (its stream out to one partner, the partner's in),
the merge of both as local work on the rank's processor. Dense streams are priced as rows of the same width (no
ids: a few percent high at the paper's widths). The fold of a world that is not a power of two (a receive with
nothing sent) is not priced: every machine count simulated here is one.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from simulator.schedule import Comm, Compute, Item
from zen.types import Measured

INDEX_BYTES = 4  # SparCML's row ids on the wire (int32; baselines/sparcml.py)


@dataclass(frozen=True)
class MergeCost(Measured):
    row_s: float  # one thread's CPU per input row, besides its values: its id compared and copied
    value_s: float  # per input value: added to its partner's or copied
    source: str = ""

    def seconds(self, rows: float, width: int) -> float:
        return rows * (self.row_s + width * self.value_s)


def measure(rows: int = 1 << 16, widths: tuple[int, int] = (8, 64), repeats: int = 9) -> MergeCost:
    """The merge's cost on this machine, one thread: `zen`'s own timing of zen.rows.merge_rows
    (zen.algorithms.localcost.merge_seconds: two ascending sets of `rows` rows, about half their ids shared) in the
    thread's CPU time per input row at two widths, on the line row_s + width x value_s."""
    import torch

    from zen.algorithms.localcost import merge_seconds

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        per_row = [merge_seconds(rows, width, repeats, time.thread_time) / (2 * rows) for width in widths]
    finally:
        torch.set_num_threads(threads)
    value_s = max(0.0, (per_row[1] - per_row[0]) / (widths[1] - widths[0]))
    row_s = max(0.0, per_row[0] - widths[0] * value_s)
    return MergeCost(row_s, value_s, f"measured here: one thread, zen.rows.merge_rows of two ascending sets of "
                                     f"{rows} rows (about half shared) at widths {widths[0]} and {widths[1]}, "
                                     f"median of {repeats}")


def merged_rows(item: Comm, width: int) -> float:
    """Rows an exchange brings to its merge: the rank's stream (what it sent) and its partner's (what came)."""
    return (sum(item.sends.values()) + sum(item.recvs.values())) / (INDEX_BYTES + 4 * width)


def exchange(item: Item) -> bool:
    """A rank's stream out to one partner and the partner's in (a round of recursive doubling)."""
    return isinstance(item, Comm) and len(item.sends) == 1 and item.sends.keys() == item.recvs.keys()


def priced(items: list[Item], cost: MergeCost, width: int) -> list[Item]:
    """One rank's recorded SSAR_Recursive_double call with each round's merge after it (local work on the rank's
    processor, before the next round can send). A round is the counts exchanged, then the streams with the same
    partner: the streams' exchange is the one the next primitive does not repeat with that partner."""
    comms = [i for i in items if isinstance(i, Comm)]
    follows = {id(a): b for a, b in zip(comms, comms[1:], strict=False)}
    out: list[Item] = []
    for item in items:
        out.append(item)
        if exchange(item):
            after = follows.get(id(item))
            if after is None or not (exchange(after) and after.sends.keys() == item.sends.keys()):  # type: ignore[union-attr]
                out.append(Compute(cost.seconds(merged_rows(item, width), width)))  # type: ignore[arg-type]
    return out
