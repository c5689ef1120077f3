"""The live ``pulsar`` source's message rows (``output=messages``, the default): pulsar-spark's columns, batches
split, compression undone, streaming and batch, with and without the read-through (``offloaded.store``); its
pulsar-spark offsets (serialized message ids); ``output=entries``; the ``streamoffload-pulsar`` name.

Messages are published with pulsar-client (batched, unbatched, ZLIB, ZSTD and LZ4; keys or none, properties or
none, event times or none, empty values, bytes that are not UTF-8) to a first broker, whose entries are then
offloaded, read from it byte for byte, into a filesystem store through the real segmenter and sink. A second
broker on its own data directory holds later messages of the same topics in later ledgers (other topics are
created on it first, so its ledger numbers come after the stored ones): as a broker whose retention deleted
the offloaded ledgers. What each message must be comes from the producer (value, key, properties, event time)
and from a pulsar-client reader of its broker (its publish time and id).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pulsar
import pytest

from streamoffload.checkpoints.policy import OffloadPolicy
from streamoffload.codecs.entry import entry_messages
from streamoffload.codecs.topics import TopicName
from streamoffload.embedded_broker import EmbeddedBroker
from streamoffload.errors import ConfigError
from streamoffload.pulsar import raw_reader as rr
from streamoffload.pulsar.exactly_once import BEFORE_EARLIEST, ReaderSettings
from streamoffload.read.dataset_read import MESSAGE_SCHEMA
from streamoffload.storage.location import parse_store_url
from streamoffload.streaming.segmenter.segmenter import run_segmenter
from streamoffload.streaming.segmenter.segmenter_model import CONTROL_SEAL, MemoryState
from streamoffload.streaming.source.pulsar_source import (
    SCHEMA,
    OwnNamePulsarDataSource,
    PulsarStreamReader,
    register_unless_taken,
)
from streamoffload.streaming.source.source_options import SourceOptions, parse_starting_offsets
from tests.fixtures.broker import unique_topic
from tests.fixtures.entries import Published, forget_sent, memory_sink, publish_to
from tests.table.offload import message_id

OLD, NEW = 22, 13  # messages per topic on the first broker (offloaded) and on the second
EVENT_BASE_MS = 1_700_000_000_000
TOPICS = {
    # kind: (batched, compression)
    "batched": (True, pulsar.CompressionType.NONE),
    "unbatched": (False, pulsar.CompressionType.NONE),
    "zlib": (True, pulsar.CompressionType.ZLib),
    "zstd": (False, pulsar.CompressionType.ZSTD),
    "lz4": (True, pulsar.CompressionType.LZ4),
}
SELECTED = ("value", "__key", "__publishTime", "__messageProperties", "__topic", "__messageId", "__eventTime")


@dataclass(frozen=True)
class Expected:
    """One message as the source must give it (the columns of ``SELECTED``)."""

    value: bytes
    key: bytes | None
    publish_time: datetime
    properties: dict[str, str]
    topic: str
    message_id: bytes
    event_time: datetime | None


def spark_time(ms: int) -> datetime:
    """A time in ms as PySpark collects a timestamp (``TimestampType.fromInternal``: local, naive)."""
    us = ms * 1000
    return datetime.fromtimestamp(us // 1_000_000).replace(microsecond=us % 1_000_000)


def message(i: int) -> tuple[bytes, str | None, dict[str, str], int | None]:
    """Message ``i``'s value, key, properties and event time: each field set or not, by turns."""
    value = b"" if i % 11 == 0 else f"m{i}|".encode() + bytes([i % 256, 0xFF, 0x00, 0x80]) * (i % 5)
    key = None if i % 5 == 2 else f"k{i % 3}"
    properties = {"n": str(i), "kind": "odd" if i % 2 else "even"} if i % 3 else {}
    event = None if i % 4 == 1 else EVENT_BASE_MS + i
    return value, key, properties, event


