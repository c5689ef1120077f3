"""Chaos: SIGKILL the continuous offload job at random moments under steady traffic, then check the store.

Run from the repository root:

    .venv/bin/python bench/chaos.py --kills 20 --seed 1               # ~10 min on 2 shared cores
    .venv/bin/python bench/chaos.py --kills 3 --seed 1 --rate 100     # quick look, ~2-3 min
    .venv/bin/python bench/chaos.py --kills 20 --seed 1 --store s3    # against a local moto_server

What it does, in one work directory (a temporary one, removed at the end unless ``--keep``):

1. Starts the embedded pulsar-lite broker and a producer thread that publishes steadily (``--rate``
   messages/s over all topics) to three topic-partitions: ``<base>-a-partition-0/1`` with batching (up to
   20 messages per entry) and ``<base>-b`` without. Every payload is ``streamoffload.produce``'s
   reproducible ``b"<seq>:" + digest(topic, seq)``, so a stored message names its topic-partition and
   sequence number, and the checker tells missing, duplicated and corrupt messages apart. The producer
   talks to the broker only, so it keeps publishing while the job is down.
2. Runs the job as ``python -m streamoffload run --conf FILE`` in its own session (small segments:
   ``maxSizePerOffloadSegmentMbytes`` 0.05, blocks of 8192 bytes, rollover 3 s, trigger every second,
   metrics off, Spark UI off), and ``--kills`` times: waits until the job has made progress (a new
   micro-batch commit in the checkpoint's ``commits`` directory) and then a random
   delay (``--min-delay``..``--max-delay`` s; about one kill in five instead lands during the Spark
   start-up, before any progress), SIGKILLs the whole process group (the Spark JVM and its Python
   workers are children of the job), waits until no process of the group is left, and restarts at once.
   The RNG is seeded (``--seed``), so a run's kill moments and events can be replayed.
3. Among the kills, at seeded random places:
   - **policy edit (offline)**: between a kill and its restart, the configuration file is rewritten with
     another ``maxSizePerOffloadSegmentMbytes`` and block size;
   - **policy edit (live)**: once while the job runs (it re-reads the file without a restart);
   - **checkpoint deletion**: between a kill and its restart, the checkpoint directory is removed.
4. After the last kill it restarts the job, stops the producer, and polls the store until every
   topic-partition's last Offloaded segment reaches the last message id the broker acknowledged (the
   time from the last kill to that moment is "converge after last kill"; ``--converge-timeout``). Then it
   stops the job (SIGTERM, then waits), reads every Offloaded segment back (whole objects, codecs only),
   and compares with what the broker acknowledged, by (topic-partition, sequence number), and checks that
   each topic-partition's messages come back in the order they were published (one producer per
   topic-partition, so its sequence numbers only grow along the topic's positions). Finally it runs
   ``streamoffload cleanup --grace-minutes 0`` and checks that the store then holds only the objects the
   Offloaded segments name, and that cleanup removed no Offloaded segment.

It prints a table: kills (and survived: the job made progress again after the kill), messages published
(acknowledged), stored, missing, duplicated, corrupt, out of order, the time to converge after the last
kill, cleanup and wall time. The exit status is 1 when a message is missing, duplicated, corrupt or out of
order, when convergence timed out, or when cleanup failed, left orphans behind or removed an Offloaded
segment; 2 on bad arguments. The job's distinct error lines (last lines of tracebacks) and runs that
ended on their own are listed under the table; the job logs are kept in the work directory when the result
is not OK.

``run_chaos`` is the same as a function (the suite runs it with 3 kills: tests/job/test_chaos.py).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

# bench/chaos_processes.py sits beside this script; run from the repository root or imported as bench.chaos.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.chaos_processes import JobProcess, Producer, job_errors
from streamoffload.checkpoints import manifest as mf
from streamoffload.checkpoints.metadata_store import MetadataStore
from streamoffload.codecs.blocks import iter_blocks
from streamoffload.codecs.entry import entry_messages
from streamoffload.config import Config, load_config
from streamoffload.embedded_broker import EmbeddedBroker
from streamoffload.produce import expected_payload
from streamoffload.storage import keys
from streamoffload.storage.base import ObjectStore
from tests.fixtures.s3 import moto_endpoint, raw_s3_client

NAMESPACE = "persistent://public/default"
# (maxSizePerOffloadSegmentMbytes, managedLedgerOffloadMaxBlockSizeInBytes): the start, the offline edit,
# the live edit.
POLICIES = [(0.05, 8192), (0.08, 16384), (0.03, 8192)]
S3_BUCKET = "chaos"
S3_PREFIX = "offload"


# --- the report ---------------------------------------------------------------------------------------


@dataclass
class TopicCounts:
    published: int = 0
    """Messages the broker acknowledged."""
    stored: int = 0
    """Messages read back from Offloaded segments (duplicates included)."""
    missing: int = 0
    duplicated: int = 0
    """Stored messages beyond the first copy of their (topic-partition, sequence number)."""
    corrupt: int = 0
    """Stored messages whose bytes are not what was published under their sequence number."""
    out_of_order: int = 0
    """Places where a message's sequence number is below the one stored before it (first copies only: a
    duplicate counts as duplicated). One producer publishes each topic-partition, so the sequence numbers
    only grow along the topic's positions, and a reader must give them back in that order."""
    unacknowledged: int = 0
    """Stored messages whose send was never acknowledged (not an error: the broker may have kept them)."""
    first_missing: list[int] = field(default_factory=list)
    first_out_of_order: list[tuple[int, int]] = field(default_factory=list)
    """The first few ``(sequence number stored before, sequence number)`` pairs counted in ``out_of_order``."""


