"""The store is the source of truth, end to end: publish with pulsar-client into the embedded broker, run
the offload job on local Spark, change what operators change (the checkpoint, the policy, a toggle, a
second instance), and read every message back from the store."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from streamoffload.checkpoints import manifest as mf
from streamoffload.checkpoints.lease import LeaseHeldError
from streamoffload.checkpoints.metadata_store import MetadataStore
from streamoffload.config import load_config
from streamoffload.produce import expected_payload, produce
from streamoffload.storage.location import ScopedStore
from streamoffload.streaming.governance.policy_versions import VersionsFile
from streamoffload.streaming.job.offload_job import OffloadJob
from tests.fixtures.broker import unique_topic
from tests.fixtures.job import SMALL_SEGMENTS, fs_store, poll
from tests.fixtures.job import write_config as _write_config
from tests.fixtures.readback import read_messages, referenced_keys, store_keys

pytestmark = [pytest.mark.spark, pytest.mark.broker]


def write_config(directory: Path, *args: Any) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    return _write_config(directory, *args)


def published(topic: str, *phases: int, size: int) -> list[bytes]:
    """Payloads of several ``produce`` calls in a row (each numbers its messages from 0)."""
    return [expected_payload(topic, seq, size) for count in phases for seq in range(count)]


def stored(store: Any, topic: str) -> list[bytes]:
    messages = read_messages(ScopedStore(store), topic)
    positions = [(m.ledger_id, m.entry_id, m.batch_index) for m in messages]
    assert positions == sorted(positions) and len(set(positions)) == len(positions), "in order, once each"
    return [m.payload for m in messages]


def test_a_new_or_lost_checkpoint_continues_from_the_store(spark: Any, pulsar_broker: Any, tmp_path: Path) -> None:
    topic = unique_topic("lost-checkpoint")
    produce(pulsar_broker.service_url, topic, count=120, payload_size=200, batching=True, batch_size=10)
    first = write_config(tmp_path / "a", pulsar_broker.service_url, [topic], fs_store(tmp_path))
    OffloadJob(load_config(first), str(first)).run_once(spark)

    # More traffic, then a run on a brand-new checkpoint that would start at the latest position on its
    # own: the store says where the topic continues, so nothing is skipped ...
    produce(pulsar_broker.service_url, topic, count=90, payload_size=200, batching=True, batch_size=10)
    second = write_config(tmp_path / "b", pulsar_broker.service_url, [topic], fs_store(tmp_path))
    second.write_text(second.read_text().replace("[pulsar]", '[pulsar]\nstarting_offsets = "latest"'))
    OffloadJob(load_config(second), str(second)).run_once(spark)
    store = load_config(second).store.location.open().store
    assert stored(store, topic) == published(topic, 120, 90, size=200)

    # ... and the first (now stale) checkpoint, starting at the earliest position, rewrites nothing.
    produce(pulsar_broker.service_url, topic, count=30, payload_size=200, batching=True, batch_size=10)
    OffloadJob(load_config(first), str(first)).run_once(spark)
    assert stored(store, topic) == published(topic, 120, 90, 30, size=200)

    # A broker that trimmed its log gives a new reader an earliest position inside what the store
    # already holds; a new checkpoint starting there (as startingOffsets says) must not overlap it.
    [segment, *_] = MetadataStore(ScopedStore(store)).offloaded_segments(topic)
    inside = {topic: [segment.startLedgerId, segment.startEntryId + 3]}
    third = write_config(tmp_path / "c", pulsar_broker.service_url, [topic], fs_store(tmp_path))
    third.write_text(third.read_text().replace("[pulsar]", f"[pulsar]\nstarting_offsets = '{json.dumps(inside)}'"))
    produce(pulsar_broker.service_url, topic, count=20, payload_size=200, batching=True, batch_size=10)
    OffloadJob(load_config(third), str(third)).run_once(spark)
    assert stored(store, topic) == published(topic, 120, 90, 30, 20, size=200)
    ordinals = [m.ordinal for m in MetadataStore(ScopedStore(store)).offloaded_segments(topic)]
    assert ordinals == list(range(len(ordinals)))


def test_a_policy_edit_between_a_crash_and_the_restart(spark: Any, pulsar_broker: Any, tmp_path: Path) -> None:
    topic = unique_topic("policy-edit")
    produce(pulsar_broker.service_url, topic, count=400, payload_size=150, batching=True, batch_size=10)
    config_path = write_config(tmp_path, pulsar_broker.service_url, [topic], fs_store(tmp_path))
    env = {**os.environ, "STREAMOFFLOAD_CRASH_DIR": str(tmp_path / "crash")}
    cmd = [sys.executable, "-m", "streamoffload", "run", "--once", "--conf", str(config_path)]
    crashed = subprocess.run(
        cmd, env={**env, "STREAMOFFLOAD_CRASH_AT": "after-part:2"}, start_new_session=True, capture_output=True
    )
    assert crashed.returncode == -9, crashed.stderr.decode()[-2000:]
    store = load_config(config_path).store.location.open().store
    before = {mf.manifest_uuid(m) for m in MetadataStore(ScopedStore(store)).offloaded_segments(topic)}
    # Other block and segment sizes: a replay under them would write different bytes into the same
    # objects. The restart recovers from the store instead and offloads under the new policy.
    config_path.write_text(config_path.read_text().replace("= 8192", "= 16384").replace("0.03", "0.05"))
    # The restart in this session's Spark (a process's start-up less; the CLI's recovery after a SIGKILL is
    # test_job_e2e's crash sweep): what it recovers and offloads comes from the store and the edited file.
    config = load_config(config_path)
    OffloadJob(config, str(config_path)).run_once(spark)
    store = config.store.location.open().store
    assert stored(store, topic) == published(topic, 400, size=150)
    meta = MetadataStore(ScopedStore(store))
    after = [m for m in meta.offloaded_segments(topic) if mf.manifest_uuid(m) not in before]
    assert after, "segments were offloaded after the restart"
    for segment in after:  # committed before the crash: the old policy; opened after: the new one
        assert '"managedLedgerOffloadMaxBlockSizeInBytes":16384' in str(mf.driver_property(segment, mf.PROP_POLICY))
    meta.cleanup(topic, grace_ms=0)
    assert {k for k in store_keys(store) if "/_" not in k and not k.startswith("_")} == referenced_keys(
        ScopedStore(store), [topic]
    )
    assert not list(store.pending_multiparts(""))


def test_a_second_instance_is_refused_while_the_first_runs(tmp_path: Path, pulsar_broker: Any) -> None:
    topic = unique_topic("two-instances")
    first = write_config(tmp_path / "one", pulsar_broker.service_url, [topic], fs_store(tmp_path))
    second = write_config(tmp_path / "two", pulsar_broker.service_url, [topic], fs_store(tmp_path))
    one = OffloadJob(load_config(first), str(first))
    one.begin_run()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "streamoffload", "run", "--once", "--conf", str(second)],
            capture_output=True,
            timeout=120,
        )
        lines = [line for line in proc.stderr.decode().splitlines() if "error" in line]
        assert proc.returncode != 0 and lines, proc.stderr.decode()[-2000:]
        assert one.instance in lines[-1] and "expires" in lines[-1], lines
        # The same instance (same host and checkpoint) restarting takes its lease over at once.
        again = OffloadJob(load_config(first), str(first))
        assert again.begin_run().epoch == one.run.epoch + 1  # type: ignore[union-attr]
        try:
            with pytest.raises(LeaseHeldError):
                OffloadJob(load_config(second), str(second)).begin_run()
        finally:
            again.end_run()
        # A clean stop lets the lease go: the other instance may start now.
        other = OffloadJob(load_config(second), str(second))
        assert other.begin_run().epoch == one.run.epoch + 2  # type: ignore[union-attr]
        other.end_run()
    finally:
        one.end_run()


def test_a_topic_disabled_while_traffic_continues_then_enabled_misses_nothing(
    running_job: Callable[[Path], OffloadJob], pulsar_broker: Any, tmp_path: Path
) -> None:
    topic, other = unique_topic("toggled"), unique_topic("steady")
    policy = SMALL_SEGMENTS.replace(
        "maxOffloadSegmentRolloverTimeMinutes = 10", "maxOffloadSegmentRolloverTimeSeconds = 2"
    )
    config_path = write_config(tmp_path, pulsar_broker.service_url, [topic, other], fs_store(tmp_path), policy)
    store = load_config(config_path).store.location.open().store
    meta = MetadataStore(ScopedStore(store))
    job = running_job(config_path)

    def offloaded(t: str) -> int:
        return sum(m.entries for m in meta.offloaded_segments(t))

    first = produce(pulsar_broker.service_url, [topic, other], count=50, payload_size=100, batching=False)
    paused_at = first.partitions[topic].last_message_id[:2]  # type: ignore[index]
    poll(lambda: offloaded(topic) == 50 and offloaded(other) == 50, what="the first 50 offloaded")

    config_path.write_text(config_path.read_text() + f'\n[topics."{topic}"]\nenabled = false\n')
    # The pause is in force from its version's effective time on (published + refresh + skew): what is
    # published before then may still be read. Wait until the versions the source reads say the topic is
    # paused (as the source decides it, a second ago already), then publish: it has nothing it may read.
    versions = VersionsFile(str(tmp_path / "checkpoint" / "policy-versions.json"))
    poll(lambda: not versions.enabled(topic, int(time.time() * 1000) - 1000), what="the pause in force")
    produce(pulsar_broker.service_url, [topic, other], count=60, payload_size=100, batching=False)
    # One more on the steady topic, published once all 60 of both were acknowledged: the micro-batch that
    # read it was planned after the paused topic's 60 were there to read.
    produce(pulsar_broker.service_url, other, count=1, payload_size=100, batching=False)
    poll(lambda: offloaded(other) == 111, what="the steady topic keeps going")
    # Every micro-batch planned so far, that one included, ends the paused topic at its 50th entry: the source
    # planned none of its 60 (a broken pause plans them, at the latest with the steady topic's last one).
    planned = [planned_position(p, topic) for p in job.query.recentProgress]
    assert planned[-1] == paused_at and max(planned) == paused_at, (planned, paused_at)
    assert offloaded(topic) == 50, "a paused topic is not read"
    assert stored(store, topic) == published(topic, 50, size=100)

    config_path.write_text(config_path.read_text().replace("enabled = false", "enabled = true"))
    produce(pulsar_broker.service_url, [topic, other], count=40, payload_size=100, batching=False)
    poll(lambda: offloaded(topic) == 150 and offloaded(other) == 151, what="everything after re-enabling")
    assert stored(store, topic) == published(topic, 50, 60, 40, size=100)
    assert stored(store, other) == published(other, 50, 60, 1, 40, size=100)


def planned_position(progress: dict[str, Any], topic: str) -> tuple[int, int]:
    """Where a micro-batch's plan ended ``topic`` (its source's end offset: ``{topic-partition: [ledger, entry]}``);
    (-1, -1) before its first entry."""
    ends = [s["endOffset"] for s in progress["sources"]]
    offsets = [json.loads(e) if isinstance(e, str) else e for e in ends]
    [position] = [o[topic] for o in offsets if isinstance(o, dict) and topic in o] or [[-1, -1]]
    return int(position[0]), int(position[1])
