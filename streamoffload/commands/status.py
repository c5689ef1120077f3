"""``streamoffload status``: what has been offloaded, per topic-partition."""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from datetime import datetime
from typing import Any, TextIO

from streamoffload.checkpoints.metadata_store import MetadataStore
from streamoffload.cli_common import add_store_args, config_from_args
from streamoffload.errors import ConfigError
from streamoffload.printable import printable
from streamoffload.status import TopicStatus, latest_positions, store_status, table_statuses
from streamoffload.streaming.job.health import read_health

EPILOG = """\
examples:
  streamoffload status --store var/demo/store
  streamoffload status --conf conf/streamoffload.toml             # asks [pulsar] service_url for the lag
  streamoffload status --store s3://bucket/prefix --s3-endpoint http://127.0.0.1:9000 --json | jq .
  streamoffload status --conf conf/streamoffload.toml --watch 5
"""


def lag_text(s: TopicStatus) -> str:
    """The LAG column: "caught up", seconds, or seconds and "?" when the latest position is unknown."""
    if s.caught_up:
        return "caught up"
    if s.lag_seconds is None:
        return "-"
    return f"{s.lag_seconds:.0f}s" + ("?" if s.caught_up is None else "")


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "status",
        help="segments, positions, bytes and lag per topic-partition",
        description="Show, per topic-partition, segments by status, the last offloaded position, bytes "
        "offloaded and the lag. Reads the store's metadata, so it works with or without a running job.\n\n"
        "LAG has the definition of the streamoffload_offload_lag_seconds metric: 'caught up' (0) when the "
        "newest offloaded position is at or past the topic-partition's latest position, otherwise now minus "
        "the publish time of the newest offloaded entry. The latest positions are asked from the broker "
        "(--service-url, or [pulsar] service_url of --conf); without one LAG is followed by '?' (latest "
        "position unknown: the figure is the second branch).",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_store_args(parser)
    parser.add_argument(
        "--service-url", metavar="URL", help="Pulsar service URL to ask for the latest positions (lag, caught up)"
    )
    parser.add_argument("--no-broker", action="store_true", help="do not ask the broker (LAG then shows '?')")
    parser.add_argument("--json", action="store_true", help="one JSON document instead of a table")
    parser.add_argument(
        "--watch",
        nargs="?",
        type=float,
        const=2.0,
        default=None,
        metavar="SECONDS",
        help="live view: refresh every SECONDS (default 2) with entries/s since the last refresh, until Ctrl-C; "
        "with --json, one JSON document per line per refresh",
    )
    parser.set_defaults(func=run)


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def render_table(rows: list[TopicStatus], rates: dict[str, float | None] | None = None) -> str:
    """The status table; with ``rates`` (topic -> entries/s, None when unknown) an ENTRIES/S column. What the store
    said (topic names, failures, reasons) is shown through ``printable``: a control character is escaped."""
    if not rows:
        return "no offloaded topics in this store yet"
    rate_header = f" {'ENTRIES/S':>10}" if rates is not None else ""
    header = (
        f"{'TOPIC-PARTITION':<56} {'OFFLOADED':>9} {'OPEN':>4} {'FAILED':>6} {'ENTRIES':>10} {'BYTES':>10} "
        f"{'LAST POSITION':>16} {'LAG':>9}{rate_header}"
    )
    lines = [header]
    for s in rows:
        last = f"{s.last_offloaded_position[0]}:{s.last_offloaded_position[1]}" if s.last_offloaded_position else "-"
        lag = lag_text(s)
        rate = ""
        if rates is not None:
            value = rates.get(s.topic)
            rate = f" {value:>10.1f}" if value is not None else f" {'-':>10}"
        lines.append(
            f"{printable(s.topic):<56} {s.segments.get('Offloaded', 0):>9} {s.segments.get('Assigned', 0):>4} "
            f"{s.segments.get('Failed', 0):>6} {s.entries:>10} {_human(s.data_bytes):>10} {last:>16} {lag:>9}{rate}"
        )
        if s.open_segment_age_seconds is not None and rates is not None:
            lines.append(f"    open segment for {s.open_segment_age_seconds:.0f}s")
        lines.extend(f"    failed: {printable(f)}" for f in s.failures)
        lines.extend(f"    corrupt manifest (skipped): {printable(c)}" for c in s.corrupt_manifests)
        if s.set_aside:
            record = s.set_aside
            if record["until_ms"] > time.time() * 1000:
                until = time.strftime("%H:%M:%S", time.localtime(record["until_ms"] / 1000))
                reason = printable(str(record["reason"]))
                lines.append(f"    SET ASIDE until {until} after {record['failures']} failures: {reason}")
            else:
                lines.append(f"    failing ({record['failures']} in a row): {printable(str(record['reason']))}")
        if s.error:
            lines.append(f"    error: {printable(s.error)}")
    return "\n".join(lines)


