"""The ``pulsar-offloaded`` DataFrame reader next to plain reads of the same objects, in the same run.

Run from the repository root:

    .venv/bin/python bench/dataframe.py                   # a 1 GB filesystem store
    .venv/bin/python bench/dataframe.py --store-mb 200    # smaller, on a shared machine
    .venv/bin/python bench/dataframe.py --broker --messages 200000 --partitions 2   # against a broker drain
    .venv/bin/python bench/dataframe.py --direct --store-mb 55 --partitions 1       # the reader alone, ~50,000 msgs

With ``--broker`` it starts the embedded pulsar-lite broker, publishes --messages messages of
--message-bytes bytes (batched by up to --batch, ``streamoffload.produce``) over --partitions
topic-partitions, offloads them with the real job (``OffloadJob.run_once``, as ``bench/offload.py`` runs
it) into a filesystem store, then measures, best of --runs, on those same messages:

- (a) a plain ``pulsar-client`` Reader drain from the broker (``bench/source.py``'s loop: each message id
  counted once, as pulsar-lite duplicates deliveries; re-opened after a --stall-ms stall), the reference;
- (b) ``spark.read.format("pulsar-offloaded")`` ``count()`` and a full scan of ``value`` on local[2], as
  messages/s with the ratio to (a) (the target is >= 3);
- (c) a read-through query over the stored part, once ``read_through_query`` gives one (skipped now);

each with the CPU seconds of the broker, this driver, the Spark JVM and its Python workers.

Without ``--broker``, it builds a synthetic filesystem store of --store-mb MB of entries (--partitions
topic-partitions, batches of --batch messages of --message-bytes bytes, publish times spread evenly over
one day, blocks of --block-mib MiB, segments of --segment-mib MiB) with the real segmenter and sink, then
prints (each figure the best of --runs (2) runs):

- raw: a sequential read of every data object file (``f.read`` of 1 MiB), the reference; it runs first
  once to warm the page cache, so all figures read from memory;
- ``count()`` and a full scan of ``value`` (``sum(length(value))``) through ``spark.read.format(
  "pulsar-offloaded")`` on local[2], as MB/s of data objects, with the ratio to raw;
- the same scan through ``TopicReader`` (one Python process: every entry checked, split into messages);
- a 1% publish-time window (``startingTime``/``endingTime``): bytes read from the store (data, index and
  manifest objects, counted by running the source's planner and reader over a counting view of the
  store) beside the store size, and the Spark query's time and row count (checked equal).

``--direct`` only calls ``OffloadedReader.read`` (what a Spark task runs) directly in this process over
the synthetic store, best of 3: seconds and µs per message, wall and CPU.

The store is written under --work-dir (default /tmp) and deleted afterwards unless --keep.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from streamoffload.storage.location import ScopedStore

# The synthetic store builder is shared with tests/dataframe; run from the repository root.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.logs import log_beside
from bench.synthetic import CountingStore, build_topic
from streamoffload.checkpoints.metadata_store import MetadataStore
from streamoffload.codecs.entry import entry_messages
from streamoffload.read import dataset_plan as ofp
from streamoffload.read import dataset_read as ofr
from streamoffload.read.segment import ChunkCache
from streamoffload.read.topic_reader import TopicReader
from streamoffload.storage.filesystem import FilesystemStore

MIB = 1024 * 1024
DAY_MS = 86_400_000
FIRST_MS = 1_772_323_200_000  # 2026-03-01T00:00:00Z
BASE = "persistent://public/bench/df"


def build(root: Path, args: argparse.Namespace) -> tuple[list[str], int]:
    store = FilesystemStore(str(root))
    per_entry = args.batch * (args.message_bytes + 40) + 60
    entries = max(args.store_mb * 1_000_000 // per_entry // args.partitions, 1)
    topics = [f"{BASE}-partition-{p}" for p in range(args.partitions)]
    written = 0
    for p, topic in enumerate(topics):
        _, n = build_topic(
            ScopedStore(store),
            topic,
            entries=entries,
            batch=args.batch,
            payload_size=args.message_bytes,
            first_publish_ms=FIRST_MS,
            publish_step_ms=max(DAY_MS // entries, 1),
            block_bytes=args.block_mib * MIB,
            segment_bytes=args.segment_mib * MIB,
            keys=100,
            seed=p,
            keep=False,
        )
        written += n
    return topics, written


def data_files(root: Path, store: FilesystemStore, topics: list[str]) -> list[Path]:
    meta = MetadataStore(ScopedStore(store))
    return [root / m.dataKey for t in topics for m in meta.offloaded_segments(t)]


def raw_read(paths: list[Path]) -> int:
    total = 0
    for path in paths:
        with open(path, "rb", buffering=0) as f:
            while chunk := f.read(MIB):
                total += len(chunk)
    return total


def timed(fn: Any, runs: int = 1) -> tuple[float, Any]:
    """Best time of ``runs`` calls, and the result."""
    best = float("inf")
    out = None
    for _ in range(runs):
        start = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - start)
    return best, out


def topic_reader_scan(store: FilesystemStore, topics: list[str]) -> tuple[int, int]:
    messages = value_bytes = 0
    with TopicReader(ScopedStore(store), cache=ChunkCache(64 * MIB)) as reader:
        for topic in topics:
            for entry in reader.read(topic):
                for msg in entry_messages(entry.payload, verify_checksum=False):  # the read checked the CRC
                    messages += 1
                    value_bytes += len(msg.payload)
    return messages, value_bytes


def window_bytes(store: FilesystemStore, topics: list[str], times: ofp.TimeBounds) -> tuple[int, int]:
    """What the source's planner and reader read for ``times``: (bytes read from the store, rows)."""
    counting = CountingStore(store)
    tasks = ofp.plan(ScopedStore(counting), topics, {}, times)  # type: ignore[arg-type]
    rows = 0
    for task in tasks:
        for batch in ofr.read_task(ScopedStore(counting), task, times=times):  # type: ignore[arg-type]
            rows += len(batch[0])
    return counting.bytes_read, rows


