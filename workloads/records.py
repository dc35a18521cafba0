"""Per-step records of `zen train` and their summaries: one dataclass says what a step measured and how
ranks combine; the summary gives every time as a median with its spread (25th-75th percentile).

Times are noisy on a shared machine: a ratio of two schemes is quoted with the range its per-step spreads
allow (`ratio_range`), so a claim is only judged where that range does not straddle the target.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field, fields
from typing import Any

# how the ranks' values of one step combine: a step ends when its slowest rank does; bytes per rank average
MAX, MEAN, FIRST = "max", "mean", "first"


def _combined(how: str) -> Any:
    return field(default=None, metadata={"across": how})


@dataclass
class Step:
    """One training step on one rank. `comm_busy_s`: seconds during which some of the hook's communication
    was in flight (None where it cannot be seen: DDP's built-in allreduce)."""

    loss: float = _combined(MEAN)
    iter_s: float = _combined(MAX)
    comm_busy_s: float | None = _combined(MAX)
    bytes_sent: float | None = _combined(MEAN)
    bytes_received: float | None = _combined(MEAN)
    embedding_bytes_received: float | None = _combined(MEAN)
    embedding_nnz: float | None = _combined(MEAN)
    embedding_parts: int | None = _combined(MAX)
    choice: str | None = _combined(FIRST)
    residual_norm: float | None = _combined(MEAN)  # what the compressor has not sent yet (None: none)


STEP_FIELDS = [f.name for f in fields(Step)]
_REDUCE = {MAX: max, MEAN: statistics.fmean, FIRST: lambda values: values[0]}


def across_ranks(ranks: list[list[dict[str, Any]]]) -> dict[str, list[Any]]:
    """Per field, the step-by-step value over all ranks (None where any rank has None)."""
    out: dict[str, list[Any]] = {}
    for f in fields(Step):
        reduce = _REDUCE[f.metadata["across"]]
        columns = zip(*([step[f.name] for step in rank] for rank in ranks), strict=True)
        out[f.name] = [None if any(v is None for v in col) else reduce(list(col)) for col in columns]
    return out


def spread(values: list[float | None]) -> tuple[float, float, float] | None:
    """(median, 25th, 75th percentile), or None when a value is missing."""
    if not values or any(v is None for v in values):
        return None
    clean = [float(v) for v in values if v is not None]
    if len(clean) == 1:
        return clean[0], clean[0], clean[0]
    q1, _, q3 = statistics.quantiles(clean, n=4, method="inclusive")
    return statistics.median(clean), q1, q3


def ratio_range(num: tuple[float, float, float], den: tuple[float, float, float]) -> tuple[float, float, float]:
    """num / den as (median ratio, lowest, highest) over the two interquartile ranges."""
    return num[0] / den[0], num[1] / den[2], num[2] / den[1]


def summarize(steps: dict[str, list[Any]], timed: slice, samples_per_step: int) -> dict[str, Any]:
    """Medians and spreads of the timed steps; throughput from the same median as the step time."""
    iters = spread(steps["iter_s"][timed])
    assert iters is not None
    busy = spread(steps["comm_busy_s"][timed])
    summary: dict[str, Any] = {
        "iter_s_median": iters[0], "iter_s_p25": iters[1], "iter_s_p75": iters[2],
        "samples_per_s": samples_per_step / iters[0],
        "samples_per_s_p25": samples_per_step / iters[2], "samples_per_s_p75": samples_per_step / iters[1],
        "comm_busy_s_median": busy and busy[0], "comm_busy_s_p25": busy and busy[1],
        "comm_busy_s_p75": busy and busy[2],
        "final_loss": steps["loss"][-1], "zen_choice": steps["choice"][-1],
        "final_residual_norm": steps["residual_norm"][-1],
    }
    for key in ("bytes_sent", "bytes_received", "embedding_bytes_received", "embedding_nnz", "embedding_parts"):
        values = steps[key][timed]
        summary[f"{key}_per_step"] = None if not values or None in values else statistics.fmean(values)
    return summary


def exposed_comm(run: dict[str, Any], nocomm: dict[str, Any]) -> dict[str, float]:
    """The communication a scheme adds to a step: its step time minus the no-communication step time,
    median and the range the two interquartile ranges allow."""
    s, n = run["summary"], nocomm["summary"]
    return {"comm_exposed_s": s["iter_s_median"] - n["iter_s_median"],
            "comm_exposed_s_lo": s["iter_s_p25"] - n["iter_s_p75"],
            "comm_exposed_s_hi": s["iter_s_p75"] - n["iter_s_p25"]}
