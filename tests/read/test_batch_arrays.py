"""``read.batch_arrays.split_batches``, the vectorized split behind the ``pulsar-offloaded`` reader, against the
entry-by-entry split (``codecs.entry_columns.append_messages``, itself checked against ``split_messages``):
whenever it gives columns they are the same Arrow arrays, byte for byte; whenever the entry-by-entry split
raises, it gives None (the reader then splits one by one and raises that error).

Batches are written at the wire level here (fields in any order, repeated, unknown, with odd varints, bools
and strings), besides the protobuf runtime's own encoding, so that what the small decoder reads is what
protobuf reads."""

from __future__ import annotations

import base64
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
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
)
from streamoffload.read import dataset_read as ofr
from streamoffload.read.batch_arrays import split_batches

TOPIC = "persistent://public/default/t-partition-2"


def varint(value: int, pad: int = 0) -> bytes:
    """``value`` as a protobuf varint, with ``pad`` needless continuation bytes (still the same value)."""
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value or pad:
            out.append(byte | 0x80)
            if not value:
                out.extend([0x80] * (pad - 1) + [0])
                break
        else:
            out.append(byte)
            break
    return bytes(out)


def field(number: int, wire: int, body: bytes) -> bytes:
    return varint(number << 3 | wire) + body


def length_delimited(number: int, data: bytes) -> bytes:
    return field(number, 2, varint(len(data)) + data)


def batch_entry(records: list[tuple[bytes, bytes]], count: int | None = None, **metadata: Any) -> bytes:
    """An entry of ``[u32 k][k bytes of metadata][payload]`` records, as written (nothing checked)."""
    body = b"".join(len(meta).to_bytes(4, "big") + meta + payload for meta, payload in records)
    md = MessageMetadata(
        producer_name="prod",
        sequence_id=metadata.pop("sequence_id", 40),
        publish_time=metadata.pop("publish_time", 1_700_000_000_000),
        num_messages_in_batch=len(records) if count is None else count,
        **metadata,
    )
    return encode_entry(md, body)


def both(entries: list[bytes]) -> tuple[pa.RecordBatch | BaseException, pa.RecordBatch | BaseException | None]:
    """(the entry-by-entry batch, or what it raised; the vectorized batch, or what building it raised, or None
    when the vectorized split declined)."""
    batch = ofr._MessageBatch(TOPIC, 2)
    for i, entry in enumerate(entries):
        batch.add(7, i, decode_entry(entry), f"entry {i}")
    try:
        cols, sizes = batch._one_by_one()
        reference: pa.RecordBatch | BaseException = batch._from_columns(cols, sizes)
    except Exception as exc:  # any error: the fast path must then decline
        reference = exc
    if batch._split() is None:
        return reference, None
    try:
        return reference, batch.to_arrow()
    except Exception as exc:  # building the batch from split columns: only what the reference raises too
        return reference, exc


def assert_same(entries: list[bytes], *, fast_expected: bool) -> None:
    reference, fast = both(entries)
    if fast is None:
        assert not fast_expected, f"the vectorized split declined: {reference!r}"
        return
    if isinstance(fast, BaseException):  # a time that does not fit a timestamp: the same error both ways
        assert isinstance(reference, BaseException) and type(fast) is type(reference), (fast, reference)
        assert str(fast) == str(reference)
        return
    assert not isinstance(reference, BaseException), f"vectorized rows where the split raises {reference!r}"
    assert fast.schema.equals(ofr.MESSAGE_ARROW_SCHEMA)
    for name, want, got in zip(fast.schema.names, reference.columns, fast.columns, strict=True):
        assert got.equals(want), (name, want, got)
    assert ofr.rows(fast) == ofr.rows(reference)


texts = st.text(max_size=6)
regular_messages = st.builds(
    Message,
    payload=st.binary(max_size=40),
    key=st.none() | texts,
    properties=st.dictionaries(texts, texts, max_size=3),
    event_time=st.sampled_from([0, 1, 1_700_000_000_123]),
    sequence_id=st.none() | st.integers(0, 2**40),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(regular_messages, min_size=2, max_size=12), min_size=1, max_size=5))
