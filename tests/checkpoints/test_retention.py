"""``apply_retention`` on real stores: which ledgers retention marks (time, size; never the newest), what the
deletion lag holds back, and what a deletion leaves (a record with the counts, no manifest, no objects)."""

from __future__ import annotations

import pytest

from streamoffload.checkpoints import manifest as mf
from streamoffload.checkpoints.deleted_segments import DeletedRecord
from streamoffload.checkpoints.metadata_store import MetadataStore
from streamoffload.checkpoints.metadata_view import MetadataView
from streamoffload.checkpoints.policy import OffloadPolicy
from streamoffload.checkpoints.retention import apply_retention
from streamoffload.storage import keys
from streamoffload.storage.base import ObjectStore
from streamoffload.storage.location import ScopedStore
from streamoffload.units import MIB
from tests.checkpoints.segments import HOUR_MS, NOW, TOPIC, readable_ledgers, write_segment


def policy(*, minutes: int = -1, mb: int = -1, lag_ms: int = 0) -> OffloadPolicy:
    return OffloadPolicy(retentionTimeInMinutes=minutes, retentionSizeInMB=mb, managedLedgerOffloadDeletionLagMs=lag_ms)


def test_time_retention_deletes_the_segments_of_ledgers_older_than_the_retention(store: ObjectStore) -> None:
    meta = MetadataStore(ScopedStore(store, "pre"))
    # Ledgers 10..13 published 5, 4, 1 and 0.5 hours before NOW.
    ages_h = [5, 4, 1, 0.5]
    segments = [write_segment(meta, i, [10 + i], publish_last=NOW - int(age * HOUR_MS)) for i, age in enumerate(ages_h)]

    report = apply_retention(meta, TOPIC, policy(minutes=120), NOW)

    assert report.marked_ledgers == [10, 11]
    assert report.deleted_segments == [str(mf.manifest_uuid(s)) for s in segments[:2]]
    assert readable_ledgers(meta) == [12, 13]
    marks = meta.deleted_ledgers(TOPIC)
    assert sorted(marks) == [10, 11] and {m.reason for m in marks.values()} == {"retention-time"}
    for gone in segments[:2]:  # manifest and objects are deleted; the record keeps the counts
        assert not store.exists(meta.manifest_key(gone))
        assert not store.exists(gone.dataKey) and not store.exists(gone.indexKey)
        record = DeletedRecord.decode(store.get(meta.deleted_segment_key(gone)), where="test")
        assert (record.entries, record.entry_bytes, record.start) == (10, MIB, (gone.startLedgerId, 0))
    for kept in segments[2:]:
        assert store.exists(kept.dataKey) and store.exists(meta.manifest_key(kept))


def test_the_newest_ledger_is_never_marked_even_when_past_retention(store: ObjectStore) -> None:
    meta = MetadataStore(ScopedStore(store))
    for i in range(3):
        write_segment(meta, i, [20 + i], publish_last=NOW - (10 - i) * HOUR_MS)

    report = apply_retention(meta, TOPIC, policy(minutes=60, mb=0), NOW)

    # It may still be receiving entries: marking it would delete entries written after the mark.
    assert report.marked_ledgers == [20, 21]
    assert readable_ledgers(meta) == [22]


def test_size_retention_marks_the_oldest_ledgers_until_the_rest_fits(store: ObjectStore) -> None:
    meta = MetadataStore(ScopedStore(store))
    for i in range(5):  # 5 ledgers of 1 MiB, all recent
        write_segment(meta, i, [30 + i], size=MIB, publish_last=NOW - (5 - i) * 60_000)

    report = apply_retention(meta, TOPIC, policy(mb=2), NOW)

    assert report.marked_ledgers == [30, 31, 32]
    assert {m.reason for m in meta.deleted_ledgers(TOPIC).values()} == {"retention-size"}
    assert readable_ledgers(meta) == [33, 34]
    assert apply_retention(meta, TOPIC, policy(mb=2), NOW).marked_ledgers == []  # now within the limit


