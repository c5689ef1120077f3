"""The dashboard model: rows of panel specifications over the metric definitions of
``streamoffload.metrics.definitions``, built into a Grafana dashboard by ``grafana-foundation-sdk``'s builders.

The curated rows (lag, throughput, segments, errors, health, buffer, micro-batches, the per-topic table) name
their metrics through their definitions. Every exported family that no curated panel queries gets a panel
derived from its definition (:func:`derived_panel`: its kind, labels and unit from its name), in the row
"Every other metric": a family added to the definitions is on the dashboard without a line here."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from streamoffload import __version__
from streamoffload.dashboard.errors import DashboardError
from streamoffload.metrics import definitions as m

if TYPE_CHECKING:
    from grafana_foundation_sdk.cog.builder import Builder
    from grafana_foundation_sdk.models.dashboard import (
        AnnotationQuery,
        Dashboard,
        DataSourceRef,
        GridPos,
        Panel,
        VariableModel,
    )
    from grafana_foundation_sdk.models.prometheus import PromQueryFormat

DASHBOARD_UID = "streamoffload"
DASHBOARD_TITLE = "streamoffload: Pulsar offload"
TOPIC_VARIABLE_QUERY = f"label_values({m.ENTRIES_OFFLOADED.total}, topic)"
JOB_VARIABLE_QUERY = f"label_values({m.BUILD_INFO.name}, job)"
INSTANCE_VARIABLE_QUERY = f'label_values({m.BUILD_INFO.name}{{job=~"$job"}}, instance)'
NAMESPACE_VARIABLE_QUERY = f"label_values({m.NAMESPACE_TOPICS.name}, namespace)"
"""The namespace variable's values: the ``namespace`` label of the namespace totals, which every namespace the
job knows has (a topic label would name only the topic-partitions that have per-topic series)."""

VARIABLE_ALL_VALUES = {"job": ".*", "instance": ".*", "namespace": ".*", "topic": ".*"}
"""What each query variable's "All" stands for (``substitute_variables`` uses it for a variable not given)."""

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
_J = 'job=~"$job",instance=~"$instance"'
_S = "{" + _J + "}"
_T = "{" + _J + ',topic=~"persistent://$namespace/.*",topic=~"$topic"}'
_N = "{" + _J + ',namespace=~"$namespace"}'
_RI = "$__rate_interval"

# Thresholds: green below, then amber, then red (Grafana "absolute" steps; the first step's value is null).
LAG_WARN_S = 2 * 600.0
"""Two default rollover times (maxOffloadSegmentRolloverTimeMinutes = 10): a job that keeps up stays below."""
LAG_CRIT_S = 3 * 600.0
STALE_BATCH_WARN_S = 300.0
STALE_BATCH_CRIT_S = 900.0

TOP_N = (
    " Per-topic series exist only for the worst topic-partitions ([metrics] topic_series, 100 by default: "
    "set aside and failing first, then by offload lag, then by backlog), so this shows at most that many; "
    "the per-namespace panels cover every topic-partition."
)
"""Said by every panel that draws per-topic series."""

DERIVED_ROW = "Every other metric"

PanelKind = Literal["timeseries", "stat", "bargauge", "table"]


class DashboardBuildError(DashboardError):
    """The dashboard cannot be built here (its SDK is not installed)."""


@dataclass(frozen=True)
class Target:
    """One query of a panel: ``unit`` (and, on a graph, ``right_axis``) give its series their own unit."""

    expr: str
    legend: str = ""
    unit: str | None = None
    right_axis: bool = False


@dataclass(frozen=True)
class PanelSpec:
    """What a panel shows; :func:`dashboard_model` builds it with the SDK's builder of its ``kind``. A table's
    queries are instant, one column each (named by their ``legend``), merged into one row per topic-partition."""

    title: str
    description: str
    targets: tuple[Target, ...]
    unit: str = "short"
    kind: PanelKind = "timeseries"
    width: int = 8
    height: int = 8
    stack: bool = False
    thresholds: tuple[float, float] | None = None
    value_texts: tuple[tuple[str, str, str], ...] = ()
    """Value mappings: (value, text, color)."""


@dataclass(frozen=True)
class RowSpec:
    title: str
    panels: tuple[PanelSpec, ...]


@dataclass(frozen=True)
class AnnotationSpec:
    """A Prometheus annotation: an event wherever ``expr`` has a positive sample (Grafana's rule)."""

    name: str
    expr: str
    color: str
    title: str
    text: str


def _quantile(q: float, bucket: str, by_rate: bool = True, selector: str = "") -> str:
    series = f"{bucket}{selector}"
    inner = f"rate({series}[{_RI}])" if by_rate else series
    return f"histogram_quantile({q}, sum by (le) ({inner}))"


