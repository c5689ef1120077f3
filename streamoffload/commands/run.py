"""``streamoffload run``: the continuously running offload job."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import re
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from streamoffload.cli_common import add_job_args, config_from_args
from streamoffload.config import Config
from streamoffload.printable import printable
from streamoffload.progress import Progress
from streamoffload.redaction import redact, secret_name
from streamoffload.streaming.runtime.progress_files import WrittenSpan, read_spans, written
from streamoffload.streaming.source.backlog import BacklogCount

if TYPE_CHECKING:
    from rich.progress import TaskID

    from streamoffload.streaming.job.offload_job import OffloadJob
    from streamoffload.streaming.job.report import BatchReport
    from streamoffload.streaming.job.supervision import BrokerLatest

T = TypeVar("T")
log = logging.getLogger(__name__)

EPILOG = """\
examples:
  streamoffload run --conf conf/streamoffload.toml
  streamoffload run --service-url pulsar://127.0.0.1:6650 --topics orders,payments \\
      --store file:///var/lib/streamoffload/store --checkpoint /var/lib/streamoffload/checkpoint
  streamoffload run --conf prod.toml --once     # drain, seal every open segment, exit
  streamoffload run --conf prod.toml --spark-conf spark.sql.shuffle.partitions=8

On a cluster (standalone, YARN, Kubernetes), submit the same job with spark-submit: README.md "Running on a
cluster" says how the virtualenv and the configuration reach the executors, and what the job sets on each
kind of master.
"""


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "run",
        help="run the offload job (continuously, or --once)",
        description="Tail Pulsar topics and offload them continuously into PIP-76 offload segments in the "
        "object store. Policy changes in the configuration file are picked up without a restart.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_job_args(parser)
    parser.add_argument(
        "--once",
        action="store_true",
        help="process everything available now, seal all open segments, and exit",
    )
    parser.add_argument(
        "--take-over",
        action="store_true",
        help="take the store prefix's writer lease even while another instance holds it (when you know that "
        "instance is gone and do not want to wait for its lease to expire); the other instance is fenced",
    )
    parser.add_argument(
        "--metrics-address",
        metavar="HOST:PORT",
        help="serve Prometheus metrics here (default: [metrics] address, 127.0.0.1:9464; '' disables)",
    )
    parser.add_argument(
        "--spark-conf",
        action="append",
        type=spark_setting,
        default=[],
        metavar="KEY=VALUE",
        help="a Spark setting (repeatable), over the file's [spark.conf] and the job's defaults",
    )
    parser.set_defaults(func=run)


def spark_setting(text: str) -> tuple[str, str]:
    """One ``--spark-conf KEY=VALUE``; argparse refuses anything else in one line naming the option."""
    key, sep, value = text.partition("=")
    # A malformed argument's text is shown unless a word of it names a secret (its value may be in there).
    shown = (
        "its text not shown: it names a secret"
        if any(map(secret_name, re.split(r"[^\w.-]+", text)))
        else repr(redact(text))
    )
    if not sep:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {shown}")
    if not key.strip():
        raise argparse.ArgumentTypeError(f"empty key in {shown}")
    return key.strip(), value


def spark_conf(config: Config, cli: Iterable[tuple[str, str]]) -> dict[str, str]:
    """The user's Spark settings: ``--spark-conf`` over ``[spark.conf]`` (the job's defaults give way to both)."""
    return {**config.spark.conf, **dict(cli)}


def check_store_capabilities(config: Config) -> None:
    """Refuse, before Spark starts, a store that lacks what the job relies on (``StoreCapabilityError``, one
    line naming it); note on stderr what only ``cleanup`` misses."""
    from streamoffload.storage.probe import check_store

    scoped = config.store.location.open()
    with scoped.store:
        report = check_store(scoped)
    if not report.stray_upload_listing:
        print(
            f"note: {report.url} cannot list unfinished multipart uploads (ListMultipartUploads); the job does not "
            "need it, but 'streamoffload cleanup' cannot find stray uploads there",
            file=sys.stderr,
        )


STARTUP_RETRY_S = 600.0
"""How long the continuous job retries a store it cannot write at start-up before it gives up."""


def retry_store_at_start(step: Callable[[], T], *, once: bool, what: str) -> T:
    """Run ``step``; the continuous job rides out a store it cannot write while it starts (a full disk, S3
    answering 5xx or resetting connections): one line per attempt naming the cause, backoff from 5 s doubling
    to 60 s, for up to ``STARTUP_RETRY_S``. ``--once`` (a scheduled batch), a store that lacks a capability
    (``StoreCapabilityError``) and a second instance's lease fail at once."""
    from streamoffload.storage.base import StorageError
    from streamoffload.storage.probe import StoreCapabilityError

    delay, deadline = 5.0, time.monotonic() + STARTUP_RETRY_S
    while True:
        try:
            return step()
        except StoreCapabilityError:
            raise
        except StorageError as err:
            if once or time.monotonic() + delay > deadline:
                raise
            print(f"warning: {what}: {err}; retrying in {delay:.0f} s", file=sys.stderr, flush=True)
            time.sleep(delay)
            delay = min(delay * 2, 60.0)


