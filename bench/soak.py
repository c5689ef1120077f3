"""Soak: the continuous job for an hour of steady traffic; its resources must stay flat, its lag bounded, and
every message must be in the store exactly once (issue 23).

Run from the repository root:

    .venv/bin/python bench/soak.py                           # 60 min, 2,000 msg/s over 100 topic-partitions
    .venv/bin/python bench/soak.py --minutes 10 --out bench  # a shortened run (bench/soak-10min.csv, .png)
    .venv/bin/python bench/soak.py --minutes 10 --store s3   # S3 on a local moto_server

What it does, in one work directory (a temporary one, removed at the end unless ``--keep`` or a failure):

1. Starts the embedded pulsar-lite broker and the job as ``python -m streamoffload run --conf FILE`` in its own
   process group (bench/chaos_processes.py's ``JobProcess``; rollover ``--rollover-s``, trigger every second,
   segments of at most 1 MB, so the rollover seals them).
2. Once the job's query has started (its checkpoint holds the query's metadata), a producer thread
   (bench/chaos_processes.py's ``Producer``) publishes ``--rate`` messages/s of ``--payload-size`` bytes round
   robin over ``--partitions`` topic-partitions in four groups: ``<base>-batched`` (batching on),
   ``<base>-unbatched``, ``<base>-lz4`` (batched, LZ4) and ``<base>-zstd`` (unbatched, ZSTD). Every payload is
   reproducible (``produce.expected_payload``), so the checker knows what each stored message must be. The
   run's clock starts once every topic-partition has a segment Offloaded (Spark's start-up and first
   micro-batches: printed apart), then ``--minutes`` of traffic follow. Messages published before that are
   checked like the others but left out of the lag figures.
3. Every ``--sample-s`` seconds it samples, from /proc and the store: the resident set of the job's Python
   driver and of the Spark JVM, the proportional set of the JVM's Python workers (summed) and their number,
   open file descriptors and threads (driver + JVM; the workers' fds apart), and the store's objects
   (bench/store_census.py: all of them, those of Offloaded segments, the rest, open multipart uploads). Every
   ``--gc-every-s`` seconds it forces a full collection in the JVM (``jcmd GC.run``) twice, 2 s apart, and reads
   the heap left by the one that left less (``live_heap``): the old generation's live set, and the metaspace.
   The job must run throughout.
4. At ``--minutes`` it stops the producer, waits until every topic-partition's Offloaded segments reach the
   last message the broker acknowledged, stops the job (SIGTERM), and reads every Offloaded segment back with
   the codecs alone (bench/chaos.py's ``check_store``: missing, duplicated, corrupt, out of order). Each
   message's lag is the time its segment's manifest became Offloaded minus its publish time
   (bench/readable.py, as bench/offload.py measures it).

It writes ``soak-<minutes>min.csv`` (the samples; ``lag_p99_s`` is the p99 lag of the messages published in
the sample's window) and ``soak-<minutes>min.png`` (bench/soak_plot.py; skipped with a note without
matplotlib) into ``--out``, and prints a table: per series its mean after the warm-up, min and max as ±% of
the mean, the slope (% per sixth of the run: per 10 minutes of an hour), a verdict (bench/soak_stats.py says
what flat means); lag p50/p99; the exactly-once counts; then one verdict line per criterion:

- resources flat: after the warm-up (the first sixth of the run) each judged series stays within ±10% of its
  mean and its fitted trend rises by at most 10% of it. The store's objects grow with the segments by
  design; what is judged is the objects outside Offloaded segments and the open uploads, which must not grow;
- lag: p99 over every message of the run <= rollover + 2 s;
- exactly once: every acknowledged message in the store once, in order, none corrupt;
- the traffic ran at the rate asked (within 10%, acknowledged by the broker while sampled): a stalled producer
  would make the rest pass vacuously;
- the job ran throughout (did not exit) and converged after the traffic stopped.

The exit status is 1 when a criterion fails, 2 on bad arguments. ``run_soak`` is the same as a function
(tests/bench/test_soak.py runs 2 minutes of it in the suite).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import logging
import os
import shutil
import signal
import sys
import time
import uuid
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

# bench/ sits beside streamoffload's checkout; run from the repository root or imported as bench.soak.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.chaos import TopicCounts, check_store, write_config
from bench.chaos_processes import JobProcess, Producer, job_errors
from bench.harness import (
    add_work_arguments,
    fs_store_section,
    moto_bucket,
    moto_credentials,
    new_work_dir,
    s3_store_section,
    store_toml,
)
from bench.procstats import HeapAfterGc, heap_after_full_gc, job_tree_sample
from bench.readable import percentile, readable_messages, wait_offloaded
from bench.soak_plot import plot_samples
from bench.soak_stats import Series, SeriesStats, render_stats, resource_series, series_stats
from bench.store_census import StoreCensus
from streamoffload.checkpoints.metadata_store import MetadataStore
from streamoffload.config import load_config
from streamoffload.embedded_broker import EmbeddedBroker

NAMESPACE = "persistent://public/default"
# (name, batching, compression): the four kinds of traffic the partitions are dealt into, round robin.
TRAFFIC_KINDS = [("batched", True, None), ("unbatched", False, None), ("lz4", True, "LZ4"), ("zstd", False, "ZSTD")]
SEGMENT_POLICY = (1.0, 65536)  # (MB, block bytes): big enough that the rollover seals every segment
S3_BUCKET = "soak"
PRODUCER_LOGGER = "bench.chaos.pulsar"  # the logger bench/chaos_processes.py gives the pulsar client
MIB = 2**20

Row = dict[str, float | None]
NATIVE_COLUMNS = {
    "Total": "jvm_native_total_mib",
    "Java Heap": "jvm_native_heap_mib",
    "Class": "jvm_native_class_mib",
    "Thread": "jvm_native_thread_mib",
    "Code": "jvm_native_code_mib",
    "GC": "jvm_native_gc_mib",
    "Internal": "jvm_native_internal_mib",
    "Other": "jvm_native_other_mib",
    "Symbol": "jvm_native_symbol_mib",
    "Arena Chunk": "jvm_native_arena_mib",
}
"""Native memory tracking's categories sampled after each forced GC (committed MiB), when the JVM tracks them
(``--java-options -XX:NativeMemoryTracking=summary``). ``jvm_untracked_mib``: the JVM's RSS minus their total,
i.e. what native libraries (RocksDB) and the C allocator hold beyond the JVM's own accounting."""


