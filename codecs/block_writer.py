"""Writing data objects a block at a time: ``BlockWriter`` takes entries in position order and cuts
finished ``Block``s (layout and validation in ``codecs.blocks``)."""

from __future__ import annotations

from dataclasses import dataclass

from streamoffload.codecs.blocks import (
    BLOCK_HEADER_LENGTH,
    ENTRY_HEADER,
    ENTRY_HEADER_LENGTH,
    MAX_BLOCK_LENGTH,
    MIN_BLOCK_LENGTH,
    FormatVersion,
    assemble_block,
    check_id,
)
from streamoffload.codecs.errors import CodecError, EntryTooLargeError
from streamoffload.codecs.positions import MAX_ID


class BlockWriterError(CodecError, ValueError):
    """A BlockWriter was fed something it cannot write: out-of-order positions or a second ledger in v1."""


@dataclass(frozen=True, slots=True)
class Block:
    """A finished block, placed at ``offset`` in its data object. ``data`` is the encoded block."""

    ledger_id: int
    first_entry_id: int
    last_entry_id: int
    entry_count: int
    offset: int
    data: bytes

    @property
    def length(self) -> int:
        return len(self.data)

    @property
    def end(self) -> int:
        return self.offset + len(self.data)


class BlockWriter:
    """Feed entries in position order; cuts a new block at every ledger change or when the next entry does not fit.

    Blocks cut because they are full are exactly ``max_block_size`` (padded); a block cut by a ledger change or
    by flush() fits exactly (so the last block of a data object fits exactly). A block filled to the byte is
    returned by the add() that filled it. Payloads are referenced, not copied, until their block is
    encoded: do not reuse a payload's buffer before the block holding it has been returned.
    """

    def __init__(self, version: FormatVersion, max_block_size: int, *, start_offset: int = 0) -> None:
        self.version = FormatVersion(version)
        if not MIN_BLOCK_LENGTH <= max_block_size <= MAX_BLOCK_LENGTH:
            raise ValueError(
                f"max block size {max_block_size} outside {MIN_BLOCK_LENGTH}.."
                f"{MAX_BLOCK_LENGTH} (a block holds a {BLOCK_HEADER_LENGTH}-byte header and at least one "
                f"{ENTRY_HEADER_LENGTH}-byte entry header)"
            )
        if start_offset < 0:
            raise ValueError(f"start offset {start_offset} is negative")
        self.max_block_size = max_block_size
        self._offset = start_offset
        # The open block: its ledger, first/last entry ids, entry count, framed entries and size with header.
        self._ledger_id = -1
        self._first_entry_id = -1
        self._last_entry_id = -1
        self._count = 0
        self._parts: list[bytes | bytearray | memoryview] = []
        self._pending = 0
        self._v1_ledger_id: int | None = None  # the one ledger a v1 data object may hold
        self._last_ledger = -1  # position of the last entry accepted
        self._last_entry = -1

    @property
    def pending_bytes(self) -> int:
        """Bytes the open block would occupy now (header + framed entries); 0 without an open block."""
        return self._pending

    @property
    def offset(self) -> int:
        """Data-object offset where the next block will start."""
        return self._offset

    @property
    def last_position(self) -> tuple[int, int] | None:
        """(ledger id, entry id) of the last entry accepted, or None."""
        return None if self._last_ledger < 0 else (self._last_ledger, self._last_entry)

    def add(self, ledger_id: int, entry_id: int, payload: bytes | bytearray | memoryview) -> list[Block]:
        """Add one entry; returns the blocks this call completed (often none)."""
        if not (0 <= ledger_id <= MAX_ID and 0 <= entry_id <= MAX_ID):
            check_id("ledger id", ledger_id)
            check_id("entry id", entry_id)
        if ledger_id == self._last_ledger:
            if entry_id <= self._last_entry:
                self._out_of_order(ledger_id, entry_id)
        elif ledger_id < self._last_ledger:
            self._out_of_order(ledger_id, entry_id)
        elif self._v1_ledger_id is not None:
            raise BlockWriterError(
                f"a v1 data object holds one ledger only: got ledger {ledger_id} after ledger {self._v1_ledger_id}"
            )
        size = payload.nbytes if type(payload) is memoryview else len(payload)
        framed = ENTRY_HEADER_LENGTH + size
        if BLOCK_HEADER_LENGTH + framed > self.max_block_size:
            raise EntryTooLargeError(
                f"entry {entry_id} of ledger {ledger_id} has {size} bytes; framed with its {ENTRY_HEADER_LENGTH}-byte"
                f" header it does not fit in a block of {self.max_block_size} bytes ({BLOCK_HEADER_LENGTH}-byte header)"
            )
        done: list[Block] = []
        if self._count:
            if ledger_id != self._ledger_id:
                done.append(self._cut(exact=True))
            elif self._pending + framed > self.max_block_size:
                done.append(self._cut(exact=False))
        if not self._count:
            self._ledger_id = ledger_id
            self._first_entry_id = entry_id
            self._pending = BLOCK_HEADER_LENGTH
        self._parts.append(ENTRY_HEADER.pack(size, entry_id))
        self._parts.append(payload)
        self._count += 1
        self._last_entry_id = entry_id
        self._pending += framed
        self._last_ledger = ledger_id
        self._last_entry = entry_id
        if self.version is FormatVersion.V1:
            self._v1_ledger_id = ledger_id
        if self._pending == self.max_block_size:
            # Filled to the byte: nothing can follow, and padded and exact fit are the same block.
            done.append(self._cut(exact=True))
        return done

    def _out_of_order(self, ledger_id: int, entry_id: int) -> None:
        raise BlockWriterError(
            f"entry ({ledger_id}, {entry_id}) does not follow ({self._last_ledger}, {self._last_entry}): "
            "entries must be added in strictly increasing position order"
        )

    def flush(self) -> list[Block]:
        """Cut the open block (fitted exactly), if any."""
        return [self._cut(exact=True)] if self._count else []

    def _cut(self, *, exact: bool) -> Block:
        length = self._pending if exact else self.max_block_size
        data = assemble_block(self.version, self._ledger_id, self._first_entry_id, self._parts, self._pending, length)
        block = Block(
            ledger_id=self._ledger_id,
            first_entry_id=self._first_entry_id,
            last_entry_id=self._last_entry_id,
            entry_count=self._count,
            offset=self._offset,
            data=data,
        )
        self._offset += length
        self._parts = []
        self._count = 0
        self._pending = 0
        return block


__all__ = ["Block", "BlockWriter", "BlockWriterError"]
