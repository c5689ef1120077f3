"""The soak's series and what "flat" means for them (bench/soak.py).

Each series is judged on the samples after the warm-up (the first sixth of the run: 10 minutes of an hour):

- **band**: every sample within ±10% of the series' mean over that window. A count whose natural jitter is
  tens of units (an open segment per topic-partition, with its manifest and checksum records so far, comes and
  goes around each seal) is given an absolute tolerance ``floor`` instead when that is larger;
- **trend**: the least-squares line through the window rises by at most 10% of the mean (of the floor, where
  that is larger) across the window: no upward trend over the last 50 minutes of an hour. The slope is printed
  as % of the mean per sixth of the run (per 10 minutes of an hour).

A count of work in flight (the objects outside Offloaded segments) has a ``cap`` instead of a band: every sample
at most what the work in flight can account for. A series that is not ``flat`` (the store's object count, which
grows with the segments) is shown, not judged.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

TOLERANCE = 0.10


@dataclass(frozen=True)
class Series:
    column: str
    label: str
    flat: bool = True
    """Held to the band and trend criteria; else shown only."""
    floor: float = 0.0
    """An absolute band tolerance, for counts whose jitter is a few units."""
    cap: float | None = None
    """Instead of the band: every sample at most this (a count of work in flight, which swings by design)."""


def resource_series(partitions: int) -> list[Series]:
    """The sampled series, in the table's and the plot's order."""
    return [
        Series("driver_rss_mib", "driver RSS (MiB)"),
        Series("jvm_rss_mib", "JVM RSS (MiB)"),
        Series("jvm_old_after_gc_mib", "JVM old gen after full GC (MiB)"),
        Series("jvm_metaspace_mib", "JVM metaspace (MiB)"),
        Series("jvm_heap_committed_mib", "JVM heap committed after full GC (MiB)", flat=False),
        Series("workers_pss_mib", "Python workers PSS, sum (MiB)"),
        Series("workers", "Python worker processes", flat=False),
        Series("fds", "open fds (driver + JVM)"),
        Series("worker_fds", "open fds (Python workers)", flat=False),
        # Spark's cached thread pools (the block manager's, the map output dispatcher...) start threads under load
        # and end them after 60 s idle, so the count swings by tens from minute to minute; a leak is a trend.
        Series("threads", "threads (driver + JVM)", floor=50),
        Series("store_objects", "objects in the store", flat=False),
        Series("offloaded_segments", "Offloaded segments", flat=False),
        # Per topic-partition an open segment's Assigned manifest, and while a seal is in flight that segment's
        # data object, index, checksum record(s) and commit, written before its manifest is rewritten Offloaded:
        # 1 to ~5 objects, so the count swings between ~1 and ~5 per topic-partition with the micro-batches (a
        # 10-minute soak: 71 to 480 over 100, mean 313) and a band around the mean says nothing. A leak shows as
        # a trend, or as more than the in-flight work accounts for (6 per topic-partition).
        Series("loose_objects", "objects outside Offloaded segments", cap=6 * partitions),
        Series("open_uploads", "open multipart uploads", floor=partitions),
    ]


@dataclass
class SeriesStats:
    series: Series
    samples: int
    mean: float
    low_pct: float
    """(min - mean) / mean, in %."""
    high_pct: float
    slope_pct: float
    """The fitted slope, % of the mean per ``slope_unit_s``."""
    rise_pct: float
    """The fitted line's change across the window, % of the mean."""
    band_ok: bool
    trend_ok: bool

    @property
    def ok(self) -> bool:
        return self.band_ok and self.trend_ok


def series_stats(series: Series, points: list[tuple[float, float]], slope_unit_s: float) -> SeriesStats | None:
    """``points``: (seconds, value) after the warm-up. None with fewer than 3 points."""
    if len(points) < 3:
        return None
    times = [t for t, _ in points]
    values = [v for _, v in points]
    mean = statistics.fmean(values)
    slope = statistics.linear_regression(times, values).slope if len(set(times)) > 1 else 0.0
    scale = 100 / mean if mean else 0.0
    tolerance = max(TOLERANCE * abs(mean), series.floor)
    rise = slope * (times[-1] - times[0])
    return SeriesStats(
        series=series,
        samples=len(points),
        mean=mean,
        low_pct=(min(values) - mean) * scale,
        high_pct=(max(values) - mean) * scale,
        slope_pct=slope * slope_unit_s * scale,
        rise_pct=rise * scale,
        band_ok=(all(abs(v - mean) <= tolerance for v in values) if series.cap is None else max(values) <= series.cap),
        trend_ok=rise <= TOLERANCE * max(abs(mean), series.floor),
    )


def render_stats(stats: list[SeriesStats], slope_unit: str) -> list[str]:
    width = max(len(s.series.label) for s in stats)
    lines = [f"  {'series':<{width}}  {'mean':>9}  {'min':>7}  {'max':>7}  {'slope ' + slope_unit:>16}  verdict"]
    for s in stats:
        verdict = "(shown only)"
        if s.series.flat:
            band = "band" if s.series.cap is None else f"max > {s.series.cap:g}"
            faults = [what for what, ok in ((band, s.band_ok), ("trend", s.trend_ok)) if not ok]
            verdict = "OK" if not faults else "FAILED: " + ", ".join(faults)
        lines.append(
            f"  {s.series.label:<{width}}  {s.mean:9.1f}  {s.low_pct:+6.1f}%  {s.high_pct:+6.1f}%  "
            f"{s.slope_pct:+15.1f}%  {verdict}"
        )
    return lines