def _p(
    title: str,
    description: str,
    *targets: Target,
    unit: str = "short",
    kind: PanelKind = "timeseries",
    width: int = 8,
    height: int = 8,
    stack: bool = False,
    thresholds: tuple[float, float] | None = None,
    value_texts: tuple[tuple[str, str, str], ...] = (),
) -> PanelSpec:
    return PanelSpec(title, description, targets, unit, kind, width, height, stack, thresholds, value_texts)


_ABSENT_IS_NONE = (
    " The per-topic family is absent while no topic-partition fails: the query reads 0 then (`or vector(0)`)."
)


def curated_rows() -> list[RowSpec]:
    """The dashboard's hand-laid rows (each query names its metric through its definition)."""
    failed = f'{{{_N[1:-1]},status="Failed"}}'
    rows = [
        RowSpec(
            "Lag",
            (
                _p(
                    "Offload lag by namespace",
                    "The largest offload lag of each namespace's topic-partitions: 0 when every published entry is "
                    "in an Offloaded (readable) segment; else now minus the publish time of the newest offloaded "
                    "entry. Bounded by maxOffloadSegmentRolloverTimeMinutes when the job keeps up.",
                    Target(f"max by (namespace) ({m.NAMESPACE_MAX_OFFLOAD_LAG.name}{_N})", "{{namespace}}"),
                    unit="s",
                    thresholds=(LAG_WARN_S, LAG_CRIT_S),
                ),
                _p(
                    "Offload lag",
                    "Offload lag of the worst topic-partitions: 0 when every published entry is in an Offloaded "
                    "(readable) segment; else now minus the publish time of the newest offloaded entry." + TOP_N,
                    Target(f"max by (topic) ({m.OFFLOAD_LAG.name}{_T})", "{{topic}}"),
                    unit="s",
                    thresholds=(LAG_WARN_S, LAG_CRIT_S),
                ),
                _p(
                    "Open segment age",
                    "Age of the oldest open (Assigned or Failed) segment: per namespace, and of the worst "
                    "topic-partitions; a time rollover seals it at the configured rollover time." + TOP_N,
                    Target(f"max by (namespace) ({m.NAMESPACE_MAX_OPEN_SEGMENT_AGE.name}{_N})", "{{namespace}} (all)"),
                    Target(f"max by (topic) ({m.OPEN_SEGMENT_AGE.name}{_T})", "{{topic}}"),
                    unit="s",
                    thresholds=(LAG_WARN_S, LAG_CRIT_S),
                ),
                _p(
                    "Entries behind the latest position",
                    "Entries published but not yet offloaded, per namespace (summed over the topic-partitions "
                    "where the count is exact).",
                    Target(f"sum by (namespace) ({m.NAMESPACE_BACKLOG_ENTRIES.name}{_N})", "{{namespace}}"),
                ),
                _p(
                    "Bytes behind the latest position",
                    "Bytes between the source's read positions and the latest positions (from the source), per "
                    "namespace and of the worst topic-partitions: what is left to read." + TOP_N,
                    Target(f"sum by (namespace) ({m.NAMESPACE_SOURCE_BACKLOG_BYTES.name}{_N})", "{{namespace}} (all)"),
                    Target(f"sum by (topic) ({m.SOURCE_BACKLOG_BYTES.name}{_T})", "{{topic}}"),
                    unit="bytes",
                ),
                _p(
                    "Topic-partitions",
                    "Topic-partitions the job knows per namespace, those failing (failures since their last "
                    "commit, or a Failed segment), those with per-topic series, how many were left out of the "
                    "per-topic series, and the limit ([metrics] topic_series).",
                    Target(f"sum by (namespace) ({m.NAMESPACE_TOPICS.name}{_N})", "{{namespace}}"),
                    Target(f"sum by (namespace) ({m.NAMESPACE_TOPICS_FAILING.name}{_N})", "{{namespace}} failing"),
                    Target(
                        f"sum by (namespace) ({m.NAMESPACE_TOPICS_EXPORTED.name}{_N})",
                        "{{namespace}} per-topic series",
                    ),
                    Target(f"sum({m.TOPIC_SERIES_OMITTED.name}{_S})", "left out of per-topic series"),
                    Target(f"max({m.TOPIC_SERIES_LIMIT.name}{_S})", "per-topic series limit"),
                ),
            ),
        ),
        RowSpec(
            "Per topic-partition",
            (
                _p(
                    "Topic-partitions now",
                    "One row per topic-partition with per-topic series: its lag, what waits, what the store "
                    "holds, its open segment and its failures (failures in a row since its last committed "
                    "segment; set aside: 1 while the job pauses it after failing again and again)." + TOP_N,
                    Target(f"max by (topic) ({m.OFFLOAD_LAG.name}{_T})", "lag", "s"),
                    Target(f"max by (topic) ({m.BACKLOG_ENTRIES.name}{_T})", "entries behind", "short"),
                    Target(f"max by (topic) ({m.SOURCE_BACKLOG_BYTES.name}{_T})", "bytes behind", "bytes"),
                    Target(f"max by (topic) ({m.OPEN_SEGMENT_AGE.name}{_T})", "open segment age", "s"),
                    Target(f"max by (topic) ({m.ENTRIES_OFFLOADED.total}{_T})", "entries offloaded", "short"),
                    Target(f"max by (topic) ({m.BYTES_OFFLOADED.total}{_T})", "entry bytes offloaded", "bytes"),
                    Target(f"max by (topic) ({m.STORED_BYTES.name}{_T})", "stored bytes", "bytes"),
                    Target(f"sum by (topic) ({m.SEGMENTS_SEALED.total}{_T})", "segments sealed", "short"),
                    Target(
                        f"max by (topic) ({m.LAST_OFFLOADED_PUBLISH.name}{_T}) * 1000",
                        "newest offloaded entry",
                        "dateTimeAsIso",
                    ),
                    Target(f"max by (topic) ({m.TOPIC_FAILURES_IN_A_ROW.name}{_T})", "failures in a row", "short"),
                    Target(f"max by (topic) ({m.TOPIC_SET_ASIDE.name}{_T})", "set aside", "bool_yes_no"),
                    kind="table",
                    width=24,
                    height=9,
                ),
            ),
        ),
        RowSpec(
            "Throughput",
            (
                _p(
                    "Entries offloaded / s",
                    "Entries committed to Offloaded segments per second, per namespace.",
                    Target(
                        f"sum by (namespace) (rate({m.NAMESPACE_ENTRIES_OFFLOADED.total}{_N}[{_RI}]))", "{{namespace}}"
                    ),
                    unit="ops",
                    stack=True,
                ),
                _p(
                    "Bytes offloaded / s",
                    "Bytes of Pulsar entries committed to Offloaded segments per second, per namespace.",
                    Target(
                        f"sum by (namespace) (rate({m.NAMESPACE_BYTES_OFFLOADED.total}{_N}[{_RI}]))", "{{namespace}}"
                    ),
                    unit="Bps",
                    stack=True,
                ),
                _p(
                    "Offloaded so far",
                    "Entries and entry bytes in Offloaded segments, and the data object bytes the store holds now.",
                    Target(f"sum({m.NAMESPACE_ENTRIES_OFFLOADED.total}{_N})", "entries", "short"),
                    Target(f"sum({m.NAMESPACE_BYTES_OFFLOADED.total}{_N})", "entry bytes", "bytes"),
                    Target(f"sum({m.NAMESPACE_STORED_BYTES.name}{_N})", "stored bytes", "bytes"),
                    kind="stat",
                ),
            ),
        ),
        RowSpec(
            "Segments",
            (
                _p(
                    "Segments by status",
                    "Assigned: open, being written. Offloaded: readable. Failed: retried before any new segment opens.",
                    Target(f"sum by (status) ({m.NAMESPACE_SEGMENTS.name}{_N})", "{{status}}"),
                ),
                _p(
                    "Seals by reason",
                    "Offloaded segments by what sealed them: size, time, manual (offload-now), ledger, "
                    "method-switch, end.",
                    Target(f"sum by (reason) ({m.NAMESPACE_SEGMENTS_SEALED.total}{_N})", "{{reason}}"),
                    kind="bargauge",
                ),
                _p(
                    "Segment size",
                    "Data object size of offloaded segments, over every topic-partition of the job (all "
                    "namespaces: one histogram per job keeps a scrape small): median, 95th percentile (bucket "
                    "bounds) and mean.",
                    Target(_quantile(0.5, m.SEGMENT_SIZE.bucket, False, _S), "p50"),
                    Target(_quantile(0.95, m.SEGMENT_SIZE.bucket, False, _S), "p95"),
                    Target(f"sum({m.SEGMENT_SIZE.sum}{_S}) / sum({m.SEGMENT_SIZE.count}{_S})", "mean"),
                    unit="bytes",
                ),
            ),
        ),
        RowSpec(
            "Errors and uploads",
            (
                _p(
                    "Errors",
                    "Failed sink actions, failed queries (restarted from the checkpoint), Failed segments, and "
                    "whether the store's metadata could be read (1 = yes).",
                    Target(f"sum(increase({m.UPLOAD_ERRORS.total}{_S}[{_RI}]))", "upload errors"),
                    Target(f"sum(increase({m.QUERY_FAILURES.total}{_S}[{_RI}]))", "query failures"),
                    Target(f"sum({m.NAMESPACE_SEGMENTS.name}{failed})", "failed segments"),
                    Target(f"min({m.METADATA_REFRESH_OK.name}{_S})", "metadata readable", "bool_yes_no"),
                ),
                _p(
                    "Upload latency",
                    "Time to upload a part or to seal a segment (complete the data object, put the index and "
                    "manifest).",
                    Target(_quantile(0.5, m.UPLOAD_DURATION.bucket, selector=_S), "p50"),
                    Target(_quantile(0.99, m.UPLOAD_DURATION.bucket, selector=_S), "p99"),
                    unit="s",
                ),
                _p(
                    "Upload rate",
                    "Multipart parts uploaded per second (right axis) and their bytes per second (left axis).",
                    Target(f"sum(rate({m.PART_BYTES_UPLOADED.total}{_S}[{_RI}]))", "part bytes/s"),
                    Target(f"sum(rate({m.PARTS_UPLOADED.total}{_S}[{_RI}]))", "parts/s", "reqps", right_axis=True),
                    unit="Bps",
                ),
                _p(
                    "Throttled by rate limits",
                    "Seconds per second the sink's tasks waited for the offload policy's rate limits "
                    '(offload*RateBytesPerSecond; docs/DESIGN.md "Rate limits"), by kind: upload (parts to the '
                    "store) and read (re-reads from the broker). Summed over tasks: 200% means two tasks waited "
                    "all the time. Lag while this is high is the configured limit at work "
                    "(StreamoffloadLagHighRateLimited), not a fault.",
                    Target(f"sum by (kind) (rate({m.THROTTLED_SECONDS.total}{_S}[{_RI}]))", "{{kind}}"),
                    unit="percentunit",
                ),
            ),
        ),
        RowSpec(
            "Health",
            (
                _p(
                    "Broker unreachable",
                    "Yes while the job's Pulsar broker does not answer: the job keeps retrying with capped backoff "
                    "(StreamoffloadBrokerUnreachable; docs/RUNBOOK.md).",
                    Target(f"max({m.BROKER_UNREACHABLE.name}{_S})", "broker unreachable", "bool_yes_no"),
                    kind="stat",
                    width=6,
                    thresholds=(1, 1),
                    value_texts=(("0", "No", "green"), ("1", "Yes", "red")),
                ),
                _p(
                    "Query restarts",
                    "Runs the job started again after a failure of its query or of a run's start, per interval "
                    "(each also marks the graphs: the annotation 'Query restarts'). Several in a row are a restart "
                    "loop (StreamoffloadRestartLoop).",
                    Target(f"sum(increase({m.QUERY_RESTARTS.total}{_S}[{_RI}]))", "restarts"),
                    width=6,
                ),
                _p(
                    "Set aside and failing",
                    "Topic-partitions set aside (paused after failing again and again, retried after a backoff) "
                    "and the most offload failures in a row of one topic-partition since its last committed "
                    "segment; the table above names them." + _ABSENT_IS_NONE + TOP_N,
                    Target(f"count({m.TOPIC_SET_ASIDE.name}{_T} > 0) or vector(0)", "set aside"),
                    Target(f"max({m.TOPIC_FAILURES_IN_A_ROW.name}{_T}) or vector(0)", "most failures in a row"),
                    width=6,
                ),
                _p(
                    "Read cache",
                    "Hits and misses per second of the read path's shared chunk cache in this process (0 while no "
                    "reader runs here).",
                    Target(f"sum(rate({m.READ_CACHE_HITS.total}{_S}[{_RI}]))", "hits"),
                    Target(f"sum(rate({m.READ_CACHE_MISSES.total}{_S}[{_RI}]))", "misses"),
                    unit="ops",
                    width=6,
                ),
            ),
        ),
        RowSpec(
            "Buffer",
            (
                _p(
                    "Offload buffer",
                    "Bytes accepted but not yet uploaded: per namespace (all its topic-partitions) and per "
                    "topic-partition (the PIP-76 buffer, bounded by offloadBufferMaxBytes; at the bound the job "
                    "stops reading that topic-partition)." + TOP_N,
                    Target(f"sum by (namespace) ({m.NAMESPACE_OFFLOAD_BUFFER.name}{_N})", "{{namespace}} (all)"),
                    Target(f"sum by (topic) ({m.OFFLOAD_BUFFER.name}{_T})", "{{topic}}"),
                    unit="bytes",
                    width=12,
                ),
                _p(
                    "Open segment size",
                    "Bytes (left axis) and entries (right axis) assigned to open segments: per namespace, and the "
                    "open segment of the worst topic-partitions." + TOP_N,
                    Target(f"sum by (namespace) ({m.NAMESPACE_OPEN_SEGMENT_BYTES.name}{_N})", "{{namespace}} bytes"),
                    Target(
                        f"sum by (namespace) ({m.NAMESPACE_OPEN_SEGMENT_ENTRIES.name}{_N})",
                        "{{namespace}} entries",
                        "short",
                        right_axis=True,
                    ),
                    Target(f"sum by (topic) ({m.OPEN_SEGMENT_BYTES.name}{_T})", "{{topic}} bytes"),
                    Target(
                        f"sum by (topic) ({m.OPEN_SEGMENT_ENTRIES.name}{_T})",
                        "{{topic}} entries",
                        "short",
                        right_axis=True,
                    ),
                    unit="bytes",
                    width=12,
                ),
            ),
        ),
        RowSpec(
            "Spark micro-batches",
            (
                _p(
                    "Micro-batch duration",
                    "Spark's triggerExecution time per micro-batch, and the sink's share (foreachBatch).",
                    Target(_quantile(0.5, m.BATCH_DURATION.bucket, selector=_S), "batch p50"),
                    Target(_quantile(0.95, m.BATCH_DURATION.bucket, selector=_S), "batch p95"),
                    Target(_quantile(0.95, m.SINK_DURATION.bucket, selector=_S), "sink p95"),
                    unit="s",
                ),
                _p(
                    "Input rate",
                    "Rows (entries and control requests) per second: Spark's input and processing rates of the "
                    "last micro-batch, and the rate averaged over the interval.",
                    Target(f"sum({m.INPUT_RATE.name}{_S})", "input rows/s (last batch)"),
                    Target(f"sum({m.PROCESSED_RATE.name}{_S})", "processed rows/s (last batch)"),
                    Target(f"sum(rate({m.INPUT_ROWS.total}{_S}[{_RI}]))", "input rows/s"),
                    unit="rowsps",
                ),
                _p(
                    "Since the last micro-batch",
                    "Seconds since the sink last finished a micro-batch: a stuck job grows here.",
                    Target(f"time() - max({m.LAST_BATCH_TIME.name}{_S})", "seconds"),
                    unit="s",
                    kind="stat",
                    thresholds=(STALE_BATCH_WARN_S, STALE_BATCH_CRIT_S),
                ),
            ),
        ),
        RowSpec(
            "Iceberg tables",
            (
                _p(
                    "Table lag",
                    "Offloaded segments (left axis) and their entries (right axis) each table did not hold after the "
                    "job's last sync of it (topics whose policy has offloadTable on); the job syncs a table at most "
                    "once per [table] commit_interval.",
                    Target(f"max by (table) ({m.TABLE_LAG_SEGMENTS.name}{_S})", "{{table}} segments"),
                    Target(f"max by (table) ({m.TABLE_LAG_ENTRIES.name}{_S})", "{{table}} entries", "short", True),
                ),
                _p(
                    "Table rows appended / s",
                    "Messages the job appended to each table per second (left axis), and the bytes of their Parquet "
                    "files (right axis).",
                    Target(f"sum by (table) (rate({m.TABLE_ROWS_APPENDED.total}{_S}[{_RI}]))", "{{table}} rows/s"),
                    Target(
                        f"sum by (table) (rate({m.TABLE_BYTES_APPENDED.total}{_S}[{_RI}]))",
                        "{{table}} bytes/s",
                        "Bps",
                        True,
                    ),
                    unit="rowsps",
                ),
                _p(
                    "Table commits and failures",
                    "Iceberg commits per table, failed syncs (retried at the next interval; nothing is appended "
                    "twice), and seconds since each table's last commit (right axis).",
                    Target(f"sum by (table) (increase({m.TABLE_COMMITS.total}{_S}[{_RI}]))", "{{table}} commits"),
                    Target(
                        f"sum by (table) (increase({m.TABLE_COMMIT_FAILURES.total}{_S}[{_RI}]))", "{{table}} failures"
                    ),
                    Target(
                        f"time() - max by (table) ({m.TABLE_LAST_COMMIT.name}{_S})",
                        "{{table}} since last commit",
                        "s",
                        True,
                    ),
                ),
            ),
        ),
    ]
    return rows