CLEAR = "\033[H\033[2J"


def _sleep(seconds: float) -> None:
    time.sleep(seconds)


def watch(
    fetch: Callable[[], list[TopicStatus]],
    interval: float,
    store_url: str,
    *,
    out: TextIO | None = None,
    as_json: bool = False,
    clear: bool | None = None,
    iterations: int | None = None,
    sleep: Callable[[float], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> int:
    """Refresh the status every ``interval`` seconds until Ctrl-C (exit 0) or ``iterations`` frames.

    The screen is cleared between frames on a terminal (``clear`` overrides); a store that cannot be
    read for a moment shows the error in the frame and the view keeps refreshing."""
    out = out or sys.stdout
    sleep = sleep or _sleep
    clear = out.isatty() if clear is None else clear
    previous: tuple[float, dict[str, int]] | None = None
    frame = 0
    try:
        while iterations is None or frame < iterations:
            frame += 1
            now = clock()
            stamp = datetime.now().astimezone().strftime("%Y-%m-%d %H:%M:%S %Z")
            try:
                rows, error = fetch(), None
            except Exception as err:  # keep watching through a store hiccup
                rows, error = [], f"{type(err).__name__}: {err}"
            counts = {r.topic: r.entries for r in rows}
            rates: dict[str, float | None] = {}
            for r in rows:
                if previous is not None and r.topic in previous[1] and now > previous[0]:
                    rates[r.topic] = max(0, r.entries - previous[1][r.topic]) / (now - previous[0])
                else:
                    rates[r.topic] = None
            if error is None:
                previous = (now, counts)
            if as_json:
                doc = {"time": stamp, "store": store_url, "topics": [r.to_json() for r in rows]}
                if error:
                    doc["error"] = error
                out.write(json.dumps(doc) + "\n")
            else:
                body = f"error reading the store: {printable(error)}" if error else render_table(rows, rates)
                totals = f"{len(rows)} topic-partitions, {sum(counts.values())} entries offloaded"
                text = (
                    f"streamoffload status  {store_url}  {stamp}  (every {interval:g}s, Ctrl-C to quit)\n\n"
                    f"{body}\n\n{totals}\n"
                )
                out.write((CLEAR if clear else ("\n" if frame > 1 else "")) + text)
            out.flush()
            if iterations is None or frame < iterations:
                sleep(interval)
    except KeyboardInterrupt:
        if not as_json:
            out.write("\n")
        out.flush()
    return 0


MAX_WATCH_SECONDS = 24 * 60 * 60.0


def run(args: argparse.Namespace) -> int:
    if args.watch is not None and not (math.isfinite(args.watch) and 0 < args.watch <= MAX_WATCH_SECONDS):
        raise ConfigError(
            f"--watch {args.watch:g}: the refresh interval must be positive and at most {MAX_WATCH_SECONDS:g} seconds"
        )
    config, path = config_from_args(args)
    location = config.store.location
    meta = MetadataStore(location.open(create=False))  # a mistyped path is an error, not a new empty store
    service_url = None if args.no_broker else (args.service_url or (config.pulsar.service_url if path else None))

    def fetch() -> list[TopicStatus]:
        if service_url is None:
            return store_status(meta)
        topics = [str(t) for t in meta.topics()]
        client_options = {str(k): str(v) for k, v in config.pulsar.client.items()}
        return store_status(meta, latest=latest_positions(service_url, topics, client_options))

    if args.watch is not None:
        return watch(fetch, args.watch, location.describe(), as_json=args.json)
    rows = fetch()
    held = config.pulsar.retain_subscription
    # The running job's own record: while its broker is unreachable it says so here (it keeps retrying).
    health = read_health(meta.scoped)
    tables = table_statuses(config, meta)  # the Iceberg tables of its topics, where there are any
    if args.json:
        doc: dict[str, Any] = {"store": location.describe(), "topics": [r.to_json() for r in rows]}
        if held:
            doc["retain_subscription"] = held
        if health is not None:
            doc["job_health"] = asdict(health)
        if tables:
            doc["tables"] = [t.as_dict() for t in tables]
        print(json.dumps(doc, indent=2))
    else:
        if health is not None and health.line():
            print(printable(health.line()))  # the job's record in the store
        print(render_table(rows))
        if tables:
            from streamoffload.commands.table import render_status

            print("\nIceberg tables:")
            print("\n".join(printable(render_status(t), keep_newlines=True) for t in tables))
        if held:
            print(
                f"The broker keeps every entry after each topic-partition's last offloaded position: the durable "
                f"subscription {held!r} (pulsar.retain_subscription) is acknowledged up to it after every commit."
            )
    return 0
