"""Chaos: mixed faults at random moments under steady traffic (job, broker and store), then check the store.

Run from the repository root:

    .venv/bin/python bench/chaos.py --faults 100 --seed 1 --rate 2000             # filesystem store
    .venv/bin/python bench/chaos.py --faults 100 --seed 1 --rate 2000 --store s3   # moto behind the fault proxy
    .venv/bin/python bench/chaos.py --faults 10 --seed 1 --rate 100                # quick look, ~3 min
    .venv/bin/python bench/chaos.py --kills 20 --seed 1                            # job kills and edits only

What it does, in one work directory (a temporary one, removed at the end unless ``--keep``):

1. Starts its own pulsar-lite broker (``streamoffload.embedded_broker``, data under the work directory) and a
   producer thread that publishes steadily (``--rate`` messages/s over all topics) to three
   topic-partitions: ``<base>-a-partition-0/1`` with batching (up to 20 messages per entry) and ``<base>-b``
   without. Every payload is ``streamoffload.produce``'s reproducible ``b"<seq>:" + digest(topic, seq)``, so
   a stored message names its topic-partition and sequence number, and the checker tells missing,
   duplicated and corrupt messages apart. Only messages the broker acknowledged count; the producer rides
   out broker restarts (pulsar-client reconnects and re-sends what is pending).
2. Runs the job as ``python -m streamoffload run --conf FILE`` in its own session (small segments, blocks
   of 8192 bytes, rollover 3 s, trigger every second, metrics and Spark UI off). With ``--store s3`` the
   job talks to moto through the fault proxy (bench/s3_fault_proxy.py); the harness reads moto directly.
3. ``--faults N`` times, drawn at seeded random (bench/chaos_faults.py: every kind at least once when N
   allows): waits until the job has made progress (a new micro-batch commit in Spark's checkpoint) and a
   random delay (``--min-delay``..``--max-delay`` s), then injects one fault: SIGKILL of the job (after
   progress, during start-up, or in the middle of a segment commit), SIGKILL of the broker and a restart on
   the same data, a full disk (filesystem store) or S3 faults (500, 503 SlowDown, connection resets, hangs
   beyond the client's timeout, slow answers), deletion of Spark's checkpoint, a policy edit while running
   or while stopped. A fault is **survived** when the job makes progress again after it without the harness
   having to restart a job that stopped on its own. ``--kills N`` is the original run: job kills, policy
   edits and checkpoint deletions only.
4. After the last fault it stops the producer and polls the store until every topic-partition's last
   Offloaded segment reaches the last message id the broker acknowledged (the time from the end of the
   last fault to that moment is "converge after last fault"; ``--converge-timeout``). Then it stops the job
   (SIGTERM), reads every Offloaded segment back (whole objects, codecs only: not the job's reader) and
   compares with what the broker acknowledged, by (topic-partition, sequence number) and position: every
   acknowledged message stored, no position stored twice, each topic-partition's messages in the order
   published. A message the broker holds at two positions (the producer re-sent it after a broker restart
   lost its acknowledgement) is stored at both, as the broker holds it: counted as "re-published", not as
   duplicated. It runs ``streamoffload verify --crc`` (must be clean), then ``streamoffload cleanup
   --grace-minutes 0`` and checks that the store then holds only the objects the Offloaded segments name.

It prints a table per fault kind (count, survived) and the totals. The exit status is 1 when a message is
missing, duplicated, corrupt or out of order, when convergence timed out, when ``verify`` or cleanup failed
or cleanup left orphans or removed an Offloaded segment; 2 on bad arguments. The job's distinct error lines
and runs that ended on their own are listed under the table; the job logs are kept when the result is not OK.

``run_chaos`` is the same as a function (the suite runs it with 10 faults: tests/bench/test_chaos.py).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
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

from streamoffload.storage.location import ScopedStore

# bench/ modules sit beside this script; run from the repository root or imported as bench.chaos.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.chaos_faults import AFTER_PROGRESS, CRASH_POINTS, KILL_KINDS, kinds_for, plan_faults
from bench.chaos_processes import JobProcess, Producer, job_errors
from bench.harness import fs_store_section, moto_bucket, moto_credentials, s3_store_section, store_toml
from bench.s3_fault_proxy import Fault, S3FaultProxy
from streamoffload.checkpoints import manifest as mf
from streamoffload.checkpoints.metadata_store import MetadataStore
from streamoffload.codecs.blocks import iter_blocks
from streamoffload.codecs.checksums import BlockChecksums
from streamoffload.codecs.entry import entry_messages
from streamoffload.codecs.index import OffloadIndex
from streamoffload.codecs.proto.offload_manifest_pb2 import SegmentManifest
from streamoffload.config import Config, load_config
from streamoffload.embedded_broker import EmbeddedBroker
from streamoffload.produce import expected_payload
from streamoffload.storage import keys
from streamoffload.storage.base import ObjectStore
from streamoffload.storage.filesystem import DISK_FULL_FLAG_ENV
from streamoffload.streaming.runtime.faults import CRASH_ARM

NAMESPACE = "persistent://public/default"
# (maxSizePerOffloadSegmentMbytes, managedLedgerOffloadMaxBlockSizeInBytes) at 200 msg/s: the edits cycle
# through them. Faster traffic scales them (``policies_for``), so a topic seals about as many segments a second.
POLICIES = [(0.05, 8192), (0.08, 16384), (0.03, 8192)]


def policies_for(rate: float) -> list[tuple[float, int]]:
    """``POLICIES`` scaled to the traffic: at 2,000 msg/s segments of 0.3-0.8 MB, not thousands of 50 KB ones a
    minute (each a data object, an index, a manifest, a commit and a checksum record per block)."""
    scale = max(1.0, rate / 200.0)
    return [(round(mb * scale, 3), int(block * scale)) for mb, block in POLICIES]


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
    """Stored messages beyond the first copy of their (topic-partition, sequence number) at one position:
    what the job wrote twice."""
    republished: int = 0
    """Copies of a sequence number at further positions: the broker holds the message twice (the producer
    re-sent it after a reconnect), and the store holds it as the broker does. Not an error."""
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
class FaultCounts:
    injected: int = 0
    survived: int = 0


@dataclass
class ChaosReport:
    faults: dict[str, FaultCounts] = field(default_factory=dict)
    """Per fault kind, in the order first injected."""
    events: list[str] = field(default_factory=list)
    topics: dict[str, TopicCounts] = field(default_factory=dict)
    converged: bool = False
    converge_seconds: float | None = None
    """From the end of the last fault until every acknowledged message's position was in an Offloaded segment."""
    verify_error: str | None = None
    """``streamoffload verify --crc``'s complaint (None: clean, or not run yet: see ``verify_ran``)."""
    verify_ran: bool = False
    cleanup_removed: int | None = None
    """Items ``streamoffload cleanup --grace-minutes 0`` removed; None when it failed (``cleanup_error``)."""
    cleanup_error: str | None = None
    orphans_after_cleanup: int | None = None
    cleanup_dropped_segments: int = 0
    cleanup_damage: list[str] = field(default_factory=list)
    """What cleanup took from the committed segments (``cleanup_damage``): each object one names that is gone or
    no longer reads back, and any difference in what reads back against before cleanup."""
    wall_seconds: float = 0.0
    job_runs: int = 0
    job_exits: dict[str, int] = field(default_factory=dict)
    """Runs of the job that ended on their own (not killed by the harness or its crash point): exit code and
    last log line, with how many runs ended so."""
    job_errors: list[str] = field(default_factory=list)
    """Error lines from the job's logs (e.g. a ReplayMismatchError), deduplicated."""
    segments: int = 0
    stop_exit: int | None = None
    """Exit status of the last run after the harness's SIGTERM (0: a clean stop; None: it had to be killed)."""

    def _sum(self, name: str) -> int:
        return sum(getattr(t, name) for t in self.topics.values())

    @property
    def injected(self) -> int:
        return sum(c.injected for c in self.faults.values())

    @property
    def survived(self) -> int:
        return sum(c.survived for c in self.faults.values())

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
    def republished(self) -> int:
        return self._sum("republished")

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
            and self.verify_ran
            and self.verify_error is None
            and self.cleanup_removed is not None
            and not self.orphans_after_cleanup
            and self.cleanup_dropped_segments == 0
            and not self.cleanup_damage
        )

    def render(self) -> str:
        converge = (
            f"{self.converge_seconds:.1f} s" if self.converged and self.converge_seconds is not None else "TIMED OUT"
        )
        lines = ["  fault kind           injected  survived"]
        for kind, fault in self.faults.items():
            lines.append(f"  {kind:<20} {fault.injected:>8}  {fault.survived:>8}")
        lines.append(f"  {'all':<20} {self.injected:>8}  {self.survived:>8}")
        verify = (
            "not run" if not self.verify_ran else (f"FAILED ({self.verify_error})" if self.verify_error else "clean")
        )
        rows = [
            ("published (acked)", f"{self.published:,}"),
            ("stored", f"{self.stored:,} in {self.segments} Offloaded segments"),
            ("missing", f"{self.missing:,}"),
            ("duplicated", f"{self.duplicated:,}"),
            ("re-published by the producer", f"{self.republished:,} (held twice by the broker; stored as held)"),
            ("corrupt", f"{self.corrupt:,}"),
            ("out of order", f"{self.out_of_order:,}"),
            ("converge after last fault", converge),
            ("verify --crc", verify),
            (
                "cleanup",
                f"FAILED ({self.cleanup_error})"
                if self.cleanup_removed is None
                else f"removed {self.cleanup_removed}, orphans left {self.orphans_after_cleanup}, "
                f"Offloaded segments lost {self.cleanup_dropped_segments}, "
                + (
                    f"DAMAGED {len(self.cleanup_damage)}: {'; '.join(self.cleanup_damage[:3])}"
                    if self.cleanup_damage
                    else "every committed segment's objects read back"
                ),
            ),
            ("job runs", f"{self.job_runs} ({sum(self.job_exits.values())} ended on their own)"),
            ("job stop (SIGTERM)", "killed after 90 s" if self.stop_exit is None else f"exit {self.stop_exit}"),
            ("wall time", f"{self.wall_seconds:.0f} s"),
            ("result", "OK" if self.ok else "FAILED"),
        ]
        width = max(len(name) for name, _ in rows)
        lines += [f"  {name:<{width}}  {value}" for name, value in rows]
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
            lines.append(f"  events ({len(self.events)}): " + "; ".join(self.events[:12]))
            if len(self.events) > 12:
                lines.append(f"    ... and {len(self.events) - 12} more (the log lines above)")
        for exit_line, times in self.job_exits.items():
            lines.append(f"  job exited on its own ({times}x): {exit_line}")
        for error in self.job_errors[:8]:
            lines.append(f"  job error: {error}")
        if len(self.job_errors) > 8:
            lines.append(f"  ... and {len(self.job_errors) - 8} more distinct job errors")
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
    spark_conf: dict[str, str] | None = None,
) -> None:
    """Write the job's configuration atomically (a rename), so the running job never reads half a file.
    ``rollover_s``: ``maxOffloadSegmentRolloverTimeSeconds`` (bench/soak.py sets its own); ``spark_conf``: more
    Spark settings (bench/soak.py's ``--java-options``)."""
    segment_mb, block_size = policy
    topic_list = ", ".join(f'"{t}"' for t in topics)
    more_conf = "".join(f"{json.dumps(k)} = {json.dumps(v)}\n" for k, v in (spark_conf or {}).items())
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
{more_conf}
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


