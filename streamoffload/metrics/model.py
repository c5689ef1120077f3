"""The metrics' model: what the job knows of each topic-partition (counted segments, the store's view,
the source's backlog) and the totals, lag and backlog it exports from that."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from streamoffload.checkpoints.metadata_view import SegmentFold, TopicMeta
from streamoffload.codecs.positions import Position
from streamoffload.metrics.definitions import SEGMENT_SIZE_BUCKETS
from streamoffload.streaming.handoff.actions import StatsAction


@dataclass(frozen=True)
class Backlog:
    """What a topic-partition's source knows: its latest position and, when the source can tell,
    the entries and bytes between the job's read position and that latest position."""

    latest: Position | None = None
    entries: int | None = None
    bytes: int | None = None


BacklogProvider = Callable[[Sequence[str]], Mapping[str, Backlog]]
"""Given the topic-partitions the metrics know of, return what is known of their backlog. Called
from the metrics' own thread, never from a scrape, so it may talk to the broker."""


@dataclass(frozen=True)
class CacheCounters:
    hits: int
    misses: int


CacheCounterSource = Callable[[], CacheCounters]
"""Read-path cache counters of a reader running in this process (see :meth:`JobMetrics.add_read_cache`)."""


@dataclass
class SizeHistogram:
    buckets: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * len(self.buckets)

    def observe(self, value: float) -> None:
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[i] += 1
                break
        self.total += value
        self.count += 1

    def cumulative(self) -> list[tuple[str, float]]:
        out: list[tuple[str, float]] = []
        running = 0
        for bound, n in zip(self.buckets, self.counts, strict=True):
            running += n
            out.append((_float_text(bound), running))
        out.append(("+Inf", self.count))
        return out


def _float_text(value: float) -> str:
    return repr(float(value)) if value != int(value) else f"{int(value)}.0"


@dataclass
class Totals:
    segments: int
    entries: int
    bytes: int
    seals: dict[str, int]
    sizes: SizeHistogram


def store_totals(snap: TopicMeta) -> Totals:
    """The totals of a topic-partition from its metadata: deleted segments (summary and records) plus the
    live Offloaded segments (folded and held)."""
    deleted = snap.deleted_totals()
    deleted.merge(snap.fold.totals)
    sizes = SizeHistogram(SEGMENT_SIZE_BUCKETS)
    for klass, n in deleted.size_log2.items():
        # A size in (2**(klass-1), 2**klass] falls in the first bucket bounded by at least 2**klass.
        index = next((i for i, bound in enumerate(sizes.buckets) if 2**klass <= bound), None)
        if index is not None:
            sizes.counts[index] += n
        sizes.count += n
    sizes.total += deleted.data_length
    totals = Totals(deleted.segments, deleted.entries, deleted.entry_bytes, dict(deleted.seals), sizes)
    for segment in snap.offloaded_states():  # the segments held; the folded ones are in ``deleted`` (above)
        totals.segments += 1
        totals.entries += segment.entries
        totals.bytes += segment.entry_bytes
        reason = segment.seal_reason or "unknown"
        totals.seals[reason] = totals.seals.get(reason, 0) + 1
        sizes.observe(segment.data_length)
    return totals


@dataclass
class OpenSegment:
    status: str
    assigned_ms: int


