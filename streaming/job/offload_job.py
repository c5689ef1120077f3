"""The offload job: Pulsar source + control requests -> segmenter (transformWithStateInPandas) ->
sink (foreachBatch, uploads on executors), with retention on the driver.

``OffloadJob.run_forever`` is the continuously running service; ``OffloadJob.run_once`` drains what is
available, seals every open segment and returns (batch-style runs, tests, checks).

The store is the source of truth. Every **run** (a start, and every restart after a failure) takes the
writer lease of the store prefix (a new epoch), publishes the policy in force, recovers each
topic-partition from the store (``MetadataStore.recover``: continue after the last committed segment,
abandon unfinished attempts) and starts its queries on a fresh Spark checkpoint under
``<checkpoint>/run-<epoch>``: Spark's checkpoint is scratch space for one run, so losing it, replacing
it or restoring an old one changes nothing. What a crash costs is the open segments' entries, read
again from the broker.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from streamoffload.checkpoints.control_requests import submit_requests
from streamoffload.checkpoints.lease import DEFAULT_TTL_MS, FencedError, LeaseHeldError, WriterLease, instance_id
from streamoffload.checkpoints.metadata_store import MetadataStore
from streamoffload.checkpoints.retention import RetentionRunner
from streamoffload.config import Config, PolicySource, StoreSettings
from streamoffload.errors import StreamOffloadError
from streamoffload.storage.base import StorageError
from streamoffload.storage.urls import parse_store_url
from streamoffload.streaming.control.policy_versions import (
    CLOCK_SKEW_MS,
    DEFAULT_REFRESH_S,
    PolicyLog,
    policy_document,
    write_versions_file,
)
from streamoffload.streaming.control.quarantine import Quarantine, failed_topics, failure_reason
from streamoffload.streaming.job.health import BROKER_BACKOFF_CAP_S, HealthTracker, broker_unreachable
from streamoffload.streaming.runtime.worker_gc import freeze_long_lived
from streamoffload.streaming.segmenter.segmenter_model import (
    ACTION_COLUMNS,
    ACTION_SCHEMA,
    CONTROL_POLICY,
    CONTROL_SEAL,
)
from streamoffload.streaming.sink.entry_fetch import BrokerFetcherSpec
from streamoffload.streaming.sink.sink import SinkStats, sink_for
from streamoffload.streaming.source.admission import buffer_file_path, write_buffer_file

log = logging.getLogger(__name__)

QUERY_NAME = "streamoffload"
STATE_STORE_CONF = {
    # Per micro-batch, commit the state's changes as a changelog instead of a RocksDB checkpoint
    # (a flush, hard links and a copy of the new files): the fixed cost of a batch's state commit.
    "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
    # Checkpoint files (offset and commit logs, state changelogs) through Hadoop's FileSystem instead of
    # FileContext: FileContext's rename on a local filesystem forks `readlink` (Hadoop without its native
    # library) for the file and its .crc, several processes per file and micro-batch, ~0.2 s of state
    # commit per batch here. It only gives up FileContext's atomic no-overwrite rename against a
    # concurrent writer of the same checkpoint, which cannot exist: each run has its own under the lease.
    "spark.sql.streaming.checkpointFileManagerClass": (
        "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"
    ),
}
"""Session settings the job's queries need (a query copies them when it starts; each run's checkpoint
is fresh, so they never meet a checkpoint written without them)."""


def min_part_size(store: StoreSettings) -> int:
    """The segmenter's minimum part: the store class's ``min_part_size``, from the URL (no store is opened)."""
    return parse_store_url(store.url).store_class.min_part_size


@dataclass
class BatchReport:
    batch_id: int
    duration_s: float
    parts: int = 0
    part_bytes: int = 0
    fetch_seconds: float = 0.0
    spooled_entries: int = 0
    broker_entries: int = 0
    broker_reads: int = 0
    opened: int = 0
    sealed: list[dict[str, Any]] = field(default_factory=list)
    upload_seconds: list[float] = field(default_factory=list)
    errors: int = 0
    topics: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Per topic-partition: buffered_bytes, open_segment, open_segment_entries, open_segment_bytes,
    open_segment_assigned_ms, last_position, now_ms (see Segmenter.stats)."""


