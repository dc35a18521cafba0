"""Helpers shared by the pipeline's scripts: atomic writes, one colour per scheme, figure saving.

Scripts run as `python workflow/scripts/<name>.py` (this folder is then on sys.path), never through
Snakemake's `script:`, so they import the installed `zen` package like any other program.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

# One colour per scheme across every figure (Zen variants in reds, baselines in cool/neutral tones).
SCHEME_COLORS = {
    "allreduce": "#4d4d4d",
    "agsparse": "#1f77b4",
    "sparcml": "#2ca02c",
    "omnireduce": "#9467bd",
    "sparse_ps": "#8c564b",
    "zen": "#d62728",
    "zen-bp": "#ff7f0e",
    "zen-hc": "#e377c2",
    "zen-bp-noindex": "#fdae6b",
    "ddp": "#7f7f7f",
    "none": "#bcbd22",
}
SCHEME_LABELS = {
    "allreduce": "AllReduce", "agsparse": "AGsparse", "sparcml": "SparCML", "omnireduce": "OmniReduce",
    "sparse_ps": "Sparse PS", "zen": "Zen", "zen-bp": "Zen BP", "zen-hc": "Zen HC",
    "zen-bp-noindex": "BP w/o index", "ddp": "DDP allreduce", "none": "no comm",
}
MARKERS = {"allreduce": "s", "agsparse": "v", "sparcml": "^", "omnireduce": "D", "sparse_ps": "P",
           "zen": "o", "zen-bp": "o", "zen-hc": "X", "zen-bp-noindex": "o"}
_FALLBACK = plt.get_cmap("tab20").colors


def color(scheme: str) -> str | tuple[float, ...]:
    """The scheme's colour; unknown schemes get a stable colour from their name."""
    if scheme in SCHEME_COLORS:
        return SCHEME_COLORS[scheme]
    return _FALLBACK[sum(map(ord, scheme)) % len(_FALLBACK)]


def label(scheme: str) -> str:
    return SCHEME_LABELS.get(scheme, scheme)


def marker(scheme: str) -> str:
    return MARKERS.get(scheme, "o")


def scheme_order(schemes: Iterable[str]) -> list[str]:
    """Baselines in a fixed order first, Zen variants last, unknown names alphabetically in between."""
    known = list(SCHEME_COLORS)
    present = set(schemes)
    return [s for s in known if s in present] + sorted(present - set(known))


def _tmp(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp{os.getpid()}")


def write_text(path: str | Path, text: str) -> None:
    """Write then rename: an interrupted job never leaves a half-written output."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp(path)
    tmp.write_text(text)
    tmp.replace(path)


def write_csv(frame: pd.DataFrame, path: str | Path) -> None:
    write_text(path, frame.to_csv(index=False))


def write_json(obj: Any, path: str | Path) -> None:
    write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def save_figure(fig: plt.Figure, path: str | Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp(path)
    fig.savefig(tmp, dpi=130, bbox_inches="tight", format=path.suffix.lstrip(".") or "png")
    plt.close(fig)
    tmp.replace(path)


def read_jsonl(paths: Iterable[str | Path]) -> list[dict[str, Any]]:
    rows = []
    for p in paths:
        with open(p) as f:
            rows.extend(json.loads(line) for line in f if line.strip())
    return rows
