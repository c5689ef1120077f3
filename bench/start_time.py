"""Where a scheduled ``streamoffload run --once`` spends its time from launch to its first read, and in all.

Run from the repository root:

    .venv/bin/python bench/start_time.py                          # 600 MB backlog, then a run with nothing new
    .venv/bin/python bench/start_time.py --backlog-mb 2000 --broker pulsar   # issue 48's whole run, Apache Pulsar
    .venv/bin/python bench/start_time.py --backlog-mb 5 --runs 1  # smoke size (tests/bench)

It starts the broker (``--broker``: pulsar-lite, or Apache Pulsar standalone), publishes ``--backlog-mb`` MB of
4 KiB messages batched by 32 over 4 topic-partitions, takes the broker's best reader on the fresh broker
(``bench/offload.py``'s reference: 5 plain ``pulsar-client`` drains and a raw one, each printed; the fastest is the
reference; ``--no-reference`` skips it), and runs ``run --once`` as a user would (a new process, Spark's start-up
included), ``--runs`` times on the same backlog (each into a store of its own), then once more with nothing new.
The process is ``python bench/start_time.py --child ...``, which runs ``streamoffload.cli.main`` unchanged with the
job's steps wrapped to note when each starts and ends (seconds since launch, as the parent's clock saw the launch;
every micro-batch's ``foreachBatch`` numbered), and every micro-batch's own figures from Spark's query progress.
The first ``foreachBatch`` call is where the first micro-batch's Spark job, and so the source's first read,
starts. It prints, per run, each step and the whole run's wall time, the MB/s from launch and from the first read
(each ÷ the reference), and the broker's CPU seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
LAUNCH_ENV = "BENCH_START_LAUNCHED_AT"
"""The parent's ``time.time()`` just before it started the child."""
PHASES_ENV = "BENCH_START_PHASES"
"""Where the child writes its phases (JSON)."""

NAMESPACE = "persistent://public/default"


def child(argv: list[str]) -> int:
    """``streamoffload ARGV`` in this process, its steps timed (seconds since the parent launched it)."""
    launched = float(os.environ[LAUNCH_ENV])
    marks: list[tuple[str, float]] = [("python up", time.time() - launched)]

    def mark(name: str) -> None:
        marks.append((name, time.time() - launched))

    sys.path.insert(0, str(ROOT))
    from streamoffload import cli

    mark("imports of the CLI done")
    from streamoffload.commands import run
    from streamoffload.streaming.job import queries, runs, session, supervision

    def timed(owner: Any, name: str, label: str, *, first_only: bool = False, numbered: bool = False) -> None:
        original = getattr(owner, name, None)
        if original is None:  # an older tree (the bench also times the code before a change)
            return
        seen = {"n": 0}

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            seen["n"] += 1
            if first_only and seen["n"] > 1:
                return original(*args, **kwargs)
            named = f"{label} {seen['n']}" if numbered else label
            mark(f"{named}: start")
            try:
                return original(*args, **kwargs)
            finally:
                mark(f"{named}: end")

        setattr(owner, name, wrapper)

    timed(runs.JobRuns, "begin_run", "begin_run (lease, recovery)", first_only=True)
    timed(supervision.JobSupervision, "broker_latest", "broker's latest positions")
    timed(supervision.JobSupervision, "nothing_new", "nothing new?")
    timed(run, "backlog_at_start", "progress's backlog")
    timed(session, "_start_fork_server", "fork server")
    timed(session, "_launch_gateway", "JVM launch")
    timed(session, "build_session", "SparkSession")
    from pyspark.sql import SparkSession

    timed(SparkSession.Builder, "getOrCreate", "SparkSession.builder.getOrCreate")
    timed(session, "register", "the data sources registered")
    timed(queries.JobQueries, "start", "query start", first_only=True)
    timed(queries.JobQueries, "_foreach_batch", "micro-batch's foreachBatch", numbered=True)
    timed(queries.JobQueries, "finish_writes", "the last micro-batch's writes awaited")
    timed(supervision.JobSupervision, "retention_runner", "retention runner made")
    timed(supervision.JobSupervision, "sync_tables", "tables synced")
    timed(runs.JobRuns, "end_run", "end_run", first_only=True)
    timed(session, "stop_session", "Spark stopped")
    progress: list[dict[str, Any]] = []
    original_await = supervision.JobSupervision._await

    def kept_await(self: Any, query: Any) -> None:
        try:
            original_await(self, query)
        finally:
            progress.extend(json.loads(p.json) for p in query.recentProgress)

    supervision.JobSupervision._await = kept_await  # type: ignore[method-assign]
    try:
        code = cli.main(argv)
    finally:
        mark("command returned")
        Path(os.environ[PHASES_ENV]).write_text(json.dumps({"marks": marks, "progress": progress}))
    return code


