"""``streamoffload offload-now``: seal a topic's open segment now (PIP-76 "work with the CLI")."""

from __future__ import annotations

import argparse
import json
import shlex
from collections.abc import Sequence
from typing import Any

from streamoffload.checkpoints.control_requests import submit_requests
from streamoffload.checkpoints.metadata_store import MetadataStore
from streamoffload.cli_common import CommandError, add_store_args, config_from_args
from streamoffload.codecs.topics import TopicName


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "offload-now",
        help="seal the open segment of a topic now",
        description="Ask the running job to close and complete the open offload segment of TOPIC at once "
        "(every partition of a partitioned topic). The job picks the request up at its next micro-batch. "
        "Prints one request id per topic-partition; follow them with `streamoffload offload-status TOPIC --wait`.",
        epilog="example:\n  streamoffload offload-now --conf conf/streamoffload.toml persistent://public/default/orders\n"
        "  streamoffload offload-status --conf conf/streamoffload.toml persistent://public/default/orders --wait",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_store_args(parser)
    parser.add_argument("topic", metavar="TOPIC", help="topic or topic-partition")
    parser.add_argument(
        "--json",
        action="store_true",
        help='one JSON document: {"requests": [{"topic", "request_id"}], "follow": COMMAND} (README)',
    )
    parser.set_defaults(func=run)


class UnknownTopicError(CommandError):
    """The topic is neither in the store nor among the configured topics (a typo, most likely)."""


def partitions_of(meta: MetadataStore, topic: str, configured: Sequence[str] = ()) -> list[str]:
    """The topic-partitions of TOPIC the store knows, or TOPIC itself when it is one of the ``configured``
    topics (or a partition of one) the job has not offloaded yet. ``UnknownTopicError`` otherwise: a request
    for a topic no job offloads would wait forever."""
    name = TopicName.parse(topic)
    stored = list(meta.topics())
    known = [t for t in stored if t == name or (not name.is_partition and t.base == name)]
    if known:
        return sorted(str(t) for t in known)
    wanted = {TopicName.parse(t) for t in configured}
    if name in wanted or name.base in wanted:
        return [str(name)]
    where = f"the store {meta_url(meta)}" if not configured else f"the store {meta_url(meta)} or the configuration"
    raise UnknownTopicError(
        f"unknown topic {str(name)!r}: not in {where} ({len(stored)} topic-partitions offloaded there"
        f"{', configured: ' + ', '.join(configured) if configured else ''}); check the name"
    )


def meta_url(meta: MetadataStore) -> str:
    store = getattr(meta, "store", None)
    return str(getattr(store, "url", None) or "")


def store_args_text(args: argparse.Namespace) -> str:
    """The store options this command was given, to repeat in a suggested follow-up command."""
    parts = []
    flags = (("--conf", "conf"), ("--store", "store"), ("--s3-endpoint", "s3_endpoint"), ("--s3-region", "s3_region"))
    for flag, name in flags:
        value = getattr(args, name, None)
        if value:
            parts.append(f"{flag} {shlex.quote(str(value))}")
    return " ".join(parts)


def run(args: argparse.Namespace) -> int:
    config, _ = config_from_args(args)
    scoped = config.store.location.open(create=False)  # a mistyped path is an error, not a new empty store
    topics = partitions_of(MetadataStore(scoped), args.topic, config.pulsar.topics)
    ids = submit_requests(scoped, topics)
    follow = " ".join(p for p in ("streamoffload offload-status", store_args_text(args), shlex.quote(args.topic)) if p)
    follow += " --wait"
    if args.json:
        requests = [{"topic": t, "request_id": str(r)} for t, r in zip(topics, ids, strict=True)]
        print(json.dumps({"requests": requests, "follow": follow}, indent=2))
        return 0
    for topic, request_id in zip(topics, ids, strict=True):
        print(f"requested offload of {topic} (request {request_id})")
    print(f"follow with: {follow}")
    return 0
