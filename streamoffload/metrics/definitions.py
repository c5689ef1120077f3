"""What the offload job exports: every metric's name, type, help and labels, in one registry.

The recording side (``metrics.collector``) creates its prometheus-client objects from these definitions,
and the dashboard and alert rules (``streamoffload.dashboard``) build their queries from them, so a
renamed metric renames its panels and alerts with it instead of leaving them silently empty.

Families with a ``topic`` label carry samples only for the topic-partitions ``metrics.selection`` picks
(``[metrics] topic_series``, the worst first), so a job of 10,000 topic-partitions does not export
hundreds of thousands of series. The ``streamoffload_namespace_*`` families are computed over every
topic-partition the job knows, exported or not: they are the ones to sum, and their counters never go
down when a topic leaves the per-topic series. They are separate families, not a ``namespace`` label on
the per-topic ones, so ``sum(family)`` never adds a topic's figures to its namespace's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

PREFIX = "streamoffload"
STATUSES = ("Assigned", "Offloaded", "Failed")

# Segment sizes: from 1 MiB to 4 GiB (segments are bounded by maxSizePerOffloadSegmentMbytes, 1 GiB
# by default; small ones come from time rollovers of quiet topics).
SEGMENT_SIZE_BUCKETS: tuple[float, ...] = tuple(float(2**i) for i in range(20, 33, 1))
UPLOAD_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
BATCH_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)

Kind = Literal["counter", "gauge", "histogram"]


@dataclass(frozen=True)
class MetricDef:
    """One exported metric family."""

    name: str
    """The family's name, as ``# TYPE`` shows it (a counter's sample adds ``_total``)."""
    kind: Kind
    help: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] = ()
    """A histogram's upper bounds (``+Inf`` is implied)."""

    @property
    def total(self) -> str:
        """A counter's sample name."""
        if self.kind != "counter":
            raise ValueError(f"metric {self.name}: a {self.kind} has no _total sample")
        return self.name + "_total"

    @property
    def bucket(self) -> str:
        return self._histogram_sample("_bucket")

    @property
    def sum(self) -> str:
        return self._histogram_sample("_sum")

    @property
    def count(self) -> str:
        return self._histogram_sample("_count")

    def _histogram_sample(self, suffix: str) -> str:
        if self.kind != "histogram":
            raise ValueError(f"metric {self.name}: a {self.kind} has no {suffix} sample")
        return self.name + suffix


METRICS: dict[str, MetricDef] = {}
"""Every exported family by name, in the order of the definitions below."""


def _define(
    name: str, kind: Kind, help: str, labels: tuple[str, ...] = (), buckets: tuple[float, ...] = ()
) -> MetricDef:
    full = f"{PREFIX}_{name}"
    if full in METRICS:
        raise ValueError(f"metric {full} is defined twice")
    METRICS[full] = MetricDef(full, kind, help, labels, buckets)
    return METRICS[full]


_TOPIC = ("topic",)

# -- the sink and the Spark query: process-lifetime counters and distributions -------------------------

