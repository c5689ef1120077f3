"""``streamoffload demo``: the whole product on the embedded default, in one command.

Starts pulsar-lite, publishes sample traffic to a partitioned and a plain topic, runs the offload
job on local Spark into a filesystem store, shows progress and status, reads entries back and checks
them byte for byte, then stops everything.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from streamoffload.checkpoints.policy import min_block_size
from streamoffload.cli_common import configure_logging, default_log_file, log_settings
from streamoffload.config import check_config_block_sizes

DEMO_TOPICS = ("persistent://public/default/demo-orders", "persistent://public/default/demo-audit")
DEMO_BLOCK_SIZE = 6 * 1024 * 1024
"""Holds the largest entry pulsar-lite or Pulsar accepts (maxMessageSize, 5 MiB), so the demo never depends on
how full produce's batches get (``checkpoints.policy.min_block_size``)."""
assert min_block_size() <= DEMO_BLOCK_SIZE

EPILOG = """\
examples:
  streamoffload demo                          # everything under var/demo, logs in var/demo/logs/
  streamoffload demo --messages 500 --work-dir /tmp/so-demo
  streamoffload demo --log-level INFO         # more detail in the log file (the terminal stays quiet)
"""


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="run the whole pipeline on the embedded default and show it working",
        description="Start the embedded pulsar-lite broker, publish sample traffic (a 3-partition topic with "
        "batching, a plain topic without), run the offload job on local Spark into a filesystem store, "
        "show status, read entries back and verify them, then stop cleanly.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--work-dir", default="var/demo", help="where the broker, store and checkpoint live")
    parser.add_argument("--messages", type=int, default=3000, help="messages per topic-partition (default 3000)")
    parser.add_argument("--keep", action="store_true", help="keep the previous work dir instead of starting fresh")
    parser.set_defaults(func=run)


def _say(text: str) -> None:
    print(f"\n== {text}", flush=True)


def run(args: argparse.Namespace) -> int:
    from streamoffload.checkpoints.metadata_store import MetadataStore
    from streamoffload.codecs.entry import entry_messages
    from streamoffload.commands.status import render_table
    from streamoffload.config import load_config
    from streamoffload.embedded_broker import EmbeddedBroker
    from streamoffload.produce import expected_payload, partition_topics, produce
    from streamoffload.read.topic_reader import TopicReader
    from streamoffload.status import latest_positions, store_status
    from streamoffload.streaming.job.offload_job import OffloadJob
    from streamoffload.streaming.job.report import BatchReport
    from streamoffload.streaming.job.session import build_session

    work = Path(args.work_dir).resolve()
    if work.exists() and not args.keep:
        shutil.rmtree(work)
    work.mkdir(parents=True, exist_ok=True)
    settings = log_settings()
    if not settings.log_file:
        settings = configure_logging(replace(settings, log_file=str(default_log_file(work, "demo.log"))))
    orders = partition_topics(DEMO_TOPICS[0], 3)
    audit = DEMO_TOPICS[1]
    print(f"logs: {settings.log_file}")

    _say("starting the embedded Pulsar broker (pulsar-lite)")
    with EmbeddedBroker(work / "broker", default_partitions=0) as broker:
        print(f"broker at {broker.service_url} (its log: {work / 'broker' / 'pulsar-lite.log'})")
        _say(f"publishing {args.messages} messages to each of {len(orders)} partitions (batched) and to {audit}")
        produce(
            broker.service_url,
            orders,
            count=args.messages,
            payload_size=512,
            keys=16,
            batching=True,
            progress=sys.stderr,
        )
        produce(broker.service_url, audit, count=args.messages, payload_size=256, batching=False, progress=sys.stderr)

        config_path = work / "demo.toml"
        config_path.write_text(
            f"""
[pulsar]
serviceUrl = "{broker.service_url}"
topics = {[*orders, audit]!r}

[store]
root = "store"

[spark]
checkpoint = "checkpoint"

[metrics]
address = ""

[offload]
managedLedgerOffloadMaxBlockSizeInBytes = {DEMO_BLOCK_SIZE}
maxSizePerOffloadSegmentMbytes = 0.5
maxOffloadSegmentRolloverTimeMinutes = 1
""".replace("'", '"')
        )
        config = load_config(config_path)
        check_config_block_sizes(config)
        _say(f"running the offload job (local Spark) into {config.store.location.describe()}")
        started = time.monotonic()
        spark = build_session(master=config.spark.master, work_dir=str(work / "spark"))
        try:
            job = OffloadJob(config, str(config_path))

            def progress(report: BatchReport) -> None:
                print(
                    f"  micro-batch {report.batch_id}: {report.stats.parts} parts, "
                    f"{report.stats.part_bytes / 1e6:.1f} MB uploaded, {len(report.stats.sealed)} segments sealed "
                    f"({report.duration_s:.1f} s)",
                    flush=True,
                )

            job.listeners.append(progress)
            job.run_once(spark)
        finally:
            spark.stop()
        print(f"job finished in {time.monotonic() - started:.0f} s")
        scoped = config.store.location.open()
        meta = MetadataStore(scoped)
        latest = latest_positions(broker.service_url, [str(t) for t in meta.topics()])

    _say("status")
    print(render_table(store_status(meta, latest=latest)))

    _say("reading back from the store and checking every payload")
    reader = TopicReader(scoped)
    failures = 0
    for topic in [*orders, audit]:
        messages = [m for e in reader.read(topic) for m in entry_messages(e.payload)]
        size = 256 if topic == audit else 512
        bad = sum(bytes(m.payload) != expected_payload(topic, i, size) for i, m in enumerate(messages))
        ok = len(messages) == args.messages and bad == 0
        failures += not ok
        print(f"  {topic}: {len(messages)} messages read back, {'all identical' if ok else f'{bad} differ'}")
    first = next(iter(reader.read(orders[0])))
    print(f"  e.g. {orders[0]} entry {first.ledger_id}:{first.entry_id}, {len(first.payload)} bytes")
    table_failures = _query_table(config.store.location, scoped, [DEMO_TOPICS[0], audit], args.messages)
    program = _program()
    print(f"\ntry: {program} status --store {config.store.location.describe()}")
    print(f"     {program} read --store {config.store.location.describe()} {orders[0]} --messages --limit 3")
    print(f"     {program} verify --store {config.store.location.describe()} --crc")
    if table_failures is not None:
        print(f"     {program} table show --store {config.store.location.describe()}")
    print(f"logs: {settings.log_file}")
    return 1 if failures or table_failures else 0