def annotation_specs() -> list[AnnotationSpec]:
    """Events drawn on every graph: query restarts and offload policy changes."""
    restarts = m.QUERY_RESTARTS.total
    policy = m.POLICY_EFFECTIVE_TIME.name
    return [
        AnnotationSpec(
            "Query restarts",
            f"increase({restarts}{_S}[1m]) > 0",
            "red",
            "query restarted",
            "{{instance}}: the job started its run again after a failure (streamoffload_query_restarts_total)",
        ),
        AnnotationSpec(
            "Policy changes",
            # A change of the newest version's effective time, not the first sample of a new process (from 0).
            f"(changes({policy}{_S}[1m]) > 0) and (min_over_time({policy}{_S}[1m]) > 0)",
            "blue",
            "offload policy changed",
            "{{instance}}: a new offload policy version is in force (the configuration file was edited)",
        ),
    ]


_SAMPLE_SUFFIXES = ("_total", "_bucket", "_sum", "_count")


def families_of(expr: str) -> set[str]:
    """The exported families (``definitions.METRICS``) a PromQL expression reads."""
    out: set[str] = set()
    for name in re.findall(r"\b(streamoffload_\w+)", expr):
        if name in m.METRICS:
            out.add(name)
            continue
        for suffix in _SAMPLE_SUFFIXES:
            if name.endswith(suffix) and name[: -len(suffix)] in m.METRICS:
                out.add(name[: -len(suffix)])
    return out


