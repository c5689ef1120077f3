"""``JobMetrics``: the collector of one offload job. It records what the job's batch reports, Spark's progress
and the store's metadata say, and exposes it in the families of ``metrics.definitions``."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from streamoffload import __version__
from streamoffload.checkpoints.metadata_store import MetadataStore
from streamoffload.checkpoints.metadata_view import KEEP_RECENT, MetadataView
from streamoffload.codecs.positions import Position
from streamoffload.config import DEFAULT_TOPIC_SERIES
from streamoffload.metrics import definitions as d
from streamoffload.metrics.model import (
    Backlog,
    BacklogProvider,
    CacheCounterSource,
    OpenSegment,
    TopicState,
    store_totals,
)
from streamoffload.metrics.selection import (
    NamespaceTotals,
    TopicFigures,
    job_segment_sizes,
    namespace_of,
    namespace_totals,
    select,
    topic_figures,
)
from streamoffload.metrics.serving import MetricsServer, format_address
from streamoffload.metrics.sources import backlog_from_source_progress, shared_read_cache

if TYPE_CHECKING:
    from streamoffload.streaming.job.report import BatchReport
    from streamoffload.streaming.job.tables import TableFigures

log = logging.getLogger(__name__)


class JobMetrics(Collector):
    """Metrics of one offload job. Feed it with :meth:`on_batch` (a job listener), Spark progress
    (``metrics.sources.progress_listener``) and :meth:`refresh_store`; serve it with :meth:`start_server`.

    ``topic_series``: per-topic series for at most this many topic-partitions per scrape, the worst first
    (``metrics.selection``); 0 exports none. The ``streamoffload_namespace_*`` families cover them all.

    ``relist_s``: the store refresh lists a topic-partition only when :meth:`mark_changed` named it (the job's
    ``metadata_listeners``), or once every ``relist_s`` (``MetadataView.snapshot``); without it, every refresh
    lists every topic-partition (metrics of a store others write).

    ``keep_recent``: the store view holds each topic-partition's newest segments one by one and their older
    ones as sums (``MetadataView``); the per-topic figures add the sums, so memory stays flat as the store grows.
    """

    def __init__(
        self,
        metadata: MetadataStore | None = None,
        *,
        backlog: BacklogProvider | None = None,
        store_refresh_s: float = 60.0,
        backlog_interval_s: float = 15.0,
        registry: CollectorRegistry | None = None,
        clock: Callable[[], float] = time.time,
        read_cache: bool = True,
        topic_rediscovery_s: float = 3600.0,
        topic_series: int = DEFAULT_TOPIC_SERIES,
        relist_s: float | None = None,
        keep_recent: int | None = KEEP_RECENT,
    ) -> None:
        if isinstance(topic_series, bool) or not isinstance(topic_series, int) or topic_series < 0:
            raise ValueError(f"topic_series must be a whole number >= 0, got {topic_series!r}")
        self.topic_series = topic_series
        self.metadata = metadata
        self._view = (
            None
            if metadata is None
            else MetadataView(metadata, rediscover_s=topic_rediscovery_s, relist_s=relist_s, keep_recent=keep_recent)
        )
        self.backlog_provider = backlog
        self.store_refresh_s = store_refresh_s
        self.backlog_interval_s = backlog_interval_s
        self.clock = clock
        self.registry = registry or CollectorRegistry(auto_describe=True)
        self._lock = threading.RLock()
        self._refresh_lock = threading.Lock()
        self._on_stop: list[Callable[[], None]] = []
        self._topics: dict[str, TopicState] = {}
        self._read_caches: list[CacheCounterSource] = [shared_read_cache] if read_cache else []
        self._dirty: set[str] = set()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._server: MetricsServer | None = None
        self.address: tuple[str, int] | None = None
        self.last_refresh_error: str | None = None
        self._last_refresh_time = 0.0
        self._last_batch_time = 0.0
        self.job_health: Callable[[], Any] | None = None
        """The job's ``streaming.job.health.JobHealth`` now (``install_metrics`` sets it): broker reachability
        and restarts."""
        self.policy_effective_ms: Callable[[], int] | None = None
        """When the job's newest offload policy version takes effect, in ms (``install_metrics`` sets it)."""
        self.table_figures: Callable[[], list[TableFigures]] | None = None
        """The job's Iceberg tables now (``install_metrics`` sets it: ``JobRuns.table_figures``)."""
        self._failing: dict[str, tuple[int, int]] = {}
        """Topic-partitions failing in a row (streaming.governance.quarantine): failures and until when set aside."""

        reg = self.registry
        self.upload_duration = _histogram(d.UPLOAD_DURATION, reg)
        self.upload_errors = _counter(d.UPLOAD_ERRORS, reg)
        self.parts_uploaded = _counter(d.PARTS_UPLOADED, reg)
        self.part_bytes_uploaded = _counter(d.PART_BYTES_UPLOADED, reg)
        self.segments_opened = _counter(d.SEGMENTS_OPENED, reg)
        self.throttled_seconds = _counter(d.THROTTLED_SECONDS, reg)
        for kind in ("read", "upload"):
            self.throttled_seconds.labels(kind=kind)  # 0 until a limit holds something back: the panel has data
        self.sink_duration = _histogram(d.SINK_DURATION, reg)
        self.batch_duration = _histogram(d.BATCH_DURATION, reg)
        self.batches = _counter(d.BATCHES, reg)
        self.input_rows = _counter(d.INPUT_ROWS, reg)
        self.input_rate = Gauge(d.INPUT_RATE.name, d.INPUT_RATE.help, registry=reg)
        self.processed_rate = Gauge(d.PROCESSED_RATE.name, d.PROCESSED_RATE.help, registry=reg)
        self.query_failures = _counter(d.QUERY_FAILURES, reg)
        self.info = Gauge(d.BUILD_INFO.name, d.BUILD_INFO.help, list(d.BUILD_INFO.labels), registry=reg)
        self.info.labels(version=__version__).set(1)
        reg.register(self)

    # -- inputs ---------------------------------------------------------------------------------

    def _topic(self, topic: str) -> TopicState:
        state = self._topics.get(topic)
        if state is None:
            state = self._topics[topic] = TopicState(namespace=namespace_of(topic))
        return state

    def on_batch(self, report: BatchReport) -> None:
        """A job listener: account a :class:`~streamoffload.streaming.job.report.BatchReport`."""
        now = self.clock()
        sink = report.stats
        for seconds in sink.upload_seconds:
            self.upload_duration.observe(seconds)
        if sink.errors:
            self.upload_errors.inc(sink.errors)
        if sink.parts:
            self.parts_uploaded.inc(sink.parts)
        if sink.part_bytes:
            self.part_bytes_uploaded.inc(sink.part_bytes)
        if sink.opened:
            self.segments_opened.inc(sink.opened)
        for kinds in sink.throttled.values():
            for kind, seconds in kinds.items():
                if seconds > 0:
                    self.throttled_seconds.labels(kind=kind).inc(seconds)
        self.sink_duration.observe(report.duration_s)
        with self._lock:
            self._last_batch_time = now
            for topic, stats in sink.topics.items():
                state = self._topic(topic)
                state.stats = stats
                segment, assigned = stats.open_segment, stats.open_segment_assigned_ms
                if segment and segment not in state.offloaded:
                    previous = state.open.get(segment)
                    state.open[segment] = OpenSegment(previous.status if previous else "Assigned", int(assigned or 0))
            for seal in sink.sealed:
                state = self._topic(seal.topic)
                state.count_offloaded(
                    seal.segment,
                    entries=seal.entries,
                    entry_bytes=seal.entry_bytes,
                    data_bytes=seal.data_length,
                    reason=seal.reason,
                    end=seal.end,
                    publish_last_ms=seal.publish_time_last,
                )
                if not seal.publish_time_last:
                    self._dirty.add(seal.topic)  # the manifest has the last publish time
        if sink.sealed:
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

    def mark_changed(self, topics: Iterable[str]) -> None:
        """The job wrote these topic-partitions' metadata: the next refresh lists them again."""
        if self._view is not None:
            self._view.mark_changed(topics)

    def refresh_store(self, topics: Iterable[str] | None = None) -> None:
        """Re-read the metadata of ``topics``, or of every topic-partition known (the store's, found at
        the first refresh and every ``topic_rediscovery_s``, and those the job's batches named): one
        listing per topic-partition, reads of changed objects only."""
        if self._view is None:
            return
        view = self._view
        if topics is None:
            with self._lock:
                known = list(self._topics)
            names = view.topics(known)
        else:
            names = sorted({str(t) for t in topics})
        for topic in names:
            # The periodic pass lists only what changed (with relist_s: the job tells mark_changed); topics
            # named by the caller are listed now.
            snap = view.snapshot(topic) if topics is None else view.refresh(topic)
            totals = store_totals(snap)
            with self._lock:
                state = self._topic(topic)
                offloaded: dict[str, int] = {}
                opened: dict[str, OpenSegment] = {}
                for segment in snap.segment_states():
                    if segment.offloaded:
                        offloaded[segment.segment_id] = segment.data_length
                        state.count_offloaded(
                            segment.segment_id,
                            entries=segment.entries,
                            entry_bytes=segment.entry_bytes,
                            data_bytes=segment.data_length,
                            reason=segment.seal_reason,
                            end=segment.end,
                            publish_last_ms=segment.publish_last_ms,
                        )
                    else:
                        opened[segment.segment_id] = OpenSegment(segment.status, segment.assigned_ms)
                state.offloaded = offloaded
                state.open = opened
                state.take_fold(snap.fold)
                if state.store_totals is None or totals.segments >= state.store_totals.segments:
                    state.store_totals = totals
        if topics is None:  # one LIST (records exist only while a topic is failing)
            from streamoffload.streaming.governance.quarantine import read_records

            failing = read_records(view.meta.scoped)
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
        with self._lock:
            # Every known topic-partition's figures (O(T)), the worst ``topic_series`` of them (O(T log N)),
            # and the namespace totals over all of them; per-topic samples only for the chosen ones.
            failing = dict(self._failing)
            figures = [
                topic_figures(topic, self._topics.get(topic), failing.get(topic), now_ms)
                for topic in self._topics.keys() | failing.keys()
            ]
            chosen = sorted(select(figures, self.topic_series), key=lambda f: f.topic)
            namespaces = namespace_totals(figures, chosen)
            # Built under the lock (totals share dicts with the live state); yielded after it.
            families = [*_topic_families(chosen), *_namespace_families(namespaces)]
            job_sizes = job_segment_sizes(figures)
            sizes = _family(d.SEGMENT_SIZE)
            sizes.add_metric([], job_sizes.cumulative(), job_sizes.total)
            families.append(sizes)
            families.append(_gauge(d.TOPIC_SERIES_LIMIT, self.topic_series))
            families.append(_gauge(d.TOPIC_SERIES_OMITTED, len(figures) - len(chosen)))
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
            refresh_error = self.last_refresh_error
        yield from families
        cache_hits = _family(d.READ_CACHE_HITS)
        cache_hits.add_metric([], hits)
        cache_misses = _family(d.READ_CACHE_MISSES)
        cache_misses.add_metric([], misses)
        yield cache_hits
        yield cache_misses
        yield _gauge(d.METADATA_REFRESH_TIME, refreshed)
        yield _gauge(d.METADATA_REFRESH_OK, 0.0 if refresh_error else 1.0)
        yield _gauge(d.LAST_BATCH_TIME, batch_time)
        health = self.job_health() if self.job_health is not None else None
        yield _gauge(d.BROKER_UNREACHABLE, 1.0 if health is not None and health.broker_unreachable else 0.0)
        restarts = _family(d.QUERY_RESTARTS)
        restarts.add_metric([], health.query_restarts if health is not None else 0)
        yield restarts
        policy_ms = self.policy_effective_ms() if self.policy_effective_ms is not None else 0
        yield _gauge(d.POLICY_EFFECTIVE_TIME, policy_ms / 1000)
        yield from _table_families(self.table_figures() if self.table_figures is not None else [])

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
        self._server = MetricsServer(self.registry, address)
        self.address = self._server.address
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
            self._server.stop()
            self._server = None


