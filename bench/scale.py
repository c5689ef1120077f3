"""Scale: one continuous job over many topic-partitions, most of them idle and a rotating few hundred active
(issue 24). What grows with the number of topic-partitions, and what only with the traffic?

Run from the repository root:

    .venv/bin/python bench/scale.py                                 # steps of 100, 1,000 and 10,000
    .venv/bin/python bench/scale.py --topics 1000                   # one step
    .venv/bin/python bench/scale.py --topics 300 --minutes 1 --idle-s 60 --keep   # a quick look, logs kept

Each step (``--topics``, comma-separated) has a fresh work directory with its own pulsar-lite broker, store and
checkpoint, and runs for at most ``--step-minutes`` (every wait below is cut to what is left; what could not
run is said so):

1. **Topic-partitions.** N topic-partitions ``persistent://public/default/scale-GGGG-partition-P`` (10 partitions
   per topic; pulsar-lite runs with ``default_partitions = 0``, so each is a plain topic there: SPEC 6) plus
   ``--probes`` quiet ones ``scale-probe-partition-K``. Each is created by publishing ``--seed-messages`` messages
   to it (a producer created, used and closed, ``--create-chunk`` at a time), so that every topic-partition also
   has a segment in the store once the job has run: ``status``, retention and the metrics walk them all, as
   they would walk a real namespace's history. The time this takes and pulsar-lite's memory are printed; if
   creating fails or passes ``--create-timeout``, the step goes on with what exists and says exactly what
   (where pulsar-lite stops is a finding of its own).
2. **Discovery**, measured in this process with the job's own planner (``streaming/source/offset_planner.py``
   ``SourcePlanner``, with the source options the job uses): pulsar-lite does not answer GetTopicsOfNamespace,
   so the job's ``topics_pattern`` comes with ``topics_pattern_candidates`` (every name above) and discovery
   expands each candidate (``SourcePlanner._list_namespace``). The first discovery waits out the unanswered
   GetTopicsOfNamespace; the job repeats the expansion every ``discoveryIntervalSeconds`` (10 s) inside a
   trigger. Also one pipelined pass of every latest position (``streamoffload/pulsar/latest_positions.py``), the other
   part of a trigger's planning.
3. **The job** as ``python -m streamoffload run --conf FILE`` in its own process group (bench/chaos_processes.py
   ``JobProcess``): the pattern, a trigger every ``--trigger-s``, rollover ``--rollover-s``, segments of at most
   1 MB (the rollover seals them), a filesystem store (``--store s3``: moto), Prometheus metrics on a free
   loopback port, and Spark's event log on (the query's progress events: ``durationMs``, ``stateOperators``).
   Every process of the job counts its store requests (``STREAMOFFLOAD_STORE_REQUEST_COUNTS``,
   ``storage/request_counts.py``). Start-up ends when every topic-partition has an Offloaded segment.
4. **Traffic**: ``--rate`` messages/s of ``--payload-size`` bytes, round robin over a window of ``--active``
   topic-partitions (default min(N, 300)) that slides through them, ``--active`` every ``--rotate-s`` seconds
   (a topic-partition leaving the window goes quiet and is sealed by the rollover timer), for ``--minutes``.
   Halfway, 3 messages to each probe topic-partition, which then stays quiet.
5. **Idle**: the traffic stops; once the store holds every acknowledged message and ``--settle-s`` more seconds
   have passed (the driver's minutely retention and metrics passes read what the last minute sealed), ``--idle-s``
   seconds with nothing to do: the job's store requests in that time, by process, operation and kind of key
   (``storage.request_counts.key_kind``), and one ``/metrics`` scrape.
6. ``streamoffload status --json`` (with ``--no-broker``, then asking the broker) timed as subprocesses, and two
   passes of the job's retention runner (``checkpoints/retention.py`` ``RetentionRunner``, the job's policy) in
   this process: the first is a new runner's (it lists the whole store), the second what the job's runner does
   every minute. Then the job is stopped (SIGTERM) and every topic-partition read back with the codecs alone
   (bench/chaos.py ``check_store``: every acknowledged message exactly once, in order).

Figures per step, each beside what it is compared with (the issue's targets, or what it should be):

- creating the topic-partitions: seconds, topic-partitions/s, pulsar-lite's RSS after;
- discovery: first and repeated (this process), one latest-positions pass;
- planning per trigger: ``durationMs.latestOffset`` (the sources' planning on the driver: discovery, latest
  positions, admission) and ``queryPlanning``, p50/p99/max over every trigger of the traffic window (target ≤ 1 s);
- micro-batch p50/p99: ``durationMs.triggerExecution`` of the micro-batches that ran (target p50 ≤ 2 s);
- lag p99 of the active topic-partitions: a message's lag is its segment's Offloaded time minus its publish time
  (bench/readable.py), over the messages published after the first ``--warmup-s`` of traffic (target ≤ rollover +
  5 s);
- sealing an idle topic-partition by the rollover timer: from the first probe message's publish time to its
  segment's Offloaded manifest (should be rollover + about a trigger and a micro-batch);
- state: ``numRowsTotal``, ``memoryUsedBytes`` and the RocksDB files of the segmenter's state store, from the last
  progress;
- memory: the job's Python driver RSS, the JVM's RSS, the PSS of Spark's Python processes summed (largest sample
  of the traffic window; MB per 1,000 topic-partitions in the closing table, between the smallest and largest
  step);
- one scrape: sample lines (target ≤ 2,000), of them per-topic, and its time;
- ``status`` (store only, and with the broker) and retention passes: seconds and store requests;
- idle store requests per minute by S3 request class (LIST, GET, HEAD, PUT, DELETE), the driver's and the rest
  (target: independent of the number of topic-partitions).

A closing table over the steps is printed for bench/README.md. Logs (the job's, Spark's, the broker's, the
event log) stay in each step's work directory (``--keep``, or kept when a step fails). Traffic goes to 127.0.0.1
only. ``run_step`` is the same as a function (tests/bench/test_scale.py runs ~300 topic-partitions in the suite).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from streamoffload.storage.location import ScopedStore

# bench/ sits beside streamoffload's checkout; run from the repository root or imported as bench.scale.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.chaos import TopicCounts, check_store
from bench.chaos_processes import JobProcess, Producer, job_errors
from bench.harness import add_work_arguments, new_work_dir
from bench.procstats import _proc_stat, _rss_bytes, job_tree_sample, tree_cpu
from bench.readable import percentile, readable_messages
from bench.soak import ProducerLogFile, _wait_query_started, store_settings
from bench.store_census import StoreCensus
from streamoffload.checkpoints.metadata_store import MetadataStore
from streamoffload.checkpoints.metadata_view import MetadataView
from streamoffload.checkpoints.retention import RetentionRunner
from streamoffload.cli_common import LogSettings, configure_logging
from streamoffload.config import PolicySource, load_config
from streamoffload.embedded_broker import EmbeddedBroker, free_port
from streamoffload.storage.request_counts import (
    ENV as COUNTS_ENV,
)
from streamoffload.storage.request_counts import (
    REQUEST_CLASSES,
    CountingStore,
    RequestCounts,
    by_class,
    counts_by_process,
    where_by_process,
)
from streamoffload.streaming.job.offload_job import OffloadJob
from streamoffload.streaming.job.queries import QUERY_NAME
from streamoffload.streaming.source.offset_planner import SourcePlanner
from streamoffload.streaming.source.source_options import SourceOptions

NAMESPACE = "persistent://public/default"
PARTITIONS_PER_TOPIC = 10
PROBE_MESSAGES = 3
MIB = 2**20
PROGRESS_EVENT = "org.apache.spark.sql.streaming.StreamingQueryListener$QueryProgressEvent"


def topic_names(n: int, base: str = "scale") -> list[str]:
    """``n`` topic-partitions, 10 partitions per topic."""
    per = PARTITIONS_PER_TOPIC
    return [f"{NAMESPACE}/{base}-{i // per:05d}-partition-{i % per}" for i in range(n)]


def probe_names(n: int, base: str = "scale") -> list[str]:
    return [f"{NAMESPACE}/{base}-probe-partition-{k}" for k in range(n)]


@dataclass(frozen=True)
class ScaleSettings:
    topics: int = 100
    active: int | None = None
    """Active topic-partitions at a time (default min(topics, 300))."""
    rate: float = 2000.0
    payload_size: int = 200
    rollover_s: float = 5.0
    trigger_s: float = 1.0
    minutes: float = 3.0
    warmup_s: float = 30.0
    rotate_s: float = 60.0
    idle_s: float = 120.0
    settle_s: float = 65.0
    create_only: bool = False
    """Create the topic-partitions and measure discovery, then stop (no job)."""
    """Seconds between convergence and the idle window (the driver's minutely passes catch up meanwhile)."""
    probes: int = 5
    seed_messages: int = 2
    create_chunk: int = 200
    create_rate: float = 5000.0
    create_timeout: float = 300.0
    startup_timeout: float = 600.0
    converge_timeout: float = 180.0
    status_timeout: float = 300.0
    step_minutes: float = 15.0
    store: str = "fs"
    sample_s: float = 10.0
    measure_discovery: bool = True
    latest_sample: int = 1000
    """The bench's own latest-positions pass asks at most this many topic-partitions."""
    measure_status: bool = True
    measure_retention: bool = True
    base: str = "scale"
    """Every topic-partition's name starts with it; the job's pattern is ``public/default/<base>-.*``."""

    @property
    def active_n(self) -> int:
        return min(self.topics, 300 if self.active is None else self.active)


# --- the report -------------------------------------------------------------------------------------------


@dataclass
class Dist:
    """A few quantiles of a list of values (None when empty)."""

    values: list[float] = field(default_factory=list)

    def q(self, quantile: float) -> float | None:
        return percentile(self.values, quantile) if self.values else None

    @property
    def max(self) -> float | None:
        return max(self.values) if self.values else None

    def text(self, unit: str = "s", digits: int = 2) -> str:
        if not self.values:
            return "none"
        return (
            f"p50 {self.q(0.5):.{digits}f} {unit}, p99 {self.q(0.99):.{digits}f} {unit}, max {self.max:.{digits}f} "
            f"{unit} ({len(self.values)})"
        )


@dataclass
class StepReport:
    topics: int
    active: int
    probes: int
    rollover_s: float
    trigger_s: float
    rate: float
    created: int = 0
    """Topic-partitions created on the broker (with their seed messages acknowledged), probes included."""
    create_s: float | None = None
    create_note: str = ""
    broker_rss_mib: float | None = None
    broker_db_mib: float | None = None
    subscriptions_created: int | None = None
    """Subscriptions in pulsar-lite's metadata file once the topic-partitions were created."""
    subscriptions_end: int | None = None
    metadata_end_mib: float | None = None
    broker_cpu_traffic: float | None = None
    """CPU seconds pulsar-lite used in the traffic window."""
    latest_pass_topics: int | None = None
    latest_pass_client_cpu: float | None = None
    latest_pass_broker_cpu: float | None = None
    latest_offset_first: float | None = None
    """latestOffset p50 of the traffic window's first third, and of its last third: pulsar-lite slowing down."""
    latest_offset_last: float | None = None
    discovery_first_s: float | None = None
    discovery_again_s: float | None = None
    discovered: int | None = None
    latest_pass_s: float | None = None
    startup_s: float | None = None
    """From the job's start until every created topic-partition had an Offloaded segment."""
    converged: bool = False
    """The store held every acknowledged message before the idle window."""
    traffic_started: float | None = None
    """When the traffic window started (epoch seconds)."""
    traffic_s: float = 0.0
    acked_in_window: int = 0
    latest_offset: Dist = field(default_factory=Dist)
    query_planning: Dist = field(default_factory=Dist)
    triggers: int = 0
    batches: Dist = field(default_factory=Dist)
    batch_rows: float | None = None
    lag: Dist = field(default_factory=Dist)
    seal: Dist = field(default_factory=Dist)
    state_rows: int | None = None
    state_memory_bytes: int | None = None
    state_sst_bytes: int | None = None
    state_metrics: dict[str, Any] = field(default_factory=dict)
    driver_rss_mib: float | None = None
    jvm_rss_mib: float | None = None
    workers_pss_mib: float | None = None
    workers: int | None = None
    series: int | None = None
    topic_series: int | None = None
    scrape_s: float | None = None
    scrape_kib: float | None = None
    status_store_s: float | None = None
    status_store_requests: dict[str, int] = field(default_factory=dict)
    status_broker_s: float | None = None
    status_rows: int | None = None
    status_note: str = ""
    retention_first_s: float | None = None
    retention_first_requests: dict[str, int] = field(default_factory=dict)
    retention_steady_s: float | None = None
    retention_steady_requests: dict[str, int] = field(default_factory=dict)
    idle_per_min: dict[str, float] = field(default_factory=dict)
    """Store requests per minute of the idle window, by S3 request class."""
    idle_driver_per_min: dict[str, float] = field(default_factory=dict)
    idle_ops_per_min: dict[str, float] = field(default_factory=dict)
    idle_where_per_min: dict[str, float] = field(default_factory=dict)
    """Per ``"<process> <op> <key kind>"`` (storage.request_counts.key_kind): requests per minute."""
    idle_window_s: float | None = None
    idle_cpu_per_min: float | None = None
    """CPU seconds per minute of the job's processes (driver, JVM, Python workers) in the idle window."""
    exactly: dict[str, TopicCounts] = field(default_factory=dict)
    check_s: float | None = None
    job_exit: str | None = None
    job_errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    wall_s: float = 0.0

    def total(self, name: str) -> int:
        return sum(getattr(c, name) for c in self.exactly.values())

    @property
    def exactly_once(self) -> bool | None:
        if not self.exactly:
            return None
        bad = sum(self.total(k) for k in ("missing", "duplicated", "corrupt", "out_of_order"))
        return bad == 0 and self.total("published") > 0

    def render(self) -> str:
        def f(value: float | None, fmt: str = ".2f", unit: str = " s") -> str:
            return "-" if value is None else f"{value:{fmt}}{unit}"

        target_lag = self.rollover_s + 5
        lines = [
            f"step: {self.topics:,} topic-partitions (+{self.probes} probes), {self.active:,} active at a time, "
            f"{self.rate:g} msg/s, rollover {self.rollover_s:g} s, trigger {self.trigger_s:g} s; "
            f"wall {self.wall_s:.0f} s",
            f"  created on pulsar-lite        {self.created:,} topic-partitions in {f(self.create_s, '.1f')}"
            + (f" ({self.created / self.create_s:,.0f}/s)" if self.create_s else "")
            + f"; broker RSS {f(self.broker_rss_mib, '.0f', ' MiB')}, "
            f"its RocksDB {f(self.broker_db_mib, '.0f', ' MiB')}"
            + (f"; {self.create_note}" if self.create_note else ""),
            f"  discovery (this process)      first {f(self.discovery_first_s)}, again {f(self.discovery_again_s)} "
            f"(found {self.discovered if self.discovered is not None else '-'}; the job repeats it every 10 s in a "
            f"trigger); one latest-positions pass of {self.latest_pass_topics or 0:,} {f(self.latest_pass_s)} (CPU: "
            f"planner {f(self.latest_pass_client_cpu)}, pulsar-lite {f(self.latest_pass_broker_cpu)})",
            f"  start-up                      {f(self.startup_s, '.0f')} until every topic-partition had a segment "
            "Offloaded",
            f"  planning per trigger          latestOffset {self.latest_offset.text()}; queryPlanning "
            f"{self.query_planning.text()}   [target <= 1 s]",
            f"{'':32}latestOffset p50 in the window's first third {f(self.latest_offset_first)}, last third "
            f"{f(self.latest_offset_last)}",
            f"  micro-batch                   {self.batches.text()}; mean {f(self.batch_rows, ',.0f', '')} rows "
            "[target p50 <= 2 s]",
            f"  lag of active topics          {self.lag.text()}   [target p99 <= rollover + 5 s = {target_lag:g} s]",
            f"  idle topic sealed by timer    {self.seal.text()}   [rollover {self.rollover_s:g} s + a trigger and a "
            "micro-batch]",
            f"  state store                   {self.state_rows if self.state_rows is not None else '-'} rows, memory "
            f"{f(None if self.state_memory_bytes is None else self.state_memory_bytes / MIB, '.1f', ' MiB')}, RocksDB "
            f"files {f(None if self.state_sst_bytes is None else self.state_sst_bytes / MIB, '.1f', ' MiB')}",
            f"  memory (traffic, largest)     driver RSS {f(self.driver_rss_mib, '.0f', ' MiB')}, JVM RSS "
            f"{f(self.jvm_rss_mib, '.0f', ' MiB')}, Spark's Python processes PSS "
            f"{f(self.workers_pss_mib, '.0f', ' MiB')}"
            f" ({self.workers if self.workers is not None else '-'} processes)",
            f"  one /metrics scrape           {self.series if self.series is not None else '-'} series "
            f"({self.topic_series if self.topic_series is not None else '-'} per-topic), "
            f"{f(self.scrape_kib, '.0f', ' KiB')} in {f(self.scrape_s)}   [target <= 2,000 series]",
            f"  status --json                 store only {f(self.status_store_s)} "
            f"({_requests_text(self.status_store_requests)}); with the broker {f(self.status_broker_s)}"
            + (f" ({self.status_rows:,} rows)" if self.status_rows is not None else "")
            + (f"; {self.status_note}" if self.status_note else ""),
            f"  retention pass                first {f(self.retention_first_s)} "
            f"({_requests_text(self.retention_first_requests)}); steady {f(self.retention_steady_s)} "
            f"({_requests_text(self.retention_steady_requests)})",
            f"  pulsar-lite                   subscriptions it keeps: {_num(self.subscriptions_created)} after "
            f"creating, {_num(self.subscriptions_end)} at the end (metadata file "
            f"{f(self.metadata_end_mib, '.1f', ' MiB')}); CPU in the traffic window "
            f"{f(self.broker_cpu_traffic, '.0f')}",
            f"  idle store requests / min     {_rate_text(self.idle_per_min)} (driver: "
            f"{_rate_text(self.idle_driver_per_min)}) over {f(self.idle_window_s, '.0f')}   [target: independent of "
            "the topic-partitions]",
            f"  idle job CPU                  {f(self.idle_cpu_per_min, '.1f', ' s per minute')} (driver, JVM and "
            "Python workers)",
        ]
        if self.idle_where_per_min:
            lines.append(
                f"{'':32}of them: " + ", ".join(f"{k} {n:,.1f}" for k, n in list(self.idle_where_per_min.items())[:8])
            )
        if self.exactly:
            bad = {k: self.total(k) for k in ("missing", "duplicated", "corrupt", "out_of_order") if self.total(k)}
            lines.append(
                f"  exactly once                  {'OK' if self.exactly_once else 'FAILED'}: "
                f"{self.total('published'):,} acknowledged, {self.total('stored'):,} stored"
                + "".join(f", {k.replace('_', ' ')} {v:,}" for k, v in bad.items())
                + f" (read back in {f(self.check_s, '.0f')})"
            )
        if self.job_exit:
            lines.append(f"  the job ended on its own: {self.job_exit}")
        lines.extend(f"  note: {n}" for n in self.notes)
        lines.extend(f"  job error: {e}" for e in self.job_errors[:5])
        return "\n".join(lines)


def _num(value: int | None) -> str:
    return "-" if value is None else f"{value:,}"


def _requests_text(counts: dict[str, int]) -> str:
    if not counts:
        return "- requests"
    classes = by_class(counts)
    return ", ".join(f"{n:,} {name}" for name, n in classes.items() if n) or "0 requests"


def _rate_text(rates: dict[str, float]) -> str:
    if not rates:
        return "-"
    return ", ".join(f"{name} {rates.get(name, 0.0):,.1f}" for name in REQUEST_CLASSES)


# --- what the producer publishes to, round by round -------------------------------------------------------


class Rotation:
    """``Producer(active=...)``: what the producer publishes to at each round. Nothing, the creation of the
    topic-partitions (``--seed-messages`` to each, ``--create-chunk`` topic-partitions at a time), or a window of
    ``active`` topic-partitions sliding through ``topics`` (``active`` of them every ``rotate_s``); plus, for a
    few rounds, the probes."""

    def __init__(self, topics: Sequence[str], active: int, rotate_s: float) -> None:
        self.topics = list(topics)
        self.active = min(active, len(self.topics))
        self.rotate_s = rotate_s
        self.traffic: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._mode = "off"
        self._seed: list[str] = []
        self._seed_at = 0
        self._seed_k = 0
        self._chunk = 1
        self._window_from = 0.0
        self._extra: list[str] = []
        self._extra_rounds = 0
        self.windowed: set[str] = set()
        """Every topic-partition the window has held."""

    def seed(self, topics: Sequence[str], messages: int, chunk: int) -> None:
        with self._lock:
            self._mode, self._seed, self._seed_at, self._seed_k, self._chunk = "seed", list(topics), 0, messages, chunk

    def window(self) -> None:
        with self._lock:
            self._mode, self._window_from = "window", time.monotonic()

    def off(self) -> None:
        with self._lock:
            self._mode = "off"
            self._extra_rounds = 0

    def probe(self, topics: Sequence[str], rounds: int) -> None:
        with self._lock:
            self._extra, self._extra_rounds = list(topics), rounds

    def seeded(self) -> int:
        """Topic-partitions whose seed messages were all sent (acknowledged or not)."""
        return sum(1 for t in self._seed if self.traffic[t].sent >= self._seed_k)

    def __call__(self) -> list[str]:
        with self._lock:
            out: list[str] = []
            if self._mode == "seed":
                while self._seed_at < len(self._seed) and self.traffic[self._seed[self._seed_at]].sent >= self._seed_k:
                    self._seed_at += 1
                chunk = self._seed[self._seed_at : self._seed_at + self._chunk]
                out = [t for t in chunk if self.traffic[t].sent < self._seed_k]
            elif self._mode == "window":
                n = len(self.topics)
                if self.active >= n:
                    out = list(self.topics)
                else:
                    first = int((time.monotonic() - self._window_from) * self.active / self.rotate_s) % n
                    out = [self.topics[(first + j) % n] for j in range(self.active)]
                self.windowed.update(out)
            if self._extra_rounds > 0:
                out = out + self._extra
                self._extra_rounds -= 1
            return out


# --- pulsar-lite ------------------------------------------------------------------------------------------


def broker_metadata(broker: EmbeddedBroker | None) -> tuple[int, int] | None:
    """(subscriptions, bytes) of pulsar-lite's metadata file (``<db_path>.metadata.json``): it records every
    subscription ever made on a topic, non-durable ones included, and is rewritten whole at each new one."""
    if broker is None:
        return None
    path = broker.db_path.with_name(broker.db_path.name + ".metadata.json")
    if not path.exists():
        return 0, 0  # written at the first subscription
    try:
        text = path.read_text()
        doc = json.loads(text)
    except (OSError, ValueError):
        return None

    def count(node: Any) -> int:
        if not isinstance(node, dict):
            return 0
        subs = node.get("subscriptions")
        own = len(subs) if isinstance(subs, dict) else 0
        return own + sum(count(v) for k, v in node.items() if k != "subscriptions")

    return count(doc), len(text.encode())


def broker_cpu(broker: EmbeddedBroker | None) -> float | None:
    stat = _proc_stat(broker.pid) if broker is not None and broker.pid else None
    return None if stat is None else stat[2]


# --- the job's configuration and progress -----------------------------------------------------------------


def write_scale_config(
    path: Path,
    service_url: str,
    candidates: Sequence[str],
    checkpoint: Path,
    store_toml: str,
    *,
    pattern: str,
    metrics_address: str,
    event_log: Path,
    rollover_s: float,
    trigger_s: float,
) -> None:
    """The job's configuration: the pattern with every candidate name, segments of at most 1 MB (the rollover
    seals them), metrics on ``metrics_address``, Spark's event log into ``event_log``."""
    names = ",\n    ".join(json.dumps(t.rsplit("/", 1)[1]) for t in candidates)
    text = f"""# written by bench/scale.py
[pulsar]
service_url = "{service_url}"
topics_pattern = "{pattern}"
# pulsar-lite does not answer GetTopicsOfNamespace: the names the pattern filters
topics_pattern_candidates = [
    {names},
]
max_message_size = 4096  # lets the small blocks below through (the bench's entries are smaller)

{store_toml}

[spark]
checkpoint = "{checkpoint}"
trigger_interval = "{trigger_s:g} seconds"

[spark.conf]
"spark.ui.enabled" = "false"
"spark.ui.showConsoleProgress" = "false"
"spark.local.dir" = "{path.parent / "spark-local"}"
"spark.eventLog.enabled" = "true"
"spark.eventLog.dir" = "{event_log.as_uri()}"
"spark.eventLog.compress" = "false"

[metrics]
address = "{metrics_address}"

[offload]
maxSizePerOffloadSegmentMbytes = 1
managedLedgerOffloadMaxBlockSizeInBytes = 65536
maxOffloadSegmentRolloverTimeSeconds = {rollover_s:g}
"""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def query_progress(event_log: Path) -> list[dict[str, Any]]:
    """The job query's progress events from Spark's event log (every file in the directory), in order."""
    out: list[dict[str, Any]] = []
    for path in sorted(p for p in event_log.rglob("events_*") if p.is_file()):  # Spark 4: a directory per app
        with contextlib.suppress(OSError), open(path, errors="replace") as f:
            for line in f:
                if PROGRESS_EVENT not in line:
                    continue
                try:
                    progress = json.loads(line).get("progress") or {}
                except ValueError:
                    continue  # the last line of a log still being written
                if progress.get("name") == QUERY_NAME:
                    out.append(progress)
    return out


def progress_time(progress: dict[str, Any]) -> float:
    """A progress event's trigger start (epoch seconds)."""
    return datetime.fromisoformat(str(progress["timestamp"]).replace("Z", "+00:00")).timestamp()


def _state(progress: list[dict[str, Any]]) -> dict[str, Any] | None:
    for p in reversed(progress):
        ops = p.get("stateOperators") or []
        if ops:
            return dict(ops[0])
    return None


# --- measuring --------------------------------------------------------------------------------------------


def scrape(address: str) -> tuple[int, int, float, int]:
    """One ``/metrics`` scrape: (sample lines, of them per-topic, seconds, bytes)."""
    started = time.monotonic()
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=60) as resp:
        body = resp.read()
    seconds = time.monotonic() - started
    samples = [line for line in body.decode().splitlines() if line and not line.startswith("#")]
    return len(samples), sum(1 for line in samples if 'topic="' in line), seconds, len(body)