def direct_read(root: Path, topics: list[str], runs: int) -> tuple[int, float, float]:
    """``OffloadedReader.read`` called directly in this process (no Spark) over every task of ``topics``:
    (messages, best wall seconds, best CPU seconds)."""
    from pyspark.sql.pandas.types import from_arrow_schema

    from streamoffload.streaming.source.offloaded_source import OffloadedDataSource, OffloadedReader

    source = OffloadedDataSource({"store": f"file://{root}", "topics": ",".join(topics)})
    reader = source.reader(from_arrow_schema(ofr.MESSAGE_ARROW_SCHEMA))
    assert isinstance(reader, OffloadedReader)  # its read() yields Arrow record batches (not rows)
    partitions = reader.partitions()

    def read_all() -> int:
        return sum(batch.num_rows for p in partitions for batch in reader.read(p))

    messages = read_all()  # warm: the page cache, and the first call's gc.freeze
    wall = cpu = float("inf")
    for _ in range(runs):
        started, cpu_started = time.perf_counter(), time.process_time()
        assert read_all() == messages
        wall, cpu = min(wall, time.perf_counter() - started), min(cpu, time.process_time() - cpu_started)
    return messages, wall, cpu


# --- --broker: the same messages through a broker, the real offload job and the reader -----------------


def read_through_query(spark: Any, service_url: str, store_url: str, topic: str) -> tuple[float, int] | None:
    """Figure (c): the live ``pulsar`` source reading ``topic`` (a comma list) through the tier
    (``offloaded.store``) from ``earliest``: every entry the store holds is read from it (the broker serves
    only what follows, here nothing). Returns (seconds, messages read)."""
    started = time.perf_counter()
    row = (
        spark.read.format("pulsar")
        .option("output", "entries")
        .option("serviceUrl", service_url)
        .option("topics", topic)
        .option("offloaded.store", store_url)
        .load()
        .selectExpr("sum(num_messages) AS n")
        .collect()[0]
    )
    return time.perf_counter() - started, int(row.n or 0)


