"""Planning the ranged reads of a sequential scan (which ranges, in which order, where they end)."""

from __future__ import annotations

import struct

from streamoffload.codecs.blocks import BLOCK_HEADER_LENGTH, ENTRY_HEADER_LENGTH, PADDING_WORD
from streamoffload.codecs.index import BlockLocation
from streamoffload.read.segment.chunked_object import ChunkedObject, Range

_U32 = struct.Struct(">I")


class RangePlanner:
    """Plans the ranged reads of a sequential scan.

    Entry-aligned (local files): each read takes ``read_buffer_size`` bytes (the known entry alone when a
    full buffer would add only part of another, more when it is larger) from the first byte no earlier
    range holds whole; the range handed over ends at the last entry (or block header) that fits, and the
    next read starts there. No entry straddles two ranges and none is copied to be joined; the price is
    re-reading the unfinished entry at the end of a read, which for a page-cache read costs what a join's
    copy would, and less. Padding at the end of a block is skipped, not read. Only the framing needed to
    find entry boundaries is looked at here; the reader checks everything when it decodes.

    Contiguous (remote stores): back-to-back reads of ``read_buffer_size`` bytes; entries crossing a range
    end are joined in memory, which is far cheaper than fetching their bytes twice over the network.
    """

    def __init__(
        self,
        chunks: ChunkedObject,
        blocks: list[BlockLocation],
        block_index: int,
        begin: int,
        end: int,
        *,
        contiguous: bool = False,
    ) -> None:
        self._contiguous = contiguous
        self._chunks = chunks
        self._blocks = blocks
        self._bi = block_index  # the block holding _pos
        self._pos = begin
        self._end = end
        self._need = 0  # bytes of the entry starting at _pos, when the previous read told us
        self._seen_bytes = 0  # entries handed over so far, for their mean size
        self._seen_entries = 0

    def next(self) -> Range | None:
        pos, end = self._pos, self._end
        if pos >= end:
            return None
        size, need = self._chunks.size, self._need
        if self._contiguous:
            view = memoryview(self._chunks.read_range(pos, min(size, end - pos)))
            self._pos = pos + len(view)
            return pos, view
        want = max(size, need)
        if need and self._seen_entries and size - need < self._seen_bytes / self._seen_entries:
            # What a full buffer would add after the known entry is less than an average entry: most likely
            # only part of one, to be read again. Read the known entry alone.
            want = need
        while True:
            view = memoryview(self._chunks.read_range(pos, min(want, end - pos)))
            cut, next_pos, bi, need, entries = self._plan(pos, view)
            if cut > pos:
                self._seen_bytes += cut - pos
                self._seen_entries += entries
                break
            if need > len(view) and pos + need <= end:
                want = need  # one unit larger than the read: read it whole
                continue
            cut = next_pos = pos + len(view)  # nothing decodable: hand it over; the reader reports why
            break
        self._pos, self._bi, self._need = next_pos, bi, need if next_pos == cut else 0
        return pos, view[: cut - pos]

    def _plan(self, pos: int, view: memoryview) -> tuple[int, int, int, int, int]:
        """(where the range ends, where the next read starts, block index there, size of the entry there if
        known, entries in the range)."""
        blocks = self._blocks
        bi = self._bi
        data_end = pos + len(view)
        unpack = _U32.unpack_from
        q = pos
        n = 0
        while q < data_end:
            block = blocks[bi]
            if q == block.offset:
                if q + BLOCK_HEADER_LENGTH > data_end:
                    return q, q, bi, 0, n
                q += BLOCK_HEADER_LENGTH
                continue
            block_end = block.offset + block.length
            if q >= block_end:
                bi += 1
                continue
            remaining = block_end - q
            if remaining < ENTRY_HEADER_LENGTH:
                if block_end > data_end:
                    return q, q, bi, 0, n
                q = block_end
                continue
            if q + ENTRY_HEADER_LENGTH > data_end:
                return q, q, bi, 0, n
            (length,) = unpack(view, q - pos)
            if length == PADDING_WORD:
                if block_end <= data_end:
                    q = block_end
                    continue
                # The reader checks the first padding bytes; the rest of the block is skipped.
                return q + ENTRY_HEADER_LENGTH, block_end, bi + 1, 0, n
            if length > remaining - ENTRY_HEADER_LENGTH:
                return data_end, data_end, bi, 0, n  # corrupt length: the reader reports it
            entry_end = q + ENTRY_HEADER_LENGTH + length
            if entry_end > data_end:
                return q, q, bi, ENTRY_HEADER_LENGTH + length, n
            q = entry_end
            n += 1
        return q, q, bi, 0, n
