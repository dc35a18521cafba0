"""`zen`'s plans and their predicted times, from what every rank knows once BP has run (zen.algorithms.selector).

After the measuring BP calls every rank has all-gathered, per rank: its non-zero rows, what it pushed to each hash
server, how many non-zero rows it served, and how many of its rows fall in each of n equal ranges (`Counts`).
That gives BP's bytes exactly, per rank, sent and received (a server sends its pull message to n - 1 ranks, so
the busiest server decides, not the mean), the all-gather's exactly, and BP over ranges' push exactly; its pull
comes from the result's non-zero rows in each range, which every rank counts on the same result.
HC's bytes come from the cost model's closed form at the measured gamma, its gap codes scaled by what the ranks'
own codes measured against random sets'. A plan's time is its busiest rank's
bytes, sent or received (its messages' headers included), over the link's rate, plus its messages' latency.

The plans (`PLANS`): "bp" (hash partitions), "bp-range" (equal ranges), "hc" / "hc-coo" (HC with gap-coded or
plain ids), "ag" / "ag-coo" (HC without its merge: one all-gather).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from zen import costmodel, gaps
from zen.algorithms.bp import BalancedParallelism
from zen.algorithms.partitions import even_bounds
from zen.comm.base import count_meta, gather_v_meta, message_meta
from zen.types import WireLayout

PLANS = ("bp", "bp-range", "hc", "hc-coo", "ag", "ag-coo")
TIE = 0.05  # predicted or timed differences within this fraction count as a tie
RANGE_MARGIN = 0.01  # ranges replace hashes only when predicted this much faster (the hashes were measured)


@dataclass(frozen=True)
class Counts:
    """Per rank i: nnz[i] non-zero rows; hash_push[i][j] of them owned by hash server j; served[i] non-zero rows
    of the partition rank i served; coded[i] bytes of its ids gap-coded (zen.gaps); range_push[i][j] of its rows
    in range j. `owned[j]`: |S_j| of the hash partitions; `range_union[j]`: the result's non-zero rows in range j
    (every rank reads them off the same result)."""

    layout: WireLayout
    nnz: list[int]
    hash_push: list[list[int]]
    served: list[int]
    coded: list[int]
    range_push: list[list[int]]
    owned: list[int]
    range_union: list[int]

    def row(self, rank: int) -> list[int]:
        """Rank `rank`'s numbers as one flat row (what the selector all-gathers)."""
        return [self.nnz[rank], self.served[rank], self.coded[rank], *self.hash_push[rank], *self.range_push[rank]]

    @classmethod
    def from_rows(cls, layout: WireLayout, rows: list[list[int]], owned: list[int], range_union: list[int]
                  ) -> Counts:
        n = layout.world_size
        return cls(layout, [r[0] for r in rows], [list(r[3 : 3 + n]) for r in rows], [r[1] for r in rows],
                   [r[2] for r in rows], [list(r[3 + n : 3 + 2 * n]) for r in rows], owned, range_union)

    @property
    def union(self) -> int:
        return sum(self.served)


def _bp_time(c: Counts, push: list[list[int]], owned: list[int], union: list[float], bp: BalancedParallelism,
             net: costmodel.Network) -> float:
    """Push then pull, each as long as its busiest rank's bytes (sent or received)."""
    n, layout = c.layout.world_size, c.layout
    push_busy = max(max(sum(push[r][j] for j in range(n) if j != r), sum(push[i][r] for i in range(n) if i != r))
                    for r in range(n)) * layout.coo_row
    payload = [bp.encoding.payload_bytes(owned[j], round(union[j]), layout) for j in range(n)]
    pull_busy = max(max((n - 1) * p, sum(payload) - p) for p in payload)
    meta = count_meta(n) + gather_v_meta(n)
    return 2 * (n - 1) * net.alpha + (push_busy + pull_busy + meta) / net.bandwidth


