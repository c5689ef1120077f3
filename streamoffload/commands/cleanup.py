"""``streamoffload cleanup``: remove what crashed or abandoned attempts left behind."""

from __future__ import annotations

import argparse
from typing import Any

from streamoffload.checkpoints.metadata_store import MetadataStore
from streamoffload.cli_common import add_store_args, config_from_args, float_arg, open_existing_store, topic_arg
from streamoffload.codecs.errors import StreamOffloadError
from streamoffload.config import MAX_RETENTION_MINUTES
from streamoffload.storage import keys


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


class CleanupError(StreamOffloadError):
    """A cleanup target that is not in the store."""


def run(args: argparse.Namespace) -> int:
    float_arg(args.grace_minutes, "--grace-minutes", 0, MAX_RETENTION_MINUTES, "the grace period is minutes")
    config, _ = config_from_args(args)
    topic = topic_arg(args.topic, config) if args.topic else None
    store = open_existing_store(config.store)
    meta = MetadataStore(store, config.store.key_prefix)
    if topic is not None:
        if next(iter(store.list(keys.topic_dir(meta.prefix, topic))), None) is None:
            raise CleanupError(f"--topic {topic}: the store {store.url} holds no objects of this topic-partition")
        topics = [str(topic)]
    else:
        topics = [str(t) for t in meta.topics()]
    total = 0
    for name in topics:
        report = meta.cleanup(name, grace_ms=round(args.grace_minutes * 60_000))
        total += report.total
        for label, items in (
            ("superseded attempt", report.superseded_manifests),
            ("aborted upload", report.aborted_uploads),
            ("orphan object", report.orphan_objects),
            ("finished deletion", report.finished_deletions),
        ):
            for item in items:
                print(f"{name}: removed {label} {item}")
    print(f"cleanup: {total} item(s) removed from {len(topics)} topic-partition(s)")
    return 0
