"""The Grafana dashboard of the offload job, as code, and pushing it through Grafana's HTTP API.

:func:`build_dashboard` returns the dashboard model (JSON-able dict): panels for lag, throughput,
segments, errors, the offload buffer and Spark micro-batches over the metrics of
``streamoffload.metrics``, each series in the unit of what it counts, thresholds on the lag, open
segment age and staleness; a ``datasource`` variable (any Prometheus data source) and ``job``,
``instance``, ``namespace`` and ``topic`` variables (multi-select, "All" = ``.*``; the namespace is
the tenant/namespace part of the ``topic`` label). :func:`alert_rules` is the matching Prometheus
rule file (``dashboard export --alerts``).

:func:`push_dashboard` creates or updates it (``POST /api/dashboards/db`` with ``overwrite``) and,
if asked, a Prometheus data source (``POST /api/datasources``, or ``PUT /api/datasources/uid/<uid>``
when it exists), with the standard library's ``urllib`` (:class:`GrafanaClient`). Both are idempotent:
pushing twice leaves one dashboard and one data source.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from streamoffload import __version__
from streamoffload.errors import StreamOffloadError

DASHBOARD_UID = "streamoffload"
DASHBOARD_TITLE = "streamoffload: Pulsar offload"
DATASOURCE_UID = "streamoffload-prometheus"
DATASOURCE_NAME = "streamoffload Prometheus"
TOPIC_VARIABLE_QUERY = "label_values(streamoffload_entries_offloaded_total, topic)"
JOB_VARIABLE_QUERY = "label_values(streamoffload_build_info, job)"
INSTANCE_VARIABLE_QUERY = 'label_values(streamoffload_build_info{job=~"$job"}, instance)'
NAMESPACE_VARIABLE_QUERY = "label_values(streamoffload_entries_offloaded_total, topic)"
NAMESPACE_VARIABLE_REGEX = "/^persistent://([^/]+/[^/]+)/.*/"
"""The namespace variable's values: the tenant/namespace part of every topic label (metrics carry no namespace
label; the topic name has it)."""

VARIABLE_ALL_VALUES = {"job": ".*", "instance": ".*", "namespace": ".*", "topic": ".*"}
"""What each query variable's "All" stands for (``substitute_variables`` uses it for a variable not given)."""

_DS = {"type": "prometheus", "uid": "${datasource}"}
_J = 'job=~"$job",instance=~"$instance"'
_S = "{" + _J + "}"
_T = "{" + _J + ',topic=~"persistent://$namespace/.*",topic=~"$topic"}'
_RI = "$__rate_interval"

# Thresholds: green below, then amber, then red (Grafana "absolute" steps; the first step's value is null).
LAG_WARN_S = 2 * 600.0
"""Two default rollover times (maxOffloadSegmentRolloverTimeMinutes = 10): a job that keeps up stays below."""
LAG_CRIT_S = 3 * 600.0
STALE_BATCH_WARN_S = 300.0
STALE_BATCH_CRIT_S = 900.0


