"""The soak's 2-minute version (bench/soak.py; the hour is the bench's): steady mixed traffic (batched, unbatched,
LZ4, ZSTD) through the job's start-up and 60 s beyond its first offloads. The continuous job keeps every message
exactly once, keeps its lag bounded, and its long-lived processes and the store's loose objects do not grow
without bound.

60 s on 2 shared cores cannot show a slow leak, so the bounds here are loose: they catch runaway growth, not the
hour's ±10% (bench/README.md "Issue 23: soak")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench.soak import run_soak

pytestmark = [pytest.mark.slow, pytest.mark.broker, pytest.mark.spark]

MINUTES = 1.0  # after the job's first offloads: with its start-up, convergence and the read-back ~115 s in all
SAMPLE_S = 4.0  # 11 samples after the warm-up; its first and last thirds 24 s apart, as 5 s over 75 s gave 25 s
PARTITIONS = 10
WARMUP_S = 15.0
ROLLOVER_S = 5.0


def _after_warmup(rows: list[dict[str, float | None]], column: str) -> list[float]:
    return [float(v) for r in rows if (v := r.get(column)) is not None and float(r["t_s"] or 0) >= WARMUP_S]


def test_two_minutes_of_mixed_traffic_stay_exact_bounded_and_flat(pulsar_broker: Any, tmp_path: Path) -> None:
    lines: list[str] = []
    report = run_soak(
        tmp_path / "soak",
        minutes=MINUTES,
        rate=300.0,
        partitions=PARTITIONS,
        rollover_s=ROLLOVER_S,
        sample_s=SAMPLE_S,
        gc_every_s=20.0,
        warmup_s=WARMUP_S,
        service_url=pulsar_broker.service_url,
        startup_timeout=180.0,
        converge_timeout=60.0,
        log=lines.append,
    )
    summary = "\n".join(lines) + "\n" + report.render()
    print(summary)  # shown with -s or -rA
    criteria = report.criteria()

    # Exactly once, and the job ran the whole time.
    assert report.job_exit is None and report.converged, summary
    assert report.total("published") > 10_000, summary
    assert report.acked_rate is not None and report.acked_rate >= 0.8 * 300.0, summary  # the traffic kept up
    assert criteria["every message in the store exactly once"][0], summary

    # Lag: the hour's bound is rollover + 2 s at p99 (on a calm machine the job's p99 is about rollover + 1 s:
    # bench/README.md issue 22). A loaded 2-core machine's slower micro-batches get room here; a job that does not
    # seal by the rollover, or stops sealing, fails it (stopping altogether fails the convergence above).
    assert report.lag_p99_after_warmup is not None, summary
    assert report.lag_p99_after_warmup <= ROLLOVER_S + 25.0, summary

    # No runaway growth after the warm-up. Spark's cached thread pools (and the fds of their work) swing by tens
    # within a minute, which raises peaks, and grow until the micro-batches settle, which on a loaded machine (a
    # second test file on the other worker) is after the warm-up; a leak raises the floor to the end. So the
    # lowest count of the window's last third must not be above the highest of its middle third by more than
    # the slack. That catches a leak of about 4 a second or more (one per task: tens of tasks a second here), not
    # one per sealed segment (2 a second) or per micro-batch (1 a second): a slow leak is the hour's to show
    # (bench/soak.py). Seen at load: threads 177, 233, 259, 306, 322, 328, 329, 328, 328, 330, 331 (flat from the
    # middle third on). Over 10 minutes the threads settle at 130-200 and swing by up to 70 within a minute.
    for column, slack in (("fds", 30), ("threads", 60)):
        values = _after_warmup(report.rows, column)
        assert len(values) >= 9, summary  # a sample every 4 s for the 45 s after the warm-up
        third = len(values) // 3
        middle = values[third : 2 * third]
        assert min(values[-third:]) <= max(middle) + slack, f"{column} grew: {values}\n{summary}"
    # Per topic-partition one open segment (its manifest, its blocks' checksum records so far, its upload) plus
    # a few: not one per sealed segment (about 200 here) or per micro-batch. A sample taken inside a commit may
    # see one micro-batch's new objects at once (seen: 2, ..., 2, 72, 2, ...): the second-highest sample is judged.
    for column in ("loose_objects", "open_uploads"):
        values = _after_warmup(report.rows, column)
        assert sorted(values)[-2] <= 5 * PARTITIONS + 20, f"{column}: {values}\n{summary}"
    # The JVM's live set after a full collection (a forced one every 20 s): not doubling within the minute.
    old = _after_warmup(report.rows, "jvm_old_after_gc_mib")
    assert old and max(old) <= 2 * min(old) + 50, f"old gen after GC: {old}\n{summary}"