@dataclass
class TopicState:
    namespace: str = ""
    """``tenant/namespace`` of the topic-partition (the ``namespace`` label of its namespace's totals)."""
    # Counted once per segment UUID (monotonic while the process runs).
    counted_segments: int = 0
    counted: dict[str, Position | None] = field(default_factory=dict)
    """UUID -> end position of the segments counted and not yet folded by the store view (``take_fold``)."""
    entries_total: int = 0
    bytes_total: int = 0
    seals: dict[str, int] = field(default_factory=dict)
    sizes: SizeHistogram = field(default_factory=lambda: SizeHistogram(SEGMENT_SIZE_BUCKETS))
    # The store's current view (replaced by each refresh, updated by batch reports in between).
    offloaded: dict[str, int] = field(default_factory=dict)
    """Offloaded segments now in the store and not folded: UUID -> data object bytes."""
    folded_segments: int = 0
    folded_bytes: int = 0
    """Offloaded segments the store view folded into sums (``SegmentFold``): their number and data bytes."""
    open: dict[str, OpenSegment] = field(default_factory=dict)
    """Assigned or Failed segments: UUID -> status and assigned time."""
    last_end: Position | None = None
    last_publish_ms: int = 0
    # From the segmenter (last batch that carried this topic-partition) and the backlog provider.
    stats: StatsAction | None = None
    backlog: Backlog | None = None

    store_totals: Totals | None = None
    """The totals as the store tells them (live manifests, deleted-segment records and their summary)."""

    def exported(self) -> Totals:
        """The totals to export: this process's own count, or the store's when it knows more segments
        (after a restart: segments deleted before it are counted only there)."""
        own = Totals(self.counted_segments, self.entries_total, self.bytes_total, self.seals, self.sizes)
        if self.store_totals is not None and self.store_totals.segments > own.segments:
            return self.store_totals
        return own

    def count_offloaded(
        self,
        uuid: str,
        *,
        entries: int,
        entry_bytes: int,
        data_bytes: int,
        reason: str,
        end: Position | None = None,
        publish_last_ms: int = 0,
    ) -> None:
        self.open.pop(uuid, None)
        self.offloaded[uuid] = data_bytes
        if end is not None and (self.last_end is None or end > self.last_end):
            self.last_end = end
        self.last_publish_ms = max(self.last_publish_ms, publish_last_ms)
        if uuid in self.counted:
            return
        self.counted[uuid] = end
        self.counted_segments += 1
        self.entries_total += entries
        self.bytes_total += entry_bytes
        reason = reason or "unknown"
        self.seals[reason] = self.seals.get(reason, 0) + 1
        self.sizes.observe(data_bytes)

    def take_fold(self, fold: SegmentFold) -> None:
        """The store view's fold as of its last listing: its sums join the per-topic figures, and the segments
        it holds are no longer remembered one by one (the view never shows them again)."""
        totals = fold.totals
        self.folded_segments = totals.segments
        self.folded_bytes = totals.data_length
        if fold.last_end is not None:
            through = fold.last_end
            self.counted = {u: end for u, end in self.counted.items() if end is None or end > through}

    def latest_known(self) -> Position | None:
        """The newest position known to exist: the source's latest or the job's last read, whichever is later."""
        candidates: list[Position] = []
        if self.backlog is not None and self.backlog.latest is not None:
            candidates.append(tuple(self.backlog.latest))  # type: ignore[arg-type]
        last_read = self.stats.last_position if self.stats is not None else None
        if last_read and int(last_read[0]) >= 0:
            candidates.append((int(last_read[0]), int(last_read[1])))
        return max(candidates) if candidates else None

    def caught_up(self) -> bool:
        return self._caught_up(self.latest_known())

    def _caught_up(self, latest: Position | None) -> bool:
        return latest is not None and self.last_end is not None and latest <= self.last_end

    def lag_seconds(self, now_ms: int) -> float | None:
        return self.lag_and_behind(now_ms)[0]

    def backlog_entries(self) -> int | None:
        """Entries published but not yet in an Offloaded segment, when that is known exactly."""
        return self.lag_and_behind(0)[1]

    def lag_and_behind(self, now_ms: int) -> tuple[float | None, int | None]:
        """:meth:`lag_seconds` and :meth:`backlog_entries` at once (a scrape asks both of every topic-partition;
        the latest position is worked out once)."""
        latest = self.latest_known()
        if self._caught_up(latest):
            return 0.0, 0
        lag = max(0.0, (now_ms - self.last_publish_ms) / 1000) if self.last_publish_ms else None
        if self.backlog is not None and self.backlog.entries is not None:
            # The source counts from its read position; entries read but not yet sealed sit in the open segment.
            return lag, self.backlog.entries + (self.stats.open_segment_entries if self.stats is not None else 0)
        if latest is not None and self.last_end is not None and latest[0] == self.last_end[0]:
            return lag, latest[1] - self.last_end[1]
        return lag, None  # entries of the ledgers in between are not known without asking the broker per ledger
