"""Read-through: what the broker no longer holds read from the offload store (the live ``pulsar`` source's
``offloaded.store``, ``read --follow``).

Our offloader runs outside the broker, so the broker knows nothing of the store: once its retention deletes
a ledger, a reader of the broker alone finds a hole. With the source option ``offloaded.store`` a range
``(start, end]`` of a topic-partition is read as one stream from two places (:func:`read_through_range`):

* **the store first**, wherever it holds the entry right after the position reached (gap-free: the next
  entry of the same ledger, or entry 0 of a later ledger); it is read through ``read.TopicReader`` (the
  read path's read-ahead, cache and checks) for as long as its run of stored entries lasts;
* **the broker** where the store has nothing right after the position reached: from there, up to the start
  of the store's next run (if any), or to the range's end.

Ledger entries are immutable, so both places hold the same bytes for a position and it does not matter to a
reader which one served it: every position is emitted once, in order. Reading history from the store spares
the broker (the point of a tier). A query that starts at ``earliest`` reads the broker first only when the
broker's history starts before the store's (the offloader started late): then the broker holds everything
from its first entry on, and the store adds nothing.

Data loss is reported only where neither side has the entries: a hole in the store that the broker does not
fill, or the broker's next entry not following the store's last (``exactly_once.gap``). The message names
the ledger range. A ledger skipped whole cannot be seen, by the broker's reader or here (ledger ids are not
consecutive per topic), but a hole inside a ledger the store holds the rest of is.

:class:`StoredHistory` is the store's side in positions only (per ledger, the entry ids held), built from
the Offloaded manifests (``checkpoints.metadata_store``); the planner uses it for the latest position, the
next position and exact entry counts; the tasks to split a range. Plain Python: no Spark here.
"""

from __future__ import annotations

import bisect
import logging
import math
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from streamoffload.checkpoints.metadata_store import MetadataStore
from streamoffload.codecs.entry import decode_entry, metadata_num_messages
from streamoffload.codecs.positions import Position
from streamoffload.pulsar.exactly_once import (
    BEFORE_EARLIEST,
    DataLossError,
    Probe,
    ReadEntry,
    ReadStats,
    gap,
)
from streamoffload.read.topic_reader import TopicReader
from streamoffload.storage.location import ScopedStore, StoreLocation

if TYPE_CHECKING:
    from streamoffload.codecs.proto.offload_manifest_pb2 import SegmentManifest

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class LedgerSpan:
    """Entry ids ``first..last`` (inclusive) of one ledger, held by the store without a hole; ``size`` the sum
    of their payload sizes."""

    ledger_id: int
    first: int
    last: int
    size: int

    @property
    def start(self) -> Position:
        return (self.ledger_id, self.first)

    @property
    def end(self) -> Position:
        return (self.ledger_id, self.last)

    @property
    def entries(self) -> int:
        return self.last - self.first + 1


def _spans_of(manifest: SegmentManifest) -> list[LedgerSpan]:
    """A segment's ledgers as spans: the first starts at the segment's start entry, later ones at entry 0, and
    each holds ``entries`` entries (a segment is written gap-free by the offloader)."""
    out: list[LedgerSpan] = []
    for info in manifest.ledgers:
        first = manifest.startEntryId if info.ledgerId == manifest.startLedgerId else 0
        if info.entries <= 0:
            continue
        out.append(LedgerSpan(info.ledgerId, first, first + info.entries - 1, info.size))
    if not out and manifest.entries > 0:  # no ledger list (should not happen): the segment's own bounds
        out.append(LedgerSpan(manifest.startLedgerId, manifest.startEntryId, manifest.endEntryId, manifest.entryBytes))
    return out