@dataclass
class ChaosReport:
    kills: int = 0
    kills_survived: int = 0
    startup_kills: int = 0
    """Kills that landed before the run had made any progress (during Spark start-up)."""
    events: list[str] = field(default_factory=list)
    topics: dict[str, TopicCounts] = field(default_factory=dict)
    converged: bool = False
    converge_seconds: float | None = None
    """From the last kill until every acknowledged message's position was in an Offloaded segment."""
    cleanup_removed: int | None = None
    """Items ``streamoffload cleanup --grace-minutes 0`` removed; None when it failed (``cleanup_error``)."""
    cleanup_error: str | None = None
    orphans_after_cleanup: int | None = None
    cleanup_dropped_segments: int = 0
    wall_seconds: float = 0.0
    job_exits: dict[str, int] = field(default_factory=dict)
    """Runs of the job that ended on their own (not killed by the harness): exit code and last log line,
    with how many runs ended so."""
    job_errors: list[str] = field(default_factory=list)
    """Error lines from the job's logs (e.g. a ReplayMismatchError), deduplicated."""
    segments: int = 0
    stop_exit: int | None = None
    """Exit status of the last run after the harness's SIGTERM (0: a clean stop; None: it had to be killed)."""

    def _sum(self, name: str) -> int:
        return sum(getattr(t, name) for t in self.topics.values())

    @property
    def published(self) -> int:
        return self._sum("published")

    @property
    def stored(self) -> int:
        return self._sum("stored")

    @property
    def missing(self) -> int:
        return self._sum("missing")

    @property
    def duplicated(self) -> int:
        return self._sum("duplicated")

    @property
    def corrupt(self) -> int:
        return self._sum("corrupt")

    @property
    def out_of_order(self) -> int:
        return self._sum("out_of_order")

    @property
    def ok(self) -> bool:
        return (
            self.converged
            and self.missing == 0
            and self.duplicated == 0
            and self.corrupt == 0
            and self.out_of_order == 0
            and self.cleanup_removed is not None
            and not self.orphans_after_cleanup
            and self.cleanup_dropped_segments == 0
        )

    def render(self) -> str:
        converge = (
            f"{self.converge_seconds:.1f} s" if self.converged and self.converge_seconds is not None else "TIMED OUT"
        )
        rows = [
            ("kills", f"{self.kills} ({self.startup_kills} during start-up)"),
            ("kills survived", f"{self.kills_survived} of {self.kills}"),
            ("published (acked)", f"{self.published:,}"),
            ("stored", f"{self.stored:,} in {self.segments} Offloaded segments"),
            ("missing", f"{self.missing:,}"),
            ("duplicated", f"{self.duplicated:,}"),
            ("corrupt", f"{self.corrupt:,}"),
            ("out of order", f"{self.out_of_order:,}"),
            ("converge after last kill", converge),
            (
                "cleanup",
                f"FAILED ({self.cleanup_error})"
                if self.cleanup_removed is None
                else f"removed {self.cleanup_removed}, orphans left {self.orphans_after_cleanup}, "
                f"Offloaded segments lost {self.cleanup_dropped_segments}",
            ),
            ("job stop (SIGTERM)", "killed after 90 s" if self.stop_exit is None else f"exit {self.stop_exit}"),
            ("wall time", f"{self.wall_seconds:.0f} s"),
            ("result", "OK" if self.ok else "FAILED"),
        ]
        width = max(len(name) for name, _ in rows)
        lines = [f"  {name:<{width}}  {value}" for name, value in rows]
        lines.append("  per topic-partition (published / stored / missing / duplicated / corrupt / out of order):")
        for topic, c in self.topics.items():
            extra = f"   first missing seq {c.first_missing}" if c.first_missing else ""
            if c.first_out_of_order:
                extra += "   first out of order " + ", ".join(f"{a} then {b}" for a, b in c.first_out_of_order)
            unacked = f"   ({c.unacknowledged} stored but never acknowledged)" if c.unacknowledged else ""
            lines.append(
                f"    {topic}: {c.published:,} / {c.stored:,} / {c.missing:,} / {c.duplicated:,} / {c.corrupt:,}"
                f" / {c.out_of_order:,}{extra}{unacked}"
            )
        if self.events:
            lines.append("  events: " + "; ".join(self.events))
        for exit_line, times in self.job_exits.items():
            lines.append(f"  job exited on its own ({times}x): {exit_line}")
        for error in self.job_errors[:5]:
            lines.append(f"  job error: {error}")
        if len(self.job_errors) > 5:
            lines.append(f"  ... and {len(self.job_errors) - 5} more distinct job errors")
        return "\n".join(lines)