def test_batches_from_the_protobuf_runtime_split_the_same(batches: list[list[Message]]) -> None:
    entries = [
        build_entry(msgs, producer_name="p", sequence_id=3, publish_time=1_000 + i) for i, msgs in enumerate(batches)
    ]
    assert_same(entries, fast_expected=True)


utf8_or_not = st.one_of(
    texts.map(str.encode),
    st.binary(max_size=6),
    st.sampled_from(
        [b"\xed\xa0\x80", b"\xc0\xaf", b"\xf4\x90\x80\x80", b"\xe2\x82", b"\xef\xbf\xbf", b"\xf0\x9f\x98\x80"]
    ),
)


valid_utf8 = st.one_of(texts.map(str.encode), st.sampled_from([b"\xef\xbf\xbf", b"\xf0\x9f\x98\x80"]))


@st.composite
def key_values(draw: st.DrawFn, valid: bool) -> bytes:
    strings = valid_utf8 if valid else utf8_or_not
    key, value = draw(strings), draw(strings)
    parts = [length_delimited(1, key), length_delimited(2, value)]
    shapes = ["usual", "usual", "reversed", "repeated", "long"] + ([] if valid else ["no value", "unknown"])
    shape = draw(st.sampled_from(shapes))
    if shape == "reversed":
        parts.reverse()
    elif shape == "no value":
        parts = parts[:1]
    elif shape == "repeated":
        parts.append(length_delimited(1, draw(strings)))
    elif shape == "long":
        parts = [field(1, 2, varint(len(key), pad=1) + key), parts[1]]
    elif shape == "unknown":
        parts.append(field(3, 0, varint(1)))
    return b"".join(parts)