@dataclass
class SoakReport:
    minutes: float
    rate: float
    partitions: int
    rollover_s: float
    warmup_s: float
    rows: list[Row] = field(default_factory=list)
    stats: list[SeriesStats] = field(default_factory=list)
    lag_p50: float | None = None
    lag_p99: float | None = None
    lag_p99_after_warmup: float | None = None
    lag_max: float | None = None
    startup_messages: int = 0
    """Messages published before the clock started (checked exactly once, left out of the lag figures)."""
    topics: dict[str, TopicCounts] = field(default_factory=dict)
    startup_s: float | None = None
    """From the job's start until every topic-partition had an Offloaded segment (Spark's start-up, the job's
    recovery, its first micro-batches): the run's clock starts then."""
    job_exit: str | None = None
    """The job's exit code and last log line when it ended on its own during the run."""
    converged: bool = False
    producer_error: str | None = None
    """Why the producer thread failed (e.g. its last flush timed out), if it did."""
    publish_failures: int = 0
    """Sends the client gave up on (e.g. timed out while the broker fell behind): not acknowledged, so not
    expected in the store; if the broker kept them they are stored but never acknowledged (not an error)."""
    job_errors: list[str] = field(default_factory=list)
    wall_seconds: float = 0.0
    plot: str = ""

    @property
    def acked_rate(self) -> float | None:
        """Messages/s the broker acknowledged between the first and the last sample: a soak whose traffic
        stalled (the broker fell behind, sends timed out) proves little about the job."""
        if len(self.rows) < 2:
            return None
        first, last = self.rows[0], self.rows[-1]
        seconds = float(last["t_s"] or 0) - float(first["t_s"] or 0)
        return (float(last["acked"] or 0) - float(first["acked"] or 0)) / seconds if seconds > 0 else None

    @property
    def lag_bound(self) -> float:
        return self.rollover_s + 2.0

    def total(self, name: str) -> int:
        return sum(getattr(c, name) for c in self.topics.values())

    def criteria(self) -> dict[str, tuple[bool, str]]:
        judged = [s for s in self.stats if s.series.flat]
        failed = [s.series.label for s in judged if not s.ok]
        bad = {k: self.total(k) for k in ("missing", "duplicated", "corrupt", "out_of_order") if self.total(k)}
        return {
            "resources flat after warm-up": (
                bool(judged) and not failed,
                f"{len(judged) - len(failed)} of {len(judged)} series"
                + (f"; failed: {', '.join(failed)}" if failed else ""),
            ),
            f"lag p99 <= rollover + 2 s = {self.lag_bound:g} s": (
                self.lag_p99 is not None and self.lag_p99 <= self.lag_bound,
                "no messages" if self.lag_p99 is None else f"p99 {self.lag_p99:.2f} s",
            ),
            "every message in the store exactly once": (
                self.total("published") > 0 and not bad,
                f"{self.total('published'):,} acknowledged, {self.total('stored'):,} stored"
                + "".join(f", {k.replace('_', ' ')} {v:,}" for k, v in bad.items()),
            ),
            f"traffic at the rate asked ({self.rate:g} msg/s, within 10%)": (
                self.acked_rate is not None and self.acked_rate >= 0.9 * self.rate and self.producer_error is None,
                "no samples"
                if self.acked_rate is None
                else f"{self.acked_rate:,.0f} msg/s acknowledged while sampled"
                + (f"; {self.publish_failures:,} sends failed" if self.publish_failures else "")
                + (f"; {self.producer_error}" if self.producer_error else ""),
            ),
            "the job ran throughout and converged": (
                self.job_exit is None and self.converged,
                self.job_exit or ("converged" if self.converged else "did not converge"),
            ),
        }

    @property
    def ok(self) -> bool:
        return all(ok for ok, _ in self.criteria().values())

    def render(self) -> str:
        sixth = self.minutes / 6
        unit = "%/10 min" if self.minutes == 60 else f"%/{sixth:.3g} min"
        lines = [
            f"soak: {self.minutes:g} min, {self.rate:g} msg/s over {self.partitions} topic-partitions, rollover "
            f"{self.rollover_s:g} s; judged after a warm-up of {self.warmup_s / 60:.3g} min; start-up (to the "
            f"first offloads) {self.startup_s or 0:.0f} s; wall {self.wall_seconds:.0f} s",
            *render_stats(self.stats, unit),
        ]
        if self.lag_p99 is not None:
            lines.append(
                f"  lag (publish to Offloaded)  p50 {self.lag_p50:.2f} s  p99 {self.lag_p99:.2f} s  max "
                f"{self.lag_max:.2f} s  (p99 after warm-up {self.lag_p99_after_warmup or 0:.2f} s; "
                f"{self.startup_messages:,} messages published during start-up left out)"
            )
        lines.append(
            "  exactly once  "
            + ", ".join(
                f"{name.replace('_', ' ')} {self.total(name):,}"
                for name in ("published", "stored", "missing", "duplicated", "corrupt", "out_of_order")
            )
        )
        if self.publish_failures or self.total("unacknowledged"):
            lines.append(
                f"  sends that failed (not acknowledged) {self.publish_failures:,}; stored but never acknowledged "
                f"{self.total('unacknowledged'):,} (the broker kept some of them)"
            )
        for name, (ok, detail) in self.criteria().items():
            lines.append(f"  {'OK    ' if ok else 'FAILED'}  {name}: {detail}")
        lines.extend(f"  job error: {e}" for e in self.job_errors[:5])
        return "\n".join(lines)