def _counter(defn: d.MetricDef, registry: CollectorRegistry) -> Counter:
    return Counter(defn.name, defn.help, list(defn.labels), registry=registry)


def _histogram(defn: d.MetricDef, registry: CollectorRegistry) -> Histogram:
    return Histogram(defn.name, defn.help, list(defn.labels), registry=registry, buckets=defn.buckets)


_FAMILIES: dict[str, type[CounterMetricFamily] | type[GaugeMetricFamily] | type[HistogramMetricFamily]] = {
    "counter": CounterMetricFamily,
    "gauge": GaugeMetricFamily,
    "histogram": HistogramMetricFamily,
}


def _family(defn: d.MetricDef) -> Any:
    """An empty family of ``defn`` for :meth:`JobMetrics.collect` to fill, one sample per label set."""
    return _FAMILIES[defn.kind](defn.name, defn.help, labels=list(defn.labels))


def _topic_families(chosen: list[TopicFigures]) -> Iterator[Metric]:
    """The per-topic families, with samples of the ``chosen`` topic-partitions only."""
    entries = _family(d.ENTRIES_OFFLOADED)
    nbytes = _family(d.BYTES_OFFLOADED)
    sealed = _family(d.SEGMENTS_SEALED)
    segments = _family(d.SEGMENTS)
    stored = _family(d.STORED_BYTES)
    lag = _family(d.OFFLOAD_LAG)
    last_publish = _family(d.LAST_OFFLOADED_PUBLISH)
    backlog = _family(d.BACKLOG_ENTRIES)
    backlog_bytes = _family(d.SOURCE_BACKLOG_BYTES)
    open_age = _family(d.OPEN_SEGMENT_AGE)
    open_entries = _family(d.OPEN_SEGMENT_ENTRIES)
    open_bytes = _family(d.OPEN_SEGMENT_BYTES)
    buffer = _family(d.OFFLOAD_BUFFER)
    in_a_row = _family(d.TOPIC_FAILURES_IN_A_ROW)
    set_aside = _family(d.TOPIC_SET_ASIDE)
    for f in chosen:
        topic = [f.topic]
        if f.failures is not None:
            in_a_row.add_metric(topic, f.failures)
            set_aside.add_metric(topic, 1.0 if f.set_aside else 0.0)
        totals = f.totals
        if totals is None:
            continue  # known only from its quarantine record
        entries.add_metric(topic, totals.entries)
        nbytes.add_metric(topic, totals.bytes)
        for reason, n in sorted(totals.seals.items()):
            sealed.add_metric([f.topic, reason], n)
        for status, n in f.statuses.items():
            segments.add_metric([f.topic, status], n)
        stored.add_metric(topic, f.stored)
        if f.lag is not None:
            lag.add_metric(topic, f.lag)
        if f.last_publish is not None:
            last_publish.add_metric(topic, f.last_publish)
        if f.behind is not None:
            backlog.add_metric(topic, f.behind)
        if f.backlog_bytes is not None:
            backlog_bytes.add_metric(topic, f.backlog_bytes)
        open_age.add_metric(topic, f.open_age)
        if f.open_entries is not None:
            open_entries.add_metric(topic, f.open_entries)
        if f.open_bytes is not None:
            open_bytes.add_metric(topic, f.open_bytes)
        if f.buffer is not None:
            buffer.add_metric(topic, f.buffer)
    yield from (entries, nbytes, sealed, segments, stored, lag, last_publish, backlog, backlog_bytes)
    yield from (open_age, open_entries, open_bytes, buffer, in_a_row, set_aside)


