"""``streamoffload cleanup``: remove what crashed or abandoned attempts left behind."""

from __future__ import annotations

import argparse
from typing import Any

from streamoffload.checkpoints.cleanup_guard import CleanupGuard
from streamoffload.checkpoints.lease import COMMIT_WINDOW_MS, LIVE_WRITER_GRACE_MS
from streamoffload.checkpoints.metadata_store import MetadataStore
from streamoffload.checkpoints.metadata_view import MetadataView
from streamoffload.checkpoints.policy import MAX_RETENTION_MINUTES
from streamoffload.cli_common import CommandError, add_store_args, config_from_args, float_arg, topic_arg
from streamoffload.printable import printable
from streamoffload.storage import keys

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
    parser.set_defaults(func=run)


class CleanupError(CommandError):
    """A cleanup target that is not in the store."""


def run(args: argparse.Namespace) -> int:
    float_arg(args.grace_minutes, "--grace-minutes", 0, MAX_RETENTION_MINUTES, "the grace period is minutes")
    config, _ = config_from_args(args)
    topic = topic_arg(args.topic, config) if args.topic else None
    scoped = config.store.location.open(create=False)  # a mistyped path is an error, not a new empty store
    store = scoped.store
    meta = MetadataStore(scoped)
    if topic is not None:
        if next(iter(store.list(keys.topic_dir(meta.prefix, topic))), None) is None:
            raise CleanupError(f"--topic {topic}: the store {store.url} holds no objects of this topic-partition")
        topics = [str(topic)]
    else:
        topics = [str(t) for t in meta.topics()]
    grace_ms = round(args.grace_minutes * 60_000)
    with CleanupGuard.take(scoped, grace_ms) as guard:
        return _clean(meta, guard, topics, grace_ms)


def _clean(meta: MetadataStore, guard: CleanupGuard, topics: list[str], grace_ms: int) -> int:
    store = meta.store
    view = MetadataView(meta)
    total = 0
    for name in topics:
        report = meta.cleanup(name, grace_ms=grace_ms, guard=guard)
        compaction = view.compact(name, grace_ms=grace_ms)
        total += report.total + compaction.total
        for label, items in (
            ("superseded attempt", report.superseded_manifests),
            ("aborted upload", report.aborted_uploads),
            ("orphan object", report.orphan_objects),
            ("finished deletion", report.finished_deletions),
            ("deleted-segment record (counts kept in the summary)", compaction.folded_records),
            ("commit of deleted segment", compaction.removed_commits),
            ("failure note of a gone attempt", compaction.removed_failures),
        ):
            for item in items:
                print(f"{name}: removed {label} {printable(str(item))}")  # a key as the store listed it
    sweep = getattr(store, "remove_stale_temporaries", None)
    if sweep is not None:
        guard.check()
        # The sweep walks the whole filesystem store, other prefixes (and their writers, whose leases the guard
        # never read) included: below a store's root it keeps to the grace a live writer needs.
        swept = int(sweep(older_than=(max(grace_ms, LIVE_WRITER_GRACE_MS) if meta.prefix else grace_ms) / 1000))
        if swept:
            print(f"{store.url}: removed {swept} stale temporary file(s) and unfinished upload director(ies)")
        total += swept
    print(f"cleanup: {total} item(s) removed from {len(topics)} topic-partition(s)")
    return 0