def publish(service_url: str, topic: str, first: int, count: int, batched: bool, codec: Any) -> list[Expected]:
    """Messages ``first .. first+count-1`` (batches of up to 4) to a new topic, then what a pulsar-client reader
    finds of them."""
    client = pulsar.Client(service_url)
    try:
        producer = client.create_producer(
            topic,
            batching_enabled=batched,
            batching_max_messages=4,
            batching_max_publish_delay_ms=60_000,
            compression_type=codec,
        )
        sent = [message(i) for i in range(first, first + count)]
        failures: list[Any] = []
        for value, key, properties, event in sent:
            kwargs: dict[str, Any] = {"properties": properties}
            if key is not None:
                kwargs["partition_key"] = key
            if event is not None:
                kwargs["event_timestamp"] = event

            def done(result: Any, _mid: Any) -> None:
                if result != pulsar.Result.Ok:
                    failures.append(result)

            producer.send_async(value, done, **kwargs)
        producer.flush()
        producer.close()
        assert failures == []
        reader = client.create_reader(topic, pulsar.MessageId.earliest)
        found = [reader.read_next(timeout_millis=10_000) for _ in range(count)]
        reader.close()
    finally:
        client.close()
    partition = TopicName.parse(topic).partition
    ids = [m.message_id() for m in found]
    batch_sizes: dict[tuple[int, int], int] = {}
    for mid in ids:
        batch_sizes[(mid.ledger_id(), mid.entry_id())] = batch_sizes.get((mid.ledger_id(), mid.entry_id()), 0) + 1
    expected = []
    for (value, key, properties, event), got, mid in zip(sent, found, ids, strict=True):
        assert bytes(got.data()) == value  # the reader's order is the producer's
        batch_index = mid.batch_index() if batched else -1
        size = batch_sizes[(mid.ledger_id(), mid.entry_id())] if batched else 0
        expected.append(
            Expected(
                value,
                None if key is None else key.encode(),
                spark_time(got.publish_timestamp()),
                properties,
                topic,
                message_id(mid.ledger_id(), mid.entry_id(), partition, batch_index, size),
                None if event is None else spark_time(event),
            )
        )
    if batched:
        assert max(batch_sizes.values()) == 4  # batches of several messages, not one each
    return expected


def offload(service_url: str, store_dir: Path, topic: str) -> None:
    """Every entry of ``topic``, read from the broker byte for byte, into committed segments of the store."""
    client = rr.RawClient(service_url)
    try:
        last = rr.latest_position_raw(client, topic)
        assert last is not None
        read = list(rr.read_range_raw(client, topic, BEFORE_EARLIEST, last, settings=ReaderSettings()))
    finally:
        client.close()
    scoped = parse_store_url(f"file://{store_dir}").open()
    try:
        sink = memory_sink(scoped)
        state = MemoryState()
        policy = OffloadPolicy(
            managedLedgerOffloadMaxBlockSizeInBytes=2048,
            maxSizePerOffloadSegmentMbytes=8 * 1024 / (1024 * 1024),
            offloadBufferMaxBytes=8 * 2048,
            maxOffloadSegmentRolloverTimeMinutes=1e6,
        )
        entries = [Published(e.ledger_id, e.entry_id, bytes(e.payload), e.publish_time) for e in read]
        actions = run_segmenter(
            topic,
            policy,
            state,
            publish_to(sink, topic, entries),
            [CONTROL_SEAL],
            now_ms=1_000,
            key_prefix=scoped.prefix,
            min_part_size=scoped.store.min_part_size,
        )
        sink.apply(actions)
        forget_sent(sink, topic, state)
    finally:
        scoped.store.close()


@dataclass
class World:
    first: EmbeddedBroker
    second: EmbeddedBroker
    store: str
    topics: dict[str, str]  # kind -> topic
    old: dict[str, list[Expected]]  # topic -> its messages on the first broker (offloaded)
    new: dict[str, list[Expected]]  # topic -> its messages on the second broker
    tmp: Path