def write_config(
    path: Path,
    service_url: str,
    topics: list[str],
    checkpoint: Path,
    store_toml: str,
    policy: tuple[float, int],
    *,
    rollover_s: float = 3,
) -> None:
    """Write the job's configuration atomically (a rename), so the running job never reads half a file.
    ``rollover_s``: ``maxOffloadSegmentRolloverTimeSeconds`` (bench/soak.py sets its own)."""
    segment_mb, block_size = policy
    topic_list = ", ".join(f'"{t}"' for t in topics)
    text = f"""# written by bench/chaos.py
[pulsar]
service_url = "{service_url}"
topics = [{topic_list}]
max_message_size = 4096  # lets the small blocks below through (the harness's entries are smaller)

{store_toml}

[spark]
checkpoint = "{checkpoint}"
trigger_interval = "1 second"

[spark.conf]
"spark.ui.enabled" = "false"
"spark.ui.showConsoleProgress" = "false"
"spark.local.dir" = "{path.parent / "spark-local"}"

[metrics]
address = ""

[offload]
maxSizePerOffloadSegmentMbytes = {segment_mb}
managedLedgerOffloadMaxBlockSizeInBytes = {block_size}
maxOffloadSegmentRolloverTimeSeconds = {rollover_s:g}
"""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


@contextlib.contextmanager
def _moto_server(log_dir: Path) -> Iterator[str]:
    """A local moto_server (S3) on a free port, with a bucket for the run."""
    with moto_endpoint(log_dir / "moto.log") as url:
        raw_s3_client(url).create_bucket(Bucket=S3_BUCKET)
        yield url


# --- progress and convergence ---------------------------------------------------------------------------