def _offloaded(meta: MetadataStore, topics: list[str]) -> dict[str, list[SegmentManifest]]:
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

Position = tuple[int, int, int]
"""(ledger id, entry id, index in the entry's batch)."""


def read_payloads(store: ObjectStore, meta: MetadataStore, topic: str) -> Iterator[tuple[Position, bytes]]:
    """Every message of the topic-partition's Offloaded segments with its position, in stored order
    (whole-object reads and the codecs: not the job's reader)."""
    for manifest in meta.offloaded_segments(topic):
        v1_ledger = manifest.startLedgerId if manifest.formatVersion == 1 else None
        for block in iter_blocks(store.get(manifest.dataKey)):
            ledger = block.header.ledger_id if block.header.ledger_id is not None else v1_ledger
            for entry in block.entries:
                for index, message in enumerate(entry_messages(entry.payload)):
                    yield (ledger or 0, entry.entry_id, index), bytes(message.payload)


def check_store(
    store: ObjectStore, meta: MetadataStore, producer: Producer, payload_size: int
) -> dict[str, TopicCounts]:
    """Per topic-partition: what was acknowledged against what the store holds, in the store's order. A
    message is its (topic-partition, sequence number); each copy of it is told apart by its position."""
    out: dict[str, TopicCounts] = {}
    for topic, tr in producer.traffic.items():
        counts = TopicCounts(published=len(tr.acked))
        seen: Counter[int] = Counter()
        copies: Counter[tuple[int, Position]] = Counter()
        previous: int | None = None  # the last first copy's sequence number, in stored order
        for position, payload in read_payloads(store, meta, topic):
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
            copies[(seq, position)] += 1
        # The same position twice is the job's doing; the same message at another position is the broker's.
        counts.duplicated = sum(n - 1 for n in copies.values() if n > 1)
        counts.republished = sum(n - 1 for n in seen.values() if n > 1) - counts.duplicated
        missing = sorted(tr.acked - set(seen))
        counts.missing = len(missing)
        counts.first_missing = missing[:5]
        counts.unacknowledged = len(set(seen) - tr.acked)
        out[topic] = counts
    return out