def traffic_topics(base: str, partitions: int) -> tuple[dict[str, bool], dict[str, str]]:
    """The topic-partitions dealt round robin into the kinds of traffic: (batching per topic-partition,
    compression per compressed topic-partition)."""
    batching: dict[str, bool] = {}
    compression: dict[str, str] = {}
    for i in range(partitions):
        name, batched, codec = TRAFFIC_KINDS[i % len(TRAFFIC_KINDS)]
        topic = f"{base}-{name}-partition-{i // len(TRAFFIC_KINDS)}"
        batching[topic] = batched
        if codec is not None:
            compression[topic] = codec
    return batching, compression


@contextlib.contextmanager
def store_settings(store: str, workdir: Path, env: dict[str, str]) -> Iterator[str]:
    """The ``[store]`` table of the job's configuration: a filesystem store under ``workdir``, or a bucket on a
    local moto_server (its credentials go into ``env`` and this process's environment)."""
    if store == "fs":
        yield store_toml(fs_store_section(workdir / "store"))
        return
    with moto_bucket(workdir / "moto.log", S3_BUCKET) as url:
        moto_credentials(env)
        yield store_toml(s3_store_section(url, S3_BUCKET, "offload"))


def run_soak(
    workdir: Path,
    *,
    minutes: float = 60.0,
    rate: float = 2000.0,
    partitions: int = 100,
    rollover_s: float = 5.0,
    sample_s: float = 10.0,
    gc_every_s: float = 60.0,
    warmup_s: float | None = None,
    payload_size: int = 200,
    store: str = "fs",
    service_url: str | None = None,
    startup_timeout: float = 240.0,
    converge_timeout: float = 300.0,
    java_options: str = "",
    log: Callable[[str], None] = print,
) -> SoakReport:
    """Run the soak described in this module's docstring under ``workdir`` and return its report.

    ``service_url``: an already running broker (topics get unique names); by default an embedded pulsar-lite
    broker is started under ``workdir``. ``warmup_s``: by default a sixth of the run. ``java_options``: added to the
    job's JVM options (e.g. ``-XX:NativeMemoryTracking=summary``, which fills the ``jvm_native_*`` columns)."""
    if store not in ("fs", "s3"):
        raise ValueError(f"store must be 'fs' or 's3', got {store!r}")
    workdir.mkdir(parents=True, exist_ok=True)
    report = SoakReport(minutes, rate, partitions, rollover_s, minutes * 10 if warmup_s is None else warmup_s)
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    with contextlib.ExitStack() as stack:
        if service_url is None:
            service_url = stack.enter_context(EmbeddedBroker(workdir / "broker", default_partitions=0)).service_url
        store_toml = stack.enter_context(store_settings(store, workdir, env))
        _run(
            report,
            workdir,
            service_url,
            store_toml,
            env,
            sample_s,
            gc_every_s,
            payload_size,
            startup_timeout,
            converge_timeout,
            java_options,
            log,
        )
    return report


