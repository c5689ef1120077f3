"""The vectorized read of batched entries, against the entry-by-entry read it stands in for:

- ``read.entry_arrays.batched_entries`` gives each entry's publish time, sequence id, event time, message count,
  producer and payload exactly as ``codecs.entry.decode_entry`` reads them, or None (never other values) for
  anything the fast path leaves to it: metadata written at the wire level (fields in any order, repeated,
  unknown, two-byte tags, odd varints and wire types), besides the protobuf runtime's own encoding;
- ``read.dataset_read.message_ids`` gives ``message_id`` of every message, byte for byte;
- ``_message_rows`` gives the same record batches, cut at the same rows, as ``message_batches`` over the entries
  decoded one by one (the reader before the fast path), with time bounds, small batches, entries the fast path
  declines anywhere in the run, and a read that fails part way: the same batches before the same error."""

from __future__ import annotations

import base64
import struct
import zlib
from types import SimpleNamespace
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamoffload.codecs.compression import DecompressionError, compress
from streamoffload.codecs.entry import (
    CompressionType,
    KeyValue,
    Message,
    MessageMetadata,
    build_entry,
    crc32c,
    decode_entry,
    encode_entry,
    split_messages,
    uncompressed_payload,
)
from streamoffload.codecs.errors import ChecksumError, FormatError
from streamoffload.read import dataset_read as ofr
from streamoffload.read.dataset_plan import TimeBounds
from streamoffload.read.entry_arrays import batched_entries
from streamoffload.read.segment import OffloadedEntry
from tests.read.test_batch_arrays import field, length_delimited, regular_messages, utf8_or_not, varint

TOPIC = "persistent://public/default/t-partition-2"
_INT64_MAX = 2**63 - 1


def entry_of(metadata: bytes, payload: bytes, checked: bool = True) -> bytes:
    """``[u16 0x0e01][u32 crc32c][u32 n][metadata][payload]`` around wire-level metadata; unless ``checked``, without
    the checksum section (``[u32 n][metadata][payload]``: pulsar-lite stores its entries so)."""
    body = struct.pack(">I", len(metadata)) + metadata + payload
    return struct.pack(">HI", 0x0E01, crc32c(body)) + body if checked else body


big = st.sampled_from([0, 1, 127, 128, 16_383, 16_384, 2**31 - 1, 2**31, 2**62, 2**63 - 1, 2**63, 2**64 - 1])
small = st.sampled_from([0, 1, 2, 5, 127, 128, 300])
skipped_delimited = st.sampled_from([5, 7, 16, 18, 26])
skipped_varints = st.sampled_from([9, 19, 20, 22, 23, 24, 27, 28, 29])
single_bools = st.sampled_from([17, 25, 30])  # read past in a batch


