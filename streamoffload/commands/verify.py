"""``streamoffload verify``: check stored segments against themselves and each other.

The command layer: arguments, which topics or objects to check, the summary or JSON, the exit status (1 if
there is any problem). The checks themselves are ``read.verify``: ``verify_segment`` for every Offloaded
segment of the chosen topic-partitions (or one segment named by its object keys), ``verify_topic`` for each
topic-partition's history as a whole. Every problem names the object and the byte offset.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import Any

from streamoffload.checkpoints.metadata_store import MetadataStore
from streamoffload.checkpoints.policy import MAX_RETENTION_MINUTES
from streamoffload.cli_common import (
    add_store_args,
    config_from_args,
    float_arg,
    ledger_id_arg,
    topic_arg,
)
from streamoffload.codecs.topics import TopicName
from streamoffload.commands.read import stored_manifest
from streamoffload.printable import PrintableWriter
from streamoffload.progress import Progress
from streamoffload.read.verify import (
    STALE_MINUTES,
    Problem,
    SegmentReport,
    TopicReport,
    VerifyError,
    verify_segment,
    verify_topic,
)
from streamoffload.storage import keys
from streamoffload.storage.location import ScopedStore

EPILOG = """\
examples:
  streamoffload verify --store file:///var/offload
  streamoffload verify --conf conf/streamoffload.toml persistent://public/default/orders-partition-0 --crc
  streamoffload verify --store s3://bucket/offload --s3-endpoint http://127.0.0.1:9000 --json
  streamoffload verify --store file:///var/offload --data-key public/default/t/UUID \\
      --index-key public/default/t/UUID-index

