"""The short chaos run: 8 mixed faults under steady traffic (bench/chaos.py), every kind a filesystem store
allows once: job SIGKILLs (after progress, during start-up, inside a segment commit), a broker
SIGKILL and restart on its data, a full disk, a checkpoint deletion, policy edits while running and while
stopped. Nothing may be lost, doubled or reordered; ``verify --crc`` is clean and cleanup leaves no orphan
(bench/chaos.py's checker itself: tests/bench/test_chaos_checker.py). ``bench/chaos.py --faults 100`` is the
long run."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.chaos import ChaosSettings, run_chaos
from bench.chaos_faults import kinds_for

pytestmark = [pytest.mark.slow, pytest.mark.broker, pytest.mark.spark]

FAULTS = len(kinds_for("fs"))
"""Every kind once, in a seeded order: the suite's longest test (120-220 s at 10 faults); more of each is the
bench's (``bench/chaos.py --faults 100``)."""


def test_eight_mixed_faults_lose_double_and_reorder_nothing(tmp_path: Path) -> None:
    lines: list[str] = []
    settings = ChaosSettings(
        faults=FAULTS,
        # A plan with only two faults that wait for progress (job-kill, job-kill-commit): three Spark start-ups.
        seed=5,
        rate=50.0,  # a small backlog per restart: the first micro-batch after one is the slow part
        min_delay=0.0,
        max_delay=0.5,
        # Generous bounds: Spark's start-up alone takes 15 s on a quiet machine and over a minute on a loaded one.
        startup_timeout=240.0,
        converge_timeout=300.0,
        # Kills after progress wait for it; the other faults may land while the job starts or recovers, so ten
        # fit in a few Spark start-ups.
        overlap=True,
    )
    report = run_chaos(tmp_path / "chaos", settings, log=lines.append)  # with its own broker, to kill it
    summary = "\n".join(lines) + "\n" + report.render()
    print(summary)  # shown with -s or -rA: the faults, moments and counts
    assert report.injected == FAULTS, summary
    assert set(report.faults) == set(kinds_for("fs")), summary  # every kind at least once
    assert report.published > 500, summary
    assert report.converged, summary
    assert report.missing == 0, summary
    assert report.duplicated == 0, summary
    assert report.corrupt == 0, summary
    assert report.out_of_order == 0, summary  # each topic-partition's messages in the order published
    assert report.survived == FAULTS, summary  # every fault ridden out: no run of the job stopped on its own
    assert not report.job_exits, summary
    assert report.verify_ran and report.verify_error is None, summary
    assert report.cleanup_removed is not None, summary  # cleanup ran and succeeded
    assert report.orphans_after_cleanup == 0 and report.cleanup_dropped_segments == 0, summary
    assert report.cleanup_damage == [], summary  # every committed segment's objects there and reading back
    assert report.ok, summary