@st.composite
def wire_metadata(draw: st.DrawFn, valid: bool, single: bool = False) -> tuple[bytes, bytes]:
    """A ``MessageMetadata`` as bytes and a payload: the required fields, some of the others, in any order, some
    repeated, with padded varints; unless ``valid``, also what the fast path declines (no batch count, a
    compression, properties, the encryption fields, unknown or wrongly typed fields, a two-byte tag written
    overlong, a producer name that is not UTF-8, values above what their field holds, a length past the end)."""
    payload = draw(st.binary(max_size=30))
    pad = draw(st.sampled_from([0, 0, 0, 1, 3]))
    producer = draw(st.text(max_size=8).map(str.encode) if valid else utf8_or_not)
    numbers = st.integers(0, _INT64_MAX) if valid else big
    count = draw(st.integers(0, 2**31 - 1) if valid else st.one_of(small, big))
    sequence = draw(numbers)
    if valid and len(varint(sequence)) + pad > 10:
        pad = 0  # a varint of more than 10 bytes is no varint
    fields = [
        length_delimited(1, producer),
        field(2, 0, varint(sequence, pad=pad)),
        field(3, 0, varint(draw(numbers))),
    ]
    if not single:
        fields.append(field(11, 0, varint(count)))
    if not valid and draw(st.booleans()):
        fields.pop(draw(st.integers(0, len(fields) - 1)))  # a required field missing, or not a batch
    optional = [
        st.builds(lambda v: field(12, 0, varint(v)), numbers),
        st.builds(lambda n, v: length_delimited(n, v), skipped_delimited, st.binary(max_size=5)),
        st.builds(lambda n, v: field(n, 0, varint(v)), skipped_varints, big),
        st.just(field(8, 0, varint(0))),  # compression NONE, written
        st.builds(lambda v: field(2, 0, varint(v)), numbers),  # repeated: the last one counts
        st.builds(lambda v: length_delimited(1, v), st.text(max_size=4).map(str.encode)),
    ]
    odd = [
        st.builds(lambda v: field(8, 0, varint(v)), st.sampled_from([1, 2, 3, 4, 99])),  # compressed, or unknown
        st.just(length_delimited(4, length_delimited(1, b"k") + length_delimited(2, b"v"))),  # properties
        st.just(length_delimited(4, length_delimited(1, b"k"))),  # a property without its required value
        st.builds(lambda n: length_delimited(n, b"x"), st.sampled_from([13, 14, 15])),  # encrypted
        st.builds(lambda n: field(n, 0, varint(1)), st.sampled_from([10, 13, 31, 99])),  # unknown numbers
        st.just(field(3, 2, varint(1) + b"x")),  # publish_time with the wrong wire type
        st.just(field(12, 1, bytes(8))),  # event_time as a fixed64
        st.just(bytes([0x82, 0x81, 0x00]) + varint(0)),  # tag 130 (field 16) written in three bytes
        st.just(bytes([0x88, 0x00]) + varint(0)),  # tag 8 written in two bytes
        st.just(bytes([0x2A]) + varint(50)),  # a length running past the end
        st.just(field(2, 0, bytes([0xFF] * 10) + b"\x01")),  # a varint of 11 bytes
    ]
    keyed = [  # a single message's key and properties (read past in a batch)
        st.builds(lambda k: length_delimited(6, k), st.text(max_size=5).map(str.encode)),
        st.builds(lambda k: length_delimited(6, base64.b64encode(k)) + field(17, 0, varint(1)), st.binary(max_size=5)),
        st.builds(lambda v: field(30, 0, varint(v)), st.sampled_from([0, 1])),
        st.builds(lambda v: field(25, 0, varint(v)), st.sampled_from([0, 1])),
        st.builds(
            lambda k, v: length_delimited(4, length_delimited(1, k) + length_delimited(2, v)),
            st.sampled_from([b"a", b"b", "ü".encode()]),
            st.text(max_size=4).map(str.encode),
        ),
    ]
    odd_keyed = [
        st.builds(lambda k: length_delimited(6, k), utf8_or_not),
        st.just(length_delimited(6, b"!!") + field(17, 0, varint(1))),  # marked base64, and not
        st.builds(lambda n: field(n, 0, varint(2)), st.sampled_from([17, 25, 30])),  # a bool of 2
        st.builds(lambda v: length_delimited(4, length_delimited(1, b"a") + length_delimited(2, v)), utf8_or_not),
    ]
    if not single:  # a batch's own key fields: read past, whatever they hold
        optional += [
            st.builds(lambda n, v: field(n, 0, varint(v)), single_bools, big),
            st.builds(lambda k: length_delimited(6, k), utf8_or_not),
        ]
    if single and valid:  # one key at most, property keys distinct
        chosen = draw(st.lists(st.sampled_from(range(len(keyed))), max_size=4, unique=True))
        fields += [draw(keyed[i]) for i in chosen]
        if 0 in chosen and 1 in chosen:
            fields = [f for f in fields if not f.startswith(b"\x32")] + [draw(keyed[1])]
    elif not valid:
        optional += keyed + odd_keyed
    fields += draw(st.lists(st.one_of(optional) if valid else st.one_of(*optional, *odd), max_size=5))
    order = draw(st.permutations(range(len(fields))))
    return b"".join(fields[i] for i in order), payload


