"""``streamoffload delete-ledger``: mark ledgers deleted (PIP-76 "how to delete")."""

from __future__ import annotations

import argparse
import difflib
import json
from typing import Any

from streamoffload.checkpoints import manifest as mf
from streamoffload.checkpoints.metadata_store import MetadataStore
from streamoffload.cli_common import CommandError, add_store_args, config_from_args, ledger_id_arg, topic_arg
from streamoffload.codecs.topics import TopicName


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "delete-ledger",
        help="mark ledgers of a topic-partition deleted",
        description="Mark ledgers deleted. A segment's objects are deleted only once every ledger it holds is "
        "marked deleted and the deletion lag (managedLedgerOffloadDeletionLagMs) has passed; --now ignores "
        "the lag. Only ledgers the store holds for the topic-partition are accepted, and not its newest "
        "offloaded ledger, which may still be open at the broker (--force accepts both).",
        epilog="example:\n  streamoffload delete-ledger --store file:///data/store \\\n"
        "      persistent://public/default/t-partition-0 12 13",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_store_args(parser)
    parser.add_argument("topic", metavar="TOPIC_PARTITION", help="e.g. persistent://public/default/t-partition-0")
    parser.add_argument("ledgers", metavar="LEDGER_ID", type=int, nargs="+", help="ledger ids to mark deleted")
    parser.add_argument("--now", action="store_true", help="delete eligible segments now, ignoring the lag")
    parser.add_argument(
        "--force",
        action="store_true",
        help="also mark the newest offloaded ledger (only once the broker has closed it) and ledgers the store "
        "does not hold",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="one JSON document: the ledgers marked and the segments deleted (README)",
    )
    parser.set_defaults(func=run)


class DeleteLedgerError(CommandError):
    """A ledger or topic that delete-ledger refuses to mark."""


def run(args: argparse.Namespace) -> int:
    for ledger in args.ledgers:
        ledger_id_arg(ledger, "LEDGER_ID")
    config, _ = config_from_args(args)
    topic = topic_arg(args.topic, config)
    lag = 0 if args.now else config.policy_for(topic).managedLedgerOffloadDeletionLagMs
    meta = MetadataStore(config.store.location.open(create=False))
    try:
        _check_targets(meta, topic, args.ledgers, force=args.force)
        marked = [(ledger, meta.mark_ledger_deleted(topic, ledger, "delete-ledger command")) for ledger in args.ledgers]
        deleted = meta.apply_deletions(topic, lag)
    finally:
        meta.store.close()
    if args.json:
        doc = {
            "topic": str(topic),
            "deletion_lag_ms": lag,
            "ledgers": [{"ledger": ledger, "newly_marked": fresh} for ledger, fresh in marked],
            "deleted_segments": [
                {
                    "segment": str(mf.manifest_uuid(m)),
                    "start": [m.startLedgerId, m.startEntryId],
                    "end": [m.endLedgerId, m.endEntryId],
                    "data_key": m.dataKey,
                }
                for m in deleted
            ],
        }
        print(json.dumps(doc, indent=2))
        return 0
    for ledger, fresh in marked:
        print(f"ledger {ledger}: {'marked deleted' if fresh else 'already marked deleted'}")
    for manifest in deleted:
        print(
            f"deleted segment {mf.manifest_uuid(manifest)} "
            f"({manifest.startLedgerId}:{manifest.startEntryId}..{manifest.endLedgerId}:{manifest.endEntryId})"
        )
    return 0


def _check_targets(meta: MetadataStore, topic: TopicName, ledgers: list[int], *, force: bool) -> None:
    """Refuse, before marking anything: a topic with no offloaded segments in the store (a mistyped name
    would otherwise get a directory of its own), ledgers the topic's segments do not hold, and its newest
    offloaded ledger, which the broker may still be writing: its later entries would be offloaded into
    segments that are already marked for deletion."""
    held = [info.ledgerId for info in meta.ledgers(topic)]
    if not held:
        stored = [str(t) for t in meta.topics()]
        others = [t for t in stored if t != str(topic)]
        close = difflib.get_close_matches(str(topic), others, n=3, cutoff=0.6)
        partitions = [t for t in others if TopicName.parse(t).base == topic]
        hint = f"; did you mean {' or '.join(close or partitions[:3])}?" if close or partitions else ""
        if str(topic) in stored:
            hint = " (all its segments are deleted)" + hint
        raise DeleteLedgerError(f"topic {topic} has no offloaded segments in {meta.store.url}{hint}")
    if force:
        return
    marked = set(meta.deleted_ledgers(topic))
    unknown = [ledger for ledger in ledgers if ledger not in held and ledger not in marked]
    if unknown:
        raise DeleteLedgerError(
            f"topic {topic} has no offloaded ledger {', '.join(map(str, unknown))} (offloaded ledgers: "
            f"{_ranges(held)}); --force marks it anyway"
        )
    newest = held[-1]
    if newest in ledgers and newest not in marked:
        raise DeleteLedgerError(
            f"ledger {newest} is the newest offloaded ledger of {topic}: it may still be open at the broker and "
            "receiving entries, and the segments those entries go to would be deleted too; pass --force once "
            "the broker has closed it"
        )


def _ranges(ids: list[int]) -> str:
    """``3, 4, 8`` as ``3-4, 8`` (and only the first few runs of a long list)."""
    runs: list[tuple[int, int]] = []
    for i in ids:
        if runs and i == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], i)
        else:
            runs.append((i, i))
    text = [str(a) if a == b else f"{a}-{b}" for a, b in runs[:10]]
    return ", ".join(text) + (", ..." if len(runs) > 10 else "")
