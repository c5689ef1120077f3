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
A payload that does not inflate to exactly ``uncompressed_size`` bytes is refused.
"""

from __future__ import annotations

import zlib

import cramjam

from streamoffload.codecs.block_frames import zstd_content_size
from streamoffload.codecs.errors import FormatError, LengthMismatchError
from streamoffload.codecs.proto.pulsar_api_pb2 import CompressionType

__all__ = ["CODECS", "MAX_UNCOMPRESSED", "codec_name", "compress", "decompress"]

# Pulsar's default maxMessageSize is 5 MiB and brokers cap it far below this; a larger inflated size
# is taken as corruption rather than allocated.
MAX_UNCOMPRESSED = 1 << 30

CODECS = (CompressionType.NONE, CompressionType.LZ4, CompressionType.ZLIB, CompressionType.ZSTD, CompressionType.SNAPPY)

Buffer = bytes | bytearray | memoryview


def codec_name(codec: int) -> str:
    return CompressionType.Name(codec) if codec in CompressionType.values() else f"unknown codec {codec}"


def compress(codec: int, data: Buffer) -> bytes:
    """``data`` compressed as a Pulsar producer compresses a payload with ``codec``."""
    if codec == CompressionType.NONE:
        return bytes(data)
    if codec == CompressionType.LZ4:
        return bytes(cramjam.lz4.compress_block(data, store_size=False))
    if codec == CompressionType.ZLIB:
        return zlib.compress(data)
    if codec == CompressionType.ZSTD:
        return bytes(cramjam.zstd.compress(data))
    if codec == CompressionType.SNAPPY:
        return bytes(cramjam.snappy.compress_raw(data))
    raise ValueError(f"cannot compress with {codec_name(codec)}")


def _inflate_zlib(data: Buffer, size: int, offset: int | None, where: str | None) -> memoryview:
    inflater = zlib.decompressobj()
    try:
        out = inflater.decompress(data, size + 1)
    except zlib.error as exc:
        raise FormatError(f"ZLIB payload does not inflate: {exc}", offset=offset, where=where) from None
    if len(out) != size or not inflater.eof:
        raise LengthMismatchError(
            f"ZLIB payload inflates to {len(out)}{'+' if not inflater.eof else ''} bytes, "
            f"metadata says uncompressed_size {size}",
            offset=offset,
            where=where,
        )
    return memoryview(out)


def decompress(
    codec: int, data: Buffer, uncompressed_size: int, *, offset: int | None = None, where: str | None = None
) -> Buffer:
    """The payload ``data`` decompressed with ``codec`` to exactly ``uncompressed_size`` bytes.

    ``NONE`` hands ``data`` back untouched. Raises :class:`FormatError` (with ``offset``/``where``
    for the message) when the codec is unknown or the bytes do not decompress, and
    :class:`LengthMismatchError` when they decompress to another size than the metadata says.
    """
    if codec == CompressionType.NONE:
        return data
    name = codec_name(codec)
    if codec not in CODECS:
        raise FormatError(
            f"entry payload is compressed with {name}, which Pulsar does not define", offset=offset, where=where
        )
    if uncompressed_size < 0 or uncompressed_size > MAX_UNCOMPRESSED:
        raise LengthMismatchError(
            f"uncompressed_size {uncompressed_size} is implausible for a {name} payload", offset=offset, where=where
        )
    if codec == CompressionType.ZLIB:
        return _inflate_zlib(data, uncompressed_size, offset, where)
    try:
        if codec == CompressionType.LZ4:
            # A raw block with no size prefix, inflated into exactly uncompressed_size bytes: a block
            # that inflates to more fails, one that inflates to less reports the smaller count.
            buf = bytearray(uncompressed_size)
            try:
                written = cramjam.lz4.decompress_block_into(data, buf)
            except Exception as exc:
                if "large enough" not in str(exc):
                    raise
                raise LengthMismatchError(
                    f"payload compressed with LZ4 decompresses to more than {uncompressed_size} bytes, metadata says "
                    f"uncompressed_size {uncompressed_size}",
                    offset=offset,
                    where=where,
                ) from None
            if written != uncompressed_size:
                raise LengthMismatchError(
                    f"payload compressed with LZ4 decompresses to {written} bytes, metadata says "
                    f"uncompressed_size {uncompressed_size}",
                    offset=offset,
                    where=where,
                )
            return memoryview(buf)
        elif codec == CompressionType.ZSTD:
            # A frame that declares another size than the metadata's is refused before it is inflated, so a
            # damaged header cannot make a reader allocate up to its claim (frames without one are inflated).
            declared = zstd_content_size(memoryview(data)[:18])
            if declared is not None and declared != uncompressed_size:
                raise LengthMismatchError(
                    f"payload compressed with ZSTD declares {declared} bytes, metadata says uncompressed_size "
                    f"{uncompressed_size}",
                    offset=offset,
                    where=where,
                )
            out = cramjam.zstd.decompress(data)
        else:
            out = cramjam.snappy.decompress_raw(data)
    except LengthMismatchError:
        raise
    except Exception as exc:  # cramjam raises its own DecompressionError (or ValueError on bad input)
        raise FormatError(
            f"payload compressed with {name} does not decompress: {exc}", offset=offset, where=where
        ) from None
    result = memoryview(out)  # a cramjam Buffer
    if len(result) != uncompressed_size:
        raise LengthMismatchError(
            f"payload compressed with {name} decompresses to {len(result)} bytes, metadata says "
            f"uncompressed_size {uncompressed_size}",
            offset=offset,
            where=where,
        )
    return result