def timed_status(
    conf: Path, workdir: Path, env: dict[str, str], args: list[str], timeout: float, name: str
) -> tuple[float | None, dict[str, int], int | None, str]:
    """``streamoffload status --json ARGS`` as a subprocess: (seconds, its store requests, rows, a note)."""
    counts = workdir / f"requests-{name}"
    counts.mkdir(exist_ok=True)
    out = workdir / "logs" / f"{name}.json"
    started = time.monotonic()
    with open(out, "wb") as stdout, open(workdir / "logs" / f"{name}.log", "wb") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "streamoffload", "status", "--conf", str(conf), "--json", *args],
            stdout=stdout,
            stderr=stderr,
            stdin=subprocess.DEVNULL,
            cwd=workdir,
            env={**env, COUNTS_ENV: str(counts)},
            start_new_session=True,
        )
        try:
            code = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
            return None, {}, None, f"{name} did not finish within {timeout:.0f} s (killed)"
    seconds = time.monotonic() - started
    requests = _sum_counts(counts)
    if code != 0:
        return seconds, requests, None, f"{name} exited {code}"
    try:
        doc = json.loads(out.read_text())
        rows = len(doc.get("topics", doc) if isinstance(doc, dict) else doc)
    except (OSError, ValueError):
        rows = None
    return seconds, requests, rows, ""