UPLOAD_DURATION = _define(
    "upload_duration_seconds",
    "histogram",
    "Time to upload one part, or to seal a segment (complete the data object, put index and manifest).",
    buckets=UPLOAD_BUCKETS,
)
UPLOAD_ERRORS = _define(
    "upload_errors",
    "counter",
    "Sink actions (part uploads, seals) that failed; the query then restarts and retries them.",
)
PARTS_UPLOADED = _define("parts_uploaded", "counter", "Multipart parts uploaded by the sink.")
PART_BYTES_UPLOADED = _define("part_bytes_uploaded", "counter", "Bytes of the multipart parts uploaded by the sink.")
THROTTLED_SECONDS = _define(
    "throttled_seconds",
    "counter",
    "Seconds the sink's tasks waited for the offload policy's rate limits (offload*RateBytesPerSecond), by kind: "
    "read (re-reads from the broker) or upload (parts to the store). Summed over tasks, so it can grow faster "
    "than the clock.",
    ("kind",),
)
SEGMENTS_OPENED = _define("segments_opened", "counter", "Offload segments opened (Assigned manifests written).")
SINK_DURATION = _define(
    "sink_duration_seconds",
    "histogram",
    "Wall time of the sink (foreachBatch) for one micro-batch.",
    buckets=BATCH_BUCKETS,
)
BATCH_DURATION = _define(
    "batch_duration_seconds",
    "histogram",
    "Spark micro-batch duration (triggerExecution), from the StreamingQueryListener.",
    buckets=BATCH_BUCKETS,
)
BATCHES = _define("batches", "counter", "Spark micro-batches completed.")
INPUT_ROWS = _define("input_rows", "counter", "Rows (entries and control requests) read by the Spark query.")
INPUT_RATE = _define(
    "input_rows_per_second", "gauge", "Input rate of the last micro-batch (Spark's inputRowsPerSecond)."
)
PROCESSED_RATE = _define(
    "processed_rows_per_second", "gauge", "Processing rate of the last micro-batch (Spark's processedRowsPerSecond)."
)
QUERY_FAILURES = _define(
    "query_failures",
    "counter",
    "Offload queries that terminated with an error (the job restarts them from the checkpoint).",
)
QUERY_RESTARTS = _define(
    "query_restarts",
    "counter",
    "Runs the job started again after a failure of its query or of a run's start (recovering from the store).",
)
BROKER_UNREACHABLE = _define(
    "broker_unreachable",
    "gauge",
    "1 while the job's Pulsar broker is unreachable; the job keeps retrying with capped backoff meanwhile.",
)
POLICY_EFFECTIVE_TIME = _define(
    "policy_effective_timestamp_seconds",
    "gauge",
    "When the newest offload policy version the job published takes effect (0 before its first run): it "
    "changes when the configuration's policy does.",
)
BUILD_INFO = _define("build_info", "gauge", "streamoffload version.", ("version",))

# -- per topic-partition: what the store holds and what waits ------------------------------------------

ENTRIES_OFFLOADED = _define("entries_offloaded", "counter", "Entries in Offloaded (readable) segments.", _TOPIC)
BYTES_OFFLOADED = _define("bytes_offloaded", "counter", "Bytes of the Pulsar entries in Offloaded segments.", _TOPIC)
SEGMENTS_SEALED = _define(
    "segments_sealed", "counter", "Segments sealed and offloaded, by seal reason.", ("topic", "reason")
)
# One histogram for the job: per topic-partition (or per namespace) its 16 series would be most of a scrape.
SEGMENT_SIZE = _define(
    "segment_size_bytes",
    "histogram",
    "Data object size of offloaded segments, over every topic-partition of the job.",
    buckets=SEGMENT_SIZE_BUCKETS,
)
SEGMENTS = _define(
    "segments", "gauge", "Segments in the store by status (Assigned, Offloaded, Failed).", ("topic", "status")
)
STORED_BYTES = _define("stored_bytes", "gauge", "Data object bytes of the Offloaded segments now in the store.", _TOPIC)
OFFLOAD_LAG = _define(
    "offload_lag_seconds",
    "gauge",
    "0 when caught up with the latest position, else now minus the publish time of the newest offloaded entry.",
    _TOPIC,
)
LAST_OFFLOADED_PUBLISH = _define(
    "last_offloaded_publish_timestamp_seconds", "gauge", "Publish time of the newest offloaded entry.", _TOPIC
)
BACKLOG_ENTRIES = _define(
    "backlog_entries", "gauge", "Entries published but not yet in an Offloaded segment (where known exactly).", _TOPIC
)
SOURCE_BACKLOG_BYTES = _define(
    "source_backlog_bytes",
    "gauge",
    "Bytes between the source's read position and the latest position (from the source).",
    _TOPIC,
)
OPEN_SEGMENT_AGE = _define(
    "open_segment_age_seconds",
    "gauge",
    "Age of the oldest open (Assigned or Failed) segment; 0 when none is open.",
    _TOPIC,
)
OPEN_SEGMENT_ENTRIES = _define("open_segment_entries", "gauge", "Entries assigned to the open segment.", _TOPIC)
OPEN_SEGMENT_BYTES = _define("open_segment_bytes", "gauge", "Bytes (blocks) assigned to the open segment.", _TOPIC)
OFFLOAD_BUFFER = _define(
    "offload_buffer_bytes", "gauge", "Bytes accepted but not yet uploaded (the PIP-76 offload buffer).", _TOPIC
)

# -- the process: read caches, the metadata refresh, failing topic-partitions -------------------------