def predicted_times(c: Counts, net: costmodel.Network, plans: Mapping[str, Any]) -> dict[str, float]:
    """Every plan's predicted seconds (see the module's docstring); `plans`: the scheme running each plan."""
    n, layout = c.layout.world_size, c.layout
    if n == 1 or not any(c.nnz):
        return {name: 0.0 for name in ("bp", "bp-range", "hc", "hc-coo")}
    times: dict[str, float] = {}
    bp, ranged = plans["bp"], plans["bp-range"]
    times["bp"] = _bp_time(c, c.hash_push, c.owned, [float(s) for s in c.served], bp, net)
    bounds = even_bounds(layout.rows, n)
    times["bp-range"] = _bp_time(c, c.range_push, [bounds[j + 1] - bounds[j] for j in range(n)],
                                 [float(u) for u in c.range_union], ranged, net)
    mean = sum(c.nnz) / n
    w = costmodel.Sparsity(n=n, rows=layout.rows, density=mean / layout.rows,
                           gamma=costmodel.gamma_from_union(n, c.union / mean), width=layout.width,
                           value_bytes=layout.value_bytes, index_bytes=layout.index_bytes)
    expected = sum(k * gaps.bytes_per_id(k / layout.rows) for k in c.nnz)
    scale = sum(c.coded) / expected if expected else 1.0  # clustered rows code shorter than random ones
    for name in ("hc", "hc-coo"):
        form = plans[name].closed_form(w, scale)
        times[name] = form.time(net) + form.messages * message_meta() / net.bandwidth
    for name in ("ag", "ag-coo") if n > 2 else ():  # HC of two ranks is one exchange and no merge already
        values = layout.width * layout.value_bytes
        sizes = [k * (values + layout.index_bytes) for k in c.nnz] if name == "ag-coo" else \
            [k * values + coded for k, coded in zip(c.nnz, c.coded, strict=True)]
        busy = max(max((n - 1) * b, sum(sizes) - b) for b in sizes)
        times[name] = (n - 1) * net.alpha + (busy + gather_v_meta(n)) / net.bandwidth
    return times


def counts_of(sets: list[torch.Tensor], layout: WireLayout, seed: int, bp: BalancedParallelism) -> Counts:
    """The `Counts` the ranks would all-gather after a BP call on these row sets (`predict`'s steady state)."""
    n, M = layout.world_size, layout.rows
    hashed = bp.partitioner(lambda: seed)
    union = torch.unique(torch.cat(sets))
    served = torch.bincount(hashed.owners(union, n, M), minlength=n).tolist()
    _, offsets = hashed.server_rows(M, n, torch.device("cpu"))
    ranges = torch.tensor(even_bounds(M, n), dtype=torch.int64)
    return Counts(layout, [int(s.numel()) for s in sets],
                  [torch.bincount(hashed.owners(s, n, M), minlength=n).tolist() for s in sets], served,
                  [gaps.nbytes(s) for s in sets],
                  [torch.searchsorted(s.to(torch.int64), ranges).diff().tolist() for s in sets],
                  [offsets[j + 1] - offsets[j] for j in range(n)], torch.searchsorted(union, ranges).diff().tolist())


def families(times: dict[str, float], ids: str = "gaps") -> tuple[str, str]:
    """(BP's plan, HC's plan) to weigh against each other: BP over hash partitions, or over ranges where those
    are predicted faster by RANGE_MARGIN; HC, or its all-gather where that is within TIE of it: HC's rounds save
    bytes only where ranks share rows, and the all-gather skips its merges. `ids`: "gaps" or "coo"."""
    bp = "bp-range" if times["bp-range"] < (1 - RANGE_MARGIN) * times["bp"] else "bp"
    hc = "ag" if "ag" in times and times["ag"] <= (1 + TIE) * times["hc"] else "hc"
    return bp, hc if ids == "gaps" else f"{hc}-coo"


def best(times: dict[str, float], ids: str = "gaps") -> str:
    """The predicted choice: the faster of `families`' two (BP on a tie)."""
    bp, hc = families(times, ids)
    return hc if times[hc] < times[bp] else bp
