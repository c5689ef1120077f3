"""Golden bytes: small v1 and v2 objects written out by hand from SPEC section 3, byte for byte.

The hex below is not produced by our encoder: it spells out each field, so a change in the encoder that
still round-trips (field order, padding phase, index layout) breaks these tests.
"""

from __future__ import annotations

from streamoffload.codecs.block_writer import BlockWriter
from streamoffload.codecs.blocks import BlockHeader, FormatVersion, decode_block, encode_block, iter_blocks
from streamoffload.codecs.index import (
    IndexEntry,
    LedgerIndex,
    OffloadIndex,
    build_index,
    verify_against_blocks,
)

ZEROS_100 = "00" * 100  # v1 header: 28 bytes of fields, then 100 zero bytes
ZEROS_92 = "00" * 92  # v2 header: 36 bytes of fields, then 92 zero bytes


def hexb(text: str) -> bytes:
    return bytes.fromhex(text)


# ---------------------------------------------------------------------------------------------------------------
# v1 (PIP-17) data object of ledger 42, max block size 160 (0xa0). Entries 0..8.
# ---------------------------------------------------------------------------------------------------------------
V1_MAX_BLOCK = 160
V1_ENTRIES = [
    (0, b"hello"),  # block 1: 128 + 17
    (1, b"ab"),  #            + 14 = 159 -> 1 byte of padding
    (2, b"xyz123"),  # block 2: 128 + 18
    (3, b""),  #              + 12 = 158 -> 2 bytes of padding
    (4, b"abcd"),  # block 3: 128 + 16
    (5, b"!"),  #             + 13 = 157 -> 3 bytes of padding
    (6, b"0123456789abcdefghij"),  # block 4: 128 + 32 = 160, fills the block exactly
    (7, b"12345678"),  # block 5: 128 + 20 = 148; entry 8 (22 bytes) does not fit -> 12 bytes of padding
    (8, b"0123456789"),  # block 6: 128 + 22 = 150, the last block, fitted exactly
]
V1_DATA_HEX = (
    # block 1 at offset 0: magic, header length 128, block length 160, first entry id 0, zeros
    "fbdbabcb" + "0000000000000080" + "00000000000000a0" + "0000000000000000" + ZEROS_100
    # entry 0: length 5, id 0, "hello"; entry 1: length 2, id 1, "ab"
    + "00000005" + "0000000000000000" + "68656c6c6f"
    + "00000002" + "0000000000000001" + "6162"
    + "fe"  # padding starts its pattern at the first padding byte
    # block 2 at offset 160: first entry id 2
    + "fbdbabcb" + "0000000000000080" + "00000000000000a0" + "0000000000000002" + ZEROS_100
    + "00000006" + "0000000000000002" + "78797a313233"
    + "00000000" + "0000000000000003"
    + "fedc"
    # block 3 at offset 320: first entry id 4
    + "fbdbabcb" + "0000000000000080" + "00000000000000a0" + "0000000000000004" + ZEROS_100
    + "00000004" + "0000000000000004" + "61626364"
    + "00000001" + "0000000000000005" + "21"
    + "fedcde"
    # block 4 at offset 480: first entry id 6, no padding
    + "fbdbabcb" + "0000000000000080" + "00000000000000a0" + "0000000000000006" + ZEROS_100
    + "00000014" + "0000000000000006" + "30313233343536373839" + "6162636465666768696a"
    # block 5 at offset 640: first entry id 7, 12 bytes of padding (the pattern repeats in phase)
    + "fbdbabcb" + "0000000000000080" + "00000000000000a0" + "0000000000000007" + ZEROS_100
    + "00000008" + "0000000000000007" + "3132333435363738"
    + "fedcdead" + "fedcdead" + "fedcdead"
    # block 6 at offset 800: the last block, 150 bytes (0x96)
    + "fbdbabcb" + "0000000000000080" + "0000000000000096" + "0000000000000008" + ZEROS_100
    + "0000000a" + "0000000000000008" + "30313233343536373839"
)  # fmt: skip
V1_DATA_LENGTH = 950  # 5 x 160 + 150
V1_METADATA = hexb("08011001")  # opaque to the index codec (a LedgerMetadataFormat: quorumSize 1, ensembleSize 1)
V1_INDEX_HEX = (
    "de47de47"  # magic
    + "0000009c"  # index length: 32 + 4 + 6 x 20 = 156
    + "00000000000003b6"  # data object length 950
    + "0000000000000080"  # data block header length 128
    + "00000006"  # 6 index entries
    + "00000004"  # 4 bytes of ledger metadata
    + "08011001"
    # {u64 first entry id, u32 part id, u64 offset}
    + "0000000000000000" + "00000001" + "0000000000000000"
    + "0000000000000002" + "00000002" + "00000000000000a0"
    + "0000000000000004" + "00000003" + "0000000000000140"
    + "0000000000000006" + "00000004" + "00000000000001e0"
    + "0000000000000007" + "00000005" + "0000000000000280"
    + "0000000000000008" + "00000006" + "0000000000000320"
)  # fmt: skip


