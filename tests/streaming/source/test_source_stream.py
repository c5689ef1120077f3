"""The Pulsar source under Spark Structured Streaming, against the embedded broker: every entry
exactly once and in order, exact messages, ledger rollover, broker restart, admission control,
startingOffsets, discovery and data loss. Plus the driver-side planning in plain Python."""

from __future__ import annotations

import json
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from streamoffload.codecs.entry import entry_messages
from streamoffload.embedded_broker import EmbeddedBroker
from streamoffload.produce import expected_key, expected_payload, expected_properties, produce
from streamoffload.pulsar import client_reader
from streamoffload.pulsar.exactly_once import BEFORE_EARLIEST
from streamoffload.streaming.source.backlog import read_backlog_file
from streamoffload.streaming.source.offset_planner import SourcePlanner
from streamoffload.streaming.source.source_options import SourceOptions
from tests.fixtures.broker import ROLLOVER_ENTRIES, unique_topic

pytestmark = [pytest.mark.spark, pytest.mark.broker]

PROPS = {"src": "stream"}


def source_options(service_url: str, **extra: str) -> dict[str, str]:
    return {
        "serviceUrl": service_url,
        "stallTimeoutMs": "100",
        "retryTimeoutSeconds": "30",
        "output": "entries",
        **extra,
    }


def run_available_now(
    spark: Any, options: dict[str, str], checkpoint: Path, timeout: float = 240
) -> tuple[list[tuple[int, list[Any]]], list[dict[str, Any]]]:
    """Run a query with Trigger.AvailableNow into foreachBatch: ``([(batch id, rows)], progress)``."""
    batches: list[tuple[int, list[Any]]] = []

    def sink(frame: Any, batch_id: int) -> None:
        batches.append((batch_id, frame.collect()))

    query = (
        spark.readStream.format("pulsar")
        .options(**options)
        .load()
        .writeStream.foreachBatch(sink)
        .trigger(availableNow=True)
        .option("checkpointLocation", str(checkpoint))
        .start()
    )
    assert query.awaitTermination(timeout), "query did not finish"
    return batches, query.recentProgress


def rows_of(batches: list[tuple[int, list[Any]]]) -> list[Any]:
    return [row for _batch_id, rows in batches for row in rows]


def check_topic(rows: list[Any], topic: str, count: int, payload_size: int, keys: int = 0) -> None:
    """``rows`` of one topic-partition hold ``count`` messages, each once, in position order, exact."""
    mine = sorted((r for r in rows if r.topic == topic), key=lambda r: (r.ledger_id, r.entry_id))
    positions = [(r.ledger_id, r.entry_id) for r in mine]
    assert len(set(positions)) == len(positions), f"{topic}: an entry was emitted twice"
    seq = 0
    for row in mine:
        assert row.size == len(row.entry)
        messages = entry_messages(row.entry)
        assert len(messages) == row.num_messages
        for msg in messages:
            assert bytes(msg.payload) == expected_payload(topic, seq, payload_size), (topic, row.entry_id, seq)
            assert msg.key == expected_key(seq, keys)
            assert msg.properties == expected_properties(seq, PROPS)
            assert msg.publish_time == int(row.publish_time.timestamp() * 1000)
            seq += 1
    assert seq == count, f"{topic}: {seq} messages read, {count} published"


# --- exactly once, in order, exact bytes ------------------------------------------------------


