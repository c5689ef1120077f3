"""Prometheus metrics of the offload job, served by the driver over HTTP (loopback by default).

Design: the values are TRUE, also across restarts
-------------------------------------------------
What has been offloaded is a fact of the store, not of this process, so the offload totals are
derived from the store's metadata and kept per segment UUID:

* At start, :meth:`JobMetrics.refresh_store` reads every segment manifest (``checkpoints``), so
  ``streamoffload_entries_offloaded_total`` equals what the store holds right away, and a restarted
  job continues its counters where the store says they are instead of from zero.
* Every micro-batch's :class:`~streamoffload.streaming.job.BatchReport` adds the segments it sealed
  at once (no wait for the next refresh). A segment is counted once, by UUID, whichever of the two
  sees it first, so a replayed micro-batch or a refresh racing a batch never counts twice.
* The store is re-read every ``store_refresh_s`` (and the topic of every seal right after it, for
  the publish time the lag needs) through a ``checkpoints.metadata_store.MetadataView``: a refresh
  costs one listing of each topic-partition's ``_meta/`` plus reads of what changed since (Offloaded
  manifests never change and are cached by key); the whole store is listed only to discover
  topic-partitions, at the first refresh and every ``topic_rediscovery_s`` (the job's batches name
  new ones in between).
* Counters never go down while the process runs: a segment deleted by retention stays counted.
  After a restart they continue from what the store holds, deleted segments included: a deleted
  segment's record keeps its entry, byte and size figures, and compaction folds old records into
  a per-topic summary that keeps them too. Of the two views (what this process counted, segment by
  segment, and what the store says), the one that knows more segments is exported.

Lag: ``streamoffload_offload_lag_seconds`` is 0 when the newest offloaded position is at or past
the latest position of the topic-partition (nothing published waits), and otherwise now minus the
publish time of the newest offloaded entry: an upper bound of the age of the oldest entry not yet
offloaded (readable), exact when traffic is continuous. The latest position comes from Spark's
progress of every micro-batch (the Pulsar source reports its latest offset, ``reportLatestOffset``,
and the offset it consumed), from an optional :data:`BacklogProvider` (the source's
``backlogFile``, or :func:`pulsar_backlog` asking the broker), and from the last position the job
itself has read, whichever is newest; so after new traffic the lag can read 0 until the next
micro-batch looks at the source (one trigger interval).

Entries behind (``streamoffload_backlog_entries``) = entries between the source's consumed and latest
positions + entries read but still in the open segment; exported only when exact (both positions
in one ledger: the sizes of earlier ledgers are not known without Pulsar's admin API).

Process-lifetime distributions (upload latency, micro-batch duration) are ordinary prometheus-client
histograms: they describe this process's work and reset with it, as Prometheus expects.

Everything lives in a dedicated ``CollectorRegistry`` so tests and several jobs in one process
never collide with prometheus-client's global registry.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from streamoffload import __version__
from streamoffload.codecs.positions import Position
from streamoffload.errors import ConfigError

log = logging.getLogger(__name__)


PREFIX = "streamoffload"
STATUSES = ("Assigned", "Offloaded", "Failed")

# Segment sizes: from 1 MiB to 4 GiB (segments are bounded by maxSizePerOffloadSegmentMbytes, 1 GiB
# by default; small ones come from time rollovers of quiet topics).
SEGMENT_SIZE_BUCKETS: tuple[float, ...] = tuple(float(2**i) for i in range(20, 33, 1))
UPLOAD_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
BATCH_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


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


# ---------------------------------------------------------------------------------------------
# per topic-partition state


@dataclass
class _SizeHistogram:
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
        out, running = [], 0
        for bound, n in zip(self.buckets, self.counts, strict=True):
            running += n
            out.append((_float_text(bound), running))
        out.append(("+Inf", self.count))
        return out


def _float_text(value: float) -> str:
    return repr(float(value)) if value != int(value) else f"{int(value)}.0"


@dataclass
class _Totals:
    segments: int
    entries: int
    bytes: int
    seals: dict[str, int]
    sizes: _SizeHistogram


def _store_totals(snap: Any) -> _Totals:
    """The totals of a topic-partition from its metadata (``TopicMeta``): deleted segments (summary and
    records) plus the live Offloaded manifests."""
    deleted = snap.deleted_totals()
    sizes = _SizeHistogram(SEGMENT_SIZE_BUCKETS)
    for klass, n in deleted.size_log2.items():
        # A size in (2**(klass-1), 2**klass] falls in the first bucket bounded by at least 2**klass.
        index = next((i for i, bound in enumerate(sizes.buckets) if 2**klass <= bound), None)
        if index is not None:
            sizes.counts[index] += n
        sizes.count += n
    sizes.total += deleted.data_length
    totals = _Totals(deleted.segments, deleted.entries, deleted.entry_bytes, dict(deleted.seals), sizes)
    for manifest in snap.offloaded():
        totals.segments += 1
        totals.entries += manifest.entries
        totals.bytes += manifest.entryBytes
        reason = manifest.sealReason or "unknown"
        totals.seals[reason] = totals.seals.get(reason, 0) + 1
        sizes.observe(manifest.dataLength)
    return totals


@dataclass
class _Open:
    status: str
    assigned_ms: int


@dataclass
class _TopicState:
    # Counted once per segment UUID (monotonic while the process runs).
    counted: set[str] = field(default_factory=set)
    entries_total: int = 0
    bytes_total: int = 0
    seals: dict[str, int] = field(default_factory=dict)
    sizes: _SizeHistogram = field(default_factory=lambda: _SizeHistogram(SEGMENT_SIZE_BUCKETS))
    # The store's current view (replaced by each refresh, updated by batch reports in between).
    offloaded: dict[str, int] = field(default_factory=dict)
    """Offloaded segments now in the store: UUID -> data object bytes."""
    open: dict[str, _Open] = field(default_factory=dict)
    """Assigned or Failed segments: UUID -> status and assigned time."""
    last_end: Position | None = None
    last_publish_ms: int = 0
    # From the segmenter (last batch that carried this topic-partition) and the backlog provider.
    stats: dict[str, Any] | None = None
    backlog: Backlog | None = None

    store_totals: _Totals | None = None
    """The totals as the store tells them (live manifests, deleted-segment records and their summary)."""

    def exported(self) -> _Totals:
        """The totals to export: this process's own count, or the store's when it knows more segments
        (after a restart: segments deleted before it are counted only there)."""
        own = _Totals(len(self.counted), self.entries_total, self.bytes_total, self.seals, self.sizes)
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
        self.counted.add(uuid)
        self.entries_total += entries
        self.bytes_total += entry_bytes
        reason = reason or "unknown"
        self.seals[reason] = self.seals.get(reason, 0) + 1
        self.sizes.observe(data_bytes)

    def latest_known(self) -> Position | None:
        """The newest position known to exist: the source's latest or the job's last read, whichever is later."""
        candidates: list[Position] = []
        if self.backlog is not None and self.backlog.latest is not None:
            candidates.append(tuple(self.backlog.latest))  # type: ignore[arg-type]
        last_read = (self.stats or {}).get("last_position")
        if last_read and int(last_read[0]) >= 0:
            candidates.append((int(last_read[0]), int(last_read[1])))
        return max(candidates) if candidates else None

    def caught_up(self) -> bool:
        latest = self.latest_known()
        return latest is not None and self.last_end is not None and latest <= self.last_end

    def lag_seconds(self, now_ms: int) -> float | None:
        if self.caught_up():
            return 0.0
        if not self.last_publish_ms:
            return None
        return max(0.0, (now_ms - self.last_publish_ms) / 1000)

    def backlog_entries(self) -> int | None:
        """Entries published but not yet in an Offloaded segment, when that is known exactly."""
        if self.caught_up():
            return 0
        if self.backlog is not None and self.backlog.entries is not None:
            # The source counts from its read position; entries read but not yet sealed sit in the open segment.
            return self.backlog.entries + int((self.stats or {}).get("open_segment_entries") or 0)
        latest = self.latest_known()
        if latest is None:
            return None
        if self.last_end is not None and latest[0] == self.last_end[0]:
            return latest[1] - self.last_end[1]
        return None  # entries of the ledgers in between are not known without asking the broker per ledger


# ---------------------------------------------------------------------------------------------
# the metrics


class JobMetrics(Collector):
    """Metrics of one offload job. Feed it with :meth:`on_batch` (a job listener), Spark progress
    (:class:`QueryProgressListener`) and :meth:`refresh_store`; serve it with :meth:`start_server`.
    """

    def __init__(
        self,
        metadata: Any | None = None,
        *,
        backlog: BacklogProvider | None = None,
        store_refresh_s: float = 60.0,
        backlog_interval_s: float = 15.0,
        registry: CollectorRegistry | None = None,
        clock: Callable[[], float] = time.time,
        read_cache: bool = True,
        topic_rediscovery_s: float = 3600.0,
    ) -> None:
        self.metadata = metadata
        self._view: Any = None
        if metadata is not None:
            from streamoffload.checkpoints.metadata_store import MetadataView

            self._view = MetadataView(metadata, rediscover_s=topic_rediscovery_s)
        self.backlog_provider = backlog
        self.store_refresh_s = store_refresh_s
        self.backlog_interval_s = backlog_interval_s
        self.clock = clock
        self.registry = registry or CollectorRegistry(auto_describe=True)
        self._lock = threading.RLock()
        self._refresh_lock = threading.Lock()
        self._on_stop: list[Callable[[], None]] = []
        self._topics: dict[str, _TopicState] = {}
        self._read_caches: list[CacheCounterSource] = [shared_read_cache] if read_cache else []
        self._dirty: set[str] = set()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._server: Any = None
        self._server_thread: threading.Thread | None = None
        self.address: tuple[str, int] | None = None
        self.last_refresh_error: str | None = None
        self._last_refresh_time = 0.0
        self._last_batch_time = 0.0
        self._failing: dict[str, tuple[int, int]] = {}
        """Topic-partitions failing in a row (streaming.quarantine): failures and until when set aside."""

        reg = self.registry
        self.upload_duration = Histogram(
            f"{PREFIX}_upload_duration_seconds",
            "Time to upload one part, or to seal a segment (complete the data object, put index and manifest).",
            registry=reg,
            buckets=UPLOAD_BUCKETS,
        )
        self.upload_errors = Counter(
            f"{PREFIX}_upload_errors_total",
            "Sink actions (part uploads, seals) that failed; the query then restarts and retries them.",
            registry=reg,
        )
        self.parts_uploaded = Counter(
            f"{PREFIX}_parts_uploaded_total", "Multipart parts uploaded by the sink.", registry=reg
        )
        self.part_bytes_uploaded = Counter(
            f"{PREFIX}_part_bytes_uploaded_total", "Bytes of the multipart parts uploaded by the sink.", registry=reg
        )
        self.segments_opened = Counter(
            f"{PREFIX}_segments_opened_total", "Offload segments opened (Assigned manifests written).", registry=reg
        )
        self.sink_duration = Histogram(
            f"{PREFIX}_sink_duration_seconds",
            "Wall time of the sink (foreachBatch) for one micro-batch.",
            registry=reg,
            buckets=BATCH_BUCKETS,
        )
        self.batch_duration = Histogram(
            f"{PREFIX}_batch_duration_seconds",
            "Spark micro-batch duration (triggerExecution), from the StreamingQueryListener.",
            registry=reg,
            buckets=BATCH_BUCKETS,
        )
        self.batches = Counter(f"{PREFIX}_batches_total", "Spark micro-batches completed.", registry=reg)
        self.input_rows = Counter(
            f"{PREFIX}_input_rows_total", "Rows (entries and control requests) read by the Spark query.", registry=reg
        )
        self.input_rate = Gauge(
            f"{PREFIX}_input_rows_per_second",
            "Input rate of the last micro-batch (Spark's inputRowsPerSecond).",
            registry=reg,
        )
        self.processed_rate = Gauge(
            f"{PREFIX}_processed_rows_per_second",
            "Processing rate of the last micro-batch (Spark's processedRowsPerSecond).",
            registry=reg,
        )
        self.query_failures = Counter(
            f"{PREFIX}_query_failures_total",
            "Offload queries that terminated with an error (the job restarts them from the checkpoint).",
            registry=reg,
        )
        self.info = Gauge(f"{PREFIX}_build_info", "streamoffload version.", ["version"], registry=reg)
        self.info.labels(version=__version__).set(1)
        reg.register(self)

    # -- inputs ---------------------------------------------------------------------------------

    def _topic(self, topic: str) -> _TopicState:
        state = self._topics.get(topic)
        if state is None:
            state = self._topics[topic] = _TopicState()
        return state

    def on_batch(self, report: Any) -> None:
        """A job listener: account a :class:`~streamoffload.streaming.job.BatchReport`."""
        now = self.clock()
        for seconds in report.upload_seconds:
            self.upload_duration.observe(seconds)
        if report.errors:
            self.upload_errors.inc(report.errors)
        if report.parts:
            self.parts_uploaded.inc(report.parts)
        if report.part_bytes:
            self.part_bytes_uploaded.inc(report.part_bytes)
        if report.opened:
            self.segments_opened.inc(report.opened)
        self.sink_duration.observe(report.duration_s)
        with self._lock:
            self._last_batch_time = now
            for topic, stats in report.topics.items():
                state = self._topic(topic)
                state.stats = dict(stats)
                segment, assigned = stats.get("open_segment"), stats.get("open_segment_assigned_ms")
                if segment and segment not in state.offloaded:
                    previous = state.open.get(segment)
                    state.open[segment] = _Open(previous.status if previous else "Assigned", int(assigned or 0))
            for seal in report.sealed:
                state = self._topic(seal["topic"])
                end = seal.get("end")
                state.count_offloaded(
                    seal["segment"],
                    entries=int(seal.get("entries", 0)),
                    entry_bytes=int(seal.get("entry_bytes", 0)),
                    data_bytes=int(seal.get("data_length", 0)),
                    reason=str(seal.get("reason", "")),
                    end=(int(end[0]), int(end[1])) if end else None,
                    publish_last_ms=int(seal.get("publish_time_last", 0) or 0),
                )
                if not end or not seal.get("publish_time_last"):
                    self._dirty.add(seal["topic"])  # the manifest has the end position and publish time
        if report.sealed:
            self._wake.set()

    def on_progress(self, progress: Any) -> None:
        """Account one Spark ``StreamingQueryProgress`` (or its JSON as a dict)."""
        get = progress.get if isinstance(progress, Mapping) else (lambda k, d=None: getattr(progress, k, d))
        durations = get("durationMs") or {}
        total_ms = durations.get("triggerExecution")
        if total_ms is not None:
            self.batch_duration.observe(float(total_ms) / 1000)
        self.batches.inc()
        rows = get("numInputRows")
        if rows:
            self.input_rows.inc(int(rows))
        rate = get("inputRowsPerSecond")
        if rate is not None and rate == rate:  # NaN when a batch had no duration to divide by
            self.input_rate.set(float(rate))
        processed = get("processedRowsPerSecond")
        if processed is not None and processed == processed:
            self.processed_rate.set(float(processed))
        found: dict[str, Backlog] = {}
        for source in get("sources") or []:
            found.update(backlog_from_source_progress(source))
        if found:
            with self._lock:
                for topic, backlog in found.items():
                    state = self._topic(topic)
                    previous = state.backlog
                    if previous is not None and previous.bytes is not None and backlog.entries == previous.entries:
                        backlog = Backlog(backlog.latest, backlog.entries, previous.bytes)
                    state.backlog = backlog

    def on_query_failed(self) -> None:
        self.query_failures.inc()
        # The sink marked segments Failed: show it without waiting for the periodic refresh.
        with self._lock:
            self._dirty.update(self._topics)
        self._wake.set()

    def source_latest(self, topic: str) -> Position | None:
        """The latest position of ``topic`` as the source (Spark progress or a provider) last reported it."""
        with self._lock:
            state = self._topics.get(topic)
            return state.backlog.latest if state is not None and state.backlog is not None else None

    def add_read_cache(self, source: CacheCounterSource) -> None:
        """Export the cache counters of a reader running in this process (e.g. a ReadHandle's
        ``cache_stats``) as ``streamoffload_read_cache_{hits,misses}_total``; several sources add up."""
        with self._lock:
            self._read_caches.append(source)

    # -- the store -------------------------------------------------------------------------------

    def refresh_store(self, topics: Iterable[str] | None = None) -> None:
        """Re-read the metadata of ``topics``, or of every topic-partition known (the store's, found at
        the first refresh and every ``topic_rediscovery_s``, and those the job's batches named): one
        listing per topic-partition, reads of changed objects only."""
        if self._view is None:
            return
        from streamoffload.checkpoints import manifest as mf

        view = self._view
        if topics is None:
            with self._lock:
                known = list(self._topics)
            names = view.topics(known)
        else:
            names = sorted({str(t) for t in topics})
        for topic in names:
            snap = view.refresh(topic)
            totals = _store_totals(snap)
            with self._lock:
                state = self._topic(topic)
                offloaded: dict[str, int] = {}
                opened: dict[str, _Open] = {}
                for m in snap.manifests.values():
                    uuid = str(mf.manifest_uuid(m))
                    if m.status == mf.OFFLOADED:
                        offloaded[uuid] = m.dataLength
                        state.count_offloaded(
                            uuid,
                            entries=m.entries,
                            entry_bytes=m.entryBytes,
                            data_bytes=m.dataLength,
                            reason=m.sealReason,
                            end=(m.endLedgerId, m.endEntryId),
                            publish_last_ms=m.publishTimeLast,
                        )
                    else:
                        opened[uuid] = _Open(snap.status_name(m), m.assignedTimestamp)
                state.offloaded = offloaded
                state.open = opened
                if state.store_totals is None or totals.segments >= state.store_totals.segments:
                    state.store_totals = totals
        if topics is None:  # one LIST (records exist only while a topic is failing)
            from streamoffload.streaming.quarantine import read_records

            failing = read_records(view.meta.store, view.meta.prefix)
            with self._lock:
                self._failing = {r.topic: (r.failures, r.until_ms) for r in failing}
        with self._lock:
            self._last_refresh_time = self.clock()

    def refresh_backlog(self) -> None:
        if self.backlog_provider is None:
            return
        with self._lock:
            known = sorted(self._topics)
        found = self.backlog_provider(known)
        with self._lock:
            for topic, backlog in found.items():
                self._topic(topic).backlog = backlog

    # -- exposition ------------------------------------------------------------------------------

    def describe(self) -> list[Metric]:
        return []  # the families depend on the topics seen; nothing to check ahead of collection

    def collect(self) -> Iterator[Metric]:
        now_ms = int(self.clock() * 1000)
        p = PREFIX
        entries = CounterMetricFamily(
            f"{p}_entries_offloaded", "Entries in Offloaded (readable) segments.", labels=["topic"]
        )
        nbytes = CounterMetricFamily(
            f"{p}_bytes_offloaded", "Bytes of the Pulsar entries in Offloaded segments.", labels=["topic"]
        )
        sealed = CounterMetricFamily(
            f"{p}_segments_sealed", "Segments sealed and offloaded, by seal reason.", labels=["topic", "reason"]
        )
        sizes = HistogramMetricFamily(
            f"{p}_segment_size_bytes", "Data object size of offloaded segments.", labels=["topic"]
        )
        segments = GaugeMetricFamily(
            f"{p}_segments",
            "Segments in the store by status (Assigned, Offloaded, Failed).",
            labels=["topic", "status"],
        )
        stored = GaugeMetricFamily(
            f"{p}_stored_bytes", "Data object bytes of the Offloaded segments now in the store.", labels=["topic"]
        )
        lag = GaugeMetricFamily(
            f"{p}_offload_lag_seconds",
            "0 when caught up with the latest position, else now minus the publish time of the newest offloaded entry.",
            labels=["topic"],
        )
        last_publish = GaugeMetricFamily(
            f"{p}_last_offloaded_publish_timestamp_seconds",
            "Publish time of the newest offloaded entry.",
            labels=["topic"],
        )
        backlog = GaugeMetricFamily(
            f"{p}_backlog_entries",
            "Entries published but not yet in an Offloaded segment (where known exactly).",
            labels=["topic"],
        )
        backlog_bytes = GaugeMetricFamily(
            f"{p}_source_backlog_bytes",
            "Bytes between the source's read position and the latest position (from the source).",
            labels=["topic"],
        )
        open_age = GaugeMetricFamily(
            f"{p}_open_segment_age_seconds",
            "Age of the oldest open (Assigned or Failed) segment; 0 when none is open.",
            labels=["topic"],
        )
        open_entries = GaugeMetricFamily(
            f"{p}_open_segment_entries", "Entries assigned to the open segment.", labels=["topic"]
        )
        open_bytes = GaugeMetricFamily(
            f"{p}_open_segment_bytes", "Bytes (blocks) assigned to the open segment.", labels=["topic"]
        )
        buffer = GaugeMetricFamily(
            f"{p}_offload_buffer_bytes",
            "Bytes accepted but not yet uploaded (the PIP-76 offload buffer).",
            labels=["topic"],
        )
        with self._lock:
            for topic, st in sorted(self._topics.items()):
                totals = st.exported()
                entries.add_metric([topic], totals.entries)
                nbytes.add_metric([topic], totals.bytes)
                for reason, n in sorted(totals.seals.items()):
                    sealed.add_metric([topic, reason], n)
                sizes.add_metric([topic], totals.sizes.cumulative(), totals.sizes.total)
                counts = {status: 0 for status in STATUSES}
                counts["Offloaded"] = len(st.offloaded)
                for seg in st.open.values():
                    counts[seg.status] = counts.get(seg.status, 0) + 1
                for status, n in counts.items():
                    segments.add_metric([topic, status], n)
                stored.add_metric([topic], sum(st.offloaded.values()))
                value = st.lag_seconds(now_ms)
                if value is not None:
                    lag.add_metric([topic], value)
                if st.last_publish_ms:
                    last_publish.add_metric([topic], st.last_publish_ms / 1000)
                behind = st.backlog_entries()
                if behind is not None:
                    backlog.add_metric([topic], behind)
                if st.backlog is not None and st.backlog.bytes is not None:
                    backlog_bytes.add_metric([topic], st.backlog.bytes)
                assigned = [seg.assigned_ms for seg in st.open.values() if seg.assigned_ms]
                open_age.add_metric([topic], max(0.0, (now_ms - min(assigned)) / 1000) if assigned else 0.0)
                if st.stats is not None:
                    open_entries.add_metric([topic], int(st.stats.get("open_segment_entries") or 0))
                    open_bytes.add_metric([topic], int(st.stats.get("open_segment_bytes") or 0))
                    buffer.add_metric([topic], int(st.stats.get("buffered_bytes") or 0))
            hits = misses = 0
            for source in self._read_caches:
                try:
                    counters = source()
                except Exception:
                    log.debug("read cache counters unavailable", exc_info=True)
                    continue
                hits += counters.hits
                misses += counters.misses
            refreshed, batch_time = self._last_refresh_time, self._last_batch_time
            failing = dict(self._failing)
            refresh_error = self.last_refresh_error
        yield from (entries, nbytes, sealed, sizes, segments, stored, lag, last_publish, backlog, backlog_bytes)
        yield from (open_age, open_entries, open_bytes, buffer)
        cache_hits = CounterMetricFamily(
            f"{p}_read_cache_hits", "Read-path cache hits of readers in this process (0 when none runs here)."
        )
        cache_hits.add_metric([], hits)
        cache_misses = CounterMetricFamily(
            f"{p}_read_cache_misses", "Read-path cache misses of readers in this process (0 when none runs here)."
        )
        cache_misses.add_metric([], misses)
        yield cache_hits
        yield cache_misses
        yield GaugeMetricFamily(
            f"{p}_metadata_refresh_timestamp_seconds", "When the store's metadata was last read.", value=refreshed
        )
        yield GaugeMetricFamily(
            f"{p}_metadata_refresh_ok",
            "1 if the last read of the store's metadata succeeded.",
            value=0.0 if refresh_error else 1.0,
        )
        yield GaugeMetricFamily(
            f"{p}_last_batch_timestamp_seconds", "When the sink last finished a micro-batch.", value=batch_time
        )
        in_a_row = GaugeMetricFamily(
            f"{p}_topic_failures_in_a_row",
            "Offload failures of a topic-partition since its last committed segment (absent when none).",
            labels=["topic"],
        )
        set_aside = GaugeMetricFamily(
            f"{p}_topic_set_aside",
            "1 while a topic-partition that kept failing is set aside so the other topics go on.",
            labels=["topic"],
        )
        for topic, (failures, until_ms) in sorted(failing.items()):
            in_a_row.add_metric([topic], failures)
            set_aside.add_metric([topic], 1.0 if until_ms > now_ms else 0.0)
        yield in_a_row
        yield set_aside

    # -- running ---------------------------------------------------------------------------------

    def start_refresher(self) -> None:
        """Read the store once now (so the first scrape is right), then keep refreshing in a thread."""
        self.safe_refresh_store()
        self.safe_refresh_backlog()
        self._thread = threading.Thread(target=self._refresh_loop, name="streamoffload-metrics", daemon=True)
        self._thread.start()

    def safe_refresh_store(self, topics: Iterable[str] | None = None) -> None:
        """``refresh_store`` that logs instead of raising (an unreachable store must not stop the job);
        ``streamoffload_metadata_refresh_ok`` shows the outcome."""
        try:
            with self._refresh_lock:
                self.refresh_store(topics)
            self.last_refresh_error = None
        except Exception as err:
            self.last_refresh_error = f"{type(err).__name__}: {err}"
            log.warning("metrics: reading the store's metadata failed: %s", self.last_refresh_error)

    def safe_refresh_backlog(self) -> None:
        try:
            self.refresh_backlog()
        except Exception as err:
            log.warning("metrics: asking the source for latest positions failed: %s", err)

    def _refresh_loop(self) -> None:
        next_store = time.monotonic() + self.store_refresh_s
        next_backlog = time.monotonic() + self.backlog_interval_s
        while not self._stopping.is_set():
            timeout = max(0.0, min(next_store, next_backlog) - time.monotonic())
            self._wake.wait(timeout)
            self._wake.clear()
            if self._stopping.is_set():
                return
            with self._lock:
                dirty, self._dirty = self._dirty, set()
            now = time.monotonic()
            if now >= next_store:
                self.safe_refresh_store()
                next_store = now + self.store_refresh_s
            elif dirty:
                self.safe_refresh_store(dirty)
            if now >= next_backlog or dirty:
                self.safe_refresh_backlog()
                next_backlog = time.monotonic() + self.backlog_interval_s

    def start_server(self, address: str) -> tuple[str, int]:
        """Serve ``/metrics`` on ``host:port`` (port 0: a free port). Returns the bound address."""
        from prometheus_client import start_http_server

        host, port = parse_address(address)
        self._server, self._server_thread = start_http_server(port, addr=host, registry=self.registry)
        bound = self._server.server_address
        self.address = (host, int(bound[1]))
        log.info("Prometheus metrics on http://%s/metrics", format_address(*self.address))
        return self.address

    @property
    def url(self) -> str | None:
        return f"http://{format_address(*self.address)}/metrics" if self.address else None

    def on_stop(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` (first registered last) when the metrics stop: detaching listeners."""
        self._on_stop.append(callback)

    def stop(self) -> None:
        """Detach from the job and Spark, stop the refresher and the HTTP server. Idempotent."""
        while self._on_stop:
            callback = self._on_stop.pop()
            try:
                callback()
            except Exception:
                log.warning("metrics: detaching failed", exc_info=True)
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._server_thread is not None:
            self._server_thread.join(timeout=10)
            self._server_thread = None


def parse_address(address: str) -> tuple[str, int]:
    """``host:port``, ``[v6]:port`` or ``:port`` (loopback) into (host, port)."""
    text = address.strip()
    host, sep, port_text = text.rpartition(":")
    if not sep or not port_text.isdigit() or int(port_text) > 65535:
        raise ConfigError(f"metrics address {address!r}: expected host:port, e.g. 127.0.0.1:9464")
    host = host.strip("[]") or "127.0.0.1"
    return host, int(port_text)


def format_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


# ---------------------------------------------------------------------------------------------
# where latest positions come from


def _offsets(value: Any) -> dict[str, Position]:
    """A Pulsar source offset (JSON text or dict ``{topic-partition: [ledgerId, entryId]}``); {} otherwise."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return {}
    if not isinstance(value, Mapping):
        return {}
    out: dict[str, Position] = {}
    for topic, pos in value.items():
        if (
            isinstance(topic, str)
            and "://" in topic
            and isinstance(pos, list | tuple)
            and len(pos) == 2
            and all(isinstance(x, int) for x in pos)
        ):
            out[topic] = (int(pos[0]), int(pos[1]))
    return out


def entries_between(consumed: Position, latest: Position | None) -> int | None:
    """Entries after ``consumed`` up to ``latest`` when exact (same ledger, or nothing behind)."""
    if latest is None or latest <= consumed:
        return 0
    if latest[0] == consumed[0]:
        return latest[1] - consumed[1]
    return None


def backlog_from_source_progress(source: Any) -> dict[str, Backlog]:
    """Latest and consumed positions of one ``SourceProgress`` of the Pulsar source (its
    ``latestOffset`` is what the source's ``reportLatestOffset`` returned; ``endOffset`` what the
    micro-batch consumed). Other sources (the control stream) yield nothing."""
    get = source.get if isinstance(source, Mapping) else (lambda k, d=None: getattr(source, k, d))
    latest = _offsets(get("latestOffset"))
    consumed = _offsets(get("endOffset"))
    out: dict[str, Backlog] = {}
    for topic in set(latest) | set(consumed):
        end = consumed.get(topic, (-1, -1))
        top = latest.get(topic, end)
        out[topic] = Backlog(latest=max(top, end), entries=entries_between(end, top))
    return out


def backlog_file_provider(path: str) -> BacklogProvider:
    """A :data:`BacklogProvider` reading the Pulsar source's ``backlogFile`` (``streaming.source``
    rewrites it at every trigger and commit from Spark's source-runner process). Entry and byte
    counts are taken only where the source marks them exact."""

    def provide(_known: Sequence[str]) -> Mapping[str, Backlog]:
        from streamoffload.streaming.source import read_backlog_file

        try:
            doc = read_backlog_file(path)
        except FileNotFoundError:
            return {}  # the source writes it at its first trigger
        out: dict[str, Backlog] = {}
        for topic, part in (doc.get("partitions") or {}).items():
            latest = part.get("latest")
            exact = bool(part.get("exact"))
            out[topic] = Backlog(
                latest=(int(latest[0]), int(latest[1])) if latest else None,
                entries=int(part["entries"]) if exact and part.get("entries") is not None else None,
                bytes=int(part["bytes"]) if exact and part.get("bytes") is not None else None,
            )
        return out

    return provide


def shared_read_cache() -> CacheCounters:
    """Counters of the process-wide chunk cache of ``storage.read`` (readers share it unless
    given their own cache)."""
    from streamoffload.storage.read import shared_cache

    stats = shared_cache().stats()
    return CacheCounters(hits=stats.hits, misses=stats.misses)


# ---------------------------------------------------------------------------------------------
# the Spark side


def progress_listener(metrics: JobMetrics, query_name: str) -> Any:
    """A ``StreamingQueryListener`` feeding ``metrics`` with the progress of queries named ``query_name``."""
    from pyspark.sql.streaming import StreamingQueryListener

    class QueryProgressListener(StreamingQueryListener):
        def __init__(self) -> None:
            self.ids: set[str] = set()

        def onQueryStarted(self, event: Any) -> None:
            if event.name == query_name:
                self.ids.add(str(event.id))

        def onQueryProgress(self, event: Any) -> None:
            progress = event.progress
            if progress.name == query_name:
                metrics.on_progress(progress)

        def onQueryIdle(self, event: Any) -> None:
            pass

        def onQueryTerminated(self, event: Any) -> None:
            if str(event.id) in self.ids:
                self.ids.discard(str(event.id))
                if event.exception:
                    metrics.on_query_failed()

    return QueryProgressListener()


def pulsar_backlog(service_url: str, options: Mapping[str, str], configured: Sequence[str] = ()) -> BacklogProvider:
    """The default :data:`BacklogProvider`: each topic-partition's latest position, asked from Pulsar
    (``streaming.pulsar_io.latest_position``), for the partitions of the configured topics and the
    topic-partitions the metrics already know. Entries and bytes behind stay unknown (``None``): the
    Python client cannot count the entries of the ledgers in between."""

    def provide(known: Sequence[str]) -> Mapping[str, Backlog]:
        from streamoffload.streaming import pulsar_io

        client = pulsar_io.shared_client(service_url, pulsar_io.client_options(options))
        names = set(known)
        for topic in configured:
            with contextlib.suppress(Exception):
                names.update(pulsar_io.topic_partitions(client, topic))
        out: dict[str, Backlog] = {}
        for name in sorted(names):
            try:
                out[name] = Backlog(latest=pulsar_io.latest_position(client, name))
            except Exception as err:
                log.debug("metrics: latest position of %s unknown: %s", name, err)
        return out

    return provide


def install_metrics(
    job: Any,
    spark: Any,
    address: str,
    *,
    store_refresh_s: float = 60.0,
    backlog_interval_s: float = 15.0,
    backlog: BacklogProvider | None = None,
) -> JobMetrics:
    """Attach metrics to an :class:`~streamoffload.streaming.job.OffloadJob`: read the store's
    metadata, register the batch listener and a ``StreamingQueryListener`` on ``spark``, start the
    refresher and serve ``/metrics`` on ``address``. ``JobMetrics.stop()`` undoes all of it.

    Latest positions come from Spark's progress events. ``backlog`` adds a provider: by default the
    source's ``backlogFile`` when the job's source options name one (it adds bytes behind), or pass
    :func:`pulsar_backlog` to ask the broker directly (one short-lived subscription per partition
    and probe)."""
    from streamoffload.streaming.job import QUERY_NAME

    if backlog is None:
        backlog_path = _source_option(job, "backlogFile")
        backlog = backlog_file_provider(backlog_path) if backlog_path else None
    metrics = JobMetrics(
        job.metadata(), backlog=backlog, store_refresh_s=store_refresh_s, backlog_interval_s=backlog_interval_s
    )
    metrics.start_refresher()
    job.listeners.append(metrics.on_batch)
    metrics.on_stop(lambda: _remove(job.listeners, metrics.on_batch))
    if spark is not None:
        listener = progress_listener(metrics, QUERY_NAME)
        spark.streams.addListener(listener)
        metrics.on_stop(lambda: spark.streams.removeListener(listener))
    try:
        metrics.start_server(address)
    except Exception:
        metrics.stop()
        raise
    return metrics


def _source_option(job: Any, name: str) -> str | None:
    try:
        return job.source_options().get(name)
    except Exception:  # no topics configured, or a job without source options (tests)
        return None


def _remove(items: list[Any], item: Any) -> None:
    with contextlib.suppress(ValueError):
        items.remove(item)
