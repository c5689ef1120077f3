"""The offload job's query: the Pulsar source and the control requests, into the segmenter
(``transformWithState``), into the sink (``foreachBatch``: on a driver thread behind the next micro-batch's read,
``streaming.sink.pipeline``, or in Spark tasks); the source's options, and what each micro-batch reports.

Part of :class:`~streamoffload.streaming.job.offload_job.OffloadJob` (``JobQueries``); its runs are
``streaming/job/runs.py``, their supervision ``streaming/job/supervision.py``."""

from __future__ import annotations

import json
import logging
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from streamoffload.errors import StreamOffloadError
from streamoffload.storage.location import StoreLocation, is_url
from streamoffload.streaming.governance.policy_versions import DEFAULT_REFRESH_S
from streamoffload.streaming.governance.rate_limits import RateLimitSpec
from streamoffload.streaming.handoff.actions import PACKED_ACTIONS_SCHEMA, Action, StatsAction, unpack_actions
from streamoffload.streaming.handoff.positions import CONTROL, LEDGER_ID
from streamoffload.streaming.job.masters import Master, parse_master
from streamoffload.streaming.job.report import BatchReport
from streamoffload.streaming.job.state import JobState
from streamoffload.streaming.runtime.progress_files import TaskProgress, task_file
from streamoffload.streaming.runtime.worker_gc import freeze_long_lived
from streamoffload.streaming.segmenter.segmenter_model import CONTROL_SEAL
from streamoffload.streaming.sink.entry_fetch import BrokerFetcherSpec
from streamoffload.streaming.sink.pipeline import SinkPipeline, segmenter_figures
from streamoffload.streaming.sink.sink import SinkStats, sink_for
from streamoffload.streaming.source.admission import buffer_file_path, write_buffer_file

if TYPE_CHECKING:
    from pyspark.sql import DataFrame
    from pyspark.sql.streaming.query import StreamingQuery

log = logging.getLogger(__name__)

QUERY_NAME = "streamoffload"
IDLE_POLL_S = 2.0
"""The source's ``idlePollSeconds`` in the job: a quiet topic-partition's first new entry is read up to this much
later, in exchange for not asking the broker about every topic-partition at every trigger."""
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


SINK_STATS_SCHEMA = "stats STRING"


def _arrow_actions(batches: Iterable[Any]) -> Iterator[Action]:
    """The actions of the segmenter's Arrow record batches (``PACKED_ACTIONS_SCHEMA``: each row a
    topic-partition's packed actions), one at a time."""
    for batch in batches:
        for packed in batch.column("actions"):
            yield from unpack_actions(packed.as_py())


def _stop_quietly(query: StreamingQuery) -> None:
    try:
        query.stop()
    except Exception:
        log.debug("stopping the query after a sink failure failed", exc_info=True)


