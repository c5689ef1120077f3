"""The dashboard as code: the exported JSON's shape, and `dashboard push` against a local HTTP server
that answers like Grafana's HTTP API (no Grafana server is available here) and checks the requests."""

from __future__ import annotations

import base64
import json
import re
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from streamoffload.cli import main
from streamoffload.dashboard.export import dashboard_json
from streamoffload.dashboard.grafana import DATASOURCE_NAME, DATASOURCE_UID
from streamoffload.dashboard.model import (
    DASHBOARD_UID,
    DERIVED_ROW,
    TOP_N,
    TOPIC_VARIABLE_QUERY,
    annotation_expressions,
    build_dashboard,
    expressions,
    families_of,
    substitute_variables,
)
from streamoffload.metrics import definitions
from streamoffload.metrics.collector import JobMetrics
from streamoffload.metrics.model import Backlog
from streamoffload.streaming.job.report import BatchReport
from streamoffload.streaming.job.tables import TableFigures
from streamoffload.streaming.sink.sink import SinkStats
from tests.fixtures.reports import figures, seal_report
from tests.fixtures.tools import debian_prometheus_tool

TOKEN = "glsa_test_token"
TABLE = TableFigures(
    "persistent://public/default/t",
    "public.default.t",
    commits=1,
    rows_appended=5,
    files_appended=1,
    bytes_appended=900,
    segments_behind=0,
    entries_behind=0,
    last_commit_s=1_000.0,
)
"""A table the job keeps (``streaming.job.tables``), every figure known."""
USER, PASSWORD = "admin", "s3cret"


# ---------------------------------------------------------------------------------------------
# the exported JSON


