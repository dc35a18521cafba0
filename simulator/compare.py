"""A measured `zen train` cell beside its simulation: the rows of results/figures/sim_validation.csv."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from simulator import timeline
from simulator.calibrate import MessageCost
from simulator.validate import batch_rows, simulate_cell
from zen.netem import parse_rate


def validate_cell(report: dict[str, Any], timeline_path: Path, cost_path: Path, cores: int = 2) -> list[dict[str, Any]]:
    """Simulate the schemes of one `zen train` report on the emulated cluster it ran on."""
    cfg = report["config"]
    if not cfg.get("bandwidth"):
        raise ValueError("the run was not on the emulated cluster (no --bandwidth): nothing to simulate")
    t = timeline.load(timeline_path)
    rows = batch_rows(cfg["workload"], cfg["preset"], int(cfg["world_size"]), int(cfg["seed"]), step=int(cfg["warmup"]))
    runs = {r["scheme"]: r["summary"] for r in report["runs"]}
    sims = simulate_cell(t, rows, parse_rate(cfg["bandwidth"]), list(runs), MessageCost.load(cost_path), cores,
                         int(cfg["seed"]))
    out = []
    for scheme, s in runs.items():
        sim = sims[scheme]
        measured, simulated = 1e3 * s["iter_s_median"], 1e3 * sim.step_s
        out.append({"workload": cfg["workload"], "scheme": scheme, "world_size": int(cfg["world_size"]),
                    "bandwidth": cfg["bandwidth"], "measured_ms": measured, "measured_ms_lo": 1e3 * s["iter_s_p25"],
                    "measured_ms_hi": 1e3 * s["iter_s_p75"], "simulated_ms": simulated,
                    "simulated_comm_busy_ms": 1e3 * max(sim.comm_busy_s), "error": simulated / measured - 1,
                    "timeline": t.source})
    return out
