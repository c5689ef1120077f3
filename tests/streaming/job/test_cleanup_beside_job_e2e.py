"""``streamoffload cleanup`` beside a running job sealing small segments under traffic (issue 52, defect 2): a
grace too short for the job is refused, one that is long enough changes nothing, and once the job has stopped
``--grace-minutes 0`` leaves every acknowledged message readable exactly once."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from streamoffload.checkpoints.lease import WriterLease
from streamoffload.checkpoints.metadata_store import MetadataStore
from streamoffload.cli import main
from streamoffload.config import load_config
from streamoffload.produce import produce
from streamoffload.streaming.job.offload_job import OffloadJob
from tests.fixtures.broker import unique_topic
from tests.fixtures.job import SMALL_SEGMENTS, fs_store, poll, write_config
from tests.fixtures.readback import referenced_keys, store_keys
from tests.streaming.job.test_store_truth_e2e import published, stored

pytestmark = [pytest.mark.spark, pytest.mark.broker, pytest.mark.slow]

ROUNDS = 2
PER_ROUND = 40


def test_cleanup_beside_a_running_job_refuses_a_short_grace_and_loses_nothing(
    running_job: Callable[[Path], OffloadJob], pulsar_broker: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    topic = unique_topic("tidied")
    policy = SMALL_SEGMENTS.replace(
        "maxOffloadSegmentRolloverTimeMinutes = 10", "maxOffloadSegmentRolloverTimeSeconds = 1"
    )
    config_path = write_config(tmp_path, pulsar_broker.service_url, [topic], fs_store(tmp_path), policy)
    scoped = load_config(config_path).store.location.open()
    meta = MetadataStore(scoped)
    lease = WriterLease(scoped, "reader")
    job = running_job(config_path)
    poll(lambda: (held := lease.current()) is not None and held.holder == job.instance, what="the job's lease")

    def cleanup(grace: str) -> int:
        return main(["cleanup", "--conf", str(config_path), "--grace-minutes", grace])

    def offloaded() -> int:
        return sum(m.entries for m in meta.offloaded_segments(topic))

    codes: list[tuple[int, int]] = []
    for done in range(1, ROUNDS + 1):
        produce(pulsar_broker.service_url, topic, count=PER_ROUND, payload_size=100, batching=False)
        codes.append((cleanup("0"), cleanup("10")))
        poll(lambda: offloaded() == done * PER_ROUND, what=f"round {done} offloaded")  # noqa: B023
        codes.append((cleanup("0"), cleanup("10")))
    assert codes == [(1, 0)] * (2 * ROUNDS)
    refusals = [line for line in capsys.readouterr().err.splitlines() if "refused" in line]
    assert len(refusals) == 2 * ROUNDS and all(job.instance in line for line in refusals), refusals
    assert stored(scoped.store, topic) == published(topic, *[PER_ROUND] * ROUNDS, size=100)

    job.stop()
    poll(lambda: (held := lease.current()) is not None and held.ttl_ms == 0, what="the job's lease released")
    assert cleanup("0") == 0
    assert stored(scoped.store, topic) == published(topic, *[PER_ROUND] * ROUNDS, size=100)
    data = {k for k in store_keys(scoped.store) if not any(part.startswith("_") for part in k.split("/"))}
    assert data == referenced_keys(scoped, [topic])
