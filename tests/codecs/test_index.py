"""Index objects: encode/decode, validation with offsets, lookup, build_index and the data cross-check."""

from __future__ import annotations

import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamoffload.codecs.block_writer import Block, BlockWriter
from streamoffload.codecs.blocks import FormatVersion, InvalidFieldError, OrderingError, iter_blocks
from streamoffload.codecs.errors import (
    BadMagicError,
    FormatError,
    IndexOutOfRangeError,
    LengthMismatchError,
    TruncatedError,
)
from streamoffload.codecs.index import (
    V1_INDEX_MAGIC,
    V2_INDEX_MAGIC,
    BlockLocation,
    EntryNotCoveredError,
    IndexBuildError,
    IndexEntry,
    IndexMismatchError,
    LedgerIndex,
    OffloadIndex,
    build_index,
    verify_against_blocks,
)

V1, V2 = FormatVersion.V1, FormatVersion.V2


def v2_object(max_block: int = 200) -> tuple[bytes, list[Block]]:
    """Ledger 3 entries 0..9, ledger 8 entries 100..104, ledger 12 entry 0; 30-byte payloads."""
    writer = BlockWriter(V2, max_block)
    blocks: list[Block] = []
    for ledger, entries in ((3, range(10)), (8, range(100, 105)), (12, range(1))):
        for entry in entries:
            blocks += writer.add(ledger, entry, bytes(30))
    blocks += writer.flush()
    return b"".join(b.data for b in blocks), blocks


DATA, BLOCKS = v2_object()
META = {3: b"three", 8: b"", 12: b"twelve!"}
INDEX = build_index(V2, BLOCKS, len(DATA), META)
RAW = INDEX.encode()


def test_v2_layout_of_the_built_index() -> None:
    # 128 + 2 x 42 > 200: one entry per block, so 10 + 5 + 1 blocks
    assert [(b.ledger_id, b.first_entry_id) for b in BLOCKS][:3] == [(3, 0), (3, 1), (3, 2)]
    assert len(BLOCKS) == 16
    assert INDEX.ledger_ids == [3, 8, 12]
    part_ids = [e.part_id for ledger in INDEX.ledgers for e in ledger.entries]
    assert part_ids == list(range(1, len(BLOCKS) + 1))  # object-wide ordinals from 1
    assert struct.unpack_from(">IIQQ", RAW) == (V2_INDEX_MAGIC, len(RAW), len(DATA), 128)
    assert struct.unpack_from(">QII", RAW, 24) == (3, 10, 5)
    assert RAW[40:45] == b"three"
    assert OffloadIndex.decode(RAW) == INDEX
    assert OffloadIndex.decode(memoryview(bytearray(RAW))) == INDEX


def test_v1_round_trip_needs_the_ledger_id() -> None:
    writer = BlockWriter(V1, 300)
    blocks = [b for e in range(20) for b in writer.add(77, e, bytes(e))] + writer.flush()
    data_length = sum(b.length for b in blocks)
    index = build_index(V1, blocks, data_length, {77: b"\x08\x01"})
    raw = index.encode()
    assert struct.unpack_from(">IIQQII", raw) == (V1_INDEX_MAGIC, len(raw), data_length, 128, len(blocks), 2)
    assert OffloadIndex.decode(raw, ledger_id=77) == index
    # Without the ledger id (a v1 index where a v2 one was expected): the object's error, naming it (fuzz bench,
    # issue 52: it was a bare ValueError).
    with pytest.raises(FormatError) as info:
        OffloadIndex.decode(raw, where="t/x-index")
    assert str(info.value) == (
        "t/x-index: a v1 (ledger-based) index, which does not record its ledger id, where no ledger id is known "
        "(a v1 index object's name ends in -ledger-<id>-index) (at byte offset 0)"
    )
    with pytest.raises(IndexBuildError, match="exactly one ledger"):
        OffloadIndex(V1, data_length, (index.ledgers[0], LedgerIndex(78, b"", index.ledgers[0].entries))).encode()


def test_lookup_by_binary_search() -> None:
    for block in BLOCKS:
        for entry in range(block.first_entry_id, block.last_entry_id + 1):
            location = INDEX.lookup(block.ledger_id, entry)
            assert location == BlockLocation(
                block.ledger_id, block.first_entry_id, location.part_id, block.offset, block.length
            )
    # past the ledger's last entry: its last block (the index does not know last entry ids)
    assert INDEX.lookup(3, 10_000).offset == max(b.offset for b in BLOCKS if b.ledger_id == 3)
    with pytest.raises(EntryNotCoveredError, match=r"entry 99 of ledger 8 precedes the first entry .*100"):
        INDEX.lookup(8, 99)
    with pytest.raises(EntryNotCoveredError, match=r"ledger 4 is not in this index \(it holds ledgers 3, 8, 12\)"):
        INDEX.lookup(4, 0)
    with pytest.raises(LookupError):
        INDEX.ledger(5)
    assert INDEX.ledger(12).metadata == b"twelve!"


