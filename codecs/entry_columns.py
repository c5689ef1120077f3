"""The messages of entries as columns: each field of many entries' messages appended to a flat list, without
an object per message, for readers that build Arrow columns (``read.dataset_read``).

:func:`append_messages` gives the same messages, fields and errors as :func:`codecs.entry.split_messages`;
it only skips what costs a Python object per message there (an ``EntryMessage``, a properties dict, a
payload ``bytes``). A batch goes through one tight loop: each ``SingleMessageMetadata`` is parsed by the
protobuf runtime (upb, in C) and only the fields a row needs are read. Anything out of the ordinary in an
entry (a malformed batch, a string that is not UTF-8, repeated property keys) sends that entry through
``split_messages`` instead, which raises its usual error or gives the messages to append.

Pure: no I/O.
"""

from __future__ import annotations

import base64
import binascii
import struct
from dataclasses import dataclass, field

from google.protobuf.message import DecodeError

from streamoffload.codecs.compression import MAX_UNCOMPRESSED
from streamoffload.codecs.entry import (
    DecodedEntry,
    EntryMessage,
    SingleMessageMetadata,
    metadata_num_messages,
    split_messages,
    uncompressed_payload,
)
from streamoffload.codecs.protobuf import from_buffer

__all__ = ["MessageColumns", "append_messages"]

_U32 = struct.Struct(">I")


@dataclass(slots=True)
class MessageColumns:
    """Messages of entries, field by field. Per message: the values (``value_sizes``, and the payloads in
    ``value_parts``, joined back to back: one part per entry, or per message; ``null_values`` lists the messages
    whose value is null, stored as empty: size 0, no part), ``keys`` (the key's bytes, base64-decoded when the
    producer marked it so; None without a key), ``event_times`` (0 when unset), ``sequence_ids``,
    ``batch_indexes`` (-1 for a non-batched entry) and the properties (message i's are the pairs
    ``prop_offsets[i]:prop_offsets[i + 1]`` of ``prop_keys`` and ``prop_values``, in first-occurrence order,
    a repeated key keeping its last value as in ``EntryMessage.properties``). Per entry: ``counts`` (its
    messages), ``batch_sizes`` (its message count for a batch, 0 otherwise), ``publish_times`` and
    ``producer_names``."""

    value_parts: list[memoryview | bytes] = field(default_factory=list)
    value_sizes: list[int] = field(default_factory=list)
    null_values: list[int] = field(default_factory=list)
    keys: list[bytes | None] = field(default_factory=list)
    event_times: list[int] = field(default_factory=list)
    sequence_ids: list[int] = field(default_factory=list)
    batch_indexes: list[int] = field(default_factory=list)
    prop_offsets: list[int] = field(default_factory=lambda: [0])
    prop_keys: list[str] = field(default_factory=list)
    prop_values: list[str] = field(default_factory=list)
    counts: list[int] = field(default_factory=list)
    batch_sizes: list[int] = field(default_factory=list)
    publish_times: list[int] = field(default_factory=list)
    producer_names: list[str] = field(default_factory=list)
    messages: int = 0
    payload_bytes: int = 0
    """The sum of the messages' payload lengths (a null value's stored payload included)."""

    def value(self, i: int) -> bytes | None:
        """Message ``i``'s value (for tests and tools)."""
        if i in self.null_values:
            return None
        data = b"".join(self.value_parts)
        at = sum(self.value_sizes[:i])
        return data[at : at + self.value_sizes[i]]

    def properties(self, i: int) -> list[tuple[str, str]]:
        """Message ``i``'s properties as pairs (for tests and tools)."""
        lo, hi = self.prop_offsets[i], self.prop_offsets[i + 1]
        return list(zip(self.prop_keys[lo:hi], self.prop_values[lo:hi], strict=True))

    def _mark(self) -> tuple[int, ...]:
        return (
            len(self.value_parts),
            len(self.null_values),
            len(self.keys),
            len(self.prop_keys),
            self.messages,
            self.payload_bytes,
        )

    def _rollback(self, mark: tuple[int, ...]) -> None:
        parts, nulls, n, props, messages, payload = mark
        del self.value_parts[parts:]
        del self.null_values[nulls:]
        for column in (self.value_sizes, self.keys, self.event_times, self.sequence_ids, self.batch_indexes):
            del column[n:]
        del self.prop_offsets[n + 1 :]
        del self.prop_keys[props:]
        del self.prop_values[props:]
        self.messages, self.payload_bytes = messages, payload

    def _append_message(self, msg: EntryMessage) -> None:
        """One message as ``split_messages`` gives it."""
        payload = msg.payload
        if msg.null_value:
            self.null_values.append(self.messages)
            self.value_sizes.append(0)
        else:
            self.value_parts.append(payload)
            self.value_sizes.append(len(payload))
        if msg.key is None:
            self.keys.append(None)
        else:
            self.keys.append(base64.b64decode(msg.key) if msg.key_b64_encoded else msg.key.encode())
        self.event_times.append(msg.event_time)
        self.sequence_ids.append(msg.sequence_id)
        self.batch_indexes.append(msg.batch_index)
        self.prop_keys.extend(msg.properties)
        self.prop_values.extend(msg.properties.values())
        self.prop_offsets.append(len(self.prop_keys))
        self.messages += 1
        self.payload_bytes += len(payload)


