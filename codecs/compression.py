"""Pulsar's four payload codecs, framed exactly as Pulsar's clients frame them.

A compressed entry's ``MessageMetadata`` says ``compression`` and ``uncompressed_size``; the
payload (the whole batch, for a batched entry) is then, per codec (Pulsar's
``CompressionCodecLZ4/Zlib/ZStd/Snappy`` in Java, ``Compression*`` in the C++ client):

* ``LZ4``: one raw LZ4 *block*, without a size prefix and without the LZ4 frame format (the reader
  is told the size by ``uncompressed_size``);
* ``ZLIB``: a zlib stream (RFC 1950: the 2-byte header, deflate data, Adler-32), as Java's
  ``Deflater`` writes it;
* ``ZSTD``: one Zstandard frame;
* ``SNAPPY``: raw Snappy (not the framed/streaming format).

One library does all four: ``cramjam`` (Rust bindings, wheels for every platform, no system
libraries). ZLIB goes through Python's own ``zlib``, which also checks the stream's end.
Decompression is bounded by what is real: the ``uncompressed_size`` a payload's metadata declares is held
to a hard cap (``MAX_UNCOMPRESSED``, or the caller's ``max_size``) and, for LZ4 and Snappy, to the most the
payload's own bytes can inflate to, before any memory is taken; the payload is then inflated into a buffer of
exactly the declared size (``decompress_into``; ZLIB with ``max_length``), so a payload that would inflate to
more fails when the buffer is full and one that inflates to less is refused too. Every refusal is one
:class:`DecompressionError` naming the codec, the declared size and the entry.

ZSTD first goes through ``zstandard`` with a decompression context kept per thread, when the frame's header
declares exactly the size the metadata does: cramjam makes a new context per call, about 20 µs, most of what a
small entry costs (0.7 µs with one kept). Only exactly one frame of exactly that size is taken from it; anything
else goes the cramjam way, which gives the bytes or the refusal as before.
"""

from __future__ import annotations

import threading
import zlib

import cramjam
import zstandard

from streamoffload.codecs.block_frames import zstd_content_size
from streamoffload.codecs.errors import DecompressionError
from streamoffload.codecs.proto.pulsar_api_pb2 import CompressionType

__all__ = [
    "CODECS",
    "MAX_MESSAGE_SIZE",
    "MAX_UNCOMPRESSED",
    "DecompressionError",
    "codec_name",
    "compress",
    "decompress",
    "max_inflated",
    "max_uncompressed",
]

MAX_MESSAGE_SIZE = 5 * 1024 * 1024
"""Pulsar's ``maxMessageSize`` default (broker.conf): the largest entry a broker accepts."""

BATCH_FRAMING_ROOM = 1024 * 1024
"""What a cap on a payload's inflated size allows beyond ``maxMessageSize``: a full batch's own framing."""


def max_uncompressed(max_message_size: int = MAX_MESSAGE_SIZE) -> int:
    """The cap on a payload's inflated size for a broker whose ``maxMessageSize`` is ``max_message_size``
    (``[pulsar] max_message_size`` in the configuration): that and ``BATCH_FRAMING_ROOM``."""
    return max_message_size + BATCH_FRAMING_ROOM


MAX_UNCOMPRESSED = max_uncompressed()
"""The default cap on a payload's inflated size (``max_uncompressed`` of Pulsar's default ``maxMessageSize``).
Pulsar's producers close a batch before its uncompressed messages pass ``maxMessageSize`` (Java's
``BatchMessageContainerImpl.haveEnoughSpace``); the extra MiB holds the batch's own framing (per message a 4-byte
size and a ``SingleMessageMetadata``, 1,000 messages by default). A producer that compressed one message bigger
than that is refused with this bound named (its entry still reads as stored); the readers take the configured
broker's (``[pulsar] max_message_size``) through ``max_uncompressed``."""

# The codecs as plain ints (an attribute of the protobuf enum is a lookup each time: a few per entry read).
_NONE, _LZ4, _ZLIB, _ZSTD, _SNAPPY = (
    CompressionType.NONE,
    CompressionType.LZ4,
    CompressionType.ZLIB,
    CompressionType.ZSTD,
    CompressionType.SNAPPY,
)
CODECS = (_NONE, _LZ4, _ZLIB, _ZSTD, _SNAPPY)
_NAMES = {codec: CompressionType.Name(codec) for codec in CompressionType.values()}

# The most one byte of a codec's format inflates to: an LZ4 block's match grows 255 bytes per length byte (a
# whole sequence is at least 4 bytes for at most 273), a raw Snappy copy is at least 3 bytes for at most 64.
# ZLIB and ZSTD inflate step by step into their bound, so their ratio (1032, 32768) would add nothing.
_MAX_RATIO: dict[int, int] = {_LZ4: 255, _SNAPPY: 22}

Buffer = bytes | bytearray | memoryview


def codec_name(codec: int) -> str:
    name = _NAMES.get(codec)
    return name if name is not None else f"unknown codec {codec}"


def compress(codec: int, data: Buffer) -> bytes:
    """``data`` compressed as a Pulsar producer compresses a payload with ``codec``."""
    if codec == _NONE:
        return bytes(data)
    if codec == _LZ4:
        return bytes(cramjam.lz4.compress_block(data, store_size=False))
    if codec == _ZLIB:
        return zlib.compress(data)
    if codec == _ZSTD:
        return bytes(cramjam.zstd.compress(data))
    if codec == _SNAPPY:
        return bytes(cramjam.snappy.compress_raw(data))
    raise ValueError(f"cannot compress with {codec_name(codec)}")