def decoded_fields(entry: bytes) -> tuple[Any, ...] | None:
    """What the fast path gives for ``entry``, read by the protobuf runtime (a single message as
    ``split_messages`` and the per-entry columns read it: its key base64-decoded when marked so, its properties);
    None where the fast path must decline: the entry does not decode, or the rows cannot be built from it
    (compressed, encrypted, a producer that is not a string, a batch's entry properties, a single message that
    ``split_messages`` refuses) or a column cannot hold a value."""
    try:
        decoded = decode_entry(entry, verify_checksum=False)
    except FormatError:
        return None
    md = decoded.metadata
    if decoded.encrypted or type(md.producer_name) is not str:
        return None
    if max(md.publish_time, md.sequence_id, md.event_time) > _INT64_MAX:
        return None
    payload = bytes(decoded.payload)
    if md.compression != CompressionType.NONE:
        if not md.HasField("uncompressed_size"):
            return None
        try:
            payload = bytes(uncompressed_payload(decoded))
        except DecompressionError:
            return None
    head = (md.publish_time, md.sequence_id, md.event_time)
    if decoded.is_batch:
        if md.num_messages_in_batch < 0 or len(md.properties):
            return None
        return (*head, md.num_messages_in_batch, md.producer_name, payload)
    try:
        (msg,) = split_messages(decoded)
        key = None if msg.key is None else base64.b64decode(msg.key) if msg.key_b64_encoded else msg.key.encode()
    except (FormatError, ValueError):
        return None
    return (*head, 1, md.producer_name, payload, key, sorted(msg.properties.items()), msg.null_value)


def assert_decodes_the_same(entries: list[bytes], *, fast_expected: bool) -> None:
    got = batched_entries(entries)
    want = [decoded_fields(e) for e in entries]
    if got is None:
        assert not fast_expected, want
        return
    assert None not in want, "the fast path read what the per-entry path refuses or declines"
    joined = got.joined
    for i, fields in enumerate(want):
        assert fields is not None
        publish, sequence, event, count, producer, payload, *single = fields
        assert got.publish_time[i] == publish and got.sequence_id[i] == sequence and got.event_time[i] == event
        assert got.num_messages[i] == count and got.producer[i].as_py() == producer
        assert joined[got.payload_at[i] : got.payload_end[i]] == payload
        assert got.batched is not bool(single)
        if single:
            assert got.key is not None and got.properties is not None and got.null_value is not None
            key, properties, null_value = single
            assert got.key[i].as_py() == key and sorted(got.properties[i].as_py()) == properties
            assert got.null_value[i] == null_value


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.booleans().flatmap(lambda single: st.lists(wire_metadata(True, single), min_size=1, max_size=6)),
    st.lists(st.booleans(), min_size=6, max_size=6),
)
def test_regular_metadata_decodes_as_the_protobuf_runtime_reads_it(
    metas: list[tuple[bytes, bytes]], checked: list[bool]
) -> None:
    assert_decodes_the_same([entry_of(m, p, c) for (m, p), c in zip(metas, checked, strict=False)], fast_expected=True)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.booleans().flatmap(lambda single: st.lists(wire_metadata(False, single), min_size=1, max_size=4)),
    st.lists(st.booleans(), min_size=4, max_size=4),
)
def test_odd_metadata_is_read_the_same_or_declined(metas: list[tuple[bytes, bytes]], checked: list[bool]) -> None:
    assert_decodes_the_same([entry_of(m, p, c) for (m, p), c in zip(metas, checked, strict=False)], fast_expected=False)


