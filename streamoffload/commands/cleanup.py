"""``streamoffload cleanup``: remove what crashed or abandoned attempts left behind."""

from __future__ import annotations

import argparse
from typing import Any

from streamoffload.checkpoints.metadata_store import MetadataStore
from streamoffload.cli_common import add_store_args, config_from_args


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "cleanup",
        help="remove superseded attempts, unfinished uploads and orphan objects",
        description="Converge every topic-partition's objects to what its manifests describe: remove "
        "Assigned/Failed attempts superseded by an offloaded segment, abort multipart uploads no open "
        "segment will complete, delete objects no manifest names, and finish interrupted deletions. "
        "Safe beside a running job: anything younger than --grace-minutes is left alone.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_store_args(parser)
    parser.add_argument("--grace-minutes", type=float, default=60.0, help="leave younger work alone (default 60)")
    parser.add_argument("--topic", help="only this topic-partition")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    config, _ = config_from_args(args)
    meta = MetadataStore(config.store.open(), config.store.key_prefix)
    topics = [args.topic] if args.topic else [str(t) for t in meta.topics()]
    total = 0
    for topic in topics:
        report = meta.cleanup(topic, grace_ms=int(args.grace_minutes * 60_000))
        total += report.total
        for label, items in (
            ("superseded attempt", report.superseded_manifests),
            ("aborted upload", report.aborted_uploads),
            ("orphan object", report.orphan_objects),
            ("finished deletion", report.finished_deletions),
        ):
            for item in items:
                print(f"{topic}: removed {label} {item}")
    print(f"cleanup: {total} item(s) removed from {len(topics)} topic-partition(s)")
    return 0