READ_CACHE_HITS = _define(
    "read_cache_hits", "counter", "Read-path cache hits of readers in this process (0 when none runs here)."
)
READ_CACHE_MISSES = _define(
    "read_cache_misses", "counter", "Read-path cache misses of readers in this process (0 when none runs here)."
)
METADATA_REFRESH_TIME = _define(
    "metadata_refresh_timestamp_seconds", "gauge", "When the store's metadata was last read."
)
METADATA_REFRESH_OK = _define("metadata_refresh_ok", "gauge", "1 if the last read of the store's metadata succeeded.")
LAST_BATCH_TIME = _define("last_batch_timestamp_seconds", "gauge", "When the sink last finished a micro-batch.")
TOPIC_FAILURES_IN_A_ROW = _define(
    "topic_failures_in_a_row",
    "gauge",
    "Offload failures of a topic-partition since its last committed segment (absent when none).",
    _TOPIC,
)
TOPIC_SET_ASIDE = _define(
    "topic_set_aside",
    "gauge",
    "1 while a topic-partition that kept failing is set aside so the other topics go on.",
    _TOPIC,
)

# -- per namespace (tenant/namespace): totals over EVERY topic-partition, whether it has per-topic series -----

_NS = ("namespace",)

NAMESPACE_ENTRIES_OFFLOADED = _define(
    "namespace_entries_offloaded",
    "counter",
    "Entries in Offloaded (readable) segments, over every topic-partition of the namespace.",
    _NS,
)
NAMESPACE_BYTES_OFFLOADED = _define(
    "namespace_bytes_offloaded",
    "counter",
    "Bytes of the Pulsar entries in Offloaded segments, over every topic-partition of the namespace.",
    _NS,
)
NAMESPACE_SEGMENTS_SEALED = _define(
    "namespace_segments_sealed",
    "counter",
    "Segments sealed and offloaded by seal reason, over every topic-partition of the namespace.",
    ("namespace", "reason"),
)
NAMESPACE_SEGMENTS = _define(
    "namespace_segments",
    "gauge",
    "Segments in the store by status (Assigned, Offloaded, Failed), over every topic-partition of the namespace.",
    ("namespace", "status"),
)
NAMESPACE_STORED_BYTES = _define(
    "namespace_stored_bytes",
    "gauge",
    "Data object bytes of the Offloaded segments now in the store, over every topic-partition of the namespace.",
    _NS,
)
NAMESPACE_MAX_OFFLOAD_LAG = _define(
    "namespace_max_offload_lag_seconds",
    "gauge",
    "The largest offload lag of the namespace's topic-partitions (of those whose lag is known).",
    _NS,
)
NAMESPACE_BACKLOG_ENTRIES = _define(
    "namespace_backlog_entries",
    "gauge",
    "Entries published but not yet in an Offloaded segment, summed over the topic-partitions where it is known.",
    _NS,
)
NAMESPACE_SOURCE_BACKLOG_BYTES = _define(
    "namespace_source_backlog_bytes",
    "gauge",
    "Bytes between the source's read positions and the latest positions, summed where the source knows them.",
    _NS,
)
NAMESPACE_MAX_OPEN_SEGMENT_AGE = _define(
    "namespace_max_open_segment_age_seconds",
    "gauge",
    "Age of the oldest open (Assigned or Failed) segment of the namespace; 0 when none is open.",
    _NS,
)
NAMESPACE_OPEN_SEGMENT_ENTRIES = _define(
    "namespace_open_segment_entries",
    "gauge",
    "Entries assigned to open segments, over every topic-partition of the namespace.",
    _NS,
)
NAMESPACE_OPEN_SEGMENT_BYTES = _define(
    "namespace_open_segment_bytes",
    "gauge",
    "Bytes (blocks) assigned to open segments, over every topic-partition of the namespace.",
    _NS,
)
NAMESPACE_OFFLOAD_BUFFER = _define(
    "namespace_offload_buffer_bytes",
    "gauge",
    "Bytes accepted but not yet uploaded (the PIP-76 offload buffers), over every topic-partition of the namespace.",
    _NS,
)
NAMESPACE_TOPICS = _define(
    "namespace_topic_partitions", "gauge", "Topic-partitions of the namespace the job knows.", _NS
)
NAMESPACE_TOPICS_EXPORTED = _define(
    "namespace_topic_partitions_exported",
    "gauge",
    "Topic-partitions of the namespace exported with per-topic series (the worst first, [metrics] topic_series).",
    _NS,
)
NAMESPACE_TOPICS_FAILING = _define(
    "namespace_topic_partitions_failing",
    "gauge",
    "Topic-partitions of the namespace failing: offload failures since their last commit, or a Failed segment.",
    _NS,
)