def test_blocks_lists_every_block_with_its_length() -> None:
    assert [(b.ledger_id, b.first_entry_id, b.part_id, b.offset, b.length) for b in INDEX.blocks()] == [
        (b.ledger_id, b.first_entry_id, i, b.offset, b.length) for i, b in enumerate(BLOCKS, start=1)
    ]
    assert INDEX.blocks()[-1].end == len(DATA)


def test_encode_sorts_v2_ledgers() -> None:
    shuffled = OffloadIndex(V2, len(DATA), (INDEX.ledgers[2], INDEX.ledgers[0], INDEX.ledgers[1]))
    assert shuffled.encode() == RAW


def test_build_index_rejects_what_cannot_be_one_object() -> None:
    with pytest.raises(IndexBuildError, match="at least one block"):
        build_index(V2, [], 0, {})
    with pytest.raises(IndexBuildError, match="previous blocks end at"):
        build_index(V2, [BLOCKS[0], BLOCKS[2]], len(DATA), META)
    with pytest.raises(IndexBuildError, match="data object is 5 bytes"):
        build_index(V2, BLOCKS, 5, META)
    with pytest.raises(IndexBuildError, match=r"no ledger metadata for ledger\(s\) 8"):
        build_index(V2, BLOCKS, len(DATA), {3: b"", 12: b""})
    with pytest.raises(IndexBuildError, match="one ledger"):
        build_index(V1, BLOCKS, len(DATA), META)
    writer = BlockWriter(V2, 200)
    early = writer.add(9, 0, b"x") + writer.flush()
    late = BlockWriter(V2, 200, start_offset=early[0].length)
    out_of_order = early + late.add(4, 0, b"y") + late.flush()
    with pytest.raises(IndexBuildError, match="position order"):
        build_index(V2, out_of_order, out_of_order[-1].end, {9: b"", 4: b""})


def patched(raw: bytes, pos: int, fmt: str, *values: int) -> bytes:
    out = bytearray(raw)
    struct.pack_into(fmt, out, pos, *values)
    return bytes(out)


LEDGER8_AT = 24 + 16 + 5 + 20 * 10  # ledger 3's record is 16 + 5 metadata bytes + 10 entries
LEDGER8_ENTRIES_AT = LEDGER8_AT + 16
LEDGER12_AT = LEDGER8_ENTRIES_AT + 20 * 5


@pytest.mark.parametrize(
    ("raw", "error", "offset", "message"),
    [
        (patched(RAW, 0, ">I", 0xDE47DE48), BadMagicError, 0, "bad index magic 0xDE47DE48"),
        (RAW[:3], TruncatedError, 0, "too few"),
        (RAW[:20], TruncatedError, 0, "index header needs 24 bytes"),
        (RAW[:-1], LengthMismatchError, 4, f"says {len(RAW)} bytes but the index object has {len(RAW) - 1}"),
        (RAW + b"\x00", LengthMismatchError, 4, "index length field"),
        (patched(RAW, 16, ">Q", 64), LengthMismatchError, 16, "data block header length is 64"),
        (patched(RAW, 8, ">Q", 100), LengthMismatchError, 8, "data object length 100"),
        (patched(RAW, LEDGER12_AT + 8, ">I", 2), TruncatedError, LEDGER12_AT, "ledger 12 record (2 index entries"),
        (patched(RAW, LEDGER8_AT, ">Q", 2), OrderingError, LEDGER8_AT, "ledger 2 follows ledger 3"),
        (patched(RAW, LEDGER8_AT, ">Q", 2**63), InvalidFieldError, LEDGER8_AT, "ledger id"),
        (patched(RAW, LEDGER8_ENTRIES_AT + 20, ">Q", 100), OrderingError, LEDGER8_ENTRIES_AT + 20, "follow 100"),
        (patched(RAW, LEDGER8_ENTRIES_AT + 8, ">I", 1), OrderingError, LEDGER8_ENTRIES_AT + 8, "part id 1"),
        (
            patched(RAW, LEDGER8_ENTRIES_AT + 12, ">Q", len(DATA)),
            IndexOutOfRangeError,
            LEDGER8_ENTRIES_AT + 12,
            f"outside the {len(DATA)}-byte data object",
        ),
        (
            patched(RAW, LEDGER8_ENTRIES_AT + 12, ">Q", 10),
            IndexOutOfRangeError,
            LEDGER8_ENTRIES_AT + 12,
            "offsets must increase",
        ),
        (patched(RAW, 24 + 16 + 5 + 12, ">Q", 1), IndexOutOfRangeError, 24 + 16 + 5 + 12, "starts with a block"),
    ],
)
def test_decode_errors_name_the_problem_and_offset(
    raw: bytes, error: type[FormatError], offset: int, message: str
) -> None:
    with pytest.raises(error) as caught:
        OffloadIndex.decode(raw, where="obj-index")
    assert message in str(caught.value)
    assert caught.value.offset == offset
    assert str(caught.value).startswith("obj-index: ")


