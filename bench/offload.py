"""The offload job end to end: throughput on a backlog next to the source alone, and publish-to-readable lag.

Run from the repository root:

    .venv/bin/python bench/offload.py                                   # 500 MB backlog, 60 s at 500 msg/s
    .venv/bin/python bench/offload.py --backlog-mb 20 --lag-seconds 20  # smoke test, about 2 min
    .venv/bin/python bench/offload.py --backlog-mb 2000 --defaults      # memory on the default config

It starts the broker (``--broker``: the embedded pulsar-lite, or Apache Pulsar standalone) and one local
Spark session (``local[2]``), and uses a filesystem store (``--store s3``: a local moto_server, throughput
only), a checkpoint and the broker's data under one temporary work directory (removed at the end unless
``--keep``).

1. **Throughput.** It publishes a backlog of ``--backlog-mb`` MB of ``--payload-size`` messages,
   batched (``--batch-size`` messages per entry), over ``--partitions`` topic-partitions, then drains
   it two ways in the same run:

   - ``source``: the Pulsar source alone -- ``spark.readStream.format("pulsar")`` with the job's own
     source options (the same ``maxBytesPerTrigger``), ``Trigger.AvailableNow``, into Spark's ``noop``
     sink (as ``bench/source.py`` does). Timed from ``start()`` to termination.
   - ``job``: ``OffloadJob.run_once`` (the same query plus the segmenter and the sink, its last
     micro-batch sealing every open segment) into the filesystem store, segments of ``--segment-mb`` MiB, blocks of
     ``--block-size`` bytes. Timed as the wall time of ``run_once``.

   MB/s count entry bytes (10^6 bytes): the sum of ``entryBytes`` over the sealed segments' manifests,
   the same bytes the source emits (its row count is checked against the manifests' entry count). The
   figure that matters is the ratio job / source. Both sides first run once on a small warm-up topic,
   so neither pays the session's JVM and Python worker start-up. With ``--repeat N`` the rounds (source,
   job, plain drain) alternate and the medians are printed, each round's figures first.

   Then, as a user sees it: ``run --once`` steady MB/s (its micro-batches' time, query start-up taken
   off) next to a plain ``pulsar-client`` Reader loop (``bench/source.py``'s ``drain_plain``) draining
   the same backlog, and the peak bytes a topic-partition's segmenter kept in the state store after a
   micro-batch, beside the bound (less than one minimum part).

   **S3 on par** (``--store s3``, issue 48: the job's upload rate >= 0.7 of a raw multipart upload). After
   each round's jobs, on the same moto_server (a fresh prefix of the bucket), a raw ``aiobotocore``
   multipart upload (no project code on the upload path) of as many objects as the job's data objects, each
   as large as one of them, in parts of the job's part size (the whole blocks the segmenter gathers into a
   part: at least the policy's minimum part on S3, ``S3Store.part_size``) with as many part uploads at once
   as the job's sink makes (one per topic-partition, at most ``SINK_THREADS``, and as many parts as
   ``PART_BUDGET`` holds). Timed from the first CreateMultipartUpload to the last CompleteMultipartUpload.
   It prints the raw MB/s and, per overlap mode, the job's steady MB/s ÷ raw (target >= 0.7: met or
   MISSED; the job's MB are entry bytes, the raw upload's the data objects' bytes, a few % more: block
   headers and padding, so the ratio errs against the job), the sink's per-thread rate over its part and
   seal task seconds (fetching the entries taken off) ÷ the raw upload's per part upload, and moto's CPU
   seconds per GB on both sides (``bench/procstats.py``'s ``tree_cpu`` of the moto_server).

2. **Lag.** It runs the job continuously (``run_forever`` in a thread; trigger every
   ``--trigger-interval``, ``maxOffloadSegmentRolloverTimeSeconds = --rollover-seconds``), publishes
   at a steady ``--rate`` messages/s for ``--lag-seconds`` seconds, waits until every message is in an
   offloaded segment, then reads every segment back: for each message, lag = readable time - publish
   time, where the publish time is the one in the message's metadata (set by the producer) and the
   readable time is when the segment's manifest became ``Offloaded`` (the manifest file's mtime on the
   filesystem store: readers only read Offloaded segments, and the manifest is written last). It prints
   p50/p99 next to the rollover time (ratio). With a time-sealed segment the policy alone gives a
   p50 near half the rollover time and a p99 near the whole of it; the rest is the job. It also prints
   the micro-batches' p50 and the parts of it (Spark's query progress), the Spark jobs per micro-batch
   (the query's job group in the status tracker) and the peak state bytes per topic-partition.

3. **Memory** (``--defaults``, alone: no source-alone drain, no lag). The job on the *default*
   configuration (``maxBytesPerTrigger``, block, segment and buffer sizes as shipped; only the store,
   checkpoint and topics are set) drains a ``--backlog-mb`` backlog with ``run_once`` while a thread
   samples the resident set (VmRSS, /proc) of every process of the tree every 0.2 s: this driver Python,
   the Spark JVM (driver and executor in one, ``local[2]``), its Python workers, and the broker. It prints
   each peak beside the configured bounds, the JVM heap's peak use (per pool, from its MemoryPoolMXBeans)
   and the largest micro-batch and offload buffer seen. The job's ``bufferFile`` is written by a batch
   listener here (``streaming.source.admission.write_buffer_file``, what the job's foreachBatch does).

Comparing settings: ``--conf KEY=VALUE`` adds a Spark setting to the session (a run each, for settings
fixed when the JVM starts). ``--compare KEY=VALUE --rounds N`` runs only the lag phase, ``N`` times on
each side, alternating in one session: A with the job's settings, B with these on top (query-level
settings such as ``streaming.job.queries.STATE_STORE_CONF``'s), then prints each figure's median on both sides
and B/A, so both sides see the same load:

    M=org.apache.spark.sql.execution.streaming.checkpointing.FileContextBasedCheckpointFileManager
    .venv/bin/python bench/offload.py --backlog-mb 200 --lag-seconds 30 --skip-throughput --rounds 3 --compare \\
        spark.sql.streaming.checkpointFileManagerClass=$M

Each part also prints the CPU seconds spent by the broker, the Spark JVM, the Python workers and this
driver process (from /proc), which is what the "what limits it" line is drawn from: the 2 cores here
are shared with other work, so wall times move by ±20% and CPU seconds are the steadier witness.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import random
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

# bench/procstats.py is shared by the bench scripts; run from the repository root.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import (
    Broker,
    add_broker_argument,
    bench_broker,
    broker_name,
    fs_store_section,
    moto_bucket,
    moto_credentials,
    s3_store_section,
)
from bench.logs import log_beside
from bench.procstats import CpuMeter, JvmThreadCensus, ProcessCensus, RssSampler, child_pids, jvm_heap_pools, tree_cpu
from bench.readable import offloaded_through, percentile, readable_messages, wait_offloaded
from bench.s3_endpoint import S3_CREDENTIALS, S3_REGION, raw_s3_client
from bench.source import drain_to_noop
from streamoffload.checkpoints import manifest as mf
from streamoffload.checkpoints.metadata_store import MetadataStore
from streamoffload.checkpoints.policy import min_block_size
from streamoffload.config import DEFAULT_MAX_BYTES_PER_TRIGGER, Config, parse_config
from streamoffload.produce import ProduceSummary, produce
from streamoffload.streaming.job.offload_job import OffloadJob
from streamoffload.streaming.job.report import BatchReport

MIB = 1024 * 1024
NAMESPACE = "persistent://public/default"
# pulsar-client logs every producer's life at INFO on stdout; the bench's figures should stand out.
_QUIET = logging.getLogger("bench.offload.pulsar")
_QUIET.setLevel(logging.WARNING)
QUIET_CLIENT = {"logger": _QUIET}


# --- configuration ----------------------------------------------------------------------------------


def job_config(
    args: argparse.Namespace,
    work: Path,
    name: str,
    service_url: str,
    topics: list[str],
    rollover_seconds: float | None = None,
    encryption_keys: Path | None = None,
    compression: str | None = None,
    overlap: bool | None = None,
) -> Config:
    """The job's configuration; without ``rollover_seconds`` the default rollover (10 minutes) applies,
    so a backlog's segments are sealed by size, and the last one by ``run_once``. ``overlap``: the job's
    ``spark.overlap_writes`` (None: its default)."""
    offload: dict[str, Any] = {}
    if not args.defaults:
        offload["maxSizePerOffloadSegmentMbytes"] = args.segment_mb
        offload["managedLedgerOffloadMaxBlockSizeInBytes"] = args.block_size
    if rollover_seconds is not None:
        offload["maxOffloadSegmentRolloverTimeSeconds"] = rollover_seconds
    pulsar: dict[str, Any] = {"service_url": service_url, "topics": topics}
    if not args.defaults:
        # Its entries (batches of a few KiB messages) stay far below 1 MiB; declaring so lets blocks smaller
        # than Pulsar's 5 MiB maxMessageSize through the configuration check (checkpoints.policy).
        pulsar["max_message_size"] = min(1 << 20, args.block_size - min_block_size(0))
    if args.max_bytes_per_trigger > 0 and not args.defaults:
        pulsar["max_bytes_per_trigger"] = args.max_bytes_per_trigger
    doc: dict[str, Any] = {
        "pulsar": pulsar,
        "store": _store_section(args, work, name),
        "spark": {"checkpoint": str(work / f"checkpoint-{name}"), "trigger_interval": args.trigger_interval},
        "metrics": {"address": ""},
        "offload": offload,
    }
    if overlap is not None:
        doc["spark"]["overlap_writes"] = overlap
    if encryption_keys is not None:  # every segment encrypted at rest under the key "bench"
        doc["encryption"] = {"keys_file": str(encryption_keys)}
        offload["offloadEncryptionKeyId"] = "bench"
    if compression is not None:  # every segment compressed at rest
        offload["offloadCompression"] = compression
    return parse_config(doc, f"<bench {name}>")


S3_BUCKET = "bench"


def _store_section(args: argparse.Namespace, work: Path, name: str) -> dict[str, Any]:
    """A filesystem store under the work directory, or with ``--store s3`` a prefix per run in the bench's
    bucket on its moto_server (``args.s3_endpoint``)."""
    if args.store == "s3":
        return s3_store_section(args.s3_endpoint, S3_BUCKET, name)
    return fs_store_section(work / f"store-{name}")


@contextlib.contextmanager
def _s3_endpoint(args: argparse.Namespace, work: Path) -> Iterator[None]:
    """With ``--store s3``: a local moto_server with the bench's bucket, its URL in ``args.s3_endpoint``."""
    if args.store != "s3":
        yield
        return
    with moto_bucket(work / "moto.log", S3_BUCKET) as url:
        args.s3_endpoint = url
        args.moto_pid = min(child_pids("moto"), default=None)  # its CPU, for the S3 on par figures
        yield


