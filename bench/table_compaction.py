"""Data files per table partition after an hour of 5 s rollovers, before and after compaction (issue 49, "Done
when": bounded by the compaction setting).

A topic that seals a segment every ``--rollover-s`` seconds, each synced to its Iceberg table at once
(``table.sync.sync_topic``: one commit, one data file per segment), ``--syncs`` times (720 x 5 s: an hour), through
the real segmenter and sink on a filesystem store (entries from memory) and the default SQLite catalog. Then one
``compact_table`` (``table.maintenance``) with ``--min-files`` and ``--target-file-mb``, expiry to the newest
snapshot and orphan removal. Printed: the data files per partition before and after, the sync and compaction
times, and the rows the table holds against those offloaded. With ``--maintain-every N`` a maintenance runs
every N syncs as the job would, and the most files a partition had at any sync is printed as well.

Run from the repository root:

    .venv/bin/python bench/table_compaction.py                         # 720 syncs of 10 entries each
    .venv/bin/python bench/table_compaction.py --syncs 720 --maintain-every 60
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

from pyiceberg.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.entries import Published, forget_sent, memory_sink, publish_to
from streamoffload.checkpoints.policy import OffloadPolicy
from streamoffload.codecs.entry import Message, build_entry
from streamoffload.storage.location import ScopedStore, parse_store_url
from streamoffload.streaming.segmenter.segmenter import run_segmenter
from streamoffload.streaming.segmenter.segmenter_model import CONTROL_SEAL, MemoryState
from streamoffload.streaming.sink.sink import SegmentSink
from streamoffload.table.catalog import catalog_settings, open_catalog
from streamoffload.table.maintenance import MaintenanceOptions, compact_table, maintain_table
from streamoffload.table.sync import sync_topic
from streamoffload.units import MIB

TOPIC = "persistent://public/default/table-compaction"
IDENT = "public.default.table-compaction"
DAY_START_MS = 1_700_006_400_000
"""2023-11-15T00:00:00Z: an hour from here stays in one day, so in one table partition."""


class Topic:
    """One topic-partition whose open segment is sealed after every ``publish``: a segment per call, of entries
    holding ``messages_per_entry`` messages each (more than 1: batched, as a producer batches), their payloads
    compressed with ``compression`` (a ``CompressionType``; 0: none)."""

    def __init__(
        self, scoped: ScopedStore, value_bytes: int, messages_per_entry: int = 1, compression: int = 0
    ) -> None:
        self.scoped = scoped
        self.value_bytes = value_bytes
        self.messages_per_entry = messages_per_entry
        self.compression = compression
        self.messages = 0
        self.state = MemoryState()
        self.sink: SegmentSink = memory_sink(scoped)
        self.policy = OffloadPolicy(maxOffloadSegmentRolloverTimeMinutes=1e6)
        self.entry = 0
        self.now = 1_000

    def publish(self, entries: int, start_ms: int, span_ms: int) -> None:
        pending = []
        for i in range(entries):
            n = self.entry
            publish = start_ms + i * span_ms // entries
            messages, first = [], self.messages  # with one message an entry, first == n
            for _ in range(self.messages_per_entry):
                m = self.messages
                value = f"{m}|".encode() + bytes([m % 256]) * self.value_bytes
                messages.append(Message(value, key=f"key-{m % 16}"))
                self.messages += 1
            data = build_entry(
                messages, producer_name="bench", sequence_id=first, publish_time=publish, compression=self.compression
            )
            pending.append(Published(3, n, data, publish))
            self.entry += 1
        actions = run_segmenter(
            TOPIC,
            self.policy,
            self.state,
            publish_to(self.sink, TOPIC, pending),
            [CONTROL_SEAL],
            now_ms=self.now,
            key_prefix=self.scoped.prefix,
            min_part_size=self.scoped.store.min_part_size,
        )
        self.sink.apply(actions)
        forget_sent(self.sink, TOPIC, self.state)
        self.now += 1


def files_per_partition(table: Table) -> Counter[str]:
    return Counter(
        table.spec().partition_to_path(task.file.partition, table.schema()) for task in table.scan().plan_files()
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--syncs", type=int, default=720, help="segments sealed and synced, one each (default 720)")
    parser.add_argument("--entries-per-sync", type=int, default=10, help="entries per segment (default 10)")
    parser.add_argument("--value-bytes", type=int, default=200, help="bytes of each message's value (default 200)")
    parser.add_argument("--rollover-s", type=float, default=5.0, help="publish time each segment spans (default 5)")
    parser.add_argument("--min-files", type=int, default=5, help="compaction's --min-files (default 5)")
    parser.add_argument("--target-file-mb", type=float, default=128.0, help="compaction's target (default 128)")
    parser.add_argument(
        "--maintain-every", type=int, default=0, metavar="N", help="maintain the table every N syncs (default 0: never)"
    )
    parser.add_argument("--dir", help="work directory (default: a new temporary one)")
    args = parser.parse_args(argv)
    work = Path(args.dir or tempfile.mkdtemp(prefix="table-compaction-"))
    location = parse_store_url(str(work / "store"))
    scoped = location.open()
    catalog = open_catalog(catalog_settings(location))
    topic = Topic(scoped, args.value_bytes)
    options = MaintenanceOptions(
        min_files=args.min_files,
        target_file_bytes=round(args.target_file_mb * MIB),
        keep_snapshots=1,
        expire_older_than_s=0,
        orphan_grace_s=0,
    )
    span_ms = round(args.rollover_s * 1000)
    hours = args.syncs * args.rollover_s / 3600
    print(
        f"table compaction bench: {args.syncs} syncs of one segment of {args.entries_per_sync} entries each "
        f"(a {args.rollover_s:g} s rollover: {hours:.2f} h of the topic), min files {args.min_files}, target "
        f"{args.target_file_mb:g} MiB, maintain every {args.maintain_every or 'never'}; work {work}"
    )
    sync_ms: list[float] = []
    most = 0
    maintain_s = 0.0
    for i in range(args.syncs):
        topic.publish(args.entries_per_sync, DAY_START_MS + i * span_ms, span_ms)
        start = time.perf_counter()
        sync_topic(scoped, catalog, TOPIC)
        sync_ms.append((time.perf_counter() - start) * 1000)
        if args.maintain_every and (i + 1) % args.maintain_every == 0:
            start = time.perf_counter()
            maintain_table(scoped, catalog, TOPIC, options)
            maintain_s += time.perf_counter() - start
        if args.maintain_every:
            most = max(most, max(files_per_partition(catalog.load_table(IDENT)).values()))
    table = catalog.load_table(IDENT)
    before = files_per_partition(table)
    rows_offloaded = topic.entry
    p99 = statistics.quantiles(sync_ms, n=100)[98] if len(sync_ms) >= 2 else sync_ms[0]
    print(
        f"before compaction: {max(before.values())} data files per partition (max), {sum(before.values())} in "
        f"{len(before)} partition(s); sync p50 {statistics.median(sync_ms):.1f} ms, p99 {p99:.1f} ms"
    )
    if args.maintain_every:
        print(
            f"maintained every {args.maintain_every} syncs: at most {most} data files per partition at any sync, "
            f"{maintain_s:.2f} s of maintenance in all"
        )
    start = time.perf_counter()
    report = compact_table(table, options)
    compact_s = time.perf_counter() - start
    maintain_table(scoped, catalog, TOPIC, replace(options, steps=("expire", "orphans")))
    table = catalog.load_table(IDENT)
    after = files_per_partition(table)
    rows = table.scan().to_arrow().num_rows
    print(
        f"after compaction: {max(after.values())} data files per partition (max), {sum(after.values())} in "
        f"{len(after)} partition(s); compaction {compact_s:.2f} s for {len(report.rewrite.removed_files)} file(s)"
    )
    print(
        f"rows: {rows:,} in the table, {rows_offloaded:,} offloaded ({'exact' if rows == rows_offloaded else 'DIFFER'})"
    )
    scoped.store.close()
    return 0 if rows == rows_offloaded else 1


if __name__ == "__main__":
    sys.exit(main())