def _store_keys(scoped: ScopedStore) -> set[str]:
    return {info.key for info in scoped.store.list(f"{scoped.prefix}/" if scoped.prefix else "")}


def segment_objects(manifest: SegmentManifest) -> list[str]:
    """Every object a committed segment names: its data, its index, its block checksum records."""
    records = (keys.block_checksums_key(manifest.dataKey, n) for n in range(1, mf.checksum_blocks(manifest) + 1))
    return [manifest.dataKey, manifest.indexKey, *records]


def cleanup_damage(store: ObjectStore, offloaded: dict[str, list[SegmentManifest]]) -> list[str]:
    """Each object a committed segment names that is gone or does not read back, as ``key: why``: the data object
    is there (its content is read back by ``check_store``), the index decodes, each checksum record decodes."""
    damage: list[str] = []
    for segments in offloaded.values():
        for manifest in segments:
            v1_ledger = manifest.startLedgerId if manifest.formatVersion == 1 else None
            data, index, *records = segment_objects(manifest)
            try:
                store.head(data)
                OffloadIndex.decode(store.get(index), ledger_id=v1_ledger)
                for key in records:
                    BlockChecksums.decode(store.get(key), where=key)
            except Exception as err:  # a missing object (ObjectNotFoundError) or one that no longer decodes
                damage.append(f"{mf.manifest_uuid(manifest)}: {type(err).__name__}: {err}")
    return damage