class GrafanaPushError(StreamOffloadError):
    """Grafana refused or could not be reached."""


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
        "Offload lag",
        "0 when every published entry is in an Offloaded (readable) segment; else now minus the publish time of "
        "the newest offloaded entry. Bounded by maxOffloadSegmentRolloverTimeMinutes when the job keeps up.",
        [Target(f"max by (topic) (streamoffload_offload_lag_seconds{_T})", "{{topic}}")],
        unit="s",
        thresholds=(LAG_WARN_S, LAG_CRIT_S),
    )
    lay.panel(
        "Entries behind the latest position",
        "Entries published but not yet offloaded (shown where the count is exact).",
        [Target(f"sum by (topic) (streamoffload_backlog_entries{_T})", "{{topic}}")],
    )
    lay.panel(
        "Open segment age",
        "Age of the open (Assigned or Failed) segment; a time rollover seals it at the configured rollover time.",
        [Target(f"max by (topic) (streamoffload_open_segment_age_seconds{_T})", "{{topic}}")],
        unit="s",
        thresholds=(LAG_WARN_S, LAG_CRIT_S),
    )

    lay.row("Throughput")
    lay.panel(
        "Entries offloaded / s",
        "Entries committed to Offloaded segments per second.",
        [Target(f"sum by (topic) (rate(streamoffload_entries_offloaded_total{_T}[{_RI}]))", "{{topic}}")],
        unit="ops",
        stack=True,
    )
    lay.panel(
        "Bytes offloaded / s",
        "Bytes of Pulsar entries committed to Offloaded segments per second.",
        [Target(f"sum by (topic) (rate(streamoffload_bytes_offloaded_total{_T}[{_RI}]))", "{{topic}}")],
        unit="Bps",
        stack=True,
    )
    lay.panel(
        "Offloaded so far",
        "Entries and entry bytes in Offloaded segments, and the data object bytes the store holds now.",
        [
            Target(f"sum(streamoffload_entries_offloaded_total{_T})", "entries"),
            Target(f"sum(streamoffload_bytes_offloaded_total{_T})", "entry bytes"),
            Target(f"sum(streamoffload_stored_bytes{_T})", "stored bytes"),
        ],
        kind="stat",
        options={"textMode": "value_and_name", "colorMode": "none"},
        overrides=[_unit_override("A", "short"), _unit_override("B", "bytes"), _unit_override("C", "bytes")],
    )

    lay.row("Segments")
    lay.panel(
        "Segments by status",
        "Assigned: open, being written. Offloaded: readable. Failed: retried before any new segment opens.",
        [Target(f"sum by (status) (streamoffload_segments{_T})", "{{status}}")],
    )
    lay.panel(
        "Seals by reason",
        "Offloaded segments by what sealed them: size, time, manual (offload-now), ledger, method-switch, end.",
        [Target(f"sum by (reason) (streamoffload_segments_sealed_total{_T})", "{{reason}}")],
        kind="bargauge",
        options={"orientation": "horizontal", "displayMode": "basic"},
    )
    lay.panel(
        "Segment size",
        "Data object size of offloaded segments: median, 95th percentile (bucket bounds) and mean.",
        [
            Target(_quantile(0.5, "streamoffload_segment_size_bytes_bucket", False, _T), "p50"),
            Target(_quantile(0.95, "streamoffload_segment_size_bytes_bucket", False, _T), "p95"),
            Target(
                f"sum(streamoffload_segment_size_bytes_sum{_T}) / sum(streamoffload_segment_size_bytes_count{_T})",
                "mean",
            ),
        ],
        unit="bytes",
    )

    lay.row("Errors and uploads")
    lay.panel(
        "Errors",
        "Failed sink actions, failed queries (restarted from the checkpoint), Failed segments, and whether "
        "the store's metadata could be read (1 = yes).",
        [
            Target(f"sum(increase(streamoffload_upload_errors_total{_S}[{_RI}]))", "upload errors"),
            Target(f"sum(increase(streamoffload_query_failures_total{_S}[{_RI}]))", "query failures"),
            Target(f"sum(streamoffload_segments{{{_T[1:-1]},status=\"Failed\"}})", "failed segments"),
            Target(f"min(streamoffload_metadata_refresh_ok{_S})", "metadata readable"),
        ],
        overrides=[_unit_override("D", "bool_yes_no")],
    )
    lay.panel(
        "Upload latency",
        "Time to upload a part or to seal a segment (complete the data object, put the index and manifest).",
        [
            Target(_quantile(0.5, "streamoffload_upload_duration_seconds_bucket", selector=_S), "p50"),
            Target(_quantile(0.99, "streamoffload_upload_duration_seconds_bucket", selector=_S), "p99"),
        ],
        unit="s",
    )
    lay.panel(
        "Upload rate",
        "Multipart parts uploaded per second (right axis) and their bytes per second (left axis).",
        [
            Target(f"sum(rate(streamoffload_part_bytes_uploaded_total{_S}[{_RI}]))", "part bytes/s"),
            Target(f"sum(rate(streamoffload_parts_uploaded_total{_S}[{_RI}]))", "parts/s"),
        ],
        unit="Bps",
        overrides=[_unit_override("B", "reqps", right_axis=True)],
    )

    lay.row("Buffer")
    lay.panel(
        "Offload buffer",
        "Bytes accepted but not yet uploaded, per topic-partition (the PIP-76 buffer, bounded by "
        "offloadBufferMaxBytes; at the bound the job stops reading that topic-partition).",
        [Target(f"sum by (topic) (streamoffload_offload_buffer_bytes{_T})", "{{topic}}")],
        unit="bytes",
        width=12,
    )
    lay.panel(
        "Open segment size",
        "Bytes (left axis) and entries (right axis) assigned to each open segment.",
        [
            Target(f"sum by (topic) (streamoffload_open_segment_bytes{_T})", "{{topic}} bytes"),
            Target(f"sum by (topic) (streamoffload_open_segment_entries{_T})", "{{topic}} entries"),
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
            Target(_quantile(0.5, "streamoffload_batch_duration_seconds_bucket", selector=_S), "batch p50"),
            Target(_quantile(0.95, "streamoffload_batch_duration_seconds_bucket", selector=_S), "batch p95"),
            Target(_quantile(0.95, "streamoffload_sink_duration_seconds_bucket", selector=_S), "sink p95"),
        ],
        unit="s",
    )
    lay.panel(
        "Input rate",
        "Rows (entries and control requests) per second: Spark's input and processing rates of the last "
        "micro-batch, and the rate averaged over the interval.",
        [
            Target(f"sum(streamoffload_input_rows_per_second{_S})", "input rows/s (last batch)"),
            Target(f"sum(streamoffload_processed_rows_per_second{_S})", "processed rows/s (last batch)"),
            Target(f"sum(rate(streamoffload_input_rows_total{_S}[{_RI}]))", "input rows/s"),
        ],
        unit="rowsps",
    )
    lay.panel(
        "Since the last micro-batch",
        "Seconds since the sink last finished a micro-batch: a stuck job grows here.",
        [Target(f"time() - max(streamoffload_last_batch_timestamp_seconds{_S})", "seconds")],
        unit="s",
        kind="stat",
        thresholds=(STALE_BATCH_WARN_S, STALE_BATCH_CRIT_S),
        options={"colorMode": "background"},
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
                _query_variable("namespace", "Namespace", NAMESPACE_VARIABLE_QUERY, regex=NAMESPACE_VARIABLE_REGEX),
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


def dashboard_json(dashboard: dict[str, Any] | None = None) -> str:
    """The dashboard as the text ``dashboard export`` writes (stable: diffs of the committed copy are real)."""
    return json.dumps(dashboard if dashboard is not None else build_dashboard(), indent=2) + "\n"


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


# ---------------------------------------------------------------------------------------------
# pushing


@dataclass(frozen=True)
class PushResult:
    dashboard_url: str
    dashboard_version: int | None
    datasource_uid: str | None
    datasource_created: bool


def datasource_model(url: str, name: str = DATASOURCE_NAME, uid: str = DATASOURCE_UID) -> dict[str, Any]:
    return {
        "uid": uid,
        "name": name,
        "type": "prometheus",
        "access": "proxy",
        "url": url,
        "isDefault": False,
        "jsonData": {"httpMethod": "POST", "timeInterval": "15s"},
    }


class GrafanaHTTPError(GrafanaPushError):
    """Grafana answered with an error status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status_code = status


class GrafanaClient:
    """The four Grafana HTTP API calls the push makes, over ``urllib`` (standard library): no third-party HTTP
    client, so nothing like ``grafana-client``'s ``urllib3-future`` (whose ``.pth`` file replaces ``urllib3`` for
    the whole environment, botocore included) comes with the package."""

    def __init__(self, base_url: str, authorization: str, timeout_s: float = 30.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.authorization = authorization
        self.timeout_s = timeout_s

    def request(self, method: str, path: str, body: Any | None = None) -> Any:
        import urllib.error
        import urllib.request

        data = None if body is None else json.dumps(body).encode("utf-8")
        headers = {"Authorization": self.authorization, "Accept": "application/json"}
        if data is not None:
            headers["Content-Type"] = "application/json"
        req = urllib.request.Request(self.base_url + path, data=data, headers=headers, method=method)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as response:
                raw = response.read()
        except urllib.error.HTTPError as err:
            raw = err.read()
            try:
                message = str(json.loads(raw).get("message") or raw.decode("utf-8", "replace"))
            except (ValueError, AttributeError):
                message = raw.decode("utf-8", "replace").strip() or str(err.reason)
            raise GrafanaHTTPError(err.code, message) from None
        return json.loads(raw) if raw.strip() else {}

    # The calls, named as in grafana-client (which this replaces).
    def get_datasource_by_uid(self, uid: str) -> Any:
        return self.request("GET", f"/api/datasources/uid/{_quote(uid)}")

    def get_datasource_by_name(self, name: str) -> Any:
        return self.request("GET", f"/api/datasources/name/{_quote(name)}")

    def create_datasource(self, body: dict[str, Any]) -> Any:
        return self.request("POST", "/api/datasources", body)

    def update_datasource_by_uid(self, uid: str, body: dict[str, Any]) -> Any:
        return self.request("PUT", f"/api/datasources/uid/{_quote(uid)}", body)

    def update_dashboard(self, body: dict[str, Any]) -> Any:
        return self.request("POST", "/api/dashboards/db", body)


def _quote(text: str) -> str:
    from urllib.parse import quote

    return quote(text, safe="")


def connect(
    grafana_url: str, *, token: str | None = None, user: str | None = None, password: str | None = None
) -> GrafanaClient:
    """A :class:`GrafanaClient` with a bearer token (service account) or basic auth."""
    import base64

    if token:
        authorization = f"Bearer {token}"
    elif user is not None and password is not None:
        authorization = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode("ascii")
    else:
        raise GrafanaPushError("give --token (or GRAFANA_TOKEN), or --user and --password (or GRAFANA_PASSWORD)")
    return GrafanaClient(grafana_url, authorization)


def _grafana_call(grafana_url: str, what: str, fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except GrafanaHTTPError as err:
        if err.status_code in (401, 403):
            raise GrafanaPushError(f"Grafana at {grafana_url} refused the credentials while {what}: {err}") from None
        raise GrafanaPushError(f"Grafana at {grafana_url} failed while {what}: {err}") from None
    except OSError as err:  # URLError, refused connections, timeouts
        reason = getattr(err, "reason", None) or err
        raise GrafanaPushError(f"cannot reach Grafana at {grafana_url} while {what}: {reason}") from None


def ensure_datasource(api: Any, grafana_url: str, prometheus_url: str, name: str = DATASOURCE_NAME) -> tuple[str, bool]:
    """Create the Prometheus data source, or update it in place. Returns (uid, created)."""
    body = datasource_model(prometheus_url, name)
    try:
        existing = api.get_datasource_by_uid(DATASOURCE_UID)
    except GrafanaHTTPError as err:
        if err.status_code in (401, 403):
            raise GrafanaPushError(f"Grafana at {grafana_url} refused the credentials: {err}") from None
        if err.status_code != 404:
            raise GrafanaPushError(f"Grafana at {grafana_url} failed while looking up data source: {err}") from None
        existing = None
    except OSError as err:
        reason = getattr(err, "reason", None) or err
        raise GrafanaPushError(f"cannot reach Grafana at {grafana_url}: {reason}") from None
    if existing:
        _grafana_call(
            grafana_url,
            "updating the data source",
            api.update_datasource_by_uid,
            DATASOURCE_UID,
            {**body, "id": existing.get("id")},
        )
        return DATASOURCE_UID, False
    try:
        _grafana_call(grafana_url, "creating the data source", api.create_datasource, body)
        return DATASOURCE_UID, True
    except GrafanaPushError:
        # The name may be taken by a data source created by hand: update that one instead.
        try:
            named = api.get_datasource_by_name(name)
        except Exception:
            raise GrafanaPushError(
                f"Grafana at {grafana_url} refused to create data source {name!r} and has none of that name"
            ) from None
        uid = named["uid"]
        _grafana_call(
            grafana_url,
            "updating the data source",
            api.update_datasource_by_uid,
            uid,
            {**body, "uid": uid, "id": named.get("id")},
        )
        return uid, False


def push_dashboard(
    api: Any,
    grafana_url: str,
    *,
    prometheus_url: str | None = None,
    datasource_name: str = DATASOURCE_NAME,
    folder_uid: str | None = None,
) -> PushResult:
    """Create or overwrite the dashboard (and, with ``prometheus_url``, its data source)."""
    dashboard = build_dashboard()
    ds_uid, created = (None, False)
    if prometheus_url:
        ds_uid, created = ensure_datasource(api, grafana_url, prometheus_url, datasource_name)
        for variable in dashboard["templating"]["list"]:
            if variable["name"] == "datasource":
                variable["current"] = {"selected": True, "text": datasource_name, "value": ds_uid}
    dashboard["id"] = None  # Grafana finds it by uid; an id would have to match its own
    body: dict[str, Any] = {
        "dashboard": dashboard,
        "overwrite": True,
        "message": f"streamoffload {__version__} dashboard push",
    }
    if folder_uid:
        body["folderUid"] = folder_uid
    response = _grafana_call(grafana_url, "saving the dashboard", api.update_dashboard, body)
    response = response if isinstance(response, dict) else {}
    url = response.get("url") or f"/d/{DASHBOARD_UID}"
    return PushResult(
        dashboard_url=grafana_url.rstrip("/") + url,
        dashboard_version=response.get("version"),
        datasource_uid=ds_uid,
        datasource_created=created,
    )


# ---------------------------------------------------------------------------------------------
# alert rules


ALERT_GROUP = "streamoffload"


def alert_rules(
    *,
    rollover_minutes: float = 10.0,
    lag_rollovers: float = 3.0,
    stale_batch_s: float = STALE_BATCH_CRIT_S,
    job: str = "streamoffload",
) -> dict[str, Any]:
    """Prometheus alerting rules (a rule file's document) for the offload job scraped under ``job``:

    * ``StreamoffloadLagHigh``: the lag (``streamoffload_offload_lag_seconds``, the definition ``status`` shows)
      is above ``lag_rollovers`` rollover times: segments are not sealed when they should be;
    * ``StreamoffloadUploadsFailing``: sink actions keep failing (the query restarts and retries them);
    * ``StreamoffloadFailedSegments``: a segment stays Failed;
    * ``StreamoffloadBatchesStale``: no micro-batch finished for ``stale_batch_s`` seconds (a stuck job);
    * ``StreamoffloadStoreMetadataUnreadable``: the job cannot read the store's metadata;
    * ``StreamoffloadJobDown``: the job is not scraped (stopped, crashed, or fenced: a fenced instance stops).
    """
    lag_s = rollover_minutes * 60 * lag_rollovers
    selector = f'{{job="{job}"}}'
    rules = [
        {
            "alert": "StreamoffloadLagHigh",
            "expr": f"max by (job, instance, topic) (streamoffload_offload_lag_seconds{selector}) > {lag_s:g}",
            "for": "5m",
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": "offload lag of {{ $labels.topic }} is {{ $value | humanizeDuration }}",
                "description": f"The newest offloaded entry of {{{{ $labels.topic }}}} is older than {lag_rollovers:g} "
                f"rollover times ({lag_s:g} s) while newer entries wait. Check the job's log and "
                "`streamoffload status`.",
            },
        },
        {
            "alert": "StreamoffloadUploadsFailing",
            "expr": f"sum by (job, instance) (increase(streamoffload_upload_errors_total{selector}[10m])) > 0",
            "for": "10m",
            "labels": {"severity": "critical"},
            "annotations": {
                "summary": "uploads to the object store keep failing on {{ $labels.instance }}",
                "description": "Part uploads or seals failed in each of the last 10 minutes; the query restarts "
                "and retries them. Check the store's credentials, quota and reachability.",
            },
        },
        {
            "alert": "StreamoffloadFailedSegments",
            "expr": f'sum by (job, instance, topic) (streamoffload_segments{{job="{job}",status="Failed"}}) > 0',
            "for": "15m",
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": "{{ $labels.topic }} has a Failed segment",
                "description": "A segment stays Failed: it is retried before any new segment opens, so the topic "
                "does not progress. See `streamoffload status`.",
            },
        },
        {
            "alert": "StreamoffloadTopicSetAside",
            "expr": f"max by (job, instance, topic) (streamoffload_topic_set_aside{selector}) > 0",
            "for": "1m",
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": "{{ $labels.topic }} keeps failing and is set aside",
                "description": "Its offload failed again and again, so the job pauses it (retrying after a "
                "backoff) while the other topics go on. `streamoffload status` shows why.",
            },
        },
        {
            "alert": "StreamoffloadBatchesStale",
            "expr": f"time() - max by (job, instance) (streamoffload_last_batch_timestamp_seconds{selector}) "
            f"> {stale_batch_s:g}",
            "for": "5m",
            "labels": {"severity": "critical"},
            "annotations": {
                "summary": "no micro-batch finished on {{ $labels.instance }} for {{ $value | humanizeDuration }}",
                "description": "The job runs but its query makes no progress (stuck Spark, an unreachable broker).",
            },
        },
        {
            "alert": "StreamoffloadStoreMetadataUnreadable",
            "expr": f"min by (job, instance) (streamoffload_metadata_refresh_ok{selector}) == 0",
            "for": "10m",
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": "{{ $labels.instance }} cannot read the store's metadata",
                "description": "The metrics' store refresh fails: offload totals and the lag may be stale.",
            },
        },
        {
            "alert": "StreamoffloadJobDown",
            "expr": f'up{selector} == 0 or absent(up{{job="{job}"}})',
            "for": "2m",
            "labels": {"severity": "critical"},
            "annotations": {
                "summary": "the offload job {{ $labels.instance }} is down",
                "description": "Prometheus cannot scrape the job: it stopped, crashed or was fenced by another "
                "instance (a fenced job exits). Nothing is offloaded meanwhile.",
            },
        },
    ]
    return {"groups": [{"name": ALERT_GROUP, "rules": rules}]}


def alert_rules_yaml(rules: dict[str, Any] | None = None) -> str:
    """The rule file ``dashboard export --alerts`` writes: YAML, block style, every string double-quoted (a
    JSON string is a valid YAML double-quoted scalar), so no YAML library is needed."""
    doc = rules if rules is not None else alert_rules()
    header = "# Prometheus alerting rules for streamoffload (generated: streamoffload dashboard export --alerts)\n"
    return header + "\n".join(_yaml_lines(doc, 0)) + "\n"


def _yaml_scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return json.dumps(value)
    return json.dumps(str(value), ensure_ascii=False)


def _yaml_lines(value: Any, indent: int) -> list[str]:
    pad = " " * indent
    lines: list[str] = []
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(item, dict | list) and item:
                lines.append(f"{pad}{key}:")
                lines.extend(_yaml_lines(item, indent + 2))
            else:
                lines.append(f"{pad}{key}: {_yaml_scalar(item) if not isinstance(item, dict | list) else '[]'}")
    elif isinstance(value, list):
        for item in value:
            sub = _yaml_lines(item, indent + 2)
            if isinstance(item, dict | list) and item:
                lines.append(f"{pad}- {sub[0].lstrip()}")
                lines.extend(sub[1:])
            else:
                lines.append(f"{pad}- {_yaml_scalar(item)}")
    else:
        lines.append(pad + _yaml_scalar(value))
    return lines
