"""How the pipeline's figures are laid out: panels in rows of four, one legend above them, a line per scheme in
the shared order, colours and markers (workflow/scripts/common.py), rank counts on a log2 axis."""

from __future__ import annotations

from collections.abc import Callable

import matplotlib.pyplot as plt
import pandas as pd
from common import color, label, marker, scheme_order


def panels(n: int, width: float = 4.2, height: float = 3.4) -> tuple[plt.Figure, list[plt.Axes]]:
    cols = min(n, 4)
    rows = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False, layout="constrained")
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    return fig, list(axes.flat[:n])


def legend(fig: plt.Figure, axes: list[plt.Axes]) -> None:
    handles, labels = {}, {}
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(lab, h)
            labels.setdefault(lab, lab)
    ncol = min(len(handles), 8 if len(axes) > 2 else 5)
    fig.legend(list(handles.values()), list(labels), loc="outside upper center", ncol=ncol,
               frameon=False)


def scheme_lines(ax: plt.Axes, cell: pd.DataFrame, y: str,
                  style: Callable[[str], dict] | None = None, band: bool = False) -> None:
    """One line of `y` against world_size per scheme, in the shared scheme order, colours and markers;
    `style(scheme)` overrides the line's keyword arguments; `band` shades `{y}_lo`..`{y}_hi` (the spread)."""
    for scheme in scheme_order(cell["scheme"]):
        s = cell[cell["scheme"] == scheme].sort_values("world_size")
        kwargs = {"color": color(scheme), "label": label(scheme), **(style(scheme) if style else {})}
        ax.plot(s["world_size"], s[y], marker=marker(scheme), **kwargs)
        if band:
            ax.fill_between(s["world_size"], s[f"{y}_lo"], s[f"{y}_hi"], color=kwargs["color"], alpha=0.15, lw=0)


def log2_ranks(ax: plt.Axes, ranks: pd.Series) -> None:
    """Log2 x axis labelled with the plain rank counts."""
    ticks = sorted(set(int(n) for n in ranks))
    ax.set_xscale("log", base=2)
    ax.set_xticks(ticks, [str(t) for t in ticks])
    ax.minorticks_off()