# --- the run --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ChaosSettings:
    faults: int = 10
    seed: int = 1
    kinds: tuple[str, ...] | None = None
    """Fault kinds to draw from (default: every kind the store allows)."""
    rate: float = 200.0
    payload_size: int = 200
    store: str = "fs"
    min_delay: float = 0.0
    max_delay: float = 6.0
    startup_timeout: float = 180.0
    """How long to wait for the job's progress after a fault (a Spark start-up on a loaded machine)."""
    converge_timeout: float = 240.0
    cli_timeout: float = 600.0
    """How long ``verify --crc`` and ``cleanup`` may take (each reads the whole store: moto serves millions of
    messages slowly)."""
    s3_hang_s: float = 70.0
    """How long the proxy holds a hung S3 request: beyond the job's S3 read timeout (60 s), by default."""
    overlap: bool = False
    """Wait for the job's progress only before the faults that need a running job (``AFTER_PROGRESS``): the
    others may land while it starts up or recovers, as in real life (the suite's short run)."""


def run_chaos(
    workdir: Path, settings: ChaosSettings, *, service_url: str | None = None, log: Callable[[str], None] = print
) -> ChaosReport:
    """Run the chaos described in this module's docstring under ``workdir`` and return its report.

    ``service_url``: an already running broker (topics get unique names; no ``broker-kill`` then); by default
    the run starts its own pulsar-lite broker under ``workdir``. ``settings.store``: ``fs`` or ``s3`` (a local
    moto_server behind the fault proxy)."""
    if settings.store not in ("fs", "s3"):
        raise ValueError(f"store must be 'fs' or 's3', got {settings.store!r}")
    workdir.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        broker: EmbeddedBroker | None = None
        if service_url is None:
            broker = stack.enter_context(EmbeddedBroker(workdir / "broker", default_partitions=0))
            service_url = broker.service_url
        env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
        # Every run can be armed to crash inside a commit (job-kill-commit) while it runs: no extra start-up.
        env |= {
            "STREAMOFFLOAD_CRASH_AT": "armed",
            CRASH_ARM: str(workdir / "crash-arm"),
            "STREAMOFFLOAD_CRASH_DIR": str(workdir / "crash"),
        }
        proxy: S3FaultProxy | None = None
        if settings.store == "s3":
            endpoint = stack.enter_context(moto_bucket(workdir / "moto.log", S3_BUCKET))
            proxy = stack.enter_context(S3FaultProxy(endpoint, seed=settings.seed))
            moto_credentials(env)
            job_store = store_toml(s3_store_section(proxy.url, S3_BUCKET, S3_PREFIX))
            harness_store = store_toml(s3_store_section(endpoint, S3_BUCKET, S3_PREFIX))
        else:
            job_store = harness_store = store_toml(fs_store_section(workdir / "store"))
            env[DISK_FULL_FLAG_ENV] = str(workdir / "disk-full")  # the job's writes fail while this file exists
        chaos = _Chaos(workdir, settings, service_url, broker, proxy, env, job_store, harness_store, log)
        return chaos.run()
    raise AssertionError("unreachable")  # ExitStack does not swallow exceptions