def _unit_of_name(name: str) -> str:
    if name.endswith("_bytes") or "_bytes_" in name or name.endswith("_bytes_offloaded"):
        return "bytes"
    if name.endswith("_seconds"):
        return "s"
    return "short"


def _selector(defn: m.MetricDef) -> str:
    if "topic" in defn.labels:
        return _T
    if "namespace" in defn.labels:
        return _N
    return _S


def derived_panel(defn: m.MetricDef) -> PanelSpec:
    """A panel for a family from its definition alone: a counter's rate, a gauge's value (a timestamp's age),
    a histogram's median and 95th percentile; by its labels, in the unit its name says."""
    short = defn.name.removeprefix(m.PREFIX + "_")
    title = short.replace("_", " ")
    sel = _selector(defn)
    by = f" by ({', '.join(defn.labels)})" if defn.labels else ""
    legend = " ".join("{{" + label + "}}" for label in defn.labels) or title
    description = defn.help + (TOP_N if "topic" in defn.labels else "")
    unit = _unit_of_name(defn.name)
    if defn.kind == "counter":
        rate_unit = {"bytes": "Bps", "s": "percentunit"}.get(_unit_of_name(defn.name.removesuffix("_total")), "ops")
        expr = f"sum{by} (rate({defn.total}{sel}[{_RI}]))"
        return _p(f"{title} / s", description, Target(expr, legend), unit=rate_unit)
    if defn.kind == "histogram":
        bucket = f"rate({defn.bucket}{sel}[{_RI}])"
        keep = ", ".join(("le", *defn.labels))
        return _p(
            title,
            description,
            *(
                Target(f"histogram_quantile({q}, sum by ({keep}) ({bucket}))", f"p{round(q * 100)} {legend}")
                for q in (0.5, 0.95)
            ),
            unit=unit,
        )
    if defn.name.endswith("_timestamp_seconds"):
        since = "since " + title.removesuffix(" timestamp seconds")
        return _p(since, description, Target(f"time() - max{by} ({defn.name}{sel})", legend), unit="s")
    return _p(title, description, Target(f"max{by} ({defn.name}{sel})", legend), unit=unit)


