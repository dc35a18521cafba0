"""Alpha-beta cost model (paper section 5, Theorem 1): predicted bytes received per rank and time.

A scheme's closed form is a method of its class (`closed_form(sparsity)`), next to its exact `predict`;
this module holds what they share: the statistics the paper uses (`Sparsity`: n ranks, M rows of width D,
per-rank density d_G, the densification ratios gamma^m (union density of m ranks over d_G) and the skewness
s of even contiguous ranges; sizes in bytes, s_i per row index, s_v per value), time = messages * alpha +
bytes on the busiest link / bandwidth (+ a local compute term, see `traffic_time`), two-level sync's
composition, the paper's "BP without index" ideal line, and `closed_form(name, ...)` over the registry.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from zen.registry import SCHEMES, make_scheme


@dataclass(frozen=True)
class Network:
    """alpha: seconds per message; bandwidth: bytes per second per link."""

    alpha: float = 10e-6
    bandwidth: float = 25e9 / 8


@dataclass(frozen=True)
class Sparsity:
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


def bp_without_index(w: Sparsity) -> Prediction:
    """The paper's ideal line: BP moving values only (no indices, no bitmap): half of COO BP."""
    share = (w.n - 1) / w.n
    return Prediction(share * (1 + w.gamma(w.n)) * w.nnz * w.width * w.value_bytes, 2 * (w.n - 1))


def two_level_cost(w: Sparsity, ranks_per_node: int, inner: Callable[[Sparsity], Prediction]
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


def closed_form(name: str, w: Sparsity, **options: object) -> Prediction | None:
    """The closed form of registered scheme `name` (with `options`) for `w`; None if it has none."""
    form = getattr(make_scheme(name, **options), "closed_form", None)
    return form(w) if form is not None else None


def closed_forms() -> list[str]:
    """The registered schemes that have a closed form."""
    return [n for n in SCHEMES.names() if hasattr(SCHEMES.get(n), "closed_form")]