def run(args: argparse.Namespace) -> int:
    from streamoffload.streaming.job.offload_job import OffloadJob
    from streamoffload.streaming.job.session import build_session, stop_session
    from streamoffload.streaming.runtime.faults import arm_for_this_job

    arm_for_this_job()  # crash-safety tests only: a no-op unless STREAMOFFLOAD_CRASH_AT is set
    config, path = config_from_args(args)
    retry_store_at_start(lambda: check_store_capabilities(config), once=args.once, what="cannot check the store")
    job = OffloadJob(config, path)
    job.force_lease = args.take_over
    # The writer lease before Spark: a second instance is told at once who writes the store prefix.
    from streamoffload.checkpoints.lease import LeaseHeldError

    try:
        retry_store_at_start(job.begin_run, once=args.once, what="cannot start a run")
    except LeaseHeldError as err:
        # The way out the lease itself cannot name: this command's option (README "Operating").
        raise LeaseHeldError(f"{err} If it is gone, `run --take-over` takes the lease now.") from err
    latest = job.broker_latest() if args.once else None  # asked once: the fast path and the progress read it
    if args.once and job.nothing_new(latest):
        # No Spark session for nothing: a scheduled `run --once` over quiet topics takes seconds, not half a
        # minute. Retention still runs, as at the end of any run.
        try:
            job.retention_runner().run_pass()
            job.sync_tables()
        finally:
            job.end_run()
        print(
            f"nothing new to offload: {config.store.location.describe()} holds every topic-partition up to its"
            " latest entry",
            file=sys.stderr,
        )
        return 0
    spark = build_session(
        master=config.spark.master,
        extra_conf=spark_conf(config, args.spark_conf),
        class_archive=config.spark.class_archive,
    )
    metrics = None
    try:
        address = config.metrics.address if args.metrics_address is None else args.metrics_address
        if address:
            from streamoffload.metrics.install import install_metrics

            try:
                metrics = install_metrics(job, spark, address)
                print(f"Prometheus metrics on {metrics.url}", file=sys.stderr)
            except OSError as err:  # a taken port must not stop the offloading itself
                print(
                    f"warning: cannot serve metrics on {address} ({err.strerror or err}); running without them. "
                    'Set [metrics] address or --metrics-address ("" disables).',
                    file=sys.stderr,
                )
        if args.once:
            with Progress("all topic-partitions", total=None, unit="entries") as progress:
                if not progress.shown:
                    job.run_once(spark)
                else:
                    job.progress_dir = job.progress_files_dir()
                    remove_progress_dirs(job.progress_dir)
                    try:
                        spool = job.source_options().get("spoolDir")
                        with OnceProgress(progress, {}, job.progress_dir, spool) as once:
                            # Counted while the query starts: probing ledgers' ends must not hold the job up.
                            counting = threading.Thread(
                                target=lambda: once.set_backlog(backlog_at_start(job, latest)),
                                name="run-once-backlog",
                                daemon=True,
                            )
                            counting.start()
                            job.listeners.append(once)
                            job.run_once(spark)
                            counting.join(timeout=5.0)
                    finally:
                        remove_progress_dirs(job.progress_dir)
            print(f"offloaded everything available into {config.store.location.describe()}", file=sys.stderr)
            return 0

        def stop(signum: int, _frame: Any) -> None:
            print(f"received signal {signum}: stopping after the current micro-batch", file=sys.stderr)
            job.stop()

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        job.run_forever(spark)
        return 0
    finally:
        if metrics is not None:
            metrics.stop()
        stop_session(spark, on_write=_writing_class_archive)


def _writing_class_archive(path: Path) -> None:
    print(
        f"keeping the JVM's classes for the next runs' start-up (once, some seconds): {path} "
        '([spark] classArchive = "" turns this off)',
        file=sys.stderr,
    )


BACKLOG_COUNT_S = 60.0
"""How long ``run --once`` counts the backlog at most: the topic-partitions left then have no total."""