class StoredHistory:
    """The positions a store holds for one topic-partition, as ledger spans in position order (adjacent spans
    of one ledger merged), grouped into **runs**: spans that follow each other without a provable gap."""

    def __init__(self, spans: Sequence[LedgerSpan]) -> None:
        merged: list[LedgerSpan] = []
        for span in sorted(spans, key=lambda s: s.start):
            prev = merged[-1] if merged else None
            if prev is not None and prev.ledger_id == span.ledger_id and span.first <= prev.last + 1:
                if span.last > prev.last:
                    merged[-1] = LedgerSpan(prev.ledger_id, prev.first, span.last, prev.size + span.size)
                continue
            merged.append(span)
        self.spans: tuple[LedgerSpan, ...] = tuple(merged)
        self._starts = [s.start for s in self.spans]
        # run_ends[i]: the last position of the run span i belongs to
        run_ends: list[Position] = [BEFORE_EARLIEST] * len(self.spans)
        end = BEFORE_EARLIEST
        for i in range(len(self.spans) - 1, -1, -1):
            span = self.spans[i]
            nxt = self.spans[i + 1] if i + 1 < len(self.spans) else None
            if nxt is None or gap(span.end, nxt.start):
                end = span.end
            run_ends[i] = end
        self._run_ends = run_ends

    @classmethod
    def of(cls, manifests: Sequence[SegmentManifest]) -> StoredHistory:
        return cls([span for m in manifests for span in _spans_of(m)])

    def __bool__(self) -> bool:
        return bool(self.spans)

    def first(self) -> Position | None:
        return self.spans[0].start if self.spans else None

    def last(self) -> Position | None:
        return self.spans[-1].end if self.spans else None

    def _index_after(self, after: Position) -> int | None:
        """The index of the span holding the first stored position after ``after``."""
        i = bisect.bisect_right(self._starts, after) - 1
        if i >= 0 and self.spans[i].end > after:
            return i
        i += 1
        return i if i < len(self.spans) else None

    def next_after(self, after: Position) -> Position | None:
        """The first stored position after ``after``."""
        i = self._index_after(after)
        if i is None:
            return None
        span = self.spans[i]
        return (span.ledger_id, span.first if after < span.start else after[1] + 1)

    def run_end(self, position: Position) -> Position:
        """The last position of the gap-free run holding the stored ``position``."""
        i = bisect.bisect_right(self._starts, position) - 1
        assert i >= 0 and self.spans[i].start <= position <= self.spans[i].end, position
        return self._run_ends[i]

    def span_holding(self, position: Position) -> LedgerSpan | None:
        i = bisect.bisect_right(self._starts, position) - 1
        if i >= 0 and self.spans[i].end >= position:
            return self.spans[i]
        return None

    def stored_cuts(self, start: Position, end: Position, piece_bytes: int, most: int) -> list[Position]:
        """Where to cut ``(start, end]`` so that its stored part (the run the store serves from ``start``) is
        read by several tasks at once: up to ``most`` pieces of about ``piece_bytes`` stored bytes each. Each
        cut is a stored position (an entry that exists), so every piece keeps the exact-range contract."""
        nxt = self.next_after(start)
        if nxt is None or nxt > end or gap(start, nxt) or most <= 1:
            return []
        last = min(self.run_end(nxt), end)
        # The run's spans clipped to (start, last], as (span, first id, last id) with their estimated bytes.
        parts: list[tuple[LedgerSpan, int, int]] = []
        i = self._starts.index(self.span_holding(nxt).start)  # type: ignore[union-attr]
        while i < len(self.spans) and self.spans[i].start <= last:
            span = self.spans[i]
            lo = max(span.first, nxt[1]) if span.ledger_id == nxt[0] else span.first
            hi = min(span.last, last[1]) if span.ledger_id == last[0] else span.last
            if lo <= hi:
                parts.append((span, lo, hi))
            i += 1
        per_entry = [span.size / span.entries for span, _, _ in parts]
        total = sum(bytes_ * (hi - lo + 1) for bytes_, (_, lo, hi) in zip(per_entry, parts, strict=True))
        pieces = min(most, int(total // max(piece_bytes, 1)) + 1)
        if pieces <= 1:
            return []
        cuts: list[Position] = []
        step, acc = total / pieces, 0.0
        for bytes_, (span, lo, hi) in zip(per_entry, parts, strict=True):
            upto = acc + bytes_ * (hi - lo + 1)
            while len(cuts) < pieces - 1 and step * (len(cuts) + 1) <= upto:
                # the entry at which the running total reaches the next multiple of step
                entry_id = lo + max(0, math.ceil((step * (len(cuts) + 1) - acc) / bytes_) - 1)
                position = (span.ledger_id, min(entry_id, hi))
                if position >= last or (cuts and position <= cuts[-1]):
                    break
                cuts.append(position)
            acc = upto
        return cuts


def missing_range(after: Position, before: Position) -> str:
    """The entries strictly between two positions, in words (for data-loss messages)."""
    if after[0] == before[0]:
        return f"ledger {after[0]} entries {after[1] + 1}..{before[1] - 1}"
    if after <= BEFORE_EARLIEST:
        return f"ledger {before[0]} entries 0..{before[1] - 1}"
    return (
        f"the entries after {after[0]}:{after[1]} up to {before[0]}:{before[1]} "
        f"(ledger {before[0]} entries 0..{before[1] - 1} at least)"
    )


class TierView:
    """The store's histories of the topic-partitions a source reads, loaded from their manifests and kept for
    ``refresh_s`` (the offloader adds segments while the query runs; an out-of-date view only means the broker
    serves positions the store has since taken, which it still holds)."""

    def __init__(self, location: StoreLocation, refresh_s: float = 10.0) -> None:
        self.location = location
        self.refresh_s = refresh_s
        self._scoped: ScopedStore | None = None
        self._histories: dict[str, tuple[float, StoredHistory]] = {}
        self._lock = threading.Lock()

    @property
    def scoped(self) -> ScopedStore:
        if self._scoped is None:
            self._scoped = self.location.open()
        return self._scoped

    def history(self, tp: str, *, fresh: bool = False) -> StoredHistory:
        now = time.monotonic()
        with self._lock:
            cached = self._histories.get(tp)
            if cached is not None and not fresh and now - cached[0] < self.refresh_s:
                return cached[1]
        history = StoredHistory.of(MetadataStore(self.scoped).offloaded_segments(tp))
        with self._lock:
            self._histories[tp] = (now, history)
        return history

    def describe(self) -> str:
        return self.scoped.describe()


def stored_entries(reader: TopicReader, tp: str, after: Position, last: Position) -> Iterator[ReadEntry]:
    """The store's entries of ``tp`` in ``(after, last]`` as a reader's entries (publish time and message count
    from each entry's metadata; checked as the read path checks every entry)."""
    first = (after[0], after[1] + 1) if after > BEFORE_EARLIEST else None
    for entry in reader.read(tp, first, last):
        payload = bytes(entry.payload)
        where = f"{tp} {entry.ledger_id}:{entry.entry_id}"
        metadata = decode_entry(payload, verify_checksum=False, where=where).metadata
        yield ReadEntry(
            tp, entry.ledger_id, entry.entry_id, metadata.publish_time, metadata_num_messages(metadata), payload
        )


BrokerRead = Callable[[Position, Position, bool], Iterator[ReadEntry]]
"""Reads the broker's entries in ``(after, end]``; the flag says whether ``end`` is known to exist."""


class BrokerFront:
    """Where a topic-partition's history on the broker begins, and the broker's next entry after a position.

    A position in a ledger the broker no longer holds is answered with the broker's first entry, found once
    by a probe from the earliest position: real Pulsar starts a reader there by itself, but pulsar-lite
    delivers nothing after a position in a ledger it does not hold (seen here), and would leave a read
    waiting until its retry timeout."""

    def __init__(
        self, probe: Callable[[Position], Probe | None], latest: Callable[[], Position | None] | None = None
    ) -> None:
        self._probe = probe
        self._latest = latest
        self._first: Probe | None = None
        self._asked = False

    def first(self) -> Probe | None:
        if not self._asked:
            # An empty topic is known from one round trip; a probe would wait out its attempts (seconds).
            empty = self._latest is not None and self._latest() is None
            self._first = None if empty else self._probe(BEFORE_EARLIEST)
            self._asked = True
        return self._first

    def starts_after(self, position: Position) -> bool:
        """Whether the broker holds nothing at or before ``position`` (it may hold nothing at all)."""
        first = self.first()
        return first is None or first.position > position

    def next_after(self, after: Position) -> Probe | None:
        if self.starts_after(after):
            return self.first()
        return self._probe(after)


def read_through_range(
    tp: str,
    start: Position,
    end: Position,
    *,
    history: StoredHistory,
    read_stored: Callable[[Position, Position], Iterator[ReadEntry]],
    read_broker: BrokerRead,
    broker: BrokerFront,
    end_is_known: bool = True,
    fail_on_data_loss: bool = True,
    store_name: str = "the store",
    stats: ReadStats | None = None,
) -> Iterator[ReadEntry]:
    """The entries of ``tp`` in ``(start, end]``, in order, once each: from the store where it holds the next
    position, else from the broker (see the module docstring). ``read_stored(after, last)`` yields the store's
    entries in ``(after, last]``; ``read_broker(after, end, end_is_known)`` the broker's (with
    ``exactly_once``'s checks); ``broker`` probes where the broker's entries are (asked only where the store
    does not hold the next entry, or a read from the earliest position finds both holding something)."""
    stats = stats if stats is not None else ReadStats()

    def lost(after: Position, before: Position) -> None:
        what = f"{tp}: {missing_range(after, before)} are in neither the broker nor {store_name}"
        if fail_on_data_loss:
            raise DataLossError(what + " (set failOnDataLoss=false to skip lost entries)")
        log.warning("%s; skipping to %s:%s (failOnDataLoss=false)", what, before[0], before[1])
        stats.lost.append((after, before))

    def from_broker(after: Position, last: Position, known: bool) -> Iterator[ReadEntry]:
        if broker.starts_after(after):
            first = broker.first()
            if first is None:
                if known and after < last:
                    lost(after, (last[0], last[1] + 1))
                return
            if after > BEFORE_EARLIEST and gap(after, first.position) and first.position <= last:
                lost(after, first.position)
            after = BEFORE_EARLIEST  # the broker's first entry is next: read from its earliest
        try:
            yield from read_broker(after, last, known)
        except DataLossError as err:
            raise DataLossError(f"{err} (and not in {store_name})") from err

    cur = start
    if cur <= BEFORE_EARLIEST and history:
        first = history.first()
        front = broker.first()
        if front is not None and first is not None and front.position < first:
            # The offloader started after the broker's first entry: the broker holds all of it.
            yield from from_broker(cur, end, end_is_known)
            return
    while cur < end:
        nxt = history.next_after(cur)
        if nxt is not None and nxt <= end and not gap(cur, nxt):
            run_last = min(history.run_end(nxt), end)
            for entry in read_stored(cur, run_last):
                cur = entry.position
                stats.entries += 1
                stats.messages += entry.num_messages
                stats.bytes += len(entry.payload)
                yield entry
            if cur != run_last:
                raise DataLossError(
                    f"{tp}: {store_name} lists entries up to {run_last[0]}:{run_last[1]} but its objects end at "
                    f"{cur[0]}:{cur[1]}"
                )
            continue
        if nxt is None or nxt > end:
            yield from from_broker(cur, end, end_is_known)
            return
        # The store holds later entries but not the next one: the broker must fill the hole up to them (asked
        # first: a broker without them would otherwise be waited for until the read's retry timeout).
        before_next = (nxt[0], nxt[1] - 1)
        found = broker.next_after(cur)
        if found is not None and found.position <= before_next:
            for entry in from_broker(cur, before_next, False):
                cur = entry.position
                yield entry
            if not gap(cur, nxt):
                continue
        lost(cur, nxt)
        cur = before_next


__all__ = [
    "BrokerFront",
    "LedgerSpan",
    "StoredHistory",
    "TierView",
    "missing_range",
    "read_through_range",
    "stored_entries",
]
