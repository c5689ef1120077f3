"""Pulsar entries in "headers and payload" format: what a broker stores as one BookKeeper entry.

Layout (big-endian), as Pulsar's ``Commands.serializeMetadataAndPayload`` writes it::

    [u16 0x0e02][u32 size][size bytes BrokerEntryMetadata]     optional, prepended by some brokers
    [u16 0x0e01][u32 crc32c]                                   checksum of everything after it
    [u32 n][n bytes MessageMetadata][payload]

A batched entry (``num_messages_in_batch`` present in the metadata) has a payload of repeated
``[u32 k][k bytes SingleMessageMetadata][payload_size bytes]``, one per message.

Decoding hands out memoryviews into the caller's buffer, so payloads are never copied (except a
compressed payload, which is inflated with :mod:`streamoffload.codecs.compression`: LZ4, ZLIB, ZSTD
and SNAPPY as Pulsar frames them).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TypeVar, cast

import crc32c as _crc32c
from google.protobuf.message import DecodeError, EncodeError
from google.protobuf.message import Message as _ProtoMessage
from google.protobuf.unknown_fields import UnknownFieldSet

from streamoffload.codecs.compression import MAX_UNCOMPRESSED, compress, decompress
from streamoffload.codecs.errors import (
    BadMagicError,
    ChecksumError,
    FormatError,
    LengthMismatchError,
    TruncatedError,
)
from streamoffload.codecs.proto.pulsar_api_pb2 import (
    BrokerEntryMetadata,
    CompressionType,
    KeyValue,
    MessageMetadata,
    SingleMessageMetadata,
)
from streamoffload.codecs.protobuf import missing_fields, parse_from

__all__ = [
    "MAGIC_BROKER_ENTRY_METADATA",
    "MAGIC_CRC32C",
    "BrokerEntryMetadata",
    "CompressionType",
    "DecodedEntry",
    "EntryMessage",
    "Message",
    "MessageMetadata",
    "SingleMessageMetadata",
    "build_entry",
    "crc32c",
    "decode_entry",
    "encode_entry",
    "entry_messages",
    "metadata_encrypted",
    "metadata_num_messages",
    "parse_broker_entry_metadata",
    "split_messages",
    "uncompressed_payload",
]

MAGIC_CRC32C = 0x0E01
MAGIC_BROKER_ENTRY_METADATA = 0x0E02

_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_CHECKSUM_HEADER = struct.Struct(">HI")  # magic, crc32c
_BROKER_HEADER = struct.Struct(">HI")  # magic, size

_M = TypeVar("_M", bound=_ProtoMessage)

# MessageMetadata's encryption fields in upstream PulsarApi.proto: 13 encryption_keys, 14 encryption_algo,
# 15 encryption_param. Deliberately undeclared in pulsar_api.proto, so they stay unknown fields, byte for byte.
_ENCRYPTION_FIELDS = frozenset((13, 14, 15))

_U32_MAX = 0xFFFFFFFF
_INT32_MAX = 0x7FFFFFFF


def crc32c(data: bytes | bytearray | memoryview, value: int = 0) -> int:
    """CRC-32C (Castagnoli) of ``data`` as an unsigned int, continuing from ``value``."""
    return _crc32c.crc32c(data, value)


@dataclass
class Message:
    """One message as a producer sent it: the input of :func:`build_entry`."""

    payload: bytes
    key: str | None = None
    properties: dict[str, str] = field(default_factory=dict)
    event_time: int = 0
    ordering_key: bytes | None = None
    sequence_id: int | None = None


@dataclass(frozen=True)
class EntryMessage:
    """One message read out of an entry."""

    batch_index: int  # -1 for a non-batched entry (Pulsar's convention), 0..n-1 inside a batch
    payload: memoryview | bytes
    key: str | None
    properties: dict[str, str]
    publish_time: int
    event_time: int
    sequence_id: int
    producer_name: str
    ordering_key: bytes | None = None
    key_b64_encoded: bool = False
    null_value: bool = False
    compacted_out: bool = False


@dataclass(frozen=True)
class DecodedEntry:
    """An entry split into its parts; ``payload`` is a view into the decoded buffer."""

    metadata: MessageMetadata
    payload: memoryview
    broker_entry_metadata: bytes | None
    checksum: int | None = None  # the stored CRC-32C; None for an entry written without one
    payload_offset: int = 0  # where the payload starts in the decoded buffer
    metadata_offset: int = 0  # where the MessageMetadata starts in the decoded buffer

    @property
    def is_batch(self) -> bool:
        return self.metadata.HasField("num_messages_in_batch")

    @property
    def num_messages(self) -> int:
        """How many messages the entry holds, from its metadata alone (nothing is decompressed or split)."""
        return metadata_num_messages(self.metadata)

    @property
    def encrypted(self) -> bool:
        """True for an end-to-end encrypted entry (MessageMetadata carries encryption keys, algorithm or
        parameters): its payload is ciphertext, which cannot be inflated or split into messages here."""
        return metadata_encrypted(self.metadata)


def metadata_encrypted(metadata: MessageMetadata) -> bool:
    """Whether ``metadata`` has any of the encryption fields 13-15 (kept as unknown fields)."""
    fields = UnknownFieldSet(metadata)  # indexed: its stub declares no __iter__
    return any(fields[i].field_number in _ENCRYPTION_FIELDS for i in range(len(fields)))


def metadata_num_messages(metadata: MessageMetadata) -> int:
    """The message count of an entry with this metadata: ``num_messages_in_batch`` for a batch, else 1."""
    return metadata.num_messages_in_batch if metadata.HasField("num_messages_in_batch") else 1


# ---------------------------------------------------------------------------------------------
# encoding


def _serialize(message: MessageMetadata | SingleMessageMetadata | BrokerEntryMetadata) -> bytes:
    try:
        return message.SerializeToString()
    except EncodeError as exc:
        missing = missing_fields(message)
        raise ValueError(f"{message.DESCRIPTOR.name} is missing required fields: {missing}") from exc


def encode_entry(
    metadata: MessageMetadata,
    payload: bytes | bytearray | memoryview,
    *,
    broker_entry_metadata: bytes | BrokerEntryMetadata | None = None,
) -> bytes:
    """``[u16 0x0e01][u32 crc32c][u32 n][n bytes metadata][payload]``, optionally behind a broker prefix."""
    meta = _serialize(metadata)
    body = b"".join((_U32.pack(len(meta)), meta, payload))
    checksum = _crc32c.crc32c(body)
    head = _CHECKSUM_HEADER.pack(MAGIC_CRC32C, checksum)
    if broker_entry_metadata is None:
        return head + body
    if isinstance(broker_entry_metadata, BrokerEntryMetadata):
        broker_entry_metadata = _serialize(broker_entry_metadata)
    prefix = _BROKER_HEADER.pack(MAGIC_BROKER_ENTRY_METADATA, len(broker_entry_metadata)) + broker_entry_metadata
    return b"".join((prefix, head, body))


def _key_values(properties: dict[str, str]) -> list[KeyValue]:
    return [KeyValue(key=k, value=v) for k, v in properties.items()]


def build_entry(
    messages: Sequence[Message],
    *,
    producer_name: str,
    sequence_id: int,
    publish_time: int,
    batched: bool | None = None,
    compression: int = CompressionType.NONE,
) -> bytes:
    """Build one entry from the messages a producer sent, as a Pulsar producer would.

    ``batched`` defaults to ``len(messages) > 1``. A message without its own ``sequence_id`` gets
    ``sequence_id + its index``, as a producer numbers the messages of a batch. With ``compression``, the payload
    (the whole batch) is compressed with that codec, as a producer configured with it does.
    """
    if not messages:
        raise ValueError("build_entry needs at least one message")
    if batched is None:
        batched = len(messages) > 1
    if not batched:
        if len(messages) != 1:
            raise ValueError(f"a non-batched entry holds exactly one message, got {len(messages)}")
        msg = messages[0]
        metadata = MessageMetadata(
            producer_name=producer_name,
            sequence_id=sequence_id if msg.sequence_id is None else msg.sequence_id,
            publish_time=publish_time,
            properties=_key_values(msg.properties),
            uncompressed_size=len(msg.payload),
        )
        if msg.key is not None:
            metadata.partition_key = msg.key
        if msg.event_time:
            metadata.event_time = msg.event_time
        if msg.ordering_key is not None:
            metadata.ordering_key = msg.ordering_key
        return _encode_compressed(metadata, msg.payload, compression)

    parts: list[bytes] = []
    highest = sequence_id
    for i, msg in enumerate(messages):
        if len(msg.payload) > _INT32_MAX:
            raise ValueError(f"message {i} payload of {len(msg.payload)} bytes does not fit a batch (int32 size)")
        seq = sequence_id + i if msg.sequence_id is None else msg.sequence_id
        highest = max(highest, seq)
        single = SingleMessageMetadata(
            properties=_key_values(msg.properties),
            payload_size=len(msg.payload),
            sequence_id=seq,
        )
        if msg.key is not None:
            single.partition_key = msg.key
        if msg.event_time:
            single.event_time = msg.event_time
        if msg.ordering_key is not None:
            single.ordering_key = msg.ordering_key
        meta = _serialize(single)
        parts += (_U32.pack(len(meta)), meta, msg.payload)
    payload = b"".join(parts)
    if len(payload) > _U32_MAX:
        raise ValueError(f"batch payload of {len(payload)} bytes does not fit an entry")
    metadata = MessageMetadata(
        producer_name=producer_name,
        sequence_id=sequence_id,
        publish_time=publish_time,
        num_messages_in_batch=len(messages),
        uncompressed_size=len(payload),
        highest_sequence_id=highest,
    )
    return _encode_compressed(metadata, payload, compression)


def _encode_compressed(metadata: MessageMetadata, payload: bytes, compression: int) -> bytes:
    if compression != CompressionType.NONE:
        metadata.compression = cast(CompressionType, compression)  # an int at run time, as the stub's enum is
        payload = compress(compression, payload)
    return encode_entry(metadata, payload)


# ---------------------------------------------------------------------------------------------
# decoding


def _parse(cls: type[_M], data: memoryview, offset: int, where: str | None, what: str) -> _M:
    msg = cls()
    try:
        parse_from(msg, data)
    except DecodeError as exc:
        raise FormatError(
            f"{what} ({len(data)} bytes) is not a valid protobuf message: {exc}", offset=offset, where=where
        ) from None
    # upb's parser does not enforce proto2 `required`; a message missing one is not what it claims to be.
    if not msg.IsInitialized():
        missing = missing_fields(msg)
        raise FormatError(f"{what} is missing required fields: {missing}", offset=offset, where=where)
    return msg


def parse_broker_entry_metadata(data: bytes | memoryview, *, where: str | None = None) -> BrokerEntryMetadata:
    """Parse the raw bytes of :attr:`DecodedEntry.broker_entry_metadata`."""
    return _parse(BrokerEntryMetadata, memoryview(data), 0, where, "BrokerEntryMetadata")


def decode_entry(
    buf: bytes | bytearray | memoryview, *, verify_checksum: bool = True, where: str | None = None
) -> DecodedEntry:
    """Split an entry into broker metadata, message metadata and payload, checking its CRC-32C.

    Raises a :class:`FormatError` subclass naming the byte offset on anything malformed:
    :class:`TruncatedError`, :class:`ChecksumError`, :class:`BadMagicError`, :class:`LengthMismatchError`.
    An entry without the 0x0e01 checksum section (written by pre-v6 protocol clients) is accepted,
    as Pulsar accepts it, when its metadata size is plausible.
    """
    mv = memoryview(buf)
    if mv.ndim != 1 or mv.itemsize != 1:
        mv = mv.cast("B")
    size = len(mv)
    pos = 0
    broker: bytes | None = None

    if size < 2:
        raise TruncatedError(f"entry of {size} bytes is too short for a magic number", offset=0, where=where)
    magic = _U16.unpack_from(mv, 0)[0]
    if magic == MAGIC_BROKER_ENTRY_METADATA:
        if size < _BROKER_HEADER.size:
            raise TruncatedError(
                f"entry of {size} bytes ends inside the broker entry metadata header", offset=size, where=where
            )
        broker_size = _BROKER_HEADER.unpack_from(mv, 0)[1]
        end = _BROKER_HEADER.size + broker_size
        if end > size:
            raise TruncatedError(
                f"broker entry metadata of {broker_size} bytes runs past the end of the {size}-byte entry",
                offset=2,
                where=where,
            )
        broker = bytes(mv[_BROKER_HEADER.size : end])
        pos = end
        if size - pos < 2:
            raise TruncatedError("entry ends after its broker entry metadata", offset=size, where=where)
        magic = _U16.unpack_from(mv, pos)[0]

    checksum: int | None = None
    if magic == MAGIC_CRC32C:
        if size - pos < _CHECKSUM_HEADER.size:
            raise TruncatedError("entry ends inside its checksum header", offset=size, where=where)
        checksum = _CHECKSUM_HEADER.unpack_from(mv, pos)[1]
        pos += _CHECKSUM_HEADER.size
        if verify_checksum:
            actual = _crc32c.crc32c(mv[pos:])
            if actual != checksum:
                raise ChecksumError(
                    f"entry checksum mismatch: stored CRC-32C 0x{checksum:08x}, computed 0x{actual:08x} over "
                    f"{size - pos} bytes (corrupt or truncated entry)",
                    offset=pos - 4,
                    where=where,
                )

    if size - pos < 4:
        raise TruncatedError("entry ends inside its metadata size field", offset=size, where=where)
    meta_size = _U32.unpack_from(mv, pos)[0]
    meta_start = pos + 4
    meta_end = meta_start + meta_size
    if meta_end > size:
        if checksum is None and broker is None:
            raise BadMagicError(
                f"entry starts with 0x{magic:04x}, neither the checksum magic 0x{MAGIC_CRC32C:04x} nor the "
                f"broker entry metadata magic 0x{MAGIC_BROKER_ENTRY_METADATA:04x}, nor a plausible metadata size",
                offset=0,
                where=where,
            )
        raise TruncatedError(
            f"message metadata of {meta_size} bytes runs past the end of the {size}-byte entry",
            offset=pos,
            where=where,
        )
    metadata = _parse(MessageMetadata, mv[meta_start:meta_end], meta_start, where, "MessageMetadata")
    return DecodedEntry(
        metadata=metadata,
        payload=mv[meta_end:],
        broker_entry_metadata=broker,
        checksum=checksum,
        payload_offset=meta_end,
        metadata_offset=meta_start,
    )


def entry_incompressible(buf: bytes | bytearray | memoryview) -> bool:
    """Whether an entry's payload is already compressed or end-to-end encrypted by its producer, so that
    compressing it again would spend CPU for nothing (``codecs.block_frames``); False when unsure."""
    try:
        metadata = decode_entry(buf, verify_checksum=False).metadata
    except FormatError:
        return False
    return metadata.compression != CompressionType.NONE or metadata_encrypted(metadata)


def uncompressed_payload(
    decoded: DecodedEntry, where: str | None = None, max_size: int = MAX_UNCOMPRESSED
) -> memoryview:
    """The entry's payload, inflated if it is compressed (a view into the entry otherwise) to at most
    ``max_size`` bytes (``codecs.compression.max_uncompressed`` of the broker's ``maxMessageSize``)."""
    md = decoded.metadata
    if md.compression == CompressionType.NONE:
        return decoded.payload
    return memoryview(
        decompress(
            md.compression,
            decoded.payload,
            md.uncompressed_size,
            max_size=max_size,
            offset=decoded.payload_offset,
            where=where,
        )
    )


def _text(value: str | bytes, what: str, offset: int, where: str | None) -> str:
    # upb hands back bytes for a proto2 string field that is not valid UTF-8 (Java would replace the
    # bad bytes); refuse loudly rather than silently alter a key or property.
    if isinstance(value, bytes):
        raise FormatError(f"{what} is not valid UTF-8: {value[:40]!r}", offset=offset, where=where)
    return value


def _key(meta: MessageMetadata | SingleMessageMetadata, offset: int, where: str | None) -> str | None:
    if meta.HasField("partition_key") and not meta.null_partition_key:
        return _text(meta.partition_key, "partition_key", offset, where)
    return None


def _props(items: Sequence[KeyValue], offset: int, where: str | None) -> dict[str, str]:
    return {
        _text(kv.key, "property key", offset, where): _text(kv.value, "property value", offset, where) for kv in items
    }


def split_messages(
    decoded: DecodedEntry, *, where: str | None = None, max_uncompressed: int = MAX_UNCOMPRESSED
) -> list[EntryMessage]:
    """The messages of an already decoded entry (one with ``batch_index`` -1 if it is not a batch); a compressed
    payload is inflated to at most ``max_uncompressed`` bytes (``uncompressed_payload``)."""
    md = decoded.metadata
    meta_at = decoded.metadata_offset
    producer_name = _text(md.producer_name, "producer_name", meta_at, where)
    payload = uncompressed_payload(decoded, where, max_uncompressed)
    # Offsets in errors are into the entry for an uncompressed payload, into the inflated payload otherwise.
    base = decoded.payload_offset if md.compression == CompressionType.NONE else 0
    if not md.HasField("num_messages_in_batch"):
        return [
            EntryMessage(
                batch_index=-1,
                payload=payload,
                key=_key(md, meta_at, where),
                properties=_props(md.properties, meta_at, where),
                publish_time=md.publish_time,
                event_time=md.event_time,
                sequence_id=md.sequence_id,
                producer_name=producer_name,
                ordering_key=md.ordering_key if md.HasField("ordering_key") else None,
                key_b64_encoded=md.partition_key_b64_encoded,
                null_value=md.null_value,
            )
        ]

    count = md.num_messages_in_batch
    if count < 0:
        raise FormatError(f"num_messages_in_batch is negative ({count})", offset=base, where=where)
    size = len(payload)
    pos = 0
    out: list[EntryMessage] = []
    for index in range(count):
        if size - pos < 4:
            raise TruncatedError(
                f"batch ends before message {index} of {count} (no room for its metadata size)",
                offset=base + pos,
                where=where,
            )
        k = _U32.unpack_from(payload, pos)[0]
        start = pos + 4
        if start + k > size:
            raise TruncatedError(
                f"metadata of batch message {index} ({k} bytes) runs past the end of the batch",
                offset=base + pos,
                where=where,
            )
        single = _parse(
            SingleMessageMetadata,
            payload[start : start + k],
            base + start,
            where,
            f"SingleMessageMetadata of batch message {index}",
        )
        data_start = start + k
        n = single.payload_size
        if n < 0 or data_start + n > size:
            raise TruncatedError(
                f"payload of batch message {index} ({n} bytes) runs past the end of the batch",
                offset=base + data_start,
                where=where,
            )
        pos = data_start + n
        out.append(
            EntryMessage(
                batch_index=index,
                payload=payload[data_start:pos],
                key=_key(single, base + start, where),
                properties=_props(single.properties, base + start, where),
                publish_time=md.publish_time,
                event_time=single.event_time if single.HasField("event_time") else md.event_time,
                # Pulsar's clients fall back to the entry's sequence id when a message has none.
                sequence_id=single.sequence_id if single.HasField("sequence_id") else md.sequence_id,
                producer_name=producer_name,
                ordering_key=single.ordering_key if single.HasField("ordering_key") else None,
                key_b64_encoded=single.partition_key_b64_encoded,
                null_value=single.null_value,
                compacted_out=single.compacted_out,
            )
        )
    if pos != size:
        raise LengthMismatchError(
            f"batch of {count} messages ends at byte {pos} of its {size}-byte payload ({size - pos} bytes left over)",
            offset=base + pos,
            where=where,
        )
    return out


def entry_messages(
    buf: bytes | bytearray | memoryview, *, verify_checksum: bool = True, where: str | None = None
) -> list[EntryMessage]:
    """Decode an entry and split it into its messages.

    A batch (``num_messages_in_batch`` present) gives messages with ``batch_index`` 0..n-1; a
    non-batched entry gives one message with ``batch_index`` -1. Payloads are views into ``buf``
    (for an uncompressed entry).
    """
    return split_messages(decode_entry(buf, verify_checksum=verify_checksum, where=where), where=where)
