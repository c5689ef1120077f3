"""Pulsar entries ("headers and payload"): golden bytes, round trips, corruption and truncation."""

from __future__ import annotations

import contextlib
import random
import struct
import zlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamoffload.codecs.compression import compress
from streamoffload.codecs.entry import (
    MAGIC_BROKER_ENTRY_METADATA,
    MAGIC_CRC32C,
    BrokerEntryMetadata,
    CompressionType,
    Message,
    MessageMetadata,
    build_entry,
    decode_entry,
    encode_entry,
    entry_messages,
    metadata_encrypted,
    parse_broker_entry_metadata,
)
from streamoffload.codecs.errors import (
    BadMagicError,
    ChecksumError,
    DecompressionError,
    FormatError,
    LengthMismatchError,
    TruncatedError,
)


def _crc32c_table() -> list[int]:
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_TABLE = _crc32c_table()


def ref_crc32c(data: bytes) -> int:
    """Bitwise-table CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), independent of the code under test."""
    crc = 0xFFFFFFFF
    for b in data:
        crc = _TABLE[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def test_reference_crc_matches_published_check_value() -> None:
    assert ref_crc32c(b"123456789") == 0xE3069283


# ---------------------------------------------------------------------------------------------
# golden bytes

# MessageMetadata for build_entry([Message(b"hello", key="k", properties={"a": "b"})], producer_name="p",
# sequence_id=7, publish_time=1000), fields in number order:
GOLDEN_SINGLE_METADATA = bytes.fromhex(
    "0a0170"  # 1 producer_name "p"
    "1007"  # 2 sequence_id 7
    "18e807"  # 3 publish_time 1000
    "22060a0161120162"  # 4 properties {key "a", value "b"}
    "32016b"  # 6 partition_key "k"
    "4805"  # 9 uncompressed_size 5
)
GOLDEN_SINGLE = bytes.fromhex("0e017814d36700000015") + GOLDEN_SINGLE_METADATA + b"hello"

# A 2-message batch: [Message(b"ab", key="k1"), Message(b"", properties={"x": "y"}, event_time=5)],
# producer_name="p", sequence_id=10, publish_time=20.
GOLDEN_BATCH_PAYLOAD = bytes.fromhex(
    "00000008"  # SingleMessageMetadata size
    "12026b31"  # 2 partition_key "k1"
    "1802"  # 3 payload_size 2
    "400a"  # 8 sequence_id 10
    "6162"  # payload "ab"
    "0000000e"
    "0a060a0178120179"  # 1 properties {x: y}
    "1800"  # 3 payload_size 0
    "2805"  # 5 event_time 5
    "400b"  # 8 sequence_id 11
)
GOLDEN_BATCH_METADATA = bytes.fromhex(
    "0a0170"  # 1 producer_name "p"
    "100a"  # 2 sequence_id 10
    "1814"  # 3 publish_time 20
    "4820"  # 9 uncompressed_size 32
    "5802"  # 11 num_messages_in_batch 2
    "c0010b"  # 24 highest_sequence_id 11
)


def _golden_batch_entry() -> bytes:
    body = struct.pack(">I", len(GOLDEN_BATCH_METADATA)) + GOLDEN_BATCH_METADATA + GOLDEN_BATCH_PAYLOAD
    return struct.pack(">HI", 0x0E01, ref_crc32c(body)) + body


def test_golden_single_entry_bytes() -> None:
    built = build_entry(
        [Message(b"hello", key="k", properties={"a": "b"})], producer_name="p", sequence_id=7, publish_time=1000
    )
    assert built == GOLDEN_SINGLE
    # The checksum covers exactly everything after the checksum field: metadata size, metadata, payload.
    assert struct.unpack(">I", GOLDEN_SINGLE[2:6])[0] == ref_crc32c(GOLDEN_SINGLE[6:])


def test_golden_batch_entry_bytes() -> None:
    built = build_entry(
        [Message(b"ab", key="k1"), Message(b"", properties={"x": "y"}, event_time=5)],
        producer_name="p",
        sequence_id=10,
        publish_time=20,
    )
    assert len(GOLDEN_BATCH_PAYLOAD) == 0x20
    assert built == _golden_batch_entry()
    assert built.hex() == (
        "0e01" + f"{ref_crc32c(built[6:]):08x}" + "0000000e" + GOLDEN_BATCH_METADATA.hex() + GOLDEN_BATCH_PAYLOAD.hex()
    )


def test_golden_entries_decode() -> None:
    [single] = entry_messages(GOLDEN_SINGLE)
    assert (single.batch_index, bytes(single.payload), single.key, single.properties) == (-1, b"hello", "k", {"a": "b"})
    assert (single.publish_time, single.sequence_id, single.producer_name, single.event_time) == (1000, 7, "p", 0)

    first, second = entry_messages(_golden_batch_entry())
    assert (first.batch_index, bytes(first.payload), first.key, first.properties) == (0, b"ab", "k1", {})
    assert (first.sequence_id, first.event_time, first.publish_time) == (10, 0, 20)
    assert (second.batch_index, bytes(second.payload), second.key, second.properties) == (1, b"", None, {"x": "y"})
    assert (second.sequence_id, second.event_time, second.producer_name) == (11, 5, "p")


def test_decode_returns_views_not_copies() -> None:
    buf = bytearray(GOLDEN_SINGLE)
    decoded = decode_entry(buf)
    assert isinstance(decoded.payload, memoryview)
    assert decoded.payload.obj is buf
    assert decoded.payload_offset == len(GOLDEN_SINGLE) - 5
    assert decoded.checksum == struct.unpack(">I", GOLDEN_SINGLE[2:6])[0]
    [msg] = entry_messages(buf)
    assert isinstance(msg.payload, memoryview) and msg.payload.obj is buf
    for m in entry_messages(memoryview(_golden_batch_entry())):
        assert isinstance(m.payload, memoryview)


# ---------------------------------------------------------------------------------------------
# round trips


@st.composite
def _payloads(draw: st.DrawFn, max_size: int) -> bytes:
    # Hypothesis shrinks poorly over huge binaries; draw a size and a seed instead.
    if draw(st.booleans()):
        return draw(st.binary(max_size=64))
    size = draw(st.integers(0, max_size))
    return random.Random(draw(st.integers(0, 2**32))).randbytes(size)


def _messages(max_payload: int) -> st.SearchStrategy[Message]:
    return st.builds(
        Message,
        payload=_payloads(max_payload),
        key=st.none() | st.text(max_size=20),
        properties=st.dictionaries(st.text(max_size=10), st.text(max_size=20), max_size=4),
        event_time=st.integers(0, 2**64 - 1),
        ordering_key=st.none() | st.binary(max_size=16),
        sequence_id=st.none() | st.integers(0, 2**64 - 1),
    )


@st.composite
def _message_lists(draw: st.DrawFn) -> list[Message]:
    msgs = draw(st.lists(_messages(2048), min_size=1, max_size=200))
    if draw(st.integers(0, 3)) == 0:  # now and then one message of up to a few hundred KiB
        big = draw(_messages(400 * 1024).filter(lambda m: len(m.payload) > 64))
        msgs.insert(draw(st.integers(0, len(msgs))), big)
    return msgs


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(
    msgs=_message_lists(),
    producer=st.text(max_size=30),
    sequence_id=st.integers(0, 2**63),
    publish_time=st.integers(0, 2**64 - 1),
    force_batch=st.booleans(),
)
def test_build_then_split_round_trips(
    msgs: list[Message], producer: str, sequence_id: int, publish_time: int, force_batch: bool
) -> None:
    batched = True if force_batch or len(msgs) > 1 else None
    entry = build_entry(
        msgs, producer_name=producer, sequence_id=sequence_id, publish_time=publish_time, batched=batched
    )
    out = entry_messages(entry)
    assert len(out) == len(msgs)
    is_batch = len(msgs) > 1 or force_batch
    for i, (sent, got) in enumerate(zip(msgs, out, strict=True)):
        assert got.batch_index == (i if is_batch else -1)
        assert bytes(got.payload) == sent.payload
        assert got.key == sent.key
        assert got.properties == sent.properties
        assert got.event_time == sent.event_time
        assert got.ordering_key == sent.ordering_key
        default_seq = sequence_id + i if is_batch else sequence_id
        assert got.sequence_id == (default_seq if sent.sequence_id is None else sent.sequence_id)
        assert got.publish_time == publish_time
        assert got.producer_name == producer
    decoded = decode_entry(entry)
    assert decoded.is_batch == is_batch
    if is_batch:
        assert decoded.metadata.num_messages_in_batch == len(msgs)
    assert decoded.metadata.uncompressed_size == len(decoded.payload)


@settings(max_examples=60, deadline=None)
@given(metadata_seq=st.integers(0, 2**64 - 1), payload=st.binary(max_size=300), ts=st.integers(0, 2**64 - 1))
def test_encode_decode_round_trips_metadata_and_payload(metadata_seq: int, payload: bytes, ts: int) -> None:
    md = MessageMetadata(producer_name="prod", sequence_id=metadata_seq, publish_time=ts, replicate_to=["a", "b"])
    decoded = decode_entry(encode_entry(md, payload))
    assert decoded.metadata == md
    assert bytes(decoded.payload) == payload
    assert decoded.broker_entry_metadata is None


def test_broker_entry_metadata_prefix_is_skipped() -> None:
    broker = BrokerEntryMetadata(broker_timestamp=1_700_000_000_000, index=41)
    plain = _golden_batch_entry()
    md = decode_entry(plain).metadata
    prefixed = encode_entry(md, decode_entry(plain).payload, broker_entry_metadata=broker)
    raw = broker.SerializeToString()
    assert prefixed == struct.pack(">HI", MAGIC_BROKER_ENTRY_METADATA, len(raw)) + raw + plain
    decoded = decode_entry(prefixed)
    assert decoded.broker_entry_metadata == raw
    assert parse_broker_entry_metadata(decoded.broker_entry_metadata) == broker
    assert [bytes(m.payload) for m in entry_messages(prefixed)] == [b"ab", b""]
    assert entry_messages(prefixed) == entry_messages(plain)


def test_entry_without_checksum_section_is_accepted() -> None:
    # Pre-v6 protocol clients sent no checksum; Pulsar still reads such entries.
    legacy = GOLDEN_SINGLE[6:]
    decoded = decode_entry(legacy)
    assert decoded.checksum is None
    assert bytes(decoded.payload) == b"hello"
    assert entry_messages(legacy)[0].key == "k"


def test_constants() -> None:
    assert (MAGIC_CRC32C, MAGIC_BROKER_ENTRY_METADATA) == (0x0E01, 0x0E02)


def test_build_entry_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="at least one"):
        build_entry([], producer_name="p", sequence_id=0, publish_time=0)
    with pytest.raises(ValueError, match="exactly one"):
        build_entry([Message(b"a"), Message(b"b")], producer_name="p", sequence_id=0, publish_time=0, batched=False)
    with pytest.raises(ValueError, match="missing required fields"):
        encode_entry(MessageMetadata(producer_name="p"), b"")


