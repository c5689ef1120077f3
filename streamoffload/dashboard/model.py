"""The dashboard model: panels and template variables over the metric definitions of
``streamoffload.metrics.definitions``, laid out on Grafana's 24-unit grid."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from streamoffload import __version__
from streamoffload.metrics import definitions as m

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

_DS = {"type": "prometheus", "uid": "${datasource}"}
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


@dataclass(frozen=True)
class Target:
    expr: str
    legend: str = ""


class _Layout:
    """Places panels left to right in rows of 24 grid units."""

    def __init__(self) -> None:
        self.panels: list[dict[str, Any]] = []
        self.y = 0
        self.x = 0
        self.row_height = 0
        self.next_id = 1

    def _id(self) -> int:
        self.next_id += 1
        return self.next_id - 1

    def row(self, title: str) -> None:
        self.y += self.row_height
        self.x, self.row_height = 0, 0
        self.panels.append(
            {
                "id": self._id(),
                "type": "row",
                "title": title,
                "collapsed": False,
                "gridPos": {"h": 1, "w": 24, "x": 0, "y": self.y},
                "panels": [],
            }
        )
        self.y += 1

    def panel(
        self,
        title: str,
        description: str,
        targets: list[Target],
        *,
        unit: str = "short",
        kind: str = "timeseries",
        width: int = 8,
        height: int = 8,
        stack: bool = False,
        options: dict[str, Any] | None = None,
        thresholds: tuple[float, float] | None = None,
        overrides: list[dict[str, Any]] | None = None,
    ) -> None:
        if self.x + width > 24:
            self.y += self.row_height
            self.x, self.row_height = 0, 0
        defaults: dict[str, Any] = {"unit": unit}
        if thresholds is not None:
            warn, crit = thresholds
            defaults["thresholds"] = {
                "mode": "absolute",
                "steps": [
                    {"color": "green", "value": None},
                    {"color": "orange", "value": warn},
                    {"color": "red", "value": crit},
                ],
            }
        if kind == "timeseries":
            defaults["custom"] = {
                "drawStyle": "line",
                "lineWidth": 1,
                "fillOpacity": 10,
                "showPoints": "never",
                "spanNulls": True,
                "stacking": {"mode": "normal" if stack else "none", "group": "A"},
                # Thresholds show as dashed lines on graphs that have them.
                "thresholdsStyle": {"mode": "dashed" if thresholds is not None else "off"},
            }
        panel_options: dict[str, Any] = (
            {"legend": {"displayMode": "list", "placement": "bottom", "showLegend": True}, "tooltip": {"mode": "multi"}}
            if kind == "timeseries"
            else {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False}}
        )
        panel_options.update(options or {})
        self.panels.append(
            {
                "id": self._id(),
                "type": kind,
                "title": title,
                "description": description,
                "datasource": dict(_DS),
                "gridPos": {"h": height, "w": width, "x": self.x, "y": self.y},
                "targets": [
                    {
                        "refId": chr(ord("A") + i),
                        "datasource": dict(_DS),
                        "expr": t.expr,
                        "legendFormat": t.legend or "__auto",
                        "range": True,
                    }
                    for i, t in enumerate(targets)
                ],
                "fieldConfig": {"defaults": defaults, "overrides": list(overrides or [])},
                "options": panel_options,
            }
        )
        self.x += width
        self.row_height = max(self.row_height, height)


def _unit_override(ref_id: str, unit: str, *, right_axis: bool = False) -> dict[str, Any]:
    """A field override giving the series of query ``ref_id`` its own unit (and, on a graph, the right axis)."""
    properties: list[dict[str, Any]] = [{"id": "unit", "value": unit}]
    if right_axis:
        properties.append({"id": "custom.axisPlacement", "value": "right"})
    return {"matcher": {"id": "byFrameRefID", "options": ref_id}, "properties": properties}


def _quantile(q: float, bucket: str, by_rate: bool = True, selector: str = "") -> str:
    series = f"{bucket}{selector}"
    inner = f"rate({series}[{_RI}])" if by_rate else series
    return f"histogram_quantile({q}, sum by (le) ({inner}))"


def build_dashboard() -> dict[str, Any]:
    """The dashboard model (``uid`` :data:`DASHBOARD_UID`), ready for ``POST /api/dashboards/db`` or provisioning."""
    lay = _Layout()

    lay.row("Lag")
    lay.panel(
        "Offload lag by namespace",
        "The largest offload lag of each namespace's topic-partitions: 0 when every published entry is in an "
        "Offloaded (readable) segment; else now minus the publish time of the newest offloaded entry. Bounded "
        "by maxOffloadSegmentRolloverTimeMinutes when the job keeps up.",
        [Target(f"max by (namespace) ({m.NAMESPACE_MAX_OFFLOAD_LAG.name}{_N})", "{{namespace}}")],
        unit="s",
        thresholds=(LAG_WARN_S, LAG_CRIT_S),
    )
    lay.panel(
        "Offload lag",
        "Offload lag of the worst topic-partitions: 0 when every published entry is in an Offloaded (readable) "
        "segment; else now minus the publish time of the newest offloaded entry." + TOP_N,
        [Target(f"max by (topic) ({m.OFFLOAD_LAG.name}{_T})", "{{topic}}")],
        unit="s",
        thresholds=(LAG_WARN_S, LAG_CRIT_S),
    )
    lay.panel(
        "Open segment age",
        "Age of the open (Assigned or Failed) segment of the worst topic-partitions; a time rollover seals it at "
        "the configured rollover time." + TOP_N,
        [Target(f"max by (topic) ({m.OPEN_SEGMENT_AGE.name}{_T})", "{{topic}}")],
        unit="s",
        thresholds=(LAG_WARN_S, LAG_CRIT_S),
    )
    lay.panel(
        "Entries behind the latest position",
        "Entries published but not yet offloaded, per namespace (summed over the topic-partitions where the "
        "count is exact).",
        [Target(f"sum by (namespace) ({m.NAMESPACE_BACKLOG_ENTRIES.name}{_N})", "{{namespace}}")],
        width=12,
    )
    lay.panel(
        "Topic-partitions",
        "Topic-partitions the job knows per namespace, those failing (failures since their last commit, or a "
        "Failed segment), those with per-topic series ([metrics] topic_series), and how many were left out of "
        "the per-topic series.",
        [
            Target(f"sum by (namespace) ({m.NAMESPACE_TOPICS.name}{_N})", "{{namespace}}"),
            Target(f"sum by (namespace) ({m.NAMESPACE_TOPICS_FAILING.name}{_N})", "{{namespace}} failing"),
            Target(f"sum by (namespace) ({m.NAMESPACE_TOPICS_EXPORTED.name}{_N})", "{{namespace}} per-topic series"),
            Target(f"sum({m.TOPIC_SERIES_OMITTED.name}{_S})", "left out of per-topic series"),
        ],
        width=12,
    )

    lay.row("Throughput")
    lay.panel(
        "Entries offloaded / s",
        "Entries committed to Offloaded segments per second, per namespace.",
        [Target(f"sum by (namespace) (rate({m.NAMESPACE_ENTRIES_OFFLOADED.total}{_N}[{_RI}]))", "{{namespace}}")],
        unit="ops",
        stack=True,
    )
    lay.panel(
        "Bytes offloaded / s",
        "Bytes of Pulsar entries committed to Offloaded segments per second, per namespace.",
        [Target(f"sum by (namespace) (rate({m.NAMESPACE_BYTES_OFFLOADED.total}{_N}[{_RI}]))", "{{namespace}}")],
        unit="Bps",
        stack=True,
    )
    lay.panel(
        "Offloaded so far",
        "Entries and entry bytes in Offloaded segments, and the data object bytes the store holds now.",
        [
            Target(f"sum({m.NAMESPACE_ENTRIES_OFFLOADED.total}{_N})", "entries"),
            Target(f"sum({m.NAMESPACE_BYTES_OFFLOADED.total}{_N})", "entry bytes"),
            Target(f"sum({m.NAMESPACE_STORED_BYTES.name}{_N})", "stored bytes"),
        ],
        kind="stat",
        options={"textMode": "value_and_name", "colorMode": "none"},
        overrides=[_unit_override("A", "short"), _unit_override("B", "bytes"), _unit_override("C", "bytes")],
    )

    lay.row("Segments")
    lay.panel(
        "Segments by status",
        "Assigned: open, being written. Offloaded: readable. Failed: retried before any new segment opens.",
        [Target(f"sum by (status) ({m.NAMESPACE_SEGMENTS.name}{_N})", "{{status}}")],
    )
    lay.panel(
        "Seals by reason",
        "Offloaded segments by what sealed them: size, time, manual (offload-now), ledger, method-switch, end.",
        [Target(f"sum by (reason) ({m.NAMESPACE_SEGMENTS_SEALED.total}{_N})", "{{reason}}")],
        kind="bargauge",
        options={"orientation": "horizontal", "displayMode": "basic"},
    )
    lay.panel(
        "Segment size",
        "Data object size of offloaded segments, over every topic-partition of the job (all namespaces: one "
        "histogram per job keeps a scrape small): median, 95th percentile (bucket bounds) and mean.",
        [
            Target(_quantile(0.5, m.SEGMENT_SIZE.bucket, False, _S), "p50"),
            Target(_quantile(0.95, m.SEGMENT_SIZE.bucket, False, _S), "p95"),
            Target(f"sum({m.SEGMENT_SIZE.sum}{_S}) / sum({m.SEGMENT_SIZE.count}{_S})", "mean"),
        ],
        unit="bytes",
    )

    lay.row("Errors and uploads")
    lay.panel(
        "Errors",
        "Failed sink actions, failed queries (restarted from the checkpoint), Failed segments, and whether "
        "the store's metadata could be read (1 = yes).",
        [
            Target(f"sum(increase({m.UPLOAD_ERRORS.total}{_S}[{_RI}]))", "upload errors"),
            Target(f"sum(increase({m.QUERY_FAILURES.total}{_S}[{_RI}]))", "query failures"),
            Target(f'sum({m.NAMESPACE_SEGMENTS.name}{{{_N[1:-1]},status="Failed"}})', "failed segments"),
            Target(f"min({m.METADATA_REFRESH_OK.name}{_S})", "metadata readable"),
        ],
        overrides=[_unit_override("D", "bool_yes_no")],
    )
    lay.panel(
        "Upload latency",
        "Time to upload a part or to seal a segment (complete the data object, put the index and manifest).",
        [
            Target(_quantile(0.5, m.UPLOAD_DURATION.bucket, selector=_S), "p50"),
            Target(_quantile(0.99, m.UPLOAD_DURATION.bucket, selector=_S), "p99"),
        ],
        unit="s",
    )
    lay.panel(
        "Upload rate",
        "Multipart parts uploaded per second (right axis) and their bytes per second (left axis).",
        [
            Target(f"sum(rate({m.PART_BYTES_UPLOADED.total}{_S}[{_RI}]))", "part bytes/s"),
            Target(f"sum(rate({m.PARTS_UPLOADED.total}{_S}[{_RI}]))", "parts/s"),
        ],
        unit="Bps",
        overrides=[_unit_override("B", "reqps", right_axis=True)],
    )
    lay.panel(
        "Throttled by rate limits",
        "Seconds per second the sink's tasks waited for the offload policy's rate limits "
        '(offload*RateBytesPerSecond; docs/DESIGN.md "Rate limits"), by kind: upload (parts to the store) and '
        "read (re-reads from the broker). Summed over tasks: 200% means two tasks waited all the time. Lag "
        "while this is high is the configured limit at work (StreamoffloadLagHighRateLimited), not a fault.",
        [Target(f"sum by (kind) (rate({m.THROTTLED_SECONDS.total}{_S}[{_RI}]))", "{{kind}}")],
        unit="percentunit",
    )

    lay.row("Buffer")
    lay.panel(
        "Offload buffer",
        "Bytes accepted but not yet uploaded: per namespace (all its topic-partitions) and per topic-partition "
        "(the PIP-76 buffer, bounded by offloadBufferMaxBytes; at the bound the job stops reading that "
        "topic-partition)." + TOP_N,
        [
            Target(f"sum by (namespace) ({m.NAMESPACE_OFFLOAD_BUFFER.name}{_N})", "{{namespace}} (all)"),
            Target(f"sum by (topic) ({m.OFFLOAD_BUFFER.name}{_T})", "{{topic}}"),
        ],
        unit="bytes",
        width=12,
    )
    lay.panel(
        "Open segment size",
        "Bytes (left axis) and entries (right axis) assigned to the open segment of the worst topic-partitions."
        + TOP_N,
        [
            Target(f"sum by (topic) ({m.OPEN_SEGMENT_BYTES.name}{_T})", "{{topic}} bytes"),
            Target(f"sum by (topic) ({m.OPEN_SEGMENT_ENTRIES.name}{_T})", "{{topic}} entries"),
        ],
        unit="bytes",
        width=12,
        overrides=[_unit_override("B", "short", right_axis=True)],
    )

    lay.row("Spark micro-batches")
    lay.panel(
        "Micro-batch duration",
        "Spark's triggerExecution time per micro-batch, and the sink's share (foreachBatch).",
        [
            Target(_quantile(0.5, m.BATCH_DURATION.bucket, selector=_S), "batch p50"),
            Target(_quantile(0.95, m.BATCH_DURATION.bucket, selector=_S), "batch p95"),
            Target(_quantile(0.95, m.SINK_DURATION.bucket, selector=_S), "sink p95"),
        ],
        unit="s",
    )
    lay.panel(
        "Input rate",
        "Rows (entries and control requests) per second: Spark's input and processing rates of the last "
        "micro-batch, and the rate averaged over the interval.",
        [
            Target(f"sum({m.INPUT_RATE.name}{_S})", "input rows/s (last batch)"),
            Target(f"sum({m.PROCESSED_RATE.name}{_S})", "processed rows/s (last batch)"),
            Target(f"sum(rate({m.INPUT_ROWS.total}{_S}[{_RI}]))", "input rows/s"),
        ],
        unit="rowsps",
    )
    lay.panel(
        "Since the last micro-batch",
        "Seconds since the sink last finished a micro-batch: a stuck job grows here.",
        [Target(f"time() - max({m.LAST_BATCH_TIME.name}{_S})", "seconds")],
        unit="s",
        kind="stat",
        thresholds=(STALE_BATCH_WARN_S, STALE_BATCH_CRIT_S),
        options={"colorMode": "background"},
    )

    lay.row("Iceberg tables")
    lay.panel(
        "Table lag",
        "Offloaded segments (left axis) and their entries (right axis) each table did not hold after the job's "
        "last sync of it (topics whose policy has offloadTable on); the job syncs a table at most once per "
        "[table] commit_interval.",
        [
            Target(f"max by (table) ({m.TABLE_LAG_SEGMENTS.name}{_S})", "{{table}} segments"),
            Target(f"max by (table) ({m.TABLE_LAG_ENTRIES.name}{_S})", "{{table}} entries"),
        ],
        overrides=[_unit_override("B", "short", right_axis=True)],
    )
    lay.panel(
        "Table rows appended / s",
        "Messages the job appended to each table per second (left axis), and the bytes of their Parquet files "
        "(right axis).",
        [
            Target(f"sum by (table) (rate({m.TABLE_ROWS_APPENDED.total}{_S}[{_RI}]))", "{{table}} rows/s"),
            Target(f"sum by (table) (rate({m.TABLE_BYTES_APPENDED.total}{_S}[{_RI}]))", "{{table}} bytes/s"),
        ],
        unit="rowsps",
        overrides=[_unit_override("B", "Bps", right_axis=True)],
    )
    lay.panel(
        "Table commits and failures",
        "Iceberg commits per table, failed syncs (retried at the next interval; nothing is appended twice), and "
        "seconds since each table's last commit (right axis).",
        [
            Target(f"sum by (table) (increase({m.TABLE_COMMITS.total}{_S}[{_RI}]))", "{{table}} commits"),
            Target(f"sum by (table) (increase({m.TABLE_COMMIT_FAILURES.total}{_S}[{_RI}]))", "{{table}} failures"),
            Target(f"time() - max by (table) ({m.TABLE_LAST_COMMIT.name}{_S})", "{{table}} since last commit"),
        ],
        overrides=[_unit_override("C", "s", right_axis=True)],
    )

    return {
        "uid": DASHBOARD_UID,
        "title": DASHBOARD_TITLE,
        "description": f"Streaming offload of Pulsar topics to object storage (streamoffload {__version__}).",
        "tags": ["streamoffload", "pulsar", "offload"],
        "timezone": "browser",
        "editable": True,
        "graphTooltip": 1,
        "schemaVersion": 39,
        "refresh": "30s",
        "time": {"from": "now-1h", "to": "now"},
        "annotations": {"list": []},
        "links": [],
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "label": "Data source",
                    "type": "datasource",
                    "query": "prometheus",
                    "refresh": 1,
                    "hide": 0,
                    "current": {},
                },
                _query_variable("job", "Job", JOB_VARIABLE_QUERY),
                _query_variable("instance", "Instance", INSTANCE_VARIABLE_QUERY),
                _query_variable("namespace", "Namespace", NAMESPACE_VARIABLE_QUERY),
                {
                    "name": "topic",
                    "label": "Topic-partition",
                    "type": "query",
                    "datasource": dict(_DS),
                    "definition": TOPIC_VARIABLE_QUERY,
                    "query": {"query": TOPIC_VARIABLE_QUERY, "refId": "PrometheusVariableQueryEditor-VariableQuery"},
                    "refresh": 2,
                    "includeAll": True,
                    "multi": True,
                    "allValue": ".*",
                    "sort": 1,
                    "hide": 0,
                    "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
                },
            ]
        },
        "panels": lay.panels,
    }


def _query_variable(name: str, label: str, query: str, *, regex: str = "") -> dict[str, Any]:
    """A multi-select query variable whose "All" matches everything (``.*``), like ``topic``."""
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": dict(_DS),
        "definition": query,
        "query": {"query": query, "refId": "PrometheusVariableQueryEditor-VariableQuery"},
        "regex": regex,
        "refresh": 2,
        "includeAll": True,
        "multi": True,
        "allValue": VARIABLE_ALL_VALUES[name],
        "sort": 1,
        "hide": 0,
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
    }


def expressions(dashboard: dict[str, Any]) -> list[str]:
    """Every PromQL expression of the dashboard's panels (rows included)."""
    out: list[str] = []

    def walk(panels: list[dict[str, Any]]) -> None:
        for panel in panels:
            out.extend(t["expr"] for t in panel.get("targets", []) if t.get("expr"))
            walk(panel.get("panels", []))

    walk(dashboard["panels"])
    return out


def substitute_variables(expr: str, variables: dict[str, str]) -> str:
    """``$name`` / ``${name}`` replaced as Grafana would (longest names first, so $__rate_interval wins). The
    dashboard's query variables not in ``variables`` take their "All" value (:data:`VARIABLE_ALL_VALUES`)."""
    variables = {**VARIABLE_ALL_VALUES, **variables}
    for name in sorted(variables, key=len, reverse=True):
        expr = re.sub(r"\$\{" + re.escape(name) + r"\}|\$" + re.escape(name) + r"\b", variables[name], expr)
    return expr
