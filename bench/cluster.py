"""The job on a Spark standalone cluster (the sink re-reads every entry from the broker) beside the same job on
``local[2]`` (the spool), against the broker's best reader, in one run.

Run from the repository root:

    .venv/bin/python bench/cluster.py                     # 600 MB backlog
    .venv/bin/python bench/cluster.py --backlog-mb 5 --plain-rounds 1   # smoke size

It starts pulsar-lite, publishes ``--backlog-mb`` MB of batched messages over ``--partitions`` topic-partitions,
then, on that broker:

1. **Reference** (the fresh broker, before any job touched it): a plain ``pulsar-client`` Reader drain, best of
   ``--plain-rounds``, and a raw-reader drain; the faster is the reference.
2. **local[2]**: ``streamoffload run --once`` in its own process (the spool: the source's bytes reach the sink
   from a file).
3. **cluster**: the same job submitted with README's "Spark standalone" commands (``run --once``) to a master and
   two workers started from pip's pyspark (``bench/spark_cluster.py``, one core each): the sink on the executors
   reads every entry from the broker again.

Each job's steady MB/s counts its entry bytes (the manifests' ``entryBytes``, 10^6 bytes) over the time from its
first micro-batch's offsets file (Spark writes it as the batch starts reading) to the last manifest written; the
whole-run rate from launch is printed beside it. Broker CPU per GB (of entry bytes) for every drain and job, and
the job's own process tree's CPU (the driver; on the cluster also the workers' executors) per GB.

The packed environment comes from ``var/cluster-env/`` (README's packing block, as the cluster test makes it;
``--env DIR`` names another: a directory holding ``env/`` and ``env.tar.gz``), packed when missing.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import add_work_arguments, fs_store_section, new_work_dir, store_toml
from bench.procstats import CpuMeter, tree_cpu
from bench.source import drain_plain, drain_raw, end_positions
from bench.spark_cluster import StandaloneCluster, packed_environment, standalone_recipe, submit_command
from streamoffload.checkpoints.metadata_store import MetadataStore
from streamoffload.embedded_broker import EmbeddedBroker
from streamoffload.produce import produce
from streamoffload.pulsar import client_reader
from streamoffload.pulsar import raw_reader as rr
from streamoffload.storage.filesystem import FilesystemStore
from streamoffload.storage.location import ScopedStore

NAMESPACE = "persistent://public/default"


@dataclass
class Drain:
    name: str
    seconds: float
    entry_bytes: int
    broker_cpu: float
    own_cpu: float = 0.0
    wall: float = 0.0

    @property
    def mbs(self) -> float:
        return self.entry_bytes / 1e6 / self.seconds

    def per_gb(self, cpu: float) -> float:
        return cpu / (self.entry_bytes / 1e9)


def reference(service_url: str, topics: list[str], rounds: int, broker_pid: int) -> tuple[Drain, list[Drain]]:
    """The plain drains (best of ``rounds``) and a raw drain; (the fastest, all of them). Their entry bytes are the
    jobs' (set by the caller: the same backlog)."""
    client = client_reader.make_client(service_url)
    drains: list[Drain] = []
    try:
        ends = end_positions(client, topics)
        for i in range(rounds):
            with CpuMeter(broker_pid) as meter:
                started = time.monotonic()
                for t in topics:
                    drain_plain(client, t, ends[t], 200, 2000)
                seconds = time.monotonic() - started
            drains.append(Drain(f"plain pulsar-client drain {i + 1}", seconds, 0, meter.used["broker"]))
    finally:
        client.close()
    raw = rr.RawClient(service_url)
    try:
        with CpuMeter(broker_pid) as meter:
            started = time.monotonic()
            for t in topics:
                drain_raw(raw, t, ends[t], 200, 2000)
            seconds = time.monotonic() - started
        drains.append(Drain("raw drain", seconds, 0, meter.used["broker"]))
    finally:
        raw.close()
    return min(drains, key=lambda d: d.seconds), drains


def entry_bytes(store_root: Path, topics: list[str]) -> tuple[int, float]:
    """(entry bytes in offloaded segments, mtime of the last manifest written)."""
    meta = MetadataStore(ScopedStore(FilesystemStore(store_root)))
    total = sum(m.entryBytes for t in topics for m in meta.offloaded_segments(t))
    last = max(p.stat().st_mtime for p in store_root.rglob("*") if p.is_file())
    return total, last


def first_batch_start(checkpoint: Path) -> float:
    """When the run's first micro-batch started reading: its offsets file's mtime."""
    return min(p.stat().st_mtime for p in checkpoint.glob("run-*/**/offsets/0"))


def write_job_config(work: Path, name: str, service_url: str, topics: list[str], args: argparse.Namespace) -> Path:
    path = work / name / "streamoffload.toml"
    path.parent.mkdir(parents=True)
    path.write_text(
        f"""[pulsar]
serviceUrl = "{service_url}"
topics = [{", ".join(f'"{t}"' for t in topics)}]
maxMessageSize = 1048576

{store_toml(fs_store_section(work / name / "store"))}

[spark]
checkpoint = "{work / name / "checkpoint"}"

[metrics]
address = ""

[offload]
maxSizePerOffloadSegmentMbytes = {args.segment_mb}
managedLedgerOffloadMaxBlockSizeInBytes = {args.block_size}
""",
        encoding="utf-8",
    )
    return path


