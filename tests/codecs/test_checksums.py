"""Block checksum records (``codecs.checksums``): round trips, lookups, and every damaged byte refused."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamoffload.codecs.checksums import (
    HEADER_LENGTH,
    PROP_BLOCK_CHECKSUMS,
    PROP_INDEX_CRC,
    BlockChecksums,
    recorded_checksums,
)
from streamoffload.codecs.errors import FormatError
from streamoffload.codecs.positions import MAX_ID

u32 = st.integers(0, 2**32 - 1)
ids = st.integers(0, MAX_ID)


@st.composite
def blocks(draw: st.DrawFn) -> tuple[int, int, list[tuple[int, int]]]:
    """(offset, ledger, [(entry id, crc)]) with strictly increasing ids, consecutive or with gaps."""
    n = draw(st.integers(1, 60))
    first = draw(st.integers(0, MAX_ID - 10 * n))
    gaps = draw(st.lists(st.integers(1, 1 if draw(st.booleans()) else 9), min_size=n - 1, max_size=n - 1))
    entry_ids = [first]
    for gap in gaps:
        entry_ids.append(entry_ids[-1] + gap)
    crcs = draw(st.lists(u32, min_size=n, max_size=n))
    return draw(ids), draw(ids), list(zip(entry_ids, crcs, strict=True))


@given(blocks())
def test_round_trip_and_lookup(block: tuple[int, int, list[tuple[int, int]]]) -> None:
    offset, ledger, entries = block
    record = BlockChecksums.of(offset, ledger, entries)
    data = record.encode()
    consecutive = all(b[0] == a[0] + 1 for a, b in itertools.pairwise(entries))
    # 4 bytes per entry when ids are consecutive, 12 otherwise, plus the header.
    assert len(data) == HEADER_LENGTH + (4 if consecutive else 12) * len(entries)
    decoded = BlockChecksums.decode(data)
    assert (decoded.offset, decoded.ledger_id, decoded.first_entry_id) == (offset, ledger, entries[0][0])
    assert decoded.count == len(entries) and decoded.last_entry_id == entries[-1][0]
    for entry_id, crc in entries:
        assert decoded.crc_of(entry_id) == crc
    present = {e for e, _ in entries}
    for probe in (entries[0][0] - 1, entries[-1][0] + 1, entries[0][0] + 1):
        if probe not in present:
            assert decoded.crc_of(probe) is None
    assert decoded.encode() == data  # deterministic: a replayed part rewrites the same bytes


@settings(max_examples=50)
@given(blocks(), st.data())
def test_every_flipped_bit_is_refused(block: tuple[int, int, list[tuple[int, int]]], data: st.DataObject) -> None:
    """A damaged record is an error naming the record, never a record that says something else."""
    raw = bytearray(BlockChecksums.of(*block).encode())
    bit = data.draw(st.integers(0, len(raw) * 8 - 1))
    raw[bit // 8] ^= 1 << (bit % 8)
    with pytest.raises(FormatError) as err:
        BlockChecksums.decode(bytes(raw), where="rec")
    assert err.value.where == "rec" and err.value.offset is not None


@given(blocks(), st.integers(0, 40))
def test_truncated_or_extended_records_are_refused(block: tuple[int, int, list[tuple[int, int]]], cut: int) -> None:
    raw = BlockChecksums.of(*block).encode()
    with pytest.raises(FormatError):
        BlockChecksums.decode(raw[: len(raw) - 1 - cut], where="rec")
    with pytest.raises(FormatError):
        BlockChecksums.decode(raw + b"\0" * (cut + 1), where="rec")


def test_manifest_properties() -> None:
    none = recorded_checksums([])
    assert (none.blocks, none.index_crc, none.any) == (False, None, False)
    both = recorded_checksums([(PROP_BLOCK_CHECKSUMS, "1"), (PROP_INDEX_CRC, "00c0ffee"), ("method", "streaming")])
    assert (both.blocks, both.index_crc) == (True, 0xC0FFEE)
    # A version or a value this reader cannot use is an error, never a check silently skipped.
    with pytest.raises(FormatError, match="version 1"):
        recorded_checksums([(PROP_BLOCK_CHECKSUMS, "2")])
    with pytest.raises(FormatError, match="8 hex digits"):
        recorded_checksums([(PROP_INDEX_CRC, "xyz")])


def test_a_block_needs_an_entry() -> None:
    with pytest.raises(ValueError):
        BlockChecksums.of(0, 1, [])