def _latest_commit(checkpoint: Path) -> float | None:
    """The newest micro-batch commit's mtime in the job's checkpoint: Spark's ``commits`` directory, at the
    checkpoint's top or one level down (the job may keep one query checkpoint per run). 0 when the directory
    is empty, None when there is none."""
    latest: float | None = None
    for commits in (checkpoint / "commits", *checkpoint.glob("*/commits")):
        with contextlib.suppress(OSError):
            for entry in os.scandir(commits):
                latest = latest or 0.0
                if not entry.name.startswith("."):
                    latest = max(latest, entry.stat().st_mtime)
    return latest


def _offloaded(meta: MetadataStore, topics: list[str]) -> dict[str, list[mf.SegmentManifest]]:
    return {t: meta.offloaded_segments(t) for t in topics}


def _segment_count(meta: MetadataStore, topics: list[str]) -> int:
    """Offloaded segments, for the log lines (reads every manifest)."""
    return sum(len(s) for s in _offloaded(meta, topics).values())


def _caught_up(meta: MetadataStore, last_ids: dict[str, tuple[int, int] | None]) -> bool:
    for topic, last in last_ids.items():
        if last is None:
            continue
        segments = meta.offloaded_segments(topic)
        if not segments or mf.end_position(segments[-1]) < last:
            return False
    return True


# --- reading back ---------------------------------------------------------------------------------------


def read_payloads(store: ObjectStore, meta: MetadataStore, topic: str) -> Iterator[bytes]:
    """Every message payload in the topic-partition's Offloaded segments, in order (whole-object reads)."""
    for manifest in meta.offloaded_segments(topic):
        for block in iter_blocks(store.get(manifest.dataKey)):
            for entry in block.entries:
                for message in entry_messages(entry.payload):
                    yield bytes(message.payload)


def check_store(
    store: ObjectStore, meta: MetadataStore, producer: Producer, payload_size: int
) -> dict[str, TopicCounts]:
    """Per topic-partition: what was acknowledged against what the store holds, in the store's order."""
    out: dict[str, TopicCounts] = {}
    for topic, tr in producer.traffic.items():
        counts = TopicCounts(published=len(tr.acked))
        seen: Counter[int] = Counter()
        previous: int | None = None  # the last first copy's sequence number, in stored order
        for payload in read_payloads(store, meta, topic):
            counts.stored += 1
            head, sep, _ = payload.partition(b":")
            if not sep or not head.isdigit():
                counts.corrupt += 1
                continue
            seq = int(head)
            if payload != expected_payload(topic, seq, payload_size):
                counts.corrupt += 1
                continue
            if seq not in seen:
                if previous is not None and seq < previous:
                    counts.out_of_order += 1
                    if len(counts.first_out_of_order) < 5:
                        counts.first_out_of_order.append((previous, seq))
                previous = seq
            seen[seq] += 1
        counts.duplicated = sum(n - 1 for n in seen.values() if n > 1)
        missing = sorted(tr.acked - set(seen))
        counts.missing = len(missing)
        counts.first_missing = missing[:5]
        counts.unacknowledged = len(set(seen) - tr.acked)
        out[topic] = counts
    return out


def _store_keys(store: ObjectStore, prefix: str) -> set[str]:
    return {info.key for info in store.list(f"{prefix}/" if prefix else "")}


# --- the run --------------------------------------------------------------------------------------------


def _plan(rng: random.Random, kills: int) -> tuple[int, int, int]:
    """(kill index followed by the offline policy edit, kill index followed by the checkpoint deletion,
    run index during which the live policy edit happens). Kill ``i`` ends run ``i``; run 0 is the first."""
    middle = list(range(1, kills)) if kills >= 3 else list(range(kills))
    policy_kill, checkpoint_kill = rng.sample(middle, 2)
    live_run = rng.randrange(1, kills) if kills >= 2 else 0
    return policy_kill, checkpoint_kill, live_run


