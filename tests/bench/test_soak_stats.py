"""What "flat" means for the soak's series (bench/soak_stats.py): a band around the mean, or for a count of work in
flight a cap, and in both cases no upward trend."""

from __future__ import annotations

from bench.soak_stats import Series, series_stats

MINUTES = [t * 10.0 for t in range(60)]


def test_a_count_in_flight_may_swing_under_its_cap_but_not_exceed_it_or_climb() -> None:
    series = Series("loose_objects", "objects outside Offloaded segments", cap=600)
    swinging = [(t, 450.0 if i % 2 else 80.0) for i, t in enumerate(MINUTES)]
    stats = series_stats(series, swinging, 100)
    assert stats is not None and stats.ok
    over = [*swinging[:-1], (MINUTES[-1], 601.0)]
    stats = series_stats(series, over, 100)
    assert stats is not None and not stats.band_ok
    climbing = [(t, 80.0 + 5 * i) for i, t in enumerate(MINUTES)]
    stats = series_stats(series, climbing, 100)
    assert stats is not None and stats.band_ok and not stats.trend_ok


def test_without_a_cap_the_same_swing_is_out_of_the_band() -> None:
    series = Series("driver_rss_mib", "driver RSS (MiB)")
    swinging = [(t, 450.0 if i % 2 else 80.0) for i, t in enumerate(MINUTES)]
    stats = series_stats(series, swinging, 100)
    assert stats is not None and not stats.band_ok and stats.trend_ok
