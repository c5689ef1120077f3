"""Pulsar's payload codecs (codecs/compression.py) and compressed entries through codecs/entry.py.

The hand-made vectors pin Pulsar's framing independently of the library: LZ4 is a raw block
without a size prefix, Snappy is raw (not framed), ZSTD is one frame, ZLIB a zlib stream."""

from __future__ import annotations

import threading
import zlib
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamoffload.codecs import compression
from streamoffload.codecs.compression import (
    CODECS,
    MAX_UNCOMPRESSED,
    codec_name,
    compress,
    decompress,
    decompress_into,
)
from streamoffload.codecs.entry import (
    CompressionType,
    Message,
    MessageMetadata,
    SingleMessageMetadata,
    build_entry,
    decode_entry,
    encode_entry,
    entry_messages,
)
from streamoffload.codecs.errors import DecompressionError

LZ4, ZLIB, ZSTD, SNAPPY = CompressionType.LZ4, CompressionType.ZLIB, CompressionType.ZSTD, CompressionType.SNAPPY
COMPRESSED = [LZ4, ZLIB, ZSTD, SNAPPY]

# "hello" in each framing, written by hand from the format specifications
VECTORS = {
    LZ4: b"\x50hello",  # one sequence: token 5 literals, no match (the block's last sequence)
    SNAPPY: b"\x05\x10hello",  # varint length 5, literal tag (5-1)<<2
    ZSTD: b"\x28\xb5\x2f\xfd\x20\x05\x29\x00\x00hello",  # magic, single segment FCS=5, one raw last block
    ZLIB: b"\x78\x01\x01\x05\x00\xfa\xffhello\x06\x2c\x02\x15",  # header, stored block, Adler-32
}


@pytest.mark.parametrize("codec", COMPRESSED, ids=codec_name)
def test_hand_made_vectors_decode(codec: int) -> None:
    assert bytes(decompress(codec, VECTORS[codec], 5)) == b"hello"


def test_lz4_is_a_raw_block_without_size_prefix() -> None:
    data = b"pulsar " * 200
    block = compress(LZ4, data)
    assert len(block) < len(data) and not block.startswith(b"\x04\x22\x4d\x18")  # not the LZ4 frame magic
    assert int.from_bytes(block[:4], "little") != len(data)  # no stored size in front
    assert bytes(decompress(LZ4, block, len(data))) == data


def test_snappy_is_raw_not_framed() -> None:
    data = b"abc" * 100
    raw = compress(SNAPPY, data)
    assert raw[0] == len(data) & 0x7F | 0x80  # starts with the varint length, not the framing's 0xff chunk
    assert bytes(decompress(SNAPPY, raw, len(data))) == data


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(COMPRESSED), st.binary(max_size=3000), st.integers(1, 40))
def test_round_trip(codec: int, data: bytes, repeat: int) -> None:
    payload = data * repeat
    assert bytes(decompress(codec, compress(codec, payload), len(payload))) == payload


@pytest.mark.parametrize("codec", COMPRESSED, ids=codec_name)
@pytest.mark.parametrize("delta", [-1, 1])
def test_wrong_uncompressed_size_is_refused(codec: int, delta: int) -> None:
    data = b"0123456789" * 50
    name = codec_name(codec)
    with pytest.raises(
        DecompressionError, match=f"^obj: {name} payload with uncompressed_size {500 + delta} refused: "
    ) as info:
        decompress(codec, compress(codec, data), 500 + delta, offset=7, where="obj")
    assert (info.value.codec, info.value.declared, info.value.offset) == (name, 500 + delta, 7)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(COMPRESSED), st.binary(max_size=3000), st.integers(1, 40), st.integers(0, 8))
def test_decompress_into_fills_its_place_as_decompress_gives_it(codec: int, data: bytes, repeat: int, at: int) -> None:
    payload = data * repeat
    block = compress(codec, payload)
    out = bytearray(b"\xaa" * (at + len(payload) + 3))
    decompress_into(codec, block, memoryview(out)[at : at + len(payload)])
    assert bytes(out) == b"\xaa" * at + payload + b"\xaa" * 3  # its place and nothing around it


