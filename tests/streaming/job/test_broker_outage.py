"""A job whose broker is gone keeps retrying with capped backoff and says so (log, ``status``, the
``streamoffload_broker_unreachable`` gauge); once the broker is back on the same data it resumes, exactly."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from streamoffload.cli import main
from streamoffload.config import load_config
from streamoffload.metrics.collector import JobMetrics
from streamoffload.produce import expected_payload, produce
from streamoffload.storage.filesystem import FilesystemStore
from streamoffload.storage.location import ScopedStore
from streamoffload.streaming.job.health import broker_unreachable, read_health
from streamoffload.streaming.job.offload_job import OffloadJob
from tests.fixtures.broker import unique_topic
from tests.fixtures.job import fs_store, write_config
from tests.fixtures.readback import read_messages

pytestmark = [pytest.mark.spark, pytest.mark.broker]

QUICK_SEALS = """
[offload]
managedLedgerOffloadMaxBlockSizeInBytes = 8192
maxSizePerOffloadSegmentMbytes = 0.03
maxOffloadSegmentRolloverTimeSeconds = 2
"""

RETRY_TIMEOUT_S = 10


def poll(condition: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def gauge(metrics: JobMetrics, name: str) -> float:
    for family in metrics.registry.collect():
        for sample in family.samples:
            if sample.name == name:
                return float(sample.value)
    raise AssertionError(f"{name} not exported")


def test_the_probe_names_why_a_broker_cannot_be_reached() -> None:
    assert broker_unreachable("pulsar://127.0.0.1:1", timeout_s=1) == "connection refused"


def test_a_gone_broker_is_retried_visibly_until_it_is_back_then_the_job_is_exact(
    spark: Any, make_broker: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture
) -> None:
    broker = make_broker(default_partitions=0)
    topic = unique_topic("broker-outage")
    produce(broker.service_url, topic, count=100, payload_size=200, batching=True, batch_size=10)
    config_path = write_config(tmp_path, broker.service_url, [topic], fs_store(tmp_path), QUICK_SEALS)
    job = OffloadJob(load_config(config_path), str(config_path))
    # The source rides out a broker restart for retryTimeoutSeconds (60 s by default) before the query fails
    # and the job's own outage handling, under test here, takes over: 10 s, so the test does not wait 50 s.
    source_options = job.source_options
    job.source_options = lambda **kw: {**source_options(**kw), "retryTimeoutSeconds": str(RETRY_TIMEOUT_S)}
    metrics = JobMetrics(read_cache=False)
    metrics.job_health = lambda: job.health.current
    store = FilesystemStore(tmp_path / "store")
    caplog.set_level(logging.WARNING, logger="streamoffload.streaming.job")
    # Short backoffs, so the test sees several attempts of the series in seconds.
    runner = threading.Thread(
        target=job.run_forever,
        args=(spark,),
        # No failure of another cause may be retried: the retries seen are the broker's own series.
        kwargs={"backoff_s": 1.0, "broker_backoff_cap_s": 2.0, "max_restarts": 0},
        daemon=True,
    )
    runner.start()
    try:
        poll(lambda: job.query is not None and job.query.lastProgress is not None, 240, "the job's first batch")
        broker.kill()
        health = poll(lambda: job.health.current.attempts >= 3 and job.health.current, 180, "three attempts")
        assert health.broker_unreachable and health.cause == "connection refused", health
        assert runner.is_alive()  # it never gives up while the broker is away
        assert gauge(metrics, "streamoffload_broker_unreachable") == 1.0
        assert gauge(metrics, "streamoffload_query_restarts_total") >= 1
        lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("broker ")]
        assert lines and lines[0].startswith(
            f"broker {broker.service_url} unreachable: connection refused; retrying"
        ), lines
        assert "\n" not in lines[0]
        # `status` (another process in real life: it reads the store's health record) says so.
        assert main(["status", "--store", str(tmp_path / "store"), "--no-broker"]) == 0
        out = capsys.readouterr().out
        assert out.startswith(f"JOB: broker {broker.service_url} unreachable since "), out
        assert "connection refused" in out.splitlines()[0]

        broker.start()  # same port, same data directory
        produce(broker.service_url, topic, count=100, payload_size=200, batching=True, batch_size=10)
        poll(lambda: not job.health.current.broker_unreachable, 60, "the job to see the broker back")
        assert gauge(metrics, "streamoffload_broker_unreachable") == 0.0
        # The job sets its health in memory, then writes the store's record: the record follows.
        record = poll(
            lambda: (r := read_health(ScopedStore(store))) is not None and not r.broker_unreachable and r,
            60,
            "the store's health record to say the broker is back",
        )
        assert record.line() == ""

        def stored() -> int:
            try:
                return sum(1 for _ in _messages(store, topic))
            except Exception:
                return 0

        poll(lambda: stored() >= 200, 240, "all 200 messages in the store")
    finally:
        job.stop()
        runner.join(120)
    # Two `produce` calls each number their messages from 0: the second hundred repeats the first's payloads.
    got = list(_messages(store, topic))
    first = [expected_payload(topic, seq, 200) for seq in range(100)]
    assert got == first + first  # every message once, in order: nothing lost or doubled by the outage


def _messages(store: FilesystemStore, topic: str) -> list[bytes]:
    messages = read_messages(ScopedStore(store), topic)
    positions = [(m.ledger_id, m.entry_id, m.batch_index) for m in messages]
    assert positions == sorted(positions) and len(set(positions)) == len(positions), "in order, once each"
    return [m.payload for m in messages]


def test_a_failed_query_is_logged_as_one_line_naming_the_cause() -> None:
    from streamoffload.streaming.job.supervision import _one_line

    spark_text = (
        "An exception was raised by the Python Proxy. Return Message: Traceback (most recent call last):\n"
        '  File "/x/clientserver.py", line 617, in _call_proxy\n'
        "streamoffload.storage.base.StorageError: file:///s: put 'a' failed: No space left on device (/s/a)\n"
        "\n\tat org.apache.spark.sql.execution.streaming.sources.PythonForeachBatchHelper$.call(Sink.scala:51)\n"
        "org.apache.spark.SparkException: Job aborted"
    )
    assert _one_line(spark_text) == (
        "streamoffload.storage.base.StorageError: file:///s: put 'a' failed: No space left on device (/s/a)"
    )
    assert _one_line(RuntimeError("plain: why")) == "plain: why"
