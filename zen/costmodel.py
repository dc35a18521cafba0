"""Alpha-beta cost model (paper section 5, Theorem 1): predicted bytes received per rank and time.

Closed forms take the statistics the paper uses: n ranks, M rows of width D, per-rank density d_G,
the densification ratios gamma^m (union density of m ranks over d_G) and the skewness s of even
contiguous ranges. Sizes are bytes: s_i per row index, s_v per value. Time = messages * alpha +
bytes on the busiest link / bandwidth (+ a local compute term, see `traffic_time`). Exact per-rank
bytes from actual index sets live in each scheme's `predict` (zen/prediction.py); these closed forms
are what the selector and the scale study's ideal lines use.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from zen import gaps
from zen.encodings import get_encoding
from zen.fold import Fold
from zen.types import WireLayout


@dataclass(frozen=True)
class Network:
    """alpha: seconds per message; bandwidth: bytes per second per link."""

    alpha: float = 10e-6
    bandwidth: float = 25e9 / 8


@dataclass(frozen=True)
class Workload:
    n: int
    rows: int
    density: float  # d_G: mean fraction of non-zero rows per rank
    gamma: Callable[[int], float]  # m -> gamma^m, with gamma(1) = 1
    width: int = 1
    value_bytes: int = 4
    index_bytes: int = 4
    skew: float = 1.0  # s: max over n even contiguous ranges of their density / d_G (1 = uniform)

    @property
    def coo_row(self) -> float:
        return self.index_bytes + self.width * self.value_bytes

    @property
    def nnz(self) -> float:
        return self.rows * self.density


@dataclass(frozen=True)
class Prediction:
    bytes_received: float
    messages: int

    def time(self, net: Network) -> float:
        return self.messages * net.alpha + self.bytes_received / net.bandwidth


def bp(w: Workload, pull: str = "hash_bitmap") -> Prediction:
    """Balanced Parallelism: push (n-1)/n of own COO, pull (n-1)/n of the union in `pull` encoding."""
    n = w.n
    share = (n - 1) / n
    push = share * w.nnz * w.coo_row
    wire = WireLayout(w.n, w.rows, w.width, w.value_bytes, w.index_bytes)
    pull_bytes = get_encoding(pull).pull_bytes(wire, w.gamma(n) * w.nnz)
    return Prediction(push + pull_bytes, 2 * (n - 1))


def hc(w: Workload, ids: str = "coo") -> Prediction:
    """Hierarchical Centralization: sum_i gamma^(2^(i-1)) * M * d_G rows, plus fold/unfold; each row costs
    s_i + D s_v as COO, or with `ids="gaps"` the expected gap code of a set of that union's density."""
    fold = Fold(w.n)
    unions = [w.gamma(1 << i) for i in range(fold.levels)]
    messages = fold.levels
    if fold.extra:  # folded ranks add one hop in and one out (a rank sees at most one of them)
        unions.append(w.gamma(w.n))
        messages += 1

    def row_bytes(gamma: float) -> float:
        if ids == "coo":
            return w.coo_row
        return gaps.bytes_per_id(min(1.0, gamma * w.density)) + w.width * w.value_bytes

    return Prediction(sum(g * w.nnz * row_bytes(g) for g in unions), messages)


def allreduce(w: Workload) -> Prediction:
    return Prediction(2 * (w.n - 1) / w.n * w.rows * w.width * w.value_bytes, 2 * (w.n - 1))


def agsparse(w: Workload) -> Prediction:
    """All-gather of COO: (n-1) k (s_i + D s_v), blind to overlap."""
    return Prediction((w.n - 1) * w.nnz * w.coo_row, w.n - 1)


def sparse_ps(w: Workload) -> Prediction:
    """Even contiguous ranges: the busiest server handles s times its share (spec: 2(n-1)(d+d^n)sM/n)."""
    share = (w.n - 1) / w.n
    return Prediction(share * w.skew * (1 + w.gamma(w.n)) * w.nnz * w.coo_row, 2 * (w.n - 1))


def omnireduce(w: Workload, block: int = 256) -> Prediction:
    """Blocks of `block` elements, 4 bytes of next-offset per block; non-empty block fractions from
    uniform placement: 1 - (1 - d)^b per worker, 1 - (1 - d^n)^b for the union."""
    d, dn = w.density, min(1.0, w.gamma(w.n) * w.density)
    blocks = w.rows * w.width / block
    per_block = block * w.value_bytes + 4
    own = (1 - (1 - d) ** (block / w.width)) * blocks
    union = (1 - (1 - dn) ** (block / w.width)) * blocks
    share = (w.n - 1) / w.n
    return Prediction(share * w.skew * (own + union) * per_block, 2 * (w.n - 1))


