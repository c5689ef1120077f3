"""``streamoffload produce``: publish synthetic, verifiable traffic to Pulsar topics."""

from __future__ import annotations

import argparse
import json
import sys

from streamoffload.cli_common import CommandError, skip_finalizers_at_exit
from streamoffload.produce import produce

EPILOG = """\
examples:
  streamoffload produce --service-url pulsar://127.0.0.1:6650 --topic orders --count 10000
  streamoffload produce --service-url URL --topic orders --partitions 3 --duration 60 --rate 500
  streamoffload produce --service-url URL --topic a --topic b --payload-size 4096 --keys 16 \\
      --properties source=demo region=eu --no-batching

Payloads are deterministic: message SEQ of topic-partition P is b"SEQ:" followed by BLAKE2b(P NUL
SEQ) repeated (see streamoffload.produce.expected_payload), key "key-<SEQ % K>", and property
seq=SEQ, so readers can check every byte. With --partitions N, topic T is published to the topics
T-partition-0..N-1 by name (on pulsar-lite, run it with default partitions 0)."""


class ProduceArgError(CommandError):
    pass


def _parse_properties(items: list[str]) -> dict[str, str]:
    props: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ProduceArgError(f"--properties: expected KEY=VALUE, got {item!r}")
        props[key] = value
    return props


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "produce",
        help="publish synthetic traffic to Pulsar topics",
        description="Publish synthetic, deterministic messages with pulsar-client and print a summary.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--service-url", required=True, help="Pulsar service URL, e.g. pulsar://127.0.0.1:6650")
    parser.add_argument(
        "--topic",
        dest="topics",
        action="append",
        required=True,
        help="topic to publish to (repeatable; short names mean persistent://public/default/NAME)",
    )
    parser.add_argument(
        "--partitions",
        type=int,
        default=0,
        help="publish to TOPIC-partition-0..N-1 (default: 0, the topic itself)",
    )
    amount = parser.add_argument_group("how much (default: --count 1000)")
    amount.add_argument("--count", type=int, default=None, help="messages per topic, spread over its partitions")
    amount.add_argument("--duration", type=float, default=None, help="publish for this many seconds")
    parser.add_argument("--rate", type=float, default=None, help="cap in messages/s over all topics (default: none)")
    parser.add_argument("--payload-size", type=int, default=1024, help="payload bytes (default: %(default)s)")
    parser.add_argument("--keys", type=int, default=0, help="number of distinct keys (default: 0, no keys)")
    parser.add_argument(
        "--properties",
        nargs="*",
        default=[],
        metavar="KEY=VALUE",
        help="properties added to every message (a 'seq' property is always added)",
    )
    parser.add_argument(
        "--batching",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="batch messages into entries (default: on)",
    )
    parser.add_argument("--batch-size", type=int, default=1000, help="max messages per batch (default: %(default)s)")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON on stdout")
    parser.add_argument("--no-progress", action="store_true", help="no progress line on stderr")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    count = args.count
    if count is None and args.duration is None:
        count = 1000
    summary = produce(
        args.service_url,
        args.topics,
        count,
        args.payload_size,
        partitions=args.partitions,
        duration=args.duration,
        rate=args.rate,
        keys=args.keys,
        properties=_parse_properties(args.properties),
        batching=args.batching,
        batch_size=args.batch_size,
        progress=None if args.no_progress else sys.stderr,
        client_options={"operation_timeout_seconds": 15},
    )
    if args.json:
        print(json.dumps(summary.to_dict(), indent=2))
    else:
        print(summary.render())
    skip_finalizers_at_exit()
    return 0
