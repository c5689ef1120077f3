"""Entries decoded all at once: the ``MessageMetadata`` of every entry of a run, read with numpy over the entries'
bytes joined (``read.wire_arrays``), with no Python object per entry.

:func:`batched_entries` reads ``[u16 0x0e01][u32 crc32c][u32 n][n bytes MessageMetadata][payload]`` entries (or
``[u32 n][MessageMetadata][payload]``, without the checksum section, as ``decode_entry`` takes them), all
batches or all single messages, and gives what ``read.dataset_read`` takes from each entry's metadata to build its
rows: publish time, sequence id, event time, the batch's message count, the producer's name, where the payload
lies, and for single messages their key and properties and whether the value is null (as
``codecs.entry.split_messages`` reads them: a key marked base64 decoded, none when marked null).

A compressed entry's payload is inflated here, entry by entry, with ``codecs.compression.decompress`` (the
per-entry path's, under the same cap), and the run's payloads are then joined without their metadata; a run
that would inflate to more than ``max_inflated`` bytes in all is left to the per-entry path, which inflates a
record batch at a time.

It is a fast path, not a second definition of the format: anything it does not read exactly as
``codecs.entry.decode_entry`` and the batch split of ``read.dataset_read`` do makes it return None, and the caller
decodes those entries one by one, which gives the rows or raises the error naming the entry. Irregular here: batches
beside single messages, a compressed payload that does not inflate (or without its ``uncompressed_size``, or an unknown
codec), one with broker entry metadata, an encrypted one (fields 13-15), a field number or wire type
``pulsar_api.proto`` does not give ``MessageMetadata``, a required field missing, a producer name that is not UTF-8, a
value above what its field holds; for batches, entry ``properties`` (each a ``KeyValue`` with required fields: the split
never reads them); for single messages, a key or property that is not UTF-8 or not base64 where marked so, a property
without its key or value or repeated, a bool above 1. The fields the rows do not use (replication, ordering keys, schema
version, transactions, chunks, delivery time, markers; for batches also the entry's key fields) are read past.

The CRC-32C is not checked here: the segment's read checked it.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from streamoffload.codecs.compression import CODECS, MAX_UNCOMPRESSED, DecompressionError, decompress_into
from streamoffload.read.batch_arrays import message_keys, message_properties
from streamoffload.read.wire_arrays import MAX_JOINED, PAD, Irregular, check_utf8, cut, records

__all__ = ["MAX_INFLATED", "BatchedEntries", "batched_entries"]

_MAGIC_CRC32C = 0x0E01
_MAGIC_BROKER_ENTRY_METADATA = 0x0E02
_HEAD = 2 + 4 + 4  # magic, CRC-32C, metadata size
_PLAIN_HEAD = 4  # metadata size: an entry without the checksum section (pulsar-lite stores them so)

# MessageMetadata's fields as their wire tags (field number << 3 | wire type: 0 varint, 2 length-delimited).
_PRODUCER_NAME = 0x0A  # 1, string, required
_SEQUENCE_ID = 0x10  # 2, uint64, required
_PUBLISH_TIME = 0x18  # 3, uint64, required
_PROPERTIES = 0x22  # 4, repeated KeyValue
_PARTITION_KEY = 0x32  # 6, string
_COMPRESSION = 0x40  # 8, enum
_NUM_MESSAGES = 0x58  # 11, int32: present on a batch only
_EVENT_TIME = 0x60  # 12, uint64
_KEY_B64 = 0x88  # 17, bool
_NULL_VALUE = 0xC8  # 25, bool
_NULL_KEY = 0xF0  # 30, bool
_UNCOMPRESSED_SIZE = 0x48  # 9, uint32
# Read past: replicated_from 5, replicate_to 7 (strings: upb keeps one that is not UTF-8 as bytes, and the rows
# never read them), schema_version 16, ordering_key 18, uuid 26 (length-delimited); deliver_at_time 19,
# marker_type 20, txnid 22 and 23, highest_sequence_id 24, chunks 27-29 (varints).
_SKIPPED_DELIMITED = (0x2A, 0x3A, 0x82, 0x92, 0xD2)
_SKIPPED_VARINTS = (0x98, 0xA0, 0xB0, 0xB8, 0xC0, 0xD8, 0xE0, 0xE8)
_BOOLS = (_KEY_B64, _NULL_VALUE, _NULL_KEY)

_LENGTH_DELIMITED = np.zeros(256, dtype=bool)
_LENGTH_DELIMITED[[_PRODUCER_NAME, _PROPERTIES, _PARTITION_KEY, *_SKIPPED_DELIMITED]] = True
_KNOWN = _LENGTH_DELIMITED.copy()
_VARINTS = (_SEQUENCE_ID, _PUBLISH_TIME, _COMPRESSION, _UNCOMPRESSED_SIZE, _NUM_MESSAGES, _EVENT_TIME)
_KNOWN[[*_VARINTS, *_BOOLS, *_SKIPPED_VARINTS]] = True

_INT32_MAX = np.uint64(0x7FFFFFFF)
_UINT32_MAX = np.uint64(0xFFFFFFFF)
MAX_INFLATED = 64 << 20
"""What a run's compressed payloads may inflate to in all (``batched_entries``): twice a record batch's bytes, as
the per-entry path holds at most (a batch's entries, then their inflated payloads joined)."""
_INT64_MAX = np.uint64(0x7FFFFFFFFFFFFFFF)


@dataclass(frozen=True, slots=True)
class BatchedEntries:
    """Entries, in order: their bytes joined (``joined``: ``total`` of them, then ``wire_arrays.PAD``; when any is
    compressed, their payloads alone, inflated), where each payload starts and ends in them, ``payload_bytes``
    each counts for a record batch's size (``message_batches``' count: a compressed payload's stored or inflated
    size, whichever is larger), and from each ``MessageMetadata``: ``publish_time``, ``sequence_id`` and
    ``event_time`` (0 when unset) as int64, ``num_messages`` (int64: 1 for a single message) and ``producer``
    (strings); for single messages (``batched`` False) also ``key`` (binary), ``properties`` (a map) and
    ``null_value`` (bool), else None."""

    joined: bytes | bytearray
    total: int
    payload_at: np.ndarray
    payload_end: np.ndarray
    payload_bytes: np.ndarray
    publish_time: np.ndarray
    sequence_id: np.ndarray
    event_time: np.ndarray
    num_messages: np.ndarray
    producer: pa.Array
    batched: bool = True
    key: pa.Array | None = None
    properties: pa.MapArray | None = None
    null_value: np.ndarray | None = None


def batched_entries(
    entries: Sequence[bytes | memoryview],
    *,
    max_uncompressed: int = MAX_UNCOMPRESSED,
    max_inflated: int = MAX_INFLATED,
) -> BatchedEntries | None:
    """The metadata of ``entries`` (each an entry's bytes, as stored), or None if any of them is irregular (see
    the module docstring): the caller then decodes them one by one. A compressed payload is inflated to at most
    ``max_uncompressed`` bytes (``codecs.compression.decompress``), the run's to ``max_inflated`` in all."""
    try:
        return _decode(entries, max_uncompressed, max_inflated)
    except Irregular:
        return None


def batched_joined(
    joined: bytes,
    starts: np.ndarray,
    sizes: np.ndarray,
    *,
    max_uncompressed: int = MAX_UNCOMPRESSED,
    max_inflated: int = MAX_INFLATED,
) -> BatchedEntries | None:
    """:func:`batched_entries` of entries already joined: entry ``i`` is ``joined[starts[i]:starts[i] + sizes[i]]``
    (ascending, disjoint; what lies between them is not read), the last one ending where ``wire_arrays.PAD``
    starts (``read.segment.runs.JoinedEntries`` joins them so)."""
    try:
        n = len(starts)
        if not n:
            raise Irregular
        ends = starts + sizes
        if len(joined) != int(ends[-1]) + len(PAD):
            raise Irregular
        return _decode_joined(joined, starts, sizes, ends, max_uncompressed, max_inflated)
    except Irregular:
        return None


def _decode(entries: Sequence[bytes | memoryview], max_uncompressed: int, max_inflated: int) -> BatchedEntries:
    n = len(entries)
    sizes = np.fromiter(map(len, entries), dtype=np.int64, count=n)
    ends = np.cumsum(sizes)
    starts = ends - sizes
    return _decode_joined(b"".join([*entries, PAD]), starts, sizes, ends, max_uncompressed, max_inflated)


def _decode_joined(
    joined: bytes, starts: np.ndarray, sizes: np.ndarray, ends: np.ndarray, max_uncompressed: int, max_inflated: int
) -> BatchedEntries:
    n = len(starts)
    if not n or ends[-1] > MAX_JOINED or (sizes < _PLAIN_HEAD).any():
        raise Irregular
    buf = np.frombuffer(joined, dtype=np.uint8)
    words = np.ndarray(shape=(len(joined) - 3,), dtype=">u4", buffer=joined, strides=(1,))
    magic = (buf[starts].astype(np.int64) << 8) | buf[starts + 1]
    if (magic == _MAGIC_BROKER_ENTRY_METADATA).any():
        raise Irregular  # broker entry metadata first
    # As decode_entry reads them: the checksum section when the entry starts with its magic, else none (a client
    # of a protocol before v6, or a broker that keeps none): the metadata size first.
    checked = magic == _MAGIC_CRC32C
    if (checked & (sizes < _HEAD)).any():
        raise Irregular
    meta_at = starts + np.where(checked, _HEAD, _PLAIN_HEAD)
    meta_end = meta_at + words[meta_at - 4].astype(np.int64)
    if (meta_end > ends).any():
        raise Irregular  # (without the magic: not an entry at all)
    publish = np.zeros(n, dtype=np.uint64)
    sequence = np.zeros(n, dtype=np.uint64)
    event = np.zeros(n, dtype=np.uint64)
    count = np.full(n, -1, dtype=np.int64)
    producer_at = np.full(n, -1, dtype=np.int64)
    producer_end = np.full(n, -1, dtype=np.int64)
    required = np.zeros((3, n), dtype=bool)  # producer name, sequence id, publish time
    key_at = np.full(n, -1, dtype=np.int64)
    key_end = np.full(n, -1, dtype=np.int64)
    bools = {tag: np.zeros(n, dtype=np.uint64) for tag in _BOOLS}
    codec = np.zeros(n, dtype=np.uint64)
    inflated = np.full(n, -1, dtype=np.int64)  # uncompressed_size; -1 unset, -2 above 32 bits
    prop_msg: list[np.ndarray] = []
    prop_at: list[np.ndarray] = []
    prop_end: list[np.ndarray] = []
    who = np.arange(n, dtype=np.int64)
    for tags, field_at, field_end, value, entry in records(
        buf, meta_at, meta_end, who, _KNOWN, _LENGTH_DELIMITED, wide_tags=True
    ):
        groups = (
            [(tags, field_at, field_end, value, entry)]
            if isinstance(tags, int)
            else _by_tag(tags, field_at, field_end, value, entry)
        )
        for tag, at, end, val, e in groups:  # in a round each entry has one field: no two writes collide
            if tag == _PRODUCER_NAME:
                producer_at[e], producer_end[e] = at, end
                required[0, e] = True
            elif tag == _SEQUENCE_ID:
                sequence[e] = val
                required[1, e] = True
            elif tag == _PUBLISH_TIME:
                publish[e] = val
                required[2, e] = True
            elif tag == _EVENT_TIME:
                event[e] = val
            elif tag == _NUM_MESSAGES:
                if (val > _INT32_MAX).any():
                    raise Irregular  # negative as an int32, or above it: the per-entry path says what it is
                count[e] = val.astype(np.int64)
            elif tag == _COMPRESSION:
                codec[e] = val
            elif tag == _UNCOMPRESSED_SIZE:  # above 32 bits (protobuf keeps the low ones): -2, not inflated here
                inflated[e] = np.where(val > _UINT32_MAX, np.int64(-2), (val & _UINT32_MAX).astype(np.int64))
            elif tag == _PARTITION_KEY:
                key_at[e], key_end[e] = at, end
            elif tag == _PROPERTIES:
                prop_msg.append(e)
                prop_at.append(at)
                prop_end.append(end)
            elif tag in bools:
                bools[tag][e] = val
    if not required.all():
        raise Irregular  # a required field missing
    batched = count >= 0
    if batched.any() and (not batched.all() or prop_msg):
        raise Irregular  # batches beside single messages, or a batch's entry properties
    if (publish > _INT64_MAX).any() or (sequence > _INT64_MAX).any() or (event > _INT64_MAX).any():
        raise Irregular
    if (codec > max(CODECS)).any():
        raise Irregular  # an enum value protobuf keeps as an unknown field
    data = pa.py_buffer(joined)
    total = int(ends[-1])
    key: pa.Array | None = None
    properties: pa.MapArray | None = None
    null_value: np.ndarray | None = None
    if not batched.any():  # single messages: their key, properties and null value are the entry's
        if any((flags > 1).any() for flags in bools.values()):
            raise Irregular  # a bool that is not 0 or 1
        key = message_keys(data, total, key_at, key_end, bools[_NULL_KEY] == 1, bools[_KEY_B64] == 1)
        properties = message_properties(buf, data, total, prop_msg, prop_at, prop_end, n)
        null_value = bools[_NULL_VALUE] == 1
        count = np.ones(n, dtype=np.int64)
    producer = check_utf8(cut(data, total, producer_at, producer_end))
    payload_at, payload_end, payload_bytes = meta_end, ends, ends - meta_end
    payloads: bytes | bytearray = joined
    compressed = codec != 0
    if compressed.any():
        payloads, total, payload_at, payload_end = _inflated(
            joined, meta_end, ends, codec, inflated, max_uncompressed, max_inflated
        )
        payload_bytes = np.where(compressed, np.maximum(payload_bytes, inflated), payload_bytes)
    return BatchedEntries(
        joined=payloads,
        total=total,
        payload_at=payload_at,
        payload_end=payload_end,
        payload_bytes=payload_bytes,
        publish_time=publish.astype(np.int64),
        sequence_id=sequence.astype(np.int64),
        event_time=event.astype(np.int64),
        num_messages=count,
        producer=producer,
        batched=key is None,
        key=key,
        properties=properties,
        null_value=null_value,
    )


def _by_tag(
    tags: np.ndarray, at: np.ndarray, end: np.ndarray, value: np.ndarray, who: np.ndarray
) -> list[tuple[int, np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    out = []
    for tag in np.unique(tags).tolist():
        mask = tags == tag
        out.append((tag, at[mask], end[mask], value[mask], who[mask]))
    return out


def _inflated(
    joined: bytes,
    at: np.ndarray,
    end: np.ndarray,
    codec: np.ndarray,
    size: np.ndarray,
    max_uncompressed: int,
    max_inflated: int,
) -> tuple[bytearray, int, np.ndarray, np.ndarray]:
    """The payloads ``joined[at[i]:end[i]]``, each compressed one (``codec[i]`` not 0) inflated to its ``size[i]``,
    joined (then ``PAD``): the new joined bytes, their length, and where each payload starts and ends in them."""
    compressed = codec != 0
    if (size[compressed] < 0).any():
        raise Irregular  # no uncompressed_size, or one above 32 bits: the per-entry path says what that gives
    lengths = np.where(compressed, size, end - at)
    total = int(lengths.sum())
    if total > min(max_inflated, MAX_JOINED):
        raise Irregular
    view = memoryview(joined)
    new_end = np.cumsum(lengths)
    new_at = new_end - lengths
    out = bytearray(total + len(PAD))  # each payload inflated in its place: one allocation, no join
    target = memoryview(out)
    for a, b, c, o, n in zip(at.tolist(), end.tolist(), codec.tolist(), new_at.tolist(), lengths.tolist(), strict=True):
        if not c:
            target[o : o + n] = view[a:b]
            continue
        try:
            decompress_into(c, view[a:b], target[o : o + n], max_size=max_uncompressed)
        except DecompressionError:
            raise Irregular from None  # the per-entry path raises it, naming the entry
    return out, total, new_at, new_end