@pytest.mark.parametrize("codec", COMPRESSED, ids=codec_name)
@pytest.mark.parametrize("delta", [-1, 1])
def test_decompress_into_refuses_as_decompress_does(codec: int, delta: int) -> None:
    data = b"0123456789" * 50
    with pytest.raises(DecompressionError) as want:
        decompress(codec, compress(codec, data), 500 + delta)
    with pytest.raises(DecompressionError) as got:
        decompress_into(codec, compress(codec, data), memoryview(bytearray(500 + delta)))
    assert str(got.value) == str(want.value)
    # An LZ4 claim beyond what the block can hold is refused before anything is inflated.
    with pytest.raises(DecompressionError, match="inflate to at most"):
        decompress_into(LZ4, compress(LZ4, data), memoryview(bytearray(255 * len(compress(LZ4, data)) + 1)))


@pytest.mark.parametrize("codec", COMPRESSED, ids=codec_name)
def test_garbage_is_a_format_error_naming_the_codec(codec: int) -> None:
    with pytest.raises(DecompressionError, match=codec_name(codec)) as info:
        decompress(codec, b"\xff" * 40, 100, offset=12, where="entry 3:4")
    assert info.value.offset == 12 and info.value.where == "entry 3:4"


def test_unknown_codec_and_implausible_size() -> None:
    with pytest.raises(DecompressionError, match=r"unknown codec 9 payload .* a codec Pulsar does not define"):
        decompress(9, b"x", 1)
    with pytest.raises(DecompressionError, match=f"above the {MAX_UNCOMPRESSED}-byte bound"):
        decompress(ZSTD, compress(ZSTD, b"x"), 1 << 31)
    assert decompress(CompressionType.NONE, b"raw", 99) == b"raw"
    assert set(CODECS) == {0, 1, 2, 3, 4}


def test_a_zstd_frame_declaring_another_size_is_refused_before_it_is_inflated() -> None:
    frame = compress(ZSTD, b"y" * 1000)
    with pytest.raises(DecompressionError, match="uncompressed_size 999 refused: its frame declares 1000 bytes"):
        decompress(ZSTD, frame, 999)
    # A frame that declares no size (a streaming compressor's: no FCS, a window descriptor) is still inflated and
    # its length checked.
    unsized = b"\x28\xb5\x2f\xfd\x00\x00\x29\x00\x00hello"
    assert bytes(decompress(ZSTD, unsized, 5)) == b"hello"
    with pytest.raises(DecompressionError, match="uncompressed_size 6 refused: it inflates to 5 bytes"):
        decompress(ZSTD, unsized, 6)


def _outcome(frame: bytes, size: int) -> bytes | str:
    try:
        return bytes(decompress(ZSTD, frame, size))
    except DecompressionError as err:
        return str(err)


@settings(max_examples=80, deadline=None)
@given(st.binary(max_size=3000), st.integers(1, 40), st.sampled_from(["", "byte", "frame", "empty frame"]), st.data())
def test_a_zstd_frame_inflates_as_cramjam_inflates_it_whatever_follows_it(
    data: bytes, repeat: int, after: str, draw: Any
) -> None:
    payload = data * repeat
    if not payload:
        return
    frame = compress(ZSTD, payload)
    assert compression._zstd_frame(frame, len(payload)) is not None  # the kept context inflates the usual frame
    tail = {"": b"", "byte": b"\x00", "frame": compress(ZSTD, b"more"), "empty frame": compress(ZSTD, b"")}[after]
    size = len(payload) + draw.draw(st.sampled_from([0, 0, -1, 1, 4]))
    with_context = _outcome(frame + tail, size)
    with pytest.MonkeyPatch.context() as patch:  # cramjam alone, as before the kept context
        patch.setattr(compression, "_zstd_frame", lambda data, size: None)
        assert with_context == _outcome(frame + tail, size)
    if not tail and size == len(payload):
        assert with_context == payload


