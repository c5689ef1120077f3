"""deploy/kubernetes/: every manifest valid against its schema (Kubernetes' own, shipped by kubernetes-validate, in
strict mode; the Prometheus Operator's kinds against tests/deploy/schemas/, written from its CRDs), the generated
ones not stale, and the pieces agreeing with each other and with the job (names, ports, the configuration)."""

from __future__ import annotations

import copy
import json
import runpy
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from streamoffload.config import load_config

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy" / "kubernetes"
SCHEMAS = Path(__file__).resolve().parent / "schemas"
KUBERNETES = "1.30"
"""The oldest Kubernetes the manifests are checked for (they use nothing newer)."""
CRD_SCHEMAS = {
    "ServiceMonitor": "servicemonitor-monitoring-v1.json",
    "PrometheusRule": "prometheusrule-monitoring-v1.json",
}
GENERATOR = runpy.run_path(str(ROOT / "scripts" / "gen_kubernetes_monitoring.py"))


def _documents() -> list[tuple[str, dict[str, Any]]]:
    docs = []
    for path in sorted(DEPLOY.glob("*.yaml")):
        docs += [(path.name, doc) for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")) if doc]
    return docs


DOCUMENTS = _documents()
BY_KIND = {doc["kind"]: doc for _name, doc in DOCUMENTS}


def validate(doc: dict[str, Any]) -> None:
    """Raise unless ``doc`` is valid: a CRD kind against its schema here, anything else against Kubernetes'."""
    if doc.get("kind") in CRD_SCHEMAS:
        schema = json.loads((SCHEMAS / CRD_SCHEMAS[doc["kind"]]).read_text(encoding="utf-8"))
        jsonschema.Draft202012Validator.check_schema(schema)
        jsonschema.Draft202012Validator(schema).validate(doc)
    else:
        kubernetes_validate.validate(doc, KUBERNETES, strict=True)


def test_the_example_has_every_piece():
    assert sorted(BY_KIND) == ["ConfigMap", "Deployment", "PrometheusRule", "Service", "ServiceMonitor"]
    assert len(DOCUMENTS) == len(BY_KIND)


@pytest.mark.parametrize(("name", "doc"), DOCUMENTS, ids=[f"{n}:{d['kind']}" for n, d in DOCUMENTS])
def test_every_manifest_is_valid(name, doc):
    validate(doc)


@pytest.mark.parametrize(
    ("kind", "path", "value"),
    [
        ("Deployment", ["spec", "replica"], 1),  # a typo: strict mode refuses an unknown field
        ("Deployment", ["spec", "replicas"], "one"),
        ("Service", ["spec", "ports", 0, "port"], "metrics"),
        ("ServiceMonitor", ["spec", "endpoints", 0, "intervall"], "15s"),
        ("ServiceMonitor", ["spec", "endpoints", 0, "interval"], "15 seconds"),
        ("PrometheusRule", ["spec", "groups", 0, "rules", 0, "for"], "five minutes"),
        ("PrometheusRule", ["spec", "groups", 0, "rules", 0, "record"], "both_alert_and_record"),
    ],
)
def test_the_validators_refuse_a_broken_manifest(kind, path, value):
    doc = copy.deepcopy(BY_KIND[kind])
    target = doc
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = value
    with pytest.raises((kubernetes_validate.ValidationError, jsonschema.ValidationError)):
        validate(doc)


def test_the_generated_manifests_are_not_stale():
    files = GENERATOR["render"]()
    assert sorted(p.name for p in files) == ["prometheusrule.yaml", "servicemonitor.yaml"]
    assert GENERATOR["stale"](files) == [], "run scripts/gen_kubernetes_monitoring.py"


def test_a_stale_manifest_is_found(tmp_path):
    files = {tmp_path / path.name: text for path, text in GENERATOR["render"]().items()}
    for path, text in files.items():
        path.write_text(text, encoding="utf-8")
    assert GENERATOR["stale"](files) == []
    edited = tmp_path / "prometheusrule.yaml"
    edited.write_text(edited.read_text(encoding="utf-8").replace('for: "5m"', 'for: "10m"', 1), encoding="utf-8")
    assert GENERATOR["stale"](files) == [edited]


def test_the_rules_are_the_projects_alert_rules():
    """The same rules as docker/prometheus-alerts.yml (which a real Prometheus loads: tests/monitoring), for the job
    label the ServiceMonitor gives: the Service's name."""
    docker = yaml.safe_load((ROOT / "docker" / "prometheus-alerts.yml").read_text(encoding="utf-8"))
    assert BY_KIND["PrometheusRule"]["spec"] == docker
    assert BY_KIND["Service"]["metadata"]["name"] == "streamoffload"
    assert 'job="streamoffload"' in BY_KIND["PrometheusRule"]["spec"]["groups"][0]["rules"][0]["expr"]


def test_the_pieces_agree():
    deployment, service, monitor = BY_KIND["Deployment"], BY_KIND["Service"], BY_KIND["ServiceMonitor"]
    assert deployment["spec"]["replicas"] == 1 and deployment["spec"]["strategy"] == {"type": "Recreate"}
    pod = deployment["spec"]["template"]
    assert pod["spec"]["hostname"]  # a replacement pod is the same instance to the writer lease
    labels = pod["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert service["spec"]["selector"].items() <= labels.items()
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    (container,) = pod["spec"]["containers"]
    (port,) = container["ports"]
    assert service["spec"]["ports"][0]["targetPort"] == port["name"] == monitor["spec"]["endpoints"][0]["port"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["config"]["configMap"]["name"] == BY_KIND["ConfigMap"]["metadata"]["name"]
    assert container["args"] == ["run", "--conf", f"{mounts['config']}/streamoffload.toml"]
    secrets = {e["valueFrom"]["secretKeyRef"]["name"] for e in container["env"] if "valueFrom" in e}
    assert secrets == {"streamoffload-credentials"}


def test_the_configuration_loads_and_fits_the_pod(tmp_path):
    path = tmp_path / "streamoffload.toml"
    path.write_text(BY_KIND["ConfigMap"]["data"]["streamoffload.toml"], encoding="utf-8")
    config = load_config(str(path))
    pod = BY_KIND["Deployment"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    work = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}["work"]
    assert config.spark.checkpoint.startswith(work + "/")
    assert config.metrics.address == f"0.0.0.0:{container['ports'][0]['containerPort']}"
    assert config.spark.master == f"local[{container['resources']['requests']['cpu']}]"
