"""A real Prometheus scraping the offload job: the metrics carry the right values for a known
workload, and every PromQL expression of the exported dashboard returns data.

Prometheus comes from Debian (``apt-get install prometheus``); ``scripts/test.sh`` installs it when
it is missing. Without it the test is skipped locally and fails under CI (``CI`` set).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from streamoffload.checkpoints.metadata_store import MetadataStore
from streamoffload.config import Config, MetricsSettings, PulsarSettings, SparkSettings, StoreSettings
from streamoffload.dashboard.model import (
    NAMESPACE_VARIABLE_QUERY,
    TOPIC_VARIABLE_QUERY,
    annotation_expressions,
    build_dashboard,
    expressions,
    families_of,
    substitute_variables,
)
from streamoffload.embedded_broker import free_port
from streamoffload.metrics import definitions
from streamoffload.metrics.install import install_metrics
from streamoffload.produce import produce
from streamoffload.pulsar import raw_reader
from streamoffload.pulsar.exactly_once import BEFORE_EARLIEST
from streamoffload.streaming.job.offload_job import OffloadJob
from tests.fixtures.broker import unique_topic
from tests.fixtures.tools import debian_prometheus_tool

pytestmark = [pytest.mark.spark, pytest.mark.broker]

SCRAPE_INTERVAL_S = 1
MESSAGES = 300  # per topic, unbatched (one entry each), spread over two partitions
PAYLOAD = 400


def prometheus_binary() -> str:
    return debian_prometheus_tool("prometheus")


def poll(condition: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = condition()
        if last:
            return last
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")


class Prometheus:
    def __init__(self, binary: str, work: Path, target: str, rule_file: Path | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = work / "prometheus.yml"
        rules = f"rule_files:\n  - {rule_file}\n" if rule_file is not None else ""
        config.write_text(
            f"""
global:
  scrape_interval: {SCRAPE_INTERVAL_S}s
  evaluation_interval: {SCRAPE_INTERVAL_S}s
{rules}scrape_configs:
  - job_name: streamoffload
    static_configs:
      - targets: ["{target}"]
