"""Compression at rest of a data object's blocks, and the frame table that says where each stored block lies.

A compressed segment stores each block (the block exactly as an uncompressed segment stores it: header,
entries, padding) as one *frame*: the block compressed with zstd, or the block as it is (``NONE``) when
compressing would not make it smaller or when every entry in it was already compressed by its producer. An
encrypted segment seals each frame after that (``codecs.block_cipher``, at the block's plaintext offset), so
compression always comes before encryption. The index and the recorded checksums stay the plaintext's.

Stored frames are no longer at computable offsets, so a segment records its **frame table**: per block, the
codec, the stored length and the filler bytes that follow the frame (a part that compressed below the
store's minimum part size is filled up to it, since S3 refuses smaller parts but the last). Each part's
frames are recorded as the sink writes the part (:class:`PartFrames`, a small object beside it); the seal
joins them into the segment's table (:func:`encode_table`), which the Offloaded manifest carries.

Pure: bytes in, bytes out, no I/O.
"""

from __future__ import annotations

import base64
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import cramjam

from streamoffload.codecs.errors import FormatError

CODEC_NONE = 0
CODEC_ZSTD = 1
CODEC_NAMES = {CODEC_NONE: "none", CODEC_ZSTD: "zstd"}

COMPRESSIONS = ("none", "zstd")
"""The values of the ``offloadCompression`` policy field."""

DEFAULT_LEVEL = 1
"""The policy's default level: on JSON events, level 3's ratio within half a percent at 1.4 times the speed."""

FILLER = b"\0"

_FRAME = struct.Struct(">BII")  # codec, stored length, filler after
_PART_HEADER = struct.Struct(">4sBI")  # magic, version, frame count
_PART_MAGIC = b"SOPF"
_TABLE_VERSION = 1


class FrameError(FormatError):
    """A frame that does not decode to its block, or a frame table that cannot be read."""


@dataclass(frozen=True)
class Frame:
    """One block as stored: its codec, its stored length (cipher overhead included) and the filler after it."""

    codec: int
    stored_length: int
    filler: int = 0


@dataclass(frozen=True)
class StoredBlock:
    """Where a block's plaintext is (the index's offsets) and where its stored frame is."""

    plain_offset: int
    plain_length: int
    stored_offset: int
    stored_length: int
    codec: int = CODEC_NONE


def compress_block(plain: bytes, level: int = DEFAULT_LEVEL, *, skip: bool = False) -> tuple[int, bytes]:
    """``(codec, frame)`` of one block: zstd, unless ``skip`` (its entries are compressed already) or the
    compressed form is not smaller, in which case the block as it is."""
    if not skip:
        packed = bytes(cramjam.zstd.compress(plain, level=level))
        if len(packed) < len(plain):
            return CODEC_ZSTD, packed
    return CODEC_NONE, plain


MAX_BLOCK = 0x7FFFFFFF
"""The largest block a policy can give (``managedLedgerOffloadMaxBlockSizeInBytes`` is Pulsar's int): the
default bound on the plaintext of one frame when the segment's own block size is not known."""


def decompress_block(
    codec: int,
    frame: bytes,
    plain_length: int,
    *,
    offset: int = 0,
    where: str | None = None,
    max_size: int = MAX_BLOCK,
) -> bytes | bytearray:
    """The block a frame holds; :class:`FrameError` unless it is exactly ``plain_length`` bytes (the index's).

    A zstd frame is inflated into a buffer of ``plain_length`` bytes, checked against ``max_size`` (the
    segment's block size) and against the content size the frame's header declares before it is allocated:
    a frame that would inflate to more fails when the buffer is full, one that inflates to less is refused."""
    if codec == CODEC_NONE:
        plain = frame
    elif codec == CODEC_ZSTD:
        if plain_length > max_size:
            raise FrameError(
                f"zstd frame of the block at plaintext offset {offset}: the index says the block holds "
                f"{plain_length} bytes, above the segment's {max_size}-byte block size",
                offset=offset,
                where=where,
            )
        claimed = zstd_content_size(frame)
        if claimed != plain_length:
            raise FrameError(
                f"zstd frame of the block at plaintext offset {offset} says it holds "
                f"{'an unknown number of' if claimed is None else claimed} bytes, the index says {plain_length}",
                offset=offset,
                where=where,
            )
        out = bytearray(plain_length)
        try:
            written = cramjam.zstd.decompress_into(frame, out)
        except Exception as err:  # cramjam raises its own DecompressionError, also when the buffer is full
            raise FrameError(
                f"zstd frame of the block at plaintext offset {offset} does not decompress to the {plain_length} "
                f"bytes its index says: {err}",
                offset=offset,
                where=where,
            ) from None
        if written != plain_length:
            raise FrameError(
                f"zstd frame of the block at plaintext offset {offset} holds {written} bytes, the index says "
                f"{plain_length}",
                offset=offset,
                where=where,
            )
        return out
    else:
        raise FrameError(f"block at plaintext offset {offset} has unknown codec {codec}", offset=offset, where=where)
    if len(plain) != plain_length:
        raise FrameError(
            f"{CODEC_NAMES[codec]} frame of the block at plaintext offset {offset} holds {len(plain)} bytes, "
            f"the index says {plain_length}",
            offset=offset,
            where=where,
        )
    return plain