def _table_families(tables: list[TableFigures]) -> Iterator[Metric]:
    """The ``streamoffload_table_*`` families: one sample per table (a gauge not known yet has none)."""
    commits = _family(d.TABLE_COMMITS)
    failures = _family(d.TABLE_COMMIT_FAILURES)
    rows = _family(d.TABLE_ROWS_APPENDED)
    files = _family(d.TABLE_FILES_APPENDED)
    nbytes = _family(d.TABLE_BYTES_APPENDED)
    lag_segments = _family(d.TABLE_LAG_SEGMENTS)
    lag_entries = _family(d.TABLE_LAG_ENTRIES)
    last_commit = _family(d.TABLE_LAST_COMMIT)
    counts: list[tuple[CounterMetricFamily, Callable[[TableFigures], int]]] = [
        (_family(d.TABLE_DEAD_LETTERS), lambda t: t.dead_letters_appended),
        (_family(d.TABLE_MAINTENANCES), lambda t: t.maintenances),
        (_family(d.TABLE_MAINTENANCE_FAILURES), lambda t: t.maintenance_failures),
        (_family(d.TABLE_FILES_COMPACTED), lambda t: t.files_compacted),
        (_family(d.TABLE_SNAPSHOTS_EXPIRED), lambda t: t.snapshots_expired),
        (_family(d.TABLE_ORPHANS_REMOVED), lambda t: t.orphans_removed),
        (_family(d.TABLE_ROWS_RETAINED_AWAY), lambda t: t.rows_retained_away),
    ]
    for t in tables:
        label = [t.table]
        commits.add_metric(label, t.commits)
        failures.add_metric(label, t.commit_failures)
        rows.add_metric(label, t.rows_appended)
        files.add_metric(label, t.files_appended)
        nbytes.add_metric(label, t.bytes_appended)
        if t.segments_behind is not None:
            lag_segments.add_metric(label, t.segments_behind)
        if t.entries_behind is not None:
            lag_entries.add_metric(label, t.entries_behind)
        if t.last_commit_s is not None:
            last_commit.add_metric(label, t.last_commit_s)
        for family, count in counts:
            family.add_metric(label, count(t))
    yield from (commits, failures, rows, files, nbytes, lag_segments, lag_entries, last_commit)
    yield from (family for family, _ in counts)


