"""``cleanup`` beside a writer, without Spark (issue 52, defect 2): a small segment's objects are written with
``put_many`` before its commit and nothing names them until then; a live write's temporary files and an upload
not yet recorded look like orphans too. Each interleaving is run deterministically, by running cleanup from inside
the writer's store calls, on a real filesystem store and on moto S3."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from streamoffload.checkpoints import manifest as mf
from streamoffload.checkpoints.cleanup_guard import CleanupGuard, CleanupRefusedError
from streamoffload.checkpoints.lease import (
    COMMIT_WINDOW_MS,
    LIVE_WRITER_GRACE_MS,
    CleanupRunningError,
    FencedError,
    WriterLease,
)
from streamoffload.checkpoints.metadata_store import MetadataStore
from streamoffload.cli import main
from streamoffload.storage import keys
from streamoffload.storage.base import ObjectStore
from streamoffload.storage.filesystem import FilesystemStore
from streamoffload.storage.location import ScopedStore
from streamoffload.streaming.segmenter.segmenter import run_segmenter
from streamoffload.streaming.segmenter.segmenter_model import CONTROL_SEAL, MemoryState
from streamoffload.streaming.sink.commit import CommitWindowError
from streamoffload.streaming.sink.sink import SegmentSink
from tests.fixtures.entries import triples
from tests.fixtures.readback import read_entries
from tests.streaming.sink.test_store_truth import BROKER, POLICY, TOPIC, entries, offload, published, reopen, store

__all__ = ["reopen", "store"]  # fixtures

Hook = Callable[[list[str]], None]


def during_put_many(monkeypatch: pytest.MonkeyPatch, store: ObjectStore, hook: Hook) -> list[str]:
    """Run ``hook(keys written)`` right after the store's next ``put_many`` (a small segment's records, data and
    index), before the sink goes on to its commit. Returns the keys written."""
    put_many = store.put_many
    written: list[str] = []

    def then_hook(objects: Any) -> None:
        put_many(objects)
        written.extend(key for key, _data, _metadata in objects)
        monkeypatch.setattr(store, "put_many", put_many)
        hook(list(written))

    monkeypatch.setattr(store, "put_many", then_hook)
    return written


def data_objects(store: ObjectStore) -> list[str]:
    return sorted(i.key for i in store.list("") if not any(part.startswith("_") for part in i.key.split("/")))


def test_cleanup_with_no_grace_beside_a_live_lease_is_refused_and_the_segment_commits_whole(
    store: ObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    scoped = ScopedStore(store)
    meta = MetadataStore(scoped)
    lease = WriterLease(scoped, "job-on-host-a")
    epoch = lease.acquire().epoch
    refusals: list[str] = []
    beside: list[int] = []

    def cleanups(written: list[str]) -> None:
        with pytest.raises(CleanupRefusedError) as refused:
            meta.cleanup(TOPIC, grace_ms=0)
        refusals.append(str(refused.value))
        # The shortest grace beside a live writer runs, and leaves the segment in flight alone.
        beside.append(meta.cleanup(TOPIC, grace_ms=LIVE_WRITER_GRACE_MS).total)

    written = during_put_many(monkeypatch, store, cleanups)
    offload(store, entries(0, 12), state=MemoryState(), epoch=epoch, controls=(CONTROL_SEAL,))

    [message] = refusals
    assert "job-on-host-a" in message and f"epoch {epoch}" in message and "--grace-minutes 10 or more" in message
    assert "\n" not in message
    assert beside == [0]
    [sealed] = meta.offloaded_segments(TOPIC)
    assert {sealed.dataKey, sealed.indexKey} <= set(written)
    assert read_entries(scoped, TOPIC) == triples(published(0, 12))
    assert WriterLease(scoped, "x").current() == lease.record, "cleanup never touched the writer's lease"


def test_with_no_live_lease_cleanup_with_no_grace_fences_the_writer_and_removes_only_its_orphans(
    store: ObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writer whose lease expired (its driver gone, a task still running) is between ``put_many`` and its commit:
    cleanup takes the lease, so the objects it removes are ones no commit will ever name."""
    scoped = ScopedStore(store)
    meta = MetadataStore(scoped)
    zombie = WriterLease(scoped, "zombie", ttl_ms=60_000)
    epoch = zombie.acquire(now_ms=1_000).epoch  # expired long ago
    removed: list[list[str]] = []
    written = during_put_many(
        monkeypatch, store, lambda _keys: removed.append(meta.cleanup(TOPIC, grace_ms=0).orphan_objects)
    )
    with pytest.raises(FencedError):
        offload(store, entries(0, 12), state=MemoryState(), epoch=epoch, controls=(CONTROL_SEAL,))
    assert removed == [sorted(written)], "the in-flight segment's records, data and index: orphans now"
    assert not list(store.list(keys.commits_prefix("", TOPIC))) and not meta.offloaded_segments(TOPIC)
    assert data_objects(store) == []
    cleaner = WriterLease(scoped, "x").current()
    assert cleaner is not None and cleaner.epoch == epoch + 1 and cleaner.ttl_ms == 0, "released at the end"

    # The next run writes the segment again; every entry reads back.
    run = WriterLease(scoped, "next-run")
    point = meta.recover(TOPIC)
    assert point.next_ordinal == 0
    offload(store, entries(0, 12), state=MemoryState(), epoch=run.acquire().epoch, controls=(CONTROL_SEAL,))
    assert read_entries(scoped, TOPIC) == triples(published(0, 12))