def _sum_counts(directory: Path) -> dict[str, int]:
    total: dict[str, int] = {}
    for counts in counts_by_process(directory).values():
        for op, n in counts.items():
            total[op] = total.get(op, 0) + n
    return total


def _minus(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {op: n - before.get(op, 0) for op, n in after.items() if n - before.get(op, 0)}


def _per_minute(counts: dict[str, int], seconds: float) -> dict[str, float]:
    return {name: n * 60 / seconds for name, n in by_class(counts).items()}


def _where(directory: Path, driver: int) -> dict[str, int]:
    """Per ``"<driver|others> <op> <key kind>"``: every process's counts (storage.request_counts.where_by_process)."""
    out: dict[str, int] = {}
    for pid, counts in where_by_process(directory).items():
        who = "driver" if pid == driver else "others"
        for what, n in counts.items():
            out[f"{who} {what}"] = out.get(f"{who} {what}", 0) + n
    return out


def _snapshot(directory: Path, driver: int) -> tuple[dict[str, int], dict[str, int]]:
    """(every process's counts summed, the driver's)."""
    per = counts_by_process(directory)
    total: dict[str, int] = {}
    for counts in per.values():
        for op, n in counts.items():
            total[op] = total.get(op, 0) + n
    return total, per.get(driver, {})


def _opt(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.2f} s"


class Deadline:
    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def left(self, cap: float) -> float:
        return max(0.0, min(cap, self.end - time.monotonic()))

    @property
    def passed(self) -> bool:
        return time.monotonic() >= self.end


# --- a step -----------------------------------------------------------------------------------------------


def run_step(
    workdir: Path,
    settings: ScaleSettings,
    *,
    service_url: str | None = None,
    log: Callable[[str], None] = print,
) -> StepReport:
    """One step (the module's docstring) under ``workdir``. ``service_url``: an already running broker whose
    ``public/default`` holds no other ``scale-*`` topics (by default a fresh pulsar-lite under ``workdir``)."""
    started = time.monotonic()
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "logs").mkdir(exist_ok=True)
    report = StepReport(
        settings.topics, settings.active_n, settings.probes, settings.rollover_s, settings.trigger_s, settings.rate
    )
    deadline = Deadline(settings.step_minutes * 60)
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    env.pop(COUNTS_ENV, None)
    quiet = ProducerLogFile(workdir / "logs" / "producer.log")
    try:
        with contextlib.ExitStack() as stack:
            broker: EmbeddedBroker | None = None
            if service_url is None:
                # Its INFO log writes lines per subscription (gigabytes at 10,000 topic-partitions): warnings only.
                broker = stack.enter_context(EmbeddedBroker(workdir / "broker", default_partitions=0, log_level="warn"))
                service_url = broker.service_url
            store_toml = stack.enter_context(store_settings(settings.store, workdir, env))
            _step(report, workdir, settings, service_url, broker, store_toml, env, deadline, log)
    finally:
        quiet.close()
        report.wall_s = time.monotonic() - started
    return report


