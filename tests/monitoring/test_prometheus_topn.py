"""A real Prometheus scraping a collector whose per-topic series are cut (300 synthetic topic-partitions over
three namespaces, 20 with per-topic series): every query of the dashboard evaluates without error and returns
data, the namespace variable lists every namespace, and the alert rules evaluate, firing per topic for the
worst topic-partitions and per namespace for all of them. No Spark and no broker (``test_prometheus.py``
runs the real job)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from streamoffload.dashboard.export import alert_rules_yaml
from streamoffload.dashboard.model import (
    NAMESPACE_VARIABLE_QUERY,
    build_dashboard,
    expressions,
    substitute_variables,
)
from streamoffload.metrics.collector import JobMetrics
from tests.dashboard.test_dashboard import TABLE
from tests.metrics.test_metrics_topn import feed, synthetic_topics, worst_first
from tests.monitoring.test_prometheus import Prometheus, poll, prometheus_binary

NAMESPACES = ("tenant-a/ns-0", "tenant-a/ns-1", "tenant-b/ns-0")
TOPIC_SERIES = 20
LAG_ALERT_S = 1800  # alert_rules()' default: 3 rollovers of 10 minutes


def rules(prom: Prometheus) -> dict[str, dict[str, Any]]:
    return {r["name"]: r for g in prom.get("/api/v1/rules")["groups"] for r in g["rules"]}


def test_every_dashboard_query_and_alert_rule_evaluates_on_a_cut_scrape(tmp_path: Path) -> None:
    topics = synthetic_topics(300, seed=7, namespaces=NAMESPACES)
    now_ms = int(time.time() * 1000)
    quiet = next(t for t in topics if t.behind == 0)
    failing = {quiet.topic: (4, now_ms + 3_600_000)}  # set aside for an hour, though it does not lag
    metrics = JobMetrics(read_cache=False, topic_series=TOPIC_SERIES)
    feed(metrics, topics, now_ms=now_ms)
    metrics._failing = dict(failing)  # as a store refresh finds the quarantine record
    metrics.table_figures = lambda: [TABLE]  # a table the job keeps (the dashboard's table row)
    rule_file = tmp_path / "alerts.yml"
    rule_file.write_text(alert_rules_yaml())
    host, port = metrics.start_server("127.0.0.1:0")
    work = tmp_path / "prometheus"
    work.mkdir()
    prom = Prometheus(prometheus_binary(), work, f"{host}:{port}", rule_file)
    try:
        prom.wait_ready()
        # Two scrapes at least, so rate() and increase() have two samples.
        poll(
            lambda: prom.query("rate(streamoffload_namespace_entries_offloaded_total[1m])"),
            60,
            "two scrapes of the job",
        )

        exported = set(worst_first(topics, failing, TOPIC_SERIES))
        series = prom.query('count by (topic) ({__name__=~"streamoffload_.+", topic!=""})')
        assert {s["metric"]["topic"] for s in series} == exported
        assert prom.scalar("streamoffload_topic_series_omitted") == 300 - TOPIC_SERIES
        assert prom.scalar("sum(streamoffload_namespace_topic_partitions)") == 300
        assert prom.scalar("sum(streamoffload_namespace_entries_offloaded_total)") == sum(t.entries for t in topics)
        assert prom.scalar('scrape_samples_scraped{job="streamoffload"}') < 100 + 18 * TOPIC_SERIES + 25 * 3

        # Every dashboard query: no error (Prometheus.get asserts it), and data, for all namespaces ...
        dashboard = build_dashboard()
        variables = {"__rate_interval": "1m", "__interval": "15s", "__range": "5m"}
        empty = []
        for expr in expressions(dashboard):
            promql = substitute_variables(expr, variables)
            assert "$" not in promql, promql
            if not prom.query(promql):
                empty.append(promql)
        assert empty == [], f"dashboard queries without data: {empty}"
        # ... and for one namespace chosen: the namespace panels show it alone.
        for expr in expressions(dashboard):
            promql = substitute_variables(expr, {**variables, "namespace": "tenant-a/ns-1"})
            for result in prom.query(promql):
                assert result["metric"].get("namespace", "tenant-a/ns-1") == "tenant-a/ns-1", promql
                assert (
                    result["metric"]
                    .get("topic", "persistent://tenant-a/ns-1/")
                    .startswith("persistent://tenant-a/ns-1/")
                ), promql
        # The namespace variable (label_values(metric, label) is Prometheus' label values API).
        metric = NAMESPACE_VARIABLE_QUERY.removeprefix("label_values(").split(",")[0]
        assert prom.get("/api/v1/label/namespace/values", **{"match[]": metric}) == sorted(NAMESPACES)

        # The alert rules evaluate without error. More topic-partitions lag above the threshold than have
        # per-topic series: the per-topic alert fires for those that have them, the namespace one for every
        # namespace, and the set-aside topic-partition (ranked first) has its alert.
        lagging = {t.topic for t in topics if t.lag > LAG_ALERT_S}
        assert len(lagging) > TOPIC_SERIES

        def evaluated() -> dict[str, dict[str, Any]] | None:
            found = rules(prom)
            done = all(r.get("lastEvaluation", "").startswith("2") for r in found.values())
            if done and found["StreamoffloadNamespaceLagHigh"]["alerts"]:
                return found
            return None

        found = poll(evaluated, 30, "the alert rules to be evaluated")
        assert {name: r["health"] for name, r in found.items()} == dict.fromkeys(found, "ok")
        per_topic = {a["labels"]["topic"] for a in found["StreamoffloadLagHigh"]["alerts"]}
        assert per_topic == exported & lagging and len(per_topic) == TOPIC_SERIES - 1
        per_namespace = {a["labels"]["namespace"] for a in found["StreamoffloadNamespaceLagHigh"]["alerts"]}
        assert per_namespace == set(NAMESPACES)
        assert [a["labels"]["topic"] for a in found["StreamoffloadTopicSetAside"]["alerts"]] == [quiet.topic]
        assert not found["StreamoffloadJobDown"]["alerts"]
    finally:
        prom.stop()
        metrics.stop()