def max_inflated(codec: int, compressed_length: int) -> int | None:
    """The most ``compressed_length`` bytes of ``codec`` can inflate to; None where the format sets no useful bound."""
    ratio = _MAX_RATIO.get(codec)
    return None if ratio is None else ratio * compressed_length


class _Refused(Exception):
    """A payload refused, for this reason: :func:`decompress` makes it the one error naming the codec, the sizes
    and the entry (built only then: a payload read costs no error object)."""


def decompress(
    codec: int,
    data: Buffer,
    uncompressed_size: int,
    *,
    max_size: int = MAX_UNCOMPRESSED,
    offset: int | None = None,
    where: str | None = None,
) -> Buffer:
    """The payload ``data`` decompressed with ``codec`` to exactly ``uncompressed_size`` bytes.

    ``NONE`` hands ``data`` back untouched. Otherwise raises :class:`DecompressionError` (with ``offset`` and
    ``where`` for the entry) when the codec is unknown, the declared size is above ``max_size`` or above what
    ``data`` can hold, or the bytes do not decompress to exactly that size; no more than the declared size is
    ever allocated, and nothing when the declared size is refused.
    """
    if codec == _NONE:
        return data
    try:
        return _inflate(codec, data, uncompressed_size, max_size)
    except _Refused as refused:
        name = codec_name(codec)
        raise DecompressionError(
            f"{name} payload with uncompressed_size {uncompressed_size} refused: {refused}",
            codec=name,
            declared=uncompressed_size,
            cap=max_size,
            offset=offset,
            where=where,
        ) from None


def decompress_into(codec: int, data: Buffer, out: memoryview, *, max_size: int = MAX_UNCOMPRESSED) -> None:
    """:func:`decompress` of ``data`` into ``out``, whose length is the declared uncompressed size: a reader that
    inflates many payloads into one buffer allocates and copies each once. The checks and the one error are
    :func:`decompress`'s; LZ4 (the usual codec) inflates in place, the others are copied in from :func:`decompress`,
    which also names why a payload is refused."""
    size = len(out)
    if codec == _LZ4 and size <= max_size and size <= _MAX_RATIO[_LZ4] * len(data):
        try:
            written = cramjam.lz4.decompress_block_into(data, out)
        except Exception:  # cramjam's DecompressionError
            written = -1
        if written == size:
            return
    out[:] = decompress(codec, data, size, max_size=max_size)


def _inflate(codec: int, data: Buffer, size: int, max_size: int) -> Buffer:
    if codec not in CODECS:
        raise _Refused("the entry is compressed with a codec Pulsar does not define")
    if size < 0 or size > max_size:
        raise _Refused(f"it is above the {max_size}-byte bound on a message's inflated size")
    bound = max_inflated(codec, len(data))
    if bound is not None and size > bound:
        raise _Refused(f"{len(data)} bytes of {codec_name(codec)} inflate to at most {bound}")
    if codec == _ZLIB:
        return _inflate_zlib(data, size)
    if codec == _ZSTD:
        declared = zstd_content_size(memoryview(data)[:18])
        if declared is not None and declared != size:
            raise _Refused(f"its frame declares {declared} bytes")
        if declared == size and size:
            inflated = _zstd_frame(data, size)
            if inflated is not None:
                return inflated
    elif codec == _SNAPPY:
        try:
            declared = cramjam.snappy.decompress_raw_len(data)
        except Exception as exc:  # cramjam's DecompressionError: no valid length preamble
            raise _Refused(f"it does not decompress: {exc}") from None
        if declared != size:
            raise _Refused(f"its preamble declares {declared} bytes")
    out = bytearray(size)
    try:
        if codec == _LZ4:
            written = cramjam.lz4.decompress_block_into(data, out)
        elif codec == _ZSTD:
            written = cramjam.zstd.decompress_into(data, out)
        else:
            written = cramjam.snappy.decompress_raw_into(data, out)
    except Exception as exc:  # cramjam's DecompressionError (or ValueError on bad input)
        text = str(exc)
        if "large enough" in text or "whole buffer" in text or "smaller than required" in text:
            raise _Refused(f"it inflates to more than {size} bytes") from None
        raise _Refused(f"it does not decompress: {text}") from None
    if written != size:
        raise _Refused(f"it inflates to {written} bytes")
    return memoryview(out)


_contexts = threading.local()


def _zstd_frame(data: Buffer, size: int) -> memoryview | None:
    """``data`` inflated by this thread's ``zstandard`` context when it is exactly one ZSTD frame of exactly
    ``size`` bytes (its header declares ``size``: no more is allocated); None otherwise, for the cramjam way to
    give the bytes or the refusal."""
    context = getattr(_contexts, "zstd", None)
    if context is None:
        context = _contexts.zstd = zstandard.ZstdDecompressor()
    try:
        out = context.decompress(data, max_output_size=size, read_across_frames=False, allow_extra_data=False)
    except zstandard.ZstdError:
        return None
    return memoryview(out) if len(out) == size else None


def _inflate_zlib(data: Buffer, size: int) -> memoryview:
    inflater = zlib.decompressobj()
    try:
        out = inflater.decompress(data, size + 1)  # one byte more than declared tells "more" from "exactly"
    except zlib.error as exc:
        raise _Refused(f"it does not inflate: {exc}") from None
    if len(out) > size:
        raise _Refused(f"it inflates to more than {size} bytes")
    if len(out) != size or not inflater.eof:
        raise _Refused(f"it inflates to {len(out)} bytes{'' if inflater.eof else ' and its stream does not end'}")
    return memoryview(out)
