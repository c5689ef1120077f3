"""The soak's samples as one PNG: a panel per series, the warm-up shaded, the window's fitted trend drawn, and the
lag per sample window against its bound. Needs matplotlib (``pip install -e '.[bench]'``); without it
``plot_samples`` returns a note instead of a path."""

from __future__ import annotations

import math
from pathlib import Path

from bench.soak_stats import Series, SeriesStats

Row = dict[str, float | None]


def plot_samples(
    rows: list[Row],
    series: list[Series],
    stats: dict[str, SeriesStats],
    *,
    warmup_s: float,
    lag_bound_s: float,
    title: str,
    path: Path,
) -> str:
    """Write the PNG; return its path, or why there is none."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # no display here: render to the file only
        import matplotlib.pyplot as plt
    except ImportError:
        return "no plot: matplotlib is not installed (pip install -e '.[bench]')"
    panels = [s for s in series if any(r.get(s.column) is not None for r in rows)]
    panels.append(Series("lag_p99_s", f"lag p99 per sample window (s), bound {lag_bound_s:g}", flat=False))
    columns = 3
    lines = math.ceil(len(panels) / columns)
    fig, axes = plt.subplots(lines, columns, figsize=(13, 2.3 * lines), sharex=True, squeeze=False)
    for ax, s in zip(axes.flat, panels, strict=False):
        points = [(r["t_s"] / 60, r[s.column]) for r in rows if r.get(s.column) is not None and r["t_s"] is not None]
        ax.plot([p[0] for p in points], [p[1] for p in points], lw=1, color="tab:blue")
        ax.axvspan(0, warmup_s / 60, color="0.9")
        fitted = stats.get(s.column)
        if fitted is not None and fitted.series.flat:
            ax.axhspan(fitted.mean * 0.9, fitted.mean * 1.1, color="tab:green", alpha=0.1)
            color = "tab:green" if fitted.ok else "tab:red"
            ax.axhline(fitted.mean, color=color, lw=0.8, ls="--")
        if s.column == "lag_p99_s":
            ax.axhline(lag_bound_s, color="tab:red", lw=0.8, ls="--")
        ax.set_title(s.label, fontsize=9)
        ax.tick_params(labelsize=8)
        ax.set_ylim(bottom=0)
    for ax in list(axes.flat)[len(panels) :]:
        ax.set_visible(False)
    for ax in axes[-1]:
        ax.set_xlabel("minutes", fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=72)
    plt.close(fig)
    return str(path)