def test_cleanup_never_deletes_what_a_commit_names_before_its_manifest_is_written(
    store: ObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    scoped = ScopedStore(store)
    meta = MetadataStore(scoped)
    put = store.put
    reports: list[int] = []

    def then_cleanup(key: str, *args: Any, **kwargs: Any) -> Any:
        done = put(key, *args, **kwargs)
        if "/_meta/commits/" in key:  # committed; its Offloaded manifest is the next write
            reports.append(meta.cleanup(TOPIC, grace_ms=0).total)
        return done

    monkeypatch.setattr(store, "put", then_cleanup)
    offload(store, entries(0, 12), state=MemoryState(), epoch=0, controls=(CONTROL_SEAL,))
    monkeypatch.setattr(store, "put", put)
    assert reports == [0]
    [sealed] = meta.offloaded_segments(TOPIC)
    checksums = [keys.block_checksums_key(sealed.dataKey, n) for n in range(1, mf.checksum_blocks(sealed) + 1)]
    assert data_objects(store) == sorted([sealed.dataKey, sealed.indexKey, *checksums])
    assert read_entries(scoped, TOPIC) == triples(published(0, 12))


def test_an_unrecorded_upload_is_left_alone_while_a_lease_is_live_and_aborted_once_none_is(
    store: ObjectStore,
) -> None:
    """An upload started by the sink's open, before its Assigned manifest records it."""
    scoped = ScopedStore(store)
    meta = MetadataStore(scoped)
    data_key = keys.data_key("", TOPIC, "0b5a5c4e-6a3c-4f7e-9d7e-2a1d5f0c9e11")
    upload = store.start_multipart(data_key)
    lease = WriterLease(scoped, "job-on-host-a")
    lease.acquire()
    with pytest.raises(CleanupRefusedError, match="job-on-host-a"):
        meta.cleanup(TOPIC, grace_ms=0)
    assert [p.upload_id for p in store.pending_multiparts("")] == [upload.upload_id]
    lease.release()
    assert meta.cleanup(TOPIC, grace_ms=0).aborted_uploads == [data_key]
    assert not list(store.pending_multiparts(""))


def test_the_command_refuses_a_short_grace_beside_a_live_lease_and_leaves_live_temporaries_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "store"
    store = FilesystemStore(root)
    scoped = ScopedStore(store)
    offload(store, entries(0, 12), state=MemoryState(), epoch=0, controls=(CONTROL_SEAL,))
    topic_dir = root.joinpath(*keys.topic_dir("", TOPIC).strip("/").split("/"))
    temporary = topic_dir / ".6f1e-index.tmp-0123456789abcdef"  # a put in flight
    temporary.write_bytes(b"half an index")
    upload = store.start_multipart(keys.data_key("", TOPIC, "6f1e0000-0000-4000-8000-000000000000"))
    lease = WriterLease(scoped, "job-on-host-a")
    lease.acquire()

    assert main(["cleanup", "--store", str(root), "--grace-minutes", "0"]) == 1
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "job-on-host-a" in lines[0] and "--grace-minutes 10 or more" in lines[0], err
    assert main(["cleanup", "--store", str(root), "--grace-minutes", "9.9"]) == 1
    assert temporary.exists() and [p.upload_id for p in store.pending_multiparts("")] == [upload.upload_id]
    assert main(["cleanup", "--store", str(root), "--grace-minutes", "10"]) == 0
    assert temporary.exists() and [p.upload_id for p in store.pending_multiparts("")] == [upload.upload_id]
    capsys.readouterr()

    lease.release()
    assert main(["cleanup", "--store", str(root), "--grace-minutes", "0"]) == 0
    assert not temporary.exists() and not list(store.pending_multiparts(""))
    assert read_entries(scoped, TOPIC) == triples(published(0, 12))
    assert WriterLease(scoped, "job-on-host-b").acquire().epoch == lease.epoch + 2, "cleanup let its lease go"


def test_a_job_that_meets_a_cleanup_holding_the_lease_is_told_so_and_may_start_once_it_is_done(
    store: ObjectStore,
) -> None:
    scoped = ScopedStore(store)
    with CleanupGuard.take(scoped, 0) as guard:
        assert guard.lease is not None
        with pytest.raises(CleanupRunningError, match="streamoffload-cleanup"):
            WriterLease(scoped, "job").acquire()
    assert WriterLease(scoped, "job").acquire().epoch == 2


def test_a_cleanup_whose_lease_was_taken_over_stops_before_its_next_deletion(store: ObjectStore) -> None:
    scoped = ScopedStore(store)
    meta = MetadataStore(scoped)
    orphan = keys.data_key("", TOPIC, "7a2b0000-0000-4000-8000-000000000000")
    store.put(orphan, b"left by a dead attempt")
    with CleanupGuard.take(scoped, 0) as guard:
        WriterLease(scoped, "job").acquire(force=True)  # `run --take-over`
        with pytest.raises(CleanupRefusedError, match=r"cleanup stopped: .*taken over by instance job"):
            meta.cleanup(TOPIC, grace_ms=0, guard=guard)
    assert store.exists(orphan)


@pytest.mark.parametrize("late", [True, False], ids=["past-the-window", "at-the-window"])
def test_a_commit_later_than_the_window_after_its_writes_is_refused_and_the_retry_commits(
    store: ObjectStore, monkeypatch: pytest.MonkeyPatch, late: bool
) -> None:
    scoped = ScopedStore(store)
    meta = MetadataStore(scoped)
    now = [1_000.0]
    sink = SegmentSink(scoped, BROKER, clock=lambda: now[0])
    took = COMMIT_WINDOW_MS / 1000 + (0.001 if late else 0.0)
    during_put_many(monkeypatch, store, lambda _keys: now.__setitem__(0, now[0] + took))
    actions = run_segmenter(
        TOPIC,
        POLICY,
        MemoryState(),
        entries(0, 12),
        (CONTROL_SEAL,),
        now_ms=10_000,
        epoch=0,
        min_part_size=store.min_part_size,
    )
    if not late:
        sink.apply(actions)
        assert read_entries(scoped, TOPIC) == triples(published(0, 12))
        return
    with pytest.raises(CommitWindowError, match="not committed"):
        sink.apply(actions)
    assert not list(store.list(keys.commits_prefix("", TOPIC))) and not meta.offloaded_segments(TOPIC)
    # The replay (a retried batch) writes the objects again and commits in time.
    SegmentSink(scoped, BROKER, clock=lambda: now[0]).apply(actions)
    assert read_entries(scoped, TOPIC) == triples(published(0, 12))


def test_the_sweep_leaves_a_completing_uploads_temporary_link_alone(tmp_path: Path) -> None:
    """``complete`` of a lone part file (here a part written again: a replayed batch) links it as a temporary file,
    which must look as young as it is, however long ago the part was written."""
    store = FilesystemStore(tmp_path / "store")
    upload = store.start_multipart("t/obj")
    upload.write_part(1, b"the first attempt")
    upload.write_part(1, b"parts written long ago")
    [part] = (tmp_path / "store" / ".multipart" / upload.upload_id).glob("part-00001")
    os.utime(part, (1_000_000, 1_000_000))
    seen: list[int] = []
    publish = store._publish

    def sweep_then_publish(*args: Any, **kwargs: Any) -> Any:
        seen.append(store.remove_stale_temporaries(older_than=3600))
        return publish(*args, **kwargs)

    store._publish = sweep_then_publish  # type: ignore[method-assign]
    upload.complete([1])
    assert seen == [0] and store.get("t/obj") == b"parts written long ago"
