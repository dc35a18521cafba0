"""Alpha-beta cost model (paper section 5, Theorem 1): predicted bytes received per rank and time.

Inputs are the statistics the paper uses: n ranks, M rows of width D, per-rank density d_G and the
densification ratios gamma^m (union density of m ranks over d_G). Sizes are in bytes: s_i per row
index, s_v per value. Time = messages * alpha + bytes received / bandwidth.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

BITMAP_BYTES_PER_ROW = 1 / 8


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
    union = w.gamma(n) * w.nnz
    if pull == "hash_bitmap":
        pull_bytes = share * (w.rows * BITMAP_BYTES_PER_ROW + union * w.width * w.value_bytes)
    elif pull == "bitmap":
        pull_bytes = (n - 1) * w.rows * BITMAP_BYTES_PER_ROW + share * union * w.width * w.value_bytes
    else:
        pull_bytes = share * union * w.coo_row
    return Prediction(push + pull_bytes, 2 * (n - 1))


def hc(w: Workload) -> Prediction:
    """Hierarchical Centralization: sum_i gamma^(2^(i-1)) * M * d_G COO rows, plus fold/unfold."""
    p2 = 1 << (w.n.bit_length() - 1)
    levels = p2.bit_length() - 1
    rows = sum(w.gamma(1 << i) for i in range(levels)) * w.nnz
    messages = levels
    if p2 != w.n:  # folded ranks add one hop in and one out (a rank sees at most one of them)
        rows += w.gamma(w.n) * w.nnz
        messages += 1
    return Prediction(rows * w.coo_row, messages)


def allreduce(w: Workload) -> Prediction:
    return Prediction(2 * (w.n - 1) / w.n * w.rows * w.width * w.value_bytes, 2 * (w.n - 1))


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


def choose_bp_or_hc(w: Workload, net: Network, pull: str = "hash_bitmap") -> str:
    """The selector's rule: whichever of BP and HC the model predicts to finish first."""
    return "bp" if bp(w, pull).time(net) <= hc(w).time(net) else "hc"