# -- per Iceberg table (topics whose policy has offloadTable on: streaming.job.tables) ----------------------
# Counted by this process's table follower since it started (like the sink's counters): the table itself, in its
# snapshots, is the record of what it holds.

_TABLE = ("table",)

TABLE_COMMITS = _define(
    "table_commits", "counter", "Iceberg commits the job made to the table (each appends sealed segments).", _TABLE
)
TABLE_COMMIT_FAILURES = _define(
    "table_commit_failures",
    "counter",
    "Syncs of the table that failed (catalog unreachable, commits lost to other writers, the store failing, the "
    "writer lease lost): nothing was appended twice; retried at the next [table] commit_interval.",
    _TABLE,
)
TABLE_ROWS_APPENDED = _define(
    "table_rows_appended", "counter", "Messages (rows) the job appended to the table.", _TABLE
)
TABLE_FILES_APPENDED = _define(
    "table_data_files_appended", "counter", "Parquet data files the job appended to the table.", _TABLE
)
TABLE_BYTES_APPENDED = _define(
    "table_bytes_appended", "counter", "Bytes of the Parquet data files the job appended to the table.", _TABLE
)
TABLE_LAG_SEGMENTS = _define(
    "table_lag_segments",
    "gauge",
    "Offloaded segments the table did not hold yet after its last sync (0: caught up with the store).",
    _TABLE,
)
TABLE_LAG_ENTRIES = _define(
    "table_lag_entries",
    "gauge",
    "Entries of the offloaded segments the table did not hold after its last sync.",
    _TABLE,
)
TABLE_LAST_COMMIT = _define(
    "table_last_commit_timestamp_seconds", "gauge", "When the job last committed to the table.", _TABLE
)
TABLE_DEAD_LETTERS = _define(
    "table_dead_letters_appended",
    "counter",
    "Rows the job appended to the table's dead-letter table: values that did not decode with the topic's "
    "offloadTableSchema (their rows are in the table too, value_decoded null).",
    _TABLE,
)
TABLE_MAINTENANCES = _define(
    "table_maintenances", "counter", "Maintenances of the table by the job ([table] maintain_every).", _TABLE
)
TABLE_MAINTENANCE_FAILURES = _define(
    "table_maintenance_failures",
    "counter",
    "Maintenances of the table that failed (nothing was dropped or kept twice); retried a maintain_every later.",
    _TABLE,
)
TABLE_FILES_COMPACTED = _define(
    "table_files_compacted",
    "counter",
    "Small data files the job's compaction replaced by larger ones (the table's and its dead-letter table's).",
    _TABLE,
)
TABLE_SNAPSHOTS_EXPIRED = _define(
    "table_snapshots_expired",
    "counter",
    "Snapshots the job's maintenance expired ([table] keep_snapshots, snapshot_max_age).",
    _TABLE,
)
TABLE_ORPHANS_REMOVED = _define(
    "table_orphan_files_removed",
    "counter",
    "Files no snapshot names that the job's maintenance deleted: failed attempts' and replaced data files, "
    "unnamed manifests.",
    _TABLE,
)
TABLE_ROWS_RETAINED_AWAY = _define(
    "table_retention_rows_removed",
    "counter",
    "Rows the job's maintenance removed because the store no longer has their segments (offload retention, "
    "delete-ledger).",
    _TABLE,
)

# -- the per-topic cut ---------------------------------------------------------------------------------

TOPIC_SERIES_LIMIT = _define(
    "topic_series_limit",
    "gauge",
    "At most this many topic-partitions are exported with per-topic series ([metrics] topic_series).",
)
TOPIC_SERIES_OMITTED = _define(
    "topic_series_omitted",
    "gauge",
    "Topic-partitions the job knows that were left out of the per-topic series in this scrape "
    "(their figures are in the streamoffload_namespace_* families).",
)