def _query_table(location: Any, scoped: Any, topics: list[str], messages: int) -> int | None:
    """Publish the topics as Iceberg tables and print a query over one; the number of tables that do not hold every
    message (None: pyiceberg is not installed, so there is no table step)."""
    try:
        import pyarrow.compute as pc

        from streamoffload.table.catalog import catalog_settings, open_catalog
        from streamoffload.table.layout import identifier
        from streamoffload.table.sync import sync_topic
    except ModuleNotFoundError:
        print("\n(the Iceberg table step needs pyiceberg: pip install 'streamoffload[table]')")
        return None
    settings = catalog_settings(location)
    _say(f"publishing the topics as Iceberg tables ({settings.describe()})")
    catalog = open_catalog(settings)
    failures = 0
    for topic in topics:
        report = sync_topic(scoped, catalog, topic)
        table = catalog.load_table(identifier(topic))
        snapshot = table.current_snapshot()
        rows = int(snapshot.summary["total-records"] or 0) if snapshot and snapshot.summary else 0
        ok = rows == messages * (3 if topic == DEMO_TOPICS[0] else 1)
        failures += not ok
        print(f"  {report.table}: {report.rows} messages appended in {len(report.commits)} commit(s), {rows} in all")
    orders = catalog.load_table(identifier(DEMO_TOPICS[0]))
    counts = orders.scan(selected_fields=("__key",)).to_arrow().group_by("__key").aggregate([("__key", "count")])
    top = counts.sort_by([("__key_count", "descending"), ("__key", "ascending")]).slice(0, 3)
    print(f"  the most frequent keys of {'.'.join(orders.name())} (a pyiceberg scan of __key, grouped):")
    for key, count in zip(pc.cast(top["__key"], "string").to_pylist(), top["__key_count"].to_pylist(), strict=True):
        print(f"    {key}: {count}")
    return failures


def _program() -> str:
    """How the user can run this command again: ``streamoffload`` when that is on PATH and is this one, else
    the script's path (``.venv/bin/streamoffload`` after scripts/demo.sh, whose venv is not activated)."""
    invoked = Path(sys.argv[0])
    if invoked.name == "__main__.py":
        return f"{_shown(Path(sys.executable))} -m streamoffload"
    if invoked.name != "streamoffload":
        return "streamoffload"
    on_path = shutil.which("streamoffload")
    if on_path and Path(on_path).resolve() == invoked.resolve():
        return "streamoffload"
    return _shown(invoked)


def _shown(path: Path) -> str:
    """``path`` relative to the working directory when under it (no symlinks resolved: a venv's python is one)."""
    absolute = Path(os.path.abspath(path))
    try:
        return str(absolute.relative_to(Path.cwd()))
    except ValueError:
        return str(absolute)
