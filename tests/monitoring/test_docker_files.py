"""docker/ cannot run here (no Docker engine): check its syntax and that everything it references exists
and agrees (ports, service names, bucket, mounted paths, the committed dashboard)."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
import yaml

from streamoffload.config import load_config, parse_metrics_address
from streamoffload.dashboard.export import dashboard_json
from streamoffload.dashboard.grafana import DATASOURCE_UID
from tests.fixtures.tools import debian_prometheus_tool

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


def dockerignored(path: str, rules: list[str]) -> bool:
    """Whether a .dockerignore excludes ``path``: the last matching rule wins, ``!`` re-includes, a rule matching
    a parent directory matches everything under it (no wildcards but ``**/`` prefixes, enough for ours)."""
    parts = path.rstrip("/").split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    excluded = False
    for rule in rules:
        negate = rule.startswith("!")
        pattern = rule[1:] if negate else rule
        if any(re.fullmatch(_glob(pattern), prefix) for prefix in prefixes):
            excluded = not negate
    return excluded


def _glob(pattern: str) -> str:
    out = re.escape(pattern).replace(r"\*\*/", "(?:.*/)?").replace(r"\*", "[^/]*")
    return out


def test_dockerignore_reading_sees_exclusions_and_exceptions() -> None:
    rules = ["docker", "!docker/constraints.txt", "**/__pycache__"]
    assert dockerignored("docker/README.md", rules) and dockerignored("docker", rules)
    assert not dockerignored("docker/constraints.txt", rules)
    assert dockerignored("codecs/__pycache__", rules) and not dockerignored("codecs", rules)


def test_dockerfile_copies_files_that_exist_and_are_not_ignored(compose: dict[str, Any]) -> None:
    build = compose["services"]["streamoffload"]["build"]
    context = (DOCKER / build["context"]).resolve()
    dockerfile = context / build["dockerfile"]
    assert context == ROOT and dockerfile.is_file()
    text = dockerfile.read_text()
    assert text.startswith("#") and re.search(r"^FROM python:3\.11-slim", text, re.M)
    assert "openjdk-17-jre" in text
    rules = [
        line.strip().rstrip("/")
        for line in (dockerfile.parent / f"{dockerfile.name}.dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    copies = [shlex.split(line)[1:] for line in text.splitlines() if line.startswith("COPY ")]
    assert copies
    for args in copies:
        for source in args[:-1]:
            assert (context / source).exists(), f"COPY {source}: not in the build context {context}"
            assert not dockerignored(source, rules), f"COPY {source} is excluded by the .dockerignore"
    # Everything the package build needs is copied.
    copied = {s.rstrip("/") for args in copies for s in args[:-1]}
    assert {
        "pyproject.toml",
        "README.md",
        "codecs",
        "storage",
        "checkpoints",
        "read",
        "streaming",
        "streamoffload",
    } <= copied
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
    init = services["minio-init"]
    assert init["environment"]["STREAMOFFLOAD_BUCKET"] == config.store.bucket
    assert "create_bucket" in " ".join(init["entrypoint"]) and "http://minio:9000" in " ".join(init["entrypoint"])
    assert urlparse(config.pulsar.service_url).hostname == "pulsar"
    assert {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} <= set(job["environment"])
    host, port = parse_metrics_address(config.metrics.address)
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


# --- the issue-13 fixes: images that exist, healthchecks, a pinned install, Pulsar without functions ------------


def image_of(service: dict[str, Any]) -> str:
    image = str(service.get("image", ""))
    match = re.fullmatch(r"\$\{\w+:-(.+)\}", image)  # ${MINIO_IMAGE:-default}: the default is what runs
    return match.group(1) if match else image


def test_images_are_pinned_to_tags_that_exist(compose: dict[str, Any]) -> None:
    for name, service in compose["services"].items():
        image = image_of(service)
        if "build" in service or image == "streamoffload:latest":
            assert image == "streamoffload:latest", name  # built here (the traffic service reuses it)
            continue
        repository, _, tag = image.rpartition(":")
        assert repository and tag and tag != "latest", f"{name}: {image} is not pinned to a release tag"
        # minio/minio and minio/mc were deleted from Docker Hub; quay.io/minio keeps the frozen releases.
        assert not repository.startswith(("minio/", "docker.io/minio/")), f"{name}: {image} no longer exists"
    minio = image_of(compose["services"]["minio"])
    assert re.fullmatch(r"quay\.io/minio/minio:RELEASE\.\d{4}-\d\d-\d\dT\d\d-\d\d-\d\dZ", minio), minio
    assert not [n for n, svc in compose["services"].items() if "minio/mc" in image_of(svc)], "mc is not needed"


def test_long_running_services_have_healthchecks(compose: dict[str, Any]) -> None:
    services = compose["services"]
    for name in ("pulsar", "minio", "streamoffload", "prometheus", "grafana"):
        check = services[name].get("healthcheck")
        assert check and check["test"][0] in ("CMD", "CMD-SHELL"), f"{name} has no healthcheck"
    job_check = " ".join(services["streamoffload"]["healthcheck"]["test"])
    config = load_config(DOCKER / "streamoffload.toml")
    _host, port = parse_metrics_address(config.metrics.address)
    assert f"127.0.0.1:{port}/metrics" in job_check
    dockerfile = (DOCKER / "Dockerfile").read_text(encoding="utf-8")
    assert re.search(r"^HEALTHCHECK .*\n\s+CMD .*/metrics", dockerfile, re.M), "the image itself has a healthcheck"
    # Whoever needs the job running waits for it to be healthy, not merely started.
    assert services["traffic"]["depends_on"]["streamoffload"]["condition"] == "service_healthy"


def test_pulsar_starts_without_the_functions_worker(compose: dict[str, Any]) -> None:
    command = compose["services"]["pulsar"]["command"]
    assert command[:2] == ["bin/pulsar", "standalone"]
    assert "--no-functions-worker" in command and "--no-stream-storage" in command


def test_the_job_image_installs_pinned_dependencies() -> None:
    import tomllib

    from packaging.requirements import Requirement

    dockerfile = (DOCKER / "Dockerfile").read_text(encoding="utf-8")
    [install] = [line for line in dockerfile.splitlines() if "pip install" in line]
    assert "-c docker/constraints.txt" in install, install
    assert "COPY docker/constraints.txt docker/constraints.txt" in dockerfile
    pins = {}
    for line in (DOCKER / "constraints.txt").read_text(encoding="utf-8").splitlines():
        if line and not line.startswith("#"):
            name, sep, version = line.partition("==")
            assert sep and re.fullmatch(r"[\w.+!-]+", version), f"constraints.txt: {line!r} is not an exact pin"
            pins[re.sub(r"[-_.]+", "-", name).lower()] = version
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    for text in project["dependencies"]:
        requirement = Requirement(text)
        name = re.sub(r"[-_.]+", "-", requirement.name).lower()
        assert name in pins, f"{name} (a dependency in pyproject.toml) is not pinned: run docker/pin_constraints.py"
        assert requirement.specifier.contains(pins[name], prereleases=True), f"{name}=={pins[name]} vs {text}"


def test_prometheus_loads_the_committed_alert_rules(compose: dict[str, Any], tmp_path: Path) -> None:
    from streamoffload.dashboard.export import alert_rules_yaml

    committed = (DOCKER / "prometheus-alerts.yml").read_text(encoding="utf-8")
    assert committed == alert_rules_yaml(), (
        "docker/prometheus-alerts.yml is stale: run `streamoffload dashboard export --alerts -o "
        "docker/prometheus-alerts.yml`"
    )
    mounts = {t: s for s, t in bind_mounts(compose["services"]["prometheus"])}
    prometheus = load_yaml(DOCKER / "prometheus.yml")
    [rule_file] = prometheus["rule_files"]
    assert rule_file in mounts and (DOCKER / mounts[rule_file]).resolve() == (DOCKER / "prometheus-alerts.yml")
    promtool = debian_prometheus_tool("promtool")
    # The configuration as the container sees it: the rule file at its mounted path.
    local = tmp_path / "prometheus.yml"
    local.write_text(
        (DOCKER / "prometheus.yml").read_text(encoding="utf-8").replace(rule_file, str(DOCKER / mounts[rule_file])),
        encoding="utf-8",
    )
    result = subprocess.run([promtool, "check", "config", str(local)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    from streamoffload.dashboard.alerts import alert_rules

    rules = alert_rules()["groups"][0]["rules"]
    assert f"{len(rules)} rules found" in result.stdout + result.stderr
