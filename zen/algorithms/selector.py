"""The `zen` scheme: run Balanced Parallelism while measuring gamma, then pick BP or Hierarchical
Centralization (paper section 5, Theorem 1) for each tensor size.

The paper's rule (`select="bytes"`) asks the cost model which of the two receives fewer bytes (a positive
alpha adds a per-message latency, which favours HC's fewer messages). Bytes are the verdict where the network
is the bottleneck; where local work competes (ranks sharing cores, a slow decode of many partitions) they can
mislead: at 8 ranks on 2 cores BP moves 22% fewer bytes than HC yet takes 1.7x longer. So by default
(`select="time"`) the candidates are also timed on real backends: after the measuring BP calls, `trial_iters` HC
calls of each variant run, each rank all-gathers the fastest of each, and the one slower at its fastest rank loses;
within 5% the bytes rule decides. HC's ids go gap-coded (fewer bytes, more CPU) or as plain COO: with `hc_ids="auto"`
(the default) both HC variants are timed the same way and the slower loses, the gap-coded one on a tie, so
where bytes are nearly free (ranks sharing cores on loopback) HC does not pay for a coding it does not need.
The fastest of several, not one call each: a call that met a busy core (a DDP hook's
call overlaps backward) would otherwise settle the choice for good. The fastest rank, not the slowest: a
rank's time includes waiting for the others to arrive (in a DDP hook, how far apart the ranks' backward
passes are), which no path changes; the rank that arrived last waited least, so its time is the path's own,
which is what a step's end waits for after the last rank is ready. The simulated group has no meaningful
clock, so it always uses the bytes rule, as `predict` does. On a GPU the calls are timed with CUDA events on the
lane's stream (zen.device.Clock), not the host's clock, which would see only the time to enqueue them.
"""

from __future__ import annotations

import torch

from zen import costmodel
from zen.algorithms.bp import BalancedParallelism
from zen.algorithms.hc import HierarchicalCentralization
from zen.comm.base import Communicator
from zen.device import Clock
from zen.grad import LocalGrad
from zen.output import Output
from zen.registry import register_scheme
from zen.types import PhaseBytes, SyncStats, WireLayout

SELECT = ("time", "bytes")
HC_IDS = ("auto", "gaps", "coo")
TIE = 0.05  # time differences within this fraction leave the choice to the bytes rule


