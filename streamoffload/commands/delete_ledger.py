"""``streamoffload delete-ledger``: mark ledgers deleted (PIP-76 "how to delete")."""

from __future__ import annotations

import argparse
from typing import Any

from streamoffload.checkpoints import manifest as mf
from streamoffload.checkpoints.metadata_store import MetadataStore
from streamoffload.cli_common import add_store_args, config_from_args


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "delete-ledger",
        help="mark ledgers of a topic-partition deleted",
        description="Mark ledgers deleted. A segment's objects are deleted only once every ledger it holds is "
        "marked deleted and the deletion lag (managedLedgerOffloadDeletionLagMs) has passed; --now ignores "
        "the lag.",
        epilog="example:\n  streamoffload delete-ledger --store file:///data/store \\\n"
        "      persistent://public/default/t-partition-0 12 13",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_store_args(parser)
    parser.add_argument("topic", metavar="TOPIC_PARTITION")
    parser.add_argument("ledgers", metavar="LEDGER_ID", type=int, nargs="+")
    parser.add_argument("--now", action="store_true", help="delete eligible segments now, ignoring the lag")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    config, _ = config_from_args(args)
    meta = MetadataStore(config.store.open(), config.store.key_prefix)
    for ledger in args.ledgers:
        fresh = meta.mark_ledger_deleted(args.topic, ledger, "delete-ledger command")
        print(f"ledger {ledger}: {'marked deleted' if fresh else 'already marked deleted'}")
    lag = 0 if args.now else config.policy_for(args.topic).managedLedgerOffloadDeletionLagMs
    for manifest in meta.apply_deletions(args.topic, lag):
        print(
            f"deleted segment {mf.manifest_uuid(manifest)} "
            f"({manifest.startLedgerId}:{manifest.startEntryId}..{manifest.endLedgerId}:{manifest.endEntryId})"
        )
    return 0
