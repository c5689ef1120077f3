"""Index objects of offloaded data: PIP-17 (v1, one ledger) and PIP-76 (v2, several ledgers).

v1 (magic ``0xDE47DE47``)::

    u32 magic | u32 index length | u64 data object length | u64 data header length (128)
    | u32 n | u32 m | m bytes BookKeeper LedgerMetadataFormat | n x {u64 firstEntryId, u32 partId, u64 offset}

v2 (magic ``0x3D1FB0BC``)::

    u32 magic | u32 index length | u64 data object length | u64 data header length (128)
    then per ledger, in ascending ledger id:
    u64 ledgerId | u32 n | u32 m | m bytes ManagedLedger LedgerInfo | n x {u64 firstEntryId, u32 partId, u64 offset}

``offset`` is where a block starts in the data object and ``partId`` is the block's ordinal there, from 1.
The per-ledger metadata is kept as opaque bytes here. A v1 index does not hold its ledger id: the caller
knows it from the object name (``<uuid>-ledger-<ledgerId>-index``).
"""

from __future__ import annotations

import bisect
import mmap
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property

from streamoffload.codecs.block_writer import Block
from streamoffload.codecs.blocks import (
    BLOCK_HEADER_LENGTH,
    MAX_BLOCK_LENGTH,
    MAX_ID,
    MIN_BLOCK_LENGTH,
    DecodedBlock,
    FormatVersion,
    InvalidFieldError,
    OrderingError,
)
from streamoffload.codecs.errors import (
    BadMagicError,
    CodecError,
    FormatError,
    IndexOutOfRangeError,
    LengthMismatchError,
    TruncatedError,
)

V1_INDEX_MAGIC = 0xDE47DE47
V2_INDEX_MAGIC = 0x3D1FB0BC
INDEX_ENTRY_LENGTH = 20
V1_INDEX_HEADER_LENGTH = 32
V2_INDEX_HEADER_LENGTH = 24
V2_LEDGER_HEADER_LENGTH = 16
# Pulsar reads the index length, entry counts and metadata lengths into Java ints.
MAX_INDEX_LENGTH = 2**31 - 1

_PREFIX = struct.Struct(">II")  # magic, index length
_V1_HEADER = struct.Struct(">IIQQII")  # magic, index length, data length, data header length, n, m
_V2_HEADER = struct.Struct(">IIQQ")  # magic, index length, data length, data header length
_V2_LEDGER = struct.Struct(">QII")  # ledger id, n, m
_ENTRY = struct.Struct(">QIQ")  # first entry id, part id, offset

_MAGIC_BY_VERSION = {FormatVersion.V1: V1_INDEX_MAGIC, FormatVersion.V2: V2_INDEX_MAGIC}
_VERSION_BY_MAGIC = {magic: version for version, magic in _MAGIC_BY_VERSION.items()}


class IndexMismatchError(FormatError):
    """An index object disagrees with the data object it describes."""


class EntryNotCoveredError(CodecError, LookupError):
    """A lookup asked for a (ledger, entry) position that an index does not cover."""


class IndexBuildError(CodecError, ValueError):
    """build_index was given blocks that cannot form one data object (gaps, disorder, missing metadata)."""


@dataclass(frozen=True, slots=True)
class IndexEntry:
    """One block of a ledger: its first entry id, part id (ordinal from 1) and offset in the data object."""

    first_entry_id: int
    part_id: int
    offset: int


@dataclass(frozen=True)
class LedgerIndex:
    """The index of one ledger. ``metadata`` is LedgerMetadataFormat bytes (v1) or LedgerInfo bytes (v2)."""

    ledger_id: int
    metadata: bytes
    entries: tuple[IndexEntry, ...]

    @property
    def first_entry_id(self) -> int:
        return self.entries[0].first_entry_id

    @cached_property
    def _first_ids(self) -> list[int]:
        return [e.first_entry_id for e in self.entries]


@dataclass(frozen=True, slots=True)
class BlockLocation:
    """Where one block lies in the data object, as the index tells it."""

    ledger_id: int
    first_entry_id: int
    part_id: int
    offset: int
    length: int

    @property
    def end(self) -> int:
        return self.offset + self.length