@pytest.fixture(scope="module")
def world(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("message-rows")
    base = unique_topic("msgrows")
    topics = {kind: f"{base}-{kind}" for kind in TOPICS}
    topics["batched"] += "-partition-1"  # a partition: its message ids carry the partition index
    first = EmbeddedBroker(tmp / "broker-first", default_partitions=0).start()
    second: EmbeddedBroker | None = None
    try:
        old = {t: publish(first.service_url, t, 0, OLD, *TOPICS[kind]) for kind, t in topics.items()}
        for t in topics.values():
            offload(first.service_url, tmp / "store", t)
        second = EmbeddedBroker(tmp / "broker-second", default_partitions=0).start()
        for i in range(len(topics)):  # their ledgers come first: the topics' new ledgers follow the stored ones
            publish(second.service_url, unique_topic(f"msgrows-pad{i}"), 0, 1, False, pulsar.CompressionType.NONE)
        new = {t: publish(second.service_url, t, OLD, NEW, *TOPICS[kind]) for kind, t in topics.items()}
        yield World(first, second, f"file://{tmp / 'store'}", topics, old, new, tmp)
    finally:
        if second is not None:
            second.stop()
        first.stop()


def as_expected(row: Any) -> Expected:
    return Expected(
        bytes(row["value"]),
        None if row["__key"] is None else bytes(row["__key"]),
        row["__publishTime"],
        dict(row["__messageProperties"]),
        row["__topic"],
        bytes(row["__messageId"]),
        row["__eventTime"],
    )


def by_topic(rows: list[Any]) -> dict[str, list[Expected]]:
    """Rows per topic, in the order they came."""
    out: dict[str, list[Expected]] = {}
    for row in rows:
        got = as_expected(row)
        out.setdefault(got.topic, []).append(got)
    return out


def batch_read(spark: Any, service_url: str, topics: list[str], source: str = "pulsar", **options: str) -> Any:
    return (
        spark.read.format(source)
        .option("service.url", service_url)
        .option("topics", ",".join(topics))
        .option("stallTimeoutMs", "100")
        .options(**options)
        .load()
    )


def stream_read(spark: Any, service_url: str, topics: list[str], checkpoint: Path, **options: str) -> list[list[Any]]:
    """A streaming query (``Trigger.AvailableNow``, several micro-batches) of pulsar-spark's columns; each
    micro-batch's rows, in order."""
    batches: dict[int, list[Any]] = {}

    def sink(frame: Any, batch_id: int) -> None:
        batches[batch_id] = frame.collect()  # a replayed micro-batch replaces its rows

    query = (
        spark.readStream.format("pulsar")
        .option("service.url", service_url)
        .option("topics", ",".join(topics))
        .option("stallTimeoutMs", "100")
        .option("maxEntriesPerTrigger", "20")
        .options(**options)
        .load()
        .select(*SELECTED)
        .writeStream.foreachBatch(sink)
        .trigger(availableNow=True)
        .option("checkpointLocation", str(checkpoint))
        .start()
    )
    query.awaitTermination(240)
    assert query.exception() is None
    return [batches[b] for b in sorted(batches)]


def test_a_batch_read_gives_pulsar_sparks_columns_one_row_per_message(spark: Any, world: World) -> None:
    topics = list(world.topics.values())
    frame = batch_read(spark, world.first.service_url, topics)
    schema = [(f.name, f.dataType.simpleString()) for f in frame.schema.fields]
    assert schema == [
        (f.name, f.dataType.simpleString()) for f in spark.createDataFrame([], MESSAGE_SCHEMA).schema.fields
    ]
    assert schema[:7] == [
        ("value", "binary"),
        ("__key", "binary"),
        ("__topic", "string"),
        ("__messageId", "binary"),
        ("__publishTime", "timestamp"),
        ("__eventTime", "timestamp"),
        ("__messageProperties", "map<string,string>"),
    ]
    # A query written for pulsar-spark, as it is.
    pulsar_spark = frame.select("value", "__key", "__publishTime", "__messageProperties").collect()
    everything = [m for t in topics for m in world.old[t]]
    got = [(bytes(r["value"]), r["__key"] and bytes(r["__key"]), r["__publishTime"]) for r in pulsar_spark]
    assert sorted(got, key=repr) == sorted(((m.value, m.key, m.publish_time) for m in everything), key=repr)
    assert by_topic(frame.select(*SELECTED).collect()) == world.old
    # The same source under its own name, here with pulsar-client's reader (reader=client), which rebuilds the
    # entries from their messages: the same rows.
    own = batch_read(spark, world.first.service_url, topics, source="streamoffload-pulsar", reader="client")
    assert by_topic(own.select(*SELECTED).collect()) == world.old


def test_the_message_ids_are_pulsars_serialized_ids(spark: Any, world: World) -> None:
    topic = world.topics["batched"]
    rows = batch_read(spark, world.first.service_url, [topic]).select("__messageId", "__batchIndex").collect()
    ids = [bytes(r["__messageId"]) for r in rows]
    assert ids == [m.message_id for m in world.old[topic]]
    parsed = [pulsar.MessageId.deserialize(i) for i in ids]
    assert [p.batch_index() for p in parsed] == [r["__batchIndex"] for r in rows]
    assert {p.partition() for p in parsed} == {1}


def test_a_streaming_query_reads_every_message_once_in_order(spark: Any, world: World) -> None:
    topics = list(world.topics.values())
    # Small Arrow batches too: a range's messages come in several, each of whole entries.
    batches = stream_read(spark, world.first.service_url, topics, world.tmp / "cp-stream", arrowBatchBytes="200")
    assert len(batches) > 2  # maxEntriesPerTrigger cut it into several micro-batches
    assert by_topic([r for b in batches for r in b]) == world.old


def test_read_through_gives_the_stored_messages_then_the_brokers(spark: Any, world: World) -> None:
    topics = list(world.topics.values())
    # The second broker alone holds only the later messages.
    assert by_topic(batch_read(spark, world.second.service_url, topics).select(*SELECTED).collect()) == world.new
    expected = {t: world.old[t] + world.new[t] for t in topics}
    through = batch_read(spark, world.second.service_url, topics, **{"offloaded.store": world.store})
    assert by_topic(through.select(*SELECTED).collect()) == expected
    batches = stream_read(
        spark, world.second.service_url, topics, world.tmp / "cp-through", **{"offloaded.store": world.store}
    )
    assert by_topic([r for b in batches for r in b]) == expected


def signed(data: bytes) -> list[int]:
    """Bytes as pulsar-spark's JSON writes them (Java's signed bytes)."""
    return [b - 256 if b > 127 else b for b in data]


def test_pulsar_spark_message_id_offsets_bound_a_batch_read(spark: Any, world: World) -> None:
    """pulsar-spark's offsets: a start reads its message's entry from its first message, an end to its last."""
    topic = world.topics["batched"]
    messages = world.old[topic]
    positions = [pulsar.MessageId.deserialize(m.message_id) for m in messages]
    entry = [(p.ledger_id(), p.entry_id()) for p in positions]
    start = next(i for i, p in enumerate(positions) if p.batch_index() == 2)  # inside a batch
    end = next(i for i, p in enumerate(positions) if i > start + 4 and p.batch_index() == 1)
    first = entry.index(entry[start])
    last = max(i for i, e in enumerate(entry) if e == entry[end])
    assert first < start and last > end  # whole entries are read, beyond the messages named
    for offsets in (signed, list):  # signed bytes (JsonUtils.topicOffsets) or 0-255
        frame = batch_read(
            spark,
            world.first.service_url,
            [topic],
            startingOffsets=json.dumps({topic: offsets(messages[start].message_id)}),
            endingOffsets=json.dumps({topic: offsets(messages[end].message_id)}),
        )
        assert [as_expected(r) for r in frame.select(*SELECTED).collect()] == messages[first : last + 1]


def test_output_entries_keeps_the_entry_rows(spark: Any, world: World) -> None:
    topic = world.topics["lz4"]
    frame = batch_read(spark, world.first.service_url, [topic], output="entries")
    assert [f.name for f in frame.schema.fields] == [c.split()[0] for c in SCHEMA.split(", ")]
    rows = frame.collect()
    values = [bytes(m.payload) for r in rows for m in entry_messages(bytes(r.entry))]
    ids = [pulsar.MessageId.deserialize(m.message_id) for m in world.old[topic]]
    assert [(r.ledger_id, r.entry_id) for r in rows] == list(dict.fromkeys((i.ledger_id(), i.entry_id()) for i in ids))
    assert values == [m.value for m in world.old[topic]]


def test_a_name_a_jvm_source_has_is_left_to_it(spark: Any, tmp_path: Path) -> None:
    """Spark refuses a Python source under a built-in or JVM source's name (pulsar-spark's jar makes ``pulsar``
    one): registration goes on, and the name stays the JVM source's."""

    class Json(OwnNamePulsarDataSource):
        @classmethod
        def name(cls) -> str:
            return "json"

    assert register_unless_taken(spark, Json) is False
    (tmp_path / "a.json").write_text('{"a": 1}\n')
    assert [r.a for r in spark.read.format("json").load(str(tmp_path / "a.json")).collect()] == [1]
    assert register_unless_taken(spark, OwnNamePulsarDataSource) is True


# --- plain -----------------------------------------------------------------------------------------------


def test_message_id_offsets_parse_as_pulsar_spark_reads_them() -> None:
    t = "persistent://public/default/t"
    batch = pulsar.MessageId(-1, 7, 3, 2).serialize()  # partition -1, ledger 7, entry 3, batch index 2
    assert parse_starting_offsets(json.dumps({t: signed(batch)})) == {t: (7, 2)}
    assert parse_starting_offsets(json.dumps({t: signed(batch)}), "endingOffsets") == {t: (7, 3)}
    first = message_id(7, 0, -1, -1, 0)
    assert parse_starting_offsets(json.dumps({t: list(first)})) == {t: (7, -1)}  # from ledger 7's first entry
    assert parse_starting_offsets(json.dumps({t: signed(pulsar.MessageId.earliest.serialize())})) == {t: "earliest"}
    assert parse_starting_offsets(json.dumps({t: signed(pulsar.MessageId.latest.serialize())})) == {t: "latest"}
    # pulsar-spark's README's examples
    assert parse_starting_offsets('{"topic-1":[8,11,16,101,24,1,32,1]}') == {
        "persistent://public/default/topic-1": (11, 100)
    }
    with pytest.raises(ConfigError, match=r"endingOffsets: 'x': MessageId\.earliest is not an end"):
        parse_starting_offsets(
            '{"x":[8,-1,-1,-1,-1,-1,-1,-1,-1,-1,1,16,-1,-1,-1,-1,-1,-1,-1,-1,-1,1]}', "endingOffsets"
        )
    with pytest.raises(ConfigError, match="'x-partition-2': the MessageId is of partition 1, not of partition 2"):
        parse_starting_offsets(json.dumps({"x-partition-2": list(message_id(3, 4, 1, -1, 0))}))
    with pytest.raises(ConfigError, match="startingOffsets: 'x': not a serialized MessageId"):
        parse_starting_offsets('{"x": [1, 2, 3]}')
    with pytest.raises(ConfigError, match=r"'x': expected \[ledgerId, entryId\].*serialized MessageId"):
        parse_starting_offsets('{"x": [8, 300, 16, 1]}')


def test_the_output_option() -> None:
    base = {"serviceUrl": "pulsar://127.0.0.1:6650", "topics": "t"}
    assert SourceOptions.parse(base).output == "messages"
    assert SourceOptions.parse({**base, "OUTPUT": "Entries"}).output == "entries"
    with pytest.raises(ConfigError, match="option output: expected messages or entries, got 'rows'"):
        SourceOptions.parse({**base, "output": "rows"})
    with pytest.raises(ConfigError, match="option output='entries' does not go with positionsOnly=true"):
        SourceOptions.parse({**base, "output": "entries", "positionsOnly": "true"})
    with pytest.raises(ConfigError, match="option sealAtEnd: its seal markers are entry rows; give output=entries"):
        PulsarStreamReader({**base, "sealAtEnd": "true"})
    PulsarStreamReader({**base, "sealAtEnd": "true", "output": "entries"})