# ---------------------------------------------------------------------------------------------------------------
# v2 (PIP-76) data object: ledgers 7 and 9, max block size 176 (0xb0).
# ---------------------------------------------------------------------------------------------------------------
V2_MAX_BLOCK = 176
V2_ENTRIES = [
    (7, 0, b"A" * 10),  # block 1: 128 + 22
    (7, 1, b"B" * 14),  #           + 26 = 176, fills the block exactly
    (7, 2, b"xy"),  # block 2: 128 + 14 = 142; entry 3 (42 bytes) does not fit -> 34 bytes of padding
    (7, 3, b"C" * 30),  # block 3: 128 + 42 = 170, cut exactly by the change to ledger 9
    (9, 5, b"hi"),  # block 4: 128 + 14 = 142, the last block
]
V2_DATA_HEX = (
    # block 1 at offset 0: magic, header length 128, block length 176, first entry 0, ledger 7, zeros
    "26a66d32" + "0000000000000080" + "00000000000000b0" + "0000000000000000" + "0000000000000007" + ZEROS_92
    + "0000000a" + "0000000000000000" + "41" * 10
    + "0000000e" + "0000000000000001" + "42" * 14
    # block 2 at offset 176: first entry 2, ledger 7, 34 bytes of padding
    + "26a66d32" + "0000000000000080" + "00000000000000b0" + "0000000000000002" + "0000000000000007" + ZEROS_92
    + "00000002" + "0000000000000002" + "7879"
    + "fedcdead" * 8 + "fedc"
    # block 3 at offset 352: first entry 3, ledger 7, 170 bytes (0xaa)
    + "26a66d32" + "0000000000000080" + "00000000000000aa" + "0000000000000003" + "0000000000000007" + ZEROS_92
    + "0000001e" + "0000000000000003" + "43" * 30
    # block 4 at offset 522: first entry 5, ledger 9, 142 bytes (0x8e)
    + "26a66d32" + "0000000000000080" + "000000000000008e" + "0000000000000005" + "0000000000000009" + ZEROS_92
    + "00000002" + "0000000000000005" + "6869"
)  # fmt: skip
V2_DATA_LENGTH = 664  # 176 + 176 + 170 + 142
V2_METADATA = {7: hexb("0807"), 9: hexb("08091001")}  # opaque LedgerInfo bytes
V2_INDEX_HEX = (
    "3d1fb0bc"  # magic
    + "0000008e"  # index length: 24 + (16 + 2 + 3 x 20) + (16 + 4 + 1 x 20) = 142
    + "0000000000000298"  # data object length 664
    + "0000000000000080"  # data block header length 128
    # ledger 7: id, 3 entries, 2 metadata bytes, metadata, entries (offsets over the whole data object)
    + "0000000000000007" + "00000003" + "00000002" + "0807"
    + "0000000000000000" + "00000001" + "0000000000000000"
    + "0000000000000002" + "00000002" + "00000000000000b0"
    + "0000000000000003" + "00000003" + "0000000000000160"
    # ledger 9: part ids continue across ledgers
    + "0000000000000009" + "00000001" + "00000004" + "08091001"
    + "0000000000000005" + "00000004" + "000000000000020a"
)  # fmt: skip


def test_v1_data_object_bytes() -> None:
    expected = hexb(V1_DATA_HEX)
    assert len(expected) == V1_DATA_LENGTH
    writer = BlockWriter(FormatVersion.V1, V1_MAX_BLOCK)
    blocks = [b for entry_id, payload in V1_ENTRIES for b in writer.add(42, entry_id, payload)] + writer.flush()
    assert b"".join(b.data for b in blocks) == expected
    assert [(b.offset, b.length, b.first_entry_id, b.last_entry_id) for b in blocks] == [
        (0, 160, 0, 1),
        (160, 160, 2, 3),
        (320, 160, 4, 5),
        (480, 160, 6, 6),
        (640, 160, 7, 7),
        (800, 150, 8, 8),
    ]
    # encode_block alone gives the same bytes for one block
    assert encode_block(FormatVersion.V1, 42, V1_ENTRIES[:2], V1_MAX_BLOCK) == expected[:160]
    assert encode_block(FormatVersion.V1, 42, V1_ENTRIES[8:]) == expected[800:]