Without TOPIC, every topic-partition with offload metadata in the store is checked. Only Offloaded segments
are read; Assigned ones (work in progress) are counted in the summary, and are problems once superseded or
older than --stale-minutes; Failed ones are always problems (the next run, or cleanup, removes them).
Problems are printed as "PROBLEM <object> @<offset>: <error>: <message>"; the exit status is 1 if any."""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "verify",
        help="check offloaded objects: magic, lengths, index vs data, manifests, entries (and CRCs)",
        description=(
            "Check stored data and index objects and their offload metadata against each other, and every "
            "entry as a Pulsar entry; print a summary and exit non-zero on any problem, naming object and offset."
        ),
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_store_args(parser)
    parser.add_argument("topic_names", metavar="TOPIC", nargs="*", help="topic-partitions to check (default: all)")
    parser.add_argument(
        "--crc",
        action="store_true",
        help="also check every entry's CRC-32C (the one recorded at offload, and Pulsar's own where present)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of a summary")
    parser.add_argument(
        "--stale-minutes",
        type=float,
        default=STALE_MINUTES,
        metavar="M",
        help="report Assigned segments open longer than this as stale (default %(default)g)",
    )
    parser.add_argument("--data-key", metavar="KEY", help="check this data object (no metadata needed)")
    parser.add_argument("--index-key", metavar="KEY", help="its index object (default: DATA_KEY-index)")
    parser.add_argument(
        "--ledger-id", type=int, metavar="N", help="ledger id of a v1 data object not named ...-ledger-<N>"
    )
    parser.set_defaults(func=run)


def _under(prefix: str, key: str) -> str:
    key = key.strip("/")
    if not prefix or key.startswith(prefix + "/"):
        return key
    return f"{prefix}/{key}"


def _segment_json(s: SegmentReport) -> dict[str, Any]:
    return {
        "topic": s.topic,
        "segment": s.segment,
        "data_key": s.data_key,
        "index_key": s.index_key,
        "format": s.format,
        "data_length": s.data_length,
        "blocks": s.blocks,
        "entries": s.entries,
        "entry_bytes": s.entry_bytes,
        "messages": s.messages,
        "crc_checked": s.crc_checked,
        "recorded_checksums": s.recorded_checksums,
        "compressed_unsplit": s.compressed_unsplit,
        "first": list(s.first) if s.first else None,
        "last": list(s.last) if s.last else None,
        "encryption_key": s.encryption_key,
        "compression": s.compression,
        "plain_length": s.plain_length or s.data_length,
        "unchecked": s.unchecked,
        "ok": s.ok,
    }


def _refuse_unknown_topics(scoped: ScopedStore, names: list[TopicName]) -> None:
    """A named topic-partition with no object at all in the store is a mistyped name: one error line listing
    what the store holds (as ``read`` says), not a report of one problem. One with objects but no manifest
    stays a problem of the report."""
    stored = keys.list_topic_dirs(scoped)
    missing = [str(n) for n in names if n not in stored]
    if missing:
        shown = ", ".join(str(t) for t in stored[:10]) + (", ..." if len(stored) > 10 else "")
        raise VerifyError(
            f"no offloaded data for topic {', '.join(missing)} in {scoped.describe()}"
            + (f" (topics with offloaded data: {shown})" if stored else " (no topic has offloaded data there)")
        )


def run(args: argparse.Namespace) -> int:
    ledger_id_arg(args.ledger_id, "--ledger-id")
    float_arg(args.stale_minutes, "--stale-minutes", 0, MAX_RETENTION_MINUTES, "the staleness age is minutes")
    config, _ = config_from_args(args)
    location = config.store.location
    prefix = location.prefix
    if args.index_key and not args.data_key:
        raise VerifyError("--index-key needs --data-key")
    names = [topic_arg(t, config) for t in args.topic_names]
    keyring = config.encryption.keyring()  # segments encrypted at rest: their keys, where configured
    scoped = location.open(create=False)  # a mistyped path is an error, not a new empty store
    store = scoped.store
    try:
        topics: list[TopicReport] = []
        loose: list[SegmentReport] = []
        if args.data_key:
            data_key = _under(prefix, args.data_key)
            index_key = _under(prefix, args.index_key) if args.index_key else keys.index_key_for(data_key)
            # The manifest naming these objects, if any: an encrypted segment is read through it (its wrapped key).
            manifest = stored_manifest(MetadataStore(scoped), prefix, data_key, index_key)
            loose.append(
                verify_segment(
                    store,
                    data_key,
                    index_key,
                    crc=args.crc,
                    ledger_id=args.ledger_id,
                    manifest=manifest if args.ledger_id is None else None,
                    keyring=keyring,
                )
            )
        if names:
            _refuse_unknown_topics(scoped, names)
        elif not args.data_key:
            names = keys.list_topic_dirs(scoped)
            if not names:
                raise VerifyError(f"no offloaded topics in {scoped.describe()}")
        with Progress("verify", total=len(names), unit="topic-partitions") as progress:
            segment_bar = SegmentProgress(progress)
            for name in names:
                report = verify_topic(
                    scoped,
                    name,
                    crc=args.crc,
                    stale_ms=args.stale_minutes * 60_000,
                    keyring=keyring,
                    progress=segment_bar if progress.shown else None,
                )
                topics.append(report)
                progress.advance(1)
    finally:
        store.close()

    segments = segments_of(topics, loose)
    problems = [p for s in loose for p in s.problems] + [p for t in topics for p in t.all_problems]
    totals = {
        "topics": len(topics),
        "segments": len(segments),
        "v1_segments": sum(1 for s in segments if s.format == "v1"),
        "v2_segments": sum(1 for s in segments if s.format == "v2"),
        "blocks": sum(s.blocks for s in segments),
        "entries": sum(s.entries for s in segments),
        "entry_bytes": sum(s.entry_bytes for s in segments),
        "data_bytes": sum(s.data_length for s in segments),
        "messages": sum(s.messages for s in segments),
        "crc_checked": sum(s.crc_checked for s in segments),
        "segments_without_recorded_checksums": sum(1 for s in segments if s.recorded_checksums is False),
        "encrypted_segments": sum(1 for s in segments if s.encryption_key),
        "encrypted_unchecked": sum(1 for s in segments if s.unchecked),
        "compressed_segments": sum(1 for s in segments if s.compression),
        "plain_bytes": sum(s.plain_length or s.data_length for s in segments),
        "problems": len(problems),
    }
    if args.json:
        doc = {
            "ok": not problems,
            "crc": args.crc,
            "totals": totals,
            "topics": [
                {
                    "topic": t.topic,
                    "segments": len(t.segments),
                    "unfinished": t.unfinished,
                    "ok": not t.all_problems,
                }
                for t in topics
            ],
            "segments": [_segment_json(s) for s in segments],
            "problems": [dataclasses.asdict(p) for p in problems],
        }
        json.dump(doc, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        _print_summary(topics, loose, problems, totals, crc=args.crc)
    return 1 if problems else 0


class SegmentProgress:
    """``read.verify.VerifyProgress`` as a second bar: segments checked of those listed so far (each topic-partition's
    are listed as its check starts), with their data bytes."""

    def __init__(self, progress: Progress) -> None:
        self.progress = progress
        self.task = progress.add_task("  segments", 0, "segments")
        self.listed_bytes = 0
        self.checked_bytes = 0

    def listed(self, segments: int, data_bytes: int) -> None:
        self.listed_bytes += data_bytes
        self.progress.extend(segments, self.task)
        self.progress.advance(0, self.task, note=self._note())

    def checked(self, segment: SegmentReport, data_bytes: int) -> None:
        self.checked_bytes += data_bytes
        self.progress.advance(1, self.task, note=self._note())

    def _note(self) -> str:
        return f"{self.checked_bytes / 1e6:.1f} of {self.listed_bytes / 1e6:.1f} MB listed"


def segments_of(topics: list[TopicReport], loose: list[SegmentReport]) -> list[SegmentReport]:
    return loose + [s for t in topics for s in t.segments]


def _print_summary(
    topics: list[TopicReport],
    loose: list[SegmentReport],
    problems: list[Problem],
    totals: dict[str, int],
    *,
    crc: bool,
) -> None:
    out = PrintableWriter(sys.stdout)  # keys, topic names and problems as the store gave them: controls escaped
    for s in loose:
        state = "OK" if s.ok else f"{len(s.problems)} problem(s)"
        out.write(
            f"{s.data_key}: {s.format or '?'}, {s.blocks} blocks, {s.entries} entries, {s.data_length} bytes: {state}\n"
        )
    for t in topics:
        versions = sorted({s.format for s in t.segments if s.format})
        extra = "".join(f", {n} {status}" for status, n in sorted(t.unfinished.items()))
        state = "OK" if not t.all_problems else f"{len(t.all_problems)} problem(s)"
        out.write(
            f"{t.topic}: {len(t.segments)} offloaded segments ({'/'.join(versions) or '-'}){extra}, "
            f"{sum(s.entries for s in t.segments)} entries: {state}\n"
        )
    for p in problems:
        out.write(p.line() + "\n")
    for s in [s for t in topics for s in t.segments if s.recorded_checksums is False]:
        # Sealed before entry checksums were recorded: still read, but only entries that carry their own
        # 0x0e01 section are CRC-checked there.
        out.write(
            f"NOTE {s.data_key}: no recorded checksums (sealed by an older version): its entries are CRC-checked "
            "only where they carry their own 0x0e01 section\n"
        )
    for s in segments_of(topics, loose):
        if s.unchecked:
            out.write(f"NOTE {s.data_key}: {s.unchecked}\n")
    if totals["compressed_segments"]:
        out.write(
            f"{totals['compressed_segments']} segment(s) compressed at rest: {totals['data_bytes']} bytes stored for "
            f"{totals['plain_bytes']} bytes of blocks ({totals['data_bytes'] / max(totals['plain_bytes'], 1):.3f})\n"
        )
    checks = "framing, index, manifests, entries"
    if crc:
        checks += f", CRC-32C of {totals['crc_checked']} of {totals['entries']} entries"
    verdict = "OK" if not problems else f"{len(problems)} PROBLEM(S)"
    out.write(
        f"verified {totals['segments']} segments ({totals['v2_segments']} v2, {totals['v1_segments']} v1), "
        f"{totals['blocks']} blocks, {totals['entries']} entries, {totals['data_bytes']} data bytes "
        f"[{checks}]: {verdict}\n"
    )