def all_panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for panel in dashboard["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))
    return out


def test_export_has_the_panels_variables_and_datasource_variable() -> None:
    dash = build_dashboard()
    assert dash["uid"] == DASHBOARD_UID
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    topic = variables["topic"]
    assert topic["type"] == "query"
    assert topic["query"]["query"] == TOPIC_VARIABLE_QUERY
    assert topic["includeAll"] and topic["multi"] and topic["allValue"] == ".*"
    assert topic["datasource"] == {"type": "prometheus", "uid": "${datasource}"}

    panels = [p for p in all_panels(dash) if p["type"] != "row"]
    rows = [p["title"] for p in all_panels(dash) if p["type"] == "row"]
    assert rows == [
        "Lag",
        "Per topic-partition",
        "Throughput",
        "Segments",
        "Errors and uploads",
        "Health",
        "Buffer",
        "Spark micro-batches",
        "Iceberg tables",
        DERIVED_ROW,
    ]
    titles = {p["title"] for p in panels}
    for needed in (
        "Offload lag",
        "Entries offloaded / s",
        "Bytes offloaded / s",
        "Segments by status",
        "Errors",
        "Offload buffer",
        "Micro-batch duration",
        "Input rate",
        "Upload latency",
        "Seals by reason",
        "Topic-partitions now",
        "Broker unreachable",
        "Query restarts",
        "Set aside and failing",
        "Read cache",
        "Bytes behind the latest position",
        "Table lag",
    ):
        assert needed in titles
    ids = [p["id"] for p in all_panels(dash)]
    assert len(ids) == len(set(ids))
    for panel in panels:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["targets"], panel["title"]
        assert [t["refId"] for t in panel["targets"]] == [chr(65 + i) for i in range(len(panel["targets"]))]
        pos = panel["gridPos"]
        assert pos["x"] >= 0 and pos["x"] + pos["w"] <= 24 and pos["h"] > 0
        assert panel["description"]
    # Panels of one grid row never overlap.
    boxes = [(p["gridPos"]["x"], p["gridPos"]["y"], p["gridPos"]["w"], p["gridPos"]["h"]) for p in all_panels(dash)]
    for i, (x1, y1, w1, h1) in enumerate(boxes):
        for x2, y2, w2, h2 in boxes[i + 1 :]:
            assert x1 + w1 <= x2 or x2 + w2 <= x1 or y1 + h1 <= y2 or y2 + h2 <= y1
    # Every series is filtered by the job and instance variables; every per-topic one by namespace and topic too,
    # every namespace total by namespace.
    per_topic = {name for name, defn in definitions.METRICS.items() if "topic" in defn.labels}
    per_namespace = {name for name, defn in definitions.METRICS.items() if "namespace" in defn.labels}
    queried = set()
    for expr in expressions(dash):
        for name, selector in re.findall(r"(streamoffload_\w+)(\{[^}]*\})?", expr):
            assert 'job=~"$job"' in selector and 'instance=~"$instance"' in selector, expr
            family = re.sub(r"_(total|bucket|sum|count)$", "", name)
            queried.add(family)
            if family in per_topic:
                assert 'topic=~"$topic"' in selector and 'topic=~"persistent://$namespace/.*"' in selector, expr
            if family in per_namespace:
                assert 'namespace=~"$namespace"' in selector and "topic" not in selector, expr
    # Per-topic series exist for the worst topic-partitions only: every panel drawing them says so.
    for drawn in panels:
        names = {
            re.sub(r"_(total|bucket|sum|count)$", "", n)
            for t in drawn["targets"]
            for n in re.findall(r"streamoffload_\w+", t["expr"])
        }
        if names & per_topic:
            assert "[metrics] topic_series" in drawn["description"], drawn["title"]
    # Totals and throughput come from the namespace families, which cover every topic-partition.
    for title in (
        "Entries offloaded / s",
        "Bytes offloaded / s",
        "Offloaded so far",
        "Segments by status",
        "Seals by reason",
    ):
        [by_title] = [p for p in panels if p["title"] == title]
        for target in by_title["targets"]:
            assert "streamoffload_namespace_" in target["expr"], (title, target["expr"])
    assert {definitions.NAMESPACE_MAX_OFFLOAD_LAG.name, definitions.TOPIC_SERIES_OMITTED.name} <= queried


def test_every_metric_the_dashboard_queries_is_one_the_job_exports() -> None:
    topic = "persistent://public/default/t-partition-0"
    metrics = JobMetrics(backlog=lambda _known: {topic: Backlog((1, 5), entries=5, bytes=50)})
    # publish_time_last: not in the sink's seal reports, but used when present (else a store refresh fills it in).
    seal = seal_report(
        topic, "s", reason="time", data_length=10, entries=1, entry_bytes=5, end=(1, 0), publish_time_last=1_000
    )
    stats = figures(topic, last_position=(1, 0))
    metrics.on_batch(BatchReport(0, 0.1, SinkStats(sealed=[seal], topics={topic: stats})))
    metrics.refresh_backlog()
    metrics._failing = {topic: (3, 0)}  # as a refresh finds a quarantine record
    metrics.table_figures = lambda: [TABLE]
    exported = {s.name for family in metrics.registry.collect() for s in family.samples}
    dash = build_dashboard()
    used = {
        name
        for expr in expressions(dash) + annotation_expressions(dash)
        for name in re.findall(r"streamoffload_\w+", expr)
    }
    assert used - exported == set()


def test_the_definitions_are_exactly_the_families_the_job_exports() -> None:
    """The dashboard and the alerts build on ``metrics.definitions``: it must list every exported family,
    with the type, help and labels the collector gives it, and nothing the collector does not export."""
    topic = "persistent://public/default/t-partition-0"
    metrics = JobMetrics(read_cache=False, backlog=lambda _known: {topic: Backlog((1, 5), entries=5, bytes=50)})
    stats = figures(topic, open_segment="s", open_segment_assigned_ms=1, last_position=(1, 0))
    seal = seal_report(
        topic, "t", reason="time", entries=1, entry_bytes=5, data_length=10, end=(1, 0), publish_time_last=1_000
    )
    metrics.on_batch(BatchReport(0, 0.1, SinkStats(sealed=[seal], topics={topic: stats})))
    metrics.refresh_backlog()
    metrics._failing = {topic: (3, 0)}  # as a refresh finds a quarantine record
    metrics.table_figures = lambda: [TABLE]
    exported = {family.name: family for family in metrics.registry.collect()}
    assert set(exported) == set(definitions.METRICS)
    for name, defn in definitions.METRICS.items():
        family = exported[name]
        assert (family.type, family.documentation) == (defn.kind, defn.help), name
        labels = {k for sample in family.samples for k in sample.labels if k not in ("le",)}
        assert labels == set(defn.labels), name


# --- a panel for every exported family, derived from its definition when none is laid by hand (issue 50) ---

ISSUE_50_FAMILIES = {
    definitions.BROKER_UNREACHABLE.name,
    definitions.QUERY_RESTARTS.name,
    definitions.TOPIC_SET_ASIDE.name,
    definitions.TOPIC_FAILURES_IN_A_ROW.name,
    definitions.READ_CACHE_HITS.name,
    definitions.READ_CACHE_MISSES.name,
    definitions.SOURCE_BACKLOG_BYTES.name,
}
"""Exported families the hand-written dashboard showed nowhere."""


def families_without_panel(dashboard: dict[str, Any]) -> set[str]:
    queried = {family for expr in expressions(dashboard) for family in families_of(expr)}
    return set(definitions.METRICS) - queried


def curated_and_derived(dashboard: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The panels above the derived row, and those in it."""
    panels = all_panels(dashboard)
    [at] = [i for i, p in enumerate(panels) if p["type"] == "row" and p["title"] == DERIVED_ROW]
    return [p for p in panels[:at] if p["type"] != "row"], panels[at + 1 :]


def test_every_exported_family_has_a_panel() -> None:
    dash = build_dashboard()
    assert families_without_panel(dash) == set()
    curated, derived = curated_and_derived(dash)
    by_hand = {f for p in curated for t in p["targets"] for f in families_of(t["expr"])}
    assert by_hand >= ISSUE_50_FAMILIES
    # A derived panel is only for what no panel laid by hand shows, one family each.
    for p in derived:
        [family] = {f for t in p["targets"] for f in families_of(t["expr"])}
        assert family not in by_hand and p["description"].startswith(definitions.METRICS[family].help), p["title"]
    # The check fails when a family loses its panel.
    without_cache = {**dash, "panels": [p for p in dash["panels"] if p["title"] != "Read cache"]}
    assert families_without_panel(without_cache) == {
        definitions.READ_CACHE_HITS.name,
        definitions.READ_CACHE_MISSES.name,
    }


def test_a_new_family_gets_a_panel_from_its_definition(monkeypatch: pytest.MonkeyPatch) -> None:
    """A family another change adds to metrics/definitions.py is on the dashboard without a line in model.py."""
    new = {
        "streamoffload_table_rows_synced": definitions.MetricDef(
            "streamoffload_table_rows_synced", "counter", "Rows synced to the table.", ("topic",)
        ),
        "streamoffload_namespace_table_bytes": definitions.MetricDef(
            "streamoffload_namespace_table_bytes", "gauge", "Bytes of the namespace's table.", ("namespace",)
        ),
        "streamoffload_table_commit_seconds": definitions.MetricDef(
            "streamoffload_table_commit_seconds", "histogram", "Time to commit a table snapshot.", (), (0.1, 1.0)
        ),
        "streamoffload_table_synced_timestamp_seconds": definitions.MetricDef(
            "streamoffload_table_synced_timestamp_seconds", "gauge", "When the table was last synced."
        ),
    }
    for name, defn in new.items():
        monkeypatch.setitem(definitions.METRICS, name, defn)
    dash = build_dashboard()
    assert families_without_panel(dash) == set()
    _curated, derived = curated_and_derived(dash)
    got = {p["title"]: (p["fieldConfig"]["defaults"]["unit"], [t["expr"] for t in p["targets"]]) for p in derived}
    s = '{job=~"$job",instance=~"$instance"}'
    t = '{job=~"$job",instance=~"$instance",topic=~"persistent://$namespace/.*",topic=~"$topic"}'
    n = '{job=~"$job",instance=~"$instance",namespace=~"$namespace"}'
    assert got["table rows synced / s"] == (
        "ops",
        [f"sum by (topic) (rate(streamoffload_table_rows_synced_total{t}[$__rate_interval]))"],
    )
    assert got["namespace table bytes"] == ("bytes", [f"max by (namespace) (streamoffload_namespace_table_bytes{n})"])
    assert got["table commit seconds"] == (
        "s",
        [
            f"histogram_quantile({q}, sum by (le) (rate(streamoffload_table_commit_seconds_bucket{s}"
            "[$__rate_interval])))"
            for q in (0.5, 0.95)
        ],
    )
    assert got["since table synced"] == ("s", [f"time() - max (streamoffload_table_synced_timestamp_seconds{s})"])
    [rows] = [p for p in derived if p["title"] == "table rows synced / s"]
    assert rows["description"] == "Rows synced to the table." + TOP_N  # per-topic: says the series are cut


def test_annotations_mark_restarts_and_policy_changes() -> None:
    dash = build_dashboard()
    notes = {a["name"]: a for a in dash["annotations"]["list"]}
    assert list(notes) == ["Annotations & Alerts", "Query restarts", "Policy changes"]
    assert notes["Annotations & Alerts"]["builtIn"] == 1
    s = '{job=~"$job",instance=~"$instance"}'
    assert notes["Query restarts"]["expr"] == f"increase(streamoffload_query_restarts_total{s}[1m]) > 0"
    policy = definitions.POLICY_EFFECTIVE_TIME.name
    assert notes["Policy changes"]["expr"] == (
        f"(changes({policy}{s}[1m]) > 0) and (min_over_time({policy}{s}[1m]) > 0)"
    )
    for name in ("Query restarts", "Policy changes"):
        assert notes[name]["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert notes[name]["enable"] is True and notes[name]["titleFormat"] and notes[name]["textFormat"]


def test_the_sdk_reads_the_dashboard_back_as_built() -> None:
    """The exported JSON is what grafana-foundation-sdk's model of a Grafana 11.1 dashboard describes: decoded
    by the SDK and encoded again, nothing is lost but the Prometheus annotations' own fields, which the SDK's
    generic annotation model has none for."""
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.cog.plugins import register_default_plugins
    from grafana_foundation_sdk.models.dashboard import Dashboard

    register_default_plugins()
    exported = json.loads(dashboard_json())
    again = json.loads(JSONEncoder().encode(Dashboard.from_json(exported)))
    for note in exported["annotations"]["list"]:
        for key in ("titleFormat", "textFormat", "step"):
            note.pop(key, None)
    assert again == exported


def test_the_sdk_refuses_a_panel_wider_than_the_grid() -> None:
    from grafana_foundation_sdk.models.dashboard import DataSourceRef

    from streamoffload.dashboard.model import PanelSpec, Target, _panel

    ds = DataSourceRef(type_val="prometheus", uid="${datasource}")
    _panel(PanelSpec("full width", "as wide as the grid", (Target("up"),), width=24), 1, None, ds)
    with pytest.raises(ValueError, match="w must be <= 24"):
        _panel(PanelSpec("wide", "too wide", (Target("up"),), width=25), 1, None, ds)
    with pytest.raises(ValueError, match="h must be > 0"):
        _panel(PanelSpec("flat", "no height", (Target("up"),), height=0), 1, None, ds)


def test_variable_substitution_prefers_the_longest_name() -> None:
    expr = 'rate(x{topic=~"$topic"}[$__rate_interval]) + ${topic}'
    assert substitute_variables(expr, {"topic": ".*", "__rate_interval": "15s", "__rate": "BAD"}) == (
        'rate(x{topic=~".*"}[15s]) + .*'
    )


def test_export_command_writes_the_same_json_to_a_file_or_stdout(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "sub" / "dash.json"
    assert main(["dashboard", "export", "-o", str(out)]) == 0
    assert out.read_text() == dashboard_json()
    assert main(["dashboard", "export"]) == 0
    assert capsys.readouterr().out == dashboard_json()
    assert json.loads(dashboard_json())["uid"] == DASHBOARD_UID


# ---------------------------------------------------------------------------------------------
# a Grafana look-alike


@dataclass
class FakeGrafana:
    """Grafana's data source and dashboard endpoints, with the status codes and bodies Grafana returns."""

    auth: str
    requests: list[tuple[str, str, dict[str, str], Any]] = field(default_factory=list)
    datasources: dict[str, dict[str, Any]] = field(default_factory=dict)
    dashboards: dict[str, dict[str, Any]] = field(default_factory=dict)
    next_id: int = 1

    def handle(self, method: str, path: str, headers: dict[str, str], body: Any) -> tuple[int, Any]:
        self.requests.append((method, path, headers, body))
        if headers.get("authorization") != self.auth:
            return 401, {"message": "Unauthorized"}
        if method in ("POST", "PUT") and not headers.get("content-type", "").startswith("application/json"):
            return 415, {"message": "content type must be application/json"}
        if method == "GET" and path.startswith("/api/datasources/uid/"):
            ds = self.datasources.get(path.rsplit("/", 1)[1])
            return (200, ds) if ds else (404, {"message": "Data source not found"})
        if method == "GET" and path.startswith("/api/datasources/name/"):
            name = path.rsplit("/", 1)[1].replace("%20", " ")
            found = [d for d in self.datasources.values() if d["name"] == name]
            return (200, found[0]) if found else (404, {"message": "Data source not found"})
        if method == "POST" and path == "/api/datasources":
            for key in ("name", "type", "access", "url"):
                if not body.get(key):
                    return 400, {"message": f"missing {key}"}
            if any(d["name"] == body["name"] for d in self.datasources.values()):
                return 409, {"message": "data source with the same name already exists"}
            ds = {**body, "id": self.next_id, "uid": body.get("uid") or f"auto{self.next_id}"}
            self.next_id += 1
            self.datasources[ds["uid"]] = ds
            return 200, {"datasource": ds, "id": ds["id"], "message": "Datasource added", "name": ds["name"]}
        if method == "PUT" and path.startswith("/api/datasources/uid/"):
            uid = path.rsplit("/", 1)[1]
            if uid not in self.datasources:
                return 404, {"message": "Data source not found"}
            if body.get("uid", uid) != uid:
                return 400, {"message": "uid mismatch"}
            ds = {**self.datasources[uid], **body}
            self.datasources[uid] = ds
            return 200, {"datasource": ds, "id": ds["id"], "message": "Datasource updated", "name": ds["name"]}
        if method == "POST" and path == "/api/dashboards/db":
            dash = body.get("dashboard")
            if not isinstance(dash, dict) or not dash.get("title"):
                return 400, {"message": "Dashboard title cannot be empty"}
            uid = dash.get("uid")
            existing = self.dashboards.get(uid)
            if dash.get("id") is not None and (existing is None or existing["id"] != dash["id"]):
                return 404, {"message": "Dashboard not found"}
            if existing is not None and not body.get("overwrite"):
                return 412, {"message": "A dashboard with the same uid already exists", "status": "name-exists"}
            version = (existing["version"] + 1) if existing else 1
            stored = {**dash, "id": existing["id"] if existing else self.next_id, "version": version}
            if existing is None:
                self.next_id += 1
            self.dashboards[uid] = {**stored, "folderUid": body.get("folderUid", "")}
            return 200, {
                "id": stored["id"],
                "uid": uid,
                "url": f"/d/{uid}/streamoffload",
                "status": "success",
                "version": version,
                "slug": "streamoffload",
            }
        return 404, {"message": "Not found"}


@pytest.fixture
def grafana() -> Iterator[tuple[FakeGrafana, str]]:
    fake = FakeGrafana(auth=f"Bearer {TOKEN}")

    class Handler(BaseHTTPRequestHandler):
        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            body = json.loads(raw) if raw else None
            status, payload = fake.handle(
                self.command, self.path, {k.lower(): v for k, v in self.headers.items()}, body
            )
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PUT = do_DELETE = _serve

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield fake, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def calls(fake: FakeGrafana) -> list[tuple[str, str]]:
    return [(m, p) for m, p, _h, _b in fake.requests]


def test_push_creates_then_updates_dashboard_and_datasource(grafana: tuple[FakeGrafana, str], capsys: Any) -> None:
    fake, url = grafana
    prom = "http://prometheus:9090"
    args = ["dashboard", "push", "--grafana-url", url, "--token", TOKEN, "--datasource-url", prom]
    assert main(args) == 0
    assert calls(fake) == [
        ("GET", f"/api/datasources/uid/{DATASOURCE_UID}"),
        ("POST", "/api/datasources"),
        ("POST", "/api/dashboards/db"),
    ]
    assert all(h["authorization"] == f"Bearer {TOKEN}" for _m, _p, h, _b in fake.requests)
    ds_body = fake.requests[1][3]
    assert ds_body["type"] == "prometheus" and ds_body["url"] == prom and ds_body["access"] == "proxy"
    assert ds_body["uid"] == DATASOURCE_UID and ds_body["name"] == DATASOURCE_NAME
    dash_body = fake.requests[2][3]
    assert dash_body["overwrite"] is True
    assert dash_body["dashboard"]["uid"] == DASHBOARD_UID and dash_body["dashboard"]["id"] is None
    assert dash_body["dashboard"]["panels"] == build_dashboard()["panels"]
    variable = next(v for v in dash_body["dashboard"]["templating"]["list"] if v["name"] == "datasource")
    assert variable["current"]["value"] == DATASOURCE_UID
    out = capsys.readouterr().out
    assert "created data source" in out and f"{url}/d/{DASHBOARD_UID}/streamoffload" in out and "version 1" in out

    # Again: the data source is updated in place and the dashboard overwritten; still one of each.
    fake.requests.clear()
    assert main([*args[:-1], "http://prometheus-2:9090"]) == 0
    assert calls(fake) == [
        ("GET", f"/api/datasources/uid/{DATASOURCE_UID}"),
        ("PUT", f"/api/datasources/uid/{DATASOURCE_UID}"),
        ("POST", "/api/dashboards/db"),
    ]
    assert list(fake.datasources) == [DATASOURCE_UID]
    assert fake.datasources[DATASOURCE_UID]["url"] == "http://prometheus-2:9090"
    assert list(fake.dashboards) == [DASHBOARD_UID] and fake.dashboards[DASHBOARD_UID]["version"] == 2
    assert "updated data source" in capsys.readouterr().out


def test_push_with_basic_auth_and_no_datasource_only_saves_the_dashboard(grafana: tuple[FakeGrafana, str]) -> None:
    fake, url = grafana
    fake.auth = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    args = ["dashboard", "push", "--grafana-url", url, "--user", USER, "--password", PASSWORD, "--folder-uid", "ops"]
    assert main(args) == 0
    assert calls(fake) == [("POST", "/api/dashboards/db")]
    assert fake.dashboards[DASHBOARD_UID]["folderUid"] == "ops"
    assert main(args) == 0
    assert fake.dashboards[DASHBOARD_UID]["version"] == 2


def test_push_reuses_a_datasource_of_the_same_name(grafana: tuple[FakeGrafana, str]) -> None:
    fake, url = grafana
    fake.datasources["handmade"] = {
        "id": 7,
        "uid": "handmade",
        "name": "Prom",
        "type": "prometheus",
        "access": "proxy",
        "url": "http://old:9090",
    }
    args = [
        "dashboard",
        "push",
        "--grafana-url",
        url,
        "--token",
        TOKEN,
        "--datasource-url",
        "http://new:9090",
        "--datasource-name",
        "Prom",
    ]
    assert main(args) == 0
    assert list(fake.datasources) == ["handmade"] and fake.datasources["handmade"]["url"] == "http://new:9090"
    variable = next(v for v in fake.dashboards[DASHBOARD_UID]["templating"]["list"] if v["name"] == "datasource")
    assert variable["current"]["value"] == "handmade"


def test_push_needs_no_third_party_http_client(grafana: tuple[FakeGrafana, str]) -> None:
    """grafana-client brought urllib3-future, whose .pth file replaces urllib3 for the whole environment: the
    push uses the standard library instead, so neither is imported (nor needed)."""
    import subprocess
    import sys

    _fake, url = grafana
    code = (
        "import sys\nfrom streamoffload.cli import main\n"
        f"assert main(['dashboard', 'push', '--grafana-url', {url!r}, '--token', {TOKEN!r}]) == 0\n"
        "third = ('grafana_client', 'niquests', 'urllib3_future')\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in third)\n"
        "assert not loaded, loaded\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "dashboard saved" in result.stdout


def test_push_errors_name_the_problem(
    grafana: tuple[FakeGrafana, str], capsys: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake, url = grafana
    monkeypatch.delenv("GRAFANA_TOKEN", raising=False)
    monkeypatch.delenv("GRAFANA_PASSWORD", raising=False)
    assert main(["dashboard", "push", "--grafana-url", url, "--token", "wrong"]) == 1
    assert "refused the credentials" in capsys.readouterr().err
    assert fake.dashboards == {}

    assert main(["dashboard", "push", "--grafana-url", url]) == 1
    assert "--token" in capsys.readouterr().err

    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        closed = sock.getsockname()[1]
    assert main(["dashboard", "push", "--grafana-url", f"http://127.0.0.1:{closed}", "--token", TOKEN]) == 1
    assert "cannot reach Grafana" in capsys.readouterr().err


# --- units, variables, thresholds, alert rules (issue 13) ----------------------------------------------------


def panel(dash: dict[str, Any], title: str) -> dict[str, Any]:
    [found] = [p for p in all_panels(dash) if p["title"] == title]
    return found


def unit_of(p: dict[str, Any], ref_id: str) -> str:
    """The unit Grafana shows for query ``ref_id`` of a panel: its override's (a table's column is matched by
    its name, the query's legend, after the merge), else the panel default."""
    [target] = [t for t in p["targets"] if t["refId"] == ref_id]
    matcher = (
        {"id": "byName", "options": target["legendFormat"]}
        if p["type"] == "table"
        else {"id": "byFrameRefID", "options": ref_id}
    )
    for override in p["fieldConfig"]["overrides"]:
        if override["matcher"] == matcher:
            for prop in override["properties"]:
                if prop["id"] == "unit":
                    return str(prop["value"])
    return str(p["fieldConfig"]["defaults"]["unit"])


def test_every_series_has_the_unit_of_what_it_counts() -> None:
    dash = build_dashboard()
    byte_units, count_units = {"bytes", "decbytes"}, {"short", "none"}
    for p in (p for p in all_panels(dash) if p["type"] != "row"):
        for target in p["targets"]:
            unit, expr = unit_of(p, target["refId"]), target["expr"]
            metric = re.findall(r"streamoffload_(\w+)", expr)[0]
            if expr.startswith("count("):
                expected = count_units
            elif "_timestamp_seconds" in metric and expr.endswith("* 1000"):  # a time of day, in ms
                expected = {"dateTimeAsIso"}
            elif "rate(" in expr and "histogram_quantile" not in expr:
                if "bytes" in metric:
                    expected = {"Bps"}
                elif metric.endswith("_seconds_total"):  # seconds per second: a share of the time
                    expected = {"percentunit"}
                else:
                    expected = {"ops", "reqps", "rowsps", "cps"}
            elif "bytes" in metric and "histogram_quantile" not in expr:
                expected = byte_units
            elif metric.endswith("_seconds") or "duration_seconds" in metric or "time() -" in expr:
                expected = {"s"}
            elif metric.endswith("rows_per_second"):
                expected = {"rowsps", "ops"}
            elif metric.endswith(("_refresh_ok", "_unreachable", "_set_aside")):
                expected = {"bool_yes_no"}
            elif "histogram_quantile" in expr or metric.startswith("segment_size_bytes"):
                expected = byte_units if "bytes" in metric else {"s"}
            else:
                expected = count_units
            assert unit in expected, f"{p['title']} / {target['legendFormat']}: unit {unit}, expected {expected}"
    # The three the issue named.
    assert unit_of(panel(dash, "Offloaded so far"), "B") == "bytes"
    assert unit_of(panel(dash, "Offloaded so far"), "A") == "short"
    assert unit_of(panel(dash, "Open segment size"), "B") == "short"
    assert unit_of(panel(dash, "Upload rate"), "B") == "reqps"
    table = panel(dash, "Topic-partitions now")
    assert [unit_of(table, ref) for ref in "ABC"] == ["s", "short", "bytes"]


def test_job_instance_and_namespace_variables() -> None:
    dash = build_dashboard()
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert list(variables) == ["datasource", "job", "instance", "namespace", "topic"]
    for name in ("job", "instance", "namespace"):
        v = variables[name]
        assert v["type"] == "query" and v["multi"] and v["includeAll"] and v["allValue"] == ".*"
        assert v["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
    assert variables["instance"]["query"]["query"] == 'label_values(streamoffload_build_info{job=~"$job"}, instance)'
    # The namespace comes from the namespace totals' label (a topic label names only the exported topics).
    assert (
        variables["namespace"]["query"]["query"] == "label_values(streamoffload_namespace_topic_partitions, namespace)"
    )
    assert variables["namespace"].get("regex", "") == ""  # no regex: the label is the namespace
    expr = substitute_variables('x{topic=~"persistent://$namespace/.*",job=~"$job"}', {"namespace": "acme/orders"})
    assert expr == 'x{topic=~"persistent://acme/orders/.*",job=~".*"}'


def test_lag_age_and_staleness_panels_have_thresholds() -> None:
    dash = build_dashboard()
    for title in ("Offload lag by namespace", "Offload lag", "Open segment age", "Since the last micro-batch"):
        steps = panel(dash, title)["fieldConfig"]["defaults"]["thresholds"]["steps"]
        assert [s["color"] for s in steps] == ["green", "orange", "red"], title
        assert steps[0]["value"] is None and 0 < steps[1]["value"] < steps[2]["value"], title


def test_alert_rules_export_passes_promtool_and_loads_into_prometheus(tmp_path: Path) -> None:
    import subprocess
    import time
    import urllib.request

    from streamoffload.dashboard.alerts import alert_rules
    from streamoffload.embedded_broker import free_port

    out = tmp_path / "alerts.yml"
    assert main(["dashboard", "export", "--alerts", "--rollover-minutes", "5", "-o", str(out)]) == 0
    rules = {r["alert"]: r for r in alert_rules(rollover_minutes=5)["groups"][0]["rules"]}
    assert set(rules) == {
        "StreamoffloadLagHigh",
        "StreamoffloadLagHighRateLimited",
        "StreamoffloadNamespaceLagHigh",
        "StreamoffloadUploadsFailing",
        "StreamoffloadFailedSegments",
        "StreamoffloadTopicSetAside",
        "StreamoffloadBatchesStale",
        "StreamoffloadStoreMetadataUnreadable",
        "StreamoffloadBrokerUnreachable",
        "StreamoffloadRestartLoop",
        "StreamoffloadJobDown",
    }
    assert rules["StreamoffloadBrokerUnreachable"]["expr"] == (
        'max by (job, instance) (streamoffload_broker_unreachable{job="streamoffload"}) == 1'
    )
    assert rules["StreamoffloadRestartLoop"]["expr"] == (
        'sum by (job, instance) (increase(streamoffload_query_restarts_total{job="streamoffload"}[15m])) >= 3'
    )
    assert "> 900) unless on (job, instance) (" in rules["StreamoffloadLagHigh"]["expr"]  # 3 rollovers of 5 minutes
    assert "> 900) unless on (job, instance) (" in rules["StreamoffloadNamespaceLagHigh"]["expr"]
    # Issue 26: lag while the job waits on its rate limits is the limit at work, said by an alert of its own.
    limited = rules["StreamoffloadLagHighRateLimited"]
    assert "> 900) and on (job, instance) (" in limited["expr"]
    assert "streamoffload_throttled_seconds_total" in limited["expr"]
    assert limited["labels"] == {"severity": "info", "throttled": "true"}
    promtool, prometheus = debian_prometheus_tool("promtool"), debian_prometheus_tool("prometheus")
    check = subprocess.run([promtool, "check", "rules", str(out)], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0 and f"{len(rules)} rules found" in check.stdout, check.stdout + check.stderr
    broken = tmp_path / "broken.yml"
    broken.write_text(out.read_text().replace("> 900", "> > 900", 1))
    assert subprocess.run([promtool, "check", "rules", str(broken)], capture_output=True, timeout=60).returncode != 0

    # The real Prometheus loads them and evaluates them (the job is not running: StreamoffloadJobDown fires).
    port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        f"global:\n  evaluation_interval: 1s\nrule_files:\n  - {out}\n"
        f"scrape_configs:\n  - job_name: streamoffload\n    scrape_interval: 1s\n"
        f"    static_configs:\n      - targets: ['127.0.0.1:{free_port()}']\n"
    )
    with (tmp_path / "prometheus.log").open("wb") as log:
        proc = subprocess.Popen(
            [
                prometheus,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 60
        loaded: list[str] = []
        pending: list[str] = []
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/rules", timeout=2) as response:
                    groups = json.load(response)["data"]["groups"]
                loaded = [r["name"] for g in groups for r in g["rules"]]
                pending = [r["name"] for g in groups for r in g["rules"] if r.get("state") in ("pending", "firing")]
            except OSError:
                pass
            if len(loaded) == len(rules) and "StreamoffloadJobDown" in pending:
                break
            assert proc.poll() is None, (tmp_path / "prometheus.log").read_text()
            time.sleep(0.2)
        assert sorted(loaded) == sorted(rules)
        assert "StreamoffloadJobDown" in pending
    finally:
        proc.terminate()
        proc.wait(timeout=30)


# --- every alert links its section of docs/RUNBOOK.md (issue 50) ----------------------------------------------

RUNBOOK = Path(__file__).resolve().parents[2] / "docs" / "RUNBOOK.md"


def markdown_anchors(text: str) -> dict[str, str]:
    """Each heading's anchor as GitHub renders it (lower case, punctuation dropped, spaces to hyphens): the
    section's text under it."""
    out: dict[str, str] = {}
    parts = re.split(r"^#{1,6} (.+)$", text, flags=re.M)
    for heading, body in zip(parts[1::2], parts[2::2], strict=True):
        anchor = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        out[anchor] = body
    return out


def test_every_alert_has_a_runbook_section_saying_what_to_do() -> None:
    from streamoffload.dashboard.alerts import alert_rules

    sections = markdown_anchors(RUNBOOK.read_text(encoding="utf-8"))
    rules = alert_rules()["groups"][0]["rules"]
    for rule in rules:
        url = rule["annotations"]["runbook_url"]
        path, _, anchor = url.partition("#")
        assert path == "docs/RUNBOOK.md" and anchor in sections, (rule["alert"], url)
        for part in ("**Means:**", "**Check:**", "**Do:**"):
            assert part in sections[anchor], (rule["alert"], part)
    # One section per alert, and no section for an alert that does not exist.
    assert {r["alert"].lower() for r in rules} == set(sections) - {"runbook-streamoffloads-alerts"}
    # Links inside the runbook go to sections that exist.
    text = RUNBOOK.read_text(encoding="utf-8")
    assert {link for link in re.findall(r"\]\(#([\w-]+)\)", text)} <= set(sections)
    # Pointed elsewhere (the runbook as the operators read it), each keeps its anchor.
    moved = alert_rules(runbook_url="https://git.example.com/ops/blob/main/docs/RUNBOOK.md")
    assert [r["annotations"]["runbook_url"] for r in moved["groups"][0]["rules"]] == [
        f"https://git.example.com/ops/blob/main/docs/RUNBOOK.md#{r['alert'].lower()}" for r in rules
    ]


def test_a_missing_runbook_section_is_found() -> None:
    sections = markdown_anchors("# Runbook\n\n## StreamoffloadJobDown\n\n**Means:** x\n")
    assert set(sections) == {"runbook", "streamoffloadjobdown"}
    assert "streamoffloadrestartloop" not in sections


def test_export_alerts_points_the_runbook_urls_where_asked(tmp_path: Path) -> None:
    out = tmp_path / "alerts.yml"
    base = "https://git.example.com/ops/blob/main/docs/RUNBOOK.md"
    assert main(["dashboard", "export", "--alerts", "--runbook-url", base, "-o", str(out)]) == 0
    urls = re.findall(r'runbook_url: "([^"]+)"', out.read_text())
    assert urls[0] == f"{base}#streamoffloadlaghigh" and urls[-1] == f"{base}#streamoffloadjobdown"
    assert len(urls) == 11 and all(u.startswith(base + "#") for u in urls)


def test_export_without_the_sdk_says_which_extra_to_install(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "grafana_foundation_sdk", None)  # import fails, as when not installed
    assert main(["dashboard", "export"]) == 1
    err = capsys.readouterr().err
    assert "grafana-foundation-sdk, which is not installed" in err and "streamoffload[dashboard]" in err