def test_v1_data_object_decodes_to_its_fields() -> None:
    data = hexb(V1_DATA_HEX)
    decoded = list(iter_blocks(data))
    assert [b.header for b in decoded] == [
        BlockHeader(FormatVersion.V1, 160, 0),
        BlockHeader(FormatVersion.V1, 160, 2),
        BlockHeader(FormatVersion.V1, 160, 4),
        BlockHeader(FormatVersion.V1, 160, 6),
        BlockHeader(FormatVersion.V1, 160, 7),
        BlockHeader(FormatVersion.V1, 150, 8),
    ]
    assert [(e.entry_id, bytes(e.payload)) for b in decoded for e in b.entries] == V1_ENTRIES
    assert [e.offset for e in decoded[0].entries] == [128, 145]
    assert BlockHeader(FormatVersion.V1, 160, 2).encode() == data[160:288]


def test_v1_index_bytes() -> None:
    data = hexb(V1_DATA_HEX)
    writer = BlockWriter(FormatVersion.V1, V1_MAX_BLOCK)
    blocks = [b for entry_id, payload in V1_ENTRIES for b in writer.add(42, entry_id, payload)] + writer.flush()
    index = build_index(FormatVersion.V1, blocks, len(data), {42: V1_METADATA})
    assert index.encode() == hexb(V1_INDEX_HEX)
    decoded = OffloadIndex.decode(hexb(V1_INDEX_HEX), ledger_id=42)
    assert decoded == index
    assert decoded.ledgers[0].metadata == V1_METADATA
    assert decoded.ledgers[0].entries[2] == IndexEntry(first_entry_id=4, part_id=3, offset=320)
    assert [(b.offset, b.length) for b in decoded.blocks()] == [
        (0, 160),
        (160, 160),
        (320, 160),
        (480, 160),
        (640, 160),
        (800, 150),
    ]
    assert decoded.lookup(42, 5).offset == 320
    verify_against_blocks(decoded, iter_blocks(data), len(data))


def test_v2_data_object_bytes() -> None:
    expected = hexb(V2_DATA_HEX)
    assert len(expected) == V2_DATA_LENGTH
    writer = BlockWriter(FormatVersion.V2, V2_MAX_BLOCK)
    blocks = [b for ledger, entry_id, payload in V2_ENTRIES for b in writer.add(ledger, entry_id, payload)]
    blocks += writer.flush()
    assert b"".join(b.data for b in blocks) == expected
    assert [(b.ledger_id, b.offset, b.length, b.first_entry_id, b.entry_count) for b in blocks] == [
        (7, 0, 176, 0, 2),
        (7, 176, 176, 2, 1),
        (7, 352, 170, 3, 1),
        (9, 522, 142, 5, 1),
    ]
    assert encode_block(FormatVersion.V2, 7, [(2, b"xy")], V2_MAX_BLOCK) == expected[176:352]


def test_v2_data_object_decodes_to_its_fields() -> None:
    data = hexb(V2_DATA_HEX)
    block = decode_block(data, 176)
    assert block.header == BlockHeader(FormatVersion.V2, 176, 2, ledger_id=7)
    assert [(e.entry_id, e.offset, bytes(e.payload)) for e in block.entries] == [(2, 304, b"xy")]
    decoded = list(iter_blocks(data))
    assert [(b.header.ledger_id, b.header.first_entry_id, b.header.block_length) for b in decoded] == [
        (7, 0, 176),
        (7, 2, 176),
        (7, 3, 170),
        (9, 5, 142),
    ]
    assert [(b.header.ledger_id, e.entry_id, bytes(e.payload)) for b in decoded for e in b.entries] == V2_ENTRIES


def test_v2_index_bytes_sorted_by_ledger() -> None:
    data = hexb(V2_DATA_HEX)
    writer = BlockWriter(FormatVersion.V2, V2_MAX_BLOCK)
    blocks = [b for ledger, entry_id, payload in V2_ENTRIES for b in writer.add(ledger, entry_id, payload)]
    blocks += writer.flush()
    index = build_index(FormatVersion.V2, blocks, len(data), V2_METADATA)
    assert index.encode() == hexb(V2_INDEX_HEX)
    # ledgers given in descending order are still written ascending (Pulsar used a HashMap order here)
    reversed_ledgers = OffloadIndex(FormatVersion.V2, len(data), tuple(reversed(index.ledgers)))
    assert reversed_ledgers.encode() == hexb(V2_INDEX_HEX)
    decoded = OffloadIndex.decode(hexb(V2_INDEX_HEX))
    assert decoded == index
    assert decoded.ledgers == (
        LedgerIndex(7, hexb("0807"), (IndexEntry(0, 1, 0), IndexEntry(2, 2, 176), IndexEntry(3, 3, 352))),
        LedgerIndex(9, hexb("08091001"), (IndexEntry(5, 4, 522),)),
    )
    assert decoded.lookup(7, 1).offset == 0
    assert decoded.lookup(7, 3).offset == 352
    assert decoded.lookup(9, 5).length == 142
    verify_against_blocks(decoded, iter_blocks(data), len(data))
