"""Runs of entries: the entries of a block that lie wholly in one buffer, found by one tight loop.

A segment's reader (``handle.SegmentReadHandle._walk``) checks every entry it passes: its header, its id against
the previous one, its CRC. Entry by entry in Python that is most of what reading a small-entry segment costs, so
the walk first takes the longest run of entries that are plainly well formed (each wholly inside the buffer and
the block, ids strictly increasing up to ``MAX_ID``) with :func:`entry_run`, checks the run's CRCs together, and
goes entry by entry only where a run stops: an entry across the buffer's end, the block's padding, or anything
wrong, which the entry-by-entry walk then names exactly as before. Pure: no I/O."""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

import crc32c as _crc32c
import numpy as np

from streamoffload.codecs.blocks import ENTRY_HEADER_LENGTH
from streamoffload.codecs.checksums import BlockChecksums
from streamoffload.codecs.positions import MAX_ID

_LENGTH = struct.Struct(">I")  # an entry header's first field: its payload's length


@dataclass(frozen=True)
class EntryRun:
    """Consecutive entries of one buffer: their ids, where their 12-byte headers start (in the buffer) and their
    payload lengths, in order; ``end``: where the entry after the run starts (in the buffer)."""

    ids: list[int]
    heads: list[int]
    lengths: list[int]
    end: int

    def payload(self, buf: memoryview, k: int) -> memoryview:
        at = self.heads[k] + ENTRY_HEADER_LENGTH
        return buf[at : at + self.lengths[k]]


def entry_run(buf: memoryview, at: int, stop: int, previous: int, hi: int = MAX_ID) -> EntryRun:
    """The entries of ``buf`` from ``at`` on whose header and payload end by ``stop`` (the block's end or the
    buffer's, whichever is first), each id above the one before (``previous`` first) and at most ``MAX_ID``; it
    stops before the first entry that is not so (padding, whose length word is above any block, among them), and
    after the first whose id is above ``hi`` (where a read ends). The loop follows the lengths alone; the ids are
    read and checked together after it."""
    heads: list[int] = []
    append = heads.append
    length_at = _LENGTH.unpack_from
    last = stop - ENTRY_HEADER_LENGTH
    while at <= last:
        after = at + ENTRY_HEADER_LENGTH + length_at(buf, at)[0]
        if after > stop:
            break
        append(at)
        at = after
    if not heads:
        return EntryRun([], [], [], at)
    where = np.array(heads, dtype=np.int64)
    words = np.ndarray(shape=(len(buf) - 7,), dtype=">u8", buffer=buf, strides=(1,))  # the u64 at every byte
    raw = words[where + 4]
    ids = raw.astype(np.int64)  # (an id above MAX_ID wraps here: it is refused by ``raw`` below)
    before = np.empty_like(ids)
    before[0] = previous
    before[1:] = ids[:-1]
    bad = np.flatnonzero((raw > np.uint64(MAX_ID)) | (ids <= before))
    cut = int(bad[0]) if len(bad) else len(heads)
    past = np.flatnonzero(ids[:cut] > hi)
    if len(past):
        cut = int(past[0]) + 1
    end = heads[cut] if cut < len(heads) else at
    lengths = (words[where[:cut]] >> np.uint64(32)).astype(np.int64)
    return EntryRun(ids[:cut].tolist(), heads[:cut], lengths.tolist(), end)


def run_crcs_match(run: EntryRun, buf: memoryview, sums: BlockChecksums, lo: int, hi: int) -> bool:
    """Whether the entries ``lo`` to ``hi`` (exclusive) of ``run`` have the CRC-32C their block's checksum record
    gives them."""
    ids = run.ids[lo:hi]
    if not ids:
        return True
    if sums.entry_ids is None:  # the record's ids are consecutive: a slice of its CRCs
        first = ids[0] - sums.first_entry_id
        if first < 0 or first + len(ids) > len(sums.crcs) or ids[-1] - ids[0] != len(ids) - 1:
            return False
        wanted: Sequence[int | None] = sums.crcs[first : first + len(ids)]
    else:
        wanted = [sums.crc_of(entry_id) for entry_id in ids]
    crc, h = _crc32c.crc32c, ENTRY_HEADER_LENGTH
    got = [crc(buf[at + h : at + h + n]) for at, n in zip(run.heads[lo:hi], run.lengths[lo:hi], strict=True)]
    return got == list(wanted)


class JoinedEntries:
    """Entries read as columns, for a reader that decodes many at once (``read.entry_arrays``): their ledger and
    entry ids, and their payloads as a few pieces of the buffers they were read from (each a run of entries with
    their 12-byte headers between them, or a single payload) with where each payload starts in the pieces joined
    and how long it is. No object per entry; what lies between payloads (the headers) is never read as one."""

    def __init__(self) -> None:
        self.entry_ids: list[int] = []
        self.starts: list[int] = []
        self.lengths: list[int] = []
        self.ledgers: list[tuple[int, int]] = []  # (ledger id, entries): consecutive entries of one ledger
        self.pieces: list[memoryview] = []
        self.size = 0

    def __len__(self) -> int:
        return len(self.entry_ids)

    def add_run(self, ledger_id: int, buf: memoryview, run: EntryRun, lo: int, hi: int) -> None:
        """The entries ``lo`` to ``hi`` (exclusive) of ``run``, read from ``buf``."""
        heads = run.heads
        first = heads[lo]
        after = heads[hi - 1] + ENTRY_HEADER_LENGTH + run.lengths[hi - 1]
        shift = self.size - first + ENTRY_HEADER_LENGTH
        self.starts += [head + shift for head in heads[lo:hi]]
        self.lengths += run.lengths[lo:hi]
        self.entry_ids += run.ids[lo:hi]
        self._ledger(ledger_id, hi - lo)
        self.pieces.append(buf[first:after])
        self.size += after - first

    def add(self, ledger_id: int, entry_id: int, payload: memoryview) -> None:
        self.starts.append(self.size)
        self.lengths.append(len(payload))
        self.entry_ids.append(entry_id)
        self._ledger(ledger_id, 1)
        self.pieces.append(payload)
        self.size += len(payload)

    def _ledger(self, ledger_id: int, n: int) -> None:
        if self.ledgers and self.ledgers[-1][0] == ledger_id:
            self.ledgers[-1] = (ledger_id, self.ledgers[-1][1] + n)
        else:
            self.ledgers.append((ledger_id, n))

    def mark(self) -> tuple[int, int, int, list[tuple[int, int]]]:
        """Where the entries are now: :meth:`truncate` drops what was added since."""
        return len(self.entry_ids), len(self.pieces), self.size, list(self.ledgers)

    def truncate(self, mark: tuple[int, int, int, list[tuple[int, int]]]) -> None:
        entries, pieces, self.size, self.ledgers = mark
        del self.entry_ids[entries:], self.starts[entries:], self.lengths[entries:], self.pieces[pieces:]

    def ledger_ids(self) -> list[int]:
        """Each entry's ledger id."""
        out: list[int] = []
        for ledger_id, n in self.ledgers:
            out += [ledger_id] * n
        return out

    def joined(self, pad: bytes = b"") -> bytes:
        """The pieces joined, then ``pad``."""
        return b"".join([*self.pieces, pad])