def compressed_entry(data: bytes, codec: int, *, size: int | None = None, payload: bytes | None = None) -> bytes:
    """``data`` (an entry) with its payload compressed by ``codec`` (or replaced by ``payload``), its
    ``uncompressed_size`` the payload's (or ``size``; -1: none)."""
    decoded = decode_entry(data)
    md = decoded.metadata
    md.compression = codec
    plain = bytes(decoded.payload)
    if size == -1:
        md.ClearField("uncompressed_size")
    else:
        md.uncompressed_size = len(plain) if size is None else size
    return encode_entry(md, compress(codec, plain) if payload is None else payload)


def test_what_is_not_a_plain_entry_or_a_mix_is_declined() -> None:
    batch = build_entry([Message(b"a"), Message(b"b")], producer_name="p", sequence_id=1, publish_time=5)
    single = build_entry([Message(b"a")], producer_name="p", sequence_id=1, publish_time=5)
    zlib_batch = compressed_entry(batch, CompressionType.ZLIB)
    broker = encode_entry(decode_entry(batch).metadata, bytes(decode_entry(batch).payload), broker_entry_metadata=b"")
    assert batched_entries([batch, batch]) is not None and batched_entries([single, single]) is not None
    assert batched_entries([batch, zlib_batch]) is not None  # compressed or not, batches are batches
    assert batched_entries([batch, batch[6:]]) is not None  # with the checksum section or without (pulsar-lite's)
    not_inflating = [
        compressed_entry(batch, CompressionType.ZLIB, payload=b"not zlib"),
        compressed_entry(batch, CompressionType.LZ4, size=len(decode_entry(batch).payload) + 1),
        compressed_entry(batch, CompressionType.ZSTD, size=-1),  # no uncompressed_size
    ]
    for other in (single, broker, batch[:9], batch[7:], *not_inflating):  # batches and single messages do not mix
        assert batched_entries([batch, other]) is None, other


def test_compressed_payloads_are_inflated_and_bounded() -> None:
    plain = [
        build_entry([Message(b"v%d" % i * 50, key="k")] * 3, producer_name="p", sequence_id=i, publish_time=i)
        for i in range(4)
    ]
    codecs = [CompressionType.LZ4, CompressionType.ZLIB, CompressionType.ZSTD, CompressionType.SNAPPY]
    entries = [compressed_entry(e, c) for e, c in zip(plain, codecs, strict=True)]
    run = batched_entries(entries)
    assert run is not None
    payloads = [bytes(decode_entry(e).payload) for e in plain]
    assert [run.joined[a:b] for a, b in zip(run.payload_at, run.payload_end, strict=True)] == payloads
    assert run.total == sum(map(len, payloads)) and run.joined[run.total :] == bytes(16)  # payloads, then PAD
    stored = [len(decode_entry(e).payload) for e in entries]
    assert run.payload_bytes.tolist() == [max(s, len(p)) for s, p in zip(stored, payloads, strict=True)]
    # no more than the caps: each payload's (the per-entry path's) and the run's
    assert batched_entries(entries, max_uncompressed=len(payloads[0]) - 1) is None
    assert batched_entries(entries, max_inflated=sum(map(len, payloads)) - 1) is None
    assert batched_entries(entries, max_inflated=sum(map(len, payloads))) is not None


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 2**63 - 1), st.integers(0, 2**63 - 1), st.integers(0, 300)), max_size=8),
    st.sampled_from([-1, 0, 1, 127, 128, 2**31 - 1]),
)
def test_message_ids_are_the_java_clients_bytes(entries: list[tuple[int, int, int]], partition: int) -> None:
    ledgers = np.array([e[0] for e in entries], dtype=np.int64)
    ids = np.array([e[1] for e in entries], dtype=np.int64)
    sizes = np.array([e[2] for e in entries], dtype=np.int64)
    got = ofr.message_ids(ledgers, ids, partition, sizes, np.maximum(sizes, 1)).to_pylist()
    want = [
        ofr.message_id(ledger, entry, partition, i if size else -1, size)
        for ledger, entry, size in entries
        for i in range(max(size, 1))
    ]
    assert got == want


# --- the rows: the fast path against the entry-by-entry reader -------------------------------------------------