"""
        )
        self.log = (work / "prometheus.log").open("wb")
        self.proc = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={work / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--log.level=warn",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: stopped as a whole
        )
        self.log_path = work / "prometheus.log"

    def wait_ready(self, timeout: float = 30) -> None:
        def ready() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"prometheus exited {self.proc.returncode}: {self.log_path.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as response:
                    return response.status == 200
            except OSError:
                return False

        poll(ready, timeout, "prometheus to become ready")

    def get(self, path: str, **params: str) -> Any:
        url = f"{self.url}{path}?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=10) as response:
            doc = json.load(response)
        assert doc["status"] == "success", doc
        return doc["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        data = self.get("/api/v1/query", query=expr)
        assert data["resultType"] == "vector", (expr, data)
        return data["result"]

    def scalar(self, expr: str) -> float | None:
        result = self.query(expr)
        return float(result[0]["value"][1]) if result else None

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=5)
        self.log.close()


@pytest.fixture
def prometheus_factory(tmp_path: Path) -> Iterator[Callable[..., Prometheus]]:
    binary = prometheus_binary()
    started: list[Prometheus] = []

    def start(target: str, rule_file: Path | None = None) -> Prometheus:
        work = tmp_path / "prometheus"
        work.mkdir()
        prom = Prometheus(binary, work, target, rule_file)
        started.append(prom)
        prom.wait_ready()
        return prom

    yield start
    for prom in started:
        prom.stop()


def published_entries(service_url: str, topic: str) -> tuple[int, int, tuple[int, int]]:
    """Entries, entry bytes and the latest position of a topic-partition, read straight from the broker
    as the job reads it (the raw-entry reader: entries byte for byte as the broker stores them)."""
    client = raw_reader.RawClient(service_url)
    latest = raw_reader.latest_position_raw(client, topic)
    assert latest is not None, f"nothing published to {topic}"
    count = size = 0
    for entry in raw_reader.read_range_raw(client, topic, BEFORE_EARLIEST, latest):
        count += 1
        size += len(entry.payload)
    return count, size, latest


def test_prometheus_scrapes_true_values_and_every_dashboard_query_has_data(
    spark: Any, pulsar_broker: Any, tmp_path: Path, prometheus_factory: Callable[..., Prometheus]
) -> None:
    service_url = pulsar_broker.service_url
    base = unique_topic("metrics")
    plain = unique_topic("metrics-plain")
    produce(service_url, base, MESSAGES, PAYLOAD, partitions=2, batching=False)
    produce(service_url, plain, MESSAGES // 3, PAYLOAD, batching=True, batch_size=20)  # batched: fewer entries
    topics = [f"{base}-partition-0", f"{base}-partition-1", plain]
    expected = {t: published_entries(service_url, t) for t in topics}
    assert expected[topics[0]][0] == MESSAGES // 2

    config = Config(
        pulsar=PulsarSettings(service_url=service_url, topics=tuple(topics)),
        store=StoreSettings(root=str(tmp_path / "store")),
        spark=SparkSettings(checkpoint=str(tmp_path / "checkpoint"), trigger_interval="1 second"),
        metrics=MetricsSettings(address=""),
        broker_policy={
            "managedLedgerOffloadMaxBlockSizeInBytes": 16384,
            "maxSizePerOffloadSegmentMbytes": 0.04,  # several segments sealed by size per partition
            # 8 s: the last segments seal by time, no traffic needed; long enough after the size seals for
            # several 1 s scrapes to see the lag above 0 (the first micro-batch alone can take 3 s).
            "maxOffloadSegmentRolloverTimeMinutes": 0.13,
            "offloadTable": True,  # the job keeps the topics' Iceberg tables: their panels have data too
        },
    )
    job = OffloadJob(config)
    metrics = install_metrics(job, spark, "127.0.0.1:0", store_refresh_s=1, backlog_interval_s=1)
    try:
        host, port = metrics.address or ("", 0)
        prom = prometheus_factory(f"{host}:{port}")
        poll(lambda: prom.query('up{job="streamoffload"} == 1'), 30, "the first scrape of the job")

        # The continuously running job, as in production (catches up, then time rollovers seal the rest).
        runner = threading.Thread(target=job.run_forever, args=(spark,), name="offload-job", daemon=True)
        runner.start()

        total_entries = sum(e for e, _, _ in expected.values())
        total_bytes = sum(b for _, b, _ in expected.values())

        def offloaded() -> tuple[float | None, float | None]:
            return (
                prom.scalar("sum(streamoffload_entries_offloaded_total)"),
                prom.scalar("sum(streamoffload_bytes_offloaded_total)"),
            )

        try:
            poll(
                lambda: offloaded() == (total_entries, total_bytes),
                150,
                f"{total_entries} entries, {total_bytes} bytes offloaded",
            )
            # Behind on purpose: new traffic on a caught-up topic opens a segment that seals by time 8 s later;
            # until then the lag is above 0. (The first catch-up may take longer than the rollover on a loaded
            # machine, sealing everything in one micro-batch: no scrape would see it behind.)
            poll(lambda: prom.scalar("max(streamoffload_offload_lag_seconds)") == 0, 30, "lag 0 once caught up")
            produce(service_url, plain, 3, PAYLOAD, batching=False)
            expected[plain] = published_entries(service_url, plain)
            total_entries = sum(e for e, _, _ in expected.values())
            total_bytes = sum(b for _, b, _ in expected.values())
            poll(lambda: (prom.scalar("max(streamoffload_offload_lag_seconds)") or 0) > 0, 30, "lag above 0")
            poll(
                lambda: offloaded() == (total_entries, total_bytes),
                60,
                f"{total_entries} entries, {total_bytes} bytes offloaded after new traffic",
            )
        finally:
            job.stop()
            runner.join(timeout=60)
        assert not runner.is_alive(), "the job did not stop"
        for topic, (entries, nbytes, _latest) in expected.items():
            assert prom.scalar(f'streamoffload_entries_offloaded_total{{topic="{topic}"}}') == entries
            assert prom.scalar(f'streamoffload_bytes_offloaded_total{{topic="{topic}"}}') == nbytes

        # The store agrees, and so do the segment gauges and seal counters.
        meta = MetadataStore(config.store.location.open())
        segments = {t: meta.offloaded_segments(t) for t in topics}
        assert sum(m.entries for ms in segments.values() for m in ms) == total_entries
        n_segments = sum(len(ms) for ms in segments.values())
        assert n_segments > len(topics)
        poll(
            lambda: prom.scalar('sum(streamoffload_segments{status="Offloaded"})') == n_segments,
            15,
            "the segment gauge to count every offloaded segment",
        )
        assert prom.scalar("sum(streamoffload_segments_sealed_total)") == n_segments
        assert prom.scalar('sum(streamoffload_segments_sealed_total{reason="size"})') >= 1
        assert prom.scalar('sum(streamoffload_segments_sealed_total{reason="time"})') >= len(topics)
        assert prom.scalar("sum(streamoffload_segment_size_bytes_count)") == n_segments
        # The namespace totals say the same (every topic-partition has per-topic series here: 3 of 100).
        assert prom.scalar("sum(streamoffload_namespace_entries_offloaded_total)") == total_entries
        assert prom.scalar("sum(streamoffload_namespace_bytes_offloaded_total)") == total_bytes
        assert prom.scalar('sum(streamoffload_namespace_segments{status="Offloaded"})') == n_segments
        assert prom.scalar("sum(streamoffload_namespace_segments_sealed_total)") == n_segments
        assert prom.scalar("sum(streamoffload_namespace_topic_partitions)") == len(topics)
        assert prom.scalar("streamoffload_topic_series_omitted") == 0
        assert prom.scalar("sum(streamoffload_segment_size_bytes_sum)") == sum(
            m.dataLength for ms in segments.values() for m in ms
        )
        assert prom.scalar('sum(streamoffload_segments{status=~"Assigned|Failed"})') == 0

        # Caught up: lag 0 and nothing behind, for every topic-partition (it was above 0 while behind, above).
        poll(lambda: prom.scalar("max(streamoffload_offload_lag_seconds)") == 0, 15, "lag to fall to 0")
        for topic, (_entries, _bytes, latest) in expected.items():
            assert metrics.source_latest(topic) == latest, "Spark progress did not carry the source's latest offset"
        assert len(prom.query("streamoffload_offload_lag_seconds")) == len(topics)
        assert prom.scalar("max(streamoffload_backlog_entries)") == 0
        newest = max(m.publishTimeLast for ms in segments.values() for m in ms) / 1000
        assert prom.scalar("max(streamoffload_last_offloaded_publish_timestamp_seconds)") == pytest.approx(newest)

        # Spark's progress arrived through the StreamingQueryListener.
        poll(lambda: (prom.scalar("sum(streamoffload_batches_total)") or 0) >= 2, 15, "micro-batch progress")
        assert prom.scalar("sum(streamoffload_input_rows_total)") >= total_entries
        assert prom.scalar("sum(streamoffload_batch_duration_seconds_count)") >= 2
        assert prom.scalar("sum(streamoffload_upload_duration_seconds_count)") >= n_segments
        assert prom.scalar("sum(streamoffload_upload_errors_total)") == 0

        # Every query of the dashboard returns data for this workload.
        dashboard = build_dashboard()
        variables = {"topic": ".*", "__rate_interval": "1m", "__interval": "15s", "__range": "5m"}
        empty = []
        for expr in expressions(dashboard):
            promql = substitute_variables(expr, variables)
            assert "$" not in promql, promql
            if not prom.query(promql):
                empty.append(expr)
        # But those of families this workload leaves absent: no topic-partition fails, and the source reports no
        # bytes behind without a backlog file (test_prometheus_topn.py has data for all of them).
        absent = {
            definitions.TOPIC_FAILURES_IN_A_ROW.name,
            definitions.TOPIC_SET_ASIDE.name,
            definitions.SOURCE_BACKLOG_BYTES.name,
            definitions.NAMESPACE_SOURCE_BACKLOG_BYTES.name,
        }
        expected_empty = [
            e
            for e in expressions(dashboard)
            if families_of(e) and families_of(e) <= absent and not e.endswith(" or vector(0)")  # 0: none fails
        ]
        assert empty == expected_empty, f"dashboard queries without data: {empty}"
        assert len(expected_empty) == 5  # the table's three columns, the two backlog-bytes series
        # The annotations' queries evaluate (Prometheus.get asserts no error); the first run's policy version is
        # no change (the gauge's step from 0 when the run started is not marked).
        restarts, policy = (substitute_variables(e, variables) for e in annotation_expressions(dashboard))
        prom.query(restarts)
        assert prom.query(policy) == []
        # ... and so does the topic variable (label_values(metric, topic) is Prometheus' label values API).
        assert TOPIC_VARIABLE_QUERY.startswith("label_values(streamoffload_entries_offloaded_total, topic")
        values = prom.get("/api/v1/label/topic/values", **{"match[]": "streamoffload_entries_offloaded_total"})
        assert set(topics) <= set(values)
        assert NAMESPACE_VARIABLE_QUERY == "label_values(streamoffload_namespace_topic_partitions, namespace)"
        values = prom.get("/api/v1/label/namespace/values", **{"match[]": "streamoffload_namespace_topic_partitions"})
        assert {t.split("://")[1].rsplit("/", 1)[0] for t in topics} <= set(values)
        # A misspelt metric would have been caught: the same check on a query that matches nothing fails.
        assert prom.query(substitute_variables(expressions(dashboard)[0].replace("lag", "lagg"), variables)) == []
    finally:
        metrics.stop()
    assert metrics.on_batch not in job.listeners
