"""Helpers shared by the pipeline's scripts: one colour per scheme, figure and frame saving (atomic, through
harness.provenance).

Scripts run as `python workflow/scripts/<name>.py` (this folder is then on sys.path), never through
Snakemake's `script:`, so they import the installed `zen` package like any other program.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from harness.provenance import atomic_file, write_atomic  # noqa: E402
from zen.registry import SCHEMES  # noqa: E402

# Series that are not schemes (a scheme's colour, label and marker are attributes of its class, zen.registry).
SERIES = {  # name: (colour, label, marker)
    "zen-bp-noindex": ("#fdae6b", "BP w/o index", "o"),
    "ddp": ("#7f7f7f", "DDP allreduce", "s"),
    "none": ("#bcbd22", "no comm", "o"),
    "sparcml-auto": ("#98df8a", "SparCML (its split variants)", "v"),  # simulator.paper.BASELINE_PATHS
    "zen-bp-coo": ("#fdd0a2", "BP pulling COO", "o"),  # simulator.paper.BASELINE_PATHS: Fig 17b's breakdown
}
_FALLBACK = plt.get_cmap("tab20").colors


def _scheme(name: str) -> Any:
    try:
        return SCHEMES.get(name)
    except ValueError:
        return None


def color(scheme: str) -> str | tuple[float, ...]:
    """The scheme's colour, its class's `color`: one per scheme in every figure, Zen's schemes in reds, oranges
    and pinks, AllReduce grey, the baselines in cool hues. Unknown names get a stable colour from their name."""
    if (cls := _scheme(scheme)) is not None:
        return cls.color
    if scheme in SERIES:
        return SERIES[scheme][0]
    return _FALLBACK[sum(map(ord, scheme)) % len(_FALLBACK)]


def label(scheme: str) -> str:
    if (cls := _scheme(scheme)) is not None:
        return cls.label
    return SERIES[scheme][1] if scheme in SERIES else scheme


def marker(scheme: str) -> str:
    if (cls := _scheme(scheme)) is not None:
        return cls.marker
    return SERIES[scheme][2] if scheme in SERIES else "o"


def pull_note(scheme: str) -> str:
    """How a scheme's pull is shown beside the pull encodings (its class's `pulls`), or ""."""
    cls = _scheme(scheme)
    return f" ({cls.pulls})" if cls is not None and hasattr(cls, "pulls") else ""


def scheme_order(schemes: Iterable[str]) -> list[str]:
    """Dense AllReduce first, the other registered baselines, then Zen's schemes, other series last."""
    present = set(schemes)
    registered = [s for s in SCHEMES.names() if s in present]
    ranked = sorted(registered, key=lambda s: (s != "allreduce", s.startswith("zen"), s))
    return ranked + sorted(present - set(registered))


def write_frame(frame: pd.DataFrame, path: str | Path) -> None:
    """A frame as CSV, written atomically (harness.provenance)."""
    write_atomic(path, frame.to_csv(index=False))


def save_figure(fig: plt.Figure, path: str | Path) -> None:
    path = Path(path)
    with atomic_file(path) as tmp:
        fig.savefig(tmp, dpi=130, bbox_inches="tight", format=path.suffix.lstrip(".") or "png")
    plt.close(fig)


def read_jsonl(paths: Iterable[str | Path]) -> list[dict[str, Any]]:
    rows = []
    for p in paths:
        with open(p) as f:
            rows.extend(json.loads(line) for line in f if line.strip())
    return rows