# --- the two drains ----------------------------------------------------------------------------------


def drain_source(spark: Any, job: OffloadJob, checkpoint: Path) -> tuple[int, float, int]:
    """(rows, wall seconds from start to termination, micro-batches) of the source alone into ``noop``."""
    started = time.monotonic()
    stream = spark.readStream.format("pulsar").options(**job.source_options()).load()
    progress = drain_to_noop(stream, str(checkpoint), "source-alone query")
    wall = time.monotonic() - started
    return sum(p["numInputRows"] for p in progress), wall, len(progress)


@dataclass
class JobRun:
    wall: float
    entries: int
    entry_bytes: int
    segments: int
    reasons: dict[str, int]
    batches: int
    batch_seconds: float
    upload_seconds: float
    queries: list[QueryTimes]
    fetched: str
    """Per query that ``run_once`` started (one: it drains, then seals in its last micro-batch)."""
    peak_state: int = 0
    """The most bytes any topic-partition's segmenter kept in the state store after a micro-batch."""
    steady_s: float = 0.0
    """Seconds from the start of the first micro-batch (its reading) to the last micro-batch's writes done (its
    report): the steady rate's time, start-up taken off, writes behind the source included."""
    parts: int = 0
    part_bytes: int = 0
    """The parts the sink wrote (a segment written whole counts as one) and their bytes, as stored."""
    fetch_seconds: float = 0.0
    """Task seconds the sink spent fetching the parts' entries (within ``upload_seconds``)."""
    data_keys: list[str] = field(default_factory=list)
    """The sealed segments' data objects."""


@dataclass
class QueryTimes:
    wall: float
    """Seconds from the query's start to the next one's (or the end of ``run_once``)."""
    batches: int
    batch_s: float
    """Seconds in its micro-batches (``triggerExecution``)."""
    planning_s: float
    """Of which query planning (``queryPlanning``)."""
    segmenter_s: float
    """Task seconds in the segmenter operator (``allUpdatesTimeMs`` of transformWithState)."""
    rows: list[int]
    """Input rows of each micro-batch (entries, and seal markers in the last)."""

    @classmethod
    def of(cls, wall: float, progress: list[Any]) -> QueryTimes:
        def ms(p: Any, key: str) -> float:
            return float(p["durationMs"].get(key, 0)) / 1000

        segmenter = sum(op.get("allUpdatesTimeMs", 0) for p in progress for op in p["stateOperators"]) / 1000
        return cls(
            wall,
            len(progress),
            sum(ms(p, "triggerExecution") for p in progress),
            sum(ms(p, "queryPlanning") for p in progress),
            segmenter,
            [int(p["numInputRows"]) for p in progress],
        )

    def render(self, name: str) -> str:
        return (
            f"{name} query {self.wall:.1f} s ({self.batches} micro-batches: {self.batch_s:.1f} s, of which "
            f"planning {self.planning_s:.1f} s; segmenter operator {self.segmenter_s:.1f} task s; "
            f"rows per micro-batch {', '.join(map(str, self.rows))})"
        )


def drain_job(spark: Any, config: Config) -> JobRun:
    job = OffloadJob(config)
    reports: list[BatchReport] = []
    written_at: list[float] = []

    def on_batch(report: BatchReport) -> None:
        reports.append(report)
        written_at.append(time.time())

    job.listeners.append(on_batch)
    starts: list[tuple[float, Any]] = []
    start_query = job.start

    def timed_start(*args: Any, **kwargs: Any) -> Any:
        starts.append((time.monotonic(), None))
        query = start_query(*args, **kwargs)
        starts[-1] = (starts[-1][0], query)
        return query

    job.start = timed_start  # type: ignore[method-assign]
    started = time.monotonic()
    job.run_once(spark)
    wall = time.monotonic() - started
    ended = time.monotonic()
    queries = []
    for i, (at, query) in enumerate(starts):
        until = starts[i + 1][0] if i + 1 < len(starts) else ended
        queries.append(QueryTimes.of(until - at, list(query.recentProgress)))
    first_progress = next((p for _at, q in starts for p in q.recentProgress), None)
    steady_s = 0.0
    if first_progress is not None and written_at:
        first_batch_at = datetime.fromisoformat(first_progress["timestamp"]).timestamp()
        steady_s = max(written_at) - first_batch_at
    meta = MetadataStore(config.store.location.open())
    entries = entry_bytes = segments = 0
    reasons: dict[str, int] = {}
    data_keys: list[str] = []
    for topic in config.pulsar.topics:
        manifests = meta.manifests(topic)
        stuck = [m for m in manifests if m.status != mf.OFFLOADED]
        if stuck:
            raise RuntimeError(f"{topic}: {len(stuck)} segment(s) not Offloaded after run_once")
        for m in manifests:
            entries += m.entries
            entry_bytes += m.entryBytes
            segments += 1
            reasons[m.sealReason] = reasons.get(m.sealReason, 0) + 1
            data_keys.append(m.dataKey)
    return JobRun(
        wall,
        entries,
        entry_bytes,
        segments,
        reasons,
        sum(1 for r in reports if r.stats.parts or r.stats.sealed),
        sum(r.duration_s for r in reports),
        sum(sum(r.stats.upload_seconds) for r in reports),
        queries,
        fetched(reports),
        peak_state_bytes(reports),
        steady_s,
        sum(r.stats.parts for r in reports),
        sum(r.stats.part_bytes for r in reports),
        sum(r.stats.fetch_seconds for r in reports),
        data_keys,
    )


