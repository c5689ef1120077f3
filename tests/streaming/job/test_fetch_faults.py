"""The window between the source's read and the sink's fetch: the query carries positions, sizes and
CRC-32Cs; the sink reads the bytes from the broker again. Whatever the second read returns that the
first did not (a changed byte, another size, a missing entry), nothing wrong is committed, the topic is
named, and the next run offloads everything exactly. A broker restart between the two reads is only a
reconnect for the fetch.

The faults are injected into the fetch (``streaming.runtime.faults.FETCH_FAULT``): pulsar-lite's entries cannot
be changed in place, and it has no retention trim; ``drop`` is what a trimmed ledger looks like to the
sink (the entry is not delivered).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from streamoffload.checkpoints import manifest as mf
from streamoffload.checkpoints.metadata_store import MetadataStore
from streamoffload.config import load_config
from streamoffload.produce import expected_payload, produce
from streamoffload.storage.location import ScopedStore
from streamoffload.streaming.governance.quarantine import Quarantine
from streamoffload.streaming.job.offload_job import OffloadJob
from streamoffload.streaming.runtime.faults import FETCH_FAULT
from tests.fixtures.broker import unique_topic
from tests.fixtures.job import check_messages, fs_store, poll, write_config
from tests.fixtures.readback import read_messages

pytestmark = [pytest.mark.spark, pytest.mark.broker]

COUNT, SIZE, KEYS = 200, 150, 5


def without_spool(config_path: Path) -> Path:
    """The sink reads every entry from the broker again (the path under test), not from the spool."""
    config_path.write_text(config_path.read_text().replace("[spark]\n", "[spark]\nspool = false\n"))
    return config_path


def publish(service_url: str, topic: str) -> None:
    produce(service_url, topic, count=COUNT, payload_size=SIZE, keys=KEYS, batching=True, batch_size=10)


def run_once(config_path: Path, env: dict[str, str]) -> subprocess.CompletedProcess[bytes]:
    cmd = [sys.executable, "-m", "streamoffload", "run", "--once", "--conf", str(config_path)]
    return subprocess.run(cmd, env=env, start_new_session=True, capture_output=True, timeout=300)


def committed_prefix_is_exact(store: Any, topic: str) -> int:
    """Whatever is committed for ``topic`` is its first messages, exact and in order; returns how many."""
    got = read_messages(ScopedStore(store), topic)
    for seq, message in enumerate(got):
        assert message.payload == expected_payload(topic, seq, SIZE), (topic, seq)
    return len(got)


def test_a_changed_resized_or_missing_entry_commits_nothing_wrong_then_the_next_run_is_exact(
    spark: Any, pulsar_broker: Any, tmp_path: Path
) -> None:
    faults = {
        "flip": unique_topic("fetch-flip"),
        "resize": unique_topic("fetch-resize"),
        "drop": unique_topic("fetch-drop"),
    }
    clean = unique_topic("fetch-clean")
    topics = [*faults.values(), clean]
    for topic in topics:
        produce(
            pulsar_broker.service_url, topic, count=COUNT, payload_size=SIZE, keys=KEYS, batching=True, batch_size=10
        )
    config_path = without_spool(write_config(tmp_path, pulsar_broker.service_url, topics, fs_store(tmp_path)))
    spec = ",".join(f"{kind}={topic.rsplit('/', 1)[1]}" for kind, topic in faults.items())
    env = {**os.environ, FETCH_FAULT: spec, "STREAMOFFLOAD_CRASH_DIR": str(tmp_path / "faults")}

    proc = run_once(config_path, env)
    err = proc.stderr.decode()
    assert proc.returncode != 0, err[-3000:]
    for topic in faults.values():
        assert topic in err, err[-3000:]  # each failed topic is named
    assert "CRC-32C" in err and "bytes, but the source read" in err and "is gone from" in err, err[-3000:]

    store = load_config(config_path).store.location.open().store
    check_messages(ScopedStore(store), clean, COUNT, keys=KEYS, size=SIZE)  # the other topics went on
    for topic in faults.values():
        assert committed_prefix_is_exact(store, topic) < COUNT  # the faulted part was not committed

    # The set-aside topics' backoff ends (an operator's wait, shortened), and the next run is exact.
    quarantine = Quarantine(ScopedStore(store))
    assert set(quarantine.load()) == set(faults.values())
    quarantine.clear(faults.values())
    # The next run in this session's Spark (no fault armed in it; no start-up of its own).
    OffloadJob(load_config(config_path), str(config_path)).run_once(spark)
    meta = MetadataStore(ScopedStore(store))
    for topic in topics:
        check_messages(ScopedStore(store), topic, COUNT, keys=KEYS, size=SIZE)
        assert all(m.status == mf.OFFLOADED for m in meta.manifests(topic))

    # Nothing new now: `run --once` says so without starting Spark.
    proc = run_once(config_path, {**os.environ})
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    assert "nothing new to offload" in proc.stderr.decode()


def test_a_broker_restart_between_the_two_reads_is_a_reconnect(make_broker: Any, tmp_path: Path) -> None:
    broker = make_broker()
    topic = unique_topic("fetch-restart")
    publish(broker.service_url, topic)
    config_path = without_spool(write_config(tmp_path, broker.service_url, [topic], fs_store(tmp_path)))
    fault_dir = tmp_path / "faults"
    env = {**os.environ, FETCH_FAULT: f"pause={topic.rsplit('/', 1)[1]}", "STREAMOFFLOAD_CRASH_DIR": str(fault_dir)}
    result: dict[str, subprocess.CompletedProcess[bytes]] = {}
    job = threading.Thread(target=lambda: result.setdefault("proc", run_once(config_path, env)))
    job.start()
    # The sink has the positions and waits before its fetch: the broker restarts under it.
    poll(lambda: any(fault_dir.glob("fetch-pause-*")), timeout=240, what="the sink's first fetch")
    broker.restart()
    (fault_dir / "resume").write_text("")
    job.join(300)
    proc = result["proc"]
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    check_messages(load_config(config_path).store.location.open(), topic, COUNT, keys=KEYS, size=SIZE)


def test_the_retain_subscription_is_acknowledged_up_to_the_last_commit(
    spark: Any, pulsar_broker: Any, tmp_path: Path
) -> None:
    """``pulsar.retain_subscription``: a durable subscription acknowledged after each commit, so the broker's
    retention keeps what the store does not have yet. A consumer on it starts right after the offloaded
    entries."""
    import pulsar

    topic = unique_topic("retain")
    publish(pulsar_broker.service_url, topic)
    config_path = write_config(tmp_path, pulsar_broker.service_url, [topic], fs_store(tmp_path))
    text = config_path.read_text().replace("[pulsar]\n", '[pulsar]\nretain_subscription = "streamoffload-retain"\n')
    config_path.write_text(text)
    config = load_config(config_path)
    assert config.pulsar.retain_subscription == "streamoffload-retain"
    OffloadJob(config, str(config_path)).run_once(spark)
    check_messages(config.store.location.open(), topic, COUNT, keys=KEYS, size=SIZE)

    job = OffloadJob(config, str(config_path))
    job.begin_run()
    try:
        assert job.nothing_new(job.broker_latest())  # `run --once` would skip Spark
    finally:
        job.end_run()
    produce(pulsar_broker.service_url, topic, count=1, payload_size=7, batching=False)  # after the offloaded ones
    job.begin_run()
    try:
        assert not job.nothing_new(job.broker_latest())  # one new entry: a run must read it
    finally:
        job.end_run()
    client = pulsar.Client(pulsar_broker.service_url)
    try:
        consumer = client.subscribe(topic, "streamoffload-retain", consumer_type=pulsar.ConsumerType.Failover)
        message = consumer.receive(timeout_millis=10_000)
        assert len(message.data()) == 7, "the subscription should start after the last committed entry"
        consumer.close()
    finally:
        client.close()


@pytest.mark.slow
def test_two_executor_jvms_offload_exactly_when_the_sink_reads_from_the_broker(
    pulsar_broker: Any, tmp_path: Path
) -> None:
    """Spark's ``local-cluster`` master: two executor JVMs, each with its own Python workers, as on a real
    cluster. A part's sink task may run on another executor than the source task that read its entries,
    so without the spool every entry is fetched from the broker again; the store ends up exact."""
    topics = [unique_topic("cluster-a"), unique_topic("cluster-b")]
    for topic in topics:
        publish(pulsar_broker.service_url, topic)
    config_path = without_spool(write_config(tmp_path, pulsar_broker.service_url, topics, fs_store(tmp_path)))
    config_path.write_text(
        config_path.read_text().replace("[spark]\n", '[spark]\nmaster = "local-cluster[2,1,1024]"\n')
    )
    proc = run_once(config_path, dict(os.environ))
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    store = load_config(config_path).store.location.open().store
    for topic in topics:
        check_messages(ScopedStore(store), topic, COUNT, keys=KEYS, size=SIZE)
