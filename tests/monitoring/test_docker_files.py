"""docker/ cannot run here (no Docker engine): check its syntax and that everything it references exists
and agrees (ports, service names, bucket, mounted paths, the committed dashboard)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
import yaml

from streamoffload.config import load_config
from streamoffload.dashboard import DATASOURCE_UID, dashboard_json
from streamoffload.metrics import parse_address

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"


def load_yaml(path: Path) -> Any:
    with path.open(encoding="utf-8") as fh:
        return yaml.safe_load(fh)


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    doc = load_yaml(DOCKER / "docker-compose.yml")
    assert isinstance(doc, dict) and isinstance(doc.get("services"), dict)
    return doc


def bind_mounts(service: dict[str, Any]) -> list[tuple[str, str]]:
    out = []
    for volume in service.get("volumes", []):
        source, target = volume.split(":")[:2]
        if source.startswith((".", "/")):
            out.append((source, target))
    return out


def test_compose_has_the_stack_and_its_references_resolve(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert {"pulsar", "minio", "minio-init", "streamoffload", "prometheus", "grafana"} <= set(services)
    named_volumes = set(compose.get("volumes") or {})
    for name, service in services.items():
        assert "image" in service or "build" in service, name
        for dependency in service.get("depends_on", []):
            assert dependency in services, f"{name} depends on unknown service {dependency}"
        for source, _target in bind_mounts(service):
            assert (DOCKER / source).exists(), f"{name} mounts {source}, which does not exist"
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if not source.startswith((".", "/")):
                assert source in named_volumes, f"{name} uses undeclared volume {source}"
        for port in service.get("ports", []):
            assert re.fullmatch(r"\d+:\d+", port), f"{name}: port mapping {port!r}"


def test_dockerfile_copies_files_that_exist_and_are_not_ignored(compose: dict[str, Any]) -> None:
    build = compose["services"]["streamoffload"]["build"]
    context = (DOCKER / build["context"]).resolve()
    dockerfile = context / build["dockerfile"]
    assert context == ROOT and dockerfile.is_file()
    text = dockerfile.read_text()
    assert text.startswith("#") and re.search(r"^FROM python:3\.11-slim", text, re.M)
    assert "openjdk-17-jre" in text
    ignored = {
        line.strip().rstrip("/")
        for line in (dockerfile.parent / f"{dockerfile.name}.dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    copies = [shlex.split(line)[1:] for line in text.splitlines() if line.startswith("COPY ")]
    assert copies
    for args in copies:
        for source in args[:-1]:
            assert (context / source).exists(), f"COPY {source}: not in the build context {context}"
            assert source.rstrip("/") not in ignored, f"COPY {source} is excluded by the .dockerignore"
    # Everything the package build needs is copied.
    copied = {s.rstrip("/") for args in copies for s in args[:-1]}
    assert {"pyproject.toml", "README.md", "codecs", "storage", "checkpoints", "streaming", "streamoffload"} <= copied
    entrypoint = re.search(r"^ENTRYPOINT (.*)$", text, re.M)
    assert entrypoint is not None and "streamoffload" in entrypoint.group(1)


def test_job_config_loads_and_agrees_with_compose(compose: dict[str, Any]) -> None:
    services = compose["services"]
    job = services["streamoffload"]
    [(source, target)] = [(s, t) for s, t in bind_mounts(job) if s.endswith(".toml")]
    config = load_config(DOCKER / source)
    assert target in job["command"], "the job must be started with the mounted configuration"
    assert config.store.managedLedgerOffloadDriver == "s3"
    endpoint = urlparse(config.store.serviceEndpoint)
    assert endpoint.hostname == "minio" and str(endpoint.port) in " ".join(services["minio"]["ports"])
    assert f"local/{config.store.bucket}" in " ".join(services["minio-init"]["entrypoint"])
    assert urlparse(config.pulsar.service_url).hostname == "pulsar"
    assert {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} <= set(job["environment"])
    host, port = parse_address(config.metrics.address)
    assert host == "0.0.0.0", "Prometheus scrapes from another container: the endpoint cannot be loopback"
    assert f"{port}:{port}" in job["ports"]

    prometheus = load_yaml(DOCKER / "prometheus.yml")
    targets = [t for job_cfg in prometheus["scrape_configs"] for sc in job_cfg["static_configs"] for t in sc["targets"]]
    assert f"streamoffload:{port}" in targets
    prom_service = services["prometheus"]
    assert any(t == "/etc/prometheus/prometheus.yml" for _s, t in bind_mounts(prom_service))

    demo = services["traffic"]
    published = [demo["command"][i + 1] for i, arg in enumerate(demo["command"]) if arg == "--topic"]
    assert sorted(published) == sorted(config.pulsar.topics)


def test_grafana_provisioning_points_at_the_committed_dashboard(compose: dict[str, Any]) -> None:
    grafana = compose["services"]["grafana"]
    mounts = dict((t, s) for s, t in bind_mounts(grafana))
    provisioning = DOCKER / mounts["/etc/grafana/provisioning"]
    datasources = load_yaml(provisioning / "datasources" / "prometheus.yml")
    [ds] = datasources["datasources"]
    assert ds["type"] == "prometheus" and ds["uid"] == DATASOURCE_UID
    assert urlparse(ds["url"]).hostname == "prometheus"
    providers = load_yaml(provisioning / "dashboards" / "streamoffload.yml")["providers"]
    [provider] = providers
    container_dir = provider["options"]["path"]
    assert container_dir in mounts, "the dashboards folder the provider reads must be mounted"
    dashboards = DOCKER / mounts[container_dir]
    assert sorted(p.name for p in dashboards.iterdir()) == ["streamoffload.json"]


def test_committed_dashboard_equals_the_export() -> None:
    committed = (DOCKER / "grafana" / "dashboards" / "streamoffload.json").read_text(encoding="utf-8")
    assert committed == dashboard_json(), (
        "docker/grafana/dashboards/streamoffload.json is stale: run "
        "`streamoffload dashboard export -o docker/grafana/dashboards/streamoffload.json`"
    )
