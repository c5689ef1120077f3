"""Pulsar's own offloader beside ours: the same backlog on Apache Pulsar, offloaded by the broker's tiered storage
and by ``streamoffload run --once``, in one run.

Run from the repository root (after ``bash scripts/test.sh`` has fetched Pulsar and built tests/pulsar_reader):

    .venv/bin/python bench/pulsar_offloader.py                    # 300 MB backlog
    .venv/bin/python bench/pulsar_offloader.py --backlog-mb 40    # smoke test, a few minutes

It starts a moto_server (two buckets: Pulsar's and ours) and Apache Pulsar 4.0.7 standalone (JIT as in production:
no C1-only quick start) with its own tiered storage configured as an operator would: ``managedLedgerOffloadDriver =
aws-s3`` on moto, the jcloud offloader NAR (4.0.8; bench/offloading_broker.py), Pulsar's default block and
read-buffer sizes. It publishes ``--backlog-mb`` MB of ``--payload-size`` messages batched by ``--batch-size`` to
one topic whose ledgers roll every ``--ledger-entries`` entries, then unloads the topic (the broker closes its last
ledger, which Pulsar's offloader would otherwise never take: it offloads closed ledgers only). Then, one after
another on that backlog:

1. ``ours -> fs``: ``streamoffload run --once`` as its own process (Spark's start-up included), to a filesystem store;
2. ``ours -> s3``: the same, to our bucket on the same moto;
3. ``pulsar -> s3``: ``pulsar-admin topics offload`` through the admin REST API (every closed ledger), polled until
   done. It runs last: a broker reads an offloaded ledger back from the tier, and ours must read BookKeeper's.

Figures, each with its denominators: MB/s = entry bytes offloaded (10^6 B; ours: the manifests' ``entryBytes``;
Pulsar's: the offloaded ledgers' sizes, the same bytes) / wall; CPU s per GB = CPU seconds / entry GB, counted from
/proc: the broker JVM's tree (Pulsar's offloader runs in it; for ours it is the broker dispatching), our job's
process tree (its Python driver, Spark JVM and Python workers: the children this process reaped), and moto's tree
(the store's cost, alike for both sides, apart). Publish to readable: from the end of the publish (the last
message acknowledged) to the last entry readable in the store, as if each side had started at that moment: the
side's own wall from its start to its last commit (ours) or to ``SUCCESS`` (Pulsar's). It says nothing of when
each would start unasked: Pulsar's threshold offload (``managedLedgerOffloadThresholdInBytes``) waits for a ledger
to close (by default 50,000 entries or 2 GB, and not before ``managedLedgerMinLedgerRolloverTimeMinutes`` = 10);
the job seals a segment by size or ``maxOffloadSegmentRolloverTimeMinutes``.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import resource
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import (
    add_work_arguments,
    fs_store_section,
    moto_bucket,
    moto_credentials,
    new_work_dir,
    s3_store_section,
    store_toml,
)
from bench.offloading_broker import (
    build_command,
    offload_topic,
    offloader_jar,
    offloaders_dir,
    offloading_broker,
    rest_topic,
)
from bench.procstats import child_pids, tree_cpu
from bench.s3_endpoint import raw_s3_client
from streamoffload.checkpoints.metadata_store import MetadataStore
from streamoffload.produce import produce
from streamoffload.storage.location import parse_store_url

ROOT = Path(__file__).resolve().parent.parent
# pulsar-client logs every producer's life at INFO on stdout; the figures should stand out.
QUIET = logging.getLogger("bench.pulsar_offloader.pulsar")
QUIET.setLevel(logging.WARNING)
TOPIC = "persistent://public/default/rival"
PULSAR_BUCKET = "pulsar-offload"
OUR_BUCKET = "streamoffload"


@dataclass
class Side:
    """One offload of the backlog: what it wrote and what it cost."""

    name: str
    entry_bytes: int
    entries: int
    wall_s: float
    cpu: dict[str, float]

    @property
    def mb_per_s(self) -> float:
        return self.entry_bytes / 1e6 / self.wall_s

    @property
    def cpu_per_gb(self) -> float:
        """CPU seconds per entry GB of the broker and the offloader (ours: its process tree), moto apart."""
        return sum(v for k, v in self.cpu.items() if k != "moto") / (self.entry_bytes / 1e9)

    def figures(self) -> str:
        gb = self.entry_bytes / 1e9
        parts = ", ".join(f"{k} {v:.1f} s ({v / gb:.1f} s/GB)" for k, v in self.cpu.items())
        return (
            f"{self.name:13} {self.mb_per_s:7.1f} MB/s  {self.cpu_per_gb:6.1f} CPU s/GB "
            f"(moto apart)  publish to readable {self.wall_s:6.1f} s   [{self.entries:,} entries, "
            f"{self.entry_bytes:,} B in {self.wall_s:.1f} s wall; CPU: {parts}]"
        )


def cpu_now(broker_pid: int, moto_pid: int) -> dict[str, float]:
    """CPU seconds so far of the broker's tree, this process's reaped children (our job's tree, once waited for:
    all but what its driver did not wait for, which ``run_ours`` samples) and moto's tree."""
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {
        "broker": tree_cpu(broker_pid),
        "ours": reaped.ru_utime + reaped.ru_stime,
        "moto": tree_cpu(moto_pid),
    }