def _run(
    report: SoakReport,
    workdir: Path,
    service_url: str,
    store_toml: str,
    env: dict[str, str],
    sample_s: float,
    gc_every_s: float,
    payload_size: int,
    startup_timeout: float,
    converge_timeout: float,
    java_options: str,
    log: Callable[[str], None],
) -> None:
    started = time.monotonic()
    base = f"{NAMESPACE}/soak-{uuid.uuid4().hex[:8]}"
    batching, compression = traffic_topics(base, report.partitions)
    conf, checkpoint, logs = workdir / "soak.toml", workdir / "checkpoint", workdir / "logs"
    logs.mkdir(exist_ok=True)
    rollover = report.rollover_s
    spark_conf = {"spark.driver.extraJavaOptions": java_options} if java_options else None
    write_config(
        conf,
        service_url,
        list(batching),
        checkpoint,
        store_toml,
        SEGMENT_POLICY,
        rollover_s=rollover,
        spark_conf=spark_conf,
    )
    config = load_config(conf)
    scoped = config.store.location.open()
    object_store = scoped.store
    meta = MetadataStore(scoped)
    census = StoreCensus(scoped)
    log(
        f"soak: {report.minutes:g} min, {report.rate:g} msg/s of {payload_size} B over {report.partitions} "
        f"topic-partitions ({base}-batched/unbatched/lz4/zstd), rollover {report.rollover_s:g} s; work dir {workdir}"
    )
    job = JobProcess(conf, logs / "job.log", env)
    producer: Producer | None = None
    quiet = ProducerLogFile(logs / "producer.log")
    try:
        if not _wait_query_started(job, checkpoint, startup_timeout):
            report.job_exit = f"the query did not start within {startup_timeout:.0f} s: {job.last_line()}"
            return
        log(f"  query started after {time.monotonic() - job.started:.1f} s; publishing")
        producer = Producer(service_url, batching, report.rate, payload_size, compression=compression).start()
        if not _wait_first_offloads(job, census, report.partitions, startup_timeout):
            report.job_exit = f"not every topic-partition offloaded within {startup_timeout:.0f} s: {job.last_line()}"
            return
        report.startup_s = time.monotonic() - job.started
        log(f"  every topic-partition has an Offloaded segment after {report.startup_s:.1f} s: the clock starts")
        traffic_started, traffic_started_wall = time.monotonic(), time.time()
        report.rows = _sample_until(report, job, producer, census, workdir, traffic_started, sample_s, gc_every_s, log)
        try:
            producer.stop()
        except RuntimeError as err:  # e.g. its last flush timed out: what the broker acknowledged is still checked
            report.producer_error = str(err)
            log(f"  {err}")
        log(f"  producer stopped: {producer.acked_total():,} messages acked; waiting for the store to converge")
        last = {t: tr.last_id for t, tr in producer.traffic.items() if tr.last_id is not None}
        if report.job_exit is None:  # a job that ended cannot converge: read back what it wrote
            try:
                wait_offloaded(meta, last, converge_timeout)
                report.converged = True
            except RuntimeError as err:
                log(f"  {err}")
    finally:
        code = job.terminate()
        if report.job_exit is None and code not in (0, None, -signal.SIGTERM):
            log(f"  the job's stop ended with exit {code}")
        if producer is not None:
            with contextlib.suppress(RuntimeError):
                producer.stop()
        quiet.close()
    report.job_errors = job_errors(logs)
    if producer is None:
        return  # nothing was published
    log("  reading the store back")
    report.topics = check_store(object_store, meta, producer, payload_size)
    report.publish_failures = sum(tr.failures for tr in producer.traffic.values())
    _measure_lag(report, meta, list(batching), traffic_started_wall, sample_s)
    _judge(report)
    report.wall_seconds = time.monotonic() - started


