"""``streamoffload offload-now``: seal a topic's open segment now (PIP-76 "work with the CLI")."""

from __future__ import annotations

import argparse
from typing import Any

from streamoffload.checkpoints.metadata_store import MetadataStore
from streamoffload.cli_common import add_store_args, config_from_args
from streamoffload.codecs.topics import TopicName
from streamoffload.streaming.control import submit_requests


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "offload-now",
        help="seal the open segment of a topic now",
        description="Ask the running job to close and complete the open offload segment of TOPIC at once "
        "(every partition of a partitioned topic). The job picks the request up at its next micro-batch.",
        epilog="example:\n  streamoffload offload-now --conf conf/streamoffload.toml persistent://public/default/orders",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_store_args(parser)
    parser.add_argument("topic", metavar="TOPIC", help="topic or topic-partition")
    parser.set_defaults(func=run)


def partitions_of(meta: MetadataStore, topic: str) -> list[str]:
    """The topic-partitions of TOPIC the store knows, or TOPIC itself."""
    name = TopicName.parse(topic)
    if name.is_partition:
        return [str(name)]
    known = [t for t in meta.topics() if t.base == name or t == name]
    return sorted(str(t) for t in known) or [str(name)]


def run(args: argparse.Namespace) -> int:
    config, _ = config_from_args(args)
    store = config.store.open()
    topics = partitions_of(MetadataStore(store, config.store.key_prefix), args.topic)
    ids = submit_requests(store, config.store.key_prefix, topics)
    for topic, request_id in zip(topics, ids, strict=True):
        print(f"requested offload of {topic} (request {request_id})")
    return 0