def test_plain_and_partitioned_topics_exactly_once(spark: Any, pulsar_broker: EmbeddedBroker, tmp_path: Path) -> None:
    url = pulsar_broker.service_url
    plain = unique_topic("plain")
    base = unique_topic("parted")
    parts = [f"{base}-partition-{i}" for i in range(3)]
    produce(url, plain, 500, 120, keys=5, properties=PROPS, batching=True, batch_size=20)
    produce(url, base, 300, 80, partitions=3, keys=2, properties=PROPS, batching=False)

    query = (
        spark.readStream.format("pulsar")
        .options(**source_options(url, topics=",".join([plain, *parts])))
        .load()
        .writeStream.format("memory")
        .queryName("pulsar_exactly_once")
        .option("checkpointLocation", str(tmp_path / "cp"))
        .start()
    )
    try:
        query.processAllAvailable()
        # more traffic while the query runs: appended, never repeated
        produce(url, base, 60, 80, partitions=3, keys=2, properties=PROPS, batching=True, batch_size=4)
        query.processAllAvailable()
    finally:
        query.stop()
    rows = spark.table("pulsar_exactly_once").collect()
    check_topic(rows, plain, 500, 120, keys=5)
    assert sum(r.num_messages for r in rows if r.topic == plain) == 500
    assert len([r for r in rows if r.topic == plain]) < 500  # batched entries, regrouped
    for i, tp in enumerate(parts):
        mine = sorted((r for r in rows if r.topic == tp), key=lambda r: (r.ledger_id, r.entry_id))
        assert {r.partition for r in mine} == {i}
        # 100 unbatched messages from the first produce, then 20 in batches from the second
        first = mine[:100]
        assert all(r.num_messages == 1 for r in first)
        check_topic(first, tp, 100, 80, keys=2)
        second = mine[100:]
        assert sum(r.num_messages for r in second) == 20
        seq = 0
        for row in second:
            for msg in entry_messages(row.entry):
                assert bytes(msg.payload) == expected_payload(tp, seq, 80)
                seq += 1


def test_ledger_rollover_under_admission_control(
    spark: Any, pulsar_broker: EmbeddedBroker, rollover_topic: tuple[str, int], tmp_path: Path
) -> None:
    topic, count = rollover_topic
    limit = 17_000
    batches, progress = run_available_now(
        spark, source_options(pulsar_broker.service_url, topics=topic, maxEntriesPerTrigger=str(limit)), tmp_path
    )
    assert all(len(rows) <= limit for _b, rows in batches)
    assert all(p["numInputRows"] <= limit for p in progress)
    rows = rows_of(batches)
    assert len(rows) == count
    ledgers = sorted({r.ledger_id for r in rows})
    assert len(ledgers) == 2
    assert sum(1 for r in rows if r.ledger_id == ledgers[0]) == ROLLOVER_ENTRIES
    positions = sorted((r.ledger_id, r.entry_id) for r in rows)
    assert len(set(positions)) == count
    by_position = {(r.ledger_id, r.entry_id): r for r in rows}
    for seq, pos in enumerate(positions):
        (msg,) = entry_messages(by_position[pos].entry)
        assert bytes(msg.payload) == expected_payload(topic, seq, 16)
    # the third batch's cap lay past the end of the first ledger: it stopped at the ledger's end
    assert [len(rows) for _b, rows in batches if rows] == [
        limit,
        limit,
        ROLLOVER_ENTRIES - 2 * limit,
        count - ROLLOVER_ENTRIES,
    ]


def test_broker_restart_during_a_run(spark: Any, make_broker: Callable[..., EmbeddedBroker], tmp_path: Path) -> None:
    broker = make_broker()
    url = broker.service_url
    topic = unique_topic("restart")
    produce(url, topic, 3000, 200, properties=PROPS, batching=False)
    query = (
        spark.readStream.format("pulsar")
        .options(**source_options(url, topics=topic, maxEntriesPerTrigger="400"))
        .load()
        .writeStream.format("memory")
        .queryName("pulsar_restart")
        .trigger(processingTime="200 milliseconds")
        .option("checkpointLocation", str(tmp_path / "cp"))
        .start()
    )
    try:
        deadline = time.monotonic() + 120
        while not query.recentProgress or query.recentProgress[-1]["numInputRows"] == 0:
            assert time.monotonic() < deadline, "no batch before the restart"
            assert query.exception() is None
            time.sleep(0.05)
        restarter = threading.Thread(target=broker.restart)
        restarter.start()  # while the next micro-batches read
        restarter.join(60)
        produce(url, topic, 500, 200, properties=PROPS, batching=False)
        query.processAllAvailable()
    finally:
        query.stop()
    rows = spark.table("pulsar_restart").collect()
    ordered = sorted(rows, key=lambda r: (r.ledger_id, r.entry_id))
    assert len({(r.ledger_id, r.entry_id) for r in ordered}) == len(ordered) == 3500
    check_topic(ordered[:3000], topic, 3000, 200)
    for seq, row in enumerate(ordered[3000:]):
        (msg,) = entry_messages(row.entry)
        assert bytes(msg.payload) == expected_payload(topic, seq, 200)  # the second produce counts from 0