def _step(
    report: StepReport,
    workdir: Path,
    settings: ScaleSettings,
    service_url: str,
    broker: EmbeddedBroker | None,
    store_toml: str,
    env: dict[str, str],
    deadline: Deadline,
    log: Callable[[str], None],
) -> None:
    regular, probes = topic_names(settings.topics, settings.base), probe_names(settings.probes, settings.base)
    everything = regular + probes
    rotation = Rotation(regular, settings.active_n, settings.rotate_s)
    producer = Producer(
        service_url, dict.fromkeys(everything, False), settings.create_rate, settings.payload_size, active=rotation
    )
    rotation.traffic = producer.traffic
    producer.start()
    job: JobProcess | None = None
    try:
        created = _create_topics(report, settings, rotation, producer, broker, everything, deadline, log)
        conf, checkpoint, event_log = workdir / "scale.toml", workdir / "checkpoint", workdir / "eventlog"
        event_log.mkdir(exist_ok=True)
        address = f"127.0.0.1:{free_port()}"
        write_scale_config(
            conf,
            service_url,
            everything,
            checkpoint,
            store_toml,
            pattern=f"{NAMESPACE}/{settings.base}-.*",
            metrics_address=address,
            event_log=event_log,
            rollover_s=settings.rollover_s,
            trigger_s=settings.trigger_s,
        )
        config = load_config(conf)
        scoped = config.store.location.open()
        object_store = scoped.store
        meta = MetadataStore(scoped)
        if settings.measure_discovery and not deadline.passed:
            _discovery(report, OffloadJob(config, str(conf)).source_options(), broker, settings.latest_sample, log)

        if settings.create_only:
            report.notes.append("--create-only: no job started")
            return
        counts_dir = workdir / "requests-job"
        counts_dir.mkdir(exist_ok=True)
        job = JobProcess(conf, workdir / "logs" / "job.log", {**env, COUNTS_ENV: str(counts_dir)})
        log(f"  job started (pid {job.proc.pid}); waiting for every topic-partition's first segment")
        census = StoreCensus(scoped)
        warm = _wait_warm(job, checkpoint, census, created, deadline.left(settings.startup_timeout))
        if warm:
            report.startup_s = time.monotonic() - job.started
            log(f"  start-up: {report.startup_s:.0f} s until every topic-partition had a segment Offloaded")
            samples = _traffic(report, settings, rotation, producer, job, probes, broker, deadline, address, log)
            window_end = time.time()
            rotation.off()
            _converge(report, settings, producer, meta, deadline, log)
            _idle(report, settings, job, counts_dir, address, deadline, log)
            if settings.measure_status and not deadline.passed:
                _status(report, settings, conf, workdir, env, deadline, log)
            if settings.measure_retention and not deadline.passed:
                _retention(report, config, conf, log)
        else:
            # Say how far it got, and measure what a job that is still starting up can show.
            done = census.count().offloaded_topics
            report.notes.append(
                f"start-up unfinished after {time.monotonic() - job.started:.0f} s: {done:,} of {created:,} "
                f"topic-partitions had a segment Offloaded; no traffic, idle window, status or retention measured"
            )
            log(f"  {report.notes[-1]}")
            if not job.running():
                report.job_exit = f"exit {job.proc.returncode}: {job.last_line()}"
            samples = _sample_once(job, address, report)
            window_end = time.time()
        report.driver_rss_mib, report.jvm_rss_mib, report.workers_pss_mib, report.workers = samples
        code = job.terminate()
        if report.job_exit is None and code not in (0, None, -signal.SIGTERM):
            report.notes.append(f"the job's stop ended with exit {code}")
        job_started_wall, job = job.started_wall, None
        end = broker_metadata(broker)
        if end is not None:
            report.subscriptions_end, report.metadata_end_mib = end[0], end[1] / MIB
        # Triggers after the traffic's warm-up; when the start-up did not finish, every trigger there was.
        since = job_started_wall if report.traffic_started is None else report.traffic_started + settings.warmup_s
        _progress(report, event_log, since, window_end)
        producer.stop()
        log("  reading the store back")
        checked = time.monotonic()
        report.exactly = check_store(object_store, meta, producer, settings.payload_size)
        report.check_s = time.monotonic() - checked
        _lag_and_seal(report, settings, object_store, meta, rotation, probes, window_end)
    finally:
        if job is not None:
            job.terminate()
        rotation.off()
        with contextlib.suppress(RuntimeError):
            producer.stop()
        report.job_errors = job_errors(workdir / "logs")