def reference(
    entries: list[OffloadedEntry], times: TimeBounds, skew_ms: int, batch_rows: int, batch_bytes: int
) -> tuple[list[pa.RecordBatch], BaseException | None]:
    """The batches and the error of ``message_batches`` over the entries decoded one by one (a ``FAIL`` entry:
    the read fails there)."""
    out: list[pa.RecordBatch] = []

    def raw() -> Any:
        for entry in entries:
            if entry.payload is FAIL:
                raise ChecksumError("the read failed here", offset=0, where="data")
            yield entry

    decoded = ofr._decoded_in_window("data", raw(), times, skew_ms, f" of {TOPIC}")
    try:
        for batch in ofr.message_batches(
            TOPIC,
            ((e.ledger_id, e.entry_id, d, w) for e, d, w in decoded),
            batch_rows=batch_rows,
            batch_bytes=batch_bytes,
        ):
            out.append(batch)
    except Exception as exc:
        return out, exc
    return out, None


def fast(
    entries: list[OffloadedEntry], times: TimeBounds, skew_ms: int, batch_rows: int, batch_bytes: int
) -> tuple[list[pa.RecordBatch], BaseException | None]:
    def read_range(*_: Any) -> Any:
        for entry in entries:
            if entry.payload is FAIL:
                raise ChecksumError("the read failed here", offset=0, where="data")
            yield entry

    handle = SimpleNamespace(data_key="data", read_range=read_range)
    out: list[pa.RecordBatch] = []
    try:
        for batch in ofr._message_rows(handle, TOPIC, None, None, times, skew_ms, batch_rows, batch_bytes):  # type: ignore[arg-type]
            out.append(batch)
    except Exception as exc:
        return out, exc
    return out, None


FAIL = memoryview(b"")