@register_scheme("zen")
class ZenAuto:
    """Measures d_G and gamma^n during the first `measure_iters` calls per tensor size (as BP), then, with
    `select="time"` on a real backend, times `trial_iters` calls of each HC variant; keeps the choice. More
    calls choose more surely where the variants are close (at 4 ranks on 2 cores, 2^24 and 1%, the fastest of
    two kept the gap-coded ids in one of three launches, 37.3 ms a call against 33.7 for zen-hc's plain ids;
    with four, plain ids in three of three), but every call of the trial is one a short benchmark times: the
    training cells time steps 4-12, so the default stays at two. Every rank decides from the same all-gathered
    numbers. `hc_ids`: how HC's messages carry their ids, "gaps" (zen.gaps: a compressed part's rows cost 5
    bytes, not 8), "coo" (the paper's) or "auto" (both timed on a real backend; gaps where nothing is timed, as
    in the simulated group)."""

    sparse_input = True
    label = "Zen"
    color = "#d62728"  # one colour per scheme in every figure (Zen in reds)
    marker = "o"

    def __init__(self, measure_iters: int = 2, alpha: float = 0.0, bandwidth_gbps: float = 25.0,
                 choice: str | None = None, select: str = "time", hc_ids: str = "auto", trial_iters: int = 2,
                 **bp_options: object):
        if choice not in (None, "bp", "hc"):
            raise ValueError(f"choice must be 'bp', 'hc' or None (auto), got {choice!r}")
        if select not in SELECT:
            raise ValueError(f"select must be one of {SELECT}, got {select!r}")
        if hc_ids not in HC_IDS:
            raise ValueError(f"hc_ids must be one of {HC_IDS}, got {hc_ids!r}")
        self.bp = BalancedParallelism(**bp_options)
        self.hc = HierarchicalCentralization(ids="coo" if hc_ids == "coo" else "gaps")
        self.hc_coo = HierarchicalCentralization(ids="coo") if hc_ids == "auto" else None
        self.measure_iters = max(1, measure_iters)
        self.trial_iters = max(1, trial_iters)
        self.net = costmodel.Network(alpha=alpha, bandwidth=bandwidth_gbps * 1e9 / 8)
        self.forced = choice
        self.select = select
        self.measured: dict[tuple, list[float]] = {}  # key -> the measuring BP calls' times
        self.trials: dict[tuple, tuple[float, str, dict[str, list[float]]]] = {}  # key -> (BP's fastest, the
        # bytes rule's choice, each HC variant's trial call times so far)
        self.choices: dict[tuple, str] = {}  # key -> "bp", "hc" or "hc-coo" (HC with plain COO ids)

    def __call__(self, grad: LocalGrad, comm: Communicator, out: Output, stats: SyncStats) -> None:
        key = (grad.num_rows, grad.row_width, grad.dtype)
        choice = self.forced or self.choices.get(key)
        if choice is None and key in self.trials:
            self._trial_hc(key, grad, comm, out, stats)
            return
        if choice in ("hc", "hc-coo"):
            stats.choice = "hc"
            self._hc_path(choice)(grad, comm, out, stats)
            return
        clock = Clock(grad.device).start()
        self.bp(grad, comm, out, stats)
        stats.choice = "bp"
        if choice is None:
            times = self.measured.setdefault(key, [])
            times.append(clock.stop().seconds())
            if len(times) >= self.measure_iters:
                by_bytes = self._decide(grad, comm, stats)
                if self.select == "time" and comm.clocked and comm.world_size > 1:
                    variants = ("hc", "hc-coo") if self.hc_coo is not None else ("hc",)
                    self.trials[key] = (min(times), by_bytes, {v: [] for v in variants})
                else:
                    self.choices[key] = by_bytes

    def settling_calls(self, comm: Communicator) -> int:
        """Calls per tensor size spent choosing a path on `comm` (the measuring BP calls, then each timed HC
        variant's), the same on every rank: what a trial around zen (two-level's node steps) does not time."""
        if self.forced:
            return 0
        timed = self.select == "time" and comm.clocked and comm.world_size > 1
        variants = (2 if self.hc_coo is not None else 1) if timed else 0
        return self.measure_iters + variants * self.trial_iters

    def _trial_hc(self, key: tuple, grad: LocalGrad, comm: Communicator, out: Output, stats: SyncStats) -> None:
        """One timed HC call (gap-coded ids first, then plain COO with `hc_ids="auto"`); after `trial_iters`
        of each, the choice: per path its fastest call at the rank where it is fastest (the one that waited
        least for the others); COO over gaps only when faster by more than TIE; then BP against that HC, the
        bytes rule on a tie."""
        bp_s, by_bytes, hc_times = self.trials[key]
        variant = next(v for v, times in hc_times.items() if len(times) < self.trial_iters)
        clock = Clock(grad.device).start()
        self._hc_path(variant)(grad, comm, out, stats)
        stats.choice = "hc"
        hc_times[variant].append(clock.stop().seconds())
        if any(len(times) < self.trial_iters for times in hc_times.values()):
            return
        del self.trials[key]
        mine = [bp_s] + [min(times) for times in hc_times.values()]
        table = comm.all_gather_fixed(torch.tensor(mine, dtype=torch.float64), dtype=torch.float64)
        bp_best, hc_best, *coo = (min(column) for column in zip(*table, strict=True))
        hc_path = "hc"
        if coo and coo[0] < (1 - TIE) * hc_best:
            hc_path, hc_best = "hc-coo", coo[0]
        stats.extra.update(bp_trial_s=bp_best, hc_trial_s=hc_best)
        if abs(bp_best - hc_best) <= TIE * max(bp_best, hc_best):
            self.choices[key] = hc_path if by_bytes == "hc" else "bp"
        else:
            self.choices[key] = hc_path if hc_best < bp_best else "bp"

    def _hc_path(self, name: str) -> HierarchicalCentralization:
        """HC with plain COO ids for "hc-coo" (when timed), else with gap-coded ids."""
        return self.hc_coo if name == "hc-coo" and self.hc_coo is not None else self.hc

    def _decide(self, grad: LocalGrad, comm: Communicator, stats: SyncStats) -> str:
        table = comm.all_gather_fixed([stats.nnz, stats.server_count or 0])
        layout = WireLayout(comm.world_size, grad.num_rows, grad.row_width, grad.dtype.itemsize,
                            grad.index_dtype().itemsize)
        mean_nnz = sum(row[0] for row in table) / len(table)
        union = sum(row[1] for row in table)
        stats.extra["gamma_n"] = union / mean_nnz if mean_nnz else 1.0
        return self.decide(layout, mean_nnz, union)

    def decide(self, layout: WireLayout, mean_nnz: float, union: int) -> str:
        """BP or HC from the measured mean non-zero rows per rank and the union size."""
        if mean_nnz == 0:
            return "bp"
        n = layout.world_size
        w = costmodel.Sparsity(
            n=n, rows=layout.rows, density=mean_nnz / layout.rows,
            gamma=costmodel.gamma_from_union(n, union / mean_nnz), width=layout.width,
            value_bytes=layout.value_bytes, index_bytes=layout.index_bytes,
        )
        return self.choose(w)

    def choose(self, w: costmodel.Sparsity) -> str:
        """The paper's rule (Theorem 1): whichever of BP and HC the cost model has finish first."""
        return "bp" if self.bp.closed_form(w).time(self.net) <= self.hc.closed_form(w).time(self.net) else "hc"

    def closed_form(self, w: costmodel.Sparsity) -> costmodel.Prediction:
        """The closed form of the path it picks for `w` (or the one it was told to take)."""
        choice = self.forced or self.choose(w)
        return (self.bp if choice == "bp" else self.hc).closed_form(w)

    def predict(self, sets: list[torch.Tensor], layout: WireLayout) -> list[PhaseBytes]:
        """Steady state: the path the selector picks from these sets' statistics."""
        mean_nnz = sum(int(s.numel()) for s in sets) / len(sets)
        union = int(torch.unique(torch.cat(sets)).numel())
        choice = self.forced or self.decide(layout, mean_nnz, union)
        return (self.bp if choice == "bp" else self.hc).predict(sets, layout)
