"""The planner and reader behind ``pulsar-offloaded`` (``read.dataset_read``), without Spark, on
stores of known messages (``tests.dataframe.synthetic``); and the Spark source's option errors."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamoffload.checkpoints.metadata_store import MetadataStore
from streamoffload.codecs.entry import (
    KeyValue,
    Message,
    MessageMetadata,
    SingleMessageMetadata,
    build_entry,
    decode_entry,
    encode_entry,
)
from streamoffload.codecs.errors import ChecksumError, FormatError
from streamoffload.codecs.proto.pulsar_api_pb2 import MessageIdData
from streamoffload.errors import ConfigError
from streamoffload.read import dataset_plan as ofp
from streamoffload.read import dataset_read as ofr
from streamoffload.read.segment import TopicNotOffloadedError
from streamoffload.storage import keys
from streamoffload.storage.filesystem import FilesystemStore
from streamoffload.storage.location import ScopedStore, parse_store_url
from tests.dataframe.synthetic import CountingStore, Sent, build_topic

BASE = "persistent://public/default/orders"
P0, P1 = f"{BASE}-partition-0", f"{BASE}-partition-1"
AUDIT = "persistent://public/default/audit"


@pytest.fixture(scope="module")
def store_dir(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, list[Sent]]]:
    root = tmp_path_factory.mktemp("offloaded")
    store = FilesystemStore(str(root))
    sent = {
        # batches of 4 across two ledgers, several segments of several blocks
        P0: build_topic(ScopedStore(store), P0, entries=600, batch=4, entries_per_ledger=250, seed=1)[0],
        P1: build_topic(ScopedStore(store), P1, entries=300, batch=4, entries_per_ledger=1000, seed=2)[0],
        AUDIT: build_topic(ScopedStore(store), AUDIT, entries=400, batch=1, seed=3, first_publish_ms=1_700_000_100_000)[
            0
        ],
    }
    return root, sent


def read_all(store: Any, tasks: list[ofp.ReadTask], **kwargs: Any) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    names = ofr.ENTRY_COLUMNS if kwargs.get("output") == ofr.OUTPUT_ENTRIES else ofr.MESSAGE_COLUMNS
    for task in tasks:
        for batch in ofr.read_task(ScopedStore(store), task, **kwargs):
            out += ofr.rows(batch, names)
    return out


def expected_row(topic: str, s: Sent, batch: int) -> dict[str, Any]:
    partition = int(topic.rsplit("-", 1)[1]) if "-partition-" in topic else -1
    return {
        "value": s.payload,
        "__key": None if s.key is None else s.key.encode(),
        "__topic": topic,
        "__messageId": ofr.message_id(s.ledger_id, s.entry_id, partition, s.batch_index, batch),
        "__publishTime": s.publish_time,
        "__eventTime": s.event_time or None,
        "__messageProperties": list(s.properties.items()),
        "__ledgerId": s.ledger_id,
        "__entryId": s.entry_id,
        "__batchIndex": s.batch_index,
        "__sequenceId": s.sequence_id,
        "__producerName": "synthetic",
    }


def test_every_message_and_column_across_split_segments(store_dir: tuple[Path, dict[str, list[Sent]]]) -> None:
    root, sent = store_dir
    store = FilesystemStore(str(root))
    topics = ofp.resolve_topics(MetadataStore(ScopedStore(store)), [BASE, AUDIT])
    assert topics == [AUDIT, P0, P1]  # the partitioned topic expands to its partitions in the store
    whole = ofp.plan(ScopedStore(store), topics, {})
    split = ofp.plan(ScopedStore(store), topics, {}, max_partition_bytes=20_000)
    assert len(split) > len(whole)  # large segments are read by several tasks, a run of blocks each
    assert any(t.first_block > 0 for t in split)
    for tasks in (whole, split):
        got = read_all(store, tasks)
        want = [expected_row(t, s, 4 if t != AUDIT else 0) for t in topics for s in sent[t]]
        assert got == want


def test_small_tasks_are_packed_in_order_up_to_max_bytes_each_counted_with_its_open_cost() -> None:
    def task(n: int, size: int) -> ofp.ReadTask:
        return ofp.ReadTask(f"t{n}", b"", None, None, data_bytes=size)

    tasks = [task(0, 10), task(1, 20), task(2, 30), task(3, 0), task(4, 5), task(5, 100), task(6, 1)]
    sizes = [[t.data_bytes for t in group] for group in ofp.pack_tasks(tasks, max_bytes=70, open_cost=5)]
    # 10+5 + 20+5 + 30+5 = 75 > 70; a task of unknown size (0) alone; one above the bound alone
    assert sizes == [[10, 20], [30], [0], [5], [100], [1]]
    assert [[t.topic for t in g] for g in ofp.pack_tasks(tasks, 1 << 20, 0)] == [
        ["t0", "t1", "t2"],
        ["t3"],
        ["t4", "t5", "t6"],
    ]
    assert ofp.pack_tasks([], 70, 5) == []


def test_spark_partitions_of_packed_small_segments_read_every_row_once(
    store_dir: tuple[Path, dict[str, list[Sent]]],
) -> None:
    pytest.importorskip("pyspark")
    from pyspark.sql.pandas.types import from_arrow_schema

    from streamoffload.streaming.source.offloaded_source import OffloadedOptions, OffloadedReader

    root, sent = store_dir
    store = FilesystemStore(str(root))
    topics = [AUDIT, P0, P1]
    want = read_all(store, ofp.plan(ScopedStore(store), topics, {}))
    assert len(want) == sum(len(sent[t]) for t in topics)
    schema = from_arrow_schema(ofr.MESSAGE_ARROW_SCHEMA)
    for options, packed in (
        ({}, True),
        ({"openCostInBytes": str(1 << 30)}, False),
        ({"endingTime": "4102444800000"}, True),
    ):
        reader = OffloadedReader(
            OffloadedOptions.parse({"store": str(root), "topics": f"{BASE},{AUDIT}", **options}), schema
        )
        partitions = reader.partitions()
        tasks = [t for p in partitions for t in p.tasks]  # type: ignore[attr-defined]
        assert len(tasks) == len(ofp.plan(ScopedStore(store), topics, {}))
        assert (len(partitions) < len(tasks)) == packed
        got = [row for p in partitions for batch in reader.read(p) for row in ofr.rows(batch, ofr.MESSAGE_COLUMNS)]
        assert got == want  # every message once, in order, read by read_tasks or (a time bound) read_task


def test_message_id_is_pulsars_serialized_message_id_data() -> None:
    batched = MessageIdData.FromString(ofr.message_id(7, 9, 2, 3, 10))
    assert (batched.ledgerId, batched.entryId, batched.partition, batched.batch_index, batched.batch_size) == (
        7,
        9,
        2,
        3,
        10,
    )
    single = MessageIdData.FromString(ofr.message_id(7, 9, -1, -1, 0))
    assert not single.HasField("partition") and not single.HasField("batch_index")
    assert not single.HasField("batch_size")
    # Field numbers of upstream PulsarApi.proto: ledgerId 1, entryId 2, partition 3, batch_index 4, batch_size 6.
    assert ofr.message_id(1, 2, 3, 4, 5) == bytes([0x08, 1, 0x10, 2, 0x18, 3, 0x20, 4, 0x30, 5])


@pytest.mark.parametrize("lo_i, hi_i", [(0, 1), (130, 410), (598, 600), (250, 251)])
def test_time_bounds_return_exactly_the_messages_inside(
    store_dir: tuple[Path, dict[str, list[Sent]]], lo_i: int, hi_i: int
) -> None:
    root, sent = store_dir
    store = CountingStore(FilesystemStore(str(root)))
    entries = sorted({s.publish_time for s in sent[P0]})
    times = ofp.TimeBounds(entries[lo_i], entries[hi_i] if hi_i < len(entries) else None)
    tasks = ofp.plan(ScopedStore(store), [P0], {}, times, skew_ms=0, max_partition_bytes=20_000)
    got = read_all(store, tasks, times=times, skew_ms=0)
    want = [expected_row(P0, s, 4) for s in sent[P0] if times.contains(s.publish_time)]
    assert got == want


def test_pruned_segments_are_never_opened_and_reads_start_at_the_bound_block(
    store_dir: tuple[Path, dict[str, list[Sent]]],
) -> None:
    root, sent = store_dir
    fs = FilesystemStore(str(root))
    segments = MetadataStore(ScopedStore(fs)).offloaded_segments(P0)
    total = sum(s.dataLength for s in segments)
    middle = segments[len(segments) // 2]
    store = CountingStore(fs)
    # A window of ten entries in the middle of one segment, past its first block.
    inside = sorted({s.publish_time for s in sent[P0] if mf_contains(middle, s)})
    lo = inside[len(inside) // 2]
    times = ofp.TimeBounds(lo, inside[len(inside) // 2 + 10])
    tasks = ofp.plan(ScopedStore(store), [P0], {}, times, skew_ms=0)
    assert [t.segment.dataKey for t in tasks] == [middle.dataKey]
    got = read_all(store, tasks, times=times, skew_ms=0)
    assert len(got) == 40  # ten entries of four messages
    opened = {key for key in store.read if not key.split("/")[-1].startswith("_") and "/_meta/" not in key}
    records = {key for key in opened if key.startswith(keys.block_checksums_prefix(middle.dataKey))}
    assert opened - records == {middle.dataKey, middle.indexKey}
    # Only the blocks read had their checksum records read.
    assert 0 < len(records) <= 3 < middle.blockCount, (records, middle.blockCount)
    data_read = store.read[middle.dataKey]
    assert data_read < middle.dataLength / 2, (data_read, middle.dataLength)
    assert data_read < total / 10


def mf_contains(segment: Any, s: Sent) -> bool:
    return (
        (segment.startLedgerId, segment.startEntryId)
        <= (s.ledger_id, s.entry_id)
        <= (segment.endLedgerId, segment.endEntryId)
    )


def test_position_bounds_as_the_live_source_offsets(store_dir: tuple[Path, dict[str, list[Sent]]]) -> None:
    root, sent = store_dir
    store = FilesystemStore(str(root))
    ledgers = sorted({s.ledger_id for s in sent[P0]})
    # startingOffsets: the last position already processed; endingOffsets: the last position read.
    start = ofp.start_bound((ledgers[0], 100), P0)
    end = ofp.end_bound((ledgers[1], 20), P0)
    assert (start, end) == ((ledgers[0], 101), (ledgers[1], 20))
    bounds = {P0: ofp.PositionBounds(start, end)}
    got = read_all(store, ofp.plan(ScopedStore(store), [P0], bounds, max_partition_bytes=20_000))
    assert got == [expected_row(P0, s, 4) for s in sent[P0] if start <= (s.ledger_id, s.entry_id) <= end]
    # [L, -1] starts at ledger L's first entry; an end [L, -1] ends before ledger L.
    assert ofp.start_bound((ledgers[1], -1), P0) == (ledgers[1], 0)
    before_second = ofp.PositionBounds(None, ofp.end_bound((ledgers[1], -1), P0))
    got = read_all(store, ofp.plan(ScopedStore(store), [P0], {P0: before_second}))
    assert {r["__ledgerId"] for r in got} == {ledgers[0]}
    assert ofp.spec_for({"*": "earliest", BASE: (3, 4)}, P1) == (3, 4)  # a partitioned topic's entry applies


def test_entries_output_and_encrypted_entries(tmp_path: Path) -> None:
    store = FilesystemStore(str(tmp_path))
    topic = "persistent://public/default/secret"
    sent, _ = build_topic(ScopedStore(store), topic, entries=50, batch=2, encrypted=frozenset({30}))
    tasks = ofp.plan(ScopedStore(store), [topic], {})
    entries = read_all(store, tasks, output=ofr.OUTPUT_ENTRIES)
    assert [(r["ledger_id"], r["entry_id"]) for r in entries] == sorted({(s.ledger_id, s.entry_id) for s in sent})
    assert all(r["num_messages"] == 2 and r["topic"] == topic for r in entries)
    assert entries[30]["publish_time"] == sent[60].publish_time
    encrypted = r"entry 3:30 of .*secret is end-to-end encrypted.*output=entries"
    with pytest.raises(ofr.EncryptedEntryError, match=encrypted):
        read_all(store, tasks)
    # Bounds that leave the encrypted entry out read fine.
    ok = read_all(store, ofp.plan(ScopedStore(store), [topic], {topic: ofp.PositionBounds(None, (3, 29))}))
    assert len(ok) == 60


@pytest.mark.parametrize("checksummed", [True, False], ids=["with-0x0e01", "without-0x0e01"])
def test_a_corrupt_data_object_fails_naming_object_and_offset(tmp_path: Path, checksummed: bool) -> None:
    store = FilesystemStore(str(tmp_path))
    topic = "persistent://public/default/corrupt"
    build_topic(ScopedStore(store), topic, entries=100, batch=1, segment_bytes=1 << 20, checksummed=checksummed)
    [segment] = MetadataStore(ScopedStore(store)).offloaded_segments(topic)
    path = tmp_path / segment.dataKey
    data = bytearray(path.read_bytes())
    data[5000] ^= 0x40
    path.write_bytes(bytes(data))
    with pytest.raises(FormatError) as err:
        read_all(store, ofp.plan(ScopedStore(store), [topic], {}))
    assert isinstance(err.value, ChecksumError) or "offset" in str(err.value)
    assert segment.dataKey in str(err.value)


def test_a_missing_store_or_topic_is_a_clear_error(
    store_dir: tuple[Path, dict[str, list[Sent]]], tmp_path: Path
) -> None:
    root, _ = store_dir
    with pytest.raises(ConfigError, match=r"no store at .*nowhere: the directory does not exist"):
        parse_store_url(f"file://{tmp_path}/nowhere").open(create=False)
    metadata = MetadataStore(ScopedStore(FilesystemStore(str(root))))
    with pytest.raises(
        TopicNotOffloadedError,
        match=r"topic persistent://public/default/nope has no offloaded data in "
        r".*\(topics with offloaded data: .*audit",
    ):
        ofp.resolve_topics(metadata, ["nope"])
    assert ofp.resolve_topics(metadata, [], ("public/default", re.compile("ord.*"))) == [P0, P1]
    with pytest.raises(TopicNotOffloadedError, match=r"topicsPattern public/default/x.* has no offloaded data"):
        ofp.resolve_topics(metadata, [], ("public/default", re.compile("x.*")))


def test_option_errors_name_the_option() -> None:
    pytest.importorskip("pyspark")
    from streamoffload.streaming.source.offloaded_source import OffloadedOptions

    good = {"store": "/tmp/x", "topics": "a"}
    cases = [
        ({"topics": "a"}, "option store is required"),
        ({"store": "/x"}, "give exactly one of the options topics"),
        ({**good, "startingOffsets": "latest"}, "option startingOffsets: 'latest' is not a start"),
        ({**good, "endingOffsets": '{"a": [1]}'}, "option endingOffsets: 'a': expected \\[ledgerId, entryId\\]"),
        ({**good, "startingTime": "yesterday"}, "option startingTime: expected milliseconds since the epoch"),
        ({**good, "output": "rows"}, "option output: expected messages or entries"),
        ({**good, "publishTimeSkewMs": "-1"}, "option publishTimeSkewMs"),
        ({**good, "maxMessageSize": "0"}, "option maxMessageSize must be positive, got '0'"),
        (
            {**good, "openCostInBytes": "-1"},
            "option openCostInBytes: expected a byte count like 1048576, 64m or 1GiB, got '-1'",
        ),
    ]
    for options, message in cases:
        with pytest.raises(ConfigError, match=message):
            OffloadedOptions.parse(options)
    parsed = OffloadedOptions.parse({**good, "STARTINGTIME": "2026-03-01T00:00:00Z", "endingTime": "1772409600000"})
    assert parsed.times == ofp.TimeBounds(1772323200000, 1772409600000)
    assert parsed.max_message_size == 5 * 1024 * 1024  # Pulsar's broker default
    assert OffloadedOptions.parse({**good, "maxMessageSize": "8m"}).max_message_size == 8 * 1024 * 1024


def test_pushed_filters_become_pruning_bounds() -> None:
    pytest.importorskip("pyspark")
    from datetime import UTC, datetime

    from pyspark.sql.datasource import EqualTo, GreaterThan, GreaterThanOrEqual, In, IsNotNull, LessThan

    from streamoffload.streaming.source.offloaded_source import PushedBounds

    pushed = PushedBounds()
    columns = ofr.MESSAGE_COLUMNS
    noon = datetime(2026, 3, 1, 12, tzinfo=UTC)
    for f in [
        GreaterThanOrEqual(("__publishTime",), noon),
        LessThan(("__publishTime",), datetime(2026, 3, 1, 13, tzinfo=UTC)),
        In(("__topic",), ("a", "b")),
        EqualTo(("__topic",), "b"),
        EqualTo(("__ledgerId",), 12),
        GreaterThan(("__entryId",), 4),
        LessThan(("__entryId",), 9),
        IsNotNull(("__key",)),
    ]:
        pushed.add(f, columns)
    assert pushed.times == ofp.TimeBounds(1772366400000, 1772370000001)  # whole ms, Spark re-checks the rows
    assert pushed.topics == {"b"}
    assert pushed.positions == ofp.PositionBounds((12, 5), (12, 8))
    by_id = PushedBounds()
    by_id.add(EqualTo(("__messageId",), ofr.message_id(7, 3, 0, 2, 10)), columns)
    assert by_id.positions == ofp.PositionBounds((7, 3), (7, 3))
    entries = PushedBounds()
    entries.add(GreaterThan(("ledger_id",), 4), ofr.ENTRY_COLUMNS)
    entries.add(GreaterThan(("__ledgerId",), 9), ofr.ENTRY_COLUMNS)  # not a column of entries: ignored
    assert entries.positions == ofp.PositionBounds((5, 0), None)


@settings(max_examples=200, deadline=None)
@given(
    st.integers(0, 2**63 - 1),
    st.integers(0, 2**63 - 1),
    st.integers(-1, 2**31 - 1),
    st.integers(1, 300),
)
def test_message_ids_built_per_entry_are_message_id(ledger: int, entry: int, partition: int, size: int) -> None:
    batch = ofr._MessageBatch("t", partition)
    messages = [Message(b"", key=None) for _ in range(size)]
    batch.add(ledger, entry, decode_entry(build_entry(messages, producer_name="p", sequence_id=0, publish_time=1)), "")
    batched = size > 1  # build_entry batches more than one message
    want = [ofr.message_id(ledger, entry, partition, i if batched else -1, size if batched else 0) for i in range(size)]
    assert batch.ids == want


def test_null_values_keys_and_event_times_in_the_arrow_batch() -> None:
    singles = [
        SingleMessageMetadata(payload_size=2, partition_key="k", event_time=5),
        SingleMessageMetadata(payload_size=0, null_value=True, properties=[KeyValue(key="a", value="b")]),
        SingleMessageMetadata(payload_size=1),
    ]
    payloads = [b"xy", b"", b"z"]
    body = b"".join(
        len(s.SerializeToString()).to_bytes(4, "big") + s.SerializeToString() + p
        for s, p in zip(singles, payloads, strict=True)
    )
    md = MessageMetadata(producer_name="p", sequence_id=4, publish_time=1_000, num_messages_in_batch=3)
    single = build_entry(
        [Message(b"solo", key="s", event_time=9)], producer_name="q", sequence_id=8, publish_time=2_000
    )
    batch = ofr._MessageBatch("persistent://public/default/t-partition-3", 3)
    batch.add(7, 1, decode_entry(encode_entry(md, body)), "")
    batch.add(7, 2, decode_entry(single), "")
    arrow = batch.to_arrow()
    assert arrow.schema.equals(ofr.MESSAGE_ARROW_SCHEMA)
    got = ofr.rows(arrow)
    assert [r["value"] for r in got] == [b"xy", None, b"z", b"solo"]
    assert [r["__key"] for r in got] == [b"k", None, None, b"s"]
    assert [r["__eventTime"] for r in got] == [5, None, None, 9]
    assert [r["__publishTime"] for r in got] == [1_000, 1_000, 1_000, 2_000]
    assert [r["__messageProperties"] for r in got] == [[], [("a", "b")], [], []]
    assert [(r["__ledgerId"], r["__entryId"], r["__batchIndex"]) for r in got] == [
        (7, 1, 0),
        (7, 1, 1),
        (7, 1, 2),
        (7, 2, -1),
    ]
    assert [r["__sequenceId"] for r in got] == [4, 4, 4, 8]
    assert [r["__producerName"] for r in got] == ["p", "p", "p", "q"]
    assert got[3]["__messageId"] == ofr.message_id(7, 2, 3, -1, 0)
