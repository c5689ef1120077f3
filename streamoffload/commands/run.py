"""``streamoffload run``: the continuously running offload job."""

from __future__ import annotations

import argparse
import signal
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import TYPE_CHECKING, Any, TypeVar

from streamoffload.cli_common import add_job_args, config_from_args
from streamoffload.config import Config
from streamoffload.printable import printable
from streamoffload.progress import Progress, progress_shown

if TYPE_CHECKING:
    from rich.progress import TaskID

    from streamoffload.streaming.job.offload_job import OffloadJob
    from streamoffload.streaming.job.report import BatchReport

T = TypeVar("T")

EPILOG = """\
examples:
  streamoffload run --conf conf/streamoffload.toml
  streamoffload run --service-url pulsar://127.0.0.1:6650 --topics orders,payments \\
      --store file:///var/lib/streamoffload/store --checkpoint /var/lib/streamoffload/checkpoint
  streamoffload run --conf prod.toml --once     # drain, seal every open segment, exit

On a cluster, submit the same job with spark-submit (the package installed on every node; the
master and resources then come from spark-submit, not from [spark] master):
  spark-submit --master yarn $(python -c 'import streamoffload.__main__ as m; print(m.__file__)') \\
      run --conf prod.toml
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
    parser.set_defaults(func=run)


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
    from streamoffload.streaming.job.session import build_session
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
    if args.once and job.nothing_new():
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
    spark = build_session(master=config.spark.master, extra_conf=dict(config.spark.conf))
    # Under spark-submit the master is spark-submit's, not [spark] master's: what the job decides by the master
    # (the spool and the shared rate budget exist only where every task runs on this machine) follows the session.
    master = spark.sparkContext.master
    if master != config.spark.master:
        job.config = config = replace(config, spark=replace(config.spark, master=master))
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
            backlog = backlog_at_start(job) if progress_shown() else {}
            with Progress("all topic-partitions", total=_sum_known(backlog.values()), unit="entries") as progress:
                if progress.shown:
                    job.listeners.append(OnceProgress(progress, backlog))
                job.run_once(spark)
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
        spark.stop()


def backlog_at_start(job: OffloadJob) -> dict[str, int | None]:
    """The entries each topic-partition holds beyond what the store has, by the broker's latest positions: exact
    where the store's last position is in the latest ledger, ``None`` where ledgers in between (or a topic-partition
    the store has nothing of) make the count unknown without asking the broker ledger by ledger. Progress only:
    any failure answers ``{}`` (the bars then count without totals)."""
    from streamoffload.streaming.source.backlog import entries_between
    from streamoffload.streaming.source.offset_planner import SourcePlanner
    from streamoffload.streaming.source.source_options import SourceOptions

    run = job.run
    if run is None:
        return {}
    try:
        planner = SourcePlanner(SourceOptions.parse(job.source_options()))
        try:
            partitions = planner.topic_partitions(force=True)
            latest = planner.latest_positions(partitions)
        finally:
            planner.close()
    except Exception:
        return {}
    backlog: dict[str, int | None] = {}
    for tp in partitions:
        committed = run.resume.get(tp, (None, 0))[0]
        last = latest.get(tp)
        if last is None:
            backlog[tp] = 0  # an empty topic-partition
        elif committed is None:
            backlog[tp] = None
        else:
            entries, exact = entries_between((int(committed[0]), int(committed[1])), last)
            backlog[tp] = entries if exact else None
    return backlog


def _sum_known(counts: Iterable[int | None]) -> int | None:
    """The sum of ``counts``, or ``None`` if there are none or one is unknown."""
    values = list(counts)
    known = [v for v in values if v is not None]
    return sum(known) if values and len(known) == len(values) else None


class OnceProgress:
    """A ``BatchListener`` drawing ``run --once``'s progress: per topic-partition and in all, the entries its
    micro-batches took into segments (of the backlog found at the start, where known) and their bytes, with the
    rate; rich's columns add the ETA from the entries' rate."""

    def __init__(self, progress: Progress, backlog: dict[str, int | None]) -> None:
        self.progress = progress
        self.backlog = backlog
        self.tasks: dict[str, TaskID | None] = {}
        self.bytes: dict[str, int] = {}
        self.started = time.monotonic()

    def __call__(self, report: BatchReport) -> None:
        elapsed = max(time.monotonic() - self.started, 1e-3)
        total_entries = 0
        for topic, figures in sorted(report.stats.topics.items()):
            entries, nbytes = figures.batch_entries, figures.batch_bytes
            if topic not in self.tasks:
                self.tasks[topic] = self.progress.add_task(f"  {printable(topic)}", self.backlog.get(topic), "entries")
            self.bytes[topic] = self.bytes.get(topic, 0) + nbytes
            self.progress.advance(entries, self.tasks[topic], note=_bytes_note(self.bytes[topic], elapsed))
            total_entries += entries
        self.progress.advance(total_entries, note=_bytes_note(sum(self.bytes.values()), elapsed))


def _bytes_note(nbytes: int, elapsed_s: float) -> str:
    return f"{nbytes / 1e6:.1f} MB, {nbytes / 1e6 / elapsed_s:.1f} MB/s"
