"""``streamoffload inspect``: decode a local data object (and its index) and describe what it holds.

The command layer (arguments, the summary or JSON); the describing is ``read.segment.describe``."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from streamoffload.read.segment.describe import UNKNOWN_LEDGER_KEY, InspectError, inspect_objects

EPILOG = """\
examples:
  streamoffload inspect 1b4e28ba-2fa1-11d2-883f-0016d3cca427
  streamoffload inspect 1b4e28ba-2fa1-11d2-883f-0016d3cca427 1b4e28ba-2fa1-11d2-883f-0016d3cca427-index --json
  streamoffload inspect OBJ-ledger-42 OBJ-ledger-42-index --json --entries

The format (v1 ledger-based, PIP-17; v2 streaming, PIP-76) is read from the block magic. v1 blocks do not
record their ledger id: it comes from --ledger-id, else from a "-ledger-<N>" object name, else it is
reported as null (JSON "ledgers" then uses the key "unknown"). With an index, every block it lists is
checked against the data object (offsets, lengths, ledger ids, first entry ids, part ids, data length).
A corrupt object exits with status 1 and an error naming the file and the byte offset."""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "inspect",
        help="decode a local data object (and index) and describe its blocks, ledgers and entries",
        description=(
            "Decode an offloaded data object (v1 or v2) from a local file, validate every block, and print "
            "its blocks and ledgers; with an index object, cross-check the two."
        ),
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("data_file", metavar="DATA_FILE", help="the data object, as a local file")
    parser.add_argument("index_file", metavar="INDEX_FILE", nargs="?", help="its index object (optional)")
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of a summary")
    parser.add_argument(
        "--entries",
        action="store_true",
        help="also list every entry: ledger id, entry id, payload length and CRC-32C (Castagnoli) of the payload",
    )
    parser.add_argument(
        "--ledger-id",
        type=int,
        default=None,
        metavar="N",
        help="ledger id of a v1 data object (v1 blocks do not record it; ignored for v2)",
    )
    parser.set_defaults(func=run)


def _summary(report: dict[str, Any]) -> str:
    blocks = report["blocks"]
    ledgers = report["ledgers"]
    total_entries = sum(ledger["entries"] for ledger in ledgers.values())
    total_bytes = sum(ledger["bytes"] for ledger in ledgers.values())
    lines = [
        f"{report['file']}: {report['format']} data object, {report['data_length']:,} bytes, "
        f"{len(blocks)} block{'s' * (len(blocks) != 1)}, {len(ledgers)} ledger{'s' * (len(ledgers) != 1)}, "
        f"{total_entries:,} entries ({total_bytes:,} payload bytes)",
        "ledgers:",
    ]
    for key, ledger in ledgers.items():
        lines.append(
            f"  {key:>12}  entries {ledger['first_entry_id']}..{ledger['last_entry_id']}  "
            f"({ledger['entries']:,} entries in {ledger['blocks']} blocks, {ledger['bytes']:,} payload bytes)"
        )
    lines.append(f"blocks:\n  {'#':>5}  {'offset':>14}  {'length':>11}  {'ledger':>12}  entries")
    for n, block in enumerate(blocks, start=1):
        ledger = UNKNOWN_LEDGER_KEY if block["ledger_id"] is None else block["ledger_id"]
        lines.append(
            f"  {n:>5}  {block['offset']:>14,}  {block['length']:>11,}  {ledger!s:>12}  "
            f"{block['first_entry_id']}..{block['last_entry_id']} ({block['entry_count']:,})"
        )
    index = report.get("index")
    if index:
        lines.append(
            f"index {index['file']}: {index['format']}, {index['length']:,} bytes, {index['blocks']} blocks in "
            f"{len(index['ledgers'])} ledger{'s' * (len(index['ledgers']) != 1)}; agrees with the data object"
        )
    if "entries" in report:
        lines.append(f"entries:\n  {'ledger':>12}  {'entry':>10}  {'length':>11}  crc32c")
        for entry in report["entries"]:
            ledger = UNKNOWN_LEDGER_KEY if entry["ledger_id"] is None else entry["ledger_id"]
            lines.append(f"  {ledger!s:>12}  {entry['entry_id']:>10}  {entry['length']:>11,}  {entry['crc32c']:08x}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    if args.ledger_id is not None and args.ledger_id < 0:
        raise InspectError(f"--ledger-id must be >= 0, got {args.ledger_id}")
    report = inspect_objects(args.data_file, args.index_file, ledger_id=args.ledger_id, with_entries=args.entries)
    text = json.dumps(report, indent=2) if args.json else _summary(report)
    try:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader went away (e.g. `| head`): stop quietly, and keep Python from complaining at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0