_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


def zstd_content_size(frame: bytes | memoryview) -> int | None:
    """The content size a zstd frame's header declares (RFC 8878, 3.1.1.1), or None when it declares none or
    is not a zstd frame."""
    if len(frame) < 6 or bytes(frame[:4]) != _ZSTD_MAGIC:
        return None
    descriptor = frame[4]
    size_flag, single_segment, dict_flag = descriptor >> 6, (descriptor >> 5) & 1, descriptor & 3
    at = 5 + (0 if single_segment else 1) + (0, 1, 2, 4)[dict_flag]
    width = (1 if single_segment else 0, 2, 4, 8)[size_flag]
    if width == 0 or len(frame) < at + width:
        return None
    value = int.from_bytes(bytes(frame[at : at + width]), "little")
    return value + 256 if width == 2 else value


@dataclass(frozen=True)
class PartFrames:
    """The frames of one part, in block order: what the sink records beside the part it writes."""

    frames: tuple[Frame, ...]

    @property
    def stored_length(self) -> int:
        return sum(f.stored_length + f.filler for f in self.frames)

    def encode(self) -> bytes:
        return _PART_HEADER.pack(_PART_MAGIC, _TABLE_VERSION, len(self.frames)) + _pack(self.frames)

    @classmethod
    def decode(cls, data: bytes, *, where: str | None = None) -> PartFrames:
        if len(data) < _PART_HEADER.size:
            raise FrameError(f"part frame record of {len(data)} bytes is truncated", offset=0, where=where)
        magic, version, n = _PART_HEADER.unpack_from(data)
        if magic != _PART_MAGIC or version != _TABLE_VERSION:
            raise FrameError(f"not a part frame record (magic {magic!r}, version {version})", offset=0, where=where)
        return cls(_unpack(data[_PART_HEADER.size :], n, where))


def _pack(frames: Iterable[Frame]) -> bytes:
    return b"".join(_FRAME.pack(f.codec, f.stored_length, f.filler) for f in frames)


def _unpack(data: bytes, n: int | None, where: str | None) -> tuple[Frame, ...]:
    if len(data) % _FRAME.size or (n is not None and len(data) != n * _FRAME.size):
        raise FrameError(f"frame table of {len(data)} bytes is not {n} frames of {_FRAME.size}", where=where)
    frames = tuple(Frame(*fields) for fields in _FRAME.iter_unpack(data))
    for i, frame in enumerate(frames):
        if frame.codec not in CODEC_NAMES:
            raise FrameError(f"frame {i + 1} has unknown codec {frame.codec}", where=where)
    return frames


def encode_table(frames: Sequence[Frame]) -> str:
    """The segment's frame table as the manifest's property text (base64 of 9 bytes per block)."""
    return base64.b64encode(bytes([_TABLE_VERSION]) + _pack(frames)).decode("ascii")


def decode_table(text: str, *, where: str | None = None) -> tuple[Frame, ...]:
    try:
        raw = base64.b64decode(text.encode("ascii"), validate=True)
    except (ValueError, UnicodeEncodeError):
        raise FrameError("the manifest's frame table is not base64", where=where) from None
    if not raw or raw[0] != _TABLE_VERSION:
        raise FrameError(f"the manifest's frame table has version {raw[:1].hex() or 'none'}", where=where)
    return _unpack(raw[1:], None, where)


def stored_blocks(
    plain: Sequence[tuple[int, int]], frames: Sequence[Frame] | None, overhead: int = 0
) -> list[StoredBlock]:
    """Each block's plaintext ``(offset, length)`` (the index's, in object order) with where its frame is
    stored: from the frame table, or, without one (an encrypted segment that is not compressed), each block
    ``overhead`` bytes longer than its plaintext."""
    if frames is not None and len(frames) != len(plain):
        raise FrameError(f"frame table has {len(frames)} frames, the index {len(plain)} blocks")
    out = []
    stored = 0
    for i, (offset, length) in enumerate(plain):
        frame = frames[i] if frames is not None else Frame(CODEC_NONE, length + overhead)
        out.append(StoredBlock(offset, length, stored, frame.stored_length, frame.codec))
        stored += frame.stored_length + frame.filler
    return out


def stored_size(frames: Sequence[Frame]) -> int:
    """The data object's size: every frame and its filler."""
    return sum(f.stored_length + f.filler for f in frames)


__all__ = [
    "CODEC_NAMES",
    "CODEC_NONE",
    "CODEC_ZSTD",
    "COMPRESSIONS",
    "DEFAULT_LEVEL",
    "FILLER",
    "MAX_BLOCK",
    "Frame",
    "FrameError",
    "PartFrames",
    "StoredBlock",
    "compress_block",
    "decode_table",
    "decompress_block",
    "encode_table",
    "stored_blocks",
    "stored_size",
    "zstd_content_size",
]
