"""Measured `zen train` cells beside their simulation: the rows of results/figures/sim_fidelity.csv."""

from __future__ import annotations

import csv
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from harness.netem import parse_rate
from simulator import timeline
from simulator.calibrate import MessageCost
from simulator.fidelity import batch_rows, cell_steps, launch_factor, record_cell


def fidelity_rows(reports: list[dict[str, Any]], timeline_path: Path, cost_path: Path, cores: int = 2
                   ) -> list[dict[str, Any]]:
    """Simulate the schemes of `zen train` reports of one workload and world size (one or more launches per link
    rate) on the emulated cluster they ran on: the schedules are recorded once, each launch's CPU factor from
    its own `none` steps (simulator.fidelity), and a cell's repeated launches combined by their median."""
    cfgs = [r["config"] for r in reports]
    if not all(c.get("bandwidth") for c in cfgs):
        raise ValueError("a run was not on the emulated cluster (no --bandwidth): nothing to simulate")
    cell = {(c["workload"], c["preset"], int(c["world_size"]), int(c["seed"]), int(c["warmup"])) for c in cfgs}
    if len(cell) != 1:
        raise ValueError(f"the reports are of different cells: {sorted(cell)}")
    workload, preset, world, seed, warmup = cell.pop()
    t = timeline.load(timeline_path)
    schemes = sorted({r["scheme"] for rep in reports for r in rep["runs"]})
    rec = record_cell(t, batch_rows(workload, preset, world, seed, step=warmup), schemes,
                      MessageCost.load(cost_path), seed)
    cells: dict[str, list[dict[str, dict[str, float]]]] = defaultdict(list)
    for rep in reports:
        runs = {r["scheme"]: r["summary"] for r in rep["runs"]}
        if "none" not in runs:
            raise ValueError("the launch has no `none` steps: its CPU factor cannot be measured")
        factor = launch_factor(rec, runs["none"]["iter_s_median"], cores)
        sims = cell_steps(rec, parse_rate(rep["config"]["bandwidth"]), list(runs), cores, factor)
        cells[rep["config"]["bandwidth"]].append({scheme: {
            "measured_ms": 1e3 * s["iter_s_median"], "measured_ms_lo": 1e3 * s["iter_s_p25"],
            "measured_ms_hi": 1e3 * s["iter_s_p75"], "simulated_ms": 1e3 * sims[scheme].step_s,
            "simulated_comm_busy_ms": 1e3 * max(sims[scheme].comm_busy_s),
            "measured_comm_busy_ms": 1e3 * (s.get("comm_busy_s_median") or 0.0), "cpu_factor": factor}
            for scheme, s in runs.items()})
    out = []
    for rate, launches in cells.items():
        for scheme in sorted({k for launch in launches for k in launch}):
            row = _median_launch([launch[scheme] for launch in launches if scheme in launch])
            out.append({"workload": workload, "scheme": scheme, "world_size": world, "bandwidth": rate, **row,
                        "error": row["simulated_ms"] / row["measured_ms"] - 1, "calibration": scheme == "none",
                        "timeline": t.source})
    return out


def _median_launch(launches: list[dict[str, float]]) -> dict[str, float]:
    """One scheme's cell over repeated launches: the median of each launch's figures (each simulated with its
    own CPU factor), so one noisy launch moves neither side; `launches` says how many."""
    return {k: float(statistics.median(launch[k] for launch in launches)) for k in launches[0]} | {
        "launches": len(launches)}


def reports_from_throughput(path: Path, workload: str, world: int, preset: str = "scaled", seed: int = 0,
                            warmup: int = 3) -> list[dict[str, Any]]:
    """The measured cells of an aggregated training CSV (the pipeline's fig11_throughput.csv: ms per step and
    the 25th-75th percentile throughput per scheme) as `zen train` reports, one per link rate, for
    `fidelity_rows` (the run's preset, seed and warm-up steps are the pipeline config's)."""
    runs: dict[str, list[dict[str, Any]]] = defaultdict(list)
    with path.open() as f:
        for row in csv.DictReader(f):
            if row["workload"] != workload or int(row["world_size"]) != world or not row["bandwidth"] \
                    or row.get("compress"):
                continue
            iter_s, rate = float(row["iter_ms"]) / 1e3, float(row["samples_per_s"])
            runs[row["bandwidth"]].append({"scheme": row["scheme"], "summary": {
                "iter_s_median": iter_s, "iter_s_p25": iter_s * rate / float(row["samples_per_s_hi"]),
                "iter_s_p75": iter_s * rate / float(row["samples_per_s_lo"])}})
    if not runs:
        raise ValueError(f"{path}: no emulated-cluster cell of {workload} at {world} ranks")
    return [{"config": {"workload": workload, "preset": preset, "world_size": world, "seed": seed, "warmup": warmup,
                        "bandwidth": rate}, "runs": cell} for rate, cell in sorted(runs.items())]
