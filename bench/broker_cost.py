"""What each way of reading a backlog costs the broker, in CPU seconds per GB, without Spark.

Run from the repository root:

    .venv/bin/python bench/broker_cost.py                       # 400 MB over 4 topic-partitions, 3 rounds
    .venv/bin/python bench/broker_cost.py --backlog-mb 5 --rounds 1  # smoke size (tests/bench)

It starts a fresh pulsar-lite, publishes ``--backlog-mb`` MB of 4 KiB messages batched by 32 over
``--partitions`` topic-partitions, and drains the whole backlog several ways, round after round (the ways in
turn within a round, so each sees the same broker and cache), measuring the broker's CPU (``/proc``) of each:

- ``plain``: a ``pulsar-client`` Reader loop (``bench/source.py``'s ``drain_plain``, queue 2000), topic after topic;
- ``raw``: ``raw_reader.read_range_raw`` topic after topic, the job's reader;
- ``source task``: the offload job's source tasks as the planner cuts them (``positionsOnly``, the raw reader,
  ``READ_THREADS`` ranges at once, ``maxPartitions`` tasks, two at a time as ``local[2]`` runs them), rows built
  and dropped, no spool;
- ``+ spool``: the same, the entries also written to spool files (``spoolDir``) as the job's tasks do;
- ``--job``: first of all, on the fresh broker, the offload job itself (``OffloadJob.run_once`` in a ``local[2]``
  session of its own, into a filesystem store), so its broker CPU per GB stands beside the drains';
- ``latest x N``: the planner's latest-position lookups (``HeldPositions``, held consumers) ``--asks`` times, as
  many triggers would: the CPU per lookup round is printed instead of per GB.

Every figure is printed beside the plain drain's, with the wall seconds and the MB/s.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.source import drain_plain, drain_raw, end_positions  # noqa: E402
from streamoffload.embedded_broker import EmbeddedBroker  # noqa: E402
from streamoffload.produce import produce  # noqa: E402
from streamoffload.pulsar import client_reader  # noqa: E402
from streamoffload.pulsar import raw_reader as rr  # noqa: E402
from streamoffload.pulsar.latest_positions import HeldPositions  # noqa: E402
from streamoffload.streaming.handoff.positions import POSITIONS_COLUMNS  # noqa: E402
from streamoffload.streaming.source.input_partitions import Range  # noqa: E402
from streamoffload.streaming.source.pulsar_source import _input_partitions, read_partition  # noqa: E402
from streamoffload.streaming.source.source_options import SourceOptions  # noqa: E402

NAMESPACE = "persistent://public/default"
_HZ = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _HZ


def measured(pid: int, work: Callable[[], None]) -> tuple[float, float]:
    """(broker CPU s, wall s) of ``work``."""
    before, started = cpu_s(pid), time.monotonic()
    work()
    return cpu_s(pid) - before, time.monotonic() - started


def positions_schema() -> Any:
    """The job's rows' schema (``POSITIONS_COLUMNS``) without a Spark session to parse its DDL."""
    from pyspark.sql import types

    kinds = {
        "string": types.StringType(),
        "int": types.IntegerType(),
        "long": types.LongType(),
        "timestamp": types.TimestampType(),
    }
    return types.StructType([types.StructField(name, kinds[kind]) for name, kind in POSITIONS_COLUMNS])


def source_tasks(service_url: str, ranges: list[Range], parallel: int, spool: Path | None = None) -> None:
    """The job's source tasks over ``ranges``: ``parallel`` at a time, rows dropped; with ``spool``, the entries
    written to spool files there as the job's tasks do (removed afterwards)."""
    schema = positions_schema()
    topics = ",".join(r.topic for r in ranges)
    settings = {"serviceUrl": service_url, "topics": topics, "positionsOnly": "true"}
    if spool is not None:
        spool.mkdir(parents=True, exist_ok=True)
        settings["spoolDir"] = str(spool)
    options = SourceOptions.parse(settings)
    partitions = _input_partitions(ranges, options)
    pending = list(partitions)
    lock = threading.Lock()

    def worker() -> None:
        while True:
            with lock:
                if not pending:
                    return
                part = pending.pop(0)
            for _batch in read_partition(options, part, schema):
                pass

    threads = [threading.Thread(target=worker) for _ in range(parallel)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if spool is not None:
        shutil.rmtree(spool, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backlog-mb", type=float, default=400, help="backlog, MB of payload (default 400)")
    parser.add_argument("--partitions", type=int, default=4, help="topic-partitions (default 4)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of every way (default 3)")
    parser.add_argument("--asks", type=int, default=100, help="latest-position lookup rounds (default 100)")
    parser.add_argument(
        "--job",
        action="store_true",
        help="first, on the fresh broker, the offload job itself (OffloadJob.run_once, local[2], a filesystem store)",
    )
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="bench-broker-cost-"))
    try:
        return measure(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def job_run(service_url: str, topics: list[str], work: Path, name: str) -> Callable[[], None]:
    """``run --once``'s work in this process (a session of its own), into a filesystem store under ``work``."""
    from streamoffload.config import load_config
    from streamoffload.streaming.job.offload_job import OffloadJob
    from streamoffload.streaming.job.session import build_session

    conf = work / f"{name}.toml"
    listed = ", ".join(f'"{t}"' for t in topics)
    conf.write_text(
        f'[pulsar]\nservice_url = "{service_url}"\ntopics = [{listed}]\n[store]\nroot = "{work / name}-store"\n'
        f'[spark]\ncheckpoint = "{work / name}-checkpoint"\n[metrics]\naddress = ""\n'
    )
    spark = build_session()

    def run() -> None:
        OffloadJob(load_config(conf), str(conf)).run_once(spark)

    return run


def measure(args: argparse.Namespace, work: Path) -> int:
    with EmbeddedBroker(work / "broker") as broker:
        pid = broker.pid or 0
        summary = produce(
            broker.service_url,
            f"{NAMESPACE}/broker-cost",
            int(args.backlog_mb * 1e6 / 4096),
            4096,
            partitions=args.partitions,
            batching=True,
            batch_size=32,
        )
        topics = list(summary.partitions)
        gb = summary.bytes / 1e9
        client = client_reader.make_client(broker.service_url)
        raw = rr.RawClient(broker.service_url)
        ends = end_positions(client, topics)
        ranges = [Range(t, (-1, -1), ends[t], True) for t in topics]
        print(
            f"broker_cost: {summary.bytes / 1e6:.0f} MB in {len(topics)} topic-partitions, {args.rounds} round(s); "
            f"load {os.getloadavg()[0]:.1f}"
        )
        spool_dir = Path(tempfile.mkdtemp(prefix="bench-broker-cost-spool-"))
        if args.job:
            cpu, wall = measured(pid, job_run(broker.service_url, topics, work, "job"))
            print(
                f"  the job first (fresh broker): broker {cpu:6.2f} CPU s = {cpu / gb:6.2f} s/GB, {wall:6.2f} s wall "
                f"(its session started before), {summary.bytes / 1e6 / wall:7.1f} MB/s"
            )

        def plain_drains() -> None:
            for t in topics:
                drain_plain(client, t, ends[t], 200, 2000)

        def raw_drains() -> None:
            for t in topics:
                drain_raw(raw, t, ends[t], 200, 2000)

        ways: dict[str, Callable[[], None]] = {
            "plain": plain_drains,
            "raw": raw_drains,
            "source tasks": lambda: source_tasks(broker.service_url, ranges, 2),
            "+ spool": lambda: source_tasks(broker.service_url, ranges, 2, spool_dir),
        }
        figures: dict[str, list[tuple[float, float]]] = {name: [] for name in ways}
        for round_no in range(args.rounds):
            for name, way in ways.items():
                cpu, wall = measured(pid, way)
                figures[name].append((cpu, wall))
                print(
                    f"  round {round_no + 1} {name:>13}: broker {cpu:6.2f} CPU s = {cpu / gb:6.2f} s/GB, "
                    f"{wall:6.2f} s wall, {summary.bytes / 1e6 / wall:7.1f} MB/s"
                )
        plain = statistics.median(c for c, _w in figures["plain"])
        print("  medians:")
        for name, values in figures.items():
            cpu = statistics.median(c for c, _w in values)
            wall = statistics.median(w for _c, w in values)
            # /proc counts CPU in clock ticks (10 ms): a small backlog's drain can show none.
            times = f"{cpu / plain:.2f}" if plain > 0 else "-"
            print(
                f"  {name:>13}: broker {cpu / gb:6.2f} CPU s/GB ({times} x plain's {plain / gb:.2f}), "
                f"{summary.bytes / 1e6 / wall:7.1f} MB/s"
            )
        held = HeldPositions(raw)

        def asks() -> None:
            for _ in range(args.asks):
                held.ask(topics)

        try:
            cpu, wall = measured(pid, asks)
        finally:
            held.close()
        print(
            f"  latest x {args.asks}: broker {1000 * cpu / args.asks:.2f} CPU ms per lookup of {len(topics)} "
            f"topic-partitions (held consumers), {1000 * wall / args.asks:.1f} ms wall each"
        )
        client.close()
        shutil.rmtree(spool_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
