"""Recorded entry checksums: the CRC-32C of every entry of one data block, kept beside the data object.

Pulsar entries may carry their own checksum section (``0x0e01``), but it is optional: pulsar-lite never
sends it, and older producers omit it. So the tier records a CRC-32C of every entry's bytes (exactly the
bytes stored in the block, whatever they hold) at offload time, one small object per block
(``storage.keys.block_checksums_key``), and readers check every entry against it. The data and index
objects keep Pulsar's layout untouched.

Layout (big-endian)::

    magic "SOC\\x01" | u32 CRC-32C of the body | body
    body:  u64 block offset in the data object, u64 ledger id, u64 first entry id, u32 n, u32 flags,
           n x u32 CRC-32C of each entry's payload, in order,
           then, when flags & EXPLICIT_IDS, n x u64 entry ids (a block whose ids are not consecutive)

4 bytes per entry plus 40 per block when the block's entry ids are consecutive (the usual case: a ledger's
entries are numbered 0, 1, 2, ...); 12 bytes per entry otherwise. The frame's own CRC makes a damaged
record an error naming the record, never a false verdict on an entry.

Pure: no I/O.
"""

from __future__ import annotations

import bisect
import itertools
import struct
import sys
from array import array
from collections.abc import Sequence
from dataclasses import dataclass

import crc32c as _crc32c

from streamoffload.codecs.blocks import ENTRY_HEADER_LENGTH
from streamoffload.codecs.errors import ChecksumError, FormatError
from streamoffload.codecs.frame import FRAME_LENGTH, frame, unframe
from streamoffload.codecs.positions import MAX_ID

MAGIC = b"SOC\x01"
""""SOC" (streamoffload checksums) and the record's version 1."""
EXPLICIT_IDS = 1
_HEAD = struct.Struct(">QQQII")  # offset, ledger id, first entry id, n, flags
HEADER_LENGTH = FRAME_LENGTH + _HEAD.size
_KNOWN_FLAGS = EXPLICIT_IDS