def fetched(reports: list[BatchReport]) -> str:
    """Where the sink got its entries: the spool, or reads of the broker."""
    spooled = sum(r.stats.spooled_entries for r in reports)
    broker = sum(r.stats.broker_entries for r in reports)
    reads = sum(r.stats.broker_reads for r in reports)
    seconds = sum(r.stats.fetch_seconds for r in reports)
    return (
        f"the sink took {spooled:,} entries from the spool and {broker:,} from the broker in {reads:,} reads "
        f"({seconds:.1f} task s fetching)"
    )


def peak_state_bytes(reports: list[BatchReport]) -> int:
    """The largest remainder (``buffered_bytes``) a topic-partition kept in state after any micro-batch."""
    return max((t.buffered_bytes for r in reports for t in r.stats.topics.values()), default=0)


def steady_seconds(queries: list[QueryTimes]) -> float:
    """``run_once`` with start-up taken off: the time in its micro-batches."""
    return sum(q.batch_s for q in queries)


def _bench_source() -> Any:
    """``bench/source.py`` as a module (the benches are scripts, not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_source", Path(__file__).with_name("source.py"))
    assert spec is not None and spec.loader is not None
    bench_source = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench_source)
    return bench_source


def drain_plain_client(service_url: str, topics: list[str]) -> float:
    """Seconds a plain ``pulsar-client`` Reader loop (``bench/source.py``'s) takes to drain ``topics``."""
    from streamoffload.pulsar import client_reader

    bench_source = _bench_source()
    client = client_reader.make_client(service_url)
    try:
        ends = {t: client_reader.latest_position(client, t) for t in topics}
        started = time.monotonic()
        for topic in topics:
            bench_source.drain_plain(client, topic, ends[topic], 200, 2000)
        return time.monotonic() - started
    finally:
        client.close()


def publish_backlog(args: argparse.Namespace, broker: Broker, part: str, name: str) -> ProduceSummary:
    """Publish ``--backlog-mb`` of batched messages to ``<name>-partition-<i>`` and say so."""
    summary = produce(
        broker.service_url,
        f"{NAMESPACE}/{name}",
        int(args.backlog_mb * 1e6 / args.payload_size),
        args.payload_size,
        partitions=args.partitions,
        batching=True,
        batch_size=args.batch_size,
        client_options=QUIET_CLIENT,
    )
    topics = list(summary.partitions)
    print(
        f"{part}: published {summary.messages:,} messages of {args.payload_size} B ({summary.bytes / 1e6:,.0f} MB of "
        f"payload) to {len(topics)} topic-partitions in {summary.seconds:.1f} s"
    )
    return summary


@dataclass
class JobDrain:
    """One ``run_once`` of a round, with overlap on or off (``spark.overlap_writes``)."""

    overlap: bool
    run: JobRun
    cpu: dict[str, float]
    old_gen_after: int
    """Bytes in the JVM's old generation right after the run."""
    moto_cpu: float = 0.0
    """CPU seconds of the moto_server during the run (``--store s3``)."""

    @property
    def mb(self) -> float:
        return self.run.entry_bytes / 1e6

    @property
    def steady_mbs(self) -> float:
        """From the first micro-batch's start to the last one written (``JobRun.steady_s``)."""
        return self.mb / self.run.steady_s if self.run.steady_s > 0 else self.mb / steady_seconds(self.run.queries)

    @property
    def tree_cpu_per_gb(self) -> float:
        """CPU s per GB of the job's whole process tree: the JVM, its Python workers and the driver process."""
        return sum(self.cpu.get(k, 0.0) for k in ("jvm", "python workers", "driver")) / (self.mb / 1000)

    @property
    def spark_cpu_per_gb(self) -> float:
        return (self.cpu.get("jvm", 0.0) + self.cpu.get("python workers", 0.0)) / (self.mb / 1000)

    def broker_ratio(self, plain_cpu: dict[str, float]) -> float:
        """Broker CPU per byte in the job ÷ in the plain drain."""
        return self.cpu.get("broker", 0.0) / max(plain_cpu.get("broker", 0.0), 1e-9)

    @property
    def sink_thread_mbs(self) -> float:
        """MB/s of one sink thread: its parts' bytes over its part and seal task seconds, fetching taken off."""
        return self.run.part_bytes / 1e6 / max(self.run.upload_seconds - self.run.fetch_seconds, 1e-9)


@dataclass
class ThroughputRound:
    """One round of the throughput phase: the drains of the same backlog, side by side."""

    source_rows: int
    source_wall: float
    source_batches: int
    source_cpu: dict[str, float]
    jobs: list[JobDrain]
    plain_wall: float
    plain_cpu: dict[str, float]
    raw: RawUpload | None = None
    """``--store s3``: the raw multipart upload of the jobs' bytes, after them."""

    @property
    def mb(self) -> float:
        return self.jobs[0].mb

    @property
    def plain_mbs(self) -> float:
        return self.mb / self.plain_wall

    def job(self, overlap: bool) -> JobDrain:
        return next(j for j in self.jobs if j.overlap == overlap)


@dataclass
class ReferenceDrains:
    """The broker's best reader, on the fresh broker before any job read the backlog: plain ``pulsar-client``
    drains (best of ``PLAIN_DRAINS``) and a raw-reader drain, each timed."""

    plain: list[tuple[float, dict[str, float]]]
    raw: tuple[float, dict[str, float]]

    @property
    def best_s(self) -> float:
        return min([s for s, _ in self.plain] + [self.raw[0]])

    @property
    def best_plain(self) -> tuple[float, dict[str, float]]:
        return min(self.plain, key=lambda d: d[0])


PLAIN_DRAINS = 5


def drain_raw_client(service_url: str, topics: list[str]) -> float:
    """Seconds the raw reader (``bench/source.py``'s ``drain_raw``) takes to drain ``topics``."""
    from streamoffload.pulsar import client_reader
    from streamoffload.pulsar import raw_reader as rr

    bench_source = _bench_source()
    client = client_reader.make_client(service_url)
    raw = rr.RawClient(service_url)
    try:
        ends = {t: client_reader.latest_position(client, t) for t in topics}
        started = time.monotonic()
        for topic in topics:
            bench_source.drain_raw(raw, topic, ends[topic], 200, 2000)
        return time.monotonic() - started
    finally:
        client.close()
        with contextlib.suppress(Exception):
            raw.close()


def reference_drains(broker: Broker, topics: list[str], payload_mb: float, count: int) -> ReferenceDrains:
    """The broker's best reader on the fresh broker (before the job touches the backlog), every drain printed:
    ``count`` plain drains and a raw one."""
    plain: list[tuple[float, dict[str, float]]] = []
    for i in range(count):
        with CpuMeter(broker.pid) as meter:
            seconds = drain_plain_client(broker.service_url, topics)
        plain.append((seconds, meter.used))
        print(
            f"  reference: plain pulsar-client drain {i + 1}: {seconds:.2f} s "
            f"({payload_mb / seconds:.1f} MB/s of payload)"
        )
    with CpuMeter(broker.pid) as meter:
        seconds = drain_raw_client(broker.service_url, topics)
    print(f"  reference: raw-reader drain: {seconds:.2f} s ({payload_mb / seconds:.1f} MB/s of payload)")
    drains = ReferenceDrains(plain, (seconds, meter.used))
    every = [s for s, _ in plain] + [seconds]
    if max(every) > 2 * min(every):
        print(f"  reference: the drains differ by more than 2x ({min(every):.2f} to {max(every):.2f} s)")
    return drains


def old_generation_bytes(spark: Any) -> int:
    """Bytes used now in the JVM's old generation (G1 Old Gen, or any pool named so)."""
    management = spark.sparkContext._jvm.java.lang.management.ManagementFactory
    for pool in management.getMemoryPoolMXBeans():
        if "Old" in str(pool.getName()):
            return int(pool.getUsage().getUsed())
    return 0


def overlap_modes(choice: str) -> list[bool]:
    return {"both": [False, True], "on": [True], "off": [False]}[choice]


# --- S3 on par: a raw multipart upload of the job's bytes ------------------------------------------------


def job_part_size(config: Config) -> int:
    """The bytes the job's segmenter gathers into a part (but a segment's last): whole blocks (a full block is
    padded to the block size), as many as make the policy's minimum part on the store (``min_part_bytes`` of
    the store's ``part_size``, which the job gives the segmenter; S3Store's: 5 MiB), e.g. two 4 MiB blocks."""
    policy = config.policy_for(config.pulsar.topics[0])
    min_part = policy.min_part_bytes(config.store.location.part_size)
    return -(-min_part // policy.block_size) * policy.block_size


def sink_concurrency(part_size: int, topic_partitions: int) -> int:
    """Part uploads the job's sink makes at once: one per topic-partition (each writes its parts in order), on at
    most ``SINK_THREADS`` threads, as many parts as ``PART_BUDGET`` holds (``streaming.sink.sink``)."""
    from streamoffload.streaming.sink.sink import PART_BUDGET, SINK_THREADS

    return max(1, min(SINK_THREADS, topic_partitions, PART_BUDGET // part_size))


def data_object_sizes(config: Config, data_keys: list[str]) -> list[int]:
    """The sizes of a job's data objects, from the store (HEAD)."""
    store = config.store.location.open().store
    return [store.head(key).size for key in data_keys]


@dataclass
class RawUpload:
    """A raw ``aiobotocore`` multipart upload of objects sized like the job's data objects."""

    sizes: list[int]
    part_size: int
    concurrency: int
    parts: int
    wall: float
    """Seconds from the first CreateMultipartUpload to the last CompleteMultipartUpload."""
    part_seconds: float
    """The part uploads' seconds, summed (each from its request to its answer)."""
    moto_cpu: float

    @property
    def mb(self) -> float:
        return sum(self.sizes) / 1e6

    @property
    def mbs(self) -> float:
        return self.mb / self.wall

    @property
    def part_mbs(self) -> float:
        """MB/s of one part upload stream."""
        return self.mb / max(self.part_seconds, 1e-9)


def raw_multipart_upload(
    endpoint: str, prefix: str, sizes: list[int], part_size: int, concurrency: int, moto_pid: int | None
) -> RawUpload:
    """Upload one object per ``sizes`` under ``prefix`` of the bench's bucket as multipart uploads in parts of
    ``part_size`` (the last smaller), ``concurrency`` part uploads at once over all objects, with a plain
    aiobotocore client (its defaults; path-style addressing, a pool as large as the concurrency); then delete
    them (untimed). moto's CPU is metered over the timed part."""
    import asyncio

    from aiobotocore.config import AioConfig
    from aiobotocore.session import AioSession

    body = os.urandom(part_size)
    part_seconds = 0.0
    parts = 0

    async def upload() -> float:
        nonlocal part_seconds, parts
        config = AioConfig(s3={"addressing_style": "path"}, max_pool_connections=max(10, concurrency))
        async with AioSession().create_client(
            "s3",
            endpoint_url=endpoint,
            region_name=S3_REGION,
            aws_access_key_id=S3_CREDENTIALS["access_key"],
            aws_secret_access_key=S3_CREDENTIALS["secret_key"],
            config=config,
        ) as client:
            await client.head_bucket(Bucket=S3_BUCKET)  # connected and signed once before the clock starts
            gate = asyncio.Semaphore(concurrency)

            async def part(key: str, upload_id: str, number: int, length: int) -> dict[str, Any]:
                nonlocal part_seconds, parts
                async with gate:
                    started = time.monotonic()
                    answer = await client.upload_part(
                        Bucket=S3_BUCKET,
                        Key=key,
                        UploadId=upload_id,
                        PartNumber=number,
                        Body=body if length == part_size else body[:length],
                    )
                    part_seconds += time.monotonic() - started
                    parts += 1
                return {"PartNumber": number, "ETag": answer["ETag"]}

            async def one(key: str, size: int) -> None:
                upload_id = (await client.create_multipart_upload(Bucket=S3_BUCKET, Key=key))["UploadId"]
                lengths = [min(part_size, size - offset) for offset in range(0, size, part_size)]
                done = await asyncio.gather(*(part(key, upload_id, i + 1, n) for i, n in enumerate(lengths)))
                await client.complete_multipart_upload(
                    Bucket=S3_BUCKET, Key=key, UploadId=upload_id, MultipartUpload={"Parts": list(done)}
                )

            started = time.monotonic()
            await asyncio.gather(*(one(f"{prefix}/object-{i}", size) for i, size in enumerate(sizes)))
            return time.monotonic() - started

    cpu_before = tree_cpu(moto_pid) if moto_pid is not None else 0.0
    wall = asyncio.run(upload())
    moto_cpu = tree_cpu(moto_pid) - cpu_before if moto_pid is not None else 0.0
    s3 = raw_s3_client(endpoint)
    listed = s3.list_objects_v2(Bucket=S3_BUCKET, Prefix=f"{prefix}/").get("Contents", [])
    if len(listed) != len(sizes) or sorted(o["Size"] for o in listed) != sorted(sizes):
        raise RuntimeError(f"the raw upload stored {len(listed)} objects, not the {len(sizes)} asked for")
    s3.delete_objects(Bucket=S3_BUCKET, Delete={"Objects": [{"Key": o["Key"]} for o in listed]})
    return RawUpload(sizes, part_size, concurrency, parts, wall, part_seconds, moto_cpu)


def moto_cpu_now(args: argparse.Namespace) -> float:
    """CPU seconds so far of the moto_server (0 without ``--store s3``)."""
    pid = getattr(args, "moto_pid", None)
    return tree_cpu(pid) if pid is not None else 0.0


def load_average() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} {five:.2f} {fifteen:.2f}"


def s3_on_par(rounds: list[ThroughputRound], modes: list[bool]) -> None:
    """The medians of the S3 on par figures (``--store s3``)."""
    raws = [r.raw for r in rounds if r.raw is not None]
    if not raws:
        return
    raw = raws[0]
    raw_mbs = statistics.median(u.mbs for u in raws)
    print(
        f"  S3 on par (moto): raw aiobotocore multipart {raw_mbs:.1f} MB/s ({len(raw.sizes)} objects, "
        f"{raw.mb:.1f} MB, {raw.part_size / MIB:g} MiB parts, {raw.concurrency} at once; "
        f"{statistics.median(u.part_mbs for u in raws):.1f} MB/s per part upload; moto CPU "
        f"{statistics.median(u.moto_cpu / (u.mb / 1000) for u in raws):.1f} s/GB); {load_average()}"
    )
    for overlap in modes:
        drains = [(r.job(overlap), r.raw) for r in rounds if r.raw is not None]
        steady = statistics.median(j.steady_mbs for j, _ in drains)
        ratio = statistics.median(j.steady_mbs / u.mbs for j, u in drains)
        thread = statistics.median(j.sink_thread_mbs / u.part_mbs for j, u in drains)
        print(
            f"  overlap {'on ' if overlap else 'off'}: job steady {steady:.1f} MB/s ÷ raw {ratio:.2f} (target >= 0.7) "
            f"{'met' if ratio >= 0.7 else 'MISSED'}; sink per thread "
            f"{statistics.median(j.sink_thread_mbs for j, _ in drains):.1f} MB/s (part and seal task s, fetching "
            f"taken off) ÷ raw per part upload {thread:.2f}; moto CPU "
            f"{statistics.median(j.moto_cpu / (j.mb / 1000) for j, _ in drains):.1f} s/GB"
        )


def throughput(args: argparse.Namespace, spark: Any, broker: Broker, work: Path) -> None:
    """The broker's best reader on the fresh broker first; then rounds of: the job's source alone, ``run_once``
    with overlap off and on (``--overlap``; the order alternates by round), and a plain ``pulsar-client`` drain
    of the same backlog, so each ratio is taken under the same load; medians over the rounds."""
    summary = publish_backlog(args, broker, "throughput", "bench-offload-backlog")
    topics = list(summary.partitions)
    reference = reference_drains(broker, topics, summary.bytes / 1e6, args.plain_drains)
    modes = overlap_modes(args.overlap)
    rounds: list[ThroughputRound] = []
    for round_no in range(args.repeat):
        name = f"backlog-{round_no}"
        with CpuMeter(broker.pid) as source_meter:
            config = job_config(args, work, name, broker.service_url, topics)
            rows, source_wall, batches = drain_source(spark, OffloadJob(config), work / f"checkpoint-source-{round_no}")
        jobs: list[JobDrain] = []
        raw_sizes: list[int] | None = None
        part_size = 0
        for overlap in modes if round_no % 2 == 0 else modes[::-1]:
            config = job_config(
                args, work, f"{name}-{'on' if overlap else 'off'}", broker.service_url, topics, overlap=overlap
            )
            moto_before = moto_cpu_now(args)
            with (
                CpuMeter(broker.pid) as job_meter,
                ProcessCensus() as census,
                JvmThreadCensus(broker_pid=broker.pid) as threads,
            ):
                run = drain_job(spark, config)
            moto_cpu = moto_cpu_now(args) - moto_before
            jobs.append(JobDrain(overlap, run, job_meter.used, old_generation_bytes(spark), moto_cpu))
            if args.store == "s3" and raw_sizes is None:
                raw_sizes = data_object_sizes(config, run.data_keys)
                part_size = job_part_size(config)
            if rows != run.entries:
                raise RuntimeError(f"the source read {rows} entries but the job's segments hold {run.entries}")
            j = jobs[-1]
            print(
                f"  round {round_no + 1}, overlap {'on' if overlap else 'off'}: run --once {j.mb / run.wall:.1f} MB/s, "
                f"steady {j.steady_mbs:.1f} MB/s ({run.steady_s:.1f} s); job tree CPU {j.tree_cpu_per_gb:.1f} s/GB "
                f"(Spark side {j.spark_cpu_per_gb:.1f}); {CpuMeter.describe(j.cpu, run.wall)}; JVM old gen after "
                f"{j.old_gen_after / 2**20:.0f} MiB"
            )
            print(
                f"    {run.fetched}; "
                + " + ".join(q.render(n) for n, q in zip(("drain and seal", "other"), run.queries, strict=False))
            )
            print(f"    the job's Python processes (sampled, a floor): {census.render()}")
            print(f"    the JVM's CPU s by thread: {threads.render()}")
            # The store of a run is measured; drop it so several rounds of a big backlog do not pile up.
            shutil.rmtree(config.store.root, ignore_errors=True)
        raw = None
        if raw_sizes is not None:
            concurrency = sink_concurrency(part_size, len(topics))
            raw = raw_multipart_upload(
                args.s3_endpoint, f"raw-{round_no}", raw_sizes, part_size, concurrency, args.moto_pid
            )
            stored = sum(raw_sizes) / max(jobs[0].run.entry_bytes, 1)
            mean_part = jobs[0].run.part_bytes / max(jobs[0].run.parts, 1)
            print(
                f"  round {round_no + 1}, raw aiobotocore multipart: {len(raw_sizes)} objects as the job's data "
                f"objects ({raw.mb:.1f} MB, {stored:.3f}x its entry bytes), {raw.parts} parts of at most "
                f"{part_size / MIB:g} MiB (the job's mean part {mean_part / MIB:.2f} MiB), "
                f"{concurrency} at once: {raw.wall:.2f} s = {raw.mbs:.1f} MB/s ({raw.part_mbs:.1f} MB/s per part "
                f"upload); moto CPU {raw.moto_cpu:.1f} s ({raw.moto_cpu / raw.wall:.2f} cores, "
                f"{raw.moto_cpu / (raw.mb / 1000):.1f} s/GB; in the jobs "
                + ", ".join(f"{'on' if j.overlap else 'off'} {j.moto_cpu / (j.mb / 1000):.1f}" for j in jobs)
                + ")"
            )
        with CpuMeter(broker.pid) as plain_meter:
            plain_wall = drain_plain_client(broker.service_url, topics)
        rounds.append(
            ThroughputRound(rows, source_wall, batches, source_meter.used, jobs, plain_wall, plain_meter.used, raw)
        )
        r = rounds[-1]
        print(
            f"  round {round_no + 1}: source alone {r.mb / source_wall:.1f} MB/s, plain drain after the jobs "
            f"{r.plain_mbs:.1f} MB/s"
        )

    def median(values: list[float]) -> float:
        return statistics.median(values)

    mb = rounds[0].mb
    best_mbs = mb / reference.best_s
    plain_s, plain_cpu = reference.best_plain
    print(f"  medians of {len(rounds)} round(s), {mb:.1f} MB of entries ({rounds[0].source_rows:,} entries):")
    print(
        f"  the broker's best reader (fresh broker): {best_mbs:.1f} MB/s (plain best of {args.plain_drains} "
        f"{mb / plain_s:.1f}, raw {mb / reference.raw[0]:.1f}); source alone "
        f"{median([r.mb / r.source_wall for r in rounds]):.1f} MB/s"
    )
    for overlap in modes:
        drains = [r.job(overlap) for r in rounds]
        steady = median([j.steady_mbs for j in drains])
        print(
            f"  overlap {'on ' if overlap else 'off'}: steady {steady:.1f} MB/s, "
            f"÷ best reader {steady / best_mbs:.2f}; "
            f"run --once {median([j.mb / j.run.wall for j in drains]):.1f} MB/s; job tree CPU "
            f"{median([j.tree_cpu_per_gb for j in drains]):.1f} s/GB (Spark side "
            f"{median([j.spark_cpu_per_gb for j in drains]):.1f}); "
            f"broker CPU per byte ÷ the fresh plain drain's {median([j.broker_ratio(plain_cpu) for j in drains]):.2f}; "
            f"JVM old gen after {median([j.old_gen_after for j in drains]) / 2**20:.0f} MiB; peak state bytes per "
            f"topic-partition {max(j.run.peak_state for j in drains):,}"
        )
    if len(modes) == 2:
        ratio = median([r.job(True).steady_mbs / r.job(False).steady_mbs for r in rounds])
        print(f"  overlap on ÷ off, steady: {ratio:.2f} (median of the rounds' ratios)")
    s3_on_par(rounds, modes)


def json_payload(rnd: random.Random, seq: int, size: int) -> bytes:
    """A realistic JSON event of about ``size`` bytes: ids, timestamps, enums, numbers and some free text, as an
    application's events look (not a repeated pattern, which would flatter any compressor)."""
    doc: dict[str, Any] = {
        "event_id": f"{rnd.getrandbits(128):032x}",
        "seq": seq,
        "ts": f"2026-11-27T{rnd.randint(0, 23):02d}:{rnd.randint(0, 59):02d}:{rnd.randint(0, 59):02d}."
        f"{rnd.randint(0, 999):03d}Z",
        "type": rnd.choice(("page_view", "click", "add_to_cart", "purchase", "search", "login")),
        "user": {"id": rnd.randint(1, 2_000_000), "country": rnd.choice(("DE", "FR", "US", "BR", "IN", "JP"))},
        "device": {
            "os": rnd.choice(("android", "ios", "windows", "macos")),
            "app": f"{rnd.randint(1, 9)}.{rnd.randint(0, 30)}",
        },
        "items": [],
    }
    words = ("red", "blue", "shoe", "shirt", "lamp", "desk", "phone", "case", "cable", "mug", "book", "pen")
    while len(json.dumps(doc)) < size - 120:
        doc["items"].append(
            {
                "sku": f"SKU-{rnd.randint(0, 99999):05d}",
                "name": " ".join(rnd.choice(words) for _ in range(rnd.randint(2, 5))),
                "qty": rnd.randint(1, 5),
                "price": round(rnd.uniform(1, 500), 2),
            }
        )
    return json.dumps(doc, separators=(",", ":")).encode()


def publish_payloads(args: argparse.Namespace, broker: Broker, name: str, kind: str) -> list[str]:
    """Publish ``--backlog-mb`` of ``kind`` payloads (``json`` events or ``random`` bytes, ``--payload-size``
    each), batched, round-robin over ``--partitions`` topic-partitions; returns the topic-partitions."""
    import pulsar

    rnd = random.Random(26)
    topics = [f"{NAMESPACE}/{name}-partition-{i}" for i in range(args.partitions)]
    client = pulsar.Client(broker.service_url, **QUIET_CLIENT)
    started = time.monotonic()
    total = count = 0
    try:
        producers = [
            client.create_producer(
                t,
                batching_enabled=True,
                batching_max_messages=args.batch_size,
                batching_max_allowed_size_in_bytes=max(128 * 1024, args.batch_size * (args.payload_size + 64)),
                batching_max_publish_delay_ms=10,
                block_if_queue_full=True,
            )
            for t in topics
        ]
        while total < args.backlog_mb * 1e6:
            if kind == "json":
                payload = json_payload(rnd, count, args.payload_size)
            else:
                payload = rnd.randbytes(args.payload_size)
            producers[count % len(producers)].send_async(payload, None)
            total += len(payload)
            count += 1
        for producer in producers:
            producer.flush()
            producer.close()
    finally:
        client.close()
    print(
        f"  published {count:,} {kind} messages ({total / 1e6:,.0f} MB of payload, ~{total // max(count, 1)} B each) "
        f"to {len(topics)} topic-partitions in {time.monotonic() - started:.1f} s"
    )
    return topics


def at_rest(args: argparse.Namespace, spark: Any, broker: Broker, work: Path) -> None:
    """``--encrypt`` and/or ``--compress zstd``: rounds of ``run_once`` over the same backlog, the plain job beside
    each at-rest side (encrypted, compressed, both), alternating so that each ratio is taken under the same load:
    MB/s of each, the ratio to the plain job's (target >= 0.8), stored bytes ÷ payload bytes and Spark-side CPU
    per GB. With ``--compress`` the backlog is published twice: realistic JSON events and incompressible random
    bytes."""
    import base64

    keys = work / "bench-keys.json"
    keys.write_text(json.dumps({"bench": base64.b64encode(os.urandom(32)).decode()}))
    keys.chmod(0o600)
    sides = ["plain"]
    if args.compress:
        sides.append(args.compress)
    if args.encrypt:
        sides.append("encrypted")
    if args.compress and args.encrypt:
        sides.append(f"{args.compress}+encrypted")
    kinds = ["json", "random"] if args.compress else ["backlog"]
    for kind in kinds:
        print(f"{kind} payloads:" if args.compress else "encryption:")
        if kind == "backlog":
            topics = list(publish_backlog(args, broker, "encryption", "bench-offload-encrypt").partitions)
        else:
            topics = publish_payloads(args, broker, f"bench-offload-{kind}", kind)
        figures: dict[str, list[tuple[float, float, float]]] = {side: [] for side in sides}
        for round_no in range(args.repeat):
            for side in sides:
                name = f"rest-{kind}-{side.replace('+', '-')}-{round_no}"
                config = job_config(
                    args,
                    work,
                    name,
                    broker.service_url,
                    topics,
                    encryption_keys=keys if "encrypted" in side else None,
                    compression=args.compress if side.startswith(str(args.compress)) else None,
                )
                with CpuMeter(broker.pid) as meter:
                    run = drain_job(spark, config)
                stored = stored_data_bytes(config)
                cpu = (meter.used.get("jvm", 0.0) + meter.used.get("python workers", 0.0)) / max(
                    run.entry_bytes / 1e9, 1e-9
                )
                figures[side].append((run.entry_bytes / 1e6 / run.wall, stored / max(run.entry_bytes, 1), cpu))
                if args.store == "fs":
                    shutil.rmtree(config.store.root, ignore_errors=True)
            line = ", ".join(f"{side} {figures[side][-1][0]:.1f} MB/s" for side in sides)
            print(f"  round {round_no + 1}: {line}")
        plain_mbs = [v[0] for v in figures["plain"]]
        for side in sides:
            values = figures[side]
            mbs = statistics.median(v[0] for v in values)
            ratios = [v[0] / p for v, p in zip(values, plain_mbs, strict=True)]
            versus = "" if side == "plain" else f", ÷ plain {statistics.median(ratios):.2f} (target >= 0.8)"
            stored_ratio = statistics.median(v[1] for v in values)
            cpu = statistics.median(v[2] for v in values)
            print(
                f"  {side:16s}: job {mbs:7.1f} MB/s{versus}; stored bytes ÷ payload bytes {stored_ratio:.4f}; "
                f"Spark CPU {cpu:.1f} s/GB (median of {len(values)} round(s))"
            )


def stored_data_bytes(config: Config) -> int:
    """Bytes of the data and index objects (and their sidecars) in the job's store: everything but ``_meta``."""
    store = config.store.location.open().store
    return sum(info.size for info in store.list("") if "/_" not in info.key and not info.key.startswith("_"))


# --- memory on the default configuration -----------------------------------------------------------


def memory(args: argparse.Namespace, spark: Any, broker: Broker, work: Path) -> None:
    from streamoffload.streaming.source.admission import buffer_bound, buffer_file_path, write_buffer_file
    from streamoffload.streaming.source.source_options import SourceOptions

    summary = publish_backlog(args, broker, "memory", "bench-offload-memory")
    topics = list(summary.partitions)
    config = job_config(args, work, "memory", broker.service_url, topics)
    job = OffloadJob(config)
    buffered_peak = 0

    def on_batch(report: BatchReport) -> None:  # what the job's foreachBatch does with its stats
        nonlocal buffered_peak
        assert job.run is not None
        write_buffer_file(
            buffer_file_path(job._versions_file(), job.run.epoch),
            job.last_topic_stats,
            config.store.location.min_part_size,
        )
        for stats in report.stats.topics.values():
            buffered_peak = max(buffered_peak, stats.buffered_bytes)

    job.listeners.append(on_batch)
    reports: list[BatchReport] = []
    job.listeners.append(reports.append)
    starts: list[Any] = []
    start_query = job.start

    def keep_query(*a: Any, **kw: Any) -> Any:
        starts.append(start_query(*a, **kw))
        return starts[-1]

    job.start = keep_query  # type: ignore[method-assign]
    jvm_heap_pools(spark, reset=True)
    with RssSampler(broker.pid) as rss, CpuMeter(broker.pid) as meter:
        started = time.monotonic()
        job.run_once(spark)
        wall = time.monotonic() - started
    heap = jvm_heap_pools(spark)
    meta = MetadataStore(config.store.location.open())
    entries = sum(m.entries for t in topics for m in meta.manifests(t) if m.status == mf.OFFLOADED)
    entry_bytes = sum(m.entryBytes for t in topics for m in meta.manifests(t) if m.status == mf.OFFLOADED)
    behind = {
        t: offloaded_through(meta, t)
        for t, pos in _last_positions(summary).items()
        if (offloaded_through(meta, t) or (-1, -1)) < pos
    }
    if behind:
        raise RuntimeError(f"run_once left entries unoffloaded: offloaded through {behind}")
    progress = [p for q in starts for p in q.recentProgress if p["numInputRows"] > 0]
    rows = [p["numInputRows"] for p in progress]
    entry_size = entry_bytes / max(entries, 1)
    pulsar = config.pulsar
    policy = config.policy_for(topics[0])
    options = SourceOptions.parse({"serviceUrl": pulsar.service_url, "topics": topics[0]})
    bound = buffer_bound(policy, config.store.location.min_part_size)
    driver_memory = spark.sparkContext.getConf().get("spark.driver.memory", "1g")
    mib = 1 << 20
    per_trigger = pulsar.max_bytes_per_trigger
    per_trigger_text = "none" if per_trigger is None else f"{per_trigger / mib:g} MiB"  # None: no byte limit
    print(
        f"  offloaded {entries:,} entries (everything published), "
        f"{entry_bytes / 1e6:,.0f} MB in {wall:.1f} s ({entry_bytes / 1e6 / wall:.1f} MB/s), "
        f"{len(progress)} micro-batches with data"
    )
    print(
        f"  configured: spark.driver.memory {driver_memory} (JVM heap max {_heap_max(heap) / mib:,.0f} MiB), "
        f"max_bytes_per_trigger {per_trigger_text}, arrowBatchBytes "
        f"{options.arrow_batch_bytes / mib:g} MiB, block {policy.block_size / mib:g} MiB, segment "
        f"{policy.max_segment_bytes / mib:g} MiB, offload buffer bound {bound / mib:g} MiB per topic-partition "
        f"(offloadBufferMaxBytes {policy.offloadBufferMaxBytes / mib:g} MiB), {len(topics)} topic-partitions"
    )
    if rows:
        print(
            f"  largest micro-batch {max(rows):,} entries = ~{max(rows) * entry_size / mib:,.1f} MiB "
            f"(entries of ~{entry_size / 1024:,.0f} KiB); largest offload buffer after a batch "
            f"{buffered_peak / mib:,.1f} MiB"
        )
    print(
        "  peak RSS: "
        + ", ".join(f"{name} {value / mib:,.0f} MiB" for name, value in rss.peaks.items())
        + "; largest single Python worker by kind: "
        + ", ".join(f"{kind} {value / mib:,.0f} MiB" for kind, value in sorted(rss.largest_workers().items()))
    )
    print(
        "  JVM heap peak used by pool: "
        + ", ".join(f"{name} {used / mib:,.0f} MiB" for name, (used, _max) in sorted(heap.items()))
    )
    print(f"  {meter.render(wall)}")


def _heap_max(heap: dict[str, tuple[int, int]]) -> int:
    return sum(m for _used, m in heap.values() if m > 0)


# --- lag ------------------------------------------------------------------------------------------------


def lag(args: argparse.Namespace, spark: Any, broker: Broker, work: Path, name: str = "lag") -> dict[str, float]:
    """The lag phase (see the module docstring); returns its figures for ``--compare``. ``name`` keeps
    repeated phases apart: their own topics, store and checkpoint."""
    base = f"{NAMESPACE}/bench-offload-{name}"
    topics = [f"{base}-partition-{i}" for i in range(args.partitions)]
    config = job_config(args, work, name, broker.service_url, topics, args.rollover_seconds)
    scoped = config.store.location.open()
    store = scoped.store
    meta = MetadataStore(scoped)
    job = OffloadJob(config)
    reports: list[BatchReport] = []
    job.listeners.append(reports.append)
    failure: list[BaseException] = []

    def run() -> None:
        try:
            job.run_forever(spark)
        except BaseException as err:  # reported by the main thread
            failure.append(err)

    thread = threading.Thread(target=run, name="offload-job", daemon=True)
    thread.start()
    try:
        # Warm-up: a little traffic, offloaded by time, so the query, its tasks and readers are running.
        warm = produce(
            broker.service_url,
            base,
            100,
            args.payload_size,
            partitions=args.partitions,
            batch_size=args.batch_size,
            client_options=QUIET_CLIENT,
        )
        wait_offloaded(meta, _last_positions(warm), args.rollover_seconds * 4 + 120)
        steady_from_ms = int(time.time() * 1000)
        with (
            CpuMeter(broker.pid) as meter,
            JvmThreadCensus(broker_pid=broker.pid) as threads,
            ProcessCensus() as census,
        ):
            started = time.monotonic()
            summary = produce(
                broker.service_url,
                base,
                None,
                args.payload_size,
                partitions=args.partitions,
                duration=args.lag_seconds,
                rate=args.rate,
                batching=True,
                batch_size=args.batch_size,
                client_options=QUIET_CLIENT,
            )
            wait_offloaded(meta, _last_positions(summary), args.rollover_seconds * 4 + 120)
            wall = time.monotonic() - started
        if failure:
            raise RuntimeError(f"the offload job failed: {failure[0]}")
        # The micro-batches of the steady phase (progress timestamps are UTC ISO strings, sortable).
        since = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(steady_from_ms / 1000))
        steady = [p for p in job.query.recentProgress if p["timestamp"] >= since]
        batch_seconds = [p["durationMs"].get("triggerExecution", 0) / 1000 for p in steady]
        parts = {
            name: [p["durationMs"].get(key, 0) / 1000 for p in steady]
            for name, key in (("addBatch", "addBatch"), ("planning", "queryPlanning"), ("offset log", "walCommit"))
        }
        parts["state commit"] = [sum(op.get("commitTimeMs", 0) for op in p["stateOperators"]) / 1000 for p in steady]
        parts["segmenter task s"] = [
            sum(op.get("allUpdatesTimeMs", 0) for op in p["stateOperators"]) / 1000 for p in steady
        ]
        # Spark runs a query's jobs in a job group named by its run id (the status tracker keeps the last 1000).
        all_batches = len(job.query.recentProgress)
        jobs = len(spark.sparkContext.statusTracker().getJobIdsForGroup(str(job.query.runId)))
    finally:
        job.stop()
        thread.join(120)

    lags: list[float] = []
    seal_lags: list[float] = []
    counted: set[str] = set()
    for topic in topics:
        for manifest, readable, message in readable_messages(store, meta, topic):
            if message.publish_time < steady_from_ms:
                continue  # the warm-up traffic
            lags.append(readable - message.publish_time / 1000)
            seal_lags.append((manifest.offloadedTimestamp - message.publish_time) / 1000)
            counted.add(manifest.dataKey)
    segments = len(counted)
    if len(lags) != summary.messages:
        raise RuntimeError(f"read back {len(lags)} messages of the steady phase, {summary.messages} were published")
    rollover = args.rollover_seconds
    p50, p99 = percentile(lags, 0.50), percentile(lags, 0.99)
    print(
        f"lag: {summary.messages:,} messages at {summary.rate:,.0f} msg/s for {args.lag_seconds:g} s over "
        f"{len(topics)} topic-partitions, {segments} segments; rollover {rollover:g} s, trigger {args.trigger_interval}"
    )
    print(
        f"  publish-to-readable  p50 {p50:6.2f} s (ratio {p50 / rollover:.2f} of rollover)   "
        f"p99 {p99:6.2f} s (ratio {p99 / rollover:.2f})   max {max(lags):.2f} s   mean {statistics.fmean(lags):.2f} s"
    )
    print(
        f"  publish-to-seal      p50 {percentile(seal_lags, 0.5):6.2f} s   p99 {percentile(seal_lags, 0.99):6.2f} s"
        f"   (the segmenter's seal decision; readable = seal + the sink's complete/index/manifest writes)"
    )
    print(f"  policy alone would give p50 ~{rollover / 2:g} s, p99 ~{rollover * 0.99:g} s (uniform over the rollover)")
    print(f"  {meter.render(wall)}")
    print(f"  the JVM's CPU s by thread: {threads.render()}")
    print(f"  the Python processes Spark ran (by kind; sampled, a floor): {census.render()}")
    print(f"  {fetched(reports)}")
    figures = {"lag p50": p50, "lag p99": p99}
    if batch_seconds:
        figures["micro-batch p50"] = percentile(batch_seconds, 0.5)
        figures.update({name: percentile(values, 0.5) for name, values in parts.items()})
        batch_p50 = percentile(batch_seconds, 0.5)
        print(
            f"  micro-batches: {len(batch_seconds)} in {wall:.0f} s, each p50 {batch_p50:.2f} s, max "
            f"{max(batch_seconds):.2f} s (the trigger asks for one every {args.trigger_interval}); p50 of its parts: "
            + ", ".join(f"{name} {percentile(values, 0.5):.2f} s" for name, values in parts.items())
        )
        print(
            f"  Spark jobs per micro-batch: {jobs / max(all_batches, 1):.2f} ({jobs} jobs, {all_batches} "
            f"micro-batches); peak state bytes per topic-partition {peak_state_bytes(reports):,} "
            f"(bound: less than one minimum part, {config.store.location.min_part_size:,})"
        )
        added = p50 - rollover / 2
        mb_per_batch = summary.bytes / 1e6 / len(batch_seconds)
        print(
            f"  what limits it: beyond the rollover wait the job adds ~{added:.1f} s at p50, about "
            f"{added / batch_p50:.1f} micro-batches of {batch_p50:.2f} s (read in one, sealed by the timer in a "
            f"later one, made readable by the sink at the end of that one); a micro-batch carries only "
            f"~{mb_per_batch:.1f} MB, so its duration is mostly per-batch cost, not traffic"
        )
    return figures


def compare_lag(args: argparse.Namespace, spark: Any, broker: Broker, work: Path) -> None:
    """``--compare``: the lag phase ``--rounds`` times on each side, alternating in this one session: A
    with the job's settings, B with the ``--compare`` settings on top of them (the job sets
    ``STATE_STORE_CONF`` on the session when a query starts, so B replaces those entries there)."""
    import streamoffload.streaming.job.queries as job_module

    job_settings = dict(job_module.STATE_STORE_CONF)
    overrides = dict(_key_values(args.compare))
    results: dict[str, list[dict[str, float]]] = {"A": [], "B": []}
    try:
        for round_no in range(1, args.rounds + 1):
            for side in ("A", "B"):
                job_module.STATE_STORE_CONF = job_settings if side == "A" else {**job_settings, **overrides}
                for key in overrides:  # a key the job does not set goes back to the session's value on A
                    if side == "A" and key not in job_settings:
                        spark.conf.unset(key)
                print(f"--- round {round_no}, side {side} (load average {os.getloadavg()[0]:.2f})")
                results[side].append(lag(args, spark, broker, work, f"lag-{round_no}{side.lower()}"))
    finally:
        job_module.STATE_STORE_CONF = job_settings
    print(f"compare: A = the job's settings; B = A with {', '.join(args.compare)}; median of {args.rounds} rounds")
    for key in results["A"][0]:
        a = statistics.median(r[key] for r in results["A"])
        b = statistics.median(r[key] for r in results["B"])
        print(f"  {key:18} A {a:6.2f} s   B {b:6.2f} s   B/A {b / a if a else float('nan'):.2f}")


def _key_values(items: list[str]) -> list[tuple[str, str]]:
    out = []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"expected KEY=VALUE, got {item!r}")
        out.append((key.strip(), value.strip()))
    return out


def _last_positions(summary: Any) -> dict[str, tuple[int, int]]:
    out = {}
    for name, part in summary.partitions.items():
        if part.last_message_id is not None:
            out[name] = (part.last_message_id[0], part.last_message_id[1])
    return out


# --- main -----------------------------------------------------------------------------------------------


def warm_up(args: argparse.Namespace, spark: Any, broker: Broker, work: Path) -> None:
    """The first queries of a session pay JVM warm-up, Python worker start and imports: spend that here."""
    topics = list(
        produce(
            broker.service_url,
            f"{NAMESPACE}/bench-offload-warmup",
            400,
            args.payload_size,
            partitions=2,
            batch_size=args.batch_size,
            client_options=QUIET_CLIENT,
        ).partitions
    )
    config = job_config(args, work, "warmup", broker.service_url, topics)
    started = time.monotonic()
    drain_source(spark, OffloadJob(config), work / "checkpoint-warmup-source")
    drain_job(spark, config)
    print(f"warm-up (source and job on a small topic): {time.monotonic() - started:.1f} s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backlog-mb", type=float, default=500, help="backlog of payload, MB (default 500)")
    parser.add_argument("--payload-size", type=int, default=4096, help="bytes per message (default 4096)")
    parser.add_argument("--batch-size", type=int, default=32, help="messages per batched entry (default 32)")
    parser.add_argument("--partitions", type=int, default=4, help="topic-partitions (default 4)")
    parser.add_argument("--segment-mb", type=float, default=64, help="maxSizePerOffloadSegmentMbytes (default 64)")
    parser.add_argument(
        "--block-size", type=int, default=4 * MIB, help="managedLedgerOffloadMaxBlockSizeInBytes (default 4 MiB)"
    )
    parser.add_argument(
        "--max-bytes-per-trigger",
        type=int,
        default=DEFAULT_MAX_BYTES_PER_TRIGGER,
        help="the source's admission control per micro-batch, both sides (default and 0: the job's, 1 GiB)",
    )
    parser.add_argument(
        "--repeat", type=int, default=1, help="throughput rounds (source, job, plain drain alternating); medians"
    )
    parser.add_argument("--rate", type=float, default=500, help="steady publish rate for the lag, msg/s (default 500)")
    parser.add_argument("--lag-seconds", type=float, default=60, help="how long to publish for the lag (default 60)")
    parser.add_argument(
        "--rollover-seconds", type=float, default=5, help="maxOffloadSegmentRolloverTimeSeconds (default 5)"
    )
    parser.add_argument("--trigger-interval", default="1 second", help="the job's trigger (default '1 second')")
    parser.add_argument("--work-dir", help="parent of the temporary work directory (default: the system's)")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    add_broker_argument(parser)
    parser.add_argument(
        "--conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Spark setting for the session, on top of the job's (repeatable): to compare settings run by run",
    )
    parser.add_argument(
        "--compare",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="lag phase only: alternate --rounds runs with the job's settings (A) and with these on top (B)",
    )
    parser.add_argument("--rounds", type=int, default=3, help="with --compare: lag phases per side (default 3)")
    parser.add_argument(
        "--store",
        choices=("fs", "s3"),
        default="fs",
        help="the job's store: fs (default) or s3, a local moto_server (throughput only: the lag is read from "
        "the manifests' file times on the filesystem store), with each round's jobs compared to a raw aiobotocore "
        "multipart upload of the same bytes on the same server (S3 on par, above)",
    )
    parser.add_argument(
        "--encrypt",
        action="store_true",
        help="only: run_once plain and encrypted at rest (AES-256-GCM) over the same backlog, alternating "
        "(--repeat rounds): MB/s ratio and stored ÷ payload bytes",
    )
    parser.add_argument(
        "--compress",
        choices=("zstd",),
        help="only: run_once plain and compressed at rest (with --encrypt also encrypted, and both) over a JSON "
        "backlog and an incompressible one, alternating (--repeat rounds): MB/s ratios and stored ÷ payload bytes",
    )
    parser.add_argument(
        "--overlap",
        choices=("both", "on", "off"),
        default="both",
        help="throughput: run_once with spark.overlap_writes on, off, or both side by side (default both)",
    )
    parser.add_argument(
        "--plain-drains",
        type=int,
        default=PLAIN_DRAINS,
        help=f"throughput: plain pulsar-client drains of the fresh broker for the reference (default {PLAIN_DRAINS})",
    )
    parser.add_argument("--skip-throughput", action="store_true")
    parser.add_argument("--skip-lag", action="store_true")
    parser.add_argument(
        "--defaults",
        action="store_true",
        help="memory on the default configuration only: run_once over the backlog, peak RSS per process",
    )
    args = parser.parse_args(argv)
    if args.store == "s3":
        if args.defaults or args.compare:
            parser.error("--store s3 measures throughput only: not with --defaults or --compare")
        args.skip_lag = True
        moto_credentials()  # before Spark starts, so that its Python processes inherit them
    extra_conf = {"spark.ui.showConsoleProgress": "false", "spark.sql.streaming.numRecentProgressUpdates": "1000"}
    extra_conf.update(_key_values(args.conf))

    # On SIGTERM, unwind through the finally blocks below: they stop the broker and Spark and remove the work dir.
    signal.signal(signal.SIGTERM, lambda _signum, _frame: sys.exit(143))
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    if args.work_dir:
        os.makedirs(args.work_dir, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="bench-offload-", dir=args.work_dir))
    sizes = (
        "the default configuration"
        if args.defaults
        else f"segments {args.segment_mb:g} MiB, blocks {args.block_size:,} B, maxBytesPerTrigger "
        f"{args.max_bytes_per_trigger:,}"
    )
    print(
        f"offload bench: Python {sys.version.split()[0]}, {os.cpu_count()} CPUs, local[2], {args.broker}, "
        f"{'S3 (moto_server)' if args.store == 's3' else 'filesystem'} store; {args.payload_size} B messages "
        f"batched by {args.batch_size}, {args.partitions} topic-partitions, "
        f"{sizes}; work dir {work}" + "".join(f"; --conf {item}" for item in args.conf) + f"; {load_average()}"
    )
    log_beside(work)
    from streamoffload.streaming.job.session import build_session

    spark = build_session(
        master="local[2]",
        app_name="bench-offload",
        work_dir=str(work / "spark"),
        extra_conf=extra_conf,
    )
    try:
        with _s3_endpoint(args, work), bench_broker(args.broker, work / "broker") as broker:
            print(f"broker: {broker_name(broker)}")
            warm_up(args, spark, broker, work)
            if args.encrypt or args.compress:
                at_rest(args, spark, broker, work)
            elif args.compare:
                compare_lag(args, spark, broker, work)
            elif args.defaults:
                memory(args, spark, broker, work)
            else:
                if not args.skip_throughput:
                    throughput(args, spark, broker, work)
                if not args.skip_lag:
                    lag(args, spark, broker, work)
    finally:
        spark.stop()
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
