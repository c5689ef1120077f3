"""Compression at rest, pure: blocks round-trip through their frames, frame tables through their encodings, and
a frame that does not decode to its block is refused."""

from __future__ import annotations

import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamoffload.codecs.block_frames import (
    CODEC_NONE,
    CODEC_ZSTD,
    Frame,
    FrameError,
    PartFrames,
    compress_block,
    decode_table,
    decompress_block,
    encode_table,
    stored_blocks,
    stored_size,
)
from streamoffload.codecs.entry import encode_entry, entry_incompressible
from streamoffload.codecs.proto.pulsar_api_pb2 import CompressionType, MessageMetadata

frames_strategy = st.lists(
    st.builds(Frame, st.sampled_from([CODEC_NONE, CODEC_ZSTD]), st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1)),
    max_size=50,
)


@given(st.binary(max_size=8192), st.integers(1, 9), st.booleans())
def test_a_block_round_trips_through_its_frame(plain: bytes, level: int, skip: bool) -> None:
    codec, frame = compress_block(plain, level, skip=skip)
    assert decompress_block(codec, frame, len(plain)) == plain
    assert len(frame) <= len(plain)  # never stored bigger than it is
    assert compress_block(plain, level, skip=skip) == (codec, frame)  # a rewrite after a crash: the same bytes
    if skip:
        assert (codec, frame) == (CODEC_NONE, plain)


def test_compressible_blocks_shrink_and_random_ones_are_stored_as_they_are() -> None:
    json_like = b"".join(b'{"id": %d, "name": "sensor-%d", "ok": true}' % (i, i % 7) for i in range(2000))
    codec, frame = compress_block(json_like)
    assert codec == CODEC_ZSTD and len(frame) < len(json_like) / 5
    noise = os.urandom(64 << 10)
    assert compress_block(noise) == (CODEC_NONE, noise)


def test_a_frame_that_does_not_decode_to_its_block_is_refused() -> None:
    plain = b"abc" * 1000
    codec, frame = compress_block(plain)
    with pytest.raises(FrameError, match="holds 3000 bytes, the index says 3001"):
        decompress_block(codec, frame, 3001, offset=128, where="k")
    with pytest.raises(FrameError, match="does not decompress"):
        decompress_block(CODEC_ZSTD, frame[:-4] + b"\xff\xff\xff\xff", 3000, offset=128, where="k")
    with pytest.raises(FrameError, match="says it holds an unknown number of bytes"):
        decompress_block(CODEC_ZSTD, b"not a zstd frame", 3000)
    with pytest.raises(FrameError, match="unknown codec 7"):
        decompress_block(7, frame, 3000)
    with pytest.raises(FrameError, match="none frame"):
        decompress_block(CODEC_NONE, plain[:-1], 3000)


@given(frames_strategy)
def test_part_records_and_tables_round_trip(frames: list[Frame]) -> None:
    part = PartFrames(tuple(frames))
    assert PartFrames.decode(part.encode()) == part
    assert part.stored_length == stored_size(frames)
    assert decode_table(encode_table(frames)) == tuple(frames)


def test_damaged_tables_and_records_are_refused() -> None:
    record = PartFrames((Frame(CODEC_ZSTD, 10, 0),)).encode()
    with pytest.raises(FrameError, match="not a part frame record"):
        PartFrames.decode(b"XXXX" + record[4:])
    with pytest.raises(FrameError, match="is not 1 frames"):
        PartFrames.decode(record[:-1])
    with pytest.raises(FrameError, match="not base64"):
        decode_table("!!")
    with pytest.raises(FrameError, match="unknown codec 9"):
        decode_table(encode_table([Frame(9, 1, 0)]))


def test_stored_blocks_follow_the_table_and_skip_the_filler() -> None:
    plain = [(0, 100), (100, 100), (200, 50)]
    laid = stored_blocks(plain, [Frame(CODEC_ZSTD, 30, 0), Frame(CODEC_NONE, 100, 70), Frame(CODEC_ZSTD, 20, 0)])
    assert [(b.stored_offset, b.stored_length, b.codec) for b in laid] == [(0, 30, 1), (30, 100, 0), (200, 20, 1)]
    assert [(b.plain_offset, b.plain_length) for b in laid] == plain
    # Without a table (encrypted, not compressed): each block longer by the overhead.
    assert [(b.stored_offset, b.stored_length) for b in stored_blocks(plain, None, 28)] == [
        (0, 128),
        (128, 128),
        (256, 78),
    ]
    with pytest.raises(FrameError, match="2 frames, the index 3 blocks"):
        stored_blocks(plain, [Frame(CODEC_NONE, 1), Frame(CODEC_NONE, 1)])


def test_entries_the_producer_compressed_are_known() -> None:
    metadata = MessageMetadata(producer_name="p", sequence_id=0, publish_time=1)
    plain = encode_entry(metadata, b"x" * 100)
    metadata.compression = CompressionType.ZSTD
    metadata.uncompressed_size = 100
    packed = encode_entry(metadata, b"x" * 100)
    assert not entry_incompressible(plain)
    assert entry_incompressible(packed)
    assert not entry_incompressible(b"\x00")  # unsure: compress it
