"""Metrics from synthetic and real (segmenter + sink, no Spark) batch reports, and from the store."""

from __future__ import annotations

import json
import math
import threading
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from streamoffload.checkpoints.metadata_store import MetadataStore
from streamoffload.checkpoints.policy import OffloadPolicy
from streamoffload.config import Config, parse_metrics_address
from streamoffload.errors import ConfigError
from streamoffload.metrics.collector import JobMetrics
from streamoffload.metrics.install import install_metrics
from streamoffload.metrics.model import Backlog, CacheCounters
from streamoffload.storage.filesystem import FilesystemStore
from streamoffload.storage.location import ScopedStore
from streamoffload.streaming.handoff.actions import SealReport, StatsAction
from streamoffload.streaming.job.report import BatchReport
from streamoffload.streaming.segmenter.segmenter import run_segmenter
from streamoffload.streaming.segmenter.segmenter_model import CONTROL_SEAL, MemoryState
from streamoffload.streaming.sink.sink import SegmentSink, SinkStats
from tests.fixtures.entries import Published, memory_sink, publish_to
from tests.fixtures.reports import figures, seal_report

TOPIC = "persistent://public/default/orders-partition-0"
OTHER = "persistent://public/default/orders-partition-1"


def value(metrics: JobMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def seal(topic: str, segment: str, entries: int, entry_bytes: int, data_length: int, reason: str) -> SealReport:
    return seal_report(topic, segment, reason=reason, data_length=data_length, entries=entries, entry_bytes=entry_bytes)


def stats(
    buffered: int, open_segment: str | None, entries: int, assigned_ms: int | None, last: Sequence[int]
) -> StatsAction:
    return figures(
        buffered_bytes=buffered,
        open_segment=open_segment,
        open_segment_entries=entries,
        open_segment_bytes=entries * 100,
        open_segment_assigned_ms=assigned_ms,
        last_position=tuple(last),
    )


class FakeClock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


# ---------------------------------------------------------------------------------------------
# from batch reports alone


def test_batch_reports_drive_counters_gauges_and_histograms() -> None:
    clock = FakeClock(1_000.0)
    metrics = JobMetrics(clock=clock)
    metrics.on_batch(
        BatchReport(
            batch_id=0,
            duration_s=0.3,
            stats=SinkStats(
                parts=3,
                part_bytes=3000,
                opened=2,
                sealed=[seal(TOPIC, "a", 10, 1000, 1300, "size"), seal(OTHER, "b", 4, 400, 700, "time")],
                upload_seconds=[0.002, 0.02, 0.2],
                topics={
                    TOPIC: stats(512, "c", 3, 990_000, (5, 12)),
                    OTHER: stats(0, None, 0, None, (6, 3)),
                },
            ),
        )
    )
    assert value(metrics, "streamoffload_entries_offloaded_total", topic=TOPIC) == 10
    assert value(metrics, "streamoffload_bytes_offloaded_total", topic=TOPIC) == 1000
    assert value(metrics, "streamoffload_entries_offloaded_total", topic=OTHER) == 4
    assert value(metrics, "streamoffload_segments_sealed_total", topic=TOPIC, reason="size") == 1
    assert value(metrics, "streamoffload_segments_sealed_total", topic=OTHER, reason="time") == 1
    # Segment sizes: one histogram for the whole job (per topic it would be 16 series each).
    assert value(metrics, "streamoffload_segment_size_bytes_count") == 2
    assert value(metrics, "streamoffload_segment_size_bytes_sum") == 2000
    assert value(metrics, "streamoffload_segment_size_bytes_bucket", le="1048576.0") == 2
    assert value(metrics, "streamoffload_segment_size_bytes_count", topic=TOPIC) is None
    assert value(metrics, "streamoffload_upload_duration_seconds_count") == 3
    assert value(metrics, "streamoffload_upload_duration_seconds_bucket", le="0.01") == 1
    assert value(metrics, "streamoffload_parts_uploaded_total") == 3
    assert value(metrics, "streamoffload_part_bytes_uploaded_total") == 3000
    assert value(metrics, "streamoffload_segments_opened_total") == 2
    assert value(metrics, "streamoffload_offload_buffer_bytes", topic=TOPIC) == 512
    assert value(metrics, "streamoffload_open_segment_entries", topic=TOPIC) == 3
    assert value(metrics, "streamoffload_open_segment_bytes", topic=TOPIC) == 300
    assert value(metrics, "streamoffload_open_segment_age_seconds", topic=TOPIC) == 10.0
    assert value(metrics, "streamoffload_open_segment_age_seconds", topic=OTHER) == 0.0
    assert value(metrics, "streamoffload_segments", topic=TOPIC, status="Offloaded") == 1
    assert value(metrics, "streamoffload_segments", topic=TOPIC, status="Assigned") == 1
    assert value(metrics, "streamoffload_segments", topic=TOPIC, status="Failed") == 0
    assert value(metrics, "streamoffload_stored_bytes", topic=TOPIC) == 1300
    assert value(metrics, "streamoffload_last_batch_timestamp_seconds") == 1000.0

    # A replayed micro-batch reports the same seal again: counted once.
    metrics.on_batch(BatchReport(1, 0.1, SinkStats(sealed=[seal(TOPIC, "a", 10, 1000, 1300, "size")], errors=1)))
    assert value(metrics, "streamoffload_entries_offloaded_total", topic=TOPIC) == 10
    assert value(metrics, "streamoffload_segments_sealed_total", topic=TOPIC, reason="size") == 1
    assert value(metrics, "streamoffload_upload_errors_total") == 1
    assert value(metrics, "streamoffload_sink_duration_seconds_count") == 2


def test_spark_progress_and_query_failures() -> None:
    metrics = JobMetrics()
    metrics.on_progress(
        {
            "durationMs": {"triggerExecution": 1500},
            "numInputRows": 40,
            "inputRowsPerSecond": 8.0,
            "processedRowsPerSecond": 26.5,
        }
    )
    metrics.on_progress({"durationMs": {"triggerExecution": 20}, "numInputRows": 0, "inputRowsPerSecond": math.nan})
    assert value(metrics, "streamoffload_batch_duration_seconds_count") == 2
    assert value(metrics, "streamoffload_batch_duration_seconds_sum") == pytest.approx(1.52)
    assert value(metrics, "streamoffload_batches_total") == 2
    assert value(metrics, "streamoffload_input_rows_total") == 40
    assert value(metrics, "streamoffload_input_rows_per_second") == 8.0  # the NaN of an empty batch is not kept
    assert value(metrics, "streamoffload_processed_rows_per_second") == 26.5
    metrics.on_query_failed()
    assert value(metrics, "streamoffload_query_failures_total") == 1


def test_read_cache_counters_add_up_and_a_failing_source_is_skipped() -> None:
    metrics = JobMetrics()
    assert value(metrics, "streamoffload_read_cache_hits_total") == 0
    metrics.add_read_cache(lambda: CacheCounters(hits=5, misses=2))
    metrics.add_read_cache(lambda: CacheCounters(hits=1, misses=1))

    def broken() -> CacheCounters:
        raise RuntimeError("reader closed")

    metrics.add_read_cache(broken)
    assert value(metrics, "streamoffload_read_cache_hits_total") == 6
    assert value(metrics, "streamoffload_read_cache_misses_total") == 3


# ---------------------------------------------------------------------------------------------
# real segmenter + sink on a filesystem store


def policy() -> OffloadPolicy:
    return OffloadPolicy(
        managedLedgerOffloadMaxBlockSizeInBytes=4096,
        maxSizePerOffloadSegmentMbytes=12_000 / (1024 * 1024),
        maxOffloadSegmentRolloverTimeMinutes=1.0,
        offloadBufferMaxBytes=1 << 20,
    )


def entries(ledger: int, count: int, publish_base: int) -> list[Published]:
    return [Published(ledger, i, bytes([i % 251]) * (100 + i % 300), publish_base + i) for i in range(count)]


def run_batch(
    sink: SegmentSink, state: MemoryState, batch: list[Published], now_ms: int, seal_all: bool = False
) -> BatchReport:
    """One micro-batch: the segmenter sees ``batch``'s metadata, ``sink`` (a ``memory_sink``) fetches its bytes."""
    seen = publish_to(sink, TOPIC, batch)
    actions = run_segmenter(TOPIC, policy(), state, seen, [CONTROL_SEAL] if seal_all else [], now_ms=now_ms)
    sink_stats = sink.apply(actions)
    return BatchReport(batch_id=0, duration_s=0.01, stats=sink_stats)


@pytest.fixture
def store(tmp_path: Path) -> FilesystemStore:
    return FilesystemStore(tmp_path / "store", fsync=False)


def test_store_derived_totals_equal_batch_totals_and_survive_a_restart(store: FilesystemStore) -> None:
    meta = MetadataStore(ScopedStore(store))
    sink, state = memory_sink(ScopedStore(store)), MemoryState()
    live = JobMetrics(meta)
    live.refresh_store()  # empty store
    published = entries(7, 150, publish_base=1_700_000_000_000)
    for i, start in enumerate(range(0, 150, 40)):
        live.on_batch(run_batch(sink, state, published[start : start + 40], now_ms=1_000 + i))
    live.on_batch(run_batch(sink, state, [], now_ms=2_000, seal_all=True))

    manifests = meta.offloaded_segments(TOPIC)
    assert len(manifests) > 2
    expected_entries = sum(m.entries for m in manifests)
    expected_bytes = sum(m.entryBytes for m in manifests)
    assert expected_entries == 150
    assert expected_bytes == sum(len(e.payload) for e in published)
    assert value(live, "streamoffload_entries_offloaded_total", topic=TOPIC) == 150
    assert value(live, "streamoffload_bytes_offloaded_total", topic=TOPIC) == expected_bytes

    # A restarted job starts its counters from the store, not from zero.
    restarted = JobMetrics(meta)
    restarted.refresh_store()
    for name in ("streamoffload_entries_offloaded_total", "streamoffload_bytes_offloaded_total"):
        assert value(restarted, name, topic=TOPIC) == value(live, name, topic=TOPIC)
    for reason in {m.sealReason for m in manifests}:
        n = sum(1 for m in manifests if m.sealReason == reason)
        assert value(restarted, "streamoffload_segments_sealed_total", topic=TOPIC, reason=reason) == n
        assert value(live, "streamoffload_segments_sealed_total", topic=TOPIC, reason=reason) == n
    assert value(restarted, "streamoffload_segment_size_bytes_count") == len(manifests)
    assert value(restarted, "streamoffload_segment_size_bytes_sum") == sum(m.dataLength for m in manifests)
    assert value(restarted, "streamoffload_segments", topic=TOPIC, status="Offloaded") == len(manifests)
    assert value(restarted, "streamoffload_segments", topic=TOPIC, status="Assigned") == 0
    # Refreshing again (or the live one refreshing) changes nothing: segments are counted once, by UUID.
    restarted.refresh_store()
    live.refresh_store()
    assert value(restarted, "streamoffload_entries_offloaded_total", topic=TOPIC) == 150
    assert value(live, "streamoffload_entries_offloaded_total", topic=TOPIC) == 150


def test_lag_is_zero_when_caught_up_and_grows_from_the_newest_publish_time_when_behind(store: FilesystemStore) -> None:
    meta = MetadataStore(ScopedStore(store))
    sink, state = memory_sink(ScopedStore(store)), MemoryState()
    published = entries(3, 60, publish_base=5_000_000)
    run_batch(sink, state, published, now_ms=1, seal_all=True)
    latest: dict[str, Backlog] = {TOPIC: Backlog(latest=(3, 59))}
    clock = FakeClock(5_000.0 + 100)  # 100 s after the newest entry (published at 5_000_059 ms)
    metrics = JobMetrics(meta, backlog=lambda topics: dict(latest), clock=clock)
    metrics.refresh_store()
    metrics.refresh_backlog()
    assert value(metrics, "streamoffload_offload_lag_seconds", topic=TOPIC) == 0.0
    assert value(metrics, "streamoffload_backlog_entries", topic=TOPIC) == 0
    assert value(metrics, "streamoffload_last_offloaded_publish_timestamp_seconds", topic=TOPIC) == 5_000.059

    latest[TOPIC] = Backlog(latest=(3, 75))  # 16 entries published since
    metrics.refresh_backlog()
    assert value(metrics, "streamoffload_offload_lag_seconds", topic=TOPIC) == pytest.approx(100 - 0.059)
    assert value(metrics, "streamoffload_backlog_entries", topic=TOPIC) == 16

    latest[TOPIC] = Backlog(latest=(4, 2))  # in a newer ledger: how many entries lie between is unknown
    metrics.refresh_backlog()
    assert value(metrics, "streamoffload_backlog_entries", topic=TOPIC) is None
    latest[TOPIC] = Backlog(latest=(4, 2), entries=3, bytes=900)  # a source that can count says so
    metrics.refresh_backlog()
    assert value(metrics, "streamoffload_backlog_entries", topic=TOPIC) == 3
    assert value(metrics, "streamoffload_source_backlog_bytes", topic=TOPIC) == 900


def test_without_a_latest_position_the_job_s_own_read_position_decides(store: FilesystemStore) -> None:
    meta = MetadataStore(ScopedStore(store))
    sink, state = memory_sink(ScopedStore(store)), MemoryState()
    clock = FakeClock(5_100.0)
    metrics = JobMetrics(meta, clock=clock)
    published = entries(3, 30, publish_base=5_000_000)
    metrics.on_batch(run_batch(sink, state, published[:20], now_ms=1, seal_all=True))
    metrics.refresh_store([TOPIC])
    assert value(metrics, "streamoffload_offload_lag_seconds", topic=TOPIC) == 0.0
    metrics.on_batch(run_batch(sink, state, published[20:], now_ms=2))  # read, not yet sealed
    lag = value(metrics, "streamoffload_offload_lag_seconds", topic=TOPIC)
    assert lag == pytest.approx(5_100 - 5_000.019)
    assert value(metrics, "streamoffload_backlog_entries", topic=TOPIC) == 10
    assert value(metrics, "streamoffload_segments", topic=TOPIC, status="Assigned") == 1


def test_retention_deletion_keeps_counters_and_shrinks_gauges(store: FilesystemStore) -> None:
    meta = MetadataStore(ScopedStore(store))
    sink, state = memory_sink(ScopedStore(store)), MemoryState()
    run_batch(sink, state, entries(1, 120, 1), now_ms=1, seal_all=True)
    metrics = JobMetrics(meta)
    metrics.refresh_store()
    manifests = meta.offloaded_segments(TOPIC)
    stored_before = value(metrics, "streamoffload_stored_bytes", topic=TOPIC)
    assert stored_before == sum(m.dataLength for m in manifests)
    meta.delete_segment(manifests[0])
    metrics.refresh_store()
    assert value(metrics, "streamoffload_entries_offloaded_total", topic=TOPIC) == 120
    assert value(metrics, "streamoffload_segments", topic=TOPIC, status="Offloaded") == len(manifests) - 1
    assert value(metrics, "streamoffload_stored_bytes", topic=TOPIC) == stored_before - manifests[0].dataLength


def test_failed_segments_show_with_their_status_and_age(store: FilesystemStore) -> None:
    from streamoffload.checkpoints import manifest as mf

    meta = MetadataStore(ScopedStore(store))
    sink, state = memory_sink(ScopedStore(store)), MemoryState()
    run_batch(sink, state, entries(1, 5, 1), now_ms=10_000)  # opens a segment, not sealed
    [opened] = meta.manifests(TOPIC)
    meta.put_manifest(mf.failed_manifest(opened, "OSError: disk full"))
    metrics = JobMetrics(meta, clock=FakeClock(70.0))
    metrics.refresh_store()
    assert value(metrics, "streamoffload_segments", topic=TOPIC, status="Failed") == 1
    assert value(metrics, "streamoffload_open_segment_age_seconds", topic=TOPIC) == 60.0


def test_an_unreadable_store_is_reported_not_raised(tmp_path: Path) -> None:
    class Broken(FilesystemStore):
        def list(self, prefix: str) -> Iterator[Any]:
            raise OSError("connection refused")

    metrics = JobMetrics(MetadataStore(ScopedStore(Broken(tmp_path))))
    metrics.safe_refresh_store()
    assert value(metrics, "streamoffload_metadata_refresh_ok") == 0.0
    assert "connection refused" in (metrics.last_refresh_error or "")


def test_a_seal_triggers_a_refresh_of_its_topic_for_the_publish_time(store: FilesystemStore) -> None:
    meta = MetadataStore(ScopedStore(store))
    sink, state = memory_sink(ScopedStore(store)), MemoryState()
    metrics = JobMetrics(meta, store_refresh_s=3600, backlog_interval_s=3600)
    metrics.start_refresher()
    try:
        metrics.on_batch(run_batch(sink, state, entries(2, 10, 9_000_000), now_ms=1, seal_all=True))
        deadline = time.monotonic() + 10
        while value(metrics, "streamoffload_last_offloaded_publish_timestamp_seconds", topic=TOPIC) is None:
            assert time.monotonic() < deadline, "the seal did not trigger a metadata refresh"
            time.sleep(0.02)
        assert value(metrics, "streamoffload_last_offloaded_publish_timestamp_seconds", topic=TOPIC) == 9_000.009
    finally:
        metrics.stop()


# ---------------------------------------------------------------------------------------------
# serving and installing


def test_parse_address() -> None:
    assert parse_metrics_address("127.0.0.1:9464") == ("127.0.0.1", 9464)
    assert parse_metrics_address(":9464") == ("127.0.0.1", 9464)  # loopback unless asked otherwise
    assert parse_metrics_address("0.0.0.0:1") == ("0.0.0.0", 1)
    assert parse_metrics_address("[::1]:9464") == ("::1", 9464)
    for bad in ("9464", "host:", "host:99999", "host:port"):
        with pytest.raises(ConfigError, match="metrics address"):
            parse_metrics_address(bad)


class FakeJob:
    """A ``metrics.install.MetricsJob`` that does not tell what it wrote, of unknown health, before its first
    run (no policy published)."""

    def __init__(self, meta: MetadataStore) -> None:
        self.config = Config()
        self.listeners: list[Any] = []
        self.metadata_listeners: list[Any] | None = None
        self.health: Any = None
        self._meta = meta
        self.policy_effective_ms = 0

    def metadata(self) -> MetadataStore:
        return self._meta

    def source_options(self) -> dict[str, str]:
        return {}


def test_install_serves_prometheus_text_and_stop_detaches(store: FilesystemStore) -> None:
    meta = MetadataStore(ScopedStore(store))
    sink, state = memory_sink(ScopedStore(store)), MemoryState()
    run_batch(sink, state, entries(1, 25, 1), now_ms=1, seal_all=True)
    job = FakeJob(meta)
    metrics = install_metrics(job, None, "127.0.0.1:0", backlog=lambda topics: {})
    try:
        assert job.listeners == [metrics.on_batch]
        assert metrics.address is not None and metrics.address[1] > 0
        with urllib.request.urlopen(metrics.url, timeout=10) as response:
            text = response.read().decode()
        families = {f.name: f for f in text_string_to_metric_families(text)}
        [sample] = [s for s in families["streamoffload_entries_offloaded"].samples if s.name.endswith("_total")]
        assert sample.labels == {"topic": TOPIC} and sample.value == 25
        assert families["streamoffload_entries_offloaded"].type == "counter"
        assert families["streamoffload_offload_lag_seconds"].type == "gauge"
        assert families["streamoffload_segment_size_bytes"].type == "histogram"
    finally:
        metrics.stop()
    assert job.listeners == []
    assert not any(t.name == "streamoffload-metrics" for t in threading.enumerate())
    with pytest.raises(OSError):
        urllib.request.urlopen(metrics.url, timeout=2)


def test_the_policy_gauge_follows_the_jobs_newest_policy_version(store: FilesystemStore) -> None:
    """``streamoffload_policy_effective_timestamp_seconds``: the dashboard's "Policy changes" annotation."""
    job = FakeJob(MetadataStore(ScopedStore(store)))
    metrics = install_metrics(job, None, "127.0.0.1:0", backlog=lambda topics: {})

    def gauge() -> float | None:
        return metrics.registry.get_sample_value("streamoffload_policy_effective_timestamp_seconds")

    try:
        assert gauge() == 0.0  # a job that does not tell: 0, as before a first run
        job.policy_effective_ms = 1_700_000_000_250  # as JobRuns.begin_run sets it
        assert gauge() == 1_700_000_000.25
        job.policy_effective_ms = 1_700_000_015_250  # and watch_policy, when the file's policy changed
        assert gauge() == 1_700_000_015.25
    finally:
        metrics.stop()


def test_the_job_tells_when_its_newest_policy_version_takes_effect(tmp_path: Path) -> None:
    """What the gauge above shows: a run's start sets it to the version in force, an edited policy to the
    new version's effective time (later, once every executor can see it); a start with the policy unchanged
    publishes nothing and keeps it. No broker is needed: nothing is offloaded."""
    from streamoffload.config import PolicySource, load_config
    from streamoffload.storage import keys
    from streamoffload.streaming.job.offload_job import OffloadJob
    from tests.fixtures.job import write_job_config

    path = write_job_config(tmp_path, "pulsar://127.0.0.1:1", topics=["persistent://public/default/t"])

    def versions() -> list[int]:
        scoped = load_config(path).store.location.open()
        listed = scoped.store.list(keys.prefix_meta_prefix(scoped.prefix, keys.POLICIES))
        return sorted(int(info.key.rsplit("/", 1)[1]) for info in listed)

    job = OffloadJob(load_config(path), str(path))
    assert job.policy_effective_ms == 0
    job.begin_run()
    try:
        [first] = versions()
        assert job.policy_effective_ms == first
        job.policies = PolicySource(load_config(path), str(path), min_interval_s=0)
        path.write_text(
            path.read_text().replace(
                "maxOffloadSegmentRolloverTimeMinutes = 10", "maxOffloadSegmentRolloverTimeMinutes = 5"
            )
        )
        assert job.watch_policy()
        assert versions() == [first, job.policy_effective_ms] and job.policy_effective_ms > first
    finally:
        job.end_run()
    again = OffloadJob(load_config(path), str(path))
    again.begin_run()
    try:
        assert again.policy_effective_ms == versions()[-1]  # unchanged: no new version
        assert len(versions()) == 2
    finally:
        again.end_run()


# ---------------------------------------------------------------------------------------------
# latest positions: Spark progress, the source's backlog file, the shared read cache


def test_progress_of_the_pulsar_source_gives_latest_positions_and_entries_behind() -> None:
    metrics = JobMetrics(clock=FakeClock(2_000.0))
    metrics.on_batch(
        BatchReport(
            0,
            0.1,
            SinkStats(
                sealed=[replace(seal(TOPIC, "a", 10, 1000, 1300, "size"), end=(4, 9), publish_time_last=1_990_000)],
                topics={TOPIC: stats(0, "b", 5, 1_999_000, (4, 14))},
            ),
        )
    )
    progress = {
        "durationMs": {"triggerExecution": 100},
        "numInputRows": 15,
        "sources": [
            {"description": "control", "endOffset": '{"last": "x"}', "latestOffset": '{"last": "x"}'},
            {
                "description": "pulsar",
                "endOffset": json.dumps({TOPIC: [4, 14], OTHER: [2, 7]}),
                "latestOffset": json.dumps({TOPIC: [4, 20], OTHER: [3, 1]}),
            },
        ],
    }
    metrics.on_progress(progress)
    # 6 entries not yet read + 5 read into the open segment; the newest offloaded entry is 10 s old.
    assert value(metrics, "streamoffload_backlog_entries", topic=TOPIC) == 11
    assert value(metrics, "streamoffload_offload_lag_seconds", topic=TOPIC) == 10.0
    assert value(metrics, "streamoffload_backlog_entries", topic=OTHER) is None  # across ledgers: not exact

    progress["sources"][1]["endOffset"] = json.dumps({TOPIC: [4, 20]})
    metrics.on_batch(
        BatchReport(
            1,
            0.1,
            SinkStats(
                sealed=[replace(seal(TOPIC, "b", 11, 1100, 1400, "end"), end=(4, 20), publish_time_last=1_999_500)],
                topics={TOPIC: stats(0, None, 0, None, (4, 20))},
            ),
        )
    )
    metrics.on_progress(progress)
    assert value(metrics, "streamoffload_backlog_entries", topic=TOPIC) == 0
    assert value(metrics, "streamoffload_offload_lag_seconds", topic=TOPIC) == 0.0


def test_backlog_file_of_the_source_is_read(tmp_path: Path) -> None:
    from streamoffload.metrics.sources import backlog_file_provider
    from streamoffload.streaming.source.backlog import PartitionBacklog

    path = tmp_path / "backlog.json"
    provider = backlog_file_provider(str(path))
    assert provider([]) == {}  # not written yet
    doc = {
        "updated": 1.0,
        "partitions": {
            TOPIC: PartitionBacklog(TOPIC, (4, 20), (4, 14), 6, True, 6000).to_dict(),
            OTHER: PartitionBacklog(OTHER, (3, 1), (2, 7), 2, False, 2000).to_dict(),
        },
    }
    path.write_text(json.dumps(doc))
    found = provider([])
    assert found[TOPIC] == Backlog(latest=(4, 20), entries=6, bytes=6000)
    assert found[OTHER] == Backlog(latest=(3, 1), entries=None, bytes=None)  # a lower bound is not exported
    metrics = JobMetrics(backlog=provider)
    metrics.refresh_backlog()
    assert value(metrics, "streamoffload_source_backlog_bytes", topic=TOPIC) == 6000


def test_the_shared_read_cache_of_storage_read_is_exported() -> None:
    from streamoffload.read.segment import shared_cache

    metrics = JobMetrics()
    before_hits = value(metrics, "streamoffload_read_cache_hits_total")
    before_misses = value(metrics, "streamoffload_read_cache_misses_total")
    cache = shared_cache()
    key = ("metrics-test", time.monotonic())
    cache.get(key)
    cache.put(key, b"chunk")
    cache.get(key)
    assert value(metrics, "streamoffload_read_cache_hits_total") == before_hits + 1
    assert value(metrics, "streamoffload_read_cache_misses_total") == before_misses + 1


@pytest.mark.broker
def test_status_asks_the_broker_for_every_latest_position_at_once(pulsar_broker: Any) -> None:
    """``status``'s latest positions: all topic-partitions pipelined over the binary protocol (one at a time took
    178 s at 1,000), each exact; an empty one is None; a broker that is not there gives none, quickly."""
    import time

    from streamoffload.embedded_broker import free_port
    from streamoffload.produce import produce
    from streamoffload.status import latest_positions
    from tests.fixtures.broker import unique_topic

    topics = [unique_topic(f"status-latest-{i}") for i in range(30)]
    summary = produce(pulsar_broker.service_url, topics[:-1], 3, 10, batching=False)
    expected = {t: tuple(summary.partitions[t].last_message_id[:2]) for t in topics[:-1]}
    expected[topics[-1]] = None  # created by asking, never written to
    assert latest_positions(pulsar_broker.service_url, topics) == expected
    started = time.monotonic()
    assert latest_positions(f"pulsar://127.0.0.1:{free_port()}", topics) == {}
    assert time.monotonic() - started < 10


@pytest.mark.broker
def test_pulsar_backlog_asks_the_broker_for_latest_positions(pulsar_broker: Any) -> None:
    from streamoffload.metrics.sources import pulsar_backlog
    from streamoffload.produce import produce
    from tests.fixtures.broker import unique_topic

    topic, empty = unique_topic("latest"), unique_topic("latest-empty")
    summary = produce(pulsar_broker.service_url, topic, 5, 10, batching=False)
    last = summary.partitions[topic].last_message_id
    assert last is not None
    provider = pulsar_backlog(pulsar_broker.service_url, {}, configured=[topic])
    found = provider([empty])
    assert found[topic] == Backlog(latest=(last[0], last[1]))
    assert found[empty] == Backlog(latest=None)
