"""The metadata store read and written directly: where a topic continues from the store alone, commits
(idempotent, conflicting), recovery after a crash between the commit and the manifest, and the view."""

from __future__ import annotations

import pytest

from streamoffload.checkpoints import manifest as mf
from streamoffload.checkpoints.metadata_store import CommitConflictError, MetadataStore, ResumePoint
from streamoffload.checkpoints.metadata_view import MetadataView
from streamoffload.storage import keys
from streamoffload.storage.base import ObjectStore
from streamoffload.storage.location import ScopedStore
from tests.checkpoints.segments import NOW, TOPIC, opened, readable_ledgers, sealed, write_segment


def test_resume_point_comes_from_the_store_alone(store: ObjectStore) -> None:
    meta = MetadataStore(ScopedStore(store, "p"))
    assert meta.resume_point(TOPIC) == ResumePoint(None, 0)
    write_segment(meta, 0, [3], publish_last=NOW)
    write_segment(meta, 1, [4, 5], publish_last=NOW)
    opened(meta, 2, (6, 0))  # an open attempt does not move the resume point

    # A new process knows nothing but the store.
    assert MetadataStore(ScopedStore(store, "p")).resume_point(TOPIC) == ResumePoint((5, 9), 2)
    assert MetadataStore(ScopedStore(store, "other")).resume_point(TOPIC) == ResumePoint(None, 0)


def test_commit_is_idempotent_for_the_same_segment_and_refuses_another(store: ObjectStore) -> None:
    meta = MetadataStore(ScopedStore(store))
    done = write_segment(meta, 0, [7], publish_last=NOW)
    meta.commit(done)  # a replayed micro-batch commits the same segment again
    assert readable_ledgers(meta) == [7]

    other = sealed(opened(meta, 0, (8, 0), epoch=3), [mf.LedgerSpan(8, 0, 9, 10, 100)], publish_last=NOW)
    with pytest.raises(CommitConflictError, match=f"segment 0 of the topic's history.*{mf.manifest_uuid(other)}"):
        meta.commit(other)
    assert readable_ledgers(meta) == [7]
    assert meta.resume_point(TOPIC) == ResumePoint((7, 9), 1)


def test_recover_publishes_a_commit_a_crash_left_unpublished_and_abandons_later_attempts(store: ObjectStore) -> None:
    meta = MetadataStore(ScopedStore(store))
    write_segment(meta, 0, [1], publish_last=NOW)
    # Crash between the two writes of a commit: the commit object exists, the manifest says Assigned.
    attempt = opened(meta, 1, (2, 0))
    done = sealed(attempt, [mf.LedgerSpan(2, 0, 9, 10, 100)], publish_last=NOW)
    store.put(done.dataKey, b"d")
    store.put(keys.commit_key(meta.prefix, TOPIC, 1), mf.encode_manifest(done))
    # And an attempt after it that an earlier run opened and never finished.
    stray = opened(meta, 2, (3, 0))
    store.put(stray.dataKey, b"partial")
    assert readable_ledgers(meta) == [1]

    point = meta.recover(TOPIC)

    assert point == ResumePoint((2, 9), 2)
    assert readable_ledgers(meta) == [1, 2]
    assert not store.exists(meta.manifest_key(stray)) and not store.exists(stray.dataKey)
    assert meta.recover(TOPIC) == point  # converged: a second recovery changes nothing


def test_the_view_reports_segment_states_without_decoding_manifests_for_the_caller(store: ObjectStore) -> None:
    meta = MetadataStore(ScopedStore(store))
    done = write_segment(meta, 0, [1], publish_last=NOW)
    assigned = opened(meta, 1, (2, 0))
    failed = opened(meta, 2, (3, 0))
    meta.record_failure(TOPIC, str(mf.manifest_uuid(failed)), "upload refused")

    snap = MetadataView(meta).refresh(TOPIC)

    states = {s.segment_id: s for s in snap.segment_states()}
    assert {sid: s.status for sid, s in states.items()} == {
        str(mf.manifest_uuid(done)): "Offloaded",
        str(mf.manifest_uuid(assigned)): "Assigned",
        str(mf.manifest_uuid(failed)): "Failed",
    }
    [readable] = snap.offloaded_states()
    assert readable.offloaded and readable.end == (1, 9) and readable.publish_last_ms == NOW
    assert (readable.entries, readable.entry_bytes, readable.data_length) == (10, done.entryBytes, done.dataLength)
    assert not states[str(mf.manifest_uuid(assigned))].offloaded
