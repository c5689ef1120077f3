"""Pulsar's binary protocol on the wire, shared by everything here that talks to a broker directly
(``streamoffload/pulsar/broker_connection.py``, the raw-entry reader, the tests' scripted brokers and producer).

A frame is a command, optionally followed by a payload (a ``MESSAGE``'s entry, a ``SEND``'s entry)::

    [u32 totalSize][u32 commandSize][BaseCommand][payload]

``totalSize`` counts everything after itself (``4 + commandSize + len(payload)``), big-endian.
``BaseCommand`` is ``codecs/proto/pulsar_api.proto``'s (checked against upstream ``PulsarApi.proto``).

The few fields the generated classes do not declare (``MessageIdData``'s batch size as the Python client
serializes it, producer commands in the tests) are read and written with the small protobuf wire helpers
below: varints, length-delimited fields and :func:`proto_fields`.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from types import SimpleNamespace

from streamoffload.codecs.proto.pulsar_api_pb2 import BaseCommand, ServerError

FRAME_HEADER = struct.Struct(">II")  # totalSize, commandSize
MAX_FRAME = 128 << 20  # Pulsar's maxMessageSize is 5 MiB by default; a larger frame is corruption

T = SimpleNamespace(**dict(BaseCommand.Type.items()))
"""``BaseCommand.Type``'s values as plain attributes: protobuf's enum wrapper looks a name up in a dict through
``__getattr__`` at every use, and the readers compare a frame's type per entry (4% of a source task's time)."""


def frame(command: BaseCommand, payload: bytes = b"") -> bytes:
    """One frame: ``command`` and its ``payload`` (none for most commands)."""
    body = command.SerializeToString()
    return FRAME_HEADER.pack(len(body) + 4 + len(payload), len(body)) + body + payload


def server_error(code: int) -> str:
    """A ``ServerError`` code by its name (the number when it has none here)."""
    return ServerError.Name(code) if code in ServerError.values() else str(code)


def request_id_of(cmd: BaseCommand) -> int | None:
    """The request id an answer carries, ``None`` for commands that answer no request."""
    kind = cmd.type
    if kind == T.SUCCESS:
        return cmd.success.request_id
    if kind == T.ERROR:
        return cmd.error.request_id
    if kind == T.LOOKUP_RESPONSE:
        return cmd.lookupTopicResponse.request_id
    if kind == T.GET_LAST_MESSAGE_ID_RESPONSE:
        return cmd.getLastMessageIdResponse.request_id
    if kind == T.GET_TOPICS_OF_NAMESPACE_RESPONSE:
        return cmd.getTopicsOfNamespaceResponse.request_id
    if kind == T.GET_SCHEMA_RESPONSE:
        return cmd.getSchemaResponse.request_id
    return None


# ---------------------------------------------------------------------------------------------
# protobuf wire format, for fields the generated classes do not declare


def varint(value: int) -> bytes:
    """``value`` as a protobuf varint."""
    if value < 0:
        value += 1 << 64  # int32/int64 negatives are encoded as 10-byte varints
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = 0
    shift = 0
    while True:
        if pos >= len(buf):
            raise ValueError("truncated varint")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint longer than 10 bytes")


def proto_fields(buf: bytes) -> Iterator[tuple[int, int, int | bytes]]:
    """``(field number, wire type, value)`` of each field of a protobuf message; varints as ints,
    length-delimited fields as bytes, fixed-size fields as ints."""
    pos = 0
    end = len(buf)
    while pos < end:
        tag, pos = read_varint(buf, pos)
        number, wire = tag >> 3, tag & 7
        value: int | bytes
        if wire == 0:
            value, pos = read_varint(buf, pos)
        elif wire == 2:
            size, pos = read_varint(buf, pos)
            if pos + size > end:
                raise ValueError(f"field {number} of {size} bytes runs past the message end")
            value = bytes(buf[pos : pos + size])
            pos += size
        elif wire == 1:
            if pos + 8 > end:
                raise ValueError("truncated fixed64")
            value = int.from_bytes(buf[pos : pos + 8], "little")
            pos += 8
        elif wire == 5:
            if pos + 4 > end:
                raise ValueError("truncated fixed32")
            value = int.from_bytes(buf[pos : pos + 4], "little")
            pos += 4
        else:
            raise ValueError(f"unsupported wire type {wire} for field {number}")
        yield number, wire, value


def batch_size_of(serialized_message_id: bytes) -> int:
    """The batch size in a serialized ``MessageIdData`` (field 6), 0 when absent (not batched)."""
    for number, wire, value in proto_fields(serialized_message_id):
        if number == 6 and wire == 0:
            return int(value)
    return 0


def field_varint(number: int, value: int) -> bytes:
    """Field ``number`` as a varint (wire type 0)."""
    return varint(number << 3) + varint(value)


def field_bytes(number: int, value: bytes) -> bytes:
    """Field ``number`` as length-delimited bytes (wire type 2)."""
    return varint(number << 3 | 2) + varint(len(value)) + value


__all__ = [
    "FRAME_HEADER",
    "MAX_FRAME",
    "batch_size_of",
    "field_bytes",
    "field_varint",
    "frame",
    "proto_fields",
    "read_varint",
    "request_id_of",
    "server_error",
    "varint",
]