# ---------------------------------------------------------------------------------------------
# corruption and truncation

_SAMPLES = {
    "single": GOLDEN_SINGLE,
    "batch": _golden_batch_entry(),
    "broker-prefixed": encode_entry(
        decode_entry(GOLDEN_SINGLE).metadata, b"hello", broker_entry_metadata=BrokerEntryMetadata(index=3)
    ),
}


def _flip(data: bytes, bit: int) -> bytes:
    out = bytearray(data)
    out[bit // 8] ^= 1 << (bit % 8)
    return bytes(out)


@pytest.mark.parametrize("name", list(_SAMPLES))
def test_every_bit_flip_in_checksummed_region_is_a_checksum_error(name: str) -> None:
    entry = _SAMPLES[name]
    start = entry.index(struct.pack(">H", MAGIC_CRC32C)) + 6 if name == "broker-prefixed" else 6
    for bit in range(start * 8, len(entry) * 8):
        with pytest.raises(ChecksumError) as err:
            decode_entry(_flip(entry, bit), where="e")
        assert err.value.offset == start - 4
        assert err.value.where == "e"
    # Flips of the stored checksum itself are checksum errors too; flips of a magic are format errors.
    for bit in range((start - 4) * 8, start * 8):
        with pytest.raises(ChecksumError):
            decode_entry(_flip(entry, bit))
    for bit in range(16):
        with pytest.raises(FormatError):
            entry_messages(_flip(entry, bit))


@settings(max_examples=60, deadline=None)
@given(msgs=st.lists(_messages(512), min_size=1, max_size=20), data=st.data())
def test_random_bit_flips_are_checksum_errors(msgs: list[Message], data: st.DataObject) -> None:
    entry = build_entry(msgs, producer_name="p", sequence_id=1, publish_time=2)
    bit = data.draw(st.integers(6 * 8, len(entry) * 8 - 1))
    with pytest.raises(ChecksumError):
        entry_messages(_flip(entry, bit))


@pytest.mark.parametrize("name", list(_SAMPLES))
def test_every_truncation_is_a_format_error(name: str) -> None:
    entry = _SAMPLES[name]
    for cut in range(len(entry)):
        with pytest.raises(FormatError):
            decode_entry(entry[:cut])
        with pytest.raises(FormatError):
            entry_messages(entry[:cut])


def test_truncation_without_checksum_verification_is_caught_by_structure() -> None:
    entry = _golden_batch_entry()
    for cut in range(len(entry)):
        with pytest.raises((TruncatedError, BadMagicError)) as err:
            entry_messages(entry[:cut], verify_checksum=False)
        assert err.value.offset is not None
        assert err.value.offset <= len(entry)


@settings(max_examples=80, deadline=None)
@given(msgs=st.lists(_messages(256), min_size=1, max_size=30), data=st.data())
def test_random_truncations_are_format_errors(msgs: list[Message], data: st.DataObject) -> None:
    entry = build_entry(msgs, producer_name="p", sequence_id=1, publish_time=2)
    cut = data.draw(st.integers(0, len(entry) - 1))
    with pytest.raises(FormatError):
        entry_messages(entry[:cut])


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_garbage_never_leaks_a_foreign_exception(garbage: bytes) -> None:
    for verify in (True, False):
        with contextlib.suppress(FormatError):
            entry_messages(garbage, verify_checksum=verify)


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_mutated_batches_without_checksum_fail_cleanly(data: st.DataObject) -> None:
    entry = bytearray(_golden_batch_entry())
    for _ in range(data.draw(st.integers(1, 4))):
        entry[data.draw(st.integers(6, len(entry) - 1))] = data.draw(st.integers(0, 255))
    with contextlib.suppress(FormatError):
        entry_messages(bytes(entry), verify_checksum=False)


def _entry_with_batch_payload(payload: bytes, count: int) -> bytes:
    md = MessageMetadata(producer_name="p", sequence_id=0, publish_time=0, num_messages_in_batch=count)
    return encode_entry(md, payload)


def test_batch_with_left_over_bytes_is_a_length_mismatch() -> None:
    entry = _entry_with_batch_payload(GOLDEN_BATCH_PAYLOAD + b"\x00", 2)
    with pytest.raises(LengthMismatchError, match="1 bytes left over") as err:
        entry_messages(entry, where="obj")
    assert str(err.value).startswith("obj: ")


def test_batch_with_too_few_messages_is_truncated() -> None:
    with pytest.raises(TruncatedError, match="message 2 of 3"):
        entry_messages(_entry_with_batch_payload(GOLDEN_BATCH_PAYLOAD, 3))


def test_metadata_missing_required_fields_is_a_format_error() -> None:
    meta = MessageMetadata(producer_name="p").SerializePartialToString()
    body = struct.pack(">I", len(meta)) + meta
    entry = struct.pack(">HI", MAGIC_CRC32C, ref_crc32c(body)) + body
    with pytest.raises(FormatError, match="missing required fields: sequence_id"):
        decode_entry(entry)


def test_invalid_utf8_key_is_a_format_error() -> None:
    # proto2 strings are not UTF-8 checked by the parser; we refuse to hand out altered keys.
    md = MessageMetadata(producer_name="p", sequence_id=0, publish_time=0)
    raw = md.SerializeToString() + b"\x32\x02\xff\xfe"  # partition_key = b"\xff\xfe"
    body = struct.pack(">I", len(raw)) + raw + b"x"
    entry = struct.pack(">HI", MAGIC_CRC32C, ref_crc32c(body)) + body
    with pytest.raises(FormatError, match="partition_key is not valid UTF-8"):
        entry_messages(entry)


def test_bad_magic_is_named() -> None:
    with pytest.raises(BadMagicError, match="0xdead"):
        decode_entry(b"\xde\xad\xbe\xef" + b"\x00" * 20)


# ---------------------------------------------------------------------------------------------
# compression


def test_zlib_batch_is_inflated() -> None:
    plain = decode_entry(_golden_batch_entry())
    md = MessageMetadata()
    md.CopyFrom(plain.metadata)
    md.compression = CompressionType.ZLIB
    entry = encode_entry(md, zlib.compress(bytes(plain.payload)))
    assert [bytes(m.payload) for m in entry_messages(entry)] == [b"ab", b""]
    md.uncompressed_size += 1
    with pytest.raises(DecompressionError, match="ZLIB payload with uncompressed_size 33 refused: it inflates to 32"):
        entry_messages(encode_entry(md, zlib.compress(bytes(plain.payload))))
    with pytest.raises(DecompressionError, match="does not inflate"):
        entry_messages(encode_entry(md, b"not zlib"))


@pytest.mark.parametrize("codec", ["LZ4", "ZLIB", "ZSTD", "SNAPPY"])
def test_compressed_batches_decode_and_bad_payloads_name_the_codec(codec: str) -> None:
    # All four of Pulsar's codecs are supported: a batch compressed as a producer compresses it splits into
    # its messages; a payload that is not valid for the codec is a FormatError naming the codec.
    messages = [Message(f"payload {i} ".encode() * 20, key=f"k{i}", properties={"i": str(i)}) for i in range(5)]
    plain = decode_entry(build_entry(messages, producer_name="p", sequence_id=7, publish_time=9, batched=True))
    md = MessageMetadata()
    md.CopyFrom(plain.metadata)
    md.compression = CompressionType.Value(codec)
    md.uncompressed_size = len(plain.payload)
    compressed = compress(md.compression, plain.payload)
    assert len(compressed) < len(plain.payload)
    entry = encode_entry(md, compressed)
    assert bytes(decode_entry(entry).payload) == compressed  # the stored entry stays compressed
    got = entry_messages(entry)
    assert [bytes(m.payload) for m in got] == [m.payload for m in messages]
    assert [m.key for m in got] == [m.key for m in messages]
    garbage = encode_entry(md, b"\xff\x00\x01\x02" * 3)
    assert bytes(decode_entry(garbage).payload) == b"\xff\x00\x01\x02" * 3  # the raw entry stays readable
    with pytest.raises(FormatError, match=codec):
        entry_messages(garbage)


def _encrypted_metadata() -> MessageMetadata:
    """MessageMetadata with upstream's encryption fields (13 encryption_keys {1 key, 2 value}, 14
    encryption_algo, 15 encryption_param), which pulsar_api.proto leaves undeclared."""
    md = MessageMetadata(producer_name="p", sequence_id=1, publish_time=2, num_messages_in_batch=3)
    keys = b"\x0a\x04rsa1\x12\x03\x01\x02\x03"
    extra = bytes([13 << 3 | 2, len(keys)]) + keys + bytes([14 << 3 | 2, 3]) + b"aes" + bytes([15 << 3 | 2, 2]) + b"iv"
    return MessageMetadata.FromString(md.SerializeToString() + extra)


def test_encrypted_flag_from_the_encryption_fields() -> None:
    md = _encrypted_metadata()
    entry = encode_entry(md, b"\x13\x37 ciphertext, not a batch")
    decoded = decode_entry(entry)
    assert decoded.encrypted and metadata_encrypted(decoded.metadata)
    assert decoded.num_messages == 3
    assert decoded.metadata.SerializeToString() == md.SerializeToString()  # carried byte for byte
    for number in (13, 14, 15):  # any one of them marks the entry
        only = MessageMetadata(producer_name="p", sequence_id=1, publish_time=2)
        alone = MessageMetadata.FromString(only.SerializeToString() + bytes([number << 3 | 2, 1]) + b"x")
        assert decode_entry(encode_entry(alone, b"c")).encrypted
    plain = decode_entry(
        build_entry([Message(b"x", properties={"13": "14"})], producer_name="p", sequence_id=0, publish_time=0)
    )
    assert not plain.encrypted


def test_read_messages_says_an_entry_is_encrypted() -> None:
    # `streamoffload read --messages` prints one line for an encrypted entry instead of ciphertext payloads.
    import io
    import json

    from streamoffload.commands.read import write_lines
    from streamoffload.read.segment import OffloadedEntry

    secret = encode_entry(_encrypted_metadata(), b"\x13\x37 ciphertext")
    clear = build_entry([Message(b"hello", key="k")], producer_name="q", sequence_id=0, publish_time=5)
    out = io.StringIO()
    entries = iter([OffloadedEntry(3, 0, memoryview(secret)), OffloadedEntry(3, 1, memoryview(clear))])
    assert write_lines(entries, out, messages=True, limit=None) == 2
    first, second = (json.loads(line) for line in out.getvalue().splitlines())
    assert first == {
        "ledger_id": 3,
        "entry_id": 0,
        "encrypted": True,
        "num_messages": 3,
        "publish_time": 2,
        "producer_name": "p",
    }
    assert "payload" not in first
    assert second["payload"] == "aGVsbG8=" and second["key"] == "k" and "encrypted" not in second
