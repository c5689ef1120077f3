"""The Iceberg table of a topic against its references, side by side in one run (issue 49, "Done when").

Parts (``--parts a,b,c,d,e``, all by default; each prints its figures with their denominators):

- **(a) rows into the table ÷ pyarrow alone.** ``--segments`` segments of ``--entries-per-segment`` entries (of
  ``--messages-per-entry`` messages, batched as a producer batches, ``--value-bytes`` bytes each) written by the
  real segmenter and sink to a filesystem store, then one ``table.sync.sync_topic`` (SQLite catalog) into the
  topic's empty table: rows per second, best of ``--rounds`` (the table dropped and created again between, its
  creation timed apart: a topic's first sync creates it, once). Beside it, alternating with it on the same
  segments, the sync as it wrote before ``table.data_files`` (``previous_sync``: the rows cast to the table's
  Arrow schema, pyiceberg's writer, one commit). The reference: the same rows (each data file the sync wrote,
  read back) written again by ``pyarrow.parquet.write_table`` alone, zstd, one file each, best of as many rounds.
  Target >= 0.5 (wall; the CPU ratio beside it). A rate, so 1M rows by default: a sync of 100,000 spends a tenth
  of its time on the commit's fixed cost, which part (b) measures as lag. Then the bound of any faster reader: the
  same sync with each read task's batches replayed from memory (read once before, untimed), so only writing and
  committing are timed.
- **(b) the table's lag behind the store.** The continuous job (``run_forever``, a ``local[2]`` session) on
  pulsar-lite with ``offloadTable`` on, ``--rollover-s`` rollover, while ``produce`` publishes ``--rate`` msg/s for
  ``--minutes``; per segment, its snapshot's commit time (``timestamp-ms``: the snapshot whose summary names the
  segment) minus the segment's commit to the store (its manifest's ``offloadedTimestamp``): p50 / p99. Target
  p99 <= 30 s.
- **(c) data files per partition with the job's maintenance on.** ``--syncs`` 5 s rollovers of one segment each,
  synced by the job's ``TableFollower`` (its clock advanced ``--rollover-s`` per sync, no waiting), which maintains
  the table every ``--maintain-every`` of that clock with ``--min-files``; the most data files any partition had
  after any sync, against the bound the setting gives (``maintain-every / rollover + min-files + 1``), and the
  rows exact. ``bench/table_compaction.py`` does the same without the follower, compaction on against off.
- **(d) DuckDB over the table ÷ Spark over the store.** ``SELECT __key, count(*) ... GROUP BY __key`` by DuckDB over
  the Parquet files the table's current snapshot lists, and the same aggregation through
  ``spark.read.format("pulsar-offloaded")`` over the store the table was synced from (part b's, else part e's
  sync-on store, else a ``run --once`` of its own); best of ``--runs``, their results checked equal.
- **(e) the job's steady offload rate, sync on ÷ off.** A backlog of ``--backlog-mb`` MB published to fresh topics,
  drained by the continuous job with ``offloadTable`` off, then on (``--repeat`` rounds alternating); steady rate:
  the entry bytes of every segment but the first over the time from the first segment's commit to the last's (the
  job's start-up left out). Target >= 0.8.

Run from the repository root (the machine's load average is printed beside the figures):

    .venv/bin/python bench/table.py --parts a,c                        # no Spark: ~1 min
    .venv/bin/python bench/table.py --rate 2000 --minutes 5            # every part
    .venv/bin/python bench/table.py --parts c --syncs 720 --maintain-every 10m   # an hour of 5 s rollovers
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import fs_store_section, new_work_dir
from bench.readable import percentile, wait_offloaded
from bench.table_compaction import DAY_START_MS, IDENT, TOPIC, Topic, files_per_partition
from streamoffload.checkpoints import manifest as mf
from streamoffload.checkpoints.metadata_store import MetadataStore
from streamoffload.checkpoints.policy import OffloadPolicy
from streamoffload.codecs.entry import CompressionType
from streamoffload.codecs.topics import TopicName
from streamoffload.config import Config, TableSettings, parse_config
from streamoffload.read import dataset_read
from streamoffload.storage.location import StoreLocation, parse_store_url
from streamoffload.streaming.job.tables import TableFollower
from streamoffload.table import sync as table_sync
from streamoffload.table.catalog import catalog_settings, open_catalog
from streamoffload.table.data_files import UNIQUE_COLUMNS, dictionary_columns
from streamoffload.table.position import segments_of
from streamoffload.table.status import table_status
from streamoffload.table.sync import open_table, sync_topic, table_name
from streamoffload.units import parse_duration_ms

NAMESPACE = "persistent://public/default"
PARTS = ("a", "b", "c", "d", "e")


def load() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.1f} (5 min {five:.1f})"


# --- (a) rows per second into the table ÷ pyarrow alone ------------------------------------------------------

PREVIOUS_IDENT = "public.default.table-compaction-previous"


def create_previous(catalog: Any) -> None:
    """The table ``previous_sync`` writes (created beforehand, as ``part_a`` creates the sync's)."""
    from streamoffload.table import layout
    from streamoffload.table.sync import TABLE_PROPERTIES

    catalog.create_namespace_if_not_exists(("public", "default"))
    catalog.create_table(
        PREVIOUS_IDENT, layout.SCHEMA, partition_spec=layout.partition_spec(False), properties=TABLE_PROPERTIES
    )


def previous_sync(scoped: Any, catalog: Any) -> tuple[int, int]:
    """The sync as it wrote before ``table.data_files`` (session 43): each read task's rows cast to the table's
    Arrow schema (large types), written by pyiceberg's ``_dataframe_to_data_files``, all committed in one
    fast-append snapshot, into a table of its own (``create_previous``). Returns its rows and data files."""
    import uuid

    import pyarrow as pa
    from pyiceberg.io.pyarrow import _dataframe_to_data_files
    from pyiceberg.manifest import DataFile

    from streamoffload.read.dataset_plan import DEFAULT_MAX_PARTITION_BYTES, PositionBounds, segment_tasks
    from streamoffload.read.dataset_read import read_task
    from streamoffload.table import layout

    table = catalog.load_table(PREVIOUS_IDENT)
    arrow = layout.SCHEMA.as_arrow()
    renamed = {"ledger_id": "__ledgerId", "entry_id": "__entryId", "batch_index": "__batchIndex"}
    files: list[DataFile] = []
    rows = 0
    for n, segment in enumerate(MetadataStore(scoped).offloaded_segments(TOPIC)):
        for i, task in enumerate(
            segment_tasks(scoped.store, TOPIC, segment, PositionBounds(), DEFAULT_MAX_PARTITION_BYTES)
        ):
            tables = []
            for batch in read_task(scoped, task):
                columns = [
                    pa.array([-1] * batch.num_rows, pa.int32())
                    if f.name == "partition"
                    else batch.column(renamed.get(f.name, f.name))
                    for f in arrow
                ]
                tables.append(pa.Table.from_arrays(columns, names=arrow.names).cast(arrow))
            data = pa.concat_tables(tables)
            write_uuid = uuid.uuid5(uuid.NAMESPACE_URL, f"{n}/{i}")
            files += _dataframe_to_data_files(table.metadata, data, table.io, write_uuid=write_uuid)
            rows += data.num_rows
    tx = table.transaction()
    with tx.update_snapshot(snapshot_properties={"bench": "previous"}).fast_append() as append:
        for data_file in files:
            append.append_data_file(data_file)
    tx.commit_transaction()
    return rows, len(files)


def part_a(args: argparse.Namespace, work: Path) -> bool:
    location = parse_store_url(str(work / "a-store"))
    scoped = location.open()
    catalog = open_catalog(catalog_settings(location))
    topic = Topic(scoped, args.value_bytes, args.messages_per_entry, CompressionType.Value(args.compression.upper()))
    span_ms = round(args.rollover_s * 1000)
    for i in range(args.segments):
        topic.publish(args.entries_per_segment, DAY_START_MS + i * span_ms, span_ms)
    rows = topic.messages
    syncs: list[tuple[float, float]] = []  # (wall, CPU) of each round, the sync as it is
    befores: list[tuple[float, float]] = []  # the same of the sync as it was (``previous_sync``)
    before_rows = 0
    report = None
    creates: list[float] = []  # the table's creation, before each round's sync: once in a topic's life
    for _ in range(args.rounds):  # alternating, on the same store: both read the same segments
        create_previous(catalog)
        cpu, start = time.process_time(), time.perf_counter()
        before_rows, before_files = previous_sync(scoped, catalog)
        befores.append((time.perf_counter() - start, time.process_time() - cpu))
        catalog.purge_table(PREVIOUS_IDENT)
        if report is not None:
            catalog.purge_table(IDENT)
        start = time.perf_counter()
        open_table(catalog, scoped, TopicName.parse(TOPIC), create=True)
        creates.append(time.perf_counter() - start)
        cpu, start = time.process_time(), time.perf_counter()
        report = sync_topic(scoped, catalog, TOPIC)
        syncs.append((time.perf_counter() - start, time.process_time() - cpu))
    assert report is not None
    sync_s, sync_cpu = min(syncs)
    before_s, before_cpu = min(befores)
    table = catalog.load_table(IDENT)
    paths = [task.file.file_path.removeprefix("file://") for task in table.scan().plan_files()]
    table_bytes = sum(os.path.getsize(p) for p in paths)
    datas = [pq.read_table(p) for p in paths]  # the same rows, as the sync wrote them, in memory
    arrows, arrow_bytes = pyarrow_rounds(datas, work / "a-pyarrow", args.rounds)  # the reference at its best too
    arrow_s, arrow_cpu = min(arrows)
    arrow_rows = sum(d.num_rows for d in datas)
    unique = dictionary_columns(datas[0].schema)  # the table's own settings: no dictionary for a message's bytes
    sames, same_bytes = pyarrow_rounds(datas, work / "a-pyarrow-same", args.rounds, use_dictionary=unique)
    same_s = min(sames)[0]
    scoped.store.close()
    ratio = (rows / sync_s) / (arrow_rows / arrow_s)
    before_ratio = (before_rows / before_s) / (arrow_rows / arrow_s)
    print(
        f"(a) {args.segments} segments of {args.entries_per_segment} entries of {args.messages_per_entry} "
        f"message(s) ({args.value_bytes} B values"
        + ("" if args.compression == "none" else f", {args.compression.upper()} payloads")
        + f"), best of {args.rounds} alternating rounds, {load()}"
    )
    print(
        f"  table (sync_topic)   {rows:>10,} rows in {sync_s:7.2f} s {rows / sync_s:>12,.0f} rows/s  "
        f"(CPU {sync_cpu:.2f} s; {len(report.commits)} commits, {len(paths)} data files, {table_bytes:,} B; rounds "
        + ", ".join(f"{w:.2f} s/CPU {c:.2f} s" for w, c in syncs)
        + ")"
    )
    print(
        f"  previous sync        {before_rows:>10,} rows in {before_s:7.2f} s {before_rows / before_s:>12,.0f} rows/s  "
        f"(CPU {before_cpu:.2f} s; pyiceberg's writer, {before_files} data files; rounds "
        + ", ".join(f"{w:.2f} s/CPU {c:.2f} s" for w, c in befores)
        + ")"
    )
    print(
        f"  pyarrow alone (zstd) {arrow_rows:>10,} rows in {arrow_s:7.2f} s {arrow_rows / arrow_s:>12,.0f} rows/s  "
        f"(CPU {arrow_cpu:.2f} s; {len(datas)} files, {arrow_bytes:,} B; rounds "
        + ", ".join(f"{w:.2f} s/CPU {c:.2f} s" for w, c in arrows)
        + ")"
    )
    print(
        f"  pyarrow, the table's settings {arrow_rows:>10,} rows in {same_s:7.2f} s "
        f"{arrow_rows / same_s:>12,.0f} rows/s  (zstd, no dictionary for {', '.join(sorted(UNIQUE_COLUMNS))}; "
        f"{same_bytes:,} B)"
    )
    verdict = bool(ratio >= 0.5 and rows == arrow_rows == report.rows == before_rows)
    print(
        f"  table ÷ pyarrow: {ratio:.2f} (target >= 0.5) {'met' if ratio >= 0.5 else 'MISSED'}; by CPU "
        f"{arrow_cpu / sync_cpu:.2f}; the previous sync {before_ratio:.2f}, by CPU {arrow_cpu / before_cpu:.2f}; "
        f"sync ÷ previous {before_s / sync_s:.2f}x by wall, {before_cpu / sync_cpu:.2f}x by CPU"
    )
    print(
        f"  table ÷ pyarrow with the table's settings: {(rows / sync_s) / (arrow_rows / same_s):.2f} (the target's "
        "reference is pyarrow's own settings, above)"
    )
    create_s = statistics.median(creates)
    print(
        f"  the table's creation (a topic's first sync; before each round, not timed): median {create_s:.3f} s; "
        f"with it, table ÷ pyarrow {(rows / (sync_s + create_s)) / (arrow_rows / arrow_s):.2f}"
    )
    scoped = location.open()
    free_s, free_rows = free_reader_sync(scoped, catalog, args.rounds)
    scoped.store.close()
    if free_rows != rows:
        raise SystemExit(f"(a) the sync with replayed reads wrote {free_rows:,} rows, not {rows:,}")
    print(
        f"  the sync with reads that cost nothing (each read task's batches replayed from memory), best of "
        f"{args.rounds}: {free_s:.2f} s, table ÷ pyarrow {(free_rows / free_s) / (arrow_rows / arrow_s):.2f}: "
        "what the rest of the sync (writing, committing) allows any faster reader"
    )
    return verdict


def pyarrow_rounds(
    datas: list[pa.Table], out: Path, rounds: int, **options: Any
) -> tuple[list[tuple[float, float]], int]:
    """(wall, CPU) of each of ``rounds`` rounds of pyarrow alone writing ``datas`` as zstd Parquet files (with
    ``options``), each round to new files under ``out``-<round>, and the bytes of the last round's files."""
    times: list[tuple[float, float]] = []
    for r in range(rounds):
        directory = Path(f"{out}-{r}")
        directory.mkdir()
        cpu, start = time.process_time(), time.perf_counter()
        for i, data in enumerate(datas):
            pq.write_table(data, directory / f"{i:05d}.parquet", compression="zstd", **options)
        times.append((time.perf_counter() - start, time.process_time() - cpu))
    return times, sum(p.stat().st_size for p in directory.iterdir())


def free_reader_sync(scoped: Any, catalog: Any, rounds: int) -> tuple[float, int]:
    """Best wall time (and rows) of ``sync_topic`` into a new table when ``table.sync``'s ``read_tasks`` replays
    batches read before, untimed: the bound the writing and committing set, whatever the reader."""
    real = dataset_read.read_tasks
    replays: dict[tuple[Any, ...], list[tuple[int, Any]]] = {}

    def replayed(location: Any, tasks: Any, **kwargs: Any) -> Iterator[tuple[int, Any]]:
        key = tuple((t.manifest, t.start, t.end, t.first_block, t.last_block) for t in tasks)
        if key not in replays:
            replays[key] = list(real(location, tasks, **kwargs))
        return iter(replays[key])

    walls: list[float] = []
    rows = 0
    seam = table_sync.__dict__  # the sync's own name for read_tasks: the one seam the bound replaces
    seam["read_tasks"] = replayed
    try:
        for r in range(rounds + 1):  # the first round reads (and is not timed)
            catalog.purge_table(IDENT)
            open_table(catalog, scoped, TopicName.parse(TOPIC), create=True)
            start = time.perf_counter()
            report = sync_topic(scoped, catalog, TOPIC)
            if r:
                walls.append(time.perf_counter() - start)
            rows = report.rows
    finally:
        seam["read_tasks"] = real
    return min(walls), rows


# --- (c) data files per partition with the job's maintenance on ----------------------------------------------


@dataclass
class Clock:
    now: float = 0.0

    def __call__(self) -> float:
        return self.now


def part_c(args: argparse.Namespace, work: Path) -> bool:
    location = parse_store_url(str(work / "c-store"))
    scoped = location.open()
    topic = Topic(scoped, args.value_bytes)
    clock = Clock()
    settings = TableSettings(
        commit_interval=f"{args.rollover_s:g}s", maintain_every=args.maintain_every, compact_min_files=args.min_files
    )
    follower = TableFollower(
        location,
        settings,
        lambda _topic: OffloadPolicy(offloadTable=True),
        epoch=1,
        check_lease=lambda: None,
        clock=clock,
    )
    catalog = open_catalog(catalog_settings(location))
    span_ms = round(args.rollover_s * 1000)
    most = 0
    sync_s: list[float] = []
    start_all = time.perf_counter()
    for i in range(args.syncs):
        topic.publish(args.entries_per_sync, DAY_START_MS + i * span_ms, span_ms)
        follower.mark([TOPIC])
        start = time.perf_counter()
        follower.sync_due()
        sync_s.append(time.perf_counter() - start)
        most = max(most, max(files_per_partition(catalog.load_table(IDENT)).values()))
        clock.now += args.rollover_s
    wall = time.perf_counter() - start_all
    [figures] = follower.figures()
    follower.stop()
    table = catalog.load_table(IDENT)
    now = files_per_partition(table)
    rows = table.scan().to_arrow().num_rows
    every_s = settings.maintain_every_s
    bound = (int(every_s // args.rollover_s) + args.min_files + 1) if every_s else args.syncs
    hours = args.syncs * args.rollover_s / 3600
    print(
        f"(c) {args.syncs} syncs of a {args.rollover_s:g} s rollover ({hours:.2f} h of the topic) by the job's "
        f"follower, maintain every {args.maintain_every}, min files {args.min_files}; {load()}"
    )
    print(
        f"  data files per partition: at most {most} after any sync (bound {bound}: maintain-every ÷ rollover + "
        f"min files + 1), {max(now.values())} now, {sum(now.values())} in {len(now)} partition(s); without "
        f"maintenance {args.syncs}"
    )
    print(
        f"  {figures.maintenances} maintenances, {figures.files_compacted} files compacted, "
        f"{figures.maintenance_failures} failed; syncs {figures.commits} (p50 {statistics.median(sync_s) * 1000:.0f} "
        f"ms incl. maintenance, max {max(sync_s):.2f} s), {wall:.1f} s in all"
    )
    exact = rows == topic.entry
    print(f"  rows: {rows:,} in the table, {topic.entry:,} offloaded ({'exact' if exact else 'DIFFER'})")
    scoped.store.close()
    return bool(exact and most <= bound and figures.maintenance_failures == 0)


# --- the job on pulsar-lite: (b), (d), (e) -------------------------------------------------------------------


def job_config(args: argparse.Namespace, work: Path, name: str, service_url: str, topic: str, *, table: bool) -> Config:
    doc: dict[str, Any] = {
        "pulsar": {"service_url": service_url, "topics": [topic]},
        "store": fs_store_section(work / f"store-{name}"),
        "spark": {"checkpoint": str(work / f"checkpoint-{name}"), "trigger_interval": args.trigger_interval},
        "metrics": {"address": ""},
        "offload": {
            "maxOffloadSegmentRolloverTimeSeconds": args.rollover_s,
            "maxSizePerOffloadSegmentMbytes": args.segment_mb,
        },
        "table": {"commit_interval": args.commit_interval, "maintain_every": args.maintain_every},
    }
    if table:
        doc["topics"] = {topic: {"offloadTable": True}}
    return parse_config(doc, f"<bench table {name}>")


class RunningJob:
    """``OffloadJob.run_forever`` in a thread, stopped by ``stop``."""

    def __init__(self, spark: Any, config: Config) -> None:
        from streamoffload.streaming.job.offload_job import OffloadJob

        self.job = OffloadJob(config)
        self.failure: list[BaseException] = []
        self.thread = threading.Thread(target=self._run, args=(spark,), name="offload-job", daemon=True)
        self.thread.start()

    def _run(self, spark: Any) -> None:
        try:
            self.job.run_forever(spark)
        except BaseException as err:  # reported by the main thread
            self.failure.append(err)

    def check(self) -> None:
        if self.failure:
            raise RuntimeError(f"the offload job failed: {self.failure[0]}")

    def stop(self) -> None:
        self.job.stop()
        self.thread.join(120)


def last_positions(summary: Any) -> dict[str, tuple[int, int]]:
    return {
        name: (part.last_message_id[0], part.last_message_id[1])
        for name, part in summary.partitions.items()
        if part.last_message_id is not None
    }


def poll(condition: Callable[[], bool], what: str, timeout_s: float) -> float:
    """Seconds until ``condition`` held."""
    start = time.monotonic()
    while not condition():
        if time.monotonic() - start > timeout_s:
            raise RuntimeError(f"not within {timeout_s:.0f} s: {what}")
        time.sleep(0.25)
    return time.monotonic() - start


def table_caught_up(config: Config, topic: str) -> Callable[[], bool]:
    location = config.store.location

    def check() -> bool:
        scoped = location.open()
        try:
            catalog = open_catalog(catalog_settings(location, config.table.catalog, config.table.warehouse))
            status = table_status(scoped, catalog, topic)
            return status.exists and status.segments_behind == 0
        finally:
            scoped.store.close()

    return check


@dataclass
class Offloaded:
    """A topic offloaded by the job (parts b and e), for part d."""

    config: Config
    topic: str
    messages: int


def part_b(args: argparse.Namespace, spark: Any, service_url: str, work: Path) -> tuple[bool, Offloaded]:
    from streamoffload.produce import produce

    topic = f"{NAMESPACE}/bench-table-lag"
    config = job_config(args, work, "b", service_url, topic, table=True)
    scoped = config.store.location.open()
    meta = MetadataStore(scoped)
    running = RunningJob(spark, config)
    try:
        seconds = args.minutes * 60
        summary = produce(
            service_url,
            topic,
            None,
            args.payload_size,
            duration=seconds,
            rate=args.rate,
            keys=args.keys,
            batching=True,
            batch_size=args.batch_size,
        )
        running.check()
        wait_offloaded(meta, last_positions(summary), args.rollover_s * 4 + 120)
        poll(table_caught_up(config, topic), "the table caught up with the store", 300)
        running.check()
    finally:
        running.stop()
    location = config.store.location
    catalog = open_catalog(catalog_settings(location, config.table.catalog, config.table.warehouse))
    table = catalog.load_table(table_name(topic))
    committed: dict[str, int] = {}  # segment uuid -> its snapshot's commit, ms
    for snapshot in table.metadata.snapshots:
        for ids in segments_of(snapshot).values():
            for sid in ids:
                committed[sid] = snapshot.timestamp_ms
    lags: list[float] = []
    unnamed = 0  # segments no snapshot kept names (expired snapshots)
    for manifest in meta.manifests(topic):
        if manifest.status == mf.OFFLOADED:
            at = committed.get(str(mf.manifest_uuid(manifest)))
            if at is None:
                unnamed += 1
            else:
                lags.append((at - manifest.offloadedTimestamp) / 1000)
    scoped.store.close()
    rows = table.scan().to_arrow().num_rows
    p50, p99 = percentile(lags, 0.5), percentile(lags, 0.99)
    print(
        f"(b) {summary.messages:,} messages at {summary.rate:,.0f} msg/s for {seconds:g} s ({args.payload_size} B, "
        f"batched by {args.batch_size}), rollover {args.rollover_s:g} s, commit interval {args.commit_interval}; "
        f"{load()}"
    )
    print(
        f"  table behind the store (snapshot commit - segment commit) over {len(lags)} segments in "
        f"{len(table.metadata.snapshots)} snapshots: p50 {p50:.2f} s, p99 {p99:.2f} s, max {max(lags):.2f} s "
        f"(target p99 <= 30 s) {'met' if p99 <= 30 else 'MISSED'}"
        + (f"; {unnamed} segments in expired snapshots not counted" if unnamed else "")
    )
    exact = rows == summary.messages
    print(f"  rows: {rows:,} in the table, {summary.messages:,} published ({'exact' if exact else 'DIFFER'})")
    return exact and p99 <= 30, Offloaded(config, topic, summary.messages)


def part_e(args: argparse.Namespace, spark: Any, service_url: str, work: Path) -> tuple[bool, Offloaded | None]:
    from streamoffload.produce import produce

    payload_bytes = args.backlog_mb * 1e6
    count = int(payload_bytes // args.payload_size)
    rates: dict[str, list[float]] = {"off": [], "on": []}
    offloaded: Offloaded | None = None
    print(
        f"(e) a backlog of {count:,} messages of {args.payload_size} B ({args.backlog_mb:g} MB, batched by "
        f"{args.batch_size}), segments of {args.segment_mb:g} MiB, drained by the continuous job; {load()}"
    )
    for round_no in range(1, args.repeat + 1):
        for side in ("off", "on"):
            name = f"e{round_no}-{side}"
            topic = f"{NAMESPACE}/bench-table-{name}"
            summary = produce(service_url, topic, count, args.payload_size, keys=args.keys, batch_size=args.batch_size)
            config = job_config(args, work, name, service_url, topic, table=side == "on")
            scoped = config.store.location.open()
            meta = MetadataStore(scoped)
            started = time.monotonic()
            running = RunningJob(spark, config)
            try:
                wait_offloaded(meta, last_positions(summary), 600)
                wall = time.monotonic() - started
                catch_up = poll(table_caught_up(config, topic), "the table caught up", 300) if side == "on" else 0.0
                running.check()
            finally:
                running.stop()
            manifests = sorted(
                (m for m in meta.manifests(topic) if m.status == mf.OFFLOADED), key=lambda m: m.offloadedTimestamp
            )
            scoped.store.close()
            if len(manifests) < 2:
                raise RuntimeError(f"{topic}: {len(manifests)} segment(s): a larger --backlog-mb is needed")
            steady_bytes = sum(m.entryBytes for m in manifests[1:])
            steady_s = (manifests[-1].offloadedTimestamp - manifests[0].offloadedTimestamp) / 1000
            rate = steady_bytes / 1e6 / steady_s
            rates[side].append(rate)
            tail = f"; the table caught up {catch_up:.1f} s after" if side == "on" else ""
            print(
                f"  round {round_no} sync {side:3}: {steady_bytes / 1e6:,.1f} MB in {len(manifests) - 1} segments in "
                f"{steady_s:.2f} s = {rate:,.1f} MB/s steady (all offloaded {wall:.1f} s after the job's start"
                f"{tail}); {load()}"
            )
            if side == "on":
                offloaded = Offloaded(config, topic, summary.messages)
    on, off = statistics.median(rates["on"]), statistics.median(rates["off"])
    ratio = on / off
    print(
        f"  steady rate, sync on ÷ off: {on:,.1f} ÷ {off:,.1f} MB/s = {ratio:.2f} (median of {args.repeat}; "
        f"target >= 0.8) {'met' if ratio >= 0.8 else 'MISSED'}"
    )
    return ratio >= 0.8, offloaded


def run_once_offloaded(args: argparse.Namespace, spark: Any, service_url: str, work: Path) -> Offloaded:
    """Part d alone: a topic offloaded by ``run --once`` with its table synced at the end."""
    from streamoffload.produce import produce
    from streamoffload.streaming.job.offload_job import OffloadJob

    topic = f"{NAMESPACE}/bench-table-d"
    count = int(args.backlog_mb * 1e6 // args.payload_size)
    summary = produce(service_url, topic, count, args.payload_size, keys=args.keys, batch_size=args.batch_size)
    config = job_config(args, work, "d", service_url, topic, table=True)
    OffloadJob(config).run_once(spark)
    return Offloaded(config, topic, summary.messages)


def part_d(args: argparse.Namespace, spark: Any, offloaded: Offloaded) -> bool:
    import duckdb

    location: StoreLocation = offloaded.config.store.location
    catalog = open_catalog(catalog_settings(location, offloaded.config.table.catalog, offloaded.config.table.warehouse))
    table = catalog.load_table(table_name(offloaded.topic))
    files = [task.file.file_path.removeprefix("file://") for task in table.scan().plan_files()]
    store_url = f"file://{Path(location.path).resolve()}"  # the bench's stores are on the filesystem

    def by_duckdb() -> dict[bytes | None, int]:
        con = duckdb.connect()
        got = con.execute("SELECT __key, count(*) FROM read_parquet(?) GROUP BY __key", [files]).fetchall()
        return {None if k is None else bytes(k): int(n) for k, n in got}

    def by_spark() -> dict[bytes | None, int]:
        df = spark.read.format("pulsar-offloaded").option("store", store_url).option("topics", offloaded.topic)
        got = df.load().groupBy("__key").count().collect()
        return {None if r["__key"] is None else bytes(r["__key"]): int(r["count"]) for r in got}

    def best(fn: Callable[[], dict[bytes | None, int]]) -> tuple[float, float, dict[bytes | None, int]]:
        walls = []
        out: dict[bytes | None, int] = {}
        cpu = 0.0
        for _ in range(args.runs):
            c, start = time.process_time(), time.perf_counter()
            out = fn()
            walls.append(time.perf_counter() - start)
            cpu = time.process_time() - c
        return min(walls), cpu, out

    duck_s, duck_cpu, duck = best(by_duckdb)
    spark_s, _, sparked = best(by_spark)
    rows = sum(duck.values())
    same = duck == sparked and rows == offloaded.messages
    print(
        f"(d) SELECT __key, count(*) GROUP BY __key over {rows:,} rows, {len(duck)} keys (best of {args.runs}); "
        f"{load()}"
    )
    print(
        f"  DuckDB over the table's {len(files)} Parquet files  {duck_s:7.3f} s  (CPU of this process {duck_cpu:.2f} s)"
    )
    print(f"  Spark over pulsar-offloaded (local[2])        {spark_s:7.3f} s")
    print(
        f"  DuckDB ÷ Spark time: {duck_s / spark_s:.3f} (Spark takes {spark_s / duck_s:.1f}x); results "
        f"{'equal' if same else 'DIFFER'}"
    )
    return same


# --- main --------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", default=",".join(PARTS), help="which parts, comma-separated (default a,b,c,d,e)")
    parser.add_argument("--value-bytes", type=int, default=200, help="(a, c) bytes of each message's value (200)")
    parser.add_argument("--segments", type=int, default=40, help="(a) segments synced in one sync_topic (40)")
    parser.add_argument(
        "--entries-per-segment",
        type=int,
        default=2500,
        help="(a) entries per segment (2500: with the defaults 1M rows, 230 MB; 500 gives a sync of 100,000 rows, "
        "where the commit's fixed ~10 ms is a tenth of the sync)",
    )
    parser.add_argument(
        "--messages-per-entry", type=int, default=10, help="(a) messages per entry, batched when > 1 (default 10)"
    )
    parser.add_argument("--rounds", type=int, default=2, help="(a) alternating rounds of each sync, best of (2)")
    parser.add_argument(
        "--compression",
        choices=["none", "lz4", "zlib", "zstd", "snappy"],
        default="none",
        help="(a) the producer's compression of each entry's payload (default none)",
    )
    parser.add_argument("--entries-per-sync", type=int, default=10, help="(c) entries per 5 s segment (10)")
    parser.add_argument("--rollover-s", type=float, default=5.0, help="(b, c, e) the rollover, seconds (default 5)")
    parser.add_argument("--syncs", type=int, default=720, help="(c) syncs of one segment each (720: an hour)")
    parser.add_argument("--maintain-every", default="10m", help="(b, c, e) [table] maintain_every (default 10m)")
    parser.add_argument("--min-files", type=int, default=5, help="(c) [table] compact_min_files (default 5)")
    parser.add_argument("--rate", type=float, default=2000, help="(b) publish rate, msg/s (default 2000)")
    parser.add_argument("--minutes", type=float, default=5, help="(b) how long to publish (default 5)")
    parser.add_argument("--commit-interval", default="10s", help="(b, d, e) [table] commit_interval (default 10s)")
    parser.add_argument("--payload-size", type=int, default=1024, help="(b, d, e) bytes per message (1024)")
    parser.add_argument("--batch-size", type=int, default=32, help="(b, d, e) messages per batched entry (32)")
    parser.add_argument("--keys", type=int, default=100, help="(b, d, e) distinct message keys (100)")
    parser.add_argument("--backlog-mb", type=float, default=200, help="(d alone, e) backlog, MB of payload (200)")
    parser.add_argument("--segment-mb", type=float, default=16, help="(b, d, e) maxSizePerOffloadSegmentMbytes (16)")
    parser.add_argument("--repeat", type=int, default=1, help="(e) rounds of sync off then on; medians (1)")
    parser.add_argument("--runs", type=int, default=2, help="(d) runs of each query, best of (2)")
    parser.add_argument("--trigger-interval", default="1 second", help="(b, d, e) the job's trigger (1 second)")
    parser.add_argument("--work-dir", help="parent of the temporary work directory (default: the system's)")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args(argv)
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        parser.error(f"unknown part(s) {', '.join(unknown)}: choose from {','.join(PARTS)}")
    try:
        if args.maintain_every.strip() != "0":
            parse_duration_ms(args.maintain_every)
    except ValueError as err:
        parser.error(f"--maintain-every: {err}")
    work = new_work_dir(args.work_dir, "bench-table-")
    print(
        f"table bench: Python {sys.version.split()[0]}, {os.cpu_count()} CPUs, parts {','.join(parts)}, "
        f"{load()}; work {work}"
    )
    met = True
    try:
        if "a" in parts:
            met &= part_a(args, work)
        if "c" in parts:
            met &= part_c(args, work)
        if {"b", "d", "e"} & set(parts):
            met &= spark_parts(args, parts, work)
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    print(f"verdict: {'every target met' if met else 'a target MISSED (or rows differ): see above'}")
    return 0 if met else 1


def spark_parts(args: argparse.Namespace, parts: list[str], work: Path) -> bool:
    from bench.logs import log_beside
    from streamoffload.embedded_broker import EmbeddedBroker
    from streamoffload.streaming.job.session import build_session

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    log_beside(work)
    met = True
    spark = build_session(
        master="local[2]",
        app_name="bench-table",
        work_dir=str(work / "spark"),
        extra_conf={"spark.ui.showConsoleProgress": "false"},
    )
    try:
        with EmbeddedBroker(work / "broker") as broker:
            offloaded: Offloaded | None = None
            if "b" in parts:
                ok, offloaded = part_b(args, spark, broker.service_url, work)
                met &= ok
            if "e" in parts:
                ok, on = part_e(args, spark, broker.service_url, work)
                met &= ok
                offloaded = offloaded or on
            if "d" in parts:
                met &= part_d(args, spark, offloaded or run_once_offloaded(args, spark, broker.service_url, work))
    finally:
        spark.stop()
    return met


if __name__ == "__main__":
    sys.exit(main())