def delta(before: dict[str, float], after: dict[str, float], keys: tuple[str, ...]) -> dict[str, float]:
    return {k: after[k] - before[k] for k in keys}


def write_conf(work: Path, name: str, service_url: str, store: dict[str, Any]) -> Path:
    """The job's configuration: the defaults, but for the broker, the topic, the store and a checkpoint."""
    path = work / f"{name}.toml"
    path.write_text(
        f'[pulsar]\nservice_url = "{service_url}"\ntopics = ["{TOPIC}"]\n'
        f"{store_toml(store)}\n"
        f'[spark]\ncheckpoint = "{work / f"checkpoint-{name}"}"\n'
        '[metrics]\naddress = ""\n'
    )
    return path


def run_ours(
    name: str,
    work: Path,
    service_url: str,
    store: dict[str, Any],
    url: str,
    endpoint: str | None,
    pids: tuple[int, int],
) -> Side:
    conf = write_conf(work, name, service_url, store)
    log = work / f"{name}.log"
    cmd = [sys.executable, "-m", "streamoffload", "run", "--once", "--conf", str(conf), "--log-file", str(log)]
    env = dict(os.environ)
    moto_credentials(env)
    before = cpu_now(*pids)
    started = time.monotonic()
    with open(work / f"{name}.stderr", "wb") as stderr:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=stderr, cwd=ROOT, env=env)
        # The job's tree, sampled while it runs: a process its driver does not wait for (Spark's daemons, the fork
        # server) never reaches this process's reaped children's times.
        sampled = 0.0
        while proc.poll() is None:
            sampled = max(sampled, tree_cpu(proc.pid))
            time.sleep(0.5)
    wall = time.monotonic() - started
    after = cpu_now(*pids)
    after["ours"] = before["ours"] + max(after["ours"] - before["ours"], sampled)
    if proc.returncode:
        tail = (work / f"{name}.stderr").read_text(errors="replace")[-2000:]
        raise SystemExit(f"{name}: run --once exited {proc.returncode} (log {log}):\n{tail}")
    scoped = parse_store_url(url, endpoint=endpoint, region="us-east-1").open(create=False)
    segments = MetadataStore(scoped).offloaded_segments(TOPIC)
    scoped.store.close()
    return Side(
        name,
        sum(m.entryBytes for m in segments),
        sum(m.entries for m in segments),
        wall,
        delta(before, after, ("ours", "broker", "moto")),
    )