@st.composite
def runs(draw: st.DrawFn) -> list[OffloadedEntry]:
    """Entries of one ledger as a producer writes them: batches (some of one message), or single messages, with
    publish times that grow (now and then a step back, within a skew), each compressed or not, with its checksum
    section or not; or a mix, with at times an entry the fast path declines (a batch whose records are odd, a
    payload that does not inflate) or a failing read."""
    n = draw(st.integers(1, 14))
    # only batches, or only single messages (each compressed or not): all fast
    mode = draw(st.sampled_from(["batch", "single", "mixed", "compressed"]))
    mixed = st.sampled_from(["batch"] * 8 + ["single", "compressed", "odd", "fail"])
    compressed = st.sampled_from(["compressed", "compressed", "incompressible", "bad inflate", "batch"])
    single = st.sampled_from(["single", "single", "single compressed"])
    kinds = {"mixed": mixed, "compressed": compressed, "single": single}.get(mode, st.just(mode))
    codec = st.sampled_from([CompressionType.LZ4, CompressionType.ZLIB, CompressionType.ZSTD, CompressionType.SNAPPY])
    out = []
    publish = draw(st.integers(0, 50))
    for i in range(n):
        publish = max(publish + draw(st.sampled_from([0, 1, 1, 2, 5, -1])), 0)
        kind = draw(kinds)
        if kind == "fail":
            out.append(OffloadedEntry(3, i, FAIL))
            continue
        if kind == "batch":
            msgs = draw(st.lists(regular_messages, min_size=1, max_size=6))
            data = build_entry(msgs, producer_name="p", sequence_id=i * 10, publish_time=publish, batched=True)
        elif kind == "single":
            data = build_entry(
                draw(st.lists(regular_messages, min_size=1, max_size=1)),
                producer_name="p",
                sequence_id=i,
                publish_time=publish,
            )
        elif kind == "single compressed":
            msgs = draw(st.lists(regular_messages, min_size=1, max_size=1))
            data = compressed_entry(
                build_entry(msgs, producer_name="p", sequence_id=i, publish_time=publish), draw(codec)
            )
        elif kind in ("compressed", "incompressible", "bad inflate"):
            msgs = draw(st.lists(regular_messages, min_size=1, max_size=6))
            if kind == "compressed":
                msgs.append(Message(b"x" * draw(st.sampled_from([0, 20, 400]))))
            plain = build_entry(msgs, producer_name="p", sequence_id=i * 10, publish_time=publish, batched=True)
            if kind == "bad inflate":  # declared one byte more than it inflates to: the per-entry path raises
                data = compressed_entry(plain, draw(codec), size=len(decode_entry(plain).payload) + 1)
            elif kind == "incompressible":  # stored bigger than inflated: a batch's size counts the stored bytes
                data = compressed_entry(
                    plain, CompressionType.ZLIB, payload=zlib.compress(bytes(decode_entry(plain).payload), 0)
                )
            else:
                data = compressed_entry(plain, draw(codec))
        else:  # a batch claiming a message more than it holds: the split declines, the per-entry path raises
            md = MessageMetadata(producer_name="p", sequence_id=i, publish_time=publish, num_messages_in_batch=3)
            data = encode_entry(
                md,
                decode_entry(
                    build_entry([Message(b"a"), Message(b"b")], producer_name="p", sequence_id=i, publish_time=publish)
                ).payload,
            )
        if draw(st.booleans()):  # without its checksum section, as pulsar-lite stores entries
            data = data[6:]
        out.append(OffloadedEntry(3, i, memoryview(data)))
    return out


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    runs(),
    st.sampled_from([None, 0, 20, 40]),
    st.sampled_from([None, 10, 45, 60]),
    st.sampled_from([0, 2]),
    st.sampled_from([1, 2, 5, 16384]),
    st.sampled_from([1, 40, 300, 32 << 20]),
)
def test_rows_are_those_of_the_entry_by_entry_reader(
    entries: list[OffloadedEntry], lo: int | None, hi: int | None, skew_ms: int, batch_rows: int, batch_bytes: int
) -> None:
    times = TimeBounds(lo, hi)
    want, want_error = reference(entries, times, skew_ms, batch_rows, batch_bytes)
    got, got_error = fast(entries, times, skew_ms, batch_rows, batch_bytes)
    assert [b.num_rows for b in got] == [b.num_rows for b in want]
    for g, w in zip(got, want, strict=True):
        assert g.equals(w), (g.to_pydict(), w.to_pydict())
    assert type(got_error) is type(want_error) and str(got_error) == str(want_error)


def test_a_run_of_plain_batches_takes_the_fast_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """The batches of a producer go through the vectorized read (no entry is decoded one by one), cut where the
    entry-by-entry reader cuts them."""
    entries = [
        OffloadedEntry(
            3,
            i,
            memoryview(
                build_entry(
                    [Message(b"v%d" % i, key="k")] * 4, producer_name="p", sequence_id=4 * i, publish_time=100 + i
                )
            ),
        )
        for i in range(10)
    ]
    assert read_without_one_by_one(monkeypatch, entries, 8) == [8] * 5


def read_without_one_by_one(
    monkeypatch: pytest.MonkeyPatch, entries: list[OffloadedEntry], batch_rows: int
) -> list[int]:
    """The record batches' rows of ``entries`` read by the fast path, none decoded one by one (``decode_entry``
    refuses), checked equal to the entry-by-entry reader's, batch for batch."""
    want, _ = reference(entries, TimeBounds(), 0, batch_rows, 32 << 20)

    def refuse(*_: Any, **__: Any) -> Any:
        raise AssertionError("an entry was decoded one by one")

    monkeypatch.setattr(ofr, "decode_entry", refuse)
    got, error = fast(entries, TimeBounds(), 0, batch_rows, 32 << 20)
    assert error is None
    assert [b.num_rows for b in got] == [b.num_rows for b in want]
    assert pa.Table.from_batches(got).equals(pa.Table.from_batches(want))
    return [b.num_rows for b in got]