class _Chaos:
    """One chaos run: the harness's state and its fault injectors."""

    def __init__(
        self,
        workdir: Path,
        settings: ChaosSettings,
        service_url: str,
        broker: EmbeddedBroker | None,
        proxy: S3FaultProxy | None,
        env: dict[str, str],
        job_store: str,
        harness_store: str,
        log: Callable[[str], None],
    ) -> None:
        self.workdir = workdir
        self.s = settings
        self.service_url = service_url
        self.broker = broker
        self.proxy = proxy
        self.env = env
        self.job_store = job_store
        self.log = log
        self.rng = random.Random(settings.seed)
        self.report = ChaosReport()
        base = f"{NAMESPACE}/chaos-{uuid.uuid4().hex[:8]}"
        self.base = base
        self.topics = {f"{base}-a-partition-0": True, f"{base}-a-partition-1": True, f"{base}-b": False}
        self.topic_list = list(self.topics)
        self.conf = workdir / "chaos.toml"
        self.harness_conf = workdir / "harness.toml"
        self.checkpoint = workdir / "checkpoint"
        self.logs = workdir / "logs"
        self.logs.mkdir(exist_ok=True)
        self.policy = 0
        self.policies = policies_for(settings.rate)
        write_config(self.conf, service_url, self.topic_list, self.checkpoint, job_store, self.policies[0])
        write_config(
            self.harness_conf, service_url, self.topic_list, workdir / "unused", harness_store, self.policies[0]
        )
        self.config: Config = load_config(self.harness_conf)
        self.scoped = self.config.store.location.open()
        self.store = self.scoped.store
        self.meta = MetadataStore(self.scoped)
        self.job: JobProcess | None = None
        self.runs = 0
        self.pending: list[tuple[str, float]] = []
        """Faults not yet survived, with when they ended (wall clock)."""
        self.started = time.monotonic()

    # -- the job ------------------------------------------------------------------------------------

    def spawn(self, extra_env: dict[str, str] | None = None) -> JobProcess:
        self.runs += 1
        return JobProcess(self.conf, self.logs / f"job-{self.runs:03d}.log", {**self.env, **(extra_env or {})})

    def restart(self, extra_env: dict[str, str] | None = None) -> None:
        assert self.job is not None
        self.job.kill()
        self.job = self.spawn(extra_env)

    def note_exit(self, run: JobProcess) -> None:
        text = f"exit {run.proc.returncode}: {run.last_line()}"
        self.report.job_exits[text] = self.report.job_exits.get(text, 0) + 1

    def keep_alive(self) -> bool:
        """Restart a job that ended on its own (noted; the faults not yet survived never will be: the job stopped
        instead of riding them out); True when it had."""
        assert self.job is not None
        if self.job.running():
            return False
        self.note_exit(self.job)
        self.pending.clear()
        self.job.kill()
        self.job = self.spawn()
        return True

    def settle(self) -> None:
        """A fault is survived once a micro-batch commits after it (the job offloads again)."""
        latest = _latest_commit(self.checkpoint) if self.pending else None
        if latest is None:
            return
        for kind, end in list(self.pending):
            if latest > end:
                self.report.faults[kind].survived += 1
                self.pending.remove((kind, end))

    def sleep(self, seconds: float) -> None:
        """Wait, keeping the job alive."""
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            self.keep_alive()
            time.sleep(min(0.2, max(0.0, until - time.monotonic())))

    def wait_progress(self, since_wall: float, timeout: float) -> bool:
        """Until a micro-batch commits after ``since_wall`` (True), or ``timeout``; False also when the job had to
        be restarted after ending on its own meanwhile (it stopped instead of riding the fault out)."""
        deadline = time.monotonic() + timeout
        stopped = False
        while time.monotonic() < deadline:
            stopped |= self.keep_alive()
            self.settle()
            latest = _latest_commit(self.checkpoint)
            if latest is not None and latest > since_wall:
                return not stopped
            time.sleep(0.2)
        return False

    # -- the faults ---------------------------------------------------------------------------------

    def inject(self, kind: str) -> str:
        """Inject one fault; returns what was done (for the log)."""
        if kind == "job-kill":
            self.restart()
            return "job SIGKILLed, restarted"
        if kind == "job-kill-startup":
            self.restart()
            delay = self.rng.uniform(2.0, 8.0)
            self.sleep(delay)
            self.restart()
            return f"job SIGKILLed, restarted, SIGKILLed again {delay:.1f} s into its start-up, restarted"
        if kind == "job-kill-commit":
            return self._kill_in_commit()
        if kind == "broker-kill":
            assert self.broker is not None
            self.broker.kill()
            down = self.rng.uniform(0.5, 4.0)
            self.sleep(down)
            self.broker.start()
            return f"broker SIGKILLed, restarted on its data after {down:.1f} s"
        if kind == "disk-full":
            flag = Path(self.env[DISK_FULL_FLAG_ENV])
            flag.touch()
            full = self.rng.uniform(2.0, 10.0)
            self.sleep(full)
            flag.unlink()
            return f"store disk full (ENOSPC) for {full:.1f} s"
        if kind.startswith("s3-"):
            assert self.proxy is not None
            what = kind.removeprefix("s3-")
            share = 1.0 if what in ("500", "503") else 0.5
            fault = Fault(what, share=share, delay_s=self.rng.uniform(2.0, 6.0), hang_s=self.s.s3_hang_s)
            self.proxy.set_fault(fault)
            window = self.rng.uniform(3.0, 10.0)
            self.sleep(window)
            self.proxy.clear()
            return f"S3 {what} on {share:.0%} of requests for {window:.1f} s"
        if kind == "checkpoint-delete":
            assert self.job is not None
            self.job.kill()
            shutil.rmtree(self.checkpoint, ignore_errors=True)
            self.job = self.spawn()
            return "job SIGKILLed, Spark checkpoint deleted, restarted"
        if kind in ("policy-live", "policy-offline"):
            self.policy = (self.policy + 1) % len(self.policies)
            segment_mb, block = self.policies[self.policy]
            if kind == "policy-offline":
                assert self.job is not None
                self.job.kill()
            write_config(
                self.conf,
                self.service_url,
                self.topic_list,
                self.checkpoint,
                self.job_store,
                self.policies[self.policy],
            )
            if kind == "policy-offline":
                self.job = self.spawn()
                return f"job SIGKILLed, policy edited to {segment_mb} MB / {block} B blocks, restarted"
            return f"policy edited to {segment_mb} MB / {block} B blocks while running"
        raise ValueError(f"unknown fault kind {kind!r}")

    def _kill_in_commit(self) -> str:
        """Arm the running job's crash point: it SIGKILLs itself inside its next segment commit."""
        point = self.rng.choice(CRASH_POINTS)
        crash_dir = Path(self.env["STREAMOFFLOAD_CRASH_DIR"])
        shutil.rmtree(crash_dir, ignore_errors=True)
        crash_dir.mkdir(parents=True)
        arm = Path(self.env[CRASH_ARM])
        arm.write_text(f"{point}:1")
        assert self.job is not None
        deadline = time.monotonic() + self.s.startup_timeout
        try:
            while self.job.running() and time.monotonic() < deadline:
                time.sleep(0.1)
        finally:
            arm.unlink()
        crashed = (crash_dir / "crashed").exists()
        self.restart()  # whatever of the crashed group is left goes; a new run takes over
        if not crashed:
            return f"job armed to crash at {point}, which it never reached in time (killed instead)"
        return f"job SIGKILLed itself at {point} inside a segment commit, restarted"

    # -- the run ------------------------------------------------------------------------------------

    def run(self) -> ChaosReport:
        s = self.s
        kinds = s.kinds or kinds_for(s.store)
        if self.broker is None:
            kinds = tuple(k for k in kinds if k != "broker-kill")
        plan = plan_faults(self.rng, s.faults, kinds)
        self.log(
            f"chaos: {s.faults} faults of {len(set(plan))} kinds, seed {s.seed}, "
            f"{s.rate:g} msg/s of {s.payload_size} B "
            f"to {len(self.topics)} topic-partitions ({self.base}-a-partition-0/1 batched, -b not), store {s.store}; "
            f"work dir {self.workdir}"
        )
        # pulsar-client's reconnect errors (a broker kill) go to a file: the terminal shows the harness's lines.
        client_log = logging.getLogger("bench.chaos.pulsar")
        client_log.propagate = False
        for handler in list(client_log.handlers):  # an earlier run's, in the same process (the suite)
            client_log.removeHandler(handler)
            handler.close()
        client_log.addHandler(logging.FileHandler(self.logs / "producer.log"))
        producer = Producer(self.service_url, self.topics, s.rate, s.payload_size).start()
        report = self.report
        last_fault_end = time.monotonic()
        last_end_wall = time.time()
        try:
            self.job = self.spawn()
            last_end_wall = self.job.started_wall
            for n, kind in enumerate(plan, 1):
                # The job must be offloading before a fault (strictly: before each one; with ``overlap`` only
                # before the ones that need a running job, the others may land during a start-up).
                if not s.overlap or n == 1 or kind in AFTER_PROGRESS:
                    self.wait_progress(last_end_wall, s.startup_timeout)
                self.sleep(self.rng.uniform(s.min_delay, s.max_delay))
                counts = report.faults.setdefault(kind, FaultCounts())
                counts.injected += 1
                what = self.inject(kind)
                last_fault_end, last_end_wall = time.monotonic(), time.time()
                self.pending.append((kind, last_end_wall))
                report.events.append(f"{n}: {what}")
                self.log(
                    f"  fault {n}/{s.faults} {kind:<18} at {last_fault_end - self.started:6.1f} s: {what} "
                    f"({producer.acked_total():,} acked, {_segment_count(self.meta, self.topic_list)} segments)"
                )

            # The last fault is over: stop the traffic and wait until the store has all of it.
            producer.stop()
            last_ids = {t: tr.last_id for t, tr in producer.traffic.items()}
            self.log(f"  producer stopped: {producer.acked_total():,} messages acked; waiting for the store")
            deadline = last_fault_end + s.converge_timeout
            while time.monotonic() < deadline:
                self.keep_alive()
                self.settle()
                if _caught_up(self.meta, last_ids):
                    report.converged = True
                    report.converge_seconds = time.monotonic() - last_fault_end
                    break
                time.sleep(0.5)
            if report.converged:
                # The store caught up with everything acknowledged after the last fault, with no stop since.
                for kind, _end in self.pending:
                    report.faults[kind].survived += 1
                self.pending.clear()
            self.log(
                "  converged "
                + (f"{report.converge_seconds:.1f} s after the last fault" if report.converged else "NOT (timed out)")
                + "; stopping the job"
            )
        finally:
            if self.job is not None:
                report.stop_exit = self.job.terminate()
            with contextlib.suppress(RuntimeError):
                producer.stop()
        report.job_runs = self.runs
        report.job_errors = job_errors(self.logs)
        report.topics = check_store(self.store, self.meta, producer, s.payload_size)
        # Logged before verify and cleanup, which read the whole store again: what was checked stays on record
        # whatever happens to them.
        self.log(
            f"  read back: {report.published:,} acked, {report.stored:,} stored; missing {report.missing:,}, "
            f"duplicated {report.duplicated:,}, corrupt {report.corrupt:,}, out of order {report.out_of_order:,}"
        )
        self._verify()
        self._cleanup(producer)
        report.wall_seconds = time.monotonic() - self.started
        return report

    def _cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        """A command of the tool against the store; one that runs past ``cli_timeout`` is a failed run of it (exit
        124, as ``timeout(1)`` says it), reported like any other failure, not a crash of the harness."""
        command = [sys.executable, "-m", "streamoffload", *args, "--conf", str(self.harness_conf)]
        try:
            return subprocess.run(
                command,
                env={
                    k: v
                    for k, v in self.env.items()
                    if k != DISK_FULL_FLAG_ENV and not k.startswith("STREAMOFFLOAD_CRASH")
                },
                cwd=self.workdir,
                capture_output=True,
                text=True,
                timeout=self.s.cli_timeout,
            )
        except subprocess.TimeoutExpired:
            said = f"{' '.join(args)} did not finish within {self.s.cli_timeout:g} s (--cli-timeout)"
            return subprocess.CompletedProcess(command, 124, "", said)

    def _verify(self) -> None:
        done = self._cli("verify", "--crc")
        self.report.verify_ran = True
        if done.returncode != 0:
            last = [x for x in (done.stderr + done.stdout).splitlines() if x.strip()] or ["(no output)"]
            self.report.verify_error = f"exit {done.returncode}: {last[-1][:400]}"

    def _cleanup(self, producer: Producer) -> None:
        report = self.report
        segments_before = {
            mf.manifest_uuid(s) for segs in _offloaded(self.meta, self.topic_list).values() for s in segs
        }
        report.segments = len(segments_before)
        cleanup = self._cli("cleanup", "--grace-minutes", "0")
        removed = re.search(r"cleanup: (\d+) item\(s\) removed", cleanup.stdout)
        if cleanup.returncode != 0 or removed is None:
            last = [x for x in (cleanup.stderr + cleanup.stdout).splitlines() if x.strip()] or ["(no output)"]
            report.cleanup_error = f"exit {cleanup.returncode}: {last[-1][:400]}"
            return
        report.cleanup_removed = int(removed.group(1))
        offloaded = _offloaded(self.meta, self.topic_list)
        segments_after = {mf.manifest_uuid(s) for segs in offloaded.values() for s in segs}
        report.cleanup_dropped_segments = len(segments_before - segments_after)
        referenced = {k for segs in offloaded.values() for s in segs for k in segment_objects(s)}
        # Besides metadata (a key component starting with "_"), a converged store holds exactly those objects ...
        data_keys = {k for k in _store_keys(self.scoped) if not any(part.startswith("_") for part in k.split("/"))}
        report.orphans_after_cleanup = len(data_keys - referenced)
        # ... each of them still there and reading back, and every message reads back as it did before cleanup.
        report.cleanup_damage = cleanup_damage(self.store, offloaded)
        try:
            after = check_store(self.store, self.meta, producer, self.s.payload_size)
        except Exception as err:  # a data object gone or no longer whole
            report.cleanup_damage.append(f"read back after cleanup failed: {type(err).__name__}: {err}")
        else:
            changed = [t for t in report.topics if after.get(t) != report.topics[t]]
            report.cleanup_damage += [
                f"{t}: read back {after.get(t)} after cleanup, {report.topics[t]} before" for t in changed
            ]


