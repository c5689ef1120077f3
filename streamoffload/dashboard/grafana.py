"""Pushing the dashboard through Grafana's HTTP API (:class:`GrafanaClient`, over ``urllib``): create or
update it and, if asked, its Prometheus data source. Both are idempotent."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from streamoffload import __version__
from streamoffload.dashboard.errors import DashboardError
from streamoffload.dashboard.model import DASHBOARD_UID, build_dashboard

DATASOURCE_UID = "streamoffload-prometheus"
DATASOURCE_NAME = "streamoffload Prometheus"


class GrafanaPushError(DashboardError):
    """Grafana refused or could not be reached."""


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