@dataclass(frozen=True)
class BlockChecksums:
    """The recorded CRC-32C of each entry of one block."""

    offset: int
    """Where the block starts in the data object."""
    ledger_id: int
    entry_ids: Sequence[int] | None
    """The entries' ids when they are not ``first_entry_id, first_entry_id + 1, ...``; else None."""
    crcs: Sequence[int]
    """4 bytes each (an ``array``) once decoded: a reader keeps many blocks' records."""
    first_entry_id: int

    @classmethod
    def of(cls, offset: int, ledger_id: int, entries: Sequence[tuple[int, int]]) -> BlockChecksums:
        """From ``(entry id, crc32c)`` pairs in entry-id order."""
        if not entries:
            raise ValueError("a block holds at least one entry")
        ids = tuple(e for e, _ in entries)
        first = ids[0]
        consecutive = ids[-1] - first + 1 == len(ids) and all(b > a for a, b in itertools.pairwise(ids))
        return cls(offset, ledger_id, None if consecutive else ids, tuple(c for _, c in entries), first)

    @property
    def count(self) -> int:
        return len(self.crcs)

    @property
    def last_entry_id(self) -> int:
        return self.entry_ids[-1] if self.entry_ids is not None else self.first_entry_id + len(self.crcs) - 1

    def crc_of(self, entry_id: int) -> int | None:
        """The recorded CRC-32C of ``entry_id``; None when the block recorded no such entry."""
        ids = self.entry_ids
        if ids is None:
            i = entry_id - self.first_entry_id
            return self.crcs[i] if 0 <= i < len(self.crcs) else None
        i = bisect.bisect_left(ids, entry_id)
        return self.crcs[i] if i < len(ids) and ids[i] == entry_id else None

    def check(self, entry_id: int, payload: bytes | memoryview, *, at: int, record: str, where: str | None) -> None:
        """``payload``, entry ``entry_id`` whose bytes start at offset ``at`` of the data object ``where``,
        against the CRC-32C this record (the object ``record``) holds for it; ``ChecksumError`` otherwise."""
        want = self.crc_of(entry_id)
        if want is None:
            raise ChecksumError(
                f"entry {self.ledger_id}:{entry_id} is not among the {self.count} entries {record} records for its "
                f"block ({self.first_entry_id}..{self.last_entry_id})",
                offset=at - ENTRY_HEADER_LENGTH + 4,  # the entry header's id field
                where=where,
            )
        actual = _crc32c.crc32c(payload)
        if actual != want:
            raise ChecksumError(
                f"entry {self.ledger_id}:{entry_id} checksum mismatch: CRC-32C 0x{want:08x} recorded at offload "
                f"({record}), computed 0x{actual:08x} over {len(payload)} bytes (corrupt entry)",
                offset=at,
                where=where,
            )

    def encode(self) -> bytes:
        flags = EXPLICIT_IDS if self.entry_ids is not None else 0
        n = len(self.crcs)
        body = _HEAD.pack(self.offset, self.ledger_id, self.first_entry_id, n, flags)
        body += struct.pack(f">{n}I", *self.crcs)
        if self.entry_ids is not None:
            body += struct.pack(f">{n}Q", *self.entry_ids)
        return frame(MAGIC, body)

    @classmethod
    def decode(cls, data: bytes | memoryview, *, where: str | None = None) -> BlockChecksums:
        """The record, checked strictly (magic, CRC of the body, lengths, ids); ``FormatError`` naming
        ``where`` and the byte offset otherwise."""
        view = memoryview(data)
        unframe(view, MAGIC, what="block checksum record", where=where, min_length=HEADER_LENGTH)
        offset, ledger, first, n, flags = _HEAD.unpack_from(view, FRAME_LENGTH)
        if flags & ~_KNOWN_FLAGS:
            raise FormatError(f"block checksum record has unknown flags 0x{flags:x}", offset=32, where=where)
        per_entry = 12 if flags & EXPLICIT_IDS else 4
        if n == 0 or len(view) != HEADER_LENGTH + per_entry * n:
            raise FormatError(
                f"block checksum record of {len(view)} bytes does not hold the {n} entries it declares",
                offset=28,
                where=where,
            )
        for name, value, at in (("offset", offset, 8), ("ledger id", ledger, 16), ("first entry id", first, 24)):
            if value > MAX_ID:
                raise FormatError(
                    f"block checksum record: {name} {value} is negative as a Java long", offset=at, where=where
                )
        crcs = _u32_array(view[HEADER_LENGTH : HEADER_LENGTH + 4 * n])
        ids: Sequence[int] | None = None
        if flags & EXPLICIT_IDS:
            ids = struct.unpack_from(f">{n}Q", view, HEADER_LENGTH + 4 * n)
            if ids[0] != first or any(b <= a for a, b in itertools.pairwise(ids)) or ids[-1] > MAX_ID:
                raise FormatError(
                    "block checksum record: entry ids do not start at the first entry id and strictly increase",
                    offset=HEADER_LENGTH + 4 * n,
                    where=where,
                )
        return cls(offset, ledger, ids, crcs, first)


def _u32_array(raw: memoryview) -> array[int]:
    out = array("I")  # 4 bytes wherever CPython runs
    out.frombytes(raw)
    if sys.byteorder == "little":
        out.byteswap()
    return out


def index_checksum(index: bytes | memoryview) -> int:
    """The CRC-32C a segment's manifest records of its index object."""
    return _crc32c.crc32c(index)


# What a segment manifest records of them (driver metadata properties; the manifest lives in
# ``checkpoints.manifest``, but readers in ``storage`` need the names too).
PROP_BLOCK_CHECKSUMS = "blockChecksums"
"""Present (value ``"1"``, this record's version) when every block of the segment has a checksum record."""
PROP_INDEX_CRC = "indexCrc32c"
"""The CRC-32C of the index object, 8 lowercase hex digits."""


@dataclass(frozen=True)
class RecordedChecksums:
    """What a sealed manifest says was recorded: block checksum records, and the index's CRC-32C."""

    blocks: bool
    index_crc: int | None

    @property
    def any(self) -> bool:
        return self.blocks or self.index_crc is not None


def recorded_checksums(properties: Sequence[tuple[str, str]]) -> RecordedChecksums:
    """From a manifest's driver properties (key, value); ``FormatError`` for a value this reader cannot use
    (a newer record version, a malformed CRC), so that no check is silently skipped."""
    props = dict(properties)
    version = props.get(PROP_BLOCK_CHECKSUMS)
    if version is not None and version != "1":
        raise FormatError(f"manifest property {PROP_BLOCK_CHECKSUMS}={version!r}: this reader knows version 1")
    text = props.get(PROP_INDEX_CRC)
    crc: int | None = None
    if text is not None:
        if len(text) != 8 or any(c not in "0123456789abcdef" for c in text):
            raise FormatError(f"manifest property {PROP_INDEX_CRC}={text!r} is not 8 hex digits")
        crc = int(text, 16)
    return RecordedChecksums(version is not None, crc)
