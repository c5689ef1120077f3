"""End to end: publish through ``pulsar-client`` (batched and not, compressed with each of Pulsar's four
codecs, several partitions, keys, properties, event times, a null value), run the offload job once, and
read the store back with ``spark.read.format("pulsar-offloaded")``: every message and column is what was
published, and time and position bounds (options or pushed-down filters) return exactly the messages
inside them."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pulsar
import pytest

from streamoffload.codecs.entry import CompressionType, decode_entry
from streamoffload.codecs.proto.pulsar_api_pb2 import MessageIdData
from streamoffload.config import load_config
from streamoffload.storage.location import ScopedStore
from streamoffload.streaming.job.offload_job import OffloadJob
from tests.fixtures.broker import partition_names, unique_topic
from tests.fixtures.job import SMALL_SEGMENTS, fs_store, write_config

pytestmark = [pytest.mark.spark, pytest.mark.broker]

# partition index -> codec; the unbatched topic uses SNAPPY
CODECS = [
    (pulsar.CompressionType.LZ4, CompressionType.LZ4),
    (pulsar.CompressionType.ZSTD, CompressionType.ZSTD),
    (pulsar.CompressionType.ZLib, CompressionType.ZLIB),
]
PER_TOPIC = 90


def publish(service_url: str, topic: str, codec: Any, batched: bool, seq_base: int) -> list[dict[str, Any]]:
    """Publish PER_TOPIC messages; returns what was sent, with the client's message ids, in order."""
    sent: list[dict[str, Any]] = []
    client = pulsar.Client(service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    try:
        producer = client.create_producer(
            topic,
            producer_name=f"df-{topic.rsplit('/', 1)[1]}",
            compression_type=codec,
            batching_enabled=batched,
            batching_max_messages=10,
            batching_max_publish_delay_ms=50,
        )
        before = int(time.time() * 1000)
        for i in range(PER_TOPIC):
            msg: dict[str, Any] = {
                "value": None if i == 13 else f"{topic} message {i:04d} ".encode() * (1 + i % 5),
                "key": f"k{i % 4}" if i % 5 else None,
                "properties": {"i": str(i)} if i % 3 else {},
                "event_time": 1_750_000_000_000 + 7 * i if i % 4 else None,
                "sequence_id": seq_base + 3 * i,
            }
            sent.append(msg)
            kwargs: dict[str, Any] = {"properties": msg["properties"], "sequence_id": msg["sequence_id"]}
            if msg["event_time"] is not None:
                kwargs["event_timestamp"] = msg["event_time"]
            if msg["key"] is not None:
                kwargs["partition_key"] = msg["key"]

            def done(result: Any, message_id: Any, msg: dict[str, Any] = msg) -> None:
                msg["id"] = MessageIdData.FromString(message_id.serialize())

            producer.send_async(msg["value"], done, **kwargs)
        producer.flush()
        after = int(time.time() * 1000)
        producer.close()
    finally:
        client.close()
    for msg in sent:
        msg["window"] = (before, after)
        msg["producer"] = f"df-{topic.rsplit('/', 1)[1]}"
    assert all("id" in m for m in sent)
    return sent


@pytest.fixture(scope="module")
def offloaded(spark: Any, pulsar_broker: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Publish, run the job once into a filesystem store; the store URL and what was sent per topic."""
    tmp_path: Path = tmp_path_factory.mktemp("df-e2e")
    base = unique_topic("df-orders")
    plain = unique_topic("df-audit")
    sent: dict[str, list[dict[str, Any]]] = {}
    for i, topic in enumerate(partition_names(base, 3)):
        sent[topic] = publish(pulsar_broker.service_url, topic, CODECS[i][0], True, 1000 * i)
    sent[plain] = publish(pulsar_broker.service_url, plain, pulsar.CompressionType.SNAPPY, False, 50_000)
    config_path = write_config(tmp_path, pulsar_broker.service_url, list(sent), fs_store(tmp_path), SMALL_SEGMENTS)
    config = load_config(config_path)
    OffloadJob(config, str(config_path)).run_once(spark)
    # What the broker holds: each entry's bytes as it stored them (the reference for output="entries").
    held = {topic: broker_entries(spark, pulsar_broker.service_url, topic) for topic in sent}
    return {"store": f"file://{tmp_path / 'store'}", "base": base, "plain": plain, "sent": sent, "held": held}


def broker_entries(spark: Any, service_url: str, topic: str) -> list[tuple[int, int, bytes]]:
    frame = (
        spark.read.format("pulsar")
        .option("output", "entries")
        .option("serviceUrl", service_url)
        .option("topics", topic)
        .load()
    )
    return [(r.ledger_id, r.entry_id, bytes(r.entry)) for r in frame.orderBy("ledger_id", "entry_id").collect()]


def read(spark: Any, store: str, topics: str, **options: str) -> Any:
    reader = spark.read.format("pulsar-offloaded").option("store", store).option("topics", topics)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def rows_of(df: Any) -> list[dict[str, Any]]:
    """Rows as dicts: a Row does not give attributes whose names start with "__"."""
    return [r.asDict() for r in df.collect()]


def ms(value: datetime | None) -> int | None:
    if value is None:
        return None
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)  # the test session's Spark time zone is UTC-naive datetimes
    return round(value.timestamp() * 1000)


def by_topic(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for row in sorted(rows, key=lambda r: (r["__topic"], r["__ledgerId"], r["__entryId"], r["__batchIndex"])):
        out.setdefault(row["__topic"], []).append(row)
    return out


def check_rows(topic: str, rows: list[Any], sent: list[dict[str, Any]]) -> None:
    assert len(rows) == len(sent), f"{topic}: {len(rows)} rows, {len(sent)} published"
    partition = int(topic.rsplit("-", 1)[1]) if "-partition-" in topic else -1
    for row, msg in zip(rows, sent, strict=True):
        where = (topic, msg["sequence_id"])
        assert row["value"] == msg["value"], where
        assert row["__key"] == (None if msg["key"] is None else msg["key"].encode()), where
        assert row["__messageProperties"] == msg["properties"], where
        assert ms(row["__eventTime"]) == msg["event_time"], where
        assert row["__sequenceId"] == msg["sequence_id"], where
        assert row["__producerName"] == msg["producer"], where
        lo, hi = msg["window"]
        assert lo <= ms(row["__publishTime"]) <= hi, where
        # __messageId is Pulsar's MessageIdData: the position the client was given for the message.
        ours, theirs = MessageIdData.FromString(row["__messageId"]), msg["id"]
        position = (row["__ledgerId"], row["__entryId"])
        assert (ours.ledgerId, ours.entryId) == (theirs.ledgerId, theirs.entryId) == position, where
        assert ours.batch_index == theirs.batch_index == row["__batchIndex"], where
        assert ours.batch_size == theirs.batch_size, where
        assert ours.partition == partition, where


def test_every_message_and_column(spark: Any, offloaded: dict[str, Any]) -> None:
    df = read(spark, offloaded["store"], f"{offloaded['base']},{offloaded['plain']}", maxPartitionBytes="8k")
    assert df.rdd.getNumPartitions() > 4  # one per segment or block run
    got = by_topic(rows_of(df))
    assert set(got) == set(offloaded["sent"])
    for topic, sent in offloaded["sent"].items():
        check_rows(topic, got[topic], sent)
    batched = [r for t in partition_names(offloaded["base"], 3) for r in got[t]]
    assert max(r["__batchIndex"] for r in batched) > 0
    assert all(r["__batchIndex"] == -1 for r in got[offloaded["plain"]])
    # The entries are stored compressed, as the producer wrote them; messages came back decompressed.
    entries = rows_of(read(spark, offloaded["store"], offloaded["plain"] + "," + offloaded["base"], output="entries"))
    by_position = sorted(entries, key=lambda r: (r["topic"], r["ledger_id"], r["entry_id"]))
    codecs: dict[str, set[int]] = {}
    for r in entries:
        codecs.setdefault(r["topic"], set()).add(decode_entry(r["entry"]).metadata.compression)
    for i, topic in enumerate(partition_names(offloaded["base"], 3)):
        assert codecs[topic] == {CODECS[i][1]}
    assert codecs[offloaded["plain"]] == {CompressionType.SNAPPY}
    # Entry by entry, exactly what the broker holds (its bytes), with its message count and publish time as the
    # message rows gave them.
    assert {r["topic"] for r in entries} == set(offloaded["sent"])
    for topic, sent in offloaded["sent"].items():
        rows = [r for r in by_position if r["topic"] == topic]
        assert [(r["ledger_id"], r["entry_id"], bytes(r["entry"])) for r in rows] == offloaded["held"][topic], topic
        in_entry: dict[tuple[int, int], list[dict[str, Any]]] = {}
        for message in got[topic]:
            in_entry.setdefault((message["__ledgerId"], message["__entryId"]), []).append(message)
        assert [r["num_messages"] for r in rows] == [len(in_entry[r["ledger_id"], r["entry_id"]]) for r in rows]
        published = [{ms(m["__publishTime"]) for m in in_entry[r["ledger_id"], r["entry_id"]]} for r in rows]
        assert [{ms(r["publish_time"])} for r in rows] == published, topic
        assert sum(r["num_messages"] for r in rows) == len(sent)


def test_time_and_position_bounds(spark: Any, offloaded: dict[str, Any]) -> None:
    from pyspark.sql import functions as F

    store, base = offloaded["store"], offloaded["base"]
    everything = rows_of(read(spark, store, base))
    times = sorted({ms(r["__publishTime"]) for r in everything})
    assert len(times) > 4
    lo, hi = times[len(times) // 4], times[3 * len(times) // 4]
    want = sorted(
        (r["__topic"], r["__ledgerId"], r["__entryId"], r["__batchIndex"])
        for r in everything
        if lo <= ms(r["__publishTime"]) < hi
    )
    assert 0 < len(want) < len(everything)

    def keys(rows: list[Any]) -> list[tuple[str, int, int, int]]:
        return sorted((r["__topic"], r["__ledgerId"], r["__entryId"], r["__batchIndex"]) for r in rows)

    assert keys(rows_of(read(spark, store, base, startingTime=str(lo), endingTime=str(hi)))) == want
    iso = datetime.fromtimestamp(lo / 1000, UTC).isoformat()
    assert keys(rows_of(read(spark, store, base, startingTime=iso, endingTime=str(hi)))) == want
    lo_ts = datetime.fromtimestamp(lo / 1000, UTC)
    hi_ts = datetime.fromtimestamp(hi / 1000, UTC)
    pushed = read(spark, store, base).where((F.col("__publishTime") >= lo_ts) & (F.col("__publishTime") < hi_ts))
    assert keys(rows_of(pushed)) == want

    # Positions: startingOffsets is the last position processed, endingOffsets the last one read.
    p0 = partition_names(base, 3)[0]
    rows0 = [
        r
        for r in sorted(everything, key=lambda r: (r["__ledgerId"], r["__entryId"], r["__batchIndex"]))
        if r["__topic"] == p0
    ]
    entries0 = sorted({(r["__ledgerId"], r["__entryId"]) for r in rows0})
    after, last = entries0[2], entries0[-3]
    bounded = rows_of(
        read(
            spark,
            store,
            base,
            startingOffsets=f'{{"{p0}": [{after[0]}, {after[1]}]}}',
            endingOffsets=f'{{"{p0}": [{last[0]}, {last[1]}], "*": "latest"}}',
        )
    )
    want0 = [k for k in keys(everything) if k[0] != p0 or after < (k[1], k[2]) <= last]
    assert keys(bounded) == want0

    # One message by its id (pushed down to a topic-partition and a position: one segment read).
    target = rows0[len(rows0) // 2]
    one = read(spark, store, base).where((F.col("__topic") == p0) & (F.col("__messageId") == target["__messageId"]))
    assert [(r["__topic"], r["value"]) for r in rows_of(one)] == [(p0, target["value"])]
    assert one.rdd.getNumPartitions() == 1
    by_position = read(spark, store, base).where(
        (F.col("__ledgerId") == target["__ledgerId"])
        & (F.col("__entryId") == target["__entryId"])
        & (F.col("__batchIndex") == target["__batchIndex"])
    )
    assert [r["__messageId"] for r in rows_of(by_position)] == [target["__messageId"]]


def test_missing_store_and_topic_are_clear_errors(spark: Any, offloaded: dict[str, Any], tmp_path: Path) -> None:
    with pytest.raises(Exception, match=r"no store at .*nowhere: the directory does not exist"):
        rows_of(read(spark, f"file://{tmp_path}/nowhere", "t"))
    with pytest.raises(Exception, match="topic persistent://public/default/absent has no offloaded data"):
        rows_of(read(spark, offloaded["store"], "absent"))
    with pytest.raises(Exception, match="option output: expected messages or entries"):
        rows_of(read(spark, offloaded["store"], "absent", output="rows"))


@pytest.mark.s3
def test_s3_store(spark: Any, pulsar_broker: Any, tmp_path: Path, moto_server: str, s3_bucket: str) -> None:
    topic = unique_topic("df-s3")
    sent = publish(pulsar_broker.service_url, topic, pulsar.CompressionType.ZSTD, True, 0)
    store = (
        f'[store]\nmanagedLedgerOffloadDriver = "s3"\nbucket = "{s3_bucket}"\nprefix = "tier/v1"\n'
        f'serviceEndpoint = "{moto_server}"\nregion = "us-east-1"\npathStyle = true'
    )
    extra = SMALL_SEGMENTS.replace("8192", "65536")
    config_path = write_config(tmp_path, pulsar_broker.service_url, [topic], store, extra)
    config = load_config(config_path)
    OffloadJob(config, str(config_path)).run_once(spark)
    df = read(spark, f"s3://{s3_bucket}/tier/v1", topic, **{"s3.endpoint": moto_server, "s3.region": "us-east-1"})
    check_rows(topic, by_topic(rows_of(df))[topic], sent)


def test_a_corrupt_object_fails_the_query_naming_object_and_offset(spark: Any, tmp_path: Path) -> None:
    from streamoffload.checkpoints.metadata_store import MetadataStore
    from streamoffload.storage.filesystem import FilesystemStore
    from tests.dataframe.synthetic import build_topic

    store = FilesystemStore(str(tmp_path))
    topic = "persistent://public/default/df-corrupt"
    # Entries without the 0x0e01 section (as pulsar-lite delivers them): only the recorded CRC covers them.
    sent, _ = build_topic(ScopedStore(store), topic, entries=200, batch=3, checksummed=False)
    segments = MetadataStore(ScopedStore(store)).offloaded_segments(topic)
    victim = segments[len(segments) // 2]
    path = tmp_path / victim.dataKey
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    df = read(spark, f"file://{tmp_path}", topic)
    with pytest.raises(Exception, match=rf"{victim.dataKey}.*offset \d+|offset \d+.*{victim.dataKey}"):
        df.count()
    # Bounds that leave the corrupt segment out read the rest: every message before it, exactly.
    before = f'{{"{topic}": [{victim.startLedgerId}, {victim.startEntryId - 1}]}}'
    got = rows_of(read(spark, f"file://{tmp_path}", topic, endingOffsets=before))
    want = [
        (s.ledger_id, s.entry_id, s.batch_index, s.payload)
        for s in sent
        if (s.ledger_id, s.entry_id) < (victim.startLedgerId, victim.startEntryId)
    ]
    assert want and sorted((r["__ledgerId"], r["__entryId"], r["__batchIndex"], r["value"]) for r in got) == want
