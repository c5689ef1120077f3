"""``codecs.entry_columns.append_messages`` (the column-wise split behind the ``pulsar-offloaded`` reader)
gives exactly what ``codecs.entry.entry_messages`` gives, field by field, and the same errors."""

from __future__ import annotations

import base64
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamoffload.codecs.compression import compress
from streamoffload.codecs.entry import (
    CompressionType,
    KeyValue,
    Message,
    MessageMetadata,
    SingleMessageMetadata,
    build_entry,
    decode_entry,
    encode_entry,
    entry_messages,
)
from streamoffload.codecs.entry_columns import MessageColumns, append_messages
from streamoffload.codecs.errors import FormatError


def expected(entry: bytes) -> list[dict[str, Any]]:
    """What a reader makes of ``entry_messages``: one dict per message."""
    out = []
    for m in entry_messages(entry):
        key = None if m.key is None else base64.b64decode(m.key) if m.key_b64_encoded else m.key.encode()
        out.append(
            {
                "value": None if m.null_value else bytes(m.payload),
                "key": key,
                "event_time": m.event_time,
                "sequence_id": m.sequence_id,
                "batch_index": m.batch_index,
                "properties": list(m.properties.items()),
                "publish_time": m.publish_time,
                "producer_name": m.producer_name,
                "size": len(m.payload),
            }
        )
    return out


def columns_of(entries: list[bytes]) -> list[dict[str, Any]]:
    cols = MessageColumns()
    for entry in entries:
        append_messages(decode_entry(entry), cols)
    per_entry = [
        (p, n) for p, n, c in zip(cols.publish_times, cols.producer_names, cols.counts, strict=True) for _ in range(c)
    ]
    assert len(per_entry) == cols.messages == len(cols.keys) == len(cols.value_sizes)
    assert len(cols.prop_offsets) == cols.messages + 1
    assert len(cols.batch_indexes) == len(cols.event_times) == len(cols.sequence_ids) == cols.messages
    out = [
        {
            "value": cols.value(i),
            "key": cols.keys[i],
            "event_time": cols.event_times[i],
            "sequence_id": cols.sequence_ids[i],
            "batch_index": cols.batch_indexes[i],
            "properties": cols.properties(i),
            "publish_time": per_entry[i][0],
            "producer_name": per_entry[i][1],
            "size": cols.value_sizes[i],
        }
        for i in range(cols.messages)
    ]
    # A null value is stored empty: its size is its payload's in entry_messages, not the stored one.
    assert cols.payload_bytes == sum(e["size"] for entry in entries for e in expected(entry))
    for row in out:
        del row["size"]
    return out


def without_size(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if k != "size"} for r in rows]


def test_batch_sizes_count_batched_entries_only() -> None:
    cols = MessageColumns()
    batched = build_entry([Message(b"a"), Message(b"b")], producer_name="p", sequence_id=1, publish_time=5)
    single = build_entry([Message(b"c")], producer_name="p", sequence_id=3, publish_time=6)
    assert append_messages(decode_entry(batched), cols) == 2
    assert append_messages(decode_entry(single), cols) == 1
    assert (cols.counts, cols.batch_sizes, cols.batch_indexes) == ([2, 1], [2, 0], [0, 1, -1])


texts = st.text(max_size=8)
messages = st.builds(
    Message,
    payload=st.binary(max_size=64),
    key=st.none() | texts,
    properties=st.dictionaries(texts, texts, max_size=3),
    event_time=st.sampled_from([0, 1, 1_700_000_000_123]),
    sequence_id=st.none() | st.integers(0, 2**40),
)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.tuples(st.lists(messages, min_size=1, max_size=6), st.booleans()), min_size=1, max_size=4),
)
def test_same_messages_as_entry_messages(batches: list[tuple[list[Message], bool]]) -> None:
    entries = [
        build_entry(msgs[:1] if not batched else msgs, producer_name="prod", sequence_id=7, publish_time=1000 + i)
        for i, (msgs, batched) in enumerate(batches)
    ]
    assert columns_of(entries) == without_size([m for e in entries for m in expected(e)])