@pytest.mark.parametrize("single", [False, True], ids=["batches", "single messages"])
def test_compressed_runs_take_the_fast_path(monkeypatch: pytest.MonkeyPatch, single: bool) -> None:
    """Entries compressed by each of Pulsar's codecs (producers often compress) go through the vectorized read
    too, inflated there, with the rows and cuts of the entry-by-entry reader."""
    codecs = [CompressionType.LZ4, CompressionType.ZLIB, CompressionType.ZSTD, CompressionType.SNAPPY]
    messages = 1 if single else 4
    entries = [
        OffloadedEntry(
            3,
            i,
            memoryview(
                build_entry(
                    [Message(b"value %d " % i * 30, key="k", properties={"n": str(i)})] * messages,
                    producer_name="p",
                    sequence_id=messages * i,
                    publish_time=100 + i,
                    compression=codecs[i % 4],
                )
            ),
        )
        for i in range(10)
    ]
    assert read_without_one_by_one(monkeypatch, entries, 8) == ([8, 2] if single else [8] * 5)


def test_the_read_ends_at_the_first_entry_past_the_time_bound() -> None:
    """Publish times grow with position (within the skew): past an entry published at ``hi + skew`` or later,
    nothing is read, not an entry published earlier after it, nor a failing read further on."""

    def batch(i: int, publish: int) -> OffloadedEntry:
        data = build_entry([Message(b"%d" % i)] * 2, producer_name="p", sequence_id=i, publish_time=publish)
        return OffloadedEntry(3, i, memoryview(data))

    entries = [batch(0, 1), batch(1, 2), batch(2, 7), batch(3, 9), batch(4, 3), OffloadedEntry(3, 5, FAIL)]
    times = TimeBounds(None, 5)
    for batch_rows in (1, 2, 3, 16384):
        want, want_error = reference(entries, times, 2, batch_rows, 32 << 20)
        got, got_error = fast(entries, times, 2, batch_rows, 32 << 20)
        assert want_error is None and got_error is None
        assert pa.Table.from_batches(got).column("__entryId").to_pylist() == [0, 0, 1, 1]
        assert [b.num_rows for b in got] == [b.num_rows for b in want]


def test_single_messages_take_the_fast_path_with_their_keys_properties_and_null_values(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A producer that does not batch (pulsar-client for Python, by default): every entry one message, its key
    (plain, base64, marked null), properties and null value in its MessageMetadata; read all at once, the same rows
    as one by one."""

    def single(i: int, **fields: Any) -> OffloadedEntry:
        md = MessageMetadata(producer_name="p", sequence_id=i, publish_time=100 + i, **fields)
        return OffloadedEntry(3, i, memoryview(encode_entry(md, b"v%d" % i if not fields.get("null_value") else b"")))

    entries = [
        single(0, partition_key="k0", event_time=7),
        single(1, partition_key=base64.b64encode(b"\x00\xff").decode(), partition_key_b64_encoded=True),
        single(2, partition_key="gone", null_partition_key=True),
        single(3, null_value=True),
        single(4, properties=[KeyValue(key="a", value="1"), KeyValue(key="ü", value="ß")]),
        single(5),
    ]
    want, _ = reference(entries, TimeBounds(), 0, 4, 32 << 20)
    monkeypatch.setattr(ofr, "decode_entry", lambda *_, **__: pytest.fail("an entry was decoded one by one"))
    got, error = fast(entries, TimeBounds(), 0, 4, 32 << 20)
    assert error is None and [b.num_rows for b in got] == [4, 2] == [b.num_rows for b in want]
    for g, w in zip(got, want, strict=True):
        assert g.equals(w)
    rows = pa.Table.from_batches(got)
    assert rows.column("value").to_pylist() == [b"v0", b"v1", b"v2", None, b"v4", b"v5"]
    assert rows.column("__key").to_pylist() == [b"k0", b"\x00\xff", None, None, None, None]
    assert rows.column("__batchIndex").to_pylist() == [-1] * 6
    assert rows.column("__messageProperties").to_pylist()[4] == [("a", "1"), ("ü", "ß")]