class _Irregular(Exception):
    """Something the fast loop leaves to ``split_messages``."""


def append_messages(
    decoded: DecodedEntry,
    columns: MessageColumns,
    *,
    where: str | None = None,
    max_uncompressed: int = MAX_UNCOMPRESSED,
) -> int:
    """Append the messages of an already decoded entry to ``columns``; returns how many. Raises what
    ``split_messages`` raises for the entry (with the same ``max_uncompressed``), and then leaves ``columns`` as
    they were."""
    md = decoded.metadata
    mark = columns._mark()
    producer = md.producer_name
    try:
        if not md.HasField("num_messages_in_batch") or type(producer) is not str:
            raise _Irregular  # one message: the per-entry path costs nothing extra here
        count = _append_batch(decoded, columns, where, max_uncompressed)
    except _Irregular:
        columns._rollback(mark)
        messages = split_messages(decoded, where=where, max_uncompressed=max_uncompressed)
        for msg in messages:
            columns._append_message(msg)
        count = len(messages)
        producer = messages[0].producer_name if messages else md.producer_name
    columns.counts.append(count)
    columns.batch_sizes.append(count if md.HasField("num_messages_in_batch") else 0)
    columns.publish_times.append(md.publish_time)
    columns.producer_names.append(producer)
    return count


def _append_batch(decoded: DecodedEntry, columns: MessageColumns, where: str | None, max_uncompressed: int) -> int:
    md = decoded.metadata
    count = metadata_num_messages(md)
    if count < 0:
        raise _Irregular
    payload = uncompressed_payload(decoded, where, max_uncompressed)
    size = len(payload)
    entry_event_time = md.event_time
    entry_sequence_id = md.sequence_id
    parse = from_buffer(SingleMessageMetadata)
    unpack = _U32.unpack_from
    parts: list[memoryview] = []
    sizes = columns.value_sizes
    keys = columns.keys
    events = columns.event_times
    seqs = columns.sequence_ids
    prop_offsets = columns.prop_offsets
    prop_keys = columns.prop_keys
    prop_values = columns.prop_values
    first = columns.messages
    pos = metadata_bytes = 0
    for index in range(count):
        if size - pos < 4:
            raise _Irregular
        start = pos + 4
        meta_end = start + unpack(payload, pos)[0]
        metadata_bytes += meta_end - pos
        if meta_end > size:
            raise _Irregular
        try:
            single = parse(payload[start:meta_end])
        except DecodeError:
            raise _Irregular from None
        if not single.IsInitialized():
            raise _Irregular
        pos = meta_end + single.payload_size
        if pos > size or pos < meta_end:
            raise _Irregular
        if single.null_value:
            columns.null_values.append(first + index)
            sizes.append(0)
        else:
            parts.append(payload[meta_end:pos])
            sizes.append(pos - meta_end)

        key = single.partition_key
        if (key or single.HasField("partition_key")) and not single.null_partition_key:
            if type(key) is not str:
                raise _Irregular
            if single.partition_key_b64_encoded:
                try:
                    keys.append(base64.b64decode(key))
                except binascii.Error:
                    raise _Irregular from None  # split_messages may find something else wrong first
            else:
                keys.append(key.encode())
        else:
            keys.append(None)

        properties = single.properties
        if properties:
            if len(properties) == 1:
                kv = properties[0]
                pk, pv = kv.key, kv.value
                if type(pk) is not str or type(pv) is not str:
                    raise _Irregular
                prop_keys.append(pk)
                prop_values.append(pv)
            else:
                as_dict = {kv.key: kv.value for kv in properties}
                if not all(type(k) is str and type(v) is str for k, v in as_dict.items()):
                    raise _Irregular
                prop_keys.extend(as_dict)
                prop_values.extend(as_dict.values())
        prop_offsets.append(len(prop_keys))

        event_time = single.event_time
        if not event_time and not single.HasField("event_time"):
            event_time = entry_event_time
        events.append(event_time)
        # Pulsar's clients fall back to the entry's sequence id when a message has none.
        sequence_id = single.sequence_id
        if not sequence_id and not single.HasField("sequence_id"):
            sequence_id = entry_sequence_id
        seqs.append(sequence_id)
    if pos != size:
        raise _Irregular
    # One bytes per entry: views kept until the batch is built would each be an object the cyclic garbage
    # collector walks again and again (measured: a third of the time of a read).
    columns.value_parts.append(b"".join(parts))
    columns.batch_indexes.extend(range(count))
    columns.messages += count
    columns.payload_bytes += size - metadata_bytes
    return count
