"""``streamoffload demo``: the whole product on the embedded default, in one command.

Starts pulsar-lite, publishes sample traffic to a partitioned and a plain topic, runs the offload
job on local Spark into a filesystem store, shows progress and status, reads entries back and checks
them byte for byte, then stops everything.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path
from typing import Any

DEMO_TOPICS = ("persistent://public/default/demo-orders", "persistent://public/default/demo-audit")


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="run the whole pipeline on the embedded default and show it working",
        description="Start the embedded pulsar-lite broker, publish sample traffic (a 3-partition topic with "
        "batching, a plain topic without), run the offload job on local Spark into a filesystem store, "
        "show status, read entries back and verify them, then stop cleanly.",
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
    from streamoffload.status import store_status
    from streamoffload.storage.read_handle import TopicReader
    from streamoffload.streaming.job import BatchReport, OffloadJob
    from streamoffload.streaming.session import build_session

    work = Path(args.work_dir).resolve()
    if work.exists() and not args.keep:
        shutil.rmtree(work)
    work.mkdir(parents=True, exist_ok=True)
    orders = partition_topics(DEMO_TOPICS[0], 3)
    audit = DEMO_TOPICS[1]

    _say("starting the embedded Pulsar broker (pulsar-lite)")
    with EmbeddedBroker(work / "broker", default_partitions=0) as broker:
        print(f"broker at {broker.service_url}")
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
service_url = "{broker.service_url}"
topics = {[*orders, audit]!r}

[store]
root = "store"

[spark]
checkpoint = "checkpoint"

[metrics]
address = ""

[offload]
managedLedgerOffloadMaxBlockSizeInBytes = 262144
maxSizePerOffloadSegmentMbytes = 0.5
maxOffloadSegmentRolloverTimeMinutes = 1
""".replace("'", '"')
        )
        config = load_config(config_path)
        _say(f"running the offload job (local Spark) into {config.store.url}")
        started = time.monotonic()
        spark = build_session(master=config.spark.master, work_dir=str(work / "spark"))
        try:
            job = OffloadJob(config, str(config_path))

            def progress(report: BatchReport) -> None:
                print(
                    f"  micro-batch {report.batch_id}: {report.parts} parts, {report.part_bytes / 1e6:.1f} MB "
                    f"uploaded, {len(report.sealed)} segments sealed ({report.duration_s:.1f} s)",
                    flush=True,
                )

            job.listeners.append(progress)
            job.run_once(spark)
        finally:
            spark.stop()
        print(f"job finished in {time.monotonic() - started:.0f} s")

    store = config.store.open()
    _say("status")
    print(render_table(store_status(MetadataStore(store, config.store.key_prefix))))

    _say("reading back from the store and checking every payload")
    reader = TopicReader(store, config.store.key_prefix)
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
    print(f"\ntry: streamoffload status --store {config.store.url}")
    print(f"     streamoffload read --store {config.store.url} {orders[0]} --messages --limit 3")
    return 1 if failures else 0