def backlog_at_start(
    job: OffloadJob, latest: BrokerLatest | None, *, deadline_s: float = BACKLOG_COUNT_S
) -> dict[str, BacklogCount | None]:
    """What each topic-partition holds beyond what the store has, by the broker's latest positions (``latest``,
    from ``JobSupervision.broker_latest``; ``None``: no answer, so no totals): its entries
    exactly (across ledgers: ``count_backlog`` probes each ledger's end) and about their bytes (8 entries sampled
    each, 1 beyond 16 topic-partitions); from the broker's first entry for a topic-partition the store has nothing
    of (``starting_offsets = "earliest"``), ``None`` (unknown) under any other starting offset, when a probe fails
    and past ``deadline_s``. Progress only: any failure answers ``{}`` (the bars then count without totals)."""
    from streamoffload.pulsar import client_reader
    from streamoffload.pulsar import raw_reader as rr
    from streamoffload.pulsar.exactly_once import BEFORE_EARLIEST, Probe
    from streamoffload.streaming.source.backlog import count_backlog
    from streamoffload.streaming.source.offset_planner import SourcePlanner
    from streamoffload.streaming.source.source_options import SourceOptions

    run = job.run
    if run is None or latest is None:
        return {}
    from_earliest = job.config.pulsar.starting_offsets.strip().lower() == "earliest"
    backlog: dict[str, BacklogCount | None] = {}
    try:
        planner = SourcePlanner(SourceOptions.parse(job.source_options()))
        try:
            partitions = latest.partitions
            settings = planner.options.reader_settings()
            samples = 8 if len(partitions) <= 16 else 1
            deadline = time.monotonic() + deadline_s
            for tp in partitions:
                committed = run.resume.get(tp, (None, 0))[0]
                if time.monotonic() > deadline or (
                    committed is None and not from_earliest and latest.latest.get(tp) is not None
                ):
                    backlog[tp] = None
                    continue
                after = BEFORE_EARLIEST if committed is None else (int(committed[0]), int(committed[1]))

                def probe(at: tuple[int, int], tp: str = tp) -> Probe | None:
                    if planner.options.reader == "raw":
                        return rr.probe_after_raw(planner.raw_client, tp, at, settings=settings)
                    return client_reader.probe_after(planner.client, tp, at, settings=settings)

                backlog[tp] = count_backlog(probe, after, latest.latest.get(tp), samples)
        finally:
            planner.close()
    except Exception:
        log.warning("cannot count the backlog for the progress bars", exc_info=True)
        return {}
    return backlog


def _sum_known(counts: Iterable[BacklogCount | None]) -> BacklogCount | None:
    """The sum of ``counts``, or ``None`` if there are none or one is unknown."""
    values = list(counts)
    known = [v for v in values if v is not None]
    if not values or len(known) != len(values):
        return None
    return BacklogCount(sum(v.entries for v in known), sum(v.bytes for v in known))


POLL_S = 0.25
"""How often ``run --once``'s bars read the sink's progress files again."""