def test_no_retention_configured_marks_nothing(store: ObjectStore) -> None:
    meta = MetadataStore(ScopedStore(store))
    for i in range(3):
        write_segment(meta, i, [40 + i], publish_last=NOW - 1000 * HOUR_MS)

    report = apply_retention(meta, TOPIC, policy(), NOW)

    assert (report.marked_ledgers, report.deleted_segments) == ([], [])
    assert readable_ledgers(meta) == [40, 41, 42]


def test_the_deletion_lag_keeps_marked_segments_readable_until_it_has_passed(store: ObjectStore) -> None:
    meta = MetadataStore(ScopedStore(store))
    lag_ms = 10 * 60_000
    for i in range(3):
        write_segment(meta, i, [50 + i], publish_last=NOW - (10 - i) * HOUR_MS)
    retention = policy(minutes=60, lag_ms=lag_ms)

    first = apply_retention(meta, TOPIC, retention, NOW)
    assert first.marked_ledgers == [50, 51] and first.deleted_segments == []
    assert readable_ledgers(meta) == [50, 51, 52]

    # A later pass does not mark again (the first mark's time counts) and waits for the lag.
    early = apply_retention(meta, TOPIC, retention, NOW + lag_ms - 1)
    assert (early.marked_ledgers, early.deleted_segments) == ([], [])
    assert {m.deletedTimestamp for m in meta.deleted_ledgers(TOPIC).values()} == {NOW}

    due = apply_retention(meta, TOPIC, retention, NOW + lag_ms)
    assert len(due.deleted_segments) == 2
    assert readable_ledgers(meta) == [52]


def test_a_segment_goes_only_when_every_ledger_it_holds_is_marked(store: ObjectStore) -> None:
    meta = MetadataStore(ScopedStore(store))
    write_segment(meta, 0, [60, 61], publish_last=NOW - 9 * HOUR_MS)  # spans two ledgers
    write_segment(meta, 1, [62], publish_last=NOW - 8 * HOUR_MS)
    write_segment(meta, 2, [63], publish_last=NOW)
    meta.mark_ledger_deleted(TOPIC, 60, "delete-ledger", NOW)  # one of its two ledgers

    assert apply_retention(meta, TOPIC, policy(), NOW).deleted_segments == []
    assert readable_ledgers(meta) == [60, 62, 63]

    meta.mark_ledger_deleted(TOPIC, 61, "delete-ledger", NOW)
    report = apply_retention(meta, TOPIC, policy(), NOW)
    assert len(report.deleted_segments) == 1
    assert readable_ledgers(meta) == [62, 63]


def test_a_view_kept_between_passes_gives_the_same_result_as_a_fresh_one(fs_store: ObjectStore) -> None:
    kept, fresh = MetadataStore(ScopedStore(fs_store, "a")), MetadataStore(ScopedStore(fs_store, "b"))
    for meta in (kept, fresh):
        for i in range(4):
            write_segment(meta, i, [70 + i], publish_last=NOW - (4 - i) * HOUR_MS)
    view = MetadataView(kept)
    retention = policy(minutes=150)
    for at in (NOW, NOW + HOUR_MS):
        with_view = apply_retention(kept, TOPIC, retention, at, view=view)
        without = apply_retention(fresh, TOPIC, retention, at)
        assert with_view.marked_ledgers == without.marked_ledgers
        assert len(with_view.deleted_segments) == len(without.deleted_segments)
    assert readable_ledgers(kept) == readable_ledgers(fresh) == [73]
    assert keys.list_topic_dirs(ScopedStore(fs_store, "a")) == keys.list_topic_dirs(ScopedStore(fs_store, "b"))


@pytest.mark.parametrize("minutes", [0, 59])
def test_retention_time_boundary_is_strict(fs_store: ObjectStore, minutes: int) -> None:
    """A ledger whose newest entry is exactly at the horizon stays; one a millisecond older goes."""
    meta = MetadataStore(ScopedStore(fs_store))
    horizon = NOW - minutes * 60_000
    write_segment(meta, 0, [80], publish_last=horizon)
    write_segment(meta, 1, [81], publish_last=horizon - 1)
    write_segment(meta, 2, [82], publish_last=NOW)

    report = apply_retention(meta, TOPIC, policy(minutes=minutes), NOW)

    assert report.marked_ledgers == [81]
