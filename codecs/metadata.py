"""The per-ledger metadata that index objects carry, and UUID <-> (msb, lsb) as the protobufs store them.

- A v1 (PIP-17) index holds a BookKeeper ``LedgerMetadataFormat`` of the ledger it covers.
- A v2 (PIP-76) index holds, per ledger, a managed-ledger ``LedgerInfo``.

Our readers only need the ledger id, entry count and sizes from these; Pulsar's Java readers parse
them fully, so they must be well-formed messages with every required field.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import TypeVar

from google.protobuf.message import DecodeError, EncodeError
from google.protobuf.message import Message as _ProtoMessage

from streamoffload.codecs.errors import FormatError
from streamoffload.codecs.proto.bookkeeper_pb2 import LedgerMetadataFormat
from streamoffload.codecs.proto.managed_ledger_pb2 import (
    KeyValue,
    ManagedLedgerInfo,
    OffloadContext,
    OffloadDriverMetadata,
    OffloadSegment,
)
from streamoffload.codecs.protobuf import missing_fields, parse_from

__all__ = [
    "KeyValue",
    "LedgerInfo",
    "LedgerMetadataFormat",
    "ManagedLedgerInfo",
    "OffloadContext",
    "OffloadDriverMetadata",
    "OffloadSegment",
    "ledger_info_v2",
    "ledger_metadata_v1",
    "msb_lsb_to_uuid",
    "parse_ledger_info",
    "parse_ledger_metadata_v1",
    "uuid_to_msb_lsb",
]

# Pulsar names it ManagedLedgerInfo.LedgerInfo; everything here speaks of it as LedgerInfo.
LedgerInfo = ManagedLedgerInfo.LedgerInfo

_M = TypeVar("_M", bound=_ProtoMessage)

_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1


def _check_int64(name: str, value: int) -> None:
    if not _INT64_MIN <= value <= _INT64_MAX:
        raise ValueError(f"{name}={value} does not fit a signed 64-bit integer")


def ledger_metadata_v1(
    *,
    last_entry_id: int,
    length: int,
    ctime_ms: int,
    ensemble_size: int = 1,
    quorum_size: int = 1,
    ack_quorum_size: int = 1,
    ensemble: Sequence[str] = ("offloaded:0",),
    custom_metadata: Mapping[str, bytes] | None = None,
) -> bytes:
    """A CLOSED ``LedgerMetadataFormat`` with digest CRC32C and one segment starting at entry 0.

    This is what Pulsar's offloader stores in a v1 index: the ledger as it was when it was closed.
    ``last_entry_id`` is -1 for an empty ledger; ``length`` is the ledger's size in bytes.
    """
    for name, value in (("last_entry_id", last_entry_id), ("length", length), ("ctime_ms", ctime_ms)):
        _check_int64(name, value)
    if last_entry_id < -1:
        raise ValueError(f"last_entry_id={last_entry_id} must be >= -1")
    if length < 0:
        raise ValueError(f"length={length} must be >= 0")
    if not ensemble:
        raise ValueError("ensemble needs at least one member")
    md = LedgerMetadataFormat(
        quorumSize=quorum_size,
        ensembleSize=ensemble_size,
        length=length,
        lastEntryId=last_entry_id,
        state=LedgerMetadataFormat.CLOSED,
        segment=[LedgerMetadataFormat.Segment(ensembleMember=list(ensemble), firstEntryId=0)],
        digestType=LedgerMetadataFormat.CRC32C,
        ackQuorumSize=ack_quorum_size,
        ctime=ctime_ms,
    )
    for key, raw in (custom_metadata or {}).items():
        md.customMetadata.add(key=key, value=bytes(raw))
    try:
        return md.SerializeToString()
    except (EncodeError, ValueError) as exc:
        raise ValueError(f"cannot encode LedgerMetadataFormat: {exc}") from exc


def ledger_info_v2(
    *,
    ledger_id: int,
    entries: int,
    size: int,
    timestamp_ms: int,
    properties: Mapping[str, str] | None = None,
) -> bytes:
    """A managed-ledger ``LedgerInfo`` as a v2 index stores it per ledger.

    ``entries`` is the ledger's entry count as Pulsar keeps it, counted from entry 0: a segment that holds
    entries up to ``e`` of the ledger writes ``e + 1``, however many of them it holds (Pulsar's streaming
    reader takes ``entries - 1`` of the ledger's last index as its last entry). ``size``: the bytes of the
    ledger's entries in the segment.
    """
    for name, value in (("ledger_id", ledger_id), ("entries", entries), ("size", size), ("timestamp_ms", timestamp_ms)):
        _check_int64(name, value)
    if entries < 0 or size < 0:
        raise ValueError(f"entries={entries} and size={size} must be >= 0")
    info = LedgerInfo(ledgerId=ledger_id, entries=entries, size=size, timestamp=timestamp_ms)
    for key, text in (properties or {}).items():
        info.properties.add(key=key, value=text)
    return info.SerializeToString()


def _parse(cls: type[_M], data: bytes | memoryview, what: str, where: str | None) -> _M:
    msg = cls()
    try:
        parse_from(msg, data)
    except DecodeError as exc:
        raise FormatError(f"{what} ({len(data)} bytes) is not a valid protobuf message: {exc}", where=where) from None
    # upb does not enforce proto2 `required` while parsing; garbage often parses as unknown fields.
    if not msg.IsInitialized():
        missing = missing_fields(msg)
        raise FormatError(f"{what} ({len(data)} bytes) is missing required fields: {missing}", where=where)
    return msg


def parse_ledger_metadata_v1(data: bytes | memoryview, *, where: str | None = None) -> LedgerMetadataFormat:
    """Parse the ledger metadata of a v1 index; :class:`FormatError` if it is not one."""
    return _parse(LedgerMetadataFormat, data, "LedgerMetadataFormat", where)


def parse_ledger_info(data: bytes | memoryview, *, where: str | None = None) -> ManagedLedgerInfo.LedgerInfo:
    """Parse the per-ledger ``LedgerInfo`` of a v2 index; :class:`FormatError` if it is not one."""
    return _parse(LedgerInfo, data, "LedgerInfo", where)


def uuid_to_msb_lsb(u: uuid.UUID) -> tuple[int, int]:
    """The two signed 64-bit halves of ``u``, as Java's ``UUID.getMost/LeastSignificantBits``."""
    value = u.int
    msb, lsb = value >> 64, value & 0xFFFFFFFFFFFFFFFF
    return _signed64(msb), _signed64(lsb)


def msb_lsb_to_uuid(msb: int, lsb: int) -> uuid.UUID:
    """Inverse of :func:`uuid_to_msb_lsb`; accepts signed (as stored) or unsigned halves."""
    for name, value in (("msb", msb), ("lsb", lsb)):
        if not _INT64_MIN <= value <= 0xFFFFFFFFFFFFFFFF:
            raise ValueError(f"{name}={value} is not a 64-bit value")
    return uuid.UUID(int=((msb & 0xFFFFFFFFFFFFFFFF) << 64) | (lsb & 0xFFFFFFFFFFFFFFFF))


def _signed64(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value