def _fail(cls: type[FormatError], message: str, offset: int | None, where: str | None) -> FormatError:
    return cls(message, offset=offset, where=where)


@dataclass(frozen=True)
class OffloadIndex:
    """A decoded (or to-be-encoded) index object."""

    version: FormatVersion
    data_object_length: int
    ledgers: tuple[LedgerIndex, ...]
    data_header_length: int = BLOCK_HEADER_LENGTH

    def __post_init__(self) -> None:
        # Frozen: normalise through object.__setattr__ so callers may pass 1/2 and lists.
        object.__setattr__(self, "version", FormatVersion(self.version))
        object.__setattr__(self, "ledgers", tuple(self.ledgers))

    # -- encoding --------------------------------------------------------------------------------------------

    def encode(self) -> bytes:
        """The index object bytes; v2 ledgers are written in ascending ledger id."""
        index = self
        if self.version is FormatVersion.V2:
            ordered = tuple(sorted(self.ledgers, key=lambda ledger: ledger.ledger_id))
            if ordered != self.ledgers:
                index = OffloadIndex(self.version, self.data_object_length, ordered, self.data_header_length)
        index.validate()
        if index.version is FormatVersion.V1:
            (ledger,) = index.ledgers
            length = V1_INDEX_HEADER_LENGTH + len(ledger.metadata) + INDEX_ENTRY_LENGTH * len(ledger.entries)
            _check_index_length(length)
            parts = [
                _V1_HEADER.pack(
                    V1_INDEX_MAGIC,
                    length,
                    index.data_object_length,
                    index.data_header_length,
                    len(ledger.entries),
                    len(ledger.metadata),
                ),
                bytes(ledger.metadata),
            ]
            parts.extend(_ENTRY.pack(e.first_entry_id, e.part_id, e.offset) for e in ledger.entries)
            return b"".join(parts)
        length = V2_INDEX_HEADER_LENGTH + sum(
            V2_LEDGER_HEADER_LENGTH + len(ledger.metadata) + INDEX_ENTRY_LENGTH * len(ledger.entries)
            for ledger in index.ledgers
        )
        _check_index_length(length)
        parts = [_V2_HEADER.pack(V2_INDEX_MAGIC, length, index.data_object_length, index.data_header_length)]
        for ledger in index.ledgers:
            parts.append(_V2_LEDGER.pack(ledger.ledger_id, len(ledger.entries), len(ledger.metadata)))
            parts.append(bytes(ledger.metadata))
            parts.extend(_ENTRY.pack(e.first_entry_id, e.part_id, e.offset) for e in ledger.entries)
        return b"".join(parts)

    # -- decoding --------------------------------------------------------------------------------------------

    @classmethod
    def decode(
        cls,
        buf: bytes | bytearray | memoryview | mmap.mmap,
        *,
        ledger_id: int | None = None,
        where: str | None = None,
    ) -> OffloadIndex:
        """Decode and validate a whole index object.

        A v1 index does not store its ledger id: pass ``ledger_id`` (from the object name). It is ignored
        for v2, whose index names every ledger.
        """
        view = buf if isinstance(buf, memoryview) else memoryview(buf)
        if view.format != "B" or view.ndim != 1:
            view = view.cast("B")
        size = len(view)
        if size < 4:
            raise _fail(TruncatedError, f"{size} bytes are too few to hold an index magic", 0, where)
        (magic,) = struct.unpack_from(">I", view, 0)
        version = _VERSION_BY_MAGIC.get(magic)
        if version is None:
            raise _fail(
                BadMagicError,
                f"bad index magic 0x{magic:08X} (expected 0x{V1_INDEX_MAGIC:08X} for v1 or "
                f"0x{V2_INDEX_MAGIC:08X} for v2)",
                0,
                where,
            )
        header_length = V1_INDEX_HEADER_LENGTH if version is FormatVersion.V1 else V2_INDEX_HEADER_LENGTH
        if size < header_length:
            raise _fail(
                TruncatedError,
                f"{version.label} index header needs {header_length} bytes but the index has {size}",
                0,
                where,
            )
        (_, index_length) = _PREFIX.unpack_from(view, 0)
        if index_length != size:
            raise _fail(
                LengthMismatchError,
                f"index length field says {index_length} bytes but the index object has {size}",
                4,
                where,
            )
        # Byte offsets of each ledger record and index entry, so that validation can point at them.
        ledger_at: list[int] = []
        entry_at: list[list[int]] = []
        ledgers: list[LedgerIndex] = []
        if version is FormatVersion.V1:
            if ledger_id is None:
                # Bytes of a v1 index where a v2 one is expected (a v1 object's name gives its ledger id): the
                # object is not what its name says, an error of the data, not of the caller.
                raise _fail(
                    FormatError,
                    "a v1 (ledger-based) index, which does not record its ledger id, where no ledger id is known "
                    "(a v1 index object's name ends in -ledger-<id>-index)",
                    0,
                    where,
                )
            _, _, data_length, data_header_length, n, m = _V1_HEADER.unpack_from(view, 0)
            expected = V1_INDEX_HEADER_LENGTH + m + INDEX_ENTRY_LENGTH * n
            if expected != size:
                raise _fail(
                    LengthMismatchError,
                    f"{n} index entries and {m} metadata bytes make a {expected}-byte index, but it has {size} bytes",
                    24,
                    where,
                )
            start = V1_INDEX_HEADER_LENGTH + m
            ledger_at.append(0)
            entry_at.append([start + INDEX_ENTRY_LENGTH * i for i in range(n)])
            ledgers.append(
                LedgerIndex(ledger_id, bytes(view[V1_INDEX_HEADER_LENGTH:start]), _decode_entries(view, start, n))
            )
        else:
            _, _, data_length, data_header_length = _V2_HEADER.unpack_from(view, 0)
            pos = V2_INDEX_HEADER_LENGTH
            while pos < size:
                if size - pos < V2_LEDGER_HEADER_LENGTH:
                    raise _fail(
                        TruncatedError,
                        f"ledger record header needs {V2_LEDGER_HEADER_LENGTH} bytes but only {size - pos} remain",
                        pos,
                        where,
                    )
                lid, n, m = _V2_LEDGER.unpack_from(view, pos)
                record_end = pos + V2_LEDGER_HEADER_LENGTH + m + INDEX_ENTRY_LENGTH * n
                if record_end > size:
                    raise _fail(
                        TruncatedError,
                        f"ledger {lid} record ({n} index entries, {m} metadata bytes) needs "
                        f"{record_end - pos} bytes but only {size - pos} remain",
                        pos,
                        where,
                    )
                start = pos + V2_LEDGER_HEADER_LENGTH + m
                ledger_at.append(pos)
                entry_at.append([start + INDEX_ENTRY_LENGTH * i for i in range(n)])
                ledgers.append(
                    LedgerIndex(
                        lid, bytes(view[pos + V2_LEDGER_HEADER_LENGTH : start]), _decode_entries(view, start, n)
                    )
                )
                pos = record_end
        index = cls(version, data_length, tuple(ledgers), data_header_length)
        index._validate(where, ledger_at, entry_at)
        return index

    # -- validation ------------------------------------------------------------------------------------------

    def validate(self) -> None:
        """Check the invariants decode() checks (raises the same FormatError subclasses, without offsets)."""
        self._validate(None, None, None)

    def _validate(self, where: str | None, ledger_at: list[int] | None, entry_at: list[list[int]] | None) -> None:
        def ledger_pos(i: int, field: int) -> int | None:
            return None if ledger_at is None else ledger_at[i] + field

        def entry_pos(i: int, j: int, field: int) -> int | None:
            return None if entry_at is None else entry_at[i][j] + field

        if self.data_header_length != BLOCK_HEADER_LENGTH:
            raise _fail(
                LengthMismatchError,
                f"data block header length is {self.data_header_length}, expected {BLOCK_HEADER_LENGTH}",
                None if ledger_at is None else 16,
                where,
            )
        if not MIN_BLOCK_LENGTH <= self.data_object_length <= MAX_ID:
            raise _fail(
                LengthMismatchError,
                f"data object length {self.data_object_length} outside {MIN_BLOCK_LENGTH}..{MAX_ID}",
                None if ledger_at is None else 8,
                where,
            )
        if not self.ledgers:
            raise _fail(LengthMismatchError, "index holds no ledgers", None if ledger_at is None else 24, where)
        if self.version is FormatVersion.V1 and len(self.ledgers) != 1:
            raise IndexBuildError(f"a v1 index holds exactly one ledger, not {len(self.ledgers)}")
        previous_ledger = -1
        previous_offset = -1
        previous_part = 0
        for i, ledger in enumerate(self.ledgers):
            if not 0 <= ledger.ledger_id <= MAX_ID:
                raise _fail(InvalidFieldError, f"ledger id {ledger.ledger_id} out of range", ledger_pos(i, 0), where)
            if ledger.ledger_id <= previous_ledger:
                raise _fail(
                    OrderingError,
                    f"ledger {ledger.ledger_id} follows ledger {previous_ledger}: ledgers must be in ascending order",
                    ledger_pos(i, 0),
                    where,
                )
            previous_ledger = ledger.ledger_id
            if not ledger.entries:
                raise _fail(
                    LengthMismatchError,
                    f"ledger {ledger.ledger_id} has no index entries",
                    ledger_pos(i, 8 if self.version is FormatVersion.V2 else 24),
                    where,
                )
            previous_entry = -1
            for j, entry in enumerate(ledger.entries):
                if not previous_entry < entry.first_entry_id <= MAX_ID:
                    raise _fail(
                        OrderingError,
                        f"ledger {ledger.ledger_id} index entry {j}: first entry id {entry.first_entry_id} does not"
                        f" follow {previous_entry} (ids must strictly increase)",
                        entry_pos(i, j, 0),
                        where,
                    )
                previous_entry = entry.first_entry_id
                if entry.part_id <= previous_part:
                    raise _fail(
                        OrderingError,
                        f"ledger {ledger.ledger_id} index entry {j}: part id {entry.part_id} does not follow part id "
                        f"{previous_part} (part ids count blocks from 1)",
                        entry_pos(i, j, 8),
                        where,
                    )
                previous_part = entry.part_id
                if previous_offset < 0 and entry.offset != 0:
                    raise _fail(
                        IndexOutOfRangeError,
                        f"first block is at data offset {entry.offset}, but a data object starts with a block",
                        entry_pos(i, j, 12),
                        where,
                    )
                if entry.offset >= self.data_object_length:
                    raise _fail(
                        IndexOutOfRangeError,
                        f"ledger {ledger.ledger_id} block at entry {entry.first_entry_id} points to data offset "
                        f"{entry.offset}, outside the {self.data_object_length}-byte data object",
                        entry_pos(i, j, 12),
                        where,
                    )
                if previous_offset >= 0 and not (
                    MIN_BLOCK_LENGTH <= entry.offset - previous_offset <= MAX_BLOCK_LENGTH
                ):
                    raise _fail(
                        IndexOutOfRangeError,
                        f"ledger {ledger.ledger_id} block at entry {entry.first_entry_id} starts at data offset "
                        f"{entry.offset}, {entry.offset - previous_offset} bytes after the previous block's start "
                        f"(offsets must increase by {MIN_BLOCK_LENGTH}..{MAX_BLOCK_LENGTH})",
                        entry_pos(i, j, 12),
                        where,
                    )
                previous_offset = entry.offset
        last_length = self.data_object_length - previous_offset
        if not MIN_BLOCK_LENGTH <= last_length <= MAX_BLOCK_LENGTH:
            raise _fail(
                IndexOutOfRangeError,
                f"last block starts at data offset {previous_offset}, leaving {last_length} bytes of the "
                f"{self.data_object_length}-byte data object for it (a block has {MIN_BLOCK_LENGTH}.."
                f"{MAX_BLOCK_LENGTH} bytes)",
                None if ledger_at is None else 8,
                where,
            )

    # -- queries ---------------------------------------------------------------------------------------------

    @cached_property
    def _locations(self) -> list[BlockLocation]:
        flat = [(ledger.ledger_id, e) for ledger in self.ledgers for e in ledger.entries]
        flat.sort(key=lambda item: item[1].offset)
        ends = [e.offset for _, e in flat[1:]] + [self.data_object_length]
        return [
            BlockLocation(lid, e.first_entry_id, e.part_id, e.offset, end - e.offset)
            for (lid, e), end in zip(flat, ends, strict=True)
        ]

    @cached_property
    def _by_ledger(self) -> dict[int, tuple[LedgerIndex, list[BlockLocation]]]:
        by_offset = {loc.offset: loc for loc in self._locations}
        return {ledger.ledger_id: (ledger, [by_offset[e.offset] for e in ledger.entries]) for ledger in self.ledgers}

    @property
    def ledger_ids(self) -> list[int]:
        return [ledger.ledger_id for ledger in self.ledgers]

    def ledger(self, ledger_id: int) -> LedgerIndex:
        """The index of one ledger; EntryNotCoveredError if the index does not hold it."""
        try:
            return self._by_ledger[ledger_id][0]
        except KeyError:
            raise EntryNotCoveredError(
                f"ledger {ledger_id} is not in this index (it holds ledgers {_id_list(self.ledger_ids)})"
            ) from None

    def lookup(self, ledger_id: int, entry_id: int) -> BlockLocation:
        """The block that holds (ledger_id, entry_id), by binary search over the ledger's first entry ids.

        An entry id past the ledger's last entry maps to the ledger's last block (the index does not store
        last entry ids; the ledger metadata does); reading that block then does not find the entry.
        """
        found = self._by_ledger.get(ledger_id)
        if found is None:
            raise EntryNotCoveredError(
                f"ledger {ledger_id} is not in this index (it holds ledgers {_id_list(self.ledger_ids)})"
            )
        ledger, locations = found
        i = bisect.bisect_right(ledger._first_ids, entry_id) - 1
        if i < 0:
            raise EntryNotCoveredError(
                f"entry {entry_id} of ledger {ledger_id} precedes the first entry this index covers "
                f"({ledger.first_entry_id})"
            )
        return locations[i]

    def blocks(self) -> list[BlockLocation]:
        """All blocks in data-object order, with their lengths."""
        return list(self._locations)