def test_v2_truncated_ledger_record_header() -> None:
    raw = RAW + b"\x00" * 8
    raw = patched(raw, 4, ">I", len(raw))
    with pytest.raises(TruncatedError, match="ledger record header needs 16 bytes but only 8") as caught:
        OffloadIndex.decode(raw)
    assert caught.value.offset == len(RAW)


def test_v1_entry_count_must_match_length() -> None:
    writer = BlockWriter(V1, 300)
    blocks = [b for e in range(10) for b in writer.add(1, e, bytes(50))] + writer.flush()
    raw = build_index(V1, blocks, blocks[-1].end, {1: b"meta"}).encode()
    with pytest.raises(LengthMismatchError, match="index entries and 4 metadata bytes") as caught:
        OffloadIndex.decode(patched(raw, 24, ">I", len(blocks) + 1), ledger_id=1)
    assert caught.value.offset == 24
    with pytest.raises(LengthMismatchError, match="has no index entries"):
        OffloadIndex.decode(
            patched(patched(raw[:36], 24, ">I", 0), 4, ">I", 36),
            ledger_id=1,
        )


def test_verify_against_blocks_finds_each_disagreement() -> None:
    decoded = list(iter_blocks(DATA))
    verify_against_blocks(INDEX, decoded, len(DATA))
    with pytest.raises(IndexMismatchError, match="data object is"):
        verify_against_blocks(INDEX, decoded, len(DATA) + 1)
    with pytest.raises(IndexMismatchError, match="index lists"):
        verify_against_blocks(INDEX, decoded[:-1], len(DATA))
    other_data, other_blocks = v2_object(max_block=250)
    other = build_index(V2, other_blocks, len(other_data), META)
    with pytest.raises(IndexMismatchError, match="disagrees with data block") as caught:
        verify_against_blocks(other, list(iter_blocks(other_data))[:1] + decoded[1:], len(other_data), where="x")
    assert str(caught.value).startswith("x: ")
    wrong_ledger = OffloadIndex(
        V2,
        len(DATA),
        tuple(LedgerIndex(ledger.ledger_id + 1, ledger.metadata, ledger.entries) for ledger in INDEX.ledgers),
    )
    with pytest.raises(IndexMismatchError, match="index ledger 4 vs block ledger 3") as caught:
        verify_against_blocks(wrong_ledger, decoded, len(DATA))
    assert caught.value.offset == 0


def test_validate_applies_to_constructed_indexes() -> None:
    bad = OffloadIndex(V2, 1000, (LedgerIndex(1, b"", (IndexEntry(0, 1, 0), IndexEntry(5, 2, 1000))),))
    with pytest.raises(IndexOutOfRangeError):
        bad.encode()
    with pytest.raises(LengthMismatchError, match="no ledgers"):
        OffloadIndex(V2, 1000, ()).encode()


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_property_index_corruption_is_always_caught(data: st.DataObject) -> None:
    """Every truncation fails to decode; every bit flip outside the opaque metadata fails to decode or
    disagrees with the data object."""
    version = data.draw(st.sampled_from([V1, V2]))
    max_block = data.draw(st.integers(150, 400))
    count = data.draw(st.integers(1, 25))
    writer = BlockWriter(version, max_block)
    blocks: list[Block] = []
    ledger = 5
    for entry in range(count):
        if version is V2 and data.draw(st.integers(0, 5)) == 0:
            ledger += data.draw(st.integers(1, 2**33))
        blocks += writer.add(ledger, entry, bytes(data.draw(st.integers(0, max_block - 140))))
    blocks += writer.flush()
    raw_data = b"".join(b.data for b in blocks)
    decoded = list(iter_blocks(raw_data))
    metadata = {b.ledger_id: bytes([b.ledger_id % 256]) * (b.ledger_id % 4) for b in blocks}
    index = build_index(version, blocks, len(raw_data), metadata)
    raw = index.encode()
    lid = blocks[0].ledger_id if version is V1 else None
    assert OffloadIndex.decode(raw, ledger_id=lid) == index
    for cut in range(len(raw)):
        with pytest.raises(FormatError):
            OffloadIndex.decode(raw[:cut], ledger_id=lid)
    metadata_bytes: set[int] = set()
    pos = 32 if version is V1 else 24
    for ledger in index.ledgers:
        if version is V2:
            pos += 16
        metadata_bytes.update(range(pos, pos + len(ledger.metadata)))
        pos += len(ledger.metadata) + 20 * len(ledger.entries)
    for bit in range(len(raw) * 8):
        if bit // 8 in metadata_bytes:
            continue
        flipped = bytearray(raw)
        flipped[bit // 8] ^= 0x80 >> (bit % 8)
        try:
            corrupt = OffloadIndex.decode(flipped, ledger_id=lid)
        except FormatError:
            continue
        with pytest.raises(IndexMismatchError):
            verify_against_blocks(corrupt, decoded, len(raw_data))