class OnceProgress:
    """``run --once``'s progress: per topic-partition and in all, the entries the sink has written into the store
    (of the backlog found at the start, where known) and their bytes, with the rate; rich's columns add the ETA from
    the entries' rate. Within a micro-batch it reads the sink tasks' progress files (``progress_dir``,
    ``streaming.runtime.progress_files``) every ``POLL_S`` in a thread; at each micro-batch's end (it is the job's
    ``BatchListener``) it keeps the batch's spans and removes its files. Without ``progress_dir`` (executors on
    other machines), it counts what each micro-batch's report says instead, batch by batch."""

    def __init__(
        self,
        progress: Progress,
        backlog: dict[str, BacklogCount | None],
        progress_dir: str | None = None,
        spool_dir: str | None = None,
    ) -> None:
        self.progress = progress
        self.backlog = backlog
        self.progress_dir = progress_dir
        self.spool_dir = spool_dir
        self.tasks: dict[str, TaskID | None] = {}
        self.spans: dict[str, list[WrittenSpan]] = {}
        """The spans of the micro-batches that ended (their files removed)."""
        self.reported: dict[str, tuple[int, int]] = {}
        """Without progress files: the reports' entries and bytes so far."""
        self.started = time.monotonic()
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._poller: threading.Thread | None = None
        for topic in sorted(backlog):
            self._task_of(topic)

    def __enter__(self) -> OnceProgress:
        if self.progress_dir is not None:
            self._poller = threading.Thread(target=self._poll, name="run-once-progress", daemon=True)
            self._poller.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        if self._poller is not None:
            self._poller.join()
        self.refresh(final=True)

    def _poll(self) -> None:
        while not self._done.wait(POLL_S):
            self.refresh()

    def __call__(self, report: BatchReport) -> None:
        with self._lock:
            if self.progress_dir is not None:
                for topic, spans in read_spans(self.progress_dir).items():
                    self.spans.setdefault(topic, []).extend(spans)
                for name in _names_in(self.progress_dir):
                    with contextlib.suppress(OSError):
                        os.unlink(os.path.join(self.progress_dir, name))
            if self.progress_dir is None:  # executors elsewhere: the batch's report, as the segmenter took it in
                for topic, figures in report.stats.topics.items():
                    entries, nbytes = self.reported.get(topic, (0, 0))
                    self.reported[topic] = (entries + figures.batch_entries, nbytes + figures.batch_bytes)
        self.refresh()

    def set_backlog(self, backlog: dict[str, BacklogCount | None]) -> None:
        """The backlog counted at the start (it arrives while the job runs): each topic-partition's total and the
        sum, where known."""
        with self._lock:
            self.backlog = dict(backlog)
        for topic, known in sorted(backlog.items()):
            self.progress.set_total(None if known is None else known.entries, self._task_of(topic))
        total = _sum_known(backlog.values())
        self.progress.set_total(None if total is None else total.entries)
        self.refresh()

    def written(self) -> dict[str, tuple[int, int]]:
        """(entries, bytes) written so far by topic-partition: the ended micro-batches' and the running one's."""
        with self._lock:
            spans = {topic: list(spans) for topic, spans in self.spans.items()}
            if self.progress_dir is not None:
                for topic, more in read_spans(self.progress_dir).items():
                    spans.setdefault(topic, []).extend(more)
            out = dict(self.reported)
        out.update((topic, written(topic_spans)) for topic, topic_spans in spans.items())
        for topic in self.backlog:
            out.setdefault(topic, (0, 0))
        return out

    def spooled(self, topic: str) -> int:
        """About the entry bytes of ``topic`` the source tasks have read and the sink not yet written: what its
        spool files hold (``streaming.handoff.spool``; the sink removes them as it writes), their records'
        headers taken off by the backlog's mean entry size. 0 without a spool."""
        if self.spool_dir is None:
            return 0
        from streamoffload.streaming.handoff.spool import RECORD_HEADER_BYTES, topic_dir

        size = 0
        with contextlib.suppress(OSError):
            for entry in os.scandir(topic_dir(self.spool_dir, topic)):
                with contextlib.suppress(OSError):
                    size += entry.stat().st_size
        known = self.backlog.get(topic)
        mean = known.bytes / known.entries if known is not None and known.entries else 0.0
        return int(size * mean / (mean + RECORD_HEADER_BYTES)) if mean else size

    def refresh(self, *, final: bool = False) -> None:
        """Draw the figures written so far; ``final``: the bytes exactly (the last frame: everything is written).
        Before the end the bytes read ahead of the sink (spooled) are said too: a micro-batch's source stage
        reads all its entries before its sink writes any."""
        elapsed = max(time.monotonic() - self.started, 1e-3)
        figures = self.written()
        read_in_all = 0
        for topic, (entries, nbytes) in sorted(figures.items()):
            read = nbytes + (0 if final else self.spooled(topic))
            read_in_all += read
            note = _bytes_note(nbytes, self.backlog.get(topic), elapsed, exact=final, read=read)
            self.progress.show(entries, self._task_of(topic), note=note)
        entries = sum(e for e, _ in figures.values())
        nbytes = sum(b for _, b in figures.values())
        note = _bytes_note(nbytes, _sum_known(self.backlog.values()), elapsed, exact=final, read=read_in_all)
        self.progress.show(entries, note=note)

    def _task_of(self, topic: str) -> TaskID | None:
        if topic not in self.tasks:
            known = self.backlog.get(topic)
            total = None if known is None else known.entries
            self.tasks[topic] = self.progress.add_task(f"  {printable(topic)}", total, "entries")
        return self.tasks[topic]


def _names_in(directory: str) -> list[str]:
    try:
        return os.listdir(directory)
    except OSError:
        return []


def remove_progress_dirs(current: str | None) -> None:
    """Remove every run's progress files beside this run's (``current``): what a run that died left, and its own."""
    if current is None:
        return
    for stale in Path(current).parent.glob("progress-*"):
        shutil.rmtree(stale, ignore_errors=True)


def _bytes_note(
    nbytes: int, backlog: BacklogCount | None, elapsed_s: float, *, exact: bool = False, read: int = 0
) -> str:
    """The bytes written (of about the backlog's, where known) and the rate since the start, and those ``read``
    (written, and read ahead of the sink) where more; ``exact``: the bytes written, in bytes."""
    rate = f"{nbytes / 1e6 / elapsed_s:.1f} MB/s"
    if exact:
        return f"{nbytes:,} bytes, {rate}"
    of = f" of ~{backlog.bytes / 1e6:.1f}" if backlog is not None and backlog.bytes else ""
    ahead = f" (read {read / 1e6:.1f})" if read > nbytes else ""
    return f"{nbytes / 1e6:.1f}{of} MB{ahead}, {rate}"