def dashboard_rows() -> list[RowSpec]:
    """The curated rows, and a panel derived from its definition for every family none of them queries."""
    rows = curated_rows()
    covered = {f for row in rows for p in row.panels for t in p.targets for f in families_of(t.expr)}
    missing = [defn for name, defn in m.METRICS.items() if name not in covered]
    if missing:
        rows.append(RowSpec(DERIVED_ROW, tuple(derived_panel(defn) for defn in missing)))
    return rows


# -- building with grafana-foundation-sdk ---------------------------------------------------------------------


def _check_sdk() -> None:
    try:
        import grafana_foundation_sdk  # noqa: F401
    except ImportError:
        raise DashboardBuildError(
            "the dashboard is built with grafana-foundation-sdk, which is not installed: "
            "pip install 'streamoffload[dashboard]'"
        ) from None


def dashboard_model() -> Dashboard:
    """The dashboard as the SDK's model (``uid`` :data:`DASHBOARD_UID`), built by its builders."""
    _check_sdk()
    from grafana_foundation_sdk.builders import dashboard as db
    from grafana_foundation_sdk.models import dashboard as dm

    ds = dm.DataSourceRef(type_val=DATASOURCE["type"], uid=DATASOURCE["uid"])
    builder = (
        db.Dashboard(DASHBOARD_TITLE)
        .uid(DASHBOARD_UID)
        .description(f"Streaming offload of Pulsar topics to object storage (streamoffload {__version__}).")
        .tags(["streamoffload", "pulsar", "offload"])
        .timezone("browser")
        .editable()
        .tooltip(dm.DashboardCursorSync.CROSSHAIR)
        .refresh("30s")
        .time("now-1h", "now")
        .with_variable(db.DatasourceVariable("datasource").label("Data source").type("prometheus"))
        .with_variable(_query_variable("job", "Job", JOB_VARIABLE_QUERY, ds))
        .with_variable(_query_variable("instance", "Instance", INSTANCE_VARIABLE_QUERY, ds))
        .with_variable(_query_variable("namespace", "Namespace", NAMESPACE_VARIABLE_QUERY, ds))
        .with_variable(_query_variable("topic", "Topic-partition", TOPIC_VARIABLE_QUERY, ds))
        .annotation(
            db.AnnotationQuery()
            .name("Annotations & Alerts")
            .datasource(dm.DataSourceRef(type_val="grafana", uid="-- Grafana --"))
            .built_in(1)
            .enable(True)
            .hide(True)
            .icon_color("rgba(0, 211, 255, 1)")
            .type("dashboard")
        )
    )
    for note in annotation_specs():
        builder = builder.annotation(_prom_annotation(note, ds))
    panel_id, y = 1, 0
    for row in dashboard_rows():
        builder = builder.with_row(db.Row(row.title).id(panel_id).grid_pos(dm.GridPos(h=1, w=24, x=0, y=y)))
        panel_id, y = panel_id + 1, y + 1
        x, height = 0, 0
        for spec in row.panels:
            if x + spec.width > 24:
                x, y, height = 0, y + height, 0
            grid = dm.GridPos(h=spec.height, w=spec.width, x=x, y=y)
            builder = builder.with_panel(_panel(spec, panel_id, grid, ds))
            panel_id, x, height = panel_id + 1, x + spec.width, max(height, spec.height)
        y += height
    return builder.build()