def run_job(name: str, argv: list[str], cwd: Path, env: dict[str, str], broker_pid: int, topics: list[str]) -> Drain:
    log = cwd / "job.log"
    with CpuMeter(broker_pid) as meter, open(log, "wb") as out:
        launched = time.time()
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        own = 0.0
        while proc.poll() is None:
            own = max(own, tree_cpu(proc.pid))
            time.sleep(0.5)
    if proc.returncode != 0:
        raise RuntimeError(f"{name}: exit {proc.returncode}; see {log}: {log.read_text(errors='replace')[-2000:]}")
    nbytes, last = entry_bytes(cwd / "store", topics)
    steady = last - first_batch_start(cwd / "checkpoint")
    return Drain(name, steady, nbytes, meter.used["broker"], own, last - launched)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backlog-mb", type=float, default=600.0)
    parser.add_argument("--payload-size", type=int, default=1024)
    parser.add_argument("--batch-size", type=int, default=100, help="messages per batched entry")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--segment-mb", type=float, default=64)
    parser.add_argument("--block-size", type=int, default=8 << 20)
    parser.add_argument("--plain-rounds", type=int, default=5, help="plain drains, the best counts (default 5)")
    parser.add_argument("--env", help="a directory holding env/ and env.tar.gz (default: var/cluster-env/, packed)")
    parser.add_argument(
        "--submit-conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Spark setting added to README's spark-submit command (comparing settings; repeatable)",
    )
    add_work_arguments(parser)
    args = parser.parse_args(argv)
    work = new_work_dir(args.work_dir, "bench-cluster-")
    env_dir = Path(args.env).resolve() if args.env else packed_environment(standalone_recipe())
    print(
        f"cluster bench: load {os.getloadavg()[0]:.1f} {os.getloadavg()[1]:.1f} {os.getloadavg()[2]:.1f}; work {work}"
    )
    try:
        with EmbeddedBroker(work / "broker", default_partitions=0) as broker:
            summary = produce(
                broker.service_url,
                f"{NAMESPACE}/bench-cluster",
                int(args.backlog_mb * 1e6 / args.payload_size),
                args.payload_size,
                partitions=args.partitions,
                batching=True,
                batch_size=args.batch_size,
            )
            topics = list(summary.partitions)
            print(f"published {summary.messages:,} messages of {args.payload_size} B to {len(topics)} topic-partitions")
            assert broker.pid is not None
            best, drains = reference(broker.service_url, topics, args.plain_rounds, broker.pid)

            env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH") and "PYSPARK" not in k}
            local_conf = write_job_config(work, "local", broker.service_url, topics, args)
            local = run_job(
                "local[2] (spool)",
                [str(env_dir / "env" / "bin" / "streamoffload"), "run", "--once", "--conf", str(local_conf)],
                local_conf.parent,
                env,
                broker.pid,
                topics,
            )
            cluster_conf = write_job_config(work, "cluster", broker.service_url, topics, args)
            submit_dir = cluster_conf.parent
            for name in ("env", "env.tar.gz"):
                (submit_dir / name).symlink_to(env_dir / name)
            with StandaloneCluster(work / "spark-cluster", workers=2) as cluster:
                command = submit_command(standalone_recipe(), cluster.master_url, once=True)
                for setting in args.submit_conf:
                    command = command.replace("spark-submit ", f"spark-submit --conf {shlex.quote(setting)} ", 1)
                workers_before = sum(tree_cpu(w.pid) for w in cluster.worker_processes)
                on_cluster = run_job(
                    "standalone cluster, 2 workers (re-read)",
                    ["bash", "-euc", command],
                    submit_dir,
                    {**env, "SPARK_LOCAL_IP": "127.0.0.1"},
                    broker.pid,
                    topics,
                )
                # The executors (exited: counted in their worker's reaped children) and the workers themselves.
                worker_cpu = sum(tree_cpu(w.pid) for w in cluster.worker_processes) - workers_before
            on_cluster.own_cpu += worker_cpu
            for drain in drains:  # the drains count the same entry bytes the jobs stored
                drain.entry_bytes = local.entry_bytes
            if on_cluster.entry_bytes != local.entry_bytes:
                raise RuntimeError(f"the jobs stored {local.entry_bytes} and {on_cluster.entry_bytes} entry bytes")
            gb = local.entry_bytes / 1e9
            print(f"entry bytes {local.entry_bytes / 1e6:,.1f} MB ({gb:.3f} GB); every drain and job:")
            for d in drains:
                cpu = d.per_gb(d.broker_cpu)
                print(f"  {d.name:<42} {d.mbs:8.1f} MB/s  {d.seconds:6.1f} s  broker CPU {cpu:5.1f} s/GB")
            slowest = max(drains, key=lambda d: d.seconds)
            if slowest.seconds > 2 * best.seconds:
                print(f"  (the drains differ by more than 2x: {slowest.name} {slowest.seconds:.1f} s)")
            print(f"  reference: {best.name}, {best.mbs:.1f} MB/s")
            for job in (local, on_cluster):
                launch_mbs = job.entry_bytes / 1e6 / job.wall
                broker_ratio = job.broker_cpu / max(best.broker_cpu, 1e-9)
                print(
                    f"  {job.name:<42} {job.mbs:8.1f} MB/s steady ({launch_mbs:.1f} from launch, {job.wall:.1f} s)  "
                    f"÷ reference {job.mbs / best.mbs:.2f}  broker CPU {job.per_gb(job.broker_cpu):5.1f} s/GB "
                    f"(÷ reference's {broker_ratio:.2f})  job CPU {job.per_gb(job.own_cpu):.1f} s/GB"
                )
            print(
                f"  cluster ÷ local[2]: steady {on_cluster.mbs / local.mbs:.2f}, broker CPU per GB "
                f"{on_cluster.broker_cpu / max(local.broker_cpu, 1e-9):.2f}"
            )
            print(f"load after: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
