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
from streamoffload.dashboard import (
    DASHBOARD_UID,
    DATASOURCE_NAME,
    DATASOURCE_UID,
    TOPIC_VARIABLE_QUERY,
    build_dashboard,
    dashboard_json,
    expressions,
    substitute_variables,
)
from streamoffload.metrics import JobMetrics
from streamoffload.streaming.job import BatchReport

TOKEN = "glsa_test_token"
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
    assert topic["query"]["query"] == TOPIC_VARIABLE_QUERY == topic["definition"]
    assert topic["includeAll"] and topic["multi"] and topic["allValue"] == ".*"
    assert topic["datasource"] == {"type": "prometheus", "uid": "${datasource}"}

    panels = [p for p in all_panels(dash) if p["type"] != "row"]
    rows = [p["title"] for p in all_panels(dash) if p["type"] == "row"]
    assert rows == ["Lag", "Throughput", "Segments", "Errors and uploads", "Buffer", "Spark micro-batches"]
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
    # Every per-topic series is filtered by the topic variable.
    for expr in expressions(dash):
        for selector in re.findall(r"streamoffload_\w+(\{[^}]*\})?", expr):
            assert not selector or 'topic=~"$topic"' in selector, expr


def test_every_metric_the_dashboard_queries_is_one_the_job_exports() -> None:
    metrics = JobMetrics()
    topic = "persistent://public/default/t-partition-0"
    seal = {
        "topic": topic,
        "segment": "s",
        "reason": "end",
        "parts": 1,
        "data_length": 10,
        "entries": 1,
        "entry_bytes": 5,
        "ordinal": 0,
        "format": 2,
        # Not in today's seal info, but accepted when present (else a store refresh fills them in).
        "end": [1, 0],
        "publish_time_last": 1_000,
    }
    stats = {
        "buffered_bytes": 0,
        "open_segment": None,
        "open_segment_entries": 0,
        "open_segment_bytes": 0,
        "open_segment_assigned_ms": None,
        "last_position": [1, 0],
        "skipped_entries": 0,
        "now_ms": 0,
    }
    metrics.on_batch(BatchReport(0, 0.1, sealed=[seal], topics={topic: stats}))
    exported = {s.name for family in metrics.registry.collect() for s in family.samples}
    used = {name for expr in expressions(build_dashboard()) for name in re.findall(r"streamoffload_\w+", expr)}
    assert used - exported == set()


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