def _namespace_families(namespaces: Mapping[str, NamespaceTotals]) -> Iterator[Metric]:
    """The ``streamoffload_namespace_*`` families: one sample (per reason or status) of each namespace."""
    entries = _family(d.NAMESPACE_ENTRIES_OFFLOADED)
    nbytes = _family(d.NAMESPACE_BYTES_OFFLOADED)
    sealed = _family(d.NAMESPACE_SEGMENTS_SEALED)
    segments = _family(d.NAMESPACE_SEGMENTS)
    stored = _family(d.NAMESPACE_STORED_BYTES)
    lag = _family(d.NAMESPACE_MAX_OFFLOAD_LAG)
    backlog = _family(d.NAMESPACE_BACKLOG_ENTRIES)
    backlog_bytes = _family(d.NAMESPACE_SOURCE_BACKLOG_BYTES)
    open_age = _family(d.NAMESPACE_MAX_OPEN_SEGMENT_AGE)
    open_entries = _family(d.NAMESPACE_OPEN_SEGMENT_ENTRIES)
    open_bytes = _family(d.NAMESPACE_OPEN_SEGMENT_BYTES)
    buffer = _family(d.NAMESPACE_OFFLOAD_BUFFER)
    topics = _family(d.NAMESPACE_TOPICS)
    exported = _family(d.NAMESPACE_TOPICS_EXPORTED)
    failing = _family(d.NAMESPACE_TOPICS_FAILING)
    for name, ns in sorted(namespaces.items()):
        label = [name]
        topics.add_metric(label, ns.topics)
        exported.add_metric(label, ns.exported)
        failing.add_metric(label, ns.failing)
        entries.add_metric(label, ns.entries)
        nbytes.add_metric(label, ns.bytes)
        for reason, n in sorted(ns.seals.items()):
            sealed.add_metric([name, reason], n)
        for status, n in ns.statuses.items():
            segments.add_metric([name, status], n)
        stored.add_metric(label, ns.stored)
        if ns.max_lag is not None:
            lag.add_metric(label, ns.max_lag)
        if ns.behind is not None:
            backlog.add_metric(label, ns.behind)
        if ns.backlog_bytes is not None:
            backlog_bytes.add_metric(label, ns.backlog_bytes)
        open_age.add_metric(label, ns.max_open_age)
        if ns.open_entries is not None:
            open_entries.add_metric(label, ns.open_entries)
        if ns.open_bytes is not None:
            open_bytes.add_metric(label, ns.open_bytes)
        if ns.buffer is not None:
            buffer.add_metric(label, ns.buffer)
    yield from (topics, exported, failing, entries, nbytes, sealed, segments, stored, lag, backlog)
    yield from (backlog_bytes, open_age, open_entries, open_bytes, buffer)


def _gauge(defn: d.MetricDef, value: float) -> GaugeMetricFamily:
    """A gauge of ``defn`` without labels and its one value."""
    return GaugeMetricFamily(defn.name, defn.help, value=value)
