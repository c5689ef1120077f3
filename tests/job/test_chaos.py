"""The short chaos run: 3 SIGKILLs of the continuous job under steady traffic (bench/chaos.py), with an
offline and a live policy edit and a checkpoint deletion among them; nothing may be lost, doubled or
reordered (bench/chaos.py's checker itself: tests/job/test_chaos_checker.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench.chaos import run_chaos

pytestmark = [pytest.mark.slow, pytest.mark.broker, pytest.mark.spark]


def test_three_sigkills_with_policy_edits_and_a_checkpoint_deletion_lose_and_double_nothing(
    pulsar_broker: Any, tmp_path: Path
) -> None:
    lines: list[str] = []
    report = run_chaos(
        tmp_path / "chaos",
        # 3 kills still place the offline edit, the checkpoint deletion and the live edit in different runs;
        # bench/chaos.py --kills 20 is the long run.
        kills=3,
        seed=7,
        rate=50.0,  # a small backlog per restart: the first micro-batch after one is the slow part
        service_url=pulsar_broker.service_url,
        min_delay=0.0,
        max_delay=1.0,
        # Generous bounds: Spark's start-up alone takes 15 s on a quiet machine and over a minute on a loaded one.
        startup_timeout=240.0,
        converge_timeout=300.0,
        log=lines.append,
    )
    summary = "\n".join(lines) + "\n" + report.render()
    print(summary)  # shown with -s or -rA: the kill moments, events and counts
    assert report.kills == 3, summary
    events = " ".join(report.events)
    assert "kill" in events and "policy edit" in events and "checkpoint deleted" in events, summary
    assert "live policy edit to" in events, summary
    assert report.published > 500, summary
    assert report.converged, summary
    assert report.missing == 0, summary
    assert report.duplicated == 0, summary
    assert report.corrupt == 0, summary
    assert report.out_of_order == 0, summary  # each topic-partition's messages in the order published
    assert report.kills_survived == 3, summary
    assert report.cleanup_removed is not None, summary  # cleanup ran and succeeded
    assert report.orphans_after_cleanup == 0 and report.cleanup_dropped_segments == 0, summary
    assert report.ok, summary
