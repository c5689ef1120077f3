"""Fixtures of the job tests."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from streamoffload.config import load_config
from streamoffload.streaming.job.offload_job import OffloadJob


def write_job_config(
    directory: Path,
    service_url: str,
    *,
    topics: Sequence[str] = (),
    pulsar: str = "",
    max_message_size: int = 4096,
    block_bytes: int = 8192,
    segment_mb: float = 0.03,
    name: str = "offload.toml",
) -> Path:
    """A job configuration for a test, at ``directory/name``: the broker, ``topics`` and any other ``[pulsar]``
    lines (``pulsar``: e.g. ``topics_pattern`` or ``retain_subscription``), a filesystem store and the checkpoint
    under ``directory``, no metrics endpoint, a 1 s trigger, and small segments (``block_bytes`` blocks, sealed at
    ``segment_mb`` or after 10 minutes). ``max_message_size`` must fit in a block (``streamoffload.limits``)."""
    pulsar_lines = [f"service_url = {json.dumps(service_url)}"]
    if topics:
        pulsar_lines.append(f"topics = {json.dumps(list(topics))}")
    if pulsar:
        pulsar_lines.append(pulsar.strip())
    pulsar_lines.append(f"max_message_size = {max_message_size}")
    path = directory / name
    path.write_text(
        "[pulsar]\n"
        + "\n".join(pulsar_lines)
        + f"""

[store]
root = {json.dumps(str(directory / "store"))}

[spark]
checkpoint = {json.dumps(str(directory / "checkpoint"))}
trigger_interval = "1 second"

[metrics]
address = ""

[offload]
managedLedgerOffloadMaxBlockSizeInBytes = {block_bytes}
maxSizePerOffloadSegmentMbytes = {segment_mb}
maxOffloadSegmentRolloverTimeMinutes = 10
"""
    )
    return path


class _JobThread(threading.Thread):
    """``job.run_forever`` in a thread that keeps what it raised, for the test's teardown to raise again."""

    def __init__(self, job: OffloadJob, spark: Any) -> None:
        super().__init__(name=f"running-job-{job.instance}", daemon=True)
        self.job, self.spark = job, spark
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.job.run_forever(self.spark)
        except BaseException as err:  # raised again at teardown: a job that died is the test's failure
            self.error = err


@pytest.fixture
def running_job(spark: Any) -> Iterator[Callable[[Path], OffloadJob]]:
    """Start ``OffloadJob.run_forever`` on a config file in a thread; stopped after the test, which then fails
    with what the job raised, if anything (or if it did not stop). Policy edits are picked up within about a
    second (not the default ~15 s)."""
    threads: list[_JobThread] = []

    def start(config_path: Path) -> OffloadJob:
        job = OffloadJob(load_config(config_path), str(config_path))
        job.policies._min_interval_s = 0.0
        job.policy_refresh_s, job.policy_clock_skew_ms = 1.0, 200  # policy edits in force within ~1 s
        thread = _JobThread(job, spark)
        thread.start()
        threads.append(thread)
        return job

    yield start
    for thread in threads:
        thread.job.stop()
    for thread in threads:
        thread.join(120)
    for thread in threads:
        if thread.error is not None:
            raise AssertionError(f"the running job {thread.job.instance} failed: {thread.error!r}") from thread.error
        if thread.is_alive():
            raise AssertionError(f"the running job {thread.job.instance} did not stop within 120 s of stop()")
