"""nccl-tests style table for the terminal, markdown for results/, JSON lines for machines."""

from __future__ import annotations

import json
from typing import Any

COLUMNS = [
    ("scheme", "scheme", "{}"), ("time med ms", "time_ms_median", "{:.2f}"), ("p99 ms", "time_ms_p99", "{:.2f}"),
    ("rx max MB", "bytes_received_max", "{:.3f}"), ("rx mean MB", "bytes_received_mean", "{:.3f}"),
    ("push imb", "push_imbalance", "{:.3f}"), ("pull imb", "pull_imbalance", "{:.3f}"),
    ("union dens", "union_density", "{:.4f}"), ("algbw GB/s", "algbw_GBps", "{:.2f}"),
    ("speedup", "speedup_vs_allreduce", "{:.2f}x"), ("model ms", "time_ms_predicted", "{:.2f}"),
    ("choice", "choice", "{}"), ("correct", "correct", "{}"),
]
MB_KEYS = ("bytes_received_max", "bytes_received_mean")


def _cell(row: dict[str, Any], key: str, fmt: str) -> str:
    value = row.get(key)
    if value is None:
        return "-"
    if key in MB_KEYS:
        value = value / 1e6
    if key == "correct":
        return "yes" if value else "NO"
    return fmt.format(value)


def header(rows: list[dict[str, Any]]) -> str:
    r = rows[0]
    return (f"# backend={r['backend']} world_size={r['world_size']} numel={r['numel']} density={r['density']} "
            f"pattern={r['pattern']} dtype={r['dtype']} bandwidth={r['bandwidth'] or '-'} "
            f"in_place={'yes' if r.get('in_place') else 'no'} time={r['time_source']}"
            + (f" ranks_per_node={r['ranks_per_node']} sync={r['sync']}" if r.get("ranks_per_node", 1) > 1 else "")
            + (f" gloo_loop={r['gloo_loop']}" if r.get("gloo_loop", "-") != "-" else ""))


def table(rows: list[dict[str, Any]]) -> str:
    cells = [[_cell(r, key, fmt) for _, key, fmt in COLUMNS] for r in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, (h, _, _) in enumerate(COLUMNS)]
    lines = ["  ".join(h.rjust(w) for (h, _, _), w in zip(COLUMNS, widths, strict=True))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    wrong = sum(1 for r in rows if not r["correct"])
    return "\n".join([header(rows), *lines, f"# wrong results: {wrong}"])


def markdown(rows: list[dict[str, Any]]) -> str:
    cells = [[_cell(r, key, fmt) for _, key, fmt in COLUMNS] for r in rows]
    lines = [header(rows).lstrip("# "), "", "| " + " | ".join(h for h, _, _ in COLUMNS) + " |",
             "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(c) + " |" for c in cells]
    return "\n".join(lines) + "\n"


def json_lines(rows: list[dict[str, Any]]) -> str:
    return "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows)
