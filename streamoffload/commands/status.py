"""``streamoffload status``: what has been offloaded, per topic-partition."""

from __future__ import annotations

import argparse
import json
from typing import Any

from streamoffload.checkpoints.metadata_store import MetadataStore
from streamoffload.cli_common import add_store_args, config_from_args
from streamoffload.status import TopicStatus, store_status


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "status",
        help="segments, positions, bytes and lag per topic-partition",
        description="Show, per topic-partition, segments by status, the last offloaded position, bytes "
        "offloaded and the lag (now minus the publish time of the newest offloaded entry). Reads only "
        "the store's metadata, so it works with or without a running job.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_store_args(parser)
    parser.add_argument("--json", action="store_true", help="one JSON document instead of a table")
    parser.set_defaults(func=run)


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def render_table(rows: list[TopicStatus]) -> str:
    if not rows:
        return "no offloaded topics in this store yet"
    header = (
        f"{'TOPIC-PARTITION':<56} {'OFFLOADED':>9} {'OPEN':>4} {'FAILED':>6} {'ENTRIES':>10} {'BYTES':>10} "
        f"{'LAST POSITION':>16} {'LAG':>8}"
    )
    lines = [header]
    for s in rows:
        last = f"{s.last_offloaded_position[0]}:{s.last_offloaded_position[1]}" if s.last_offloaded_position else "-"
        lag = f"{s.lag_seconds:.0f}s" if s.lag_seconds is not None else "-"
        lines.append(
            f"{s.topic:<56} {s.segments.get('Offloaded', 0):>9} {s.segments.get('Assigned', 0):>4} "
            f"{s.segments.get('Failed', 0):>6} {s.entries:>10} {_human(s.data_bytes):>10} {last:>16} {lag:>8}"
        )
        lines.extend(f"    failed: {f}" for f in s.failures)
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    config, _ = config_from_args(args)
    meta = MetadataStore(config.store.open(), config.store.key_prefix)
    rows = store_status(meta)
    if args.json:
        print(json.dumps({"store": config.store.url, "topics": [r.to_json() for r in rows]}, indent=2))
    else:
        print(render_table(rows))
    return 0