def plain_drain(service_url: str, topics: list[str], stall_ms: int, queue: int) -> tuple[int, int]:
    """(distinct messages, payload bytes) of a plain ``pulsar-client`` Reader drain of ``topics``:
    ``bench/source.py``'s loop (pulsar-lite duplicates deliveries: it counts each message id once)."""
    from bench.source import drain_plain
    from streamoffload.pulsar import client_reader

    client = client_reader.make_client(service_url)
    try:
        messages = nbytes = 0
        for topic in topics:
            end = client_reader.latest_position(client, topic)
            assert end is not None, topic
            m, b, _entries = drain_plain(client, topic, end, stall_ms, queue)
            messages, nbytes = messages + m, nbytes + b
        return messages, nbytes
    finally:
        client.close()


def broker_bench(args: argparse.Namespace, root: Path) -> None:
    """Publish through the embedded broker, offload with the real job (``run_once``), then measure the
    same messages drained from the broker and read through ``pulsar-offloaded``."""
    from pyspark.sql import functions as F

    from bench.offload import QUIET_CLIENT, drain_job, job_config
    from bench.procstats import CpuMeter
    from streamoffload.config import DEFAULT_MAX_BYTES_PER_TRIGGER
    from streamoffload.embedded_broker import EmbeddedBroker
    from streamoffload.produce import produce
    from streamoffload.streaming.job.session import build_session

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    base = "persistent://public/default/df-broker"
    log_beside(root)
    with EmbeddedBroker(root / "broker") as broker:
        summary = produce(
            broker.service_url,
            base,
            args.messages,
            args.message_bytes,
            partitions=args.partitions,
            batching=True,
            batch_size=args.batch,
            client_options=QUIET_CLIENT,
        )
        topics = sorted(summary.partitions)
        print(
            f"dataframe bench (--broker): Python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load average "
            f"{os.getloadavg()[0]:.1f}; published {summary.messages:,} messages of {args.message_bytes} B "
            f"(batched by up to {args.batch}) to {len(topics)} topic-partitions of pulsar-lite in "
            f"{summary.seconds:.1f} s"
        )
        spark = build_session(
            master="local[2]",
            app_name="bench-dataframe",
            work_dir=str(root / "_spark"),
            extra_conf={"spark.ui.showConsoleProgress": "false"},
        )
        try:
            job_args = argparse.Namespace(
                defaults=False,
                segment_mb=args.segment_mib,
                block_size=args.block_mib * MIB,
                max_bytes_per_trigger=DEFAULT_MAX_BYTES_PER_TRIGGER,
                trigger_interval="1 second",
                store="fs",
            )
            config = job_config(job_args, root, "df", broker.service_url, topics)
            run = drain_job(spark, config)
            store_url = f"file://{root / 'store-df'}"
            print(
                f"offloaded by the job (run --once): {run.entries:,} entries, {run.entry_bytes / 1e6:,.0f} MB, "
                f"{run.segments} segments in {run.wall:.1f} s (blocks {args.block_mib} MiB, segments "
                f"{args.segment_mib} MiB), filesystem store"
            )

            def best_of(fn: Any) -> tuple[float, Any, dict[str, float]]:
                best: tuple[float, Any, dict[str, float]] = (float("inf"), None, {})
                for _ in range(args.runs):
                    with CpuMeter(broker.pid) as meter:
                        started = time.perf_counter()
                        out = fn()
                        wall = time.perf_counter() - started
                    if wall < best[0]:
                        best = (wall, out, meter.used)
                return best

            def cpu(used: dict[str, float]) -> str:
                return "CPU s " + ", ".join(f"{k} {v:.1f}" for k, v in used.items() if v >= 0.05)

            plain_s, (plain_messages, plain_bytes), plain_cpu = best_of(
                lambda: plain_drain(broker.service_url, topics, args.stall_ms, args.queue)
            )
            assert plain_messages == summary.messages, (plain_messages, summary.messages)
            plain_rate = plain_messages / plain_s
            print(
                f"(a) plain pulsar-client Reader drain:   {plain_s:6.2f} s {plain_rate:10,.0f} msg/s  (reference; "
                f"{plain_messages:,} distinct messages, {plain_bytes / 1e6:,.0f} MB; {cpu(plain_cpu)})"
            )

            def df() -> Any:
                return spark.read.format("pulsar-offloaded").option("store", store_url).option("topics", base).load()

            offloaded_rate = 0.0
            for name, query in (
                ("count()", lambda: df().count()),
                ("scan of value", lambda: df().agg(F.count("*"), F.sum(F.length("value"))).collect()[0]),
            ):
                seconds, out, used = best_of(query)
                messages = out if isinstance(out, int) else out[0]
                assert messages == summary.messages, (name, messages, summary.messages)
                if not isinstance(out, int):
                    assert out[1] == summary.bytes, (out[1], summary.bytes)
                rate = messages / seconds
                offloaded_rate = max(offloaded_rate, rate)
                print(
                    f"(b) pulsar-offloaded {name + ':':15} {seconds:6.2f} s {rate:10,.0f} msg/s  ratio to (a) "
                    f"{rate / plain_rate:.2f} (target >= 3)  ({cpu(used)})"
                )
            seconds, through, used = best_of(
                lambda: read_through_query(spark, broker.service_url, store_url, ",".join(topics))
            )
            if through is not None:
                messages = through[1]
                assert messages == summary.messages, ("read-through", messages, summary.messages)
                rate = messages / seconds
                print(
                    f"(c) read-through query (pulsar source, offloaded.store): {seconds:6.2f} s {rate:10,.0f} msg/s; "
                    f"(b) ÷ (c) {offloaded_rate / rate:.2f} (target <= 1.5); ratio to (a) {rate / plain_rate:.2f}  "
                    f"({cpu(used)})"
                )
        finally:
            spark.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store-mb", type=int, default=1000, help="store size in MB (default 1000)")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--batch", type=int, default=10, help="messages per entry")
    parser.add_argument("--message-bytes", type=int, default=1024)
    parser.add_argument("--block-mib", type=int, default=2)
    parser.add_argument("--segment-mib", type=int, default=64)
    parser.add_argument("--runs", type=int, default=2, help="each figure is the best of this many runs")
    parser.add_argument(
        "--window-only", action="store_true", help="only the 1%% window's bytes read (no Spark, no scans)"
    )
    parser.add_argument("--work-dir", default=tempfile.gettempdir())
    parser.add_argument("--keep", action="store_true")
    parser.add_argument(
        "--broker",
        action="store_true",
        help="publish --messages through the embedded broker, offload them with the job, and compare a plain "
        "pulsar-client drain with the reader (instead of the synthetic store)",
    )
    parser.add_argument(
        "--direct",
        action="store_true",
        help="only OffloadedReader.read called directly on the synthetic store (no Spark): µs per message",
    )
    parser.add_argument("--messages", type=int, default=200_000, help="with --broker: messages to publish")
    parser.add_argument("--stall-ms", type=int, default=200, help="with --broker: the plain drain's stall timeout")
    parser.add_argument("--queue", type=int, default=2000, help="with --broker: the plain drain's receiver queue")
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="bench-dataframe-", dir=args.work_dir))
    spark = None
    try:
        if args.broker:
            broker_bench(args, root)
            return 0
        started = time.perf_counter()
        topics, _ = build(root, args)
        store = FilesystemStore(str(root))
        files = data_files(root, store, topics)
        data_bytes = sum(p.stat().st_size for p in files)
        store_bytes = sum(f.stat().st_size for f in root.rglob("*") if f.is_file())
        print(
            f"dataframe bench: Python {sys.version.split()[0]}, {os.cpu_count()} CPUs, "
            f"store of {store_bytes / 1e6:,.0f} MB "
            f"({len(files)} data objects, {data_bytes / 1e6:,.0f} MB; {args.partitions} topic-partitions; "
            f"{args.batch} x {args.message_bytes} B messages per entry; blocks {args.block_mib} MiB, segments "
            f"{args.segment_mib} MiB), built in {time.perf_counter() - started:.0f} s"
        )

        if args.direct:
            messages, wall, cpu = direct_read(root, topics, max(args.runs, 3))
            print(
                f"OffloadedReader.read called directly (1 process, no Spark): {messages:,} messages, best of "
                f"{max(args.runs, 3)}: {wall:.2f} s wall, {cpu:.2f} s CPU = {1e6 * wall / messages:.1f} µs per message "
                f"wall, {1e6 * cpu / messages:.1f} µs CPU; load average {os.getloadavg()[0]:.1f}"
            )
            return 0

        lo = FIRST_MS + DAY_MS // 2
        times = ofp.TimeBounds(lo, lo + DAY_MS // 100)
        if args.window_only:
            read_bytes, rows = window_bytes(store, topics, times)
            print(
                f"1% publish-time window: read {read_bytes / 1e6:,.1f} MB of the {store_bytes / 1e6:,.0f} MB store "
                f"({100 * read_bytes / store_bytes:.2f}%, must be < 3%), {rows:,} messages"
            )
            return 0

        raw_read(files)  # warm the page cache
        raw_s, _ = timed(lambda: raw_read(files), args.runs)
        raw_mbps = data_bytes / 1e6 / raw_s
        print(f"raw sequential read of the data objects: {raw_s:6.2f} s  {raw_mbps:8.1f} MB/s  (reference)")

        from pyspark.sql import functions as F

        from streamoffload.streaming.job.session import build_session

        log_beside(root)
        spark = build_session(master="local[2]", app_name="bench-dataframe", work_dir=str(root / "_spark"))

        def df(**options: str) -> Any:
            reader = spark.read.format("pulsar-offloaded").option("store", f"file://{root}").option("topics", BASE)
            for key, value in options.items():
                reader = reader.option(key, value)
            return reader.load()

        # Best of --runs: the first query of a session also starts a Python worker per core (seconds of
        # imports on a loaded machine), which a long-running session pays once.
        count_s, count = timed(lambda: df().count(), args.runs)
        print(
            f"spark count():                         {count_s:6.2f} s  {data_bytes / 1e6 / count_s:8.1f} MB/s  "
            f"ratio {data_bytes / 1e6 / count_s / raw_mbps:.2f}  ({count:,} messages)"
        )
        scan_s, scanned = timed(lambda: df().agg(F.sum(F.length("value"))).collect()[0][0], args.runs)
        print(
            f"spark scan of value:                   {scan_s:6.2f} s  {data_bytes / 1e6 / scan_s:8.1f} MB/s  "
            f"ratio {data_bytes / 1e6 / scan_s / raw_mbps:.2f}  ({scanned / 1e6:,.0f} MB of values)"
        )
        tr_s, (tr_messages, tr_bytes) = timed(lambda: topic_reader_scan(store, topics), args.runs)
        assert (tr_messages, tr_bytes) == (count, scanned), ((tr_messages, tr_bytes), (count, scanned))
        print(
            f"TopicReader scan of value (1 process): {tr_s:6.2f} s  {data_bytes / 1e6 / tr_s:8.1f} MB/s  "
            f"ratio {data_bytes / 1e6 / tr_s / raw_mbps:.2f}"
        )

        read_bytes, rows = window_bytes(store, topics, times)
        window_s, window_rows = timed(
            lambda: df(startingTime=str(times.lo), endingTime=str(times.hi)).count(), args.runs
        )
        assert window_rows == rows, (window_rows, rows)
        print(
            f"1% publish-time window: read {read_bytes / 1e6:,.1f} MB of the {store_bytes / 1e6:,.0f} MB store "
            f"({100 * read_bytes / store_bytes:.2f}%, must be < 3%); spark count() {window_s:.2f} s, {rows:,} messages "
            f"({100 * rows / count:.2f}% of them)"
        )
    finally:
        if spark is not None:
            spark.stop()
        if args.keep:
            print(f"store kept at {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
