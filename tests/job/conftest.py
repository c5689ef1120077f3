"""Fixtures of the job tests."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from streamoffload.config import load_config
from streamoffload.streaming.job.offload_job import OffloadJob


@pytest.fixture
def running_job(spark: Any) -> Iterator[Callable[[Path], OffloadJob]]:
    """Start ``OffloadJob.run_forever`` on a config file in a thread; stopped after the test. Policy
    edits are picked up within about a second (not the default ~15 s)."""
    jobs: list[tuple[OffloadJob, threading.Thread]] = []

    def start(config_path: Path) -> OffloadJob:
        job = OffloadJob(load_config(config_path), str(config_path))
        job.policies._min_interval_s = 0.0
        job.policy_refresh_s, job.policy_clock_skew_ms = 1.0, 200  # policy edits in force within ~1 s
        thread = threading.Thread(target=job.run_forever, args=(spark,), daemon=True)
        thread.start()
        jobs.append((job, thread))
        return job

    yield start
    for job, thread in jobs:
        job.stop()
        thread.join(60)
