"""The offload job: Pulsar source + control requests -> segmenter (transformWithStateInPandas) ->
sink (foreachBatch, uploads on executors), with retention on the driver.

``OffloadJob.run_forever`` is the continuously running service (restarting the query from its
checkpoint after a failure); ``OffloadJob.run_once`` drains what is available, seals every open
segment and returns (batch-style runs, tests, checks).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from streamoffload.checkpoints import manifest as mf
from streamoffload.checkpoints.metadata_store import MetadataStore
from streamoffload.checkpoints.retention import apply_retention
from streamoffload.codecs.errors import StreamOffloadError
from streamoffload.config import Config, PolicySource, StoreSettings
from streamoffload.streaming.control import requests_prefix, submit_requests
from streamoffload.streaming.segmenter import ACTION_SCHEMA, CONTROL_SEAL
from streamoffload.streaming.sink import SinkStats, sink_for

log = logging.getLogger(__name__)

S3_MIN_PART = 5 * 1024 * 1024
QUERY_NAME = "streamoffload"


def min_part_size(store: StoreSettings) -> int:
    return 1 if store.managedLedgerOffloadDriver == "filesystem" else S3_MIN_PART


@dataclass
class BatchReport:
    batch_id: int
    duration_s: float
    parts: int = 0
    part_bytes: int = 0
    opened: int = 0
    sealed: list[dict[str, Any]] = field(default_factory=list)
    upload_seconds: list[float] = field(default_factory=list)
    errors: int = 0
    topics: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Per topic-partition: buffered_bytes, open_segment, open_segment_entries, open_segment_bytes,
    open_segment_assigned_ms, last_position, skipped_entries, now_ms (see Segmenter.stats)."""


BatchListener = Callable[[BatchReport], None]


def _apply_partition(store: StoreSettings, key_prefix: str) -> Callable[[Any], Any]:
    def apply(rows: Any) -> Any:
        sink = sink_for(store.open, key_prefix)
        stats: SinkStats = sink.apply(row.asDict() for row in rows)
        yield json.dumps(asdict(stats))

    return apply


