"""Runs of entries: the entries of a block that lie wholly in one buffer, found by one tight loop.

A segment's reader (``handle.SegmentReadHandle._walk``) checks every entry it passes: its header, its id against
the previous one, its CRC. Entry by entry in Python that is most of what reading a small-entry segment costs, so
the walk first takes the longest run of entries that are plainly well formed (each wholly inside the buffer and
the block, ids strictly increasing up to ``MAX_ID``) with :func:`entry_run`, checks the run's CRCs together, and
goes entry by entry only where a run stops: an entry across the buffer's end, the block's padding, or anything
wrong, which the entry-by-entry walk then names exactly as before. Pure: no I/O."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from streamoffload.codecs.blocks import ENTRY_HEADER, ENTRY_HEADER_LENGTH
from streamoffload.codecs.checksums import BlockChecksums
from streamoffload.codecs.entry import crc32c
from streamoffload.codecs.positions import MAX_ID


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
    after the first whose id is above ``hi`` (where a read ends)."""
    ids: list[int] = []
    heads: list[int] = []
    lengths: list[int] = []
    unpack = ENTRY_HEADER.unpack_from
    last = stop - ENTRY_HEADER_LENGTH
    while at <= last:
        length, entry_id = unpack(buf, at)
        after = at + ENTRY_HEADER_LENGTH + length
        if after > stop or entry_id <= previous or entry_id > MAX_ID:
            break
        ids.append(entry_id)
        heads.append(at)
        lengths.append(length)
        previous = entry_id
        at = after
        if entry_id > hi:
            break
    return EntryRun(ids, heads, lengths, at)


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
    heads, lengths = run.heads, run.lengths
    for k, want in enumerate(wanted, lo):
        at = heads[k] + ENTRY_HEADER_LENGTH
        if crc32c(buf[at : at + lengths[k]]) != want:
            return False
    return True


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
