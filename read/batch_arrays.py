"""Batched entries split into their messages' columns all at once: numpy over the bytes of every entry of an Arrow
batch, and Arrow arrays cut from those bytes, with no Python object per message or field.

:func:`split_batches` reads the ``[u32 k][k bytes SingleMessageMetadata][payload_size bytes]`` records of many
batch payloads in lockstep: step ``j`` reads message ``j`` of every entry at once (each record's place depends on
the one before it), and each ``SingleMessageMetadata`` is decoded field by field the same way (one field of
every message per round), by a small vectorized decoder of the protobuf wire format. Strings and values are then
cut from the joined payloads by Arrow (``take`` over the payloads seen as a binary array whose elements alternate
between the wanted ranges and what lies between them), and strings are checked to be UTF-8 by Arrow's cast.

It is a fast path, not a second definition of the format: anything it does not read exactly as
``codecs.entry.split_messages`` does makes it return None, and the caller splits those entries one by one with
``codecs.entry_columns.append_messages``, which gives the rows or raises the error naming the entry. Irregular
here: a field number or wire type ``pulsar_api.proto`` does not give ``SingleMessageMetadata`` or ``KeyValue``,
a bool that is not 0 or 1, a varint above 64 bits, a ``payload_size`` above 2^31 - 1 or missing, a length past
its end, a string that is not UTF-8, a base64 key that does not decode, a message's repeated property key, an
event time or sequence id that does not fit a long, joined payloads of 2 GiB or more. Fields may come in any
order, and a repeated one's last value wins, as protobuf reads them.

Pure: no I/O.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from streamoffload.read.wire_arrays import MAX_JOINED, PAD, Irregular, check_utf8, cut, records

__all__ = ["SplitBatch", "message_keys", "message_properties", "split_batches", "split_joined"]

# SingleMessageMetadata's fields as their wire tags (field number << 3 | wire type: 0 varint, 2 length-delimited),
# and KeyValue's (both strings, both required).
_PROPERTIES = 0x0A  # 1, repeated KeyValue
_PARTITION_KEY = 0x12  # 2, string
_PAYLOAD_SIZE = 0x18  # 3, int32, required
_COMPACTED_OUT = 0x20  # 4, bool
_EVENT_TIME = 0x28  # 5, uint64
_KEY_B64 = 0x30  # 6, bool
_ORDERING_KEY = 0x3A  # 7, bytes
_SEQUENCE_ID = 0x40  # 8, uint64
_NULL_VALUE = 0x48  # 9, bool
_NULL_KEY = 0x50  # 10, bool
_KV_KEY = 0x0A  # KeyValue.key, 1
_KV_VALUE = 0x12  # KeyValue.value, 2

_LENGTH_DELIMITED = np.zeros(256, dtype=bool)
_LENGTH_DELIMITED[[_PROPERTIES, _PARTITION_KEY, _ORDERING_KEY]] = True
_KNOWN = _LENGTH_DELIMITED.copy()
_KNOWN[[_PAYLOAD_SIZE, _COMPACTED_OUT, _EVENT_TIME, _KEY_B64, _SEQUENCE_ID, _NULL_VALUE, _NULL_KEY]] = True
_KV_KNOWN = np.zeros(256, dtype=bool)
_KV_KNOWN[[_KV_KEY, _KV_VALUE]] = True

_INT32_MAX = 0x7FFFFFFF
_INT64_MAX = np.uint64(0x7FFFFFFFFFFFFFFF)
_MIN_RECORD = 4 + 2  # a message's metadata size, and its SingleMessageMetadata's required payload_size (tag, 0)


@dataclass(frozen=True, slots=True)
class SplitBatch:
    """The messages of entries, in order, as ``read.dataset_read`` puts them in its Arrow batch: ``value``
    (binary, null for a null value), ``key`` (binary: the key's bytes, base64-decoded when the producer marked
    it so; null without a key), ``event_time`` (the message's, else its entry's; 0 when unset) and
    ``sequence_id`` (likewise) as int64, ``batch_index`` (int32), ``properties`` (``map<string, string>``, a
    repeated key never occurs here), and ``payload_bytes``, the sum of the payloads' lengths (a null value's
    stored payload included)."""

    value: pa.Array
    key: pa.Array
    event_time: np.ndarray
    sequence_id: np.ndarray
    batch_index: np.ndarray
    properties: pa.MapArray
    payload_bytes: int


def split_batches(
    payloads: Sequence[bytes | memoryview],
    counts: Sequence[int],
    event_times: Sequence[int],
    sequence_ids: Sequence[int],
) -> SplitBatch | None:
    """The messages of batch payloads (uncompressed) with ``counts`` messages each (``num_messages_in_batch``),
    whose entries' ``MessageMetadata`` have ``event_times`` and ``sequence_ids``; None if anything in them is
    irregular (see the module docstring): the caller then splits them one by one."""
    try:
        return _split(payloads, counts, event_times, sequence_ids)
    except Irregular:
        return None


def split_joined(
    joined: bytes | bytearray,
    total: int,
    starts: np.ndarray,
    ends: np.ndarray,
    counts: np.ndarray,
    event_times: np.ndarray,
    sequence_ids: np.ndarray,
) -> SplitBatch | None:
    """:func:`split_batches` of payloads already joined: payload ``i`` is ``joined[starts[i]:ends[i]]`` (ascending,
    disjoint; what lies between them is not read), ``total`` bytes before a pad of at least 16 (``PAD``)."""
    try:
        return _split_joined(joined, total, starts, ends, counts, event_times, sequence_ids)
    except Irregular:
        return None


def _split(
    payloads: Sequence[bytes | memoryview],
    counts: Sequence[int],
    event_times: Sequence[int],
    sequence_ids: Sequence[int],
) -> SplitBatch:
    sizes = np.fromiter(map(len, payloads), dtype=np.int64, count=len(payloads))
    ends = np.cumsum(sizes)
    starts = ends - sizes
    if not len(payloads) or ends[-1] > MAX_JOINED:
        raise Irregular
    joined = b"".join([*payloads, PAD])
    return _split_joined(
        joined, int(ends[-1]), starts, ends, np.asarray(counts, dtype=np.int64), event_times, sequence_ids
    )


def _split_joined(
    joined: bytes | bytearray,
    total: int,
    starts: np.ndarray,
    ends: np.ndarray,
    per_entry: np.ndarray,
    event_times: Sequence[int] | np.ndarray,
    sequence_ids: Sequence[int] | np.ndarray,
) -> SplitBatch:
    if not len(per_entry) or total > MAX_JOINED or (per_entry < 0).any():
        raise Irregular
    if (per_entry * _MIN_RECORD > ends - starts).any():
        raise Irregular  # more messages than the payload can hold: nothing is allocated for the claim
    buf = np.frombuffer(joined, dtype=np.uint8)
    # The big-endian u32 starting at every byte: a record's metadata length is words[its first byte].
    words = np.ndarray(shape=(len(joined) - 3,), dtype=">u4", buffer=joined, strides=(1,))
    first = np.cumsum(per_entry) - per_entry  # each entry's first message
    n = int(per_entry.sum())
    fields = _Fields(n, per_entry, event_times, sequence_ids)
    value_at = np.empty(n, dtype=np.int64)
    pos = starts.copy()
    uniform = per_entry.min(initial=0) == per_entry.max(initial=0)  # the usual: no entry ends before another
    for j in range(int(per_entry.max(initial=0))):
        entries = slice(None) if uniform else np.flatnonzero(per_entry > j)
        at, end, msg = pos[entries], ends[entries], first[entries] + j
        meta_at = at + 4
        meta_end = meta_at + words[at]
        if (meta_end > end).any():
            raise Irregular  # (its size field too: at + 4 > end puts meta_end past it)
        fields.read(buf, meta_at, meta_end, msg)
        size = fields.payload_size[msg]
        if (size < 0).any():
            raise Irregular  # payload_size is required
        value_at[msg] = meta_end
        after = meta_end + size
        if (after > end).any():
            raise Irregular
        pos[entries] = after
    if (pos != ends).any():
        raise Irregular
    data = pa.py_buffer(joined)

    null_value = fields.null_value
    value = cut(data, total, value_at, value_at + fields.payload_size, null_value)

    key = message_keys(data, total, fields.key_at, fields.key_end, fields.null_key, fields.b64)
    properties = message_properties(buf, data, total, fields.prop_msg, fields.prop_at, fields.prop_end, n)
    return SplitBatch(
        value=value,
        key=key,
        event_time=_long(fields.event_time),
        sequence_id=_long(fields.sequence_id),
        batch_index=(np.arange(n, dtype=np.int64) - np.repeat(first, per_entry)).astype(np.int32),
        properties=properties,
        payload_bytes=int(fields.payload_size.sum()),
    )


class _Fields:
    """Each message's fields, filled in round by round: a field read later overwrites an earlier one (protobuf's
    last value wins), properties accumulate."""

    def __init__(
        self,
        n: int,
        per_entry: np.ndarray,
        event_times: Sequence[int] | np.ndarray,
        sequence_ids: Sequence[int] | np.ndarray,
    ) -> None:
        self.payload_size = np.full(n, -1, dtype=np.int64)
        self.key_at = np.full(n, -1, dtype=np.int64)
        self.key_end = np.full(n, -1, dtype=np.int64)
        self.b64 = np.zeros(n, dtype=bool)
        self.null_key = np.zeros(n, dtype=bool)
        self.null_value = np.zeros(n, dtype=bool)
        # Unset, a message's event time and sequence id are its entry's (Pulsar's clients do the same).
        self.event_time = np.repeat(np.asarray(event_times, dtype=np.uint64), per_entry)
        self.sequence_id = np.repeat(np.asarray(sequence_ids, dtype=np.uint64), per_entry)
        self.prop_msg: list[np.ndarray] = []
        self.prop_at: list[np.ndarray] = []
        self.prop_end: list[np.ndarray] = []

    def read(self, buf: np.ndarray, at: np.ndarray, end: np.ndarray, msg: np.ndarray) -> None:
        """Decode the ``SingleMessageMetadata`` in ``buf[at[i]:end[i]]`` of message ``msg[i]``, for every i."""
        for tags, field_at, field_end, value, who in records(buf, at, end, msg, _KNOWN, _LENGTH_DELIMITED):
            if isinstance(tags, int):  # the usual round: the same field in every message
                self._set(tags, field_at, field_end, value, who)
                continue
            for tag in np.unique(tags).tolist():
                mask = tags == tag
                self._set(tag, field_at[mask], field_end[mask], value[mask], who[mask])

    def _set(self, tag: int, field_at: np.ndarray, field_end: np.ndarray, value: np.ndarray, who: np.ndarray) -> None:
        if tag == _PROPERTIES:
            self.prop_msg.append(who)
            self.prop_at.append(field_at)
            self.prop_end.append(field_end)
        elif tag == _PAYLOAD_SIZE:
            if (value > _INT32_MAX).any():
                raise Irregular
            self.payload_size[who] = value
        elif tag == _SEQUENCE_ID:
            self.sequence_id[who] = value
        elif tag == _EVENT_TIME:
            self.event_time[who] = value
        elif tag == _PARTITION_KEY:
            self.key_at[who] = field_at
            self.key_end[who] = field_end
        elif tag != _ORDERING_KEY:  # the bools
            if (value > 1).any():
                raise Irregular  # a bool that is not 0 or 1
            if tag == _NULL_VALUE:
                self.null_value[who] = value == 1
            elif tag == _KEY_B64:
                self.b64[who] = value == 1
            elif tag == _NULL_KEY:
                self.null_key[who] = value == 1


def message_keys(
    data: pa.Buffer, total: int, key_at: np.ndarray, key_end: np.ndarray, null_key: np.ndarray, b64: np.ndarray
) -> pa.Array:
    """Each message's key (binary; null without one, or when marked null): its bytes at ``key_at:key_end`` (-1: no
    key), UTF-8 (a key is a proto2 string: the per-entry split refuses one that is not), base64-decoded where
    ``b64`` says so."""
    n = len(key_at)
    has_key = (key_at >= 0) & ~null_key
    keyed = np.flatnonzero(has_key)
    raw_keys = cut(data, total, key_at[keyed], key_end[keyed])
    check_utf8(raw_keys)
    if b64[keyed].any():
        key_list: list[bytes | None] = [None] * n
        for i, raw, encoded in zip(keyed.tolist(), raw_keys.to_pylist(), b64[keyed].tolist(), strict=True):
            key_list[i] = _b64decode(raw) if encoded else raw
        return pa.array(key_list, pa.binary())
    index = np.full(n, -1, dtype=np.int64)
    index[keyed] = np.arange(len(keyed))
    return raw_keys.take(pa.array(index, mask=~has_key))


def _b64decode(raw: bytes) -> bytes:
    try:
        return base64.b64decode(raw.decode())
    except ValueError:  # not base64 (or not ASCII): the per-entry split raises its error
        raise Irregular from None


def _long(values: np.ndarray) -> np.ndarray:
    if (values > _INT64_MAX).any():
        raise Irregular  # the per-entry split fails building the column, with its own error
    return values.astype(np.int64)


def message_properties(
    buf: np.ndarray,
    data: pa.Buffer,
    total: int,
    prop_msg: list[np.ndarray],
    prop_at: list[np.ndarray],
    prop_end: list[np.ndarray],
    n: int,
) -> pa.MapArray:
    """The properties of ``n`` messages, in order, as a map: the ``KeyValue`` records at ``prop_at:prop_end`` of
    message ``prop_msg`` (arrays as read, round by round), decoded like the messages."""
    if prop_msg:
        msg = np.concatenate(prop_msg)
        at = np.concatenate(prop_at)
        end = np.concatenate(prop_end)
        order = np.argsort(at, kind="stable")  # the order of the bytes: message by message, as written
        msg, at, end = msg[order], at[order], end[order]
    else:
        msg = at = end = np.zeros(0, dtype=np.int64)
    count = len(at)
    kv = np.arange(count, dtype=np.int64)
    key_at = np.full(count, -1, dtype=np.int64)
    key_end = key_at.copy()
    value_at = key_at.copy()
    value_end = key_at.copy()
    for tags, field_at, field_end, _length, who in records(buf, at, end, kv, _KV_KNOWN, _KV_KNOWN):
        mask = np.asarray(tags == _KV_KEY)
        if mask.all():
            key_at[who], key_end[who] = field_at, field_end
        elif not mask.any():
            value_at[who], value_end[who] = field_at, field_end
        else:
            key_at[who[mask]], key_end[who[mask]] = field_at[mask], field_end[mask]
            mask = ~mask
            value_at[who[mask]], value_end[who[mask]] = field_at[mask], field_end[mask]
    if (key_at < 0).any() or (value_at < 0).any():
        raise Irregular  # both are required
    keys = check_utf8(cut(data, total, key_at, key_end))
    values = check_utf8(cut(data, total, value_at, value_end))
    per_message = np.bincount(msg, minlength=n)
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(per_message, out=offsets[1:])
    several = np.flatnonzero(per_message > 1)
    if len(several):
        names = keys.to_pylist()
        for lo, hi in zip(offsets[several].tolist(), offsets[several + 1].tolist(), strict=True):
            if len(set(names[lo:hi])) != hi - lo:
                raise Irregular  # a repeated key: its last value, in its first place (the per-entry split)
    return pa.MapArray.from_arrays(pa.array(offsets), keys, values, type=pa.map_(pa.string(), pa.string()))