def _apply_arrow(
    location: StoreLocation,
    fetcher: BrokerFetcherSpec,
    keys_file: str | None = None,
    progress: tuple[str, int] | None = None,
) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """The sink as a ``mapInArrow`` function: the actions (part layouts, not entry bytes) reach the
    executor's Python worker as Arrow batches; it fetches each part's entries from the broker (``fetcher``),
    writes the store, and returns one row of ``SinkStats``. ``progress``: (directory, batch id) of the progress
    files the tasks write as they go (``streaming.runtime.progress_files``)."""

    def apply(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        freeze_long_lived()
        sink = sink_for(location, fetcher, keys_file)
        told = None
        if progress is not None:
            from pyspark import TaskContext

            task = TaskContext.get()
            if task is not None:
                told = TaskProgress(task_file(*progress, task.partitionId(), task.attemptNumber()))
        stats: SinkStats = sink.apply(_arrow_actions(batches), told)
        yield pa.RecordBatch.from_pydict({"stats": [stats.to_json()]})

    return apply


class JobQueries(JobState):
    """Building and starting the job's query, and handling each micro-batch's results."""

    @property
    def location(self) -> StoreLocation:
        """Where the configured store is (``StoreSettings.location``)."""
        return self.config.store.location

    def source_options(self, *, seal_at_end: bool = False) -> dict[str, str]:
        """The Pulsar source's options: ``positionsOnly`` rows (the sink fetches the bytes), ``maxBytesPerTrigger``
        (default 1 GiB of entries) per micro-batch, and per topic-partition the offload buffer bound through
        ``bufferFile``.
        ``seal_at_end``: ``run_once``'s query ends with seal markers, in the micro-batch that reaches its target
        (``sealAtEnd``)."""
        from streamoffload.streaming.source.admission import buffer_file_path

        pulsar = self.config.pulsar
        options = {
            "serviceUrl": pulsar.service_url,
            "startingOffsets": self._starting_offsets(),
            "failOnDataLoss": str(pulsar.fail_on_data_loss).lower(),
            # The query carries positions, sizes and CRC-32Cs; the sink fetches the bytes (entry_fetch).
            "positionsOnly": "true",
        }
        options["keyPrefix"] = self.location.prefix
        if self.run is not None:
            options["policyVersionsFile"] = self._versions_file()
            options["bufferFile"] = buffer_file_path(self._versions_file(), self.run.epoch)
            options["quarantineFile"] = self._pause_file()
        if seal_at_end:
            options["sealAtEnd"] = "true"
        limits = self.rate_limit_spec()
        if limits is not None:
            options["rateLimits"] = limits.to_option()
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
        if not pulsar.watch_quiet_topics:
            options["watchedPollSeconds"] = "0"
        if pulsar.max_entries_per_trigger:
            options["maxEntriesPerTrigger"] = str(pulsar.max_entries_per_trigger)
        if pulsar.max_bytes_per_trigger:
            # Overlap or not, the configured bound: smaller micro-batches cost the broker more per byte (each one
            # subscribes at its start position again), which outweighs the overlap they give (bench/README.md).
            options["maxBytesPerTrigger"] = str(pulsar.max_bytes_per_trigger)
        for key, value in pulsar.client.items():
            options[f"pulsar.client.{key}"] = value
        return options

    def rate_limit_spec(self) -> RateLimitSpec | None:
        """Where the tasks find the rate limits (the run's policy versions) and how they share the job's totals:
        one budget beside the checkpoint where every task runs on this machine (``local``, ``local-cluster``), else
        each process ``total / tasks`` (Spark's parallelism, the most tasks that run at once: ``build`` learns it)."""
        if self.run is None:
            return None
        versions = self.run.policy_log  # None only in tests that build a Run by hand
        refresh = versions.refresh_s if versions is not None else DEFAULT_REFRESH_S
        local = self._master().on_this_machine
        budget_dir = str(Path(self._versions_file()).with_name("rate-budget")) if local else None
        return RateLimitSpec(self.location, self.rate_limit_tasks, refresh, budget_dir)

    def _hold_broker_retention(self, committed: dict[str, Any]) -> None:
        """``pulsar.retain_subscription``: acknowledge each topic-partition's durable subscription up to its last
        committed position, so the broker keeps what the store does not have yet. A failure is logged, not
        fatal: the next commit (or run) acknowledges again, and the store stays exact either way."""
        name = self.config.pulsar.retain_subscription
        if not name or not committed:
            return
        from streamoffload.pulsar import raw_reader as rr

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
        base = Path(checkpoint) if not is_url(checkpoint) else Path(tempfile.gettempdir()) / self.instance
        return str(base / "policy-versions.json")

    def _spool_dir(self) -> str | None:
        """Where the source tasks keep the bytes they read for the sink (``streaming.handoff.spool``): beside the
        checkpoint, one per run. Only where every task runs on this machine (``local``, ``local-cluster``, by the
        master the session runs on): elsewhere a sink on another executor would not find the files, and they would
        not be removed."""
        if self.run is None or not self.config.spark.spool or not self._master().on_this_machine:
            return None
        return str(Path(self._versions_file()).with_name(f"spool-{self.run.epoch:08d}"))

    def _master(self) -> Master:
        """The master the session runs on (under spark-submit, spark-submit's, not ``[spark] master``)."""
        return parse_master(self.spark_master or self.config.spark.master)

    def progress_files_dir(self) -> str | None:
        """Where this run's sink tasks may write their progress files: beside the checkpoint, one directory per
        run (a later run never reads an earlier one's). Only where every task runs on this machine, as the spool."""
        if self.run is None or not self._master().on_this_machine:
            return None
        return str(Path(self._versions_file()).with_name(f"progress-{self.run.epoch:08d}"))

    def _pause_file(self) -> str:
        return str(Path(self._versions_file()).with_name("quarantine.json"))

    def build(self, spark: Any, *, seal_at_end: bool = False) -> Any:
        from pyspark.sql import functions as F

        from streamoffload.streaming.segmenter.segmenter_spark import SegmenterProcessor

        run = self.run
        if run is None:
            raise StreamOffloadError("the job has no run: call begin_run() first")

        # A task per core: a micro-batch over many quiet topic-partitions packs their ranges into these
        # (input_ranges.group_ranges). Not two per core: at 500 msg/s over 4 topic-partitions the second wave of
        # small tasks was ~0.05 s of each ~0.8 s micro-batch, and a 1 GB backlog drained no faster with it.
        self.rate_limit_tasks = max(1, int(spark.sparkContext.defaultParallelism))
        self.spark_master = str(spark.sparkContext.master)
        max_partitions = self.rate_limit_tasks
        entries = (
            # Our own name: where pulsar-spark's jar is on the classpath, "pulsar" is its source (SPARK-50426).
            spark.readStream.format("streamoffload-pulsar")
            .options(**self.source_options(seal_at_end=seal_at_end))
            .option("maxPartitions", str(max_partitions))
            # A quiet topic-partition's latest position every ~2 s, not every trigger (a lookup costs the broker
            # a subscription): a trigger over thousands of topic-partitions asks about those that move.
            .option("idlePollSeconds", str(IDLE_POLL_S))
            .load()
            # The source's seal markers (``sealAtEnd``, ledger_id -1) seal their topic-partition's open segment.
            .withColumn(CONTROL, F.when(F.col(LEDGER_ID) < 0, F.lit(CONTROL_SEAL)).cast("string"))
        )
        controls = (
            spark.readStream.format("streamoffload-control").option("store", json.dumps(asdict(self.location))).load()
        )
        processor = SegmenterProcessor(
            run.policy_log,
            self.location.prefix,
            self.location.part_size,
            epoch=run.epoch,
            resume=run.resume,
            cut_every_batch=self.location.min_part_size <= 1,
        )
        return (
            entries.unionByName(controls)
            .groupBy("topic")
            .transformWithState(
                statefulProcessor=processor,
                outputStructType=PACKED_ACTIONS_SCHEMA,
                outputMode="Append",
                timeMode="ProcessingTime",
            )
        )

    def overlapping(self) -> bool:
        """Whether the sink writes a micro-batch on a driver thread while Spark reads the next one
        (``spark.overlap_writes``, where every task runs on this machine: the driver is on the machine of the
        spool, so it takes the bytes from there as the sink's tasks did; ``streaming.sink.pipeline``)."""
        return self.config.spark.overlap_writes and self._master().on_this_machine

    def _foreach_batch(self, batch_df: Any, batch_id: int) -> None:
        started = time.monotonic()
        if self.overlapping():
            self._hand_over(batch_df, batch_id, started)
            return
        progress = (self.progress_dir, batch_id) if self.progress_dir else None
        apply = _apply_arrow(self.location, self.fetcher_spec(), self.config.encryption.keys_file or None, progress)
        # One Spark job per micro-batch: the segmenter's stage feeds the sink's tasks directly.
        total = SinkStats()
        for row in batch_df.mapInArrow(apply, SINK_STATS_SCHEMA).collect():
            total.merge(SinkStats.from_json(row.stats))  # each task's, as _apply_arrow wrote it
        self._segmenter_figures(total.topics)
        self._batch_written(batch_id, time.monotonic() - started, total)

    def _hand_over(self, batch_df: DataFrame, batch_id: int, started: float) -> None:
        """Overlap: the segmenter's actions (layouts, no entry bytes) come to the driver, the segmenter's figures
        go to the source's admission control at once, and the sink pipeline writes the actions in the
        background after the micro-batch before (raising its failure here, which fails the query)."""
        actions = list(_arrow_actions(batch_df.toArrow().to_batches()))
        self._segmenter_figures(segmenter_figures(actions))
        self._sink_pipeline().submit(batch_id, actions, started)

    def _sink_pipeline(self) -> SinkPipeline:
        """The run's sink pipeline, made at its first micro-batch (``finish_writes`` closes it)."""
        if self._pipeline is None:
            location, fetcher = self.location, self.fetcher_spec()
            keys_file = self.config.encryption.keys_file or None

            def apply(batch_id: int, actions: list[Action]) -> SinkStats:
                # The driver writes the batch as one task would: its progress file is task 0's, attempt 0.
                progress_dir = self.progress_dir
                told = TaskProgress(task_file(progress_dir, batch_id, 0, 0)) if progress_dir else None
                return sink_for(location, fetcher, keys_file).apply(actions, told)

            self._pipeline = SinkPipeline(apply, self._batch_written, self._sink_failed)
        return self._pipeline

    def _sink_failed(self, err: BaseException) -> None:
        """A micro-batch's writes failed on the pipeline's thread: stop the query (a continuous run may see no
        next micro-batch to fail); the supervision takes the failure from ``finish_writes``."""
        query = self.query
        if query is not None:
            threading.Thread(target=_stop_quietly, args=(query,), name="streamoffload-sink-stop", daemon=True).start()

    def finish_writes(self) -> BaseException | None:
        """The run's end (overlap): wait for the micro-batch still being written, take no more; its failure, or
        any earlier one, is returned. None without overlap."""
        pipeline, self._pipeline = self._pipeline, None
        return pipeline.close() if pipeline is not None else None

    def _segmenter_figures(self, figures: dict[str, StatsAction]) -> None:
        """The segmenter's latest figures per topic-partition; the source's admission control reads each one's
        buffer from the buffer file before it plans the next micro-batch."""
        self.last_topic_stats.update(figures)
        if self.run is not None:
            write_buffer_file(
                buffer_file_path(self._versions_file(), self.run.epoch),
                self.last_topic_stats,
                self.location.part_size,
            )

    def _batch_written(self, batch_id: int, seconds: float, total: SinkStats) -> None:
        """A micro-batch is written (in ``foreachBatch``, or on the sink pipeline's thread): what follows from its
        seals, and its report to the listeners."""
        report = BatchReport(batch_id, seconds, total)
        self._metadata_changed({*total.topics, *(seal.topic for seal in total.sealed)})
        if self.quarantine is not None and total.sealed:
            for topic in self.quarantine.clear({seal.topic for seal in total.sealed}):
                log.warning("%s: offloading again (a segment was committed); no longer set aside", topic)
        self._hold_broker_retention({seal.topic: seal.end for seal in total.sealed})
        for seal in total.sealed:
            log.info(
                "sealed segment %s of %s: %d entries, %d bytes (%s)",
                seal.segment,
                seal.topic,
                seal.entries,
                seal.data_length,
                seal.reason,
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
        # No no-data micro-batches: with processing-time timers Spark runs one at every trigger whatever the
        # timers say (SPARK-50180), each most of a CPU second of the JVM's, so an idle job kept a core busy.
        # The continuous job's source plans a micro-batch when a timer is due instead (offset_planner's
        # WAKE_KEY); an AvailableNow run would otherwise not end before the rollover time. The query copies
        # the session's settings when it starts.
        key = "spark.sql.streaming.noDataMicroBatches.enabled"
        previous = spark.conf.get(key, "true")
        spark.conf.set(key, "false")
        try:
            if once:
                self.query = writer.trigger(availableNow=True).start()
            else:
                self.query = writer.trigger(processingTime=self.config.spark.trigger_interval).start()
        finally:
            spark.conf.set(key, previous)
        if not once:
            self.retention_runner().start()
            tables = self.table_follower()
            if tables.on_batch not in self.listeners:
                self.listeners.append(tables.on_batch)
            tables.start()
        return self.query