@st.composite
def wire_records(draw: st.DrawFn, valid: bool) -> tuple[bytes, bytes, int]:
    """One ``SingleMessageMetadata`` as bytes and its payload: fields in a random order, some repeated, with
    padded varints; unless ``valid``, some odd (wrong wire types, unknown numbers, bools above 1, numbers too
    big for a long, strings that are not UTF-8, a wrong payload size)."""
    payload = draw(st.binary(max_size=24))
    pad = draw(st.sampled_from([0, 0, 0, 1, 8]))
    size = len(payload) + (0 if valid else draw(st.sampled_from([0] * 12 + [1, -1])))
    fields = [field(3, 0, varint(size if size >= 0 else size + 2**64, pad=pad))]
    big = st.sampled_from([0, 1, 127, 128, 16_383, 16_384, 2**31, 2**63 - 1] + ([] if valid else [2**63, 2**64 - 1]))
    times = st.sampled_from([0, 1, 128, 1_700_000_000_000] + ([] if valid else [2**62, 2**63 - 1, 2**64 - 1]))
    strings = valid_utf8 if valid else utf8_or_not
    bools = st.sampled_from([0, 1, 1] + ([] if valid else [2]))
    optional = [
        st.builds(lambda kv: length_delimited(1, kv), key_values(valid)),
        st.builds(lambda v: field(4, 0, varint(v)), bools),
        st.builds(lambda v: field(5, 0, varint(v)), times),
        st.builds(lambda v: length_delimited(7, v), st.binary(max_size=4)),
        st.builds(lambda v, p: field(8, 0, varint(v, pad=p)), big, st.sampled_from([0, 0, 1])),
        st.builds(lambda v: field(9, 0, varint(v)), bools),
        st.builds(lambda v: field(10, 0, varint(v)), bools),
        st.just(field(3, 0, varint(len(payload)))),  # payload_size again: the last one counts
    ]
    odd = [
        st.builds(lambda v: field(11, 0, varint(v)), big),  # an unknown field
        st.just(field(3, 2, varint(1) + b"x")),  # payload_size with the wrong wire type
        st.just(field(5, 5, b"abcd")),  # event_time as a fixed32
        st.just(bytes([0x42]) + bytes(9) + b"\x80"),  # a length running past the end
    ]
    plain_key = st.builds(lambda k: [length_delimited(2, k)], strings)
    b64_key = st.builds(
        lambda k: [length_delimited(2, base64.b64encode(k)), field(6, 0, varint(1))], st.binary(max_size=6)
    )
    if valid:  # one key at most, marked base64 only when it is
        more = draw(st.one_of(st.just([]), plain_key, b64_key))
    else:
        optional += [
            plain_key.map(b"".join),
            b64_key.map(lambda f: f[0]),
            st.builds(lambda v: field(6, 0, varint(v)), bools),
        ]
        more = []
    more += draw(st.lists(st.one_of(*optional), max_size=5))
    properties = sum(1 for f in more if f[0] == 0x0A)
    fields += more
    if not valid and draw(st.integers(0, 9)) == 0:
        fields.append(draw(st.one_of(*odd)))
    order = draw(st.permutations(range(len(fields))))
    return b"".join(fields[i] for i in order), payload, properties


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(wire_records(valid=True), min_size=1, max_size=6), min_size=1, max_size=4))
def test_valid_wire_level_batches_split_the_same(batches: list[list[tuple[bytes, bytes, int]]]) -> None:
    """Fields in any order, repeated, padded: the same rows, by the fast path unless a message has several
    properties (a repeated key among them is declined)."""
    entries = [batch_entry([r[:2] for r in records], event_time=99 * (i % 2)) for i, records in enumerate(batches)]
    reference, _ = both(entries)
    assert isinstance(reference, pa.RecordBatch)
    several = any(r[2] > 1 for records in batches for r in records)
    assert_same(entries, fast_expected=not several)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(
            st.lists(wire_records(valid=False), min_size=1, max_size=4),
            st.sampled_from([0] * 10 + [1, -1]),
            st.sampled_from([0, 0, 99, 2**63 + 5]),
        ),
        min_size=1,
        max_size=3,
    )
)
def test_wire_level_batches_split_the_same_or_decline(
    batches: list[tuple[list[tuple[bytes, bytes, int]], int, int]],
) -> None:
    entries = [
        batch_entry([r[:2] for r in records], count=len(records) + miscount, event_time=event_time)
        for records, miscount, event_time in batches
    ]
    assert_same(entries, fast_expected=False)


def test_unusual_fields_take_the_fast_path() -> None:
    singles = [
        SingleMessageMetadata(payload_size=3, partition_key="k", null_partition_key=True),
        SingleMessageMetadata(payload_size=2, null_value=True, properties=[KeyValue(key="a", value="1")]),
        SingleMessageMetadata(
            payload_size=2, partition_key=base64.b64encode(b"\x00\xff").decode(), partition_key_b64_encoded=True
        ),
        SingleMessageMetadata(payload_size=1, partition_key="", event_time=0, sequence_id=0, ordering_key=b"o"),
        SingleMessageMetadata(
            payload_size=1, properties=[KeyValue(key="a", value="1"), KeyValue(key="b", value="2")], compacted_out=True
        ),
        SingleMessageMetadata(payload_size=200, sequence_id=2**40, event_time=2**41),
    ]
    payloads = [b"abc", b"zz", b"xy", b"z", b"w", bytes(range(200))]
    entry = batch_entry(
        [(s.SerializeToString(), p) for s, p in zip(singles, payloads, strict=True)], event_time=77, sequence_id=5
    )
    assert_same([entry, entry], fast_expected=True)
    fast = both([entry])[1]
    assert isinstance(fast, pa.RecordBatch)
    got = ofr.rows(fast)
    assert [r["value"] for r in got][:3] == [b"abc", None, b"xy"]
    assert [r["__key"] for r in got][:4] == [None, None, b"\x00\xff", b""]
    assert [r["__messageProperties"] for r in got][4] == [("a", "1"), ("b", "2")]
    assert [r["__sequenceId"] for r in got] == [5, 5, 5, 0, 5, 2**40]