def is_v1_index(buf: bytes | memoryview) -> bool:
    """Whether ``buf`` starts as a v1 (ledger-based) index, which does not record its ledger id: decoding it
    needs the id from elsewhere (the object key, a manifest, the caller)."""
    return bytes(buf[:4]) == V1_INDEX_MAGIC.to_bytes(4, "big")


def _decode_entries(view: memoryview, start: int, n: int) -> tuple[IndexEntry, ...]:
    chunk = view[start : start + INDEX_ENTRY_LENGTH * n]
    return tuple(IndexEntry(eid, part, off) for eid, part, off in _ENTRY.iter_unpack(chunk))


def _check_index_length(length: int) -> None:
    if length > MAX_INDEX_LENGTH:
        raise IndexBuildError(f"index would be {length} bytes, more than Pulsar can read ({MAX_INDEX_LENGTH})")


def _id_list(ids: Sequence[int]) -> str:
    shown = ", ".join(str(i) for i in ids[:10])
    return shown + (f", ... ({len(ids)} in all)" if len(ids) > 10 else "") if ids else "none"


def build_index(
    version: FormatVersion,
    blocks: Sequence[Block],
    data_object_length: int,
    ledger_metadata: Mapping[int, bytes],
) -> OffloadIndex:
    """The index of a data object made of ``blocks`` (in data-object order, as ``BlockWriter`` returns them).

    Part ids are the blocks' ordinals from 1. The blocks must start at offset 0, follow each other without
    gaps and end at ``data_object_length``; ``ledger_metadata`` must hold the metadata of every ledger.
    """
    version = FormatVersion(version)
    if not blocks:
        raise IndexBuildError("an index needs at least one block")
    expected_offset = 0
    grouped: list[tuple[int, list[IndexEntry]]] = []
    for part_id, block in enumerate(blocks, start=1):
        if block.offset != expected_offset:
            raise IndexBuildError(
                f"block {part_id} (ledger {block.ledger_id}, entries {block.first_entry_id}..{block.last_entry_id}) "
                f"is at offset {block.offset}, but the previous blocks end at {expected_offset}"
            )
        expected_offset += len(block.data)
        if grouped and block.ledger_id != grouped[-1][0]:
            if version is FormatVersion.V1:
                raise IndexBuildError(
                    f"a v1 data object holds one ledger: block {part_id} is of ledger {block.ledger_id}, "
                    f"the first of ledger {grouped[0][0]}"
                )
            if block.ledger_id < grouped[-1][0]:
                raise IndexBuildError(
                    f"block {part_id} of ledger {block.ledger_id} follows ledger {grouped[-1][0]}: "
                    "blocks must be in position order"
                )
        if not grouped or block.ledger_id != grouped[-1][0]:
            grouped.append((block.ledger_id, []))
        grouped[-1][1].append(IndexEntry(block.first_entry_id, part_id, block.offset))
    if expected_offset != data_object_length:
        raise IndexBuildError(
            f"blocks end at offset {expected_offset}, but the data object is {data_object_length} bytes"
        )
    missing = [lid for lid, _ in grouped if lid not in ledger_metadata]
    if missing:
        raise IndexBuildError(f"no ledger metadata for ledger(s) {_id_list(missing)}")
    index = OffloadIndex(
        version,
        data_object_length,
        tuple(LedgerIndex(lid, bytes(ledger_metadata[lid]), tuple(entries)) for lid, entries in grouped),
    )
    index.validate()
    return index