def test_each_thread_inflates_with_its_own_zstd_context() -> None:
    payloads = [bytes([i]) * (1000 + i) + b"end" for i in range(8)]
    frames = [compress(ZSTD, p) for p in payloads]
    wrong: list[int] = []

    def inflate(k: int) -> None:
        for _ in range(200):
            i = (k + _) % len(frames)
            if bytes(decompress(ZSTD, frames[i], len(payloads[i]))) != payloads[i]:
                wrong.append(i)

    threads = [threading.Thread(target=inflate, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wrong == []


def _batch(messages: list[bytes]) -> bytes:
    parts = []
    for i, m in enumerate(messages):
        single = SingleMessageMetadata(payload_size=len(m), sequence_id=100 + i, partition_key=f"k{i}")
        meta = single.SerializeToString()
        parts += [len(meta).to_bytes(4, "big"), meta, m]
    return b"".join(parts)


@pytest.mark.parametrize("codec", COMPRESSED, ids=codec_name)
def test_compressed_batched_entry_splits_into_its_messages(codec: int) -> None:
    messages = [f"message {i} ".encode() * 20 for i in range(5)]
    batch = _batch(messages)
    md = MessageMetadata(
        producer_name="p",
        sequence_id=100,
        publish_time=1,
        num_messages_in_batch=5,
        compression=codec,
        uncompressed_size=len(batch),
    )
    entry = encode_entry(md, compress(codec, batch))
    decoded = decode_entry(entry)
    assert decoded.num_messages == 5 and len(decoded.payload) < len(batch)  # still compressed
    out = entry_messages(entry)
    assert [bytes(m.payload) for m in out] == messages
    assert [m.sequence_id for m in out] == [100, 101, 102, 103, 104]
    assert [m.key for m in out] == [f"k{i}" for i in range(5)]


@pytest.mark.parametrize("codec", COMPRESSED, ids=codec_name)
def test_compressed_single_message_entry(codec: int) -> None:
    payload = b"single " * 30
    md = MessageMetadata(
        producer_name="p", sequence_id=7, publish_time=1, compression=codec, uncompressed_size=len(payload)
    )
    entry = encode_entry(md, compress(codec, payload))
    assert decode_entry(entry).num_messages == 1
    (msg,) = entry_messages(entry)
    assert bytes(msg.payload) == payload and msg.batch_index == -1 and msg.sequence_id == 7


def test_corrupt_compressed_entry_names_the_payload_offset() -> None:
    payload = b"z" * 300
    md = MessageMetadata(producer_name="p", sequence_id=0, publish_time=1, compression=LZ4, uncompressed_size=299)
    entry = encode_entry(md, compress(LZ4, payload))
    with pytest.raises(DecompressionError, match="LZ4 payload with uncompressed_size 299") as info:
        entry_messages(entry, where="obj")
    assert info.value.offset == decode_entry(entry).payload_offset and info.value.where == "obj"


def test_zlib_vector_is_what_zlib_writes() -> None:
    assert zlib.decompress(VECTORS[ZLIB]) == b"hello"


@pytest.mark.parametrize("codec", COMPRESSED, ids=codec_name)
@pytest.mark.parametrize("batched", [True, False], ids=["batch", "single"])
def test_build_entry_compresses_the_payload_as_a_producer_does(codec: int, batched: bool) -> None:
    messages = [
        Message(b"value %d " % i * 20, key=f"k{i}", properties={"i": str(i)}) for i in range(3 if batched else 1)
    ]
    plain = build_entry(messages, producer_name="p", sequence_id=7, publish_time=9, batched=batched)
    entry = build_entry(messages, producer_name="p", sequence_id=7, publish_time=9, batched=batched, compression=codec)
    md, payload = decode_entry(entry).metadata, bytes(decode_entry(plain).payload)
    assert (md.compression, md.uncompressed_size) == (codec, len(payload))
    assert bytes(decompress(codec, decode_entry(entry).payload, md.uncompressed_size)) == payload
    got, want = entry_messages(entry), entry_messages(plain)
    assert [(bytes(m.payload), m.key, m.properties, m.sequence_id) for m in got] == [
        (bytes(m.payload), m.key, m.properties, m.sequence_id) for m in want
    ]