def _batch_entry(singles: list[tuple[SingleMessageMetadata, bytes]], **metadata: Any) -> tuple[bytes, MessageMetadata]:
    parts = b"".join(
        len(s.SerializeToString()).to_bytes(4, "big") + s.SerializeToString() + payload for s, payload in singles
    )
    md = MessageMetadata(
        producer_name="p", sequence_id=40, publish_time=9, num_messages_in_batch=len(singles), **metadata
    )
    return parts, md


def test_unusual_fields_null_values_b64_keys_fallbacks_and_repeated_properties() -> None:
    singles = [
        (SingleMessageMetadata(payload_size=3, partition_key="k", null_partition_key=True), b"abc"),
        (SingleMessageMetadata(payload_size=0, null_value=True), b""),
        (
            SingleMessageMetadata(
                payload_size=2, partition_key=base64.b64encode(b"\x00\xff").decode(), partition_key_b64_encoded=True
            ),
            b"xy",
        ),
        (SingleMessageMetadata(payload_size=1, partition_key="", event_time=0, sequence_id=0), b"z"),
        (
            SingleMessageMetadata(
                payload_size=1,
                properties=[KeyValue(key="a", value="1"), KeyValue(key="b", value="2"), KeyValue(key="a", value="3")],
            ),
            b"w",
        ),
    ]
    payload, md = _batch_entry(singles, event_time=77)
    entry = encode_entry(md, payload)
    got = columns_of([entry])
    assert got == without_size(expected(entry))
    assert [r["key"] for r in got] == [None, None, b"\x00\xff", b"", None]
    assert [r["value"] for r in got][:2] == [b"abc", None]
    assert got[3]["event_time"] == 0 and got[3]["sequence_id"] == 0  # set to 0: not the entry's
    assert got[4]["event_time"] == 77 and got[4]["sequence_id"] == 40  # unset: the entry's
    assert got[4]["properties"] == [("a", "3"), ("b", "2")]


@pytest.mark.parametrize(
    "codec", [CompressionType.LZ4, CompressionType.ZLIB, CompressionType.ZSTD, CompressionType.SNAPPY]
)
def test_compressed_batches(codec: int) -> None:
    singles = [
        (SingleMessageMetadata(payload_size=5, partition_key=f"k{i}", sequence_id=i, event_time=i), b"%05d" % i)
        for i in range(20)
    ]
    payload, md = _batch_entry(singles, compression=codec, uncompressed_size=0)
    md.uncompressed_size = len(payload)
    entry = encode_entry(md, compress(codec, payload))
    assert columns_of([entry]) == without_size(expected(entry))


def test_errors_are_split_messages_errors_and_leave_the_columns_as_they_were() -> None:
    good = build_entry([Message(b"a", key="x"), Message(b"b")], producer_name="p", sequence_id=1, publish_time=5)
    singles = [(SingleMessageMetadata(payload_size=3), b"abc"), (SingleMessageMetadata(payload_size=9), b"def")]
    payload, md = _batch_entry(singles)
    bad = encode_entry(md, payload)  # the second message runs past the end of the batch
    bad_utf8 = SingleMessageMetadata(payload_size=1)
    raw = bad_utf8.SerializeToString() + bytes([0x12, 2, 0xC3, 0x28])  # partition_key: invalid UTF-8
    bad_key = encode_entry(
        MessageMetadata(producer_name="p", sequence_id=1, publish_time=1, num_messages_in_batch=1),
        len(raw).to_bytes(4, "big") + raw + b"q",
    )
    for broken in (bad, bad_key, good[:-1]):
        cols = MessageColumns()
        append_messages(decode_entry(good), cols)
        before = columns_of([good])
        with pytest.raises(FormatError) as want:
            entry_messages(broken, verify_checksum=False)
        with pytest.raises(type(want.value)) as got:
            append_messages(decode_entry(broken, verify_checksum=False), cols)
        assert str(got.value) == str(want.value)
        assert cols.messages == 2 and cols.counts == [2] and len(cols.value_parts) == 1
        assert len(cols.keys) == len(cols.event_times) == len(cols.sequence_ids) == len(cols.value_sizes) == 2
        assert len(cols.prop_offsets) == 3
        assert before == columns_of([good])