def run_chaos(
    workdir: Path,
    kills: int = 5,
    seed: int = 1,
    *,
    rate: float = 200.0,
    payload_size: int = 200,
    store: str = "fs",
    service_url: str | None = None,
    min_delay: float = 0.0,
    max_delay: float = 6.0,
    startup_kill_chance: float = 0.2,
    startup_timeout: float = 180.0,
    converge_timeout: float = 240.0,
    log: Callable[[str], None] = print,
) -> ChaosReport:
    """Run the chaos described in this module's docstring under ``workdir`` and return its report.

    ``service_url``: an already running broker (topics get unique names); by default an embedded
    pulsar-lite broker is started under ``workdir``. ``store``: ``fs`` or ``s3`` (a local moto_server).
    """
    if kills < 2:
        raise ValueError(f"kills must be >= 2 (a policy edit and a checkpoint deletion among them), got {kills}")
    if store not in ("fs", "s3"):
        raise ValueError(f"store must be 'fs' or 's3', got {store!r}")
    workdir.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        if service_url is None:
            broker = stack.enter_context(EmbeddedBroker(workdir / "broker", default_partitions=0))
            service_url = broker.service_url
        env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
        if store == "s3":
            endpoint = stack.enter_context(_moto_server(workdir))
            for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
                os.environ.setdefault(key, "testing")
                env.setdefault(key, "testing")
            store_toml = (
                f'[store]\nmanagedLedgerOffloadDriver = "s3"\nbucket = "{S3_BUCKET}"\nprefix = "{S3_PREFIX}"\n'
                f'serviceEndpoint = "{endpoint}"\nregion = "us-east-1"\npathStyle = true'
            )
        else:
            store_toml = f'[store]\nmanagedLedgerOffloadDriver = "filesystem"\nroot = "{workdir / "store"}"'
        return _run(
            workdir,
            kills,
            seed,
            rate=rate,
            payload_size=payload_size,
            service_url=service_url,
            store_toml=store_toml,
            env=env,
            delays=(min_delay, max_delay),
            startup_kill_chance=startup_kill_chance,
            startup_timeout=startup_timeout,
            converge_timeout=converge_timeout,
            log=log,
        )
    raise AssertionError("unreachable")  # ExitStack does not swallow exceptions