# --- main -----------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="bench/chaos.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--faults", type=int, help="faults of all kinds, drawn at seeded random (default 20)")
    parser.add_argument(
        "--kills", type=int, help="the original run: this many job kills, policy edits and checkpoint deletions"
    )
    parser.add_argument("--kinds", help="comma-separated fault kinds to draw from (default: all the store allows)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the fault plan and moments (default 1)")
    parser.add_argument("--rate", type=float, default=200.0, help="messages/s over all topics (default 200)")
    parser.add_argument("--payload-size", type=int, default=200, help="bytes per message (default 200)")
    parser.add_argument("--store", choices=["fs", "s3"], default="fs", help="filesystem, or S3 (moto behind the proxy)")
    parser.add_argument("--min-delay", type=float, default=0.0, help="seconds after progress before a fault, low end")
    parser.add_argument("--max-delay", type=float, default=6.0, help="... high end (default 6)")
    parser.add_argument(
        "--converge-timeout", type=float, default=240.0, help="seconds after the last fault to converge (default 240)"
    )
    parser.add_argument(
        "--cli-timeout",
        type=float,
        default=600.0,
        help="seconds verify --crc and cleanup may each take at the end (default 600; a run of millions of "
        "messages on moto needs more)",
    )
    parser.add_argument(
        "--overlap",
        action="store_true",
        help="wait for the job's progress only before kills that need it: other faults may land during a start-up",
    )
    parser.add_argument("--work-dir", help="parent of the temporary work directory (default: the system's)")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (job logs under logs/)")
    args = parser.parse_args(argv)
    if args.faults is not None and args.kills is not None:
        parser.error("give --faults or --kills, not both")
    kinds: tuple[str, ...] | None = tuple(k.strip() for k in args.kinds.split(",")) if args.kinds else None
    if args.kills is not None:
        kinds = kinds or KILL_KINDS
    count = args.kills if args.kills is not None else (args.faults if args.faults is not None else 20)
    if count < 1:
        parser.error("--faults / --kills must be at least 1")
    if args.rate <= 0 or args.payload_size < 16:
        parser.error("--rate must be > 0 and --payload-size at least 16")
    if not 0 <= args.min_delay <= args.max_delay:
        parser.error("--min-delay must be between 0 and --max-delay")
    settings = ChaosSettings(
        faults=count,
        seed=args.seed,
        kinds=kinds,
        rate=args.rate,
        payload_size=args.payload_size,
        store=args.store,
        min_delay=args.min_delay,
        max_delay=args.max_delay,
        converge_timeout=args.converge_timeout,
        cli_timeout=args.cli_timeout,
        overlap=args.overlap,
    )

    # On SIGTERM, unwind through the finally blocks: they stop the job, the producer and the broker.
    signal.signal(signal.SIGTERM, lambda _signum, _frame: sys.exit(143))
    if args.work_dir:
        os.makedirs(args.work_dir, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="bench-chaos-", dir=args.work_dir))
    print(f"chaos bench: Python {sys.version.split()[0]}, {os.cpu_count()} CPUs, store {args.store}", flush=True)
    report = ChaosReport()
    try:
        report = run_chaos(work, settings, log=lambda line: print(line, flush=True))
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
