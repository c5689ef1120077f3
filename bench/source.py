"""The Pulsar source draining a backlog, next to a plain pulsar-client reader draining the same one.

Run from the repository root:

    .venv/bin/python bench/source.py                        # 200,000 messages of 1 KiB, unbatched and batched
    .venv/bin/python bench/source.py --messages 20000       # smaller and quicker
    .venv/bin/python bench/source.py --readers plain,raw --no-spark   # the raw reader against the plain client
    .venv/bin/python bench/source.py --spark-reader client  # the Spark source on its pulsar-client fallback
    .venv/bin/python bench/source.py --min-partitions 1,2   # also the Spark source with minPartitions 2

For each mode (unbatched: one message per entry; batched: up to 100 messages per entry) it starts
the broker (``--broker``: the embedded pulsar-lite, or Apache Pulsar standalone), publishes the
backlog with ``streamoffload.produce``, then drains it several ways, in the same run, from the same
broker:

- ``plain``: a ``pulsar-client`` Reader loop reading every message and its payload -- the minimum a
  correct client does on pulsar-lite: skip what it already saw and re-open the reader at the last
  message when it stalls (SPEC 6), nothing else;
- ``client``: ``pulsar.client_reader.read_range``, the source's reading without Spark: regrouping
  batches, rebuilding every entry's bytes with ``codecs.entry.build_entry``, the exactness checks;
- ``raw``: ``pulsar.raw_reader.read_range_raw``, the raw-entry reader: the stored entries byte
  for byte over the binary protocol (CRC-32C checked, message count from the metadata; no
  unpacking, no rebuilding), with the same exactness checks;
- ``spark``: ``spark.readStream.format("pulsar")`` with ``Trigger.AvailableNow`` into Spark's
  ``noop`` sink (rows built and dropped in the JVM), ``local[2]``, on the source's default reader
  (``raw``) unless ``--spark-reader`` says otherwise. Timed as the sum of the
  micro-batches' trigger times (query start-up, a few seconds, is printed apart), after a warm-up
  query on a small topic (the session's first query pays ~10 s of JVM and Python worker start-up).
  ``spark/N`` is the same with ``minPartitions`` N: one topic-partition's range read by N tasks.

Figures: entries/s, and MB/s of message payload (10^6 bytes; the same bytes for all three), and the
ratio of each to ``plain``. The machine's 2 cores are shared, so absolute figures move between runs;
the ratios are the point.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pulsar

# bench/logs.py is shared by the bench scripts; run from the repository root.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import add_broker_argument, bench_broker, broker_name
from bench.logs import log_beside
from streamoffload.codecs.positions import Position
from streamoffload.produce import produce
from streamoffload.pulsar import client_reader
from streamoffload.pulsar import raw_reader as rr
from streamoffload.pulsar.exactly_once import BEFORE_EARLIEST, ReaderSettings, ReadStats
from streamoffload.pulsar.wire import batch_size_of


def end_positions(client: Any, topics: Iterable[str]) -> dict[str, Position]:
    """Each topic-partition's last position (``client_reader.latest_position``): where the drains below stop.
    A topic-partition without entries is an error, as a drain would have no end to reach."""
    ends: dict[str, Position] = {}
    for topic in topics:
        end = client_reader.latest_position(client, topic)
        if end is None:
            raise RuntimeError(f"{topic} has no entries: nothing to drain")
        ends[topic] = end
    return ends


def drain_plain(client: Any, topic: str, end: Position, stall_ms: int, queue: int) -> tuple[int, int, int]:
    """(messages, payload bytes, entries) read with a bare Reader loop (dedupe + re-open on stall)."""
    last = (-1, -1, -1)
    messages = nbytes = entries = 0
    last_entry: tuple[int, int] = (-1, -1)
    while True:
        start = pulsar.MessageId.earliest if last[0] < 0 else pulsar.MessageId(-1, last[0], last[1], last[2])
        reader = client.create_reader(topic, start, receiver_queue_size=queue)
        try:
            while True:
                try:
                    msg = reader.read_next(stall_ms)
                except pulsar.Timeout:
                    break  # stalled: re-open at the last message
                mid = msg.message_id()
                pos = (mid.ledger_id(), mid.entry_id(), mid.batch_index())
                if pos <= last:
                    continue
                last = pos
                messages += 1
                nbytes += len(msg.data())
                if pos[:2] != last_entry:
                    last_entry = pos[:2]
                    entries += 1
                if pos[:2] >= end and (pos[2] < 0 or pos[2] + 1 == batch_size_of(mid.serialize())):
                    return messages, nbytes, entries
        finally:
            reader.close()


def drain_client(client: Any, topic: str, end: Position, stall_ms: int, queue: int) -> tuple[int, int, int]:
    stats = ReadStats()
    settings = ReaderSettings(receiver_queue_size=queue, stall_timeout_ms=stall_ms)
    for _entry in client_reader.read_range(client, topic, BEFORE_EARLIEST, end, settings=settings, stats=stats):
        pass
    return stats.messages, stats.bytes, stats.entries


def drain_raw(client: rr.RawClient, topic: str, end: Position, stall_ms: int, queue: int) -> tuple[int, int, int]:
    stats = ReadStats()
    settings = ReaderSettings(receiver_queue_size=queue, stall_timeout_ms=stall_ms)
    for _entry in rr.read_range_raw(client, topic, BEFORE_EARLIEST, end, settings=settings, stats=stats):
        pass
    return stats.messages, stats.bytes, stats.entries


def drain_to_noop(stream: Any, checkpoint: str, what: str) -> list[dict[str, Any]]:
    """Run a streaming DataFrame into Spark's ``noop`` sink with ``Trigger.AvailableNow`` until it has read all
    there was; the progress of its micro-batches with rows. RuntimeError, naming ``what``, if it failed."""
    query = (
        stream.writeStream.format("noop").trigger(availableNow=True).option("checkpointLocation", checkpoint).start()
    )
    query.awaitTermination()
    if query.exception() is not None:
        raise RuntimeError(f"{what} failed: {query.exception()}")
    return [p for p in query.recentProgress if p["numInputRows"] > 0]


def drain_spark(
    spark: Any,
    service_url: str,
    topics: list[str],
    checkpoint: str,
    stall_ms: int,
    queue: int,
    reader: str | None = None,
    min_partitions: int = 1,
) -> tuple[int, float, float, str]:
    """(rows, seconds in micro-batches, wall seconds including query start-up, where the micro-batch
    time went: Spark's ``durationMs`` phases summed over the micro-batches with rows)."""
    started = time.monotonic()
    stream = (
        spark.readStream.format("pulsar")
        .option("output", "entries")
        .option("serviceUrl", service_url)
        .option("topics", ",".join(topics))
        .option("stallTimeoutMs", str(stall_ms))
        .option("receiverQueueSize", str(queue))
    )
    if reader:
        stream = stream.option("reader", reader)
    if min_partitions > 1:
        stream = stream.option("minPartitions", str(min_partitions))
    progress = drain_to_noop(stream.load(), checkpoint, "spark query")
    wall = time.monotonic() - started
    rows = sum(p["numInputRows"] for p in progress)
    batch_seconds = sum(p["durationMs"]["triggerExecution"] for p in progress) / 1000
    phases: dict[str, int] = {}
    for p in progress:
        for phase, ms in p["durationMs"].items():
            if phase != "triggerExecution":
                phases[phase] = phases.get(phase, 0) + int(ms)
    listed = ", ".join(f"{k} {v / 1000:.2f}" for k, v in sorted(phases.items(), key=lambda kv: -kv[1]) if v >= 10)
    return rows, batch_seconds, wall, f"{len(progress)} micro-batch(es): {listed} s"


def spark_name(min_partitions: int) -> str:
    return "spark" if min_partitions == 1 else f"spark/{min_partitions}"


def line(name: str, entries: int, payload_bytes: int, seconds: float, base: tuple[float, float] | None) -> str:
    eps = entries / seconds
    mbs = payload_bytes / 1e6 / seconds
    text = f"  {name:<9} {entries:>8,} entries in {seconds:6.2f} s: {eps:>9,.0f} entries/s {mbs:7.1f} MB/s"
    if base is not None:
        text += f"   ratio {mbs / base[1]:.2f}"
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=200_000, help="messages per mode (default %(default)s)")
    parser.add_argument("--payload-size", type=int, default=1024, help="bytes per message (default %(default)s)")
    parser.add_argument("--partitions", type=int, default=1, help="topic-partitions to spread them over (default 1)")
    parser.add_argument("--modes", default="unbatched,batched", help="comma list of unbatched,batched")
    parser.add_argument("--batch-size", type=int, default=100, help="messages per batch when batched (default 100)")
    parser.add_argument("--stall-ms", type=int, default=200, help="reader silence that counts as a stall (both sides)")
    parser.add_argument("--queue", type=int, default=2000, help="reader receiver queue size (both sides)")
    parser.add_argument("--repeat", type=int, default=2, help="alternating rounds; best time of each (default 2)")
    parser.add_argument("--no-spark", action="store_true", help="skip the Spark run")
    parser.add_argument(
        "--readers", default="plain,client,raw", help="comma list of plain,client,raw (plain always runs)"
    )
    parser.add_argument(
        "--min-partitions",
        default="1",
        help="comma list of the Spark source's minPartitions values, each its own spark line (default 1)",
    )
    parser.add_argument(
        "--spark-reader",
        default=None,
        choices=("raw", "client"),
        help="the Spark source's 'reader' option (default: the source's default, raw)",
    )
    add_broker_argument(parser)
    parser.add_argument("--keep", action="store_true", help="keep the work directory (broker data, checkpoints)")
    parser.add_argument(
        "--conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Spark setting for the session, e.g. spark.driver.extraJavaOptions=-XX:TieredStopAtLevel=4 (C2 JIT)",
    )
    args = parser.parse_args(argv)
    extra = dict(kv.split("=", 1) for kv in args.conf)
    min_partitions = [int(v) for v in args.min_partitions.split(",") if v.strip()]

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    work = tempfile.mkdtemp(prefix="bench-source-")
    print(
        f"source bench: Python {sys.version.split()[0]}, {os.cpu_count()} CPUs, {args.messages:,} messages of "
        f"{args.payload_size} B per mode over {args.partitions} topic-partition(s), {args.broker}, work dir {work}"
        + ("" if args.no_spark else f", Spark source reader={args.spark_reader or 'raw (default)'}")
        + "".join(f"; --conf {kv}" for kv in args.conf)
    )
    spark = None
    if not args.no_spark:
        from streamoffload.streaming.job.session import build_session

        log_beside(work)
        spark = build_session(
            master="local[2]",
            app_name="bench-source",
            work_dir=os.path.join(work, "spark"),
            extra_conf={"spark.ui.showConsoleProgress": "false", **extra},
        )
    try:
        with bench_broker(args.broker, Path(work) / "broker") as broker:
            print(f"broker: {broker_name(broker)}")
            client = client_reader.make_client(broker.service_url)
            raw_client = rr.RawClient(broker.service_url)
            try:
                if spark is not None:
                    # The first query of a session pays for JVM warm-up, Python worker start and imports
                    # (about 10 s here): spend that on a small topic, so the figures below are steady state.
                    warm = "persistent://public/default/bench-warmup"
                    produce(broker.service_url, warm, 2000, args.payload_size, batching=False)
                    _rows, _batch_s, wall, _phases = drain_spark(
                        spark,
                        broker.service_url,
                        [warm],
                        os.path.join(work, "cp-warmup"),
                        args.stall_ms,
                        args.queue,
                        args.spark_reader,
                    )
                    print(f"spark warm-up query: {wall:.1f} s")
                for mode in [m.strip() for m in args.modes.split(",") if m.strip()]:
                    batching = mode == "batched"
                    base = f"persistent://public/default/bench-{mode}"
                    summary = produce(
                        broker.service_url,
                        base,
                        args.messages,
                        args.payload_size,
                        partitions=args.partitions if args.partitions > 1 else 0,
                        batching=batching,
                        batch_size=args.batch_size,
                    )
                    topics = list(summary.partitions)
                    ends = end_positions(client, topics)
                    print(f"{mode}: published in {summary.seconds:.1f} s ({summary.rate:,.0f} msg/s)")
                    readers = {r.strip() for r in args.readers.split(",") if r.strip()}
                    best = {name: float("inf") for name in ("plain", "client", "raw")}
                    walls: dict[str, float] = {}
                    all_phases: dict[str, str] = {}
                    entries = payload = 0
                    ranged: list[tuple[str, Any, Any]] = [
                        d for d in (("client", drain_client, client), ("raw", drain_raw, raw_client)) if d[0] in readers
                    ]
                    # Alternating rounds, best time of each: the broker's caches and the other jobs on
                    # this machine treat every reader alike.
                    for round_no in range(args.repeat):
                        started = time.monotonic()
                        totals = [0, 0, 0]
                        for t in topics:
                            for i, v in enumerate(drain_plain(client, t, ends[t], args.stall_ms, args.queue)):
                                totals[i] += v
                        best["plain"] = min(best["plain"], time.monotonic() - started)
                        messages, payload, entries = totals
                        assert messages == args.messages, f"plain reader saw {messages} messages"

                        for name, drain, reader_client in ranged:
                            started = time.monotonic()
                            read_entries = read_messages = 0
                            for t in topics:
                                m, _b, e = drain(reader_client, t, ends[t], args.stall_ms, args.queue)
                                read_messages += m
                                read_entries += e
                            best[name] = min(best[name], time.monotonic() - started)
                            assert read_messages == args.messages and read_entries == entries, (
                                name,
                                read_messages,
                                read_entries,
                            )

                        for mp in min_partitions if spark is not None else []:
                            checkpoint = os.path.join(work, f"cp-{mode}-{round_no}-{mp}")
                            rows, batch_s, wall_s, phases_s = drain_spark(
                                spark,
                                broker.service_url,
                                topics,
                                checkpoint,
                                args.stall_ms,
                                args.queue,
                                args.spark_reader,
                                mp,
                            )
                            assert rows == entries, f"spark read {rows} rows, {entries} entries exist"
                            if batch_s < best.get(spark_name(mp), float("inf")):
                                best[spark_name(mp)] = batch_s
                                walls[spark_name(mp)], all_phases[spark_name(mp)] = wall_s, phases_s
                    base_rates = (entries / best["plain"], payload / 1e6 / best["plain"])
                    print(line("plain", entries, payload, best["plain"], None))
                    for name in ("client", "raw"):
                        if name in readers:
                            print(line(name, entries, payload, best[name], base_rates))
                    for mp in min_partitions if spark is not None else []:
                        name = spark_name(mp)
                        print(line(name, entries, payload, best[name], base_rates) + f"   (wall {walls[name]:.1f} s)")
                        print(f"            {all_phases[name]}")
            finally:
                client.close()
    finally:
        if spark is not None:
            spark.stop()
        if args.keep:
            print(f"work directory kept: {work}")
        else:  # the broker's ledgers and the checkpoints: hundreds of MB per run
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