def _run(
    workdir: Path,
    kills: int,
    seed: int,
    *,
    rate: float,
    payload_size: int,
    service_url: str,
    store_toml: str,
    env: dict[str, str],
    delays: tuple[float, float],
    startup_kill_chance: float,
    startup_timeout: float,
    converge_timeout: float,
    log: Callable[[str], None],
) -> ChaosReport:
    started = time.monotonic()
    rng = random.Random(seed)
    report = ChaosReport()
    base = f"{NAMESPACE}/chaos-{uuid.uuid4().hex[:8]}"
    topics = {f"{base}-a-partition-0": True, f"{base}-a-partition-1": True, f"{base}-b": False}
    topic_list = list(topics)
    conf = workdir / "chaos.toml"
    checkpoint = workdir / "checkpoint"
    logs = workdir / "logs"
    logs.mkdir(exist_ok=True)
    write_config(conf, service_url, topic_list, checkpoint, store_toml, POLICIES[0])
    config: Config = load_config(conf)
    object_store = config.store.open()
    meta = MetadataStore(object_store, config.store.key_prefix)
    policy_kill, checkpoint_kill, live_run = _plan(rng, kills)
    log(
        f"chaos: {kills} kills, seed {seed}, {rate:g} msg/s of {payload_size} B to {len(topics)} topic-partitions "
        f"({base}-a-partition-0/1 batched, {base}-b not); offline policy edit after kill {policy_kill + 1}, "
        f"checkpoint deletion after kill {checkpoint_kill + 1}, live policy edit in run {live_run}; work dir {workdir}"
    )

    producer = Producer(service_url, topics, rate, payload_size).start()
    runs = 0
    job: JobProcess | None = None
    progress_after_kill: list[bool] = []
    last_kill_at = 0.0

    def spawn() -> JobProcess:
        nonlocal runs
        runs += 1
        return JobProcess(conf, logs / f"job-{runs:03d}.log", env)

    def progressed(run: JobProcess) -> bool:
        """A micro-batch committed since this run started (manifests are no sign: a batch writes them before
        its commit, and the job's start-up recovery writes some too)."""
        latest = _latest_commit(checkpoint)
        return latest is not None and latest > run.started_wall

    def note_exit(run: JobProcess) -> None:
        text = f"exit {run.proc.returncode}: {run.last_line()}"
        report.job_exits[text] = report.job_exits.get(text, 0) + 1

    def watch(until: float, *, stop_on_progress: bool) -> bool:
        """Wait until ``until`` (or the first progress); a job that ended on its own is noted and restarted."""
        nonlocal job
        made = False
        while time.monotonic() < until:
            assert job is not None
            if not job.running():
                note_exit(job)
                time.sleep(2.0)
                job = spawn()
                continue
            if not made and progressed(job):
                made = True
                if stop_on_progress:
                    break
            time.sleep(0.2)
        return made

    try:
        job = spawn()
        for kill in range(kills):
            # The run with the live policy edit is always killed after progress (the edit needs a running job).
            during_startup = rng.random() < startup_kill_chance and kill != live_run
            if during_startup:
                made_progress = watch(job.started + rng.uniform(2.0, 8.0), stop_on_progress=False)
            else:
                made_progress = watch(job.started + startup_timeout, stop_on_progress=True)
                if made_progress and kill == live_run:
                    policy = POLICIES[2]
                    write_config(conf, service_url, topic_list, checkpoint, store_toml, policy)
                    report.events.append(f"run {kill}: live policy edit to {policy[0]} MB / {policy[1]} B blocks")
                    # The job re-reads the file at most every second, then a trigger applies it.
                    watch(time.monotonic() + 3.0, stop_on_progress=False)
                elif kill == live_run:
                    report.events.append(f"run {kill}: live policy edit skipped (the job made no progress)")
                watch(time.monotonic() + rng.uniform(*delays), stop_on_progress=False)
                made_progress = made_progress or progressed(job)
            if progress_after_kill and made_progress:
                # The previous kills are survived: the job came back and made progress after them.
                progress_after_kill = [True] * len(progress_after_kill)
            if not job.running():
                note_exit(job)
            job.kill()
            last_kill_at = time.monotonic()
            report.kills += 1
            report.startup_kills += not made_progress
            progress_after_kill.append(False)
            what = "during start-up" if not made_progress else "after progress"
            if kill == policy_kill:
                policy = POLICIES[1]
                write_config(conf, service_url, topic_list, checkpoint, store_toml, policy)
                report.events.append(f"kill {kill + 1}: policy edit to {policy[0]} MB / {policy[1]} B blocks")
            if kill == checkpoint_kill:
                shutil.rmtree(checkpoint, ignore_errors=True)
                report.events.append(f"kill {kill + 1}: checkpoint deleted")
            log(
                f"  kill {kill + 1}/{kills} {what} at {time.monotonic() - started:6.1f} s "
                f"(run {kill} lived {last_kill_at - job.started:.1f} s; {producer.acked_total():,} messages acked, "
                f"{_segment_count(meta, topic_list)} segments offloaded)"
            )
            job = spawn()

        # The last restart is running: stop the traffic and wait until the store has all of it.
        producer.stop()
        last_ids = {t: tr.last_id for t, tr in producer.traffic.items()}
        log(f"  producer stopped: {producer.acked_total():,} messages acked; waiting for the store to converge")
        deadline = last_kill_at + converge_timeout
        while time.monotonic() < deadline:
            if _caught_up(meta, last_ids):
                report.converged = True
                report.converge_seconds = time.monotonic() - last_kill_at
                break
            watch(time.monotonic() + 1.0, stop_on_progress=False)
        if progressed(job) or report.converged:
            progress_after_kill = [True] * len(progress_after_kill)
        report.kills_survived = sum(progress_after_kill)
        log(
            "  converged "
            + (f"{report.converge_seconds:.1f} s after the last kill" if report.converged else "NOT (timed out)")
            + "; stopping the job"
        )
    finally:
        if job is not None:
            report.stop_exit = job.terminate()
        with contextlib.suppress(RuntimeError):
            producer.stop()

    report.job_errors = job_errors(logs)
    report.topics = check_store(object_store, meta, producer, payload_size)
    segments_before = {mf.manifest_uuid(s) for segs in _offloaded(meta, topic_list).values() for s in segs}
    report.segments = len(segments_before)

    cleanup = subprocess.run(
        [sys.executable, "-m", "streamoffload", "cleanup", "--conf", str(conf), "--grace-minutes", "0"],
        env=env,
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=300,
    )
    removed = re.search(r"cleanup: (\d+) item\(s\) removed", cleanup.stdout)
    if cleanup.returncode != 0 or removed is None:
        last = [x for x in (cleanup.stderr + cleanup.stdout).splitlines() if x.strip()] or ["(no output)"]
        report.cleanup_error = f"exit {cleanup.returncode}: {last[-1][:400]}"
    else:
        report.cleanup_removed = int(removed.group(1))
        offloaded = _offloaded(meta, topic_list)
        segments_after = {mf.manifest_uuid(s) for segs in offloaded.values() for s in segs}
        report.cleanup_dropped_segments = len(segments_before - segments_after)
        referenced = {
            k
            for segs in offloaded.values()
            for s in segs
            for k in (
                s.dataKey,
                s.indexKey,
                *(keys.block_checksums_key(s.dataKey, n) for n in range(1, mf.checksum_blocks(s) + 1)),
            )
        }
        # Besides metadata (a key component starting with "_"), a converged store holds exactly those objects.
        data_keys = {
            k
            for k in _store_keys(object_store, config.store.key_prefix)
            if not any(part.startswith("_") for part in k.split("/"))
        }
        report.orphans_after_cleanup = len(data_keys - referenced)
    report.wall_seconds = time.monotonic() - started
    return report