def sparcml(w: Workload) -> Prediction:
    """SSAR recursive doubling with the dense switch: each round's stream is capped at dense size."""
    levels = Fold(w.n).levels
    dense = w.rows * w.width * w.value_bytes
    rows = [min(w.gamma(1 << i) * w.nnz * w.coo_row, dense) for i in range(levels)]
    return Prediction(sum(rows), levels)


def bp_without_index(w: Workload) -> Prediction:
    """The paper's ideal line: BP moving values only (no indices, no bitmap): half of COO BP."""
    share = (w.n - 1) / w.n
    return Prediction(share * (1 + w.gamma(w.n)) * w.nnz * w.width * w.value_bytes, 2 * (w.n - 1))


CLOSED_FORMS: dict[str, Callable[[Workload], Prediction]] = {
    "allreduce": allreduce, "agsparse": agsparse, "sparse_ps": sparse_ps, "omnireduce": omnireduce,
    "sparcml": sparcml, "zen-bp": bp, "zen-hc": hc, "bp-without-index": bp_without_index,
}


def two_level(w: Workload, ranks_per_node: int, inner: Callable[[Workload], Prediction]
              ) -> tuple[float, Prediction]:
    """Two-level sync (paper section 5, step 2): (the dense bytes a rank receives inside its node, the
    `inner` closed form across the n/k nodes). Inside, the reduce-scatter and the all-gather bring (k-1)/k
    of the tensor each. Across, each rank syncs a 1/k shard of its node's sum, as dense as the union of k
    ranks (gamma^k d_G), and the union of m nodes is that of k m ranks. A node's k ranks share its uplink:
    `node_time` is the time of what they move together."""
    k = ranks_per_node
    g = w.gamma(k)
    shard = replace(w, n=w.n // k, rows=max(1, w.rows // k), density=min(1.0, g * w.density),
                    gamma=lambda m: w.gamma(k * m) / g)
    return 2 * (k - 1) / k * w.rows * w.width * w.value_bytes, inner(shard)


def node_time(per_rank: Prediction, ranks_per_node: int, net: Network) -> float:
    """Time of `per_rank` on each of a node's ranks when they share one uplink (their messages overlap)."""
    return per_rank.messages * net.alpha + ranks_per_node * per_rank.bytes_received / net.bandwidth


def traffic_time(sent: dict[str, list[int]], received: dict[str, list[int]], calls: dict[str, int],
                 net: Network) -> float:
    """Time of measured (or predicted) traffic: phases run one after another; within a phase every
    node's full-duplex link is busy for max(bytes out, bytes in) / bandwidth, the slowest node sets
    the pace, and each collective call costs alpha."""
    total = 0.0
    for phase in set(sent) | set(received) | set(calls):
        out, inn = sent.get(phase, []), received.get(phase, [])
        busiest = max((max(a, b) for a, b in zip(out, inn, strict=True)), default=0)
        total += busiest / net.bandwidth + calls.get(phase, 0) * net.alpha
    return total


def gamma_from_union(n: int, gamma_n: float) -> Callable[[int], float]:
    """Interpolate gamma^m from the measured gamma^n, modelling each union row as present in each
    rank independently with probability q: gamma^m = (1 - (1 - q)^m) / q. Exact for identical
    (q = 1) and for random disjoint-like sets (q -> 0)."""
    gamma_n = min(max(gamma_n, 1.0), float(n))
    if n == 1 or gamma_n >= n - 1e-9:
        return lambda m: float(m)
    if gamma_n <= 1 + 1e-12:
        return lambda m: 1.0
    lo, hi = 1e-12, 1.0
    for _ in range(200):
        q = (lo + hi) / 2
        if (1 - (1 - q) ** n) / q > gamma_n:
            lo = q
        else:
            hi = q
    q = (lo + hi) / 2
    return lambda m: (1 - (1 - q) ** m) / q


def choose_bp_or_hc(w: Workload, net: Network, pull: str = "hash_bitmap", hc_ids: str = "coo") -> str:
    """The selector's rule: whichever of BP and HC the model predicts to finish first."""
    return "bp" if bp(w, pull).time(net) <= hc(w, hc_ids).time(net) else "hc"