def verify_against_blocks(
    index: OffloadIndex,
    blocks: Iterable[DecodedBlock],
    data_object_length: int,
    *,
    where: str | None = None,
) -> None:
    """Check that ``index`` describes exactly the decoded ``blocks`` of a data object of ``data_object_length``.

    Raises IndexMismatchError at the data offset of the first disagreement (format, data length, block
    offsets, lengths, ledger ids, first entry ids, part ids).
    """
    if index.data_object_length != data_object_length:
        raise IndexMismatchError(
            f"index says the data object is {index.data_object_length} bytes, but it is {data_object_length}",
            offset=min(index.data_object_length, data_object_length),
            where=where,
        )
    locations = index.blocks()
    count = 0
    for count, block in enumerate(blocks, start=1):
        if block.header.version is not index.version:
            raise IndexMismatchError(
                f"{index.version.label} index for a {block.header.version.label} data object",
                offset=block.offset,
                where=where,
            )
        if count > len(locations):
            raise IndexMismatchError(
                f"data object has a block the index does not list (the index lists {len(locations)})",
                offset=block.offset,
                where=where,
            )
        loc = locations[count - 1]
        problems = []
        if loc.offset != block.offset:
            problems.append(f"index offset {loc.offset}")
        if loc.length != block.header.block_length:
            problems.append(f"index length {loc.length} vs block length {block.header.block_length}")
        if loc.first_entry_id != block.header.first_entry_id:
            problems.append(f"index first entry {loc.first_entry_id} vs block {block.header.first_entry_id}")
        if block.header.ledger_id is not None and loc.ledger_id != block.header.ledger_id:
            problems.append(f"index ledger {loc.ledger_id} vs block ledger {block.header.ledger_id}")
        if loc.part_id != count:
            problems.append(f"index part id {loc.part_id}, expected {count}")
        if problems:
            raise IndexMismatchError(
                f"index disagrees with data block {count}: " + "; ".join(problems),
                offset=block.offset,
                where=where,
            )
    if count != len(locations):
        raise IndexMismatchError(
            f"index lists {len(locations)} blocks but the data object has {count}",
            offset=data_object_length,
            where=where,
        )


__all__ = [
    "INDEX_ENTRY_LENGTH",
    "MAX_INDEX_LENGTH",
    "V1_INDEX_HEADER_LENGTH",
    "V1_INDEX_MAGIC",
    "V2_INDEX_HEADER_LENGTH",
    "V2_INDEX_MAGIC",
    "V2_LEDGER_HEADER_LENGTH",
    "BlockLocation",
    "EntryNotCoveredError",
    "IndexBuildError",
    "IndexEntry",
    "IndexMismatchError",
    "LedgerIndex",
    "OffloadIndex",
    "build_index",
    "is_v1_index",
    "verify_against_blocks",
]