# --- main -----------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="bench/chaos.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--kills", type=int, default=20, help="SIGKILLs of the job (default 20; at least 3)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the kill moments and events (default 1)")
    parser.add_argument("--rate", type=float, default=200.0, help="messages/s over all topics (default 200)")
    parser.add_argument("--payload-size", type=int, default=200, help="bytes per message (default 200)")
    parser.add_argument("--store", choices=["fs", "s3"], default="fs", help="filesystem, or S3 on a local moto_server")
    parser.add_argument("--min-delay", type=float, default=0.0, help="seconds after progress before a kill, low end")
    parser.add_argument("--max-delay", type=float, default=6.0, help="... high end (default 6)")
    parser.add_argument(
        "--converge-timeout", type=float, default=240.0, help="seconds after the last kill to converge (default 240)"
    )
    parser.add_argument("--work-dir", help="parent of the temporary work directory (default: the system's)")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (job logs under logs/)")
    args = parser.parse_args(argv)
    if args.kills < 3:
        parser.error("--kills must be at least 3 (a policy edit and a checkpoint deletion among them)")
    if args.rate <= 0 or args.payload_size < 16:
        parser.error("--rate must be > 0 and --payload-size at least 16")
    if not 0 <= args.min_delay <= args.max_delay:
        parser.error("--min-delay must be between 0 and --max-delay")

    # On SIGTERM, unwind through the finally blocks: they stop the job, the producer and the broker.
    signal.signal(signal.SIGTERM, lambda _signum, _frame: sys.exit(143))
    if args.work_dir:
        os.makedirs(args.work_dir, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="bench-chaos-", dir=args.work_dir))
    print(f"chaos bench: Python {sys.version.split()[0]}, {os.cpu_count()} CPUs, store {args.store}", flush=True)
    report = ChaosReport()
    try:
        report = run_chaos(
            work,
            args.kills,
            args.seed,
            rate=args.rate,
            payload_size=args.payload_size,
            store=args.store,
            min_delay=args.min_delay,
            max_delay=args.max_delay,
            converge_timeout=args.converge_timeout,
            log=lambda line: print(line, flush=True),
        )
        print(report.render())
    except BaseException:
        args.keep = True
        raise
    finally:
        if args.keep or not report.ok:
            print(f"kept {work} (job logs in {work / 'logs'})")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
