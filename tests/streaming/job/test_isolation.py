"""One bad topic-partition does not stop the others (``streaming.governance.quarantine``), end to end: a topic whose
offload fails (here: data loss, the source was told to continue past what the broker holds, as after a
topic was deleted and re-created) fails Spark's micro-batch; the job sets it aside and every other topic is
offloaded, byte for byte."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from streamoffload.checkpoints.metadata_store import MetadataStore
from streamoffload.config import load_config
from streamoffload.errors import StreamOffloadError
from streamoffload.produce import produce
from streamoffload.status import store_status
from streamoffload.storage.location import ScopedStore
from streamoffload.streaming.governance import quarantine
from streamoffload.streaming.governance.quarantine import read_records
from streamoffload.streaming.job.offload_job import OffloadJob
from tests.fixtures.broker import unique_topic
from tests.fixtures.job import SMALL_SEGMENTS, fs_store, poll, write_config
from tests.streaming.job.test_store_truth_e2e import published, stored

pytestmark = [pytest.mark.spark, pytest.mark.broker]


def _config(tmp_path: Path, service_url: str, bad: str, good: str, policy: str = SMALL_SEGMENTS) -> Path:
    # The store knows nothing of the bad topic, so it starts where startingOffsets says: past its end.
    path = write_config(tmp_path, service_url, [bad, good], fs_store(tmp_path), policy)
    past_the_end = json.dumps({bad: [999_999, 0]})
    path.write_text(path.read_text().replace("[pulsar]", f"[pulsar]\nstarting_offsets = '{past_the_end}'"))
    return path


def test_run_once_offloads_the_other_topics_and_names_the_bad_one(
    spark: Any, pulsar_broker: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(quarantine, "FIRST_BACKOFF_MS", 600_000)  # set aside for the whole test
    bad, good = unique_topic("bad"), unique_topic("good")
    produce(pulsar_broker.service_url, good, count=80, payload_size=300, batching=True, batch_size=10)
    produce(pulsar_broker.service_url, bad, count=5, payload_size=100, batching=False)
    config_path = _config(tmp_path, pulsar_broker.service_url, bad, good)
    store = load_config(config_path).store.location.open().store

    with pytest.raises(StreamOffloadError) as failure:
        OffloadJob(load_config(config_path), str(config_path)).run_once(spark)
    message = str(failure.value)
    assert bad in message and "DataLossError" in message and good not in message
    assert "[streamoffload:" not in message.split(bad, 1)[1], "the marker is not shown to people"

    assert stored(store, good) == published(good, 80, size=300)
    assert not MetadataStore(ScopedStore(store)).offloaded_segments(bad)
    [record] = read_records(ScopedStore(store))
    assert record.topic == bad and record.quarantined and record.until_ms > time.time() * 1000
    rows = {s.topic: s for s in store_status(MetadataStore(ScopedStore(store)))}
    assert rows[bad].set_aside is not None and "entries were lost" in rows[bad].set_aside["reason"]

    # While it is set aside, a later run leaves it alone (no failure) and the others go on.
    produce(pulsar_broker.service_url, good, count=20, payload_size=300, batching=True, batch_size=10)
    OffloadJob(load_config(config_path), str(config_path)).run_once(spark)
    assert stored(store, good) == published(good, 80, 20, size=300)


def test_the_running_job_sets_a_failing_topic_aside_and_keeps_the_others_going(
    running_job: Callable[[Path], OffloadJob], pulsar_broker: Any, tmp_path: Path
) -> None:
    bad, good = unique_topic("bad-live"), unique_topic("good-live")
    policy = SMALL_SEGMENTS.replace(
        "maxOffloadSegmentRolloverTimeMinutes = 10", "maxOffloadSegmentRolloverTimeSeconds = 2"
    )
    config_path = _config(tmp_path, pulsar_broker.service_url, bad, good, policy)
    store = load_config(config_path).store.location.open().store
    meta = MetadataStore(ScopedStore(store))
    job = running_job(config_path)

    produce(pulsar_broker.service_url, bad, count=3, payload_size=100, batching=False)
    produce(pulsar_broker.service_url, good, count=50, payload_size=100, batching=False)
    poll(lambda: any(r.quarantined for r in read_records(ScopedStore(store))), what="the bad topic set aside")
    produce(pulsar_broker.service_url, good, count=30, payload_size=100, batching=False)
    poll(
        lambda: sum(m.entries for m in meta.offloaded_segments(good)) == 80,
        what="the good topic offloaded while the bad one is set aside",
    )
    assert stored(store, good) == published(good, 50, 30, size=100)
    assert job.run is not None, "the job is still running"