# --- admission control ------------------------------------------------------------------------


def test_max_entries_split_fairly_across_partitions(spark: Any, pulsar_broker: EmbeddedBroker, tmp_path: Path) -> None:
    url = pulsar_broker.service_url
    base = unique_topic("fair")
    parts = [f"{base}-partition-{i}" for i in range(3)]
    produce(url, base, 120, 30, partitions=3, properties=PROPS, batching=False)  # 40 each
    extra = unique_topic("fair-small")
    produce(url, extra, 4, 30, properties=PROPS, batching=False)
    batches, progress = run_available_now(
        spark, source_options(url, topics=",".join([*parts, extra]), maxEntriesPerTrigger="25"), tmp_path
    )
    assert all(len(rows) <= 25 for _b, rows in batches)
    assert all(p["numInputRows"] <= 25 for p in progress)
    first_batch = next(rows for _b, rows in batches if rows)
    per_topic = defaultdict(int)
    for row in first_batch:
        per_topic[row.topic] += 1
    assert per_topic[extra] == 4  # the small one gets all it has; the rest is shared evenly
    assert sorted(per_topic[tp] for tp in parts) == [7, 7, 7]
    rows = rows_of(batches)
    for tp in parts:
        check_topic(rows, tp, 40, 30)
    check_topic(rows, extra, 4, 30)


def test_max_bytes_per_trigger(spark: Any, pulsar_broker: EmbeddedBroker, tmp_path: Path) -> None:
    url = pulsar_broker.service_url
    topic = unique_topic("bytes")
    produce(url, topic, 60, 1000, properties=PROPS, batching=False)
    batches, _progress = run_available_now(spark, source_options(url, topics=topic, maxBytesPerTrigger="10k"), tmp_path)
    sizes = [sum(r.size for r in rows) for _b, rows in batches if rows]
    assert all(size <= 10 * 1024 for size in sizes), sizes
    assert len(sizes) >= 6
    check_topic(rows_of(batches), topic, 60, 1000)


# --- where reading starts ---------------------------------------------------------------------


def test_starting_offsets_json(spark: Any, pulsar_broker: EmbeddedBroker, tmp_path: Path) -> None:
    url = pulsar_broker.service_url
    a, b = unique_topic("start-a"), unique_topic("start-b")
    produce(url, a, 30, 40, properties=PROPS, batching=False)
    produce(url, b, 30, 40, properties=PROPS, batching=False)
    client = client_reader.make_client(url)
    try:
        entries_a = list(client_reader.read_range(client, a, BEFORE_EARLIEST, client_reader.latest_position(client, a)))
    finally:
        client.close()
    tenth = entries_a[9].position
    options = source_options(url, topics=f"{a},{b}", startingOffsets=json.dumps({a: list(tenth), b: "latest"}))
    batches, _ = run_available_now(spark, options, tmp_path / "cp")
    rows = rows_of(batches)
    assert sorted((r.ledger_id, r.entry_id) for r in rows) == [e.position for e in entries_a[10:]]
    assert all(r.topic == a for r in rows)
    # the same query again (its checkpoint now decides): only what was published since
    produce(url, b, 5, 40, properties=PROPS, batching=False)
    batches, _ = run_available_now(spark, options, tmp_path / "cp")
    again = rows_of(batches)
    assert [r.topic for r in again] == [b] * 5
    check_topic(again, b, 5, 40)  # a second produce() numbers from 0 again


