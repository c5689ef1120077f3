"""``spark.read.format("pulsar")``: a batch read of live topics between ``startingOffsets`` and
``endingOffsets`` (pulsar-spark's options), and pulsar-spark's ``pulsar.reader.*`` settings."""

from __future__ import annotations

import json
from typing import Any

import pytest

from streamoffload.codecs.entry import decode_entry
from streamoffload.errors import ConfigError
from streamoffload.produce import expected_payload, produce
from streamoffload.streaming.source.pulsar_source import PulsarStreamReader
from streamoffload.streaming.source.source_options import SourceOptions
from tests.fixtures.broker import unique_topic

SERVICE = "pulsar://127.0.0.1:6650"


@pytest.mark.spark
@pytest.mark.broker
def test_a_batch_read_returns_exactly_the_entries_between_the_offsets(spark: Any, pulsar_broker: Any) -> None:
    topic = unique_topic("batch-read")
    produce(pulsar_broker.service_url, topic, count=30, payload_size=64, batching=False)

    def read(**options: str) -> list[Any]:
        frame = (
            spark.read.format("pulsar")
            .option("output", "entries")
            .option("service.url", pulsar_broker.service_url)
            .option("topic", topic)
            .options(**options)
            .load()
        )
        return sorted(frame.select("ledger_id", "entry_id", "entry").collect())

    everything = read()
    assert len(everything) == 30
    payloads = [decode_entry(bytes(row.entry)).payload for row in everything]
    assert payloads == [expected_payload(topic, seq, 64) for seq in range(30)]

    positions = [(row.ledger_id, row.entry_id) for row in everything]
    tenth, fourth = positions[9], positions[3]
    window = read(
        startingOffsets=json.dumps({topic: list(fourth)}),  # the last position already read
        endingOffsets=json.dumps({topic: list(tenth)}),  # inclusive
    )
    assert [(row.ledger_id, row.entry_id) for row in window] == positions[4:10]

    # minPartitions cuts the one topic-partition's range into pieces read by separate tasks: the same
    # entries, in position order across the input partitions.
    frame = (
        spark.read.format("pulsar")
        .option("output", "entries")
        .option("service.url", pulsar_broker.service_url)
        .option("topic", topic)
        .option("minPartitions", "3")
        .load()
    )
    assert frame.rdd.getNumPartitions() == 3
    assert [(row.ledger_id, row.entry_id, row.entry) for row in frame.collect()] == everything
    assert [tuple(row) for row in window] == [
        (row.ledger_id, row.entry_id, row.entry)
        for row in sorted(
            spark.read.format("pulsar")
            .option("output", "entries")
            .option("service.url", pulsar_broker.service_url)
            .option("topic", topic)
            .option("minPartitions", "4")
            .options(startingOffsets=json.dumps({topic: list(fourth)}), endingOffsets=json.dumps({topic: list(tenth)}))
            .load()
            .select("ledger_id", "entry_id", "entry")
            .collect()
        )
    ]

    beyond = [positions[-1][0], positions[-1][1] + 100]
    with pytest.raises(Exception, match="a position it does not hold yet"):
        read(endingOffsets=json.dumps({topic: beyond}))


@pytest.mark.spark
@pytest.mark.broker
def test_max_partitions_packs_many_topics_into_few_tasks_with_every_entry_once(spark: Any, pulsar_broker: Any) -> None:
    """Seven topic-partitions, ``maxPartitions`` 3: three tasks read every entry of every topic once, each
    topic's entries in position order, byte for byte."""
    base = unique_topic("packed")
    topics = [f"{base}-partition-{i}" for i in range(7)]
    for i, topic in enumerate(topics):
        produce(pulsar_broker.service_url, topic, count=5 + i, payload_size=32, batching=False)
    frame = (
        spark.read.format("pulsar")
        .option("output", "entries")
        .option("service.url", pulsar_broker.service_url)
        .option("topics", ",".join(topics))
        .option("maxPartitions", "3")
        .load()
    )
    assert frame.rdd.getNumPartitions() == 3
    rows = frame.select("topic", "ledger_id", "entry_id", "entry").collect()
    for i, topic in enumerate(topics):
        mine = [row for row in rows if row.topic == topic]
        assert [(r.ledger_id, r.entry_id) for r in mine] == sorted((r.ledger_id, r.entry_id) for r in mine)
        assert [decode_entry(bytes(r.entry)).payload for r in mine] == [
            expected_payload(topic, seq, 32) for seq in range(5 + i)
        ]
    assert len(rows) == sum(5 + i for i in range(7))


def test_ending_offsets_are_for_batch_reads_and_checked() -> None:
    with pytest.raises(ConfigError, match="applies to batch reads"):
        PulsarStreamReader({"serviceUrl": SERVICE, "topics": "t", "endingOffsets": "latest"})
    with pytest.raises(ConfigError, match="option endingOffsets: expected latest"):
        SourceOptions.parse({"serviceUrl": SERVICE, "topics": "t", "endingOffsets": "earliest"})
    with pytest.raises(ConfigError, match="option endingOffsets: 'x'"):
        SourceOptions.parse({"serviceUrl": SERVICE, "topics": "t", "endingOffsets": '{"x": [1]}'})
    parsed = SourceOptions.parse({"serviceUrl": SERVICE, "topics": "t", "endingOffsets": '{"*": "latest"}'})
    assert parsed.ending_offsets == {"*": "latest"}


def test_pulsar_spark_reader_settings() -> None:
    options = SourceOptions.parse(
        {"serviceUrl": SERVICE, "topics": "t", "pulsar.reader.receiverQueueSize": "77", "pulsar.reader.readerName": "x"}
    )
    assert options.receiver_queue_size == 77
    assert options.client_opts == {}, "reader settings are not client settings"
    with pytest.raises(ConfigError, match="readCompacted = true is refused"):
        SourceOptions.parse({"serviceUrl": SERVICE, "topics": "t", "pulsar.reader.readCompacted": "true"})
    with pytest.raises(ConfigError, match=r"option pulsar\.reader\.startmessageid: not supported"):
        SourceOptions.parse({"serviceUrl": SERVICE, "topics": "t", "pulsar.reader.startMessageId": "x"})