def build_dashboard() -> dict[str, Any]:
    """The dashboard model as JSON-able data, ready for ``POST /api/dashboards/db`` or provisioning."""
    model = dashboard_model()
    from grafana_foundation_sdk.cog.encoder import JSONEncoder

    data: dict[str, Any] = json.loads(JSONEncoder().encode(model))
    return data


def _prom_annotation(note: AnnotationSpec, ds: DataSourceRef) -> Builder[AnnotationQuery]:
    """A builder of a Prometheus annotation query with its title and text formats, which the SDK's
    ``AnnotationQuery`` model (Grafana's generic one) has no fields for."""
    from grafana_foundation_sdk.cog.builder import Builder
    from grafana_foundation_sdk.models import dashboard as dm

    class Query(dm.AnnotationQuery):
        def to_json(self) -> dict[str, object]:
            payload = super().to_json()
            payload.update({"titleFormat": note.title, "textFormat": note.text, "step": "1m"})
            return payload

    class QueryBuilder(Builder[dm.AnnotationQuery]):
        def build(self) -> dm.AnnotationQuery:
            return Query(name=note.name, datasource=ds, enable=True, hide=False, icon_color=note.color, expr=note.expr)

    return QueryBuilder()


def _query_variable(name: str, label: str, query: str, ds: DataSourceRef) -> Builder[VariableModel]:
    """A multi-select query variable whose "All" matches everything (``.*``)."""
    from grafana_foundation_sdk.builders import dashboard as db
    from grafana_foundation_sdk.models import dashboard as dm

    return (
        db.QueryVariable(name)
        .label(label)
        .datasource(ds)
        .query({"query": query, "refId": "PrometheusVariableQueryEditor-VariableQuery"})
        .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .include_all(True)
        .multi(True)
        .all_value(VARIABLE_ALL_VALUES[name])
        .sort(dm.VariableSort.ALPHABETICAL_ASC)
        .current(dm.VariableOption(selected=True, text=["All"], value=["$__all"]))
    )