def test_topics_pattern_with_candidates_picks_up_new_data(
    spark: Any, pulsar_broker: EmbeddedBroker, tmp_path: Path
) -> None:
    url = pulsar_broker.service_url
    base = unique_topic("pat")
    other = unique_topic("elsewhere")
    produce(url, f"{base}-partition-0", 10, 20, properties=PROPS, batching=False)
    produce(url, other, 10, 20, properties=PROPS, batching=False)
    local = base.rsplit("/", 1)[1]
    options = source_options(
        url,
        topicsPattern=f"persistent://public/default/{local}-partition-\\d+",
        topicsPatternCandidates=f"{base}-partition-0,{base}-partition-1,{other}",
        discoveryIntervalSeconds="0",
    )
    query = (
        spark.readStream.format("pulsar")
        .options(**options)
        .load()
        .writeStream.format("memory")
        .queryName("pulsar_pattern")
        .option("checkpointLocation", str(tmp_path / "cp"))
        .start()
    )
    try:
        query.processAllAvailable()
        produce(url, f"{base}-partition-1", 7, 20, properties=PROPS, batching=False)
        query.processAllAvailable()
    finally:
        query.stop()
    rows = spark.table("pulsar_pattern").collect()
    assert {r.topic for r in rows} == {f"{base}-partition-0", f"{base}-partition-1"}
    check_topic(rows, f"{base}-partition-0", 10, 20)
    check_topic(rows, f"{base}-partition-1", 7, 20)


# --- data loss ---------------------------------------------------------------------------------


def test_positions_beyond_the_topic_are_data_loss(spark: Any, pulsar_broker: EmbeddedBroker, tmp_path: Path) -> None:
    url = pulsar_broker.service_url
    topic = unique_topic("lost")
    summary = produce(url, topic, 5, 10, properties=PROPS, batching=False)
    last = summary.partitions[topic].last_message_id
    assert last is not None
    beyond = json.dumps({topic: [last[0], last[1] + 1000]})
    with pytest.raises(Exception, match="entries were lost"):
        run_available_now(spark, source_options(url, topics=topic, startingOffsets=beyond), tmp_path / "strict")
    lenient = source_options(url, topics=topic, startingOffsets=beyond, failOnDataLoss="false")
    batches, _ = run_available_now(spark, lenient, tmp_path / "lenient")
    assert rows_of(batches) == []  # goes on from the broker's position: nothing new yet


# --- the driver side in plain Python ------------------------------------------------------------


def test_planner_backlog_and_backlog_file(pulsar_broker: EmbeddedBroker, tmp_path: Path) -> None:
    url = pulsar_broker.service_url
    topic = unique_topic("backlog")
    produce(url, topic, 50, 100, properties=PROPS, batching=False)
    path = tmp_path / "metrics" / "backlog.json"
    options = SourceOptions.parse(source_options(url, topics=topic, backlogFile=str(path)))
    planner = SourcePlanner(options, lambda: client_reader.make_client(url))
    try:
        start = planner.initial_offset()
        assert start == {topic: [-1, -1]}
        end = planner.latest_offset(start, 20, None)
        ledger = end[topic][0]
        assert end == {topic: [ledger, 19]}
        backlog = planner.backlog()[topic]
        assert backlog.latest == (ledger, 49) and backlog.consumed == (-1, -1)
        assert backlog.entries == 50 and not backlog.exact  # from before the first entry: a lower bound
        assert backlog.bytes is not None and backlog.bytes >= 50 * 100
        planner.commit(end)
        backlog = planner.backlog()[topic]
        assert backlog.consumed == (ledger, 19) and backlog.entries == 30 and backlog.exact
        doc = read_backlog_file(str(path))
        assert doc["partitions"][topic]["entries"] == 30 and doc["partitions"][topic]["latest"] == [ledger, 49]
        assert planner.latest_offset(end, None, None) == {topic: [ledger, 49]}
        assert planner.end_is_known(topic, (ledger, 49))
        assert planner.latest_offset_report() == {topic: [ledger, 49]}
    finally:
        planner.client.close()
