"""What the segmenter tells the sink to write: a part as a run of block layouts, positions and sizes only.

The segmenter decides every byte of a data object from entry metadata (position, size, CRC-32C): where
blocks are cut, how they are padded, which blocks make a part. It never holds entry bytes. The sink
fetches the entries a part names (``streaming.sink.entry_fetch``), checks each one's size and CRC-32C against
the layout, and builds the blocks with ``codecs.blocks.encode_block``: the same bytes the segmenter
would have built, since a block's bytes are a function of its entries, its ledger and its padding.

A layout is a concatenation of block records, so the layouts of several blocks join by ``+``::

    block:  u64 ledgerId, i64 firstEntryId, i64 afterLedgerId, i64 afterEntryId, u64 paddedTo (0: exact
            length), u32 n, n x entry
    entry:  i64 entryId, u32 size, u32 crc32c

(big-endian). 16 bytes per entry: a 64 MiB part of 1 KiB entries is described in about 1 MiB. ``after``
is the position of the entry the segmenter saw just before the block's first one (``(-1, -1)``: none),
so a fetch reads exactly ``(after, last]`` -- a ledger's first entry has no ``(L, first - 1)`` to start
after that a broker subscription takes.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from streamoffload.codecs.blocks import BLOCK_HEADER_LENGTH, FormatVersion, encode_block_chunks, framed_entry_size
from streamoffload.codecs.checksums import BlockChecksums
from streamoffload.storage.base import Buffer
from streamoffload.streaming.errors import StreamingError
from streamoffload.streaming.handoff.entry import Entry

_BLOCK = struct.Struct(">QqqqQI")
_ENTRY = struct.Struct(">qII")


class LayoutError(StreamingError):
    """A part layout that cannot be decoded (a bug, or state written by another version)."""


@dataclass(frozen=True)
class BlockLayout:
    """One block of a data object: its ledger, its entries in order, and its padded length (0: exact)."""

    ledger_id: int
    entries: tuple[tuple[int, int, int], ...]
    """(entry id, size, crc32c) of each entry, in entry-id order."""
    padded_to: int = 0
    after: tuple[int, int] = (-1, -1)
    """The position just before the first entry (where a read of the block's entries starts after)."""

    @property
    def first_entry_id(self) -> int:
        return self.entries[0][0]

    @property
    def length(self) -> int:
        """The block's length in the data object."""
        if self.padded_to:
            return self.padded_to
        return BLOCK_HEADER_LENGTH + sum(framed_entry_size(size) for _, size, _ in self.entries)

    def refs(self) -> Iterator[Entry]:
        for entry_id, size, crc in self.entries:
            yield Entry(self.ledger_id, entry_id, size, crc)


def encode_layouts(blocks: Iterable[BlockLayout]) -> bytes:
    out = bytearray()
    for block in blocks:
        out += _BLOCK.pack(block.ledger_id, block.first_entry_id, *block.after, block.padded_to, len(block.entries))
        for entry in block.entries:
            out += _ENTRY.pack(*entry)
    return bytes(out)


def decode_layouts(data: bytes) -> list[BlockLayout]:
    blocks: list[BlockLayout] = []
    view = memoryview(data)
    offset = 0
    while offset < len(view):
        if offset + _BLOCK.size > len(view):
            raise LayoutError(f"part layout: truncated block record at offset {offset} of {len(view)}")
        ledger, first, after_ledger, after_entry, padded, n = _BLOCK.unpack_from(view, offset)
        offset += _BLOCK.size
        end = offset + n * _ENTRY.size
        if n == 0 or end > len(view):
            raise LayoutError(f"part layout: block of ledger {ledger} with {n} entries overruns {len(view)} bytes")
        entries = tuple(_ENTRY.iter_unpack(view[offset:end]))
        if entries[0][0] != first:
            raise LayoutError(f"part layout: block of ledger {ledger} says it starts at {first}, not {entries[0][0]}")
        blocks.append(BlockLayout(ledger, entries, padded, (after_ledger, after_entry)))
        offset = end
    return blocks


def part_refs(blocks: Sequence[BlockLayout]) -> list[Entry]:
    """Every entry of a part, in position order."""
    return [ref for block in blocks for ref in block.refs()]


def part_length(blocks: Sequence[BlockLayout]) -> int:
    return sum(block.length for block in blocks)


def checksum_records(blocks: Sequence[BlockLayout], first_block: int, offset: int) -> list[tuple[int, bytes]]:
    """``(block ordinal, record)`` of each block of a part whose first block is the data object's
    ``first_block``-th, starting at ``offset``: the CRC-32C of every entry, as the layouts carry them (the
    source's, which the fetcher checked the fetched bytes against), in ``codecs.checksums``' format."""
    out = []
    for i, block in enumerate(blocks):
        record = BlockChecksums.of(offset, block.ledger_id, [(entry_id, crc) for entry_id, _, crc in block.entries])
        out.append((first_block + i, record.encode()))
        offset += block.length
    return out


def build_part(version: FormatVersion, blocks: Sequence[BlockLayout], payloads: Sequence[Buffer]) -> bytes:
    """The part's bytes: each block encoded from ``payloads`` (the part's entries in order, already
    checked against the layout by the fetcher)."""
    return b"".join(part_chunks(version, blocks, payloads))


def part_chunks(version: FormatVersion, blocks: Sequence[BlockLayout], payloads: Sequence[Buffer]) -> list[Buffer]:
    """:func:`build_part` as buffers whose concatenation is the part, not joined: a store writes them as they
    are (``MultipartWrite.write_part`` takes them), so the entries' bytes are not copied into a part first."""
    return [chunk for block in block_chunks_of_part(version, blocks, payloads) for chunk in block]


def block_chunks_of_part(
    version: FormatVersion, blocks: Sequence[BlockLayout], payloads: Sequence[Buffer]
) -> list[list[Buffer]]:
    """The part's buffers block by block (an encrypted segment seals each block on its own)."""
    out: list[list[Buffer]] = []
    i = 0
    for block in blocks:
        n = len(block.entries)
        entries = [(entry_id, payloads[i + k]) for k, (entry_id, _, _) in enumerate(block.entries)]
        i += n
        out.append(encode_block_chunks(version, block.ledger_id, entries, block.padded_to or None))
    if i != len(payloads):
        raise LayoutError(f"part layout names {i} entries but {len(payloads)} were fetched")
    return out