def _panel(spec: PanelSpec, panel_id: int, grid: GridPos | None, ds: DataSourceRef) -> Builder[Panel]:
    from grafana_foundation_sdk.builders import bargauge, common, prometheus, stat, table, timeseries
    from grafana_foundation_sdk.builders import dashboard as db
    from grafana_foundation_sdk.models import common as cm
    from grafana_foundation_sdk.models import dashboard as dm

    builder: Any
    if spec.kind == "timeseries":
        builder = (
            timeseries.Panel()
            .draw_style(cm.GraphDrawStyle.LINE)
            .line_width(1)
            .fill_opacity(10)
            .show_points(cm.VisibilityMode.NEVER)
            .span_nulls(True)
            .stacking(common.StackingConfig().mode(cm.StackingMode.NORMAL if spec.stack else cm.StackingMode.NONE))
            .thresholds_style(
                common.GraphThresholdsStyleConfig().mode(
                    cm.GraphThresholdsStyleMode.DASHED if spec.thresholds else cm.GraphThresholdsStyleMode.OFF
                )
            )
            .legend(
                common.VizLegendOptions()
                .display_mode(cm.LegendDisplayMode.LIST)
                .placement(cm.LegendPlacement.BOTTOM)
                .show_legend(True)
            )
            .tooltip(common.VizTooltipOptions().mode(cm.TooltipDisplayMode.MULTI).sort(cm.SortOrder.NONE))
        )
    elif spec.kind == "stat":
        builder = (
            stat.Panel()
            .reduce_options(common.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
            .text_mode(cm.BigValueTextMode.VALUE_AND_NAME if len(spec.targets) > 1 else cm.BigValueTextMode.AUTO)
            .color_mode(cm.BigValueColorMode.BACKGROUND if spec.thresholds else cm.BigValueColorMode.NONE)
            .graph_mode(cm.BigValueGraphMode.NONE)
        )
    elif spec.kind == "bargauge":
        builder = (
            bargauge.Panel()
            .reduce_options(common.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
            .orientation(cm.VizOrientation.HORIZONTAL)
            .display_mode(cm.BarGaugeDisplayMode.BASIC)
        )
    else:
        builder = (
            table.Panel()
            .with_transformation(dm.DataTransformerConfig(id_val="merge", options={}))
            .with_transformation(
                dm.DataTransformerConfig(
                    id_val="organize",
                    options={
                        "excludeByName": {"Time": True},
                        "renameByName": {
                            f"Value #{_ref_id(i)}": t.legend for i, t in enumerate(spec.targets) if t.legend
                        },
                    },
                )
            )
            .sort_by([common.TableSortByFieldState().display_name(spec.targets[0].legend).desc(True)])
            .align(cm.FieldTextAlignment.AUTO)
            .inspect(False)
        )
    builder = (
        builder.id(panel_id)
        .title(spec.title)
        .description(spec.description)
        .datasource(ds)
        .grid_pos(grid)
        .height(spec.height)  # the SDK checks the size: 0 < h, 0 < w <= 24
        .span(spec.width)
        .unit(spec.unit)
    )
    if spec.thresholds is not None:
        warn, crit = spec.thresholds
        steps = [dm.Threshold(color="green", value=None)]
        steps += [dm.Threshold(color="orange", value=warn)] if warn < crit else []
        steps.append(dm.Threshold(color="red", value=crit))
        builder = builder.thresholds(db.ThresholdsConfig().mode(dm.ThresholdsMode.ABSOLUTE).steps(steps))
    if spec.value_texts:
        builder = builder.mappings(
            [
                dm.ValueMap(
                    options={
                        value: dm.ValueMappingResult(text=text, color=color, index=i)
                        for i, (value, text, color) in enumerate(spec.value_texts)
                    }
                )
            ]
        )
    for i, target in enumerate(spec.targets):
        query = prometheus.Dataquery().expr(target.expr).ref_id(_ref_id(i)).datasource(ds)
        if spec.kind == "table":
            query = query.instant().format(_table_format()).legend_format(target.legend)
        else:
            query = query.range().legend_format(target.legend or "__auto")
        builder = builder.with_target(query)
        if target.unit is None and not target.right_axis:
            continue
        properties = [dm.DynamicConfigValue(id_val="unit", value=target.unit or spec.unit)]
        if target.right_axis:
            properties.append(dm.DynamicConfigValue(id_val="custom.axisPlacement", value="right"))
        if spec.kind == "table":  # after the merge, a column is known by its name
            builder = builder.override_by_name(target.legend, properties)
        else:
            builder = builder.override_by_query(_ref_id(i), properties)
    built: Builder[Panel] = builder
    return built


def _table_format() -> PromQueryFormat:
    from grafana_foundation_sdk.models import prometheus as pm

    return pm.PromQueryFormat.TABLE


def _ref_id(i: int) -> str:
    return chr(ord("A") + i)


def expressions(dashboard: dict[str, Any]) -> list[str]:
    """Every PromQL expression of the dashboard's panels (rows included)."""
    out: list[str] = []

    def walk(panels: list[dict[str, Any]]) -> None:
        for panel in panels:
            out.extend(t["expr"] for t in panel.get("targets", []) if t.get("expr"))
            walk(panel.get("panels", []))

    walk(dashboard["panels"])
    return out


def annotation_expressions(dashboard: dict[str, Any]) -> list[str]:
    """The PromQL expressions of the dashboard's Prometheus annotations."""
    return [a["expr"] for a in dashboard["annotations"]["list"] if a.get("expr")]


def substitute_variables(expr: str, variables: dict[str, str]) -> str:
    """``$name`` / ``${name}`` replaced as Grafana would (longest names first, so $__rate_interval wins). The
    dashboard's query variables not in ``variables`` take their "All" value (:data:`VARIABLE_ALL_VALUES`)."""
    variables = {**VARIABLE_ALL_VALUES, **variables}
    for name in sorted(variables, key=len, reverse=True):
        expr = re.sub(r"\$\{" + re.escape(name) + r"\}|\$" + re.escape(name) + r"\b", variables[name], expr)
    return expr