def cpu_s(pid: int) -> float:
    hz = os.sysconf("SC_CLK_TCK")
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / hz


def run_once(conf: Path, log: Path, phases: Path, broker_pid: int) -> tuple[float, dict[str, Any], float, int]:
    """(wall s, the child's phases, broker CPU s, exit status) of one ``run --once`` in its own process."""
    cmd = [sys.executable, __file__, "--child", "run", "--once", "--conf", str(conf), "--log-file", str(log)]
    broker_before = cpu_s(broker_pid)
    launched = time.time()
    proc = subprocess.run(
        cmd, capture_output=True, cwd=ROOT, env={**os.environ, LAUNCH_ENV: repr(launched), PHASES_ENV: str(phases)}
    )
    wall = time.time() - launched
    if proc.returncode:
        print(proc.stderr.decode()[-3000:])
    return wall, json.loads(phases.read_text()), cpu_s(broker_pid) - broker_before, proc.returncode


def render(label: str, wall: float, doc: dict[str, Any], mb: float, broker_cpu: float, best: float | None) -> None:
    """One run's steps and rates; ``best``: the broker's best reader, MB/s (None: not taken)."""
    print(f"{label}: {wall:.2f} s wall, broker CPU {broker_cpu:.2f} s")
    first_read = None
    for name, at in doc["marks"]:
        print(f"  {at:7.2f} s  {name}")
        if name == "micro-batch's foreachBatch 1: start":
            first_read = at
    for p in doc["progress"]:
        d = p.get("durationMs", {})
        parts = ", ".join(f"{k} {v} ms" for k, v in sorted(d.items()))
        print(f"  micro-batch {p.get('batchId')} (Spark's progress: {p.get('numInputRows')} rows): {parts}")
    if first_read is not None and mb > 0:
        print(
            f"  first read at {first_read:.2f} s; {mb:.0f} MB: {mb / wall:.1f} MB/s from launch, "
            f"{mb / (wall - first_read):.1f} MB/s from the first read"
        )
        if best is not None:
            print(
                f"  ÷ the broker's best reader ({best:.1f} MB/s): from launch {mb / wall / best:.2f} (target >= 0.4), "
                f"from the first read {mb / (wall - first_read) / best:.2f}"
            )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        return child(argv[1:])
    sys.path.insert(0, str(ROOT))
    from bench.harness import add_broker_argument, bench_broker, broker_name  # not in the child: its start is timed

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backlog-mb", type=float, default=600, help="backlog, MB of payload (default 600)")
    parser.add_argument("--partitions", type=int, default=4, help="topic-partitions (default 4)")
    parser.add_argument("--runs", type=int, default=2, help="runs over the backlog, each into its own store (2)")
    parser.add_argument("--no-reference", action="store_true", help="skip the drains of the fresh broker (no ratios)")
    add_broker_argument(parser)
    args = parser.parse_args(argv)
    from bench.offload import PLAIN_DRAINS, reference_drains
    from streamoffload.produce import produce

    work = Path(tempfile.mkdtemp(prefix="bench-start-time-"))
    try:
        with bench_broker(args.broker, work / "broker") as broker:
            summary = produce(
                broker.service_url,
                f"{NAMESPACE}/start-time",
                int(args.backlog_mb * 1e6 / 4096),
                4096,
                partitions=args.partitions,
                batching=True,
                batch_size=32,
            )
            mb = summary.bytes / 1e6
            names = ", ".join(f'"{t}"' for t in summary.partitions)
            print(
                f"{broker_name(broker)}: published {mb:.0f} MB to {len(summary.partitions)} topic-partitions; "
                f"load {os.getloadavg()}"
            )
            best = None
            if not args.no_reference:
                best = mb / reference_drains(broker, list(summary.partitions), mb, PLAIN_DRAINS).best_s
                print(f"  the broker's best reader (fresh broker): {best:.1f} MB/s of payload")
            status = 0
            for i in range(args.runs + 1):
                store = work / f"store-{min(i, args.runs - 1)}"
                conf = work / f"offload-{i}.toml"
                conf.write_text(
                    f'[pulsar]\nservice_url = "{broker.service_url}"\ntopics = [{names}]\n'
                    f'[store]\nroot = "{store}"\n[spark]\ncheckpoint = "{work / f"checkpoint-{i}"}"\n'
                    '[metrics]\naddress = ""\n'
                )
                log, phases = work / f"run-{i}.log", work / "phases.json"
                wall, doc, broker_cpu, code = run_once(conf, log, phases, broker.pid or 0)
                label = f"run {i + 1} ({mb:.0f} MB)" if i < args.runs else "nothing new"
                render(label, wall, doc, mb if i < args.runs else 0.0, broker_cpu, best)
                status = status or code
            return status
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