class OffloadJob:
    def __init__(self, config: Config, config_path: str | None = None) -> None:
        self.config = config
        self.config_path = config_path
        self.policies = PolicySource(config, config_path)
        self.listeners: list[BatchListener] = []
        self.query: Any = None
        self._stop = threading.Event()
        self._last_retention = 0.0
        self.last_topic_stats: dict[str, dict[str, Any]] = {}
        """The segmenter's latest figures per topic-partition (see BatchReport.topics)."""
        self.retention_interval_s = 60.0

    # -- the query ----------------------------------------------------------------------------------

    @property
    def store_settings(self) -> StoreSettings:
        return self.config.store

    @property
    def key_prefix(self) -> str:
        return self.config.store.key_prefix

    def source_options(self, *, read_limits: bool = True) -> dict[str, str]:
        pulsar = self.config.pulsar
        options = {
            "serviceUrl": pulsar.service_url,
            "startingOffsets": pulsar.starting_offsets,
            "failOnDataLoss": str(pulsar.fail_on_data_loss).lower(),
        }
        if pulsar.topics:
            options["topics"] = ",".join(pulsar.topics)
        elif pulsar.topics_pattern:
            options["topicsPattern"] = pulsar.topics_pattern
        else:
            raise StreamOffloadError("no topics to offload: set pulsar.topics or pulsar.topics_pattern (or --topics)")
        if read_limits and pulsar.max_entries_per_trigger:
            options["maxEntriesPerTrigger"] = str(pulsar.max_entries_per_trigger)
        if read_limits and pulsar.max_bytes_per_trigger:
            options["maxBytesPerTrigger"] = str(pulsar.max_bytes_per_trigger)
        for key, value in pulsar.client.items():
            options[f"pulsar.client.{key}"] = value
        return options

    def build(self, spark: Any, *, read_limits: bool = True) -> Any:
        from pyspark.sql import functions as F

        from streamoffload.streaming.segmenter_spark import SegmenterProcessor

        entries = (
            spark.readStream.format("pulsar")
            .options(**self.source_options(read_limits=read_limits))
            .load()
            .withColumn("control", F.lit(None).cast("string"))
        )
        controls = (
            spark.readStream.format("streamoffload-control")
            .option("store", json.dumps(asdict(self.store_settings)))
            .option("keyPrefix", self.key_prefix)
            .load()
        )
        processor = SegmenterProcessor(self.policies, self.key_prefix, min_part_size(self.store_settings))
        return (
            entries.unionByName(controls)
            .groupBy("topic")
            .transformWithStateInPandas(
                statefulProcessor=processor,
                outputStructType=ACTION_SCHEMA,
                outputMode="Append",
                timeMode="ProcessingTime",
            )
        )

    def _foreach_batch(self, batch_df: Any, batch_id: int) -> None:
        started = time.monotonic()
        apply = _apply_partition(self.store_settings, self.key_prefix)
        results = [json.loads(r) for r in batch_df.rdd.mapPartitions(apply).collect()]
        report = BatchReport(batch_id, 0.0)
        for stats in results:
            report.parts += stats["parts"]
            report.part_bytes += stats["part_bytes"]
            report.opened += stats["opened"]
            report.sealed.extend(stats["sealed"])
            report.upload_seconds.extend(stats["upload_seconds"])
            report.errors += stats["errors"]
            report.topics.update(stats["topics"])
        report.duration_s = time.monotonic() - started
        self.last_topic_stats.update(report.topics)
        for seal in report.sealed:
            log.info(
                "sealed segment %s of %s: %d entries, %d bytes (%s)",
                seal["segment"],
                seal["topic"],
                seal["entries"],
                seal["data_length"],
                seal["reason"],
            )
        self.maybe_apply_retention()
        for listener in self.listeners:
            try:
                listener(report)
            except Exception:
                log.warning("batch listener failed", exc_info=True)

    def start(self, spark: Any, *, once: bool = False, read_limits: bool = True) -> Any:
        writer = (
            self.build(spark, read_limits=read_limits)
            .writeStream.queryName(QUERY_NAME)
            .foreachBatch(self._foreach_batch)
            .option("checkpointLocation", self.config.spark.checkpoint)
        )
        if not once:
            self.query = writer.trigger(processingTime=self.config.spark.trigger_interval).start()
            return self.query
        # A pending rollover timer makes Spark run no-data batches until it fires, so an AvailableNow
        # run would not end before the rollover time: batch runs turn them off (the query copies the
        # session's settings when it starts, so the continuous job keeps them).
        key = "spark.sql.streaming.noDataMicroBatches.enabled"
        previous = spark.conf.get(key, "true")
        spark.conf.set(key, "false")
        try:
            self.query = writer.trigger(availableNow=True).start()
        finally:
            spark.conf.set(key, previous)
        return self.query

    # -- driver-side housekeeping --------------------------------------------------------------------

    def metadata(self) -> MetadataStore:
        return MetadataStore(self.store_settings.open(), self.key_prefix)

    def maybe_apply_retention(self, force: bool = False) -> None:
        if not force and time.monotonic() - self._last_retention < self.retention_interval_s:
            return
        self._last_retention = time.monotonic()
        meta = self.metadata()
        for topic in meta.topics():
            name = str(topic)
            try:
                report = apply_retention(meta, name, self.policies.policy_for(name))
            except Exception:
                log.warning("retention failed for %s", name, exc_info=True)
                continue
            if report.marked_ledgers or report.deleted_segments:
                log.info(
                    "retention on %s: marked ledgers %s deleted, deleted segments %s",
                    name,
                    report.marked_ledgers,
                    report.deleted_segments,
                )

    def open_segment_topics(self) -> list[str]:
        """Topic-partitions with an open (Assigned or Failed) segment, per the metadata."""
        meta = self.metadata()
        out = []
        for topic in meta.topics():
            if any(m.status != mf.OFFLOADED for m in meta.manifests(topic)):
                out.append(str(topic))
        return out

    # -- running -------------------------------------------------------------------------------------

    def run_once(self, spark: Any) -> None:
        """Drain everything available, then seal every open segment."""
        self.start(spark, once=True).awaitTermination()
        self._raise_if_failed()
        open_topics = self.open_segment_topics()
        if open_topics:
            store = self.store_settings.open()
            ids = submit_requests(store, self.key_prefix, open_topics, CONTROL_SEAL)
            # No read limit: the data that arrived meanwhile and the seal land in one batch, so the
            # seal comes after every entry read.
            self.start(spark, once=True, read_limits=False).awaitTermination()
            self._raise_if_failed()
            # Spark tells a source its batch is committed only when the next batch starts, which a
            # finished run never does: remove the requests this run made and consumed.
            for request_id in ids:
                store.delete(requests_prefix(self.key_prefix) + request_id)
        self.maybe_apply_retention(force=True)

    def _raise_if_failed(self) -> None:
        if self.query is not None and self.query.exception() is not None:
            raise StreamOffloadError(f"offload query failed: {self.query.exception()}")

    def stop(self) -> None:
        self._stop.set()
        if self.query is not None:
            self.query.stop()

    def run_forever(self, spark: Any, *, max_restarts: int = 10, backoff_s: float = 5.0) -> None:
        """Run until ``stop``; after a query failure, restart from the checkpoint with backoff (the
        replay finishes any failed segment first). Gives up after ``max_restarts`` failures in a row."""
        failures = 0
        while not self._stop.is_set():
            query = self.start(spark)
            started = time.monotonic()
            while not self._stop.is_set() and query.isActive:
                query.awaitTermination(1.0)
            if self._stop.is_set():
                break
            error = query.exception()
            if error is None:
                break
            failures = failures + 1 if time.monotonic() - started < 300 else 1
            if failures > max_restarts:
                raise StreamOffloadError(f"offload query failed {failures} times in a row; last error: {error}")
            delay = min(backoff_s * 2 ** (failures - 1), 300.0)
            log.error("offload query failed (%s); restarting from the checkpoint in %.0f s", error, delay)
            self._stop.wait(delay)