def _create_topics(
    report: StepReport,
    settings: ScaleSettings,
    rotation: Rotation,
    producer: Producer,
    broker: EmbeddedBroker | None,
    topics: list[str],
    deadline: Deadline,
    log: Callable[[str], None],
) -> int:
    """Publish the seed messages to every topic-partition; returns how many were created (acknowledged). With
    ``--seed-messages 0`` none is: the names are the pattern's candidates only, and pulsar-lite answers for each
    as an empty topic (it creates one at the first lookup or subscription)."""
    if settings.seed_messages == 0:
        report.create_note = "none created beforehand (--seed-messages 0): empty topics until the traffic reaches them"
        log(f"  {len(topics):,} topic-partitions, not created beforehand")
        return 0
    log(f"  creating {len(topics):,} topic-partitions ({settings.seed_messages} messages each)")
    started = time.monotonic()
    rotation.seed(topics, settings.seed_messages, settings.create_chunk)
    limit = deadline.left(settings.create_timeout)
    next_log = started + 30
    while time.monotonic() - started < limit and producer.error is None:
        if rotation.seeded() >= len(topics) and producer.pending() == 0:
            break
        if time.monotonic() >= next_log:
            next_log += 30
            log(
                f"    {rotation.seeded():,} after {time.monotonic() - started:.0f} s"
                + (f", broker RSS {_rss_bytes(broker.pid) / MIB:.0f} MiB" if broker and broker.pid else "")
            )
        time.sleep(0.2)
    rotation.off()
    wait = time.monotonic() + 60
    while producer.pending() > 0 and time.monotonic() < wait and producer.error is None:
        time.sleep(0.2)
    report.create_s = time.monotonic() - started
    acked = {t: len(producer.traffic[t].acked) for t in topics}
    report.created = sum(1 for n in acked.values() if n >= settings.seed_messages)
    partial = sum(1 for n in acked.values() if 0 < n < settings.seed_messages)
    if report.created < len(topics):
        why = f"the producer failed: {producer.error}" if producer.error else f"stopped after {limit:.0f} s"
        report.create_note = (
            f"only {report.created:,} of {len(topics):,} created ({partial:,} partly); {why}. The job's pattern "
            "still names every candidate: the rest are measured as names the broker answers for without data"
        )
    if broker is not None and broker.pid:
        report.broker_rss_mib = _rss_bytes(broker.pid) / MIB
        report.broker_db_mib = sum(f.stat().st_size for f in broker.data_dir.rglob("*") if f.is_file()) / MIB
        report.subscriptions_created = (broker_metadata(broker) or (None, 0))[0]
    log(
        f"  created {report.created:,} in {report.create_s:.1f} s"
        + (f"; broker RSS {report.broker_rss_mib:.0f} MiB" if report.broker_rss_mib else "")
        + (f"; {report.create_note}" if report.create_note else "")
    )
    return sum(1 for n in acked.values() if n > 0)


def _discovery(
    report: StepReport,
    options: dict[str, str],
    broker: EmbeddedBroker | None,
    sample: int,
    log: Callable[[str], None],
) -> None:
    """Discovery twice, then one latest-positions pass over the first ``sample`` topic-partitions (each pass makes
    pulsar-lite slower for good: it keeps every subscription, see ``broker_metadata``), with the CPU seconds of
    this process (the planner's share) and of the broker."""
    planner = SourcePlanner(SourceOptions.parse(options))
    try:
        started = time.monotonic()
        planner.topic_partitions(force=True)
        report.discovery_first_s = time.monotonic() - started
        started = time.monotonic()
        found = planner.topic_partitions(force=True)
        report.discovery_again_s = time.monotonic() - started
        report.discovered = len(found)
        asked = found[:sample]
        cpu, broker_before, started = time.process_time(), broker_cpu(broker), time.monotonic()
        planner.latest_positions(asked)
        report.latest_pass_s = time.monotonic() - started
        report.latest_pass_topics = len(asked)
        report.latest_pass_client_cpu = time.process_time() - cpu
        broker_after = broker_cpu(broker)
        if broker_before is not None and broker_after is not None:
            report.latest_pass_broker_cpu = broker_after - broker_before
    finally:
        planner.close()
    log(
        f"  discovery: first {report.discovery_first_s:.2f} s, again {report.discovery_again_s:.2f} s "
        f"({report.discovered:,} found); latest positions of {len(asked):,}: {report.latest_pass_s:.2f} s "
        f"(CPU: planner {report.latest_pass_client_cpu:.2f} s, broker {report.latest_pass_broker_cpu or 0:.2f} s)"
    )


