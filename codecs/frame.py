"""The checksum frame of streamoffload's own small objects (manifests and commits, block checksum records).

    [4-byte magic][u32 big-endian CRC-32C (Castagnoli) of the body][body]

The magic names what the object is and its frame version; the CRC makes any damage detectable, which a
protobuf or a packed struct alone would not (most damaged byte strings still parse into *something*).
"""

from __future__ import annotations

import struct

import crc32c as _crc32c

from streamoffload.codecs.errors import BadMagicError, ChecksumError, TruncatedError

_FRAME = struct.Struct(">4sI")
FRAME_LENGTH = _FRAME.size
"""Bytes before the body: the magic and the CRC."""


def frame(magic: bytes, body: bytes) -> bytes:
    """``body`` behind ``magic`` and its CRC-32C."""
    return _FRAME.pack(magic, _crc32c.crc32c(body)) + body


def unframe(
    data: bytes | memoryview,
    magic: bytes,
    *,
    what: str,
    where: str | None = None,
    min_length: int = FRAME_LENGTH,
    not_magic_hint: str = "",
) -> memoryview:
    """The body of a frame, after checking its length (at least ``min_length`` bytes: the frame and any
    fixed header of the body), its magic and its CRC-32C. The errors name ``what`` the object is,
    ``where`` it is (the object key) and the byte offset: ``TruncatedError``, ``BadMagicError`` (with
    ``not_magic_hint`` appended, e.g. how such bytes could have come about), ``ChecksumError``."""
    view = memoryview(data)
    if len(view) < min_length:
        part = "checksum frame" if min_length == FRAME_LENGTH else "header"
        raise TruncatedError(
            f"{what} of {len(view)} bytes is shorter than its {min_length}-byte {part}", offset=len(view), where=where
        )
    found, stored = _FRAME.unpack_from(view, 0)
    if found != magic:
        raise BadMagicError(
            f"not a {what}: starts with 0x{bytes(found).hex()}, expected 0x{magic.hex()}{not_magic_hint}",
            offset=0,
            where=where,
        )
    body = view[FRAME_LENGTH:]
    actual = _crc32c.crc32c(body)
    if actual != stored:
        raise ChecksumError(
            f"{what} checksum mismatch: stored CRC-32C 0x{stored:08x}, computed 0x{actual:08x} over "
            f"{len(body)} bytes (damaged or truncated)",
            offset=4,
            where=where,
        )
    return body


__all__ = ["FRAME_LENGTH", "frame", "unframe"]