def test_what_the_fast_path_declines_is_split_one_by_one() -> None:
    repeated_key = SingleMessageMetadata(
        payload_size=1, properties=[KeyValue(key="a", value="1"), KeyValue(key="a", value="2")]
    )
    entry = batch_entry(
        [(repeated_key.SerializeToString(), b"x"), (SingleMessageMetadata(payload_size=0).SerializeToString(), b"")]
    )
    reference, fast = both([entry])
    assert fast is None and isinstance(reference, pa.RecordBatch)
    batch = ofr._MessageBatch(TOPIC, 2)
    batch.add(7, 0, decode_entry(entry), "")
    assert ofr.rows(batch.to_arrow())[0]["__messageProperties"] == [("a", "2")]  # the last value, as before
    single = build_entry([Message(b"solo")], producer_name="p", sequence_id=1, publish_time=1)
    batched = build_entry([Message(b"a"), Message(b"b")], producer_name="p", sequence_id=1, publish_time=1)
    assert both([batched, single])[1] is None  # not a batch: the whole run is split one by one
    assert_same([batched, single], fast_expected=False)


@pytest.mark.parametrize("codec", [CompressionType.LZ4, CompressionType.ZSTD])
def test_compressed_batches(codec: int) -> None:
    singles = [SingleMessageMetadata(payload_size=5, partition_key=f"k{i}", sequence_id=i) for i in range(20)]
    body = b"".join(
        len(s.SerializeToString()).to_bytes(4, "big") + s.SerializeToString() + b"%05d" % i
        for i, s in enumerate(singles)
    )
    md = MessageMetadata(
        producer_name="p",
        sequence_id=1,
        publish_time=1,
        num_messages_in_batch=20,
        compression=codec,
        uncompressed_size=len(body),
    )
    assert_same([encode_entry(md, compress(codec, body))], fast_expected=True)


def test_split_batches_declines_nothing_to_split() -> None:
    assert split_batches([], [], [], []) is None
    empty = split_batches([b""], [0], [0], [0])
    assert empty is not None and len(empty.value) == 0


def test_an_entry_at_fault_is_reported_before_a_later_read_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """Entries are split when their batch is built; an error met while reading on comes after the error of an
    entry already read, as when each entry was split on arrival."""
    from types import SimpleNamespace

    from streamoffload.codecs.entry import entry_messages
    from streamoffload.codecs.errors import ChecksumError, FormatError
    from streamoffload.read.segment import OffloadedEntry

    meta = SingleMessageMetadata(payload_size=9).SerializeToString()
    bad = batch_entry([(meta, b"abc")])  # the payload runs past the end of the batch
    with pytest.raises(FormatError) as want:
        entry_messages(bad, where=f"data: entry 1:0 of {TOPIC}")

    def read_range(*_: Any) -> Any:
        yield OffloadedEntry(1, 0, memoryview(bad))
        raise ChecksumError("a later entry is corrupt", offset=0, where="data")

    handle = SimpleNamespace(data_key="data", read_range=read_range)
    with pytest.raises(FormatError) as got:
        list(ofr._message_rows(handle, TOPIC, None, None, ofr.ANY_TIME, 0, 100, 1 << 20))  # type: ignore[arg-type]
    assert type(got.value) is type(want.value) and str(got.value) == str(want.value)


def test_a_message_count_the_payload_cannot_hold_allocates_nothing_for_it() -> None:
    """``num_messages_in_batch`` is a producer's claim: each message takes at least 6 bytes (its 4-byte metadata
    size and the required ``payload_size``), so 2,000,000 of them in 12 bytes is declined before any column is
    allocated for them (it took 100 MB before), and the per-entry split names the entry."""
    import tracemalloc

    single = SingleMessageMetadata(payload_size=0).SerializeToString()
    payload = (len(single).to_bytes(4, "big") + single) * 2
    tracemalloc.start()
    try:
        assert split_batches([payload], [2_000_000], [0], [0]) is None
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, peak
    assert split_batches([payload], [2], [0], [0]) is not None