def _sample_once(
    job: JobProcess, address: str, report: StepReport
) -> tuple[float | None, float | None, float | None, int | None]:
    """Memory and one scrape of a job that did not finish starting up."""
    with contextlib.suppress(OSError):
        report.series, report.topic_series, report.scrape_s, size = scrape(address)
        report.scrape_kib = size / 1024
    if not job.running():
        return None, None, None, None
    tree = job_tree_sample(job.proc.pid)
    jvm = tree.jvm_rss / MIB if tree.jvm_pid else None
    return tree.driver_rss / MIB, jvm, tree.workers_pss / MIB, tree.workers


def _wait_warm(job: JobProcess, checkpoint: Path, census: StoreCensus, topics: int, timeout: float) -> bool:
    """The query has started, and every created topic-partition has a segment Offloaded."""
    deadline = time.monotonic() + timeout
    if not _wait_query_started(job, checkpoint, timeout):
        return False
    while time.monotonic() < deadline and job.running():
        if census.count().offloaded_topics >= topics:
            return True
        time.sleep(5.0)
    return False


def _traffic(
    report: StepReport,
    settings: ScaleSettings,
    rotation: Rotation,
    producer: Producer,
    job: JobProcess,
    probes: list[str],
    broker: EmbeddedBroker | None,
    deadline: Deadline,
    address: str,
    log: Callable[[str], None],
) -> tuple[float | None, float | None, float | None, int | None]:
    """The traffic window; returns the largest (driver RSS, JVM RSS, workers' PSS) MiB and the workers then."""
    seconds = deadline.left(settings.minutes * 60)
    if seconds < settings.minutes * 60:
        report.notes.append(f"traffic cut to {seconds:.0f} s by --step-minutes")
    log(f"  traffic: {settings.rate:g} msg/s over {settings.active_n:,} active topic-partitions for {seconds:.0f} s")
    producer.rate = settings.rate
    acked_before = producer.acked_total()
    cpu_before = broker_cpu(broker)
    rotation.window()
    started = time.monotonic()
    report.traffic_started = time.time()
    probed = scraped = False
    peaks: list[float | None] = [None, None, None]
    workers = None
    while time.monotonic() - started < seconds:
        if not job.running():
            report.job_exit = f"exit {job.proc.returncode}: {job.last_line()}"
            log(f"  the job ended: {report.job_exit}")
            break
        tree = job_tree_sample(job.proc.pid)
        for i, value in enumerate(
            (tree.driver_rss / MIB, tree.jvm_rss / MIB if tree.jvm_pid else None, tree.workers_pss / MIB)
        ):
            if value is not None and (peaks[i] is None or value > peaks[i]):  # type: ignore[operator]
                peaks[i] = value
                if i == 2:
                    workers = tree.workers
        elapsed = time.monotonic() - started
        if not scraped and elapsed >= seconds / 3:
            scraped = True
            with contextlib.suppress(OSError):
                report.series, report.topic_series, report.scrape_s, size = scrape(address)
                report.scrape_kib = size / 1024
        if not probed and probes and elapsed >= seconds / 2:
            probed = True
            rotation.probe(probes, PROBE_MESSAGES)
        time.sleep(min(settings.sample_s, max(0.1, seconds - elapsed)))
    report.traffic_s = time.monotonic() - started
    report.acked_in_window = producer.acked_total() - acked_before
    cpu_after = broker_cpu(broker)
    if cpu_before is not None and cpu_after is not None:
        report.broker_cpu_traffic = cpu_after - cpu_before
    log(
        f"  traffic done: {report.acked_in_window:,} acknowledged in {report.traffic_s:.0f} s "
        f"({report.acked_in_window / max(report.traffic_s, 1):,.0f} msg/s)"
    )
    return peaks[0], peaks[1], peaks[2], workers


def _converge(
    report: StepReport,
    settings: ScaleSettings,
    producer: Producer,
    meta: MetadataStore,
    deadline: Deadline,
    log: Callable[[str], None],
) -> None:
    wait = time.monotonic() + 60
    while producer.pending() > 0 and time.monotonic() < wait:
        time.sleep(0.2)
    # Only what moved since the seeding needs looking at (every topic-partition had a segment Offloaded then).
    last = {
        t: tr.last_id
        for t, tr in producer.traffic.items()
        if tr.last_id is not None and len(tr.acked) > settings.seed_messages
    }
    started = time.monotonic()
    if offloaded_through_all(meta, last, deadline.left(settings.converge_timeout)):
        report.converged = True
        log(
            f"  converged {time.monotonic() - started:.0f} s after the traffic: the store holds every acknowledged "
            f"message ({len(last):,} topic-partitions had traffic)"
        )
    else:
        report.notes.append(
            f"the store did not hold every acknowledged message {time.monotonic() - started:.0f} s after the traffic: "
            "the 'idle' window is the job catching up, not idle"
        )
        log(f"  {report.notes[-1]}")


def offloaded_through_all(meta: MetadataStore, last: dict[str, tuple[int, int]], timeout: float) -> bool:
    """Wait until each topic-partition's Offloaded segments reach its position in ``last``. Through a
    ``MetadataView`` (a listing per topic-partition and poll, each manifest read once), and only the
    topic-partitions not there yet: bench/readable.py's ``wait_offloaded`` reads every manifest of every
    topic-partition at every poll, too slow for a thousand busy ones."""
    view = MetadataView(meta)
    waiting = dict(last)
    deadline = time.monotonic() + timeout
    while waiting:
        for topic, position in list(waiting.items()):
            segments = view.refresh(topic).offloaded()
            if segments and segments[-1].end >= position:
                del waiting[topic]
        if not waiting or time.monotonic() >= deadline:
            break
        time.sleep(1.0)
    return not waiting


def _idle(
    report: StepReport,
    settings: ScaleSettings,
    job: JobProcess,
    counts_dir: Path,
    address: str,
    deadline: Deadline,
    log: Callable[[str], None],
) -> None:
    # Converged: nothing is open. The driver's minutely passes (retention, metrics) still read what the last
    # minute of traffic sealed: that is change, not idling, so the window starts after one of each.
    settle = max(settings.settle_s, 2 * settings.trigger_s + 1)
    time.sleep(deadline.left(settle))
    seconds = deadline.left(settings.idle_s)
    if seconds < 10 or not job.running():
        report.notes.append("no idle window (--step-minutes, or the job ended)")
        return
    log(f"  idle: {seconds:.0f} s" + (" with nothing to offload" if report.converged else " (still catching up)"))
    before, driver_before = _snapshot(counts_dir, job.proc.pid)
    where_before = _where(counts_dir, job.proc.pid)
    cpu_before = tree_cpu(job.proc.pid)
    started = time.monotonic()
    time.sleep(seconds / 2)
    with contextlib.suppress(OSError):
        series, per_topic, took, size = scrape(address)
        if report.series is None or series > report.series:
            report.series, report.topic_series, report.scrape_s, report.scrape_kib = (
                series,
                per_topic,
                took,
                size / 1024,
            )
    time.sleep(max(0.0, seconds - (time.monotonic() - started)))
    time.sleep(1.5)  # each process writes its counts once a second
    after, driver_after = _snapshot(counts_dir, job.proc.pid)
    where_after = _where(counts_dir, job.proc.pid)
    cpu_after = tree_cpu(job.proc.pid)
    report.idle_cpu_per_min = (cpu_after - cpu_before) * 60 / (time.monotonic() - started)
    window = time.monotonic() - started - 1.5
    report.idle_window_s = window
    idle = _minus(after, before)
    report.idle_per_min = _per_minute(idle, window)
    report.idle_driver_per_min = _per_minute(_minus(driver_after, driver_before), window)
    report.idle_ops_per_min = {op: n * 60 / window for op, n in sorted(idle.items())}
    where = _minus(where_after, where_before)
    report.idle_where_per_min = {k: n * 60 / window for k, n in sorted(where.items(), key=lambda kv: -kv[1])}
    log(
        f"  idle store requests / min: {_rate_text(report.idle_per_min)}; by process, operation and key: "
        + ", ".join(f"{k} {n:,.1f}" for k, n in report.idle_where_per_min.items())
    )