class ProducerLogFile:
    """Until closed, the pulsar client's warnings (e.g. send timeouts when the broker falls behind) go to ``path``
    instead of the terminal: they are counted in the report (``publish_failures``)."""

    def __init__(self, path: Path) -> None:
        self.logger = logging.getLogger(PRODUCER_LOGGER)
        self.handler = logging.FileHandler(path)
        self.handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        self.logger.addHandler(self.handler)
        self.logger.propagate = False

    def close(self) -> None:
        self.logger.removeHandler(self.handler)
        self.logger.propagate = True
        self.handler.close()


def _wait_query_started(job: JobProcess, checkpoint: Path, timeout: float) -> bool:
    """Spark writes a query's ``metadata`` file when the query starts (``<checkpoint>/run-<epoch>/``)."""
    deadline = job.started + timeout
    while time.monotonic() < deadline and job.running():
        if any(checkpoint.glob("run-*/metadata")):
            return True
        time.sleep(0.5)
    return False


def _wait_first_offloads(job: JobProcess, census: StoreCensus, partitions: int, timeout: float) -> bool:
    """The job is warm once each topic-partition has a segment Offloaded: its readers, the segmenter's state and
    the sink have run (Spark's first micro-batches, with Python workers starting, take far longer than later
    ones on a loaded machine)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and job.running():
        if census.count().offloaded_topics >= partitions:
            return True
        time.sleep(1.0)
    return False


def _sample_until(
    report: SoakReport,
    job: JobProcess,
    producer: Producer,
    census: StoreCensus,
    workdir: Path,
    started: float,
    sample_s: float,
    gc_every_s: float,
    log: Callable[[str], None],
) -> list[Row]:
    """Sample every ``sample_s`` until ``minutes`` after the traffic ``started`` (or the job ends)."""
    rows: list[Row] = []
    end = started + report.minutes * 60
    next_gc = time.monotonic()
    next_log = time.monotonic() + 60
    tick = time.monotonic()
    while tick < end:
        if not job.running():
            report.job_exit = f"exit {job.proc.returncode} at {tick - started:.0f} s: {job.last_line()}"
            log(f"  the job ended: {report.job_exit}")
            break
        if producer.error is not None:
            log(f"  the producer failed at {tick - started:.0f} s: {producer.error}")
            break
        tree = job_tree_sample(job.proc.pid)
        count = census.count()
        t_s = round(time.monotonic() - started, 1)
        row: Row = {
            "t_s": t_s,
            "acked": producer.acked_total(),
            "driver_rss_mib": tree.driver_rss / MIB,
            "jvm_rss_mib": tree.jvm_rss / MIB if tree.jvm_pid else None,
            "jvm_old_after_gc_mib": None,
            "jvm_metaspace_mib": None,
            "jvm_heap_committed_mib": None,
            **dict.fromkeys(NATIVE_COLUMNS.values()),
            "jvm_untracked_mib": None,
            "workers_pss_mib": tree.workers_pss / MIB,
            "workers": tree.workers,
            "fds": tree.fds,
            "worker_fds": tree.worker_fds,
            "threads": tree.threads,
            "store_objects": count.objects,
            "offloaded_segments": count.offloaded_segments,
            "loose_objects": count.loose_objects,
            "open_uploads": count.open_uploads,
        }
        if tree.jvm_pid is not None and time.monotonic() >= next_gc:
            heap = live_heap(tree.jvm_pid, str(workdir / "jcmd-commands"))
            next_gc = time.monotonic() + gc_every_s
            if heap is not None:
                row["jvm_old_after_gc_mib"] = heap.heap_used / MIB
                row["jvm_metaspace_mib"] = heap.metaspace_used / MIB
                row["jvm_heap_committed_mib"] = heap.heap_committed / MIB
                for category, column in NATIVE_COLUMNS.items():
                    if category in heap.native_committed:
                        row[column] = heap.native_committed[category] / MIB
                if "Total" in heap.native_committed:
                    row["jvm_untracked_mib"] = (tree.jvm_rss - heap.native_committed["Total"]) / MIB
        rows.append(row)
        if time.monotonic() >= next_log:
            next_log += 60
            log(
                f"  {t_s / 60:5.1f} min: {row['acked']:,} acked, {count.offloaded_segments:,} segments, "
                f"JVM RSS {row['jvm_rss_mib'] or 0:.0f} MiB, fds {tree.fds}, threads {tree.threads}"
            )
        tick += sample_s
        time.sleep(max(0.0, tick - time.monotonic()))
    return rows


GC_PAIR_GAP_S = 2.0
"""Seconds between the two forced collections of one old-generation sample (``live_heap``)."""


def live_heap(jvm_pid: int, scratch: str) -> HeapAfterGc | None:
    """The JVM's heap after a full collection, as the smaller of two ``GC_PAIR_GAP_S`` apart. A full GC keeps
    what is reachable at that instant, a micro-batch's rows in flight too (~1 s of every 1-2 s here); a leak
    survives both collections, work in flight rarely does. (Session 36's hour failed its old-generation band on
    one sample of +15%, the next highest being +6%.)"""
    first = heap_after_full_gc(jvm_pid, scratch)
    time.sleep(GC_PAIR_GAP_S)
    second = heap_after_full_gc(jvm_pid, scratch)
    found = [heap for heap in (first, second) if heap is not None]
    return min(found, key=lambda heap: heap.heap_used) if found else None


def _measure_lag(report: SoakReport, meta: MetadataStore, topics: list[str], t0_wall: float, sample_s: float) -> None:
    """Every stored message's lag (bench/readable.py); the p99 of each sample window into the rows."""
    windows: dict[int, array[float]] = {}
    for topic in topics:
        for _manifest, readable, message in readable_messages(meta.store, meta, topic):
            published = message.publish_time / 1000
            windows.setdefault(int((published - t0_wall) // sample_s), array("d")).append(readable - published)
    if not windows:
        return
    # Windows before 0: published while the job started up (before the clock), left out of the figures.
    report.startup_messages = sum(len(w) for k, w in windows.items() if k < 0)
    every = [lag for k, w in windows.items() if k >= 0 for lag in w]
    if not every:
        return
    after = [lag for k, w in windows.items() if k * sample_s >= report.warmup_s for lag in w]
    report.lag_p50, report.lag_p99, report.lag_max = percentile(every, 0.5), percentile(every, 0.99), max(every)
    report.lag_p99_after_warmup = percentile(after, 0.99) if after else None
    for row in report.rows:
        window = windows.get(round(_seconds(row) / sample_s) - 1)
        row["lag_p99_s"] = percentile(list(window), 0.99) if window else None


def _seconds(row: Row) -> float:
    """A sample's time since the traffic started (every row has one)."""
    return float(row["t_s"] or 0.0)


def _judge(report: SoakReport) -> None:
    unit_s = report.minutes * 10  # a sixth of the run, in seconds
    for series in resource_series(report.partitions):
        points = [
            (_seconds(row), float(value))
            for row in report.rows
            if (value := row.get(series.column)) is not None and _seconds(row) >= report.warmup_s
        ]
        stats = series_stats(series, points, unit_s)
        if stats is not None:
            report.stats.append(stats)


def write_outputs(report: SoakReport, out: Path) -> tuple[Path, str]:
    """The samples as CSV and the plot as PNG under ``out``: (CSV path, PNG path or why there is none)."""
    out.mkdir(parents=True, exist_ok=True)
    stem = f"soak-{report.minutes:g}min"
    csv_path = out / f"{stem}.csv"
    columns = list(report.rows[0]) if report.rows else ["t_s"]
    with open(csv_path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        for row in report.rows:
            writer.writerow({k: ("" if v is None else round(v, 3)) for k, v in row.items()})
    title = (
        f"soak: {report.minutes:g} min, {report.rate:g} msg/s, {report.partitions} topic-partitions, rollover "
        f"{report.rollover_s:g} s (warm-up shaded; band ±10% of the mean after it)"
    )
    series: list[Series] = resource_series(report.partitions)
    plot = plot_samples(
        report.rows,
        series,
        {s.series.column: s for s in report.stats},
        warmup_s=report.warmup_s,
        lag_bound_s=report.lag_bound,
        title=title,
        path=out / f"{stem}.png",
    )
    return csv_path, plot


# --- main -----------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="bench/soak.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--minutes", type=float, default=60.0, help="minutes of traffic after the job's start-up (60)")
    parser.add_argument("--rate", type=float, default=2000.0, help="messages/s over all topic-partitions (2000)")
    parser.add_argument("--partitions", type=int, default=100, help="topic-partitions (100)")
    parser.add_argument("--rollover-s", type=float, default=5.0, help="maxOffloadSegmentRolloverTimeSeconds (5)")
    parser.add_argument("--sample-s", type=float, default=10.0, help="seconds between samples (10)")
    parser.add_argument("--gc-every-s", type=float, default=60.0, help="seconds between forced full GCs (60)")
    parser.add_argument("--payload-size", type=int, default=200, help="bytes per message (200)")
    parser.add_argument(
        "--java-options",
        default="",
        help="more options for the job's JVM, e.g. '-XX:NativeMemoryTracking=summary' to sample its native memory "
        "by category after each forced GC (CSV columns jvm_native_*), or '-Xlog:gc:file=gc.log'",
    )
    parser.add_argument("--out", default="soak-out", help="directory for the CSV and the PNG (soak-out)")
    add_work_arguments(parser)
    args = parser.parse_args(argv)
    if args.minutes <= 0 or args.rate <= 0 or args.partitions < 1 or args.sample_s <= 0 or args.rollover_s <= 0:
        parser.error("--minutes, --rate, --sample-s and --rollover-s must be > 0 and --partitions at least 1")
    if args.payload_size < 16:
        parser.error("--payload-size must be at least 16")

    work = new_work_dir(args.work_dir, "bench-soak-")
    print(f"soak bench: Python {sys.version.split()[0]}, {os.cpu_count()} CPUs, store {args.store}", flush=True)
    report: SoakReport | None = None
    try:
        report = run_soak(
            work,
            minutes=args.minutes,
            rate=args.rate,
            partitions=args.partitions,
            rollover_s=args.rollover_s,
            sample_s=args.sample_s,
            gc_every_s=args.gc_every_s,
            payload_size=args.payload_size,
            store=args.store,
            java_options=args.java_options,
            log=lambda line: print(line, flush=True),
        )
        csv_path, plot = write_outputs(report, Path(args.out))
        print(report.render())
        print(f"samples: {csv_path}; plot: {plot}")
    finally:
        if args.keep or report is None or not report.ok:
            print(f"kept {work} (job log in {work / 'logs'})")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