BatchListener = Callable[[BatchReport], None]


SINK_STATS_SCHEMA = "stats STRING"


def _arrow_actions(batches: Iterable[Any]) -> Iterator[dict[str, Any]]:
    """The action rows of Arrow record batches, one at a time (a part's bytes are copied out of the
    batch only when its row is applied)."""
    for batch in batches:
        columns = [batch.column(name) for name in ACTION_COLUMNS]
        for i in range(batch.num_rows):
            yield {name: column[i].as_py() for name, column in zip(ACTION_COLUMNS, columns, strict=True)}


def _apply_arrow(
    store: StoreSettings, key_prefix: str, fetcher: BrokerFetcherSpec
) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """The sink as a ``mapInArrow`` function: the actions (part layouts, not entry bytes) reach the
    executor's Python worker as Arrow batches; it fetches each part's entries from the broker (``fetcher``),
    writes the store, and returns one row of ``SinkStats``."""

    def apply(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        freeze_long_lived()
        sink = sink_for(store.open, key_prefix, fetcher)
        stats: SinkStats = sink.apply(_arrow_actions(batches))
        yield pa.RecordBatch.from_pydict({"stats": [json.dumps(asdict(stats))]})

    return apply


def _wait(query: Any, seconds: float) -> None:
    """Wait for the query to end, at most ``seconds``. A failure is not raised here: Spark raises it from
    ``awaitTermination`` only when the wait overlaps the failure, so callers read ``query.exception()``
    after the loop instead, every time."""
    from pyspark.errors import StreamingQueryException

    with contextlib.suppress(StreamingQueryException):
        query.awaitTermination(seconds)


class LeaseUnrenewableError(FencedError):
    """The run stopped itself: renewing its writer lease failed for most of its time to live (the store was
    unreachable), so it could not know it still held it. ``run_forever`` starts a new run, which takes the
    lease again unless another instance took it meanwhile."""


@dataclass
class Run:
    """One run of the job: a lease epoch, where each topic-partition continues, a fresh checkpoint."""

    epoch: int
    resume: dict[str, tuple[list[int] | None, int]]
    checkpoint: str
    policy_log: PolicyLog
    published: dict[str, Any]
    """The policy document last published."""


class OffloadJob:
    def __init__(self, config: Config, config_path: str | None = None, *, instance: str | None = None) -> None:
        self.config = config
        self.config_path = config_path
        self.policies = PolicySource(config, config_path)
        self.listeners: list[BatchListener] = []
        self.query: Any = None
        self._stop = threading.Event()
        self.retention: RetentionRunner | None = None
        self.last_topic_stats: dict[str, dict[str, Any]] = {}
        """The segmenter's latest figures per topic-partition (see BatchReport.topics)."""
        self.retention_interval_s = 60.0
        self.instance = instance or instance_id(config.spark.checkpoint)
        """Who this job is to the writer lease: a restart of the same instance takes its lease at once."""
        self.lease_ttl_ms = DEFAULT_TTL_MS
        self.policy_refresh_s = DEFAULT_REFRESH_S
        self.policy_clock_skew_ms = CLOCK_SKEW_MS
        self.force_lease = False
        self.run: Run | None = None
        self.lease: WriterLease | None = None
        self._fenced: FencedError | None = None
        self._renewer: threading.Thread | None = None
        self._run_ended = threading.Event()
        self.quarantine: Quarantine | None = None
        self._fetcher_spec: tuple[int | None, BrokerFetcherSpec] | None = None
        self.failed_topics: dict[str, str] = {}
        """Topics that failed during ``run_once`` and were set aside, with why (the run then fails)."""
        self._policy_failure: str | None = None
        self.health = HealthTracker(None, self.key_prefix, config.pulsar.service_url)
        """What ``run_forever`` does about an unreachable broker (status and metrics show it)."""

    # -- the query ----------------------------------------------------------------------------------

    @property
    def store_settings(self) -> StoreSettings:
        return self.config.store

    @property
    def key_prefix(self) -> str:
        return self.config.store.key_prefix

    def source_options(self, *, seal_at_end: bool = False) -> dict[str, str]:
        """The Pulsar source's options: ``positionsOnly`` rows (the sink fetches the bytes), ``maxBytesPerTrigger``
        (default 1 GiB of entries) per micro-batch, and per topic-partition the offload buffer bound through
        ``bufferFile``.
        ``seal_at_end``: ``run_once``'s query ends with a micro-batch of seal markers (``sealAtEnd``)."""
        from streamoffload.streaming.source.admission import buffer_file_path

        pulsar = self.config.pulsar
        options = {
            "serviceUrl": pulsar.service_url,
            "startingOffsets": self._starting_offsets(),
            "failOnDataLoss": str(pulsar.fail_on_data_loss).lower(),
            # The query carries positions, sizes and CRC-32Cs; the sink fetches the bytes (entry_fetch).
            "positionsOnly": "true",
        }
        options["keyPrefix"] = self.key_prefix
        if self.run is not None:
            options["policyVersionsFile"] = self._versions_file()
            options["bufferFile"] = buffer_file_path(self._versions_file(), self.run.epoch)
            options["quarantineFile"] = self._pause_file()
        if seal_at_end:
            options["sealAtEnd"] = "true"
        spool = self._spool_dir()
        if spool is not None:
            options["spoolDir"] = spool
        if pulsar.topics:
            options["topics"] = ",".join(pulsar.topics)
        elif pulsar.topics_pattern:
            options["topicsPattern"] = pulsar.topics_pattern
            if pulsar.topics_pattern_candidates:
                options["topicsPatternCandidates"] = ",".join(pulsar.topics_pattern_candidates)
        else:
            raise StreamOffloadError("no topics to offload: set pulsar.topics or pulsar.topics_pattern (or --topics)")
        if pulsar.max_entries_per_trigger:
            options["maxEntriesPerTrigger"] = str(pulsar.max_entries_per_trigger)
        if pulsar.max_bytes_per_trigger:
            options["maxBytesPerTrigger"] = str(pulsar.max_bytes_per_trigger)
        for key, value in pulsar.client.items():
            options[f"pulsar.client.{key}"] = value
        return options

    def _hold_broker_retention(self, committed: dict[str, Any]) -> None:
        """``pulsar.retain_subscription``: acknowledge each topic-partition's durable subscription up to its last
        committed position, so the broker keeps what the store does not have yet. A failure is logged, not
        fatal: the next commit (or run) acknowledges again, and the store stays exact either way."""
        name = self.config.pulsar.retain_subscription
        if not name or not committed:
            return
        from streamoffload.streaming.protocol import raw_reader as rr

        pulsar = self.config.pulsar
        client = rr.RawClient(pulsar.service_url, dict(pulsar.client))
        for topic, end in sorted(committed.items()):
            try:
                rr.hold_subscription_raw(client, topic, name, (int(end[0]), int(end[1])))
            except Exception as err:
                log.warning("%s: could not acknowledge the subscription %s up to %s: %s", topic, name, end, err)

    def fetcher_spec(self) -> BrokerFetcherSpec:
        """How the sink fetches the entries of its parts: from the broker, as the source reads them."""
        from streamoffload.streaming.source.source_options import SourceOptions

        epoch = self.run.epoch if self.run is not None else None
        if self._fetcher_spec is None or self._fetcher_spec[0] != epoch:  # the spool is the run's
            self._fetcher_spec = (epoch, BrokerFetcherSpec.of(SourceOptions.parse(self.source_options())))
        return self._fetcher_spec[1]

    def _starting_offsets(self) -> str:
        """Where each topic-partition starts: after its last committed segment when the store has one
        (whatever Spark's checkpoint holds), else the configured ``starting_offsets``."""
        configured = self.config.pulsar.starting_offsets
        resume = {tp: last for tp, (last, _ordinal) in (self.run.resume if self.run else {}).items() if last}
        if not resume:
            return configured
        if configured.strip().lower() in ("earliest", "latest"):
            doc: dict[str, Any] = {"*": configured.strip().lower()}
        else:
            doc = dict(json.loads(configured))
        doc.update({tp: list(last) for tp, last in resume.items()})
        return json.dumps(doc, sort_keys=True)

    def _versions_file(self) -> str:
        checkpoint = self.config.spark.checkpoint
        base = Path(checkpoint) if "://" not in checkpoint else Path(tempfile.gettempdir()) / self.instance
        return str(base / "policy-versions.json")

    def _spool_dir(self) -> str | None:
        """Where the source tasks keep the bytes they read for the sink (``streaming.handoff.spool``): beside the
        checkpoint, one per run. Only where every task runs on this machine (``local`` masters): elsewhere a
        sink on another executor would not find the files, and they would not be removed."""
        spark = self.config.spark
        if self.run is None or not spark.spool or not spark.master.startswith("local"):
            return None
        return str(Path(self._versions_file()).with_name(f"spool-{self.run.epoch:08d}"))

    def _pause_file(self) -> str:
        return str(Path(self._versions_file()).with_name("quarantine.json"))

    def build(self, spark: Any, *, seal_at_end: bool = False) -> Any:
        from pyspark.sql import functions as F

        from streamoffload.streaming.segmenter.segmenter_spark import SegmenterProcessor

        run = self.run
        if run is None:
            raise StreamOffloadError("the job has no run: call begin_run() first")

        # A task per core, and a second to overlap one task's start with another's reads: a micro-batch over
        # many quiet topic-partitions packs their ranges into these (input_ranges.group_ranges).
        max_partitions = 2 * max(1, int(spark.sparkContext.defaultParallelism))
        entries = (
            spark.readStream.format("pulsar")
            .options(**self.source_options(seal_at_end=seal_at_end))
            .option("maxPartitions", str(max_partitions))
            .load()
            # The source's seal markers (``sealAtEnd``, ledger_id -1) seal their topic-partition's open segment.
            .withColumn("control", F.when(F.col("ledger_id") < 0, F.lit(CONTROL_SEAL)).cast("string"))
        )
        controls = (
            spark.readStream.format("streamoffload-control")
            .option("store", json.dumps(asdict(self.store_settings)))
            .option("keyPrefix", self.key_prefix)
            .load()
        )
        processor = SegmenterProcessor(
            run.policy_log,
            self.key_prefix,
            min_part_size(self.store_settings),
            epoch=run.epoch,
            resume=run.resume,
        )
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
        apply = _apply_arrow(self.store_settings, self.key_prefix, self.fetcher_spec())
        # One Spark job per micro-batch: the segmenter's stage feeds the sink's tasks directly.
        results = [json.loads(r.stats) for r in batch_df.mapInArrow(apply, SINK_STATS_SCHEMA).collect()]
        report = BatchReport(batch_id, 0.0)
        for stats in results:
            report.parts += stats["parts"]
            report.part_bytes += stats["part_bytes"]
            report.fetch_seconds += stats.get("fetch_seconds", 0.0)
            report.spooled_entries += stats.get("spooled_entries", 0)
            report.broker_entries += stats.get("broker_entries", 0)
            report.broker_reads += stats.get("broker_reads", 0)
            report.opened += stats["opened"]
            report.sealed.extend(stats["sealed"])
            report.upload_seconds.extend(stats["upload_seconds"])
            report.errors += stats["errors"]
            report.topics.update(stats["topics"])
        report.duration_s = time.monotonic() - started
        self.last_topic_stats.update(report.topics)
        if self.quarantine is not None and report.sealed:
            for topic in self.quarantine.clear({seal["topic"] for seal in report.sealed}):
                log.warning("%s: offloading again (a segment was committed); no longer set aside", topic)
        if self.run is not None:  # the source's admission control reads each topic-partition's buffer here
            write_buffer_file(
                buffer_file_path(self._versions_file(), self.run.epoch),
                self.last_topic_stats,
                min_part_size(self.store_settings),
            )
        self._hold_broker_retention({seal["topic"]: seal["end"] for seal in report.sealed if "end" in seal})
        for seal in report.sealed:
            log.info(
                "sealed segment %s of %s: %d entries, %d bytes (%s)",
                seal["segment"],
                seal["topic"],
                seal["entries"],
                seal["data_length"],
                seal["reason"],
            )
        for listener in self.listeners:
            try:
                listener(report)
            except Exception:
                log.warning("batch listener failed", exc_info=True)

    def start(self, spark: Any, *, once: bool = False) -> Any:
        if self.run is None:
            self.begin_run()
        assert self.run is not None
        for key, value in STATE_STORE_CONF.items():
            spark.conf.set(key, value)
        writer = (
            self.build(spark, seal_at_end=once)
            .writeStream.queryName(QUERY_NAME)
            .foreachBatch(self._foreach_batch)
            .option("checkpointLocation", self.run.checkpoint)
        )
        if not once:
            self.query = writer.trigger(processingTime=self.config.spark.trigger_interval).start()
            self.retention_runner().start()
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

    def retention_runner(self) -> RetentionRunner:
        """Retention and metadata compaction, off the batch path (a thread of the lease holder)."""
        if self.retention is None:
            self.retention = RetentionRunner(
                self.metadata(),
                self.policies.policy_for,
                interval_s=self.retention_interval_s,
                topics=lambda: list(self.last_topic_stats),
            )
        return self.retention

    def open_segment_topics(self) -> list[str]:
        """Topic-partitions whose segmenter last reported an open segment (this run)."""
        return sorted(tp for tp, stats in self.last_topic_stats.items() if stats.get("open_segment"))

    # -- runs: lease, recovery, policy -----------------------------------------------------------------

    def begin_run(self) -> Run:
        """Take the writer lease (a new epoch), publish the policy, recover every topic-partition the
        store holds, and choose a fresh checkpoint. Raises ``LeaseHeldError`` when another instance
        writes the prefix."""
        store = self.store_settings.open()
        self.lease = WriterLease(store, self.key_prefix, self.instance, ttl_ms=self.lease_ttl_ms)
        record = self.lease.acquire(force=self.force_lease)
        self.force_lease = False
        self._fenced = None
        config = self.policies.current()
        policy_log = PolicyLog(
            self.store_settings.open, self.key_prefix, self.policy_refresh_s, self.policy_clock_skew_ms
        )
        versions = policy_log.start_run(config, int(time.time() * 1000))
        self.quarantine = Quarantine(store, self.key_prefix, self._pause_file())
        self.quarantine.load()
        for topic, until_ms in sorted(self.quarantine.paused().items()):
            until = time.strftime("%H:%M:%S", time.localtime(until_ms / 1000))
            log.warning("%s: set aside after failing again and again; not offloaded until %s", topic, until)
        meta = MetadataStore(store, self.key_prefix)
        resume: dict[str, tuple[list[int] | None, int]] = {}
        for topic in meta.topics():
            point = meta.recover(topic)
            if point.next_ordinal:
                resume[str(topic)] = (list(point.last) if point.last else None, point.next_ordinal)
        checkpoint = self._fresh_checkpoint(record.epoch)
        self.run = Run(record.epoch, resume, checkpoint, policy_log, policy_document(config))
        write_versions_file(self._versions_file(), versions)
        self.last_topic_stats = {}
        # A crash may have come between a commit and its acknowledgement: acknowledge from the store.
        self._hold_broker_retention({tp: last for tp, (last, _ordinal) in resume.items() if last})
        self._start_renewer()
        log.info("run %d: writer lease taken; %d topic-partitions resume from the store", record.epoch, len(resume))
        return self.run

    def _fresh_checkpoint(self, epoch: int) -> str:
        """``<checkpoint>/run-<epoch>``, removing earlier runs' (local) checkpoints: they hold nothing
        the store does not."""
        base = self.config.spark.checkpoint
        if "://" in base and not base.startswith("file://"):
            return f"{base.rstrip('/')}/run-{epoch:08d}"
        root = Path(base.removeprefix("file://"))
        if root.is_dir():
            for child in root.iterdir():
                scratch = child.name.startswith(("run-", "spool-"))
                if scratch or child.name in ("offsets", "commits", "state", "sources"):
                    shutil.rmtree(child, ignore_errors=True)
            for name in ("metadata",):
                if (root / name).is_file():
                    (root / name).unlink()
        root.mkdir(parents=True, exist_ok=True)
        return str(root / f"run-{epoch:08d}")

    def _start_renewer(self) -> None:
        self._run_ended.clear()
        lease = self.lease
        assert lease is not None

        def renew() -> None:
            interval = max(lease.ttl_ms / 3000, 0.2)
            failing_since: float | None = None
            while not self._run_ended.wait(interval):
                try:
                    lease.renew()
                    failing_since = None
                except FencedError as err:
                    self._fence(err)
                    return
                except Exception as err:  # the store is unreachable: we cannot know we still hold it
                    failing_since = failing_since or time.monotonic()
                    if time.monotonic() - failing_since > lease.ttl_ms / 1000 * 0.8:
                        self._fence(LeaseUnrenewableError(f"cannot renew the writer lease: {err}"))
                        return
                    log.warning("renewing the writer lease failed (%s); retrying", err)

        self._renewer = threading.Thread(target=renew, name="streamoffload-lease", daemon=True)
        self._renewer.start()

    def _fence(self, err: FencedError) -> None:
        log.error("%s", err)
        self._fenced = err
        if self.query is not None:
            try:
                self.query.stop()
            except Exception:
                log.debug("stopping the fenced query failed", exc_info=True)

    def end_run(self, *, release: bool = True) -> None:
        if self.retention is not None:
            self.retention.stop()
        self._run_ended.set()
        if self._renewer is not None:
            self._renewer.join(5)
            self._renewer = None
        if release and self.lease is not None and self._fenced is None:
            try:
                self.lease.release()
            except Exception:
                log.warning("releasing the writer lease failed", exc_info=True)
        self.run = None

    def watch_policy(self) -> bool:
        """Publish the policy again if the configuration file changed; True when it did."""
        run = self.run
        if run is None:
            return False
        config = self.policies.current()
        doc = policy_document(config)
        if doc == run.published:
            return False
        effective = run.policy_log.publish(config, int(time.time() * 1000))
        run.published = doc
        write_versions_file(self._versions_file(), run.policy_log.versions())
        # Open segments see a new version when their topic is next processed; without traffic that
        # could be the rollover time. A wake-up request makes the segmenter look again when it applies.
        open_topics = self.open_segment_topics()
        if open_topics:
            try:
                store = self.store_settings.open()
                submit_requests(store, self.key_prefix, open_topics, CONTROL_POLICY, effective_ms=effective)
            except StorageError as err:  # the version is published: segments see it at their next batch
                log.warning("offload policy published; asking the open segments to look now failed: %s", err)
        when = time.strftime("%H:%M:%S", time.localtime(effective / 1000))
        log.info("offload policy changed: in force from %s", when)
        return True

    def _watch_policy_or_retry(self) -> None:
        """``watch_policy`` in the running loop: a store that cannot take the new version now (a full disk,
        S3 failing) is not the job's end; the edit is published at a later second, and said so once per cause."""
        try:
            self.watch_policy()
            self._policy_failure = None
        except StorageError as err:
            if self._policy_failure != str(err):
                log.warning("publishing the edited offload policy failed (%s); retrying every second", err)
            self._policy_failure = str(err)

    # -- running -------------------------------------------------------------------------------------

    def run_once(self, spark: Any) -> None:
        """Drain everything available, then seal every open segment. A topic-partition whose offload fails
        is set aside (``streaming.control.quarantine``) and the run starts again without it, so the other topics are
        offloaded; the run then fails, naming it."""
        self.failed_topics = {}
        while True:
            if self.run is None:
                self.begin_run()
            try:
                self._drain_and_seal(spark)
                break
            except Exception as err:  # Spark's StreamingQueryException carries the executor's message
                held = self._set_aside(str(err), at_once=True)
                if not held or any(topic in self.failed_topics for topic in held):
                    raise
                self.failed_topics.update({t: failure_reason(str(err), t) for t in held})
            finally:
                self.end_run()
        if self.failed_topics:
            listed = "; ".join(f"{topic}: {why}" for topic, why in sorted(self.failed_topics.items()))
            raise StreamOffloadError(
                f"the other topics were offloaded, but {len(self.failed_topics)} topic-partition(s) failed and were "
                f"set aside (see `streamoffload status`): {listed}"
            )

    def _set_aside(self, error_text: str, *, at_once: bool = False) -> list[str]:
        """Count a failure against the topic-partitions the error names (``TopicFailedError``); returns those
        now set aside. ``at_once``: without waiting for a second failure (a batch run will not retry)."""
        if self.quarantine is None:
            return []
        held: list[str] = []
        for topic in failed_topics(error_text):
            reason = failure_reason(error_text, topic)
            record = self.quarantine.note_failure(topic, reason, at_once=at_once)
            if record.quarantined:
                held.append(topic)
                until = time.strftime("%H:%M:%S", time.localtime(record.until_ms / 1000))
                log.error(
                    "%s: offload failed %d time(s) in a row (%s); set aside until %s, the other topics go on",
                    topic,
                    record.failures,
                    reason,
                    until,
                )
            else:
                log.warning("%s: offload failed (%s); trying again", topic, reason)
        return held

    def nothing_new(self) -> bool:
        """For ``run --once``, after ``begin_run``: whether every topic-partition is offloaded up to the broker's
        latest position and no offload-now request waits, so that the query would start Spark only to find
        nothing (recovery has abandoned every unfinished attempt, and ``run --once`` leaves no open segment).
        Any doubt (the broker or the store cannot be asked) answers False: the query then finds out."""
        from streamoffload.checkpoints.control_requests import pending_requests
        from streamoffload.streaming.source.offset_planner import SourcePlanner
        from streamoffload.streaming.source.source_options import SourceOptions

        run = self.run
        if run is None:
            return False
        try:
            if pending_requests(self.store_settings.open(), self.key_prefix):
                return False
            planner = SourcePlanner(SourceOptions.parse(self.source_options()))
            try:
                partitions = planner.topic_partitions(force=True)
                latest = planner.latest_positions(partitions)
            finally:
                planner.close()
        except Exception as err:
            log.info("could not tell whether anything is new (%s): running the query", err)
            return False
        for tp in partitions:
            last = latest.get(tp)
            if last is None:
                continue  # an empty topic-partition
            committed = run.resume.get(tp, (None, 0))[0]
            if committed is None or tuple(committed) < tuple(last):
                return False
        return True

    def _drain_and_seal(self, spark: Any) -> None:
        """One query: it reads up to the positions of its start (``Trigger.AvailableNow``), and its last
        micro-batch seals every open segment (the source's seal markers), so nothing that arrives meanwhile
        lands unbounded in one batch: it waits for the next run."""
        self._await(self.start(spark, once=True))
        self.retention_runner().run_pass()

    def _await(self, query: Any) -> None:
        while query.isActive:
            if self._stop.is_set():
                query.stop()
                raise StreamOffloadError("stopped before the run finished; the next run continues from the store")
            self._watch_policy_or_retry()
            _wait(query, 1.0)
        if self._fenced is not None:
            raise self._fenced
        self._raise_if_failed()

    def _raise_if_failed(self) -> None:
        if self.query is not None and self.query.exception() is not None:
            raise StreamOffloadError(f"offload query failed: {self.query.exception()}")

    def stop(self) -> None:
        """Ask the job to stop: safe from a signal handler (it only sets a flag); the running loop stops
        the query, since calling into Spark from a handler re-enters the py4j call the main thread is in."""
        self._stop.set()

    def run_forever(
        self,
        spark: Any,
        *,
        max_restarts: int = 10,
        backoff_s: float = 5.0,
        broker_backoff_cap_s: float = BROKER_BACKOFF_CAP_S,
    ) -> None:
        """Run until ``stop``; after a failure (of the query, or of a run's start), start a new run
        (recovering from the store) with backoff. Gives up after ``max_restarts`` failures in a row without
        progress; stops at once when fenced. While the broker is unreachable it never gives up: it tries
        again with backoff capped at ``broker_backoff_cap_s`` (at once when the broker answers again), and
        says so in the log, the store's health record (``status``) and ``streamoffload_broker_unreachable``."""
        failures = 0
        if self.health.store is None:
            self.health.store = self.store_settings.open()
            self.health.clear_stale()
        try:
            while not self._stop.is_set():
                started = time.monotonic()
                query: Any = None
                error: Any
                try:
                    if self.run is None:
                        self.begin_run()
                    query = self.start(spark)
                    if self.health.current.broker_unreachable:
                        self._broker_back()
                except (FencedError, LeaseHeldError):
                    raise
                except Exception as err:  # e.g. the store or the broker is away while a run starts
                    error = err
                else:
                    while not self._stop.is_set() and query.isActive:
                        self._watch_policy_or_retry()
                        _wait(query, 1.0)
                    if self._fenced is not None and not isinstance(self._fenced, LeaseUnrenewableError):
                        raise self._fenced
                    if self._stop.is_set():
                        query.stop()
                        break
                    # Fenced by our own renewals failing (the store was away): nobody else holds the lease
                    # unless the next run's ``begin_run`` says so (LeaseHeldError), so this is a failure to retry.
                    error = self._fenced or query.exception()
                    if error is None:
                        break
                held = self._set_aside(str(error))
                self.end_run(release=False)
                self.health.restarted()
                if held:  # isolated: the next run goes on without them, at once
                    failures = 0
                    continue
                cause = broker_unreachable(self.config.pulsar.service_url)
                if cause is not None:
                    self._wait_for_broker(cause, backoff_s, broker_backoff_cap_s)
                    continue
                self._broker_back()
                if "CommitConflictError" in str(error) or "FencedError" in str(error):
                    log.warning("a segment commit was refused (%s); recovering from the store", error)
                # A run that lasted or made progress starts a new series: only failures in a row give up.
                failures = 1 if time.monotonic() - started >= 300 or _made_progress(query) else failures + 1
                if failures > max_restarts:
                    raise StreamOffloadError(f"offload query failed {failures} times in a row; last error: {error}")
                delay = min(backoff_s * 2 ** (failures - 1), 300.0)
                named = failed_topics(str(error))
                if named:  # the first failure of these topics: retried before they are set aside
                    log.error("offload of %s failed; recovering from the store in %.0f s", ", ".join(named), delay)
                else:
                    log.error("offload query failed (%s); recovering from the store in %.0f s", _one_line(error), delay)
                self._stop.wait(delay)
        finally:
            self.end_run()

    def _wait_for_broker(self, cause: str, backoff_s: float, cap_s: float) -> None:
        """Until the broker answers again (or ``stop``): no run is started meanwhile, since none could read.
        Each attempt says so in one line and waits with exponential backoff capped at ``cap_s``, probing
        every second so that a broker back early is used at once."""
        url = self.config.pulsar.service_url
        while cause is not None and not self._stop.is_set():
            attempt = self.health.current.attempts + 1
            delay = min(backoff_s * 2 ** (attempt - 1), cap_s)
            health = self.health.broker_down(cause, delay)
            since = time.strftime("%H:%M:%S", time.localtime(health.since_ms / 1000))
            (log.error if attempt == 1 else log.warning)(
                "broker %s unreachable: %s; retrying in %.0f s (attempt %d, unreachable since %s)",
                url,
                cause,
                delay,
                attempt,
                since,
            )
            deadline = time.monotonic() + delay
            while not self._stop.wait(min(1.0, delay)) and time.monotonic() < deadline:
                if broker_unreachable(url) is None:
                    break
            cause = broker_unreachable(url)
        self._broker_back()

    def _broker_back(self) -> None:
        """The broker answers again (or never was away): end the outage record, if there is one."""
        if broker_unreachable(self.config.pulsar.service_url) is not None:
            return
        ended = self.health.broker_up()
        if ended is not None:
            log.warning(
                "broker %s reachable again after %.0f s unreachable; recovering from the store",
                ended.broker_url,
                time.time() - ended.since_ms / 1000,
            )


def _made_progress(query: Any) -> bool:
    """Whether a failed query had completed a micro-batch (then its failure starts a new series)."""
    if query is None:
        return False
    try:
        return query.lastProgress is not None
    except Exception:
        return False


_CAUSE_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?[A-Za-z_]\w*(?:Error|Exception): \S")


def _one_line(error: Any) -> str:
    """An error as one line naming its cause. Spark wraps a Python failure as "An exception was raised by the
    Python Proxy. Return Message: Traceback ..." followed by the JVM stack: the cause is the traceback's last
    ``SomeError: why`` line that is not a JVM class."""
    text = str(error).strip()
    if not text:
        return type(error).__name__
    causes = [
        line.strip()
        for line in text.splitlines()
        if _CAUSE_LINE.match(line.strip()) and not line.strip().startswith(("org.", "java.", "py4j.", "scala."))
    ]
    return (causes[-1] if causes else text.splitlines()[0])[:500]