def _status(
    report: StepReport,
    settings: ScaleSettings,
    conf: Path,
    workdir: Path,
    env: dict[str, str],
    deadline: Deadline,
    log: Callable[[str], None],
) -> None:
    notes = []
    seconds, requests, rows, note = timed_status(
        conf, workdir, env, ["--no-broker"], deadline.left(settings.status_timeout), "status-store"
    )
    report.status_store_s, report.status_store_requests = seconds, requests
    notes.append(note)
    if not deadline.passed:
        seconds, _requests, rows, note = timed_status(
            conf, workdir, env, [], deadline.left(settings.status_timeout), "status-broker"
        )
        report.status_broker_s, report.status_rows = seconds, rows
        notes.append(note)
    report.status_note = "; ".join(n for n in notes if n)
    log(
        f"  status: store only {_opt(report.status_store_s)}, with the broker {_opt(report.status_broker_s)}"
        + (f"; {report.status_note}" if report.status_note else "")
    )


def _retention(report: StepReport, config: Any, conf: Path, log: Callable[[str], None]) -> None:
    counts = RequestCounts()
    scoped = config.store.location.open()
    meta = MetadataStore(ScopedStore(CountingStore(scoped.store, counts), scoped.prefix))
    runner = RetentionRunner(meta, PolicySource(config, str(conf)).policy_for)
    started = time.monotonic()
    runner.run_pass()
    report.retention_first_s = time.monotonic() - started
    report.retention_first_requests = counts.snapshot()
    started = time.monotonic()
    runner.run_pass()
    report.retention_steady_s = time.monotonic() - started
    report.retention_steady_requests = _minus(counts.snapshot(), report.retention_first_requests)
    log(f"  retention: first pass {report.retention_first_s:.2f} s, steady {report.retention_steady_s:.2f} s")


def _progress(report: StepReport, event_log: Path, since: float, window_end: float) -> None:
    progress = query_progress(event_log)
    if not progress:
        report.notes.append(f"no query progress in Spark's event log ({event_log})")
        return
    window = [p for p in progress if since <= progress_time(p) <= window_end]
    report.triggers = len(window)
    durations = [p.get("durationMs") or {} for p in window]
    report.latest_offset = Dist([d["latestOffset"] / 1000 for d in durations if "latestOffset" in d])
    if len(report.latest_offset.values) >= 6:
        third = len(report.latest_offset.values) // 3
        report.latest_offset_first = Dist(report.latest_offset.values[:third]).q(0.5)
        report.latest_offset_last = Dist(report.latest_offset.values[-third:]).q(0.5)
    report.query_planning = Dist([d["queryPlanning"] / 1000 for d in durations if "queryPlanning" in d])
    ran = [p for p in window if "addBatch" in (p.get("durationMs") or {})]
    report.batches = Dist([p["durationMs"]["triggerExecution"] / 1000 for p in ran])
    if ran:
        rows = [sum(float(src.get("numInputRows") or 0) for src in p.get("sources") or []) for p in ran]
        report.batch_rows = sum(rows) / len(rows)
    state = _state(progress)
    if state is not None:
        report.state_rows = state.get("numRowsTotal")
        report.state_memory_bytes = state.get("memoryUsedBytes")
        custom = state.get("customMetrics") or {}
        report.state_metrics = dict(custom)
        report.state_sst_bytes = custom.get("rocksdbSstFileSize")


def _lag_and_seal(
    report: StepReport,
    settings: ScaleSettings,
    store: Any,
    meta: MetadataStore,
    rotation: Rotation,
    probes: list[str],
    window_end: float,
) -> None:
    start = (report.traffic_started or window_end) + settings.warmup_s
    lags: list[float] = []
    for topic in sorted(rotation.windowed):
        for _manifest, readable, message in readable_messages(store, meta, topic):
            published = message.publish_time / 1000
            if start <= published <= window_end:
                lags.append(readable - published)
    report.lag = Dist(lags)
    seals: list[float] = []
    traffic_started = report.traffic_started or window_end
    for topic in probes:  # quiet but for the probe's messages, published during the traffic
        probed = [
            (readable, message.publish_time / 1000)
            for _m, readable, message in readable_messages(store, meta, topic)
            if message.publish_time / 1000 >= traffic_started
        ]
        if probed:
            seals.append(max(r for r, _ in probed) - min(p for _, p in probed))
    report.seal = Dist(seals)


# --- the closing table ------------------------------------------------------------------------------------


def _cell(value: float | None, fmt: str = ".2f") -> str:
    return "-" if value is None else f"{value:{fmt}}"


def _pair(a: float | None, b: float | None, fmt: str = ".2f") -> str:
    return f"{_cell(a, fmt)} / {_cell(b, fmt)}"


def _per_thousand(reports: list[StepReport], value: Callable[[StepReport], float | None]) -> str:
    points = [(r.topics, value(r)) for r in reports if value(r) is not None]
    if len(points) < 2 or points[-1][0] == points[0][0]:
        return "-"
    (n0, v0), (n1, v1) = points[0], points[-1]
    return f"{(v1 - v0) / (n1 - n0) * 1000:+.1f}"  # type: ignore[operator]


def closing_table(reports: list[StepReport]) -> str:
    """A Markdown table of the steps, for bench/README.md."""
    head = "| | " + " | ".join(f"{r.topics:,}" for r in reports) + " | compared with |"
    rule = "|---|" + "---|" * len(reports) + "---|"
    rows: list[tuple[str, Callable[[StepReport], str], str]] = [
        (
            "active at a time / msg/s acknowledged",
            lambda r: f"{r.active:,} / {_cell(r.acked_in_window / r.traffic_s if r.traffic_s else None, ',.0f')}",
            "",
        ),
        ("topic-partitions created on pulsar-lite (+ probes)", lambda r: f"{r.created:,}", "all of them"),
        ("creating them (s)", lambda r: _cell(r.create_s, ".0f"), ""),
        ("pulsar-lite RSS after (MiB)", lambda r: _cell(r.broker_rss_mib, ".0f"), ""),
        ("discovery first / again (s)", lambda r: _pair(r.discovery_first_s, r.discovery_again_s), "again: every 10 s"),
        (
            "one latest-positions pass: topics, s (CPU s: planner / pulsar-lite)",
            lambda r: (
                f"{_num(r.latest_pass_topics)}, {_cell(r.latest_pass_s)} "
                f"({_cell(r.latest_pass_client_cpu)} / {_cell(r.latest_pass_broker_cpu)})"
            ),
            "",
        ),
        ("job start-up to every topic offloaded (s)", lambda r: _cell(r.startup_s, ".0f"), ""),
        (
            "planning per trigger: latestOffset p50 / p99 (s)",
            lambda r: _pair(r.latest_offset.q(0.5), r.latest_offset.q(0.99)),
            "≤ 1 s",
        ),
        ("latestOffset max (s)", lambda r: _cell(r.latest_offset.max), ""),
        ("queryPlanning p50 / p99 (s)", lambda r: _pair(r.query_planning.q(0.5), r.query_planning.q(0.99)), ""),
        ("micro-batch p50 / p99 (s)", lambda r: _pair(r.batches.q(0.5), r.batches.q(0.99)), "p50 ≤ 2 s"),
        ("lag p99 of active topics (s)", lambda r: _cell(r.lag.q(0.99), ".1f"), "≤ rollover + 5 s"),
        ("idle topic sealed by the timer, p50 (s)", lambda r: _cell(r.seal.q(0.5), ".1f"), "rollover + a trigger"),
        (
            "state rows / memory (MiB)",
            lambda r: (
                f"{r.state_rows if r.state_rows is not None else '-'} / "
                f"{_cell(None if r.state_memory_bytes is None else r.state_memory_bytes / MIB, '.1f')}"
            ),
            "",
        ),
        ("driver RSS (MiB)", lambda r: _cell(r.driver_rss_mib, ".0f"), ""),
        ("JVM RSS (MiB)", lambda r: _cell(r.jvm_rss_mib, ".0f"), ""),
        ("Spark's Python processes PSS (MiB)", lambda r: _cell(r.workers_pss_mib, ".0f"), ""),
        (
            "series in one scrape (per-topic)",
            lambda r: (
                f"{r.series if r.series is not None else '-'} ({r.topic_series if r.topic_series is not None else '-'})"
            ),
            "≤ 2,000",
        ),
        ("status --no-broker / with broker (s)", lambda r: _pair(r.status_store_s, r.status_broker_s, ".1f"), ""),
        ("retention pass first / steady (s)", lambda r: _pair(r.retention_first_s, r.retention_steady_s), ""),
        (
            "idle store requests / min: LIST",
            lambda r: _cell(r.idle_per_min.get("LIST"), ",.0f"),
            "independent of topics",
        ),
        (
            "idle store requests / min: GET + HEAD",
            lambda r: _cell(
                (r.idle_per_min.get("GET", 0) + r.idle_per_min.get("HEAD", 0)) if r.idle_per_min else None, ",.0f"
            ),
            "",
        ),
        (
            "idle store requests / min: PUT + DELETE",
            lambda r: _cell(
                (r.idle_per_min.get("PUT", 0) + r.idle_per_min.get("DELETE", 0)) if r.idle_per_min else None, ",.0f"
            ),
            "",
        ),
        ("idle job CPU (s per minute)", lambda r: _cell(r.idle_cpu_per_min, ".1f"), ""),
        ("pulsar-lite: subscriptions kept at the end", lambda r: _num(r.subscriptions_end), "0 (non-durable)"),
        ("pulsar-lite: CPU s in the traffic window", lambda r: _cell(r.broker_cpu_traffic, ".0f"), ""),
        ("exactly once", lambda r: {None: "-", True: "OK", False: "FAILED"}[r.exactly_once], ""),
    ]
    lines = [head, rule]
    lines.extend(f"| {name} | " + " | ".join(cell(r) for r in reports) + f" | {cmp} |" for name, cell, cmp in rows)
    if len(reports) >= 2:
        lines.append(
            f"\nMiB per 1,000 topic-partitions (from {reports[0].topics:,} to {reports[-1].topics:,}): driver "
            f"{_per_thousand(reports, lambda r: r.driver_rss_mib)}, "
            f"JVM {_per_thousand(reports, lambda r: r.jvm_rss_mib)}, "
            f"Spark's Python processes {_per_thousand(reports, lambda r: r.workers_pss_mib)}, pulsar-lite "
            f"{_per_thousand(reports, lambda r: r.broker_rss_mib)}"
        )
    return "\n".join(lines)


