"""``streamoffload cleanup``: remove what crashed or abandoned attempts left behind."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from streamoffload.checkpoints.cleanup_guard import CleanupGuard
from streamoffload.checkpoints.lease import COMMIT_WINDOW_MS, LIVE_WRITER_GRACE_MS
from streamoffload.checkpoints.metadata_store import MetadataStore
from streamoffload.checkpoints.metadata_view import MetadataView
from streamoffload.checkpoints.policy import MAX_RETENTION_MINUTES
from streamoffload.cli_common import CommandError, add_store_args, config_from_args, float_arg, topic_arg
from streamoffload.printable import printable
from streamoffload.progress import Progress
from streamoffload.storage import keys
from streamoffload.storage.dry_run import DryRunStore
from streamoffload.storage.location import ScopedStore

LIVE_GRACE = f"{LIVE_WRITER_GRACE_MS / 60_000:g}"
WINDOW = f"{COMMIT_WINDOW_MS / 60_000:g}"


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "cleanup",
        help="remove superseded attempts, unfinished uploads and orphan objects",
        description="Converge every topic-partition's objects to what its manifests and commits describe: "
        "remove Assigned/Failed attempts superseded by an offloaded segment, abort multipart uploads no open "
        "segment will complete, delete objects nothing names, and finish interrupted deletions. "
        "Then drop the metadata nothing needs any more: deleted-segment records (their counts are kept in a "
        "summary; the newest record of each topic-partition stays), commits of deleted segments (never the "
        "newest) and failure notes of attempts that no longer exist; and, on a filesystem store, the "
        "temporary files, orphan metadata files and unfinished upload directories killed writers left.\n\n"
        "What is safe: nothing a manifest or a commit names is ever deleted, at any grace. What nothing names "
        "yet (a segment being written, a temporary file, an upload not yet recorded) is deleted only once older "
        f"than --grace-minutes. Beside a running job (its writer lease is live) that must be {LIVE_GRACE} "
        f"minutes or more: the job commits what it writes within {WINDOW} minutes or not at all, and a shorter "
        "grace is refused, naming the job. With no live lease any grace is safe: below "
        f"{LIVE_GRACE} minutes (0 included) cleanup holds the writer lease while it runs, so no job writes "
        "meanwhile (a job that starts waits for it, and `run --take-over` stops the cleanup).",
        epilog="examples:\n"
        "  streamoffload cleanup --store var/demo/store --dry-run\n"
        "  streamoffload cleanup --store var/demo/store\n"
        "  streamoffload cleanup --conf conf/streamoffload.toml --grace-minutes 120\n"
        "  streamoffload cleanup --store file:///data/store --topic persistent://public/default/t-partition-0",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_store_args(parser)
    parser.add_argument(
        "--grace-minutes",
        type=float,
        default=60.0,
        help=f"leave younger work alone (default 60; at least {LIVE_GRACE} beside a running job)",
    )
    parser.add_argument("--topic", help="only this topic-partition")
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="say what would be removed (the plan the real run follows) and remove nothing; the filesystem "
        "store's sweep of temporary files is not part of it",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of lines (README)")
    parser.set_defaults(func=run)


class CleanupError(CommandError):
    """A cleanup target that is not in the store."""


REMOVAL_KINDS = (
    ("superseded_attempts", "superseded attempt"),
    ("aborted_uploads", "aborted upload"),
    ("orphan_objects", "orphan object"),
    ("finished_deletions", "finished deletion"),
    ("folded_deleted_records", "deleted-segment record (counts kept in the summary)"),
    ("removed_commits", "commit of deleted segment"),
    ("removed_failure_notes", "failure note of a gone attempt"),
)
"""The kinds of removal, as ``--json`` names them (keys of a topic's ``removed``) and as a line says them."""


@dataclass
class TopicCleanup:
    """What cleanup removed (or, in a dry run, would remove) of one topic-partition, by kind (``REMOVAL_KINDS``):
    object keys, segment ids, commit ordinals, as the store names them."""

    topic: str
    removed: dict[str, list[str | int]] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(len(items) for items in self.removed.values())


def run(args: argparse.Namespace) -> int:
    float_arg(args.grace_minutes, "--grace-minutes", 0, MAX_RETENTION_MINUTES, "the grace period is minutes")
    config, _ = config_from_args(args)
    topic = topic_arg(args.topic, config) if args.topic else None
    scoped = config.store.location.open(create=False)  # a mistyped path is an error, not a new empty store
    store = scoped.store
    if args.dry_run:
        # The same code as the real run, over a view of the store that keeps every write and deletion in memory:
        # the plan printed is the one a real run follows, and the store is left as it is.
        scoped = ScopedStore(DryRunStore(store), scoped.prefix)
    meta = MetadataStore(scoped)
    if topic is not None:
        if next(iter(store.list(keys.topic_dir(meta.prefix, topic))), None) is None:
            raise CleanupError(f"--topic {topic}: the store {store.url} holds no objects of this topic-partition")
        topics = [str(topic)]
    else:
        topics = [str(t) for t in meta.topics()]
    grace_ms = round(args.grace_minutes * 60_000)
    with CleanupGuard.take(scoped, grace_ms) as guard:
        results, swept = _clean(meta, guard, topics, grace_ms, dry_run=args.dry_run, as_json=args.json)
    total = sum(r.total for r in results) + swept
    if args.json:
        doc = {
            "store": store.url,
            "prefix": meta.prefix,
            "dry_run": args.dry_run,
            "grace_minutes": args.grace_minutes,
            "topics": [{"topic": r.topic, "removed": r.removed, "total": r.total} for r in results],
            "stale_temporaries": swept,
            "total": total,
        }
        json.dump(doc, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        verb = "would remove" if args.dry_run else "removed"
        print(
            f"cleanup{' --dry-run' if args.dry_run else ''}: {total} item(s) {verb} from {len(topics)} "
            f"topic-partition(s){'; nothing was removed' if args.dry_run else ''}"
        )
    return 0


def _clean(
    meta: MetadataStore, guard: CleanupGuard, topics: list[str], grace_ms: int, *, dry_run: bool, as_json: bool
) -> tuple[list[TopicCleanup], int]:
    """Clean each topic-partition (printing a line per removal unless ``as_json``), then sweep a filesystem
    store's temporaries (not in a dry run); the topics' results and the number of temporaries swept."""
    store = meta.store
    view = MetadataView(meta)
    results: list[TopicCleanup] = []
    verb = "would remove" if dry_run else "removed"
    with Progress("cleanup", total=len(topics), unit="topic-partitions") as progress:
        for name in topics:
            report = meta.cleanup(name, grace_ms=grace_ms, guard=guard)
            compaction = view.compact(name, grace_ms=grace_ms)
            found: dict[str, Sequence[object]] = {
                "superseded_attempts": report.superseded_manifests,
                "aborted_uploads": report.aborted_uploads,
                "orphan_objects": report.orphan_objects,
                "finished_deletions": report.finished_deletions,
                "folded_deleted_records": compaction.folded_records,
                "removed_commits": compaction.removed_commits,
                "removed_failure_notes": compaction.removed_failures,
            }
            result = TopicCleanup(name, {kind: [_item(i) for i in found[kind]] for kind, _ in REMOVAL_KINDS})
            results.append(result)
            if not as_json:
                for kind, label in REMOVAL_KINDS:
                    for item in result.removed[kind]:
                        progress.line(f"{name}: {verb} {label} {printable(str(item))}")  # a key as the store listed it
            progress.advance(1)
    sweep = getattr(store, "remove_stale_temporaries", None)
    swept = 0
    if sweep is not None and not dry_run:
        guard.check()
        # The sweep walks the whole filesystem store, other prefixes (and their writers, whose leases the guard
        # never read) included: below a store's root it keeps to the grace a live writer needs.
        swept = int(sweep(older_than=(max(grace_ms, LIVE_WRITER_GRACE_MS) if meta.prefix else grace_ms) / 1000))
        if swept and not as_json:
            print(f"{store.url}: removed {swept} stale temporary file(s) and unfinished upload director(ies)")
    return results, swept


def _item(item: object) -> str | int:
    """A removed item as ``--json`` shows it: a commit's ordinal as a number, a key or segment id as a string."""
    return item if isinstance(item, int) else str(item)