def run_pulsar(broker: Any, pids: tuple[int, int]) -> Side:
    before = cpu_now(*pids)
    started = time.monotonic()
    info = offload_topic(broker, TOPIC, timeout=3600)
    wall = time.monotonic() - started
    after = cpu_now(*pids)
    offloaded = [ledger for ledger in info["ledgers"] if ledger.get("isOffloaded")]
    return Side(
        "pulsar -> s3",
        sum(int(ledger["size"]) for ledger in offloaded),
        sum(int(ledger["entries"]) for ledger in offloaded),
        wall,
        delta(before, after, ("broker", "moto")),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backlog-mb", type=float, default=300.0, help="payload MB to publish (default %(default)s)")
    parser.add_argument("--payload-size", type=int, default=4096, help="message bytes (default %(default)s)")
    parser.add_argument("--batch-size", type=int, default=32, help="messages per entry (default %(default)s)")
    parser.add_argument(
        "--ledger-entries", type=int, default=200, help="managedLedgerMaxEntriesPerLedger (default %(default)s)"
    )
    add_work_arguments(parser)
    args = parser.parse_args(argv)
    if not offloader_jar().is_file():
        print(
            f"bench/pulsar_offloader.py: Pulsar's jcloud offloader {offloader_jar()} is not resolved "
            f"({build_command()}; scripts/test.sh does it)",
            file=sys.stderr,
        )
        return 2
    work = new_work_dir(args.work_dir, "bench-pulsar-offloader-")
    try:
        with contextlib.ExitStack() as stack:
            endpoint = stack.enter_context(moto_bucket(work / "moto.log", PULSAR_BUCKET))
            raw_s3_client(endpoint).create_bucket(Bucket=OUR_BUCKET)
            moto_credentials()
            (moto_pid,) = child_pids("moto")
            offloaders = offloaders_dir(work)
            broker = offloading_broker(
                work / "broker",
                endpoint,
                PULSAR_BUCKET,
                offloaders,
                max_entries_per_ledger=args.ledger_entries,
                quick_start=False,
                heap="1g",
                direct_memory="512m",
            )
            stack.enter_context(broker)
            assert broker.pid is not None
            pids = (broker.pid, moto_pid)
            print(
                f"Apache Pulsar {broker.version} standalone up in {broker.started_in_s:.1f} s; moto at {endpoint}; "
                f"offloader {', '.join(sorted(os.listdir(offloaders)))}"
            )
            count = int(args.backlog_mb * 1e6 / args.payload_size)
            summary = produce(
                broker.service_url,
                TOPIC,
                count,
                args.payload_size,
                batching=True,
                batch_size=args.batch_size,
                client_options={"logger": QUIET},
            )
            broker.admin("PUT", f"/admin/v2/{rest_topic(TOPIC)}/unload")  # closes the last ledger
            stats = broker.admin("GET", f"/admin/v2/{rest_topic(TOPIC)}/internalStats")
            closed = [ledger for ledger in stats["ledgers"] if ledger["entries"] > 0]
            print(
                f"published {summary.messages:,} messages of {args.payload_size} B batched by {args.batch_size} "
                f"({summary.bytes / 1e6:,.0f} MB of payload) in {summary.seconds:.1f} s; {len(closed)} closed "
                f"ledgers, {sum(ledger['entries'] for ledger in closed):,} entries, "
                f"{sum(ledger['size'] for ledger in closed):,} B"
            )
            sides = [
                run_ours(
                    "ours -> fs",
                    work,
                    broker.service_url,
                    fs_store_section(work / "store"),
                    str(work / "store"),
                    None,
                    pids,
                ),
                run_ours(
                    "ours -> s3",
                    work,
                    broker.service_url,
                    s3_store_section(endpoint, OUR_BUCKET, "offload"),
                    f"s3://{OUR_BUCKET}/offload",
                    endpoint,
                    pids,
                ),
                run_pulsar(broker, pids),
            ]
            for side in sides:
                print(side.figures())
            ours, theirs = sides[1], sides[2]
            print(
                f"to the same moto, ours / Pulsar's: {ours.mb_per_s / theirs.mb_per_s:.2f}x the MB/s, "
                f"{ours.cpu_per_gb / theirs.cpu_per_gb:.2f}x the CPU s per GB (moto apart)"
            )
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"kept {work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