# --- main -------------------------------------------------------------------------------------------------


def _steps(text: str) -> list[int]:
    try:
        steps = [int(s.replace("_", "").replace(",", "")) for s in text.split(",") if s.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected topic-partition counts like 100,1000,10000, got {text!r}") from None
    if not steps or min(steps) < 1:
        raise argparse.ArgumentTypeError("each step needs at least 1 topic-partition")
    return steps


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="bench/scale.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    d = ScaleSettings()
    parser.add_argument(
        "--topics",
        type=_steps,
        default=[100, 1000, 10000],
        help="topic-partition counts, one step each (100,1000,10000)",
    )
    parser.add_argument("--active", type=int, help="active topic-partitions at a time (default min(N, 300))")
    parser.add_argument("--rate", type=float, default=d.rate, help=f"messages/s over the active ones ({d.rate:g})")
    parser.add_argument(
        "--payload-size", type=int, default=d.payload_size, help=f"bytes per message ({d.payload_size})"
    )
    parser.add_argument(
        "--rollover-s",
        type=float,
        default=d.rollover_s,
        help=f"maxOffloadSegmentRolloverTimeSeconds ({d.rollover_s:g})",
    )
    parser.add_argument("--trigger-s", type=float, default=d.trigger_s, help=f"trigger interval ({d.trigger_s:g})")
    parser.add_argument("--minutes", type=float, default=d.minutes, help=f"minutes of traffic per step ({d.minutes:g})")
    parser.add_argument(
        "--warmup-s",
        type=float,
        default=d.warmup_s,
        help=f"seconds of traffic left out of the lag and trigger figures ({d.warmup_s:g})",
    )
    parser.add_argument(
        "--rotate-s",
        type=float,
        default=d.rotate_s,
        help=f"seconds in which the active window moves by its size ({d.rotate_s:g})",
    )
    parser.add_argument(
        "--idle-s",
        type=float,
        default=d.idle_s,
        help=f"seconds of the idle window, store requests counted ({d.idle_s:g})",
    )
    parser.add_argument(
        "--create-only",
        action="store_true",
        help="per step: create the topic-partitions, measure discovery and one latest-positions pass, no job",
    )
    parser.add_argument(
        "--settle-s",
        type=float,
        default=d.settle_s,
        help=f"seconds after the store converged before the idle window starts ({d.settle_s:g})",
    )
    parser.add_argument("--probes", type=int, default=d.probes, help=f"quiet topic-partitions probed ({d.probes})")
    parser.add_argument(
        "--seed-messages",
        type=int,
        default=d.seed_messages,
        help=f"messages that create each topic-partition ({d.seed_messages})",
    )
    parser.add_argument(
        "--create-chunk",
        type=int,
        default=d.create_chunk,
        help=f"topic-partitions created at a time (open producers) ({d.create_chunk})",
    )
    parser.add_argument(
        "--create-timeout",
        type=float,
        default=d.create_timeout,
        help=f"seconds for creating them before the step goes on with what exists ({d.create_timeout:g})",
    )
    parser.add_argument(
        "--startup-timeout",
        type=float,
        default=d.startup_timeout,
        help=f"seconds for the job's start-up ({d.startup_timeout:g})",
    )
    parser.add_argument(
        "--step-minutes",
        type=float,
        default=d.step_minutes,
        help=f"at most this long per step; waits are cut to what is left ({d.step_minutes:g})",
    )
    add_work_arguments(parser)
    args = parser.parse_args(argv)
    if args.rate <= 0 or args.minutes <= 0 or args.rollover_s <= 0 or args.trigger_s <= 0 or args.idle_s < 0:
        parser.error("--rate, --minutes, --rollover-s and --trigger-s must be > 0, --idle-s >= 0")
    if args.payload_size < 16 or args.seed_messages < 0 or args.create_chunk < 1:
        parser.error("--payload-size must be at least 16, --seed-messages at least 0, --create-chunk at least 1")

    work = new_work_dir(args.work_dir, "bench-scale-")
    configure_logging(LogSettings(log_file=str(work / "bench.log")))  # the planner's and clients' lines
    print(
        f"scale bench: Python {sys.version.split()[0]}, {os.cpu_count()} CPUs, store {args.store}; work dir {work}",
        flush=True,
    )
    reports: list[StepReport] = []
    failed = False
    try:
        for n in args.topics:
            settings = ScaleSettings(
                topics=n,
                active=args.active,
                rate=args.rate,
                payload_size=args.payload_size,
                rollover_s=args.rollover_s,
                trigger_s=args.trigger_s,
                minutes=args.minutes,
                warmup_s=args.warmup_s,
                rotate_s=args.rotate_s,
                idle_s=args.idle_s,
                settle_s=args.settle_s,
                create_only=args.create_only,
                probes=args.probes,
                seed_messages=args.seed_messages,
                create_chunk=args.create_chunk,
                create_timeout=args.create_timeout,
                startup_timeout=args.startup_timeout,
                step_minutes=args.step_minutes,
                store=args.store,
            )
            print(f"\n== {n:,} topic-partitions", flush=True)
            report = run_step(work / f"step-{n}", settings, log=lambda line: print(line, flush=True))
            reports.append(report)
            print(report.render(), flush=True)
            failed = failed or report.exactly_once is False or report.job_exit is not None
        print("\n" + closing_table(reports))
    finally:
        if args.keep or failed or not reports:
            print(f"kept {work} (per step: logs/, eventlog/, broker/pulsar-lite.log)")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
