"""Retention: mark offloaded ledgers deleted by age or total size, then delete the segments whose
ledgers are all marked, once the deletion lag has passed (PIP-76 "how to delete")."""

from __future__ import annotations

from dataclasses import dataclass, field

from streamoffload.checkpoints import manifest as mf
from streamoffload.checkpoints.metadata_store import MetadataStore, now_ms
from streamoffload.config import MIB, OffloadPolicy


@dataclass
class RetentionReport:
    marked_ledgers: list[int] = field(default_factory=list)
    deleted_segments: list[str] = field(default_factory=list)


def apply_retention(
    meta: MetadataStore, topic: str, policy: OffloadPolicy, at_ms: int | None = None
) -> RetentionReport:
    """Mark ledgers past the retention time or beyond the retention size, then delete what may go.

    The newest offloaded ledger is never marked: it may still be receiving entries, and marking it
    would eventually delete data written after the mark."""
    at = now_ms() if at_ms is None else at_ms
    report = RetentionReport()
    segments = meta.offloaded_segments(topic)
    if policy.retentionTimeInMinutes >= 0 or policy.retentionSizeInMB >= 0:
        deleted = meta.deleted_ledgers(topic)
        # Per ledger: newest publish (or offload) time and bytes, over the segments holding it.
        newest: dict[int, int] = {}
        size: dict[int, int] = {}
        for seg in segments:
            stamp = seg.publishTimeLast or seg.offloadedTimestamp
            for span in mf.spans_of(seg):
                newest[span.ledger_id] = max(newest.get(span.ledger_id, 0), stamp)
                size[span.ledger_id] = size.get(span.ledger_id, 0) + span.size
        closed = sorted(newest)[:-1]
        live = [lid for lid in closed if lid not in deleted]
        if policy.retentionTimeInMinutes >= 0:
            horizon = at - int(policy.retentionTimeInMinutes * 60_000)
            for lid in live:
                if newest[lid] < horizon and meta.mark_ledger_deleted(topic, lid, "retention-time", at):
                    report.marked_ledgers.append(lid)
        if policy.retentionSizeInMB >= 0:
            limit = int(policy.retentionSizeInMB * MIB)
            marked = set(deleted) | set(report.marked_ledgers)
            total = sum(size[lid] for lid in newest if lid not in marked)
            for lid in live:
                if total <= limit:
                    break
                if lid in marked:
                    continue
                if meta.mark_ledger_deleted(topic, lid, "retention-size", at):
                    report.marked_ledgers.append(lid)
                total -= size[lid]
    for seg in meta.apply_deletions(topic, policy.managedLedgerOffloadDeletionLagMs, at):
        report.deleted_segments.append(str(mf.manifest_uuid(seg)))
    return report
