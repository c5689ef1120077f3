"""Retention and the metrics refresher cost what changed, not the history: counted store calls on
100 topic-partitions x 100 segments; and the compaction of what deletions leave behind."""

from __future__ import annotations

import gc
import os
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from streamoffload.checkpoints import manifest as mf
from streamoffload.checkpoints.deleted_segments import DeletedRecord
from streamoffload.checkpoints.metadata_store import MetadataStore
from streamoffload.checkpoints.metadata_view import MetadataView
from streamoffload.checkpoints.policy import OffloadPolicy
from streamoffload.checkpoints.retention import RetentionRunner, apply_retention
from streamoffload.codecs.metadata import uuid_to_msb_lsb
from streamoffload.codecs.proto.offload_manifest_pb2 import SegmentManifest
from streamoffload.metrics.collector import JobMetrics
from streamoffload.storage import keys
from streamoffload.storage.base import MultipartWrite, ObjectInfo, ObjectStore, PendingUpload
from streamoffload.storage.filesystem import FilesystemStore
from streamoffload.storage.location import ScopedStore
from streamoffload.units import MIB

TOPICS = 100
SEGMENTS = 100
PUBLISH_BASE = 1_700_000_000_000
NOW = PUBLISH_BASE + 10 * 24 * 3600 * 1000


class CountingStore(ObjectStore):
    """A store that counts the calls made to it (by operation) and passes them on."""

    def __init__(self, inner: ObjectStore) -> None:
        self.inner = inner
        self.calls: Counter[str] = Counter()

    @property
    def url(self) -> str:
        return self.inner.url

    def reads(self) -> int:
        return self.calls["get"] + self.calls["get_range"] + self.calls["head"]

    def put(
        self, key: str, data: bytes | memoryview, metadata: Mapping[str, str] | None = None, *, if_absent: bool = False
    ) -> ObjectInfo:
        self.calls["put"] += 1
        return self.inner.put(key, data, metadata, if_absent=if_absent)

    def get(self, key: str) -> bytes:
        self.calls["get"] += 1
        return self.inner.get(key)

    def get_range(self, key: str, start: int, length: int) -> bytes:
        self.calls["get_range"] += 1
        return self.inner.get_range(key, start, length)

    def head(self, key: str) -> ObjectInfo:
        self.calls["head"] += 1
        return self.inner.head(key)

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        self.calls["list"] += 1
        return self.inner.list(prefix)

    def delete(self, key: str) -> None:
        self.calls["delete"] += 1
        self.inner.delete(key)

    def start_multipart(self, key: str, metadata: Mapping[str, str] | None = None) -> MultipartWrite:
        self.calls["start_multipart"] += 1
        return self.inner.start_multipart(key, metadata)

    def resume_multipart(self, key: str, upload_id: str) -> MultipartWrite:
        self.calls["resume_multipart"] += 1
        return self.inner.resume_multipart(key, upload_id)

    def pending_multiparts(self, prefix: str) -> Iterator[PendingUpload]:
        self.calls["pending_multiparts"] += 1
        return self.inner.pending_multiparts(prefix)


def topic_name(i: int) -> str:
    return f"persistent://tenant/ns/topic-{i:03d}-partition-0"


def sealed(topic: str, ordinal: int, *, size: int = MIB, publish_last: int | None = None) -> SegmentManifest:
    """An Offloaded manifest of segment ``ordinal``: ledger 1000 + ordinal, 10 entries of ``size`` bytes in all."""
    ledger = 1000 + ordinal
    seg_id = mf.segment_uuid(topic, ordinal, (ledger, 0))
    opened = mf.new_manifest(
        topic=topic,
        segment_id=seg_id,
        ordinal=ordinal,
        format_version=2,
        start=(ledger, 0),
        assigned_ms=PUBLISH_BASE,
        data_key=keys.data_key("", topic, seg_id),
        index_key=keys.index_key("", topic, seg_id),
    )
    return mf.sealed_manifest(
        opened,
        end=(ledger, 9),
        offloaded_ms=PUBLISH_BASE + ordinal * 1000 + 500,
        spans=[mf.LedgerSpan(ledger, 0, 9, 10, size)],
        data_length=size + 4096,
        index_length=64,
        block_count=1,
        part_count=1,
        seal_reason="size" if ordinal % 2 else "time",
        publish_time_first=PUBLISH_BASE + ordinal * 1000,
        publish_time_last=publish_last if publish_last is not None else PUBLISH_BASE + ordinal * 1000 + 9,
    )


def write_history(root: Path, topics: int, segments: int, *, commits: bool = False) -> None:
    """Offloaded manifests (and optionally commits) written as files straight into a filesystem store's
    tree, from one template per ordinal: no data objects (retention and metrics read metadata only), and
    much faster than topics x segments puts."""
    template = [sealed(topic_name(0), ordinal) for ordinal in range(segments)]
    for i in range(topics):
        topic = topic_name(i)
        manifests_dir = root.joinpath(*keys.manifests_prefix("", topic).strip("/").split("/"))
        commits_dir = root.joinpath(*keys.commits_prefix("", topic).strip("/").split("/"))
        manifests_dir.mkdir(parents=True)
        commits_dir.mkdir(parents=True)
        for ordinal, base in enumerate(template):
            manifest = SegmentManifest()
            manifest.CopyFrom(base)
            seg_id = mf.segment_uuid(topic, ordinal, (base.startLedgerId, 0))
            manifest.topic = topic
            manifest.uidMsb, manifest.uidLsb = uuid_to_msb_lsb(seg_id)
            manifest.dataKey = keys.data_key("", topic, seg_id)
            manifest.indexKey = keys.index_key("", topic, seg_id)
            data = mf.encode_manifest(manifest)
            (manifests_dir / f"{base.startLedgerId:020d}-{0:020d}-{seg_id}").write_bytes(data)
            if commits:
                (commits_dir / f"{ordinal:020d}").write_bytes(data)


def test_second_passes_with_no_change_list_once_per_topic_and_read_nothing(tmp_path: Path) -> None:
    """100 topic-partitions x 100 segments: the metrics refresher's and retention's second passes."""
    root = tmp_path / "store"
    write_history(root, TOPICS, SEGMENTS)
    counting = CountingStore(FilesystemStore(root, fsync=False))
    meta = MetadataStore(ScopedStore(counting))

    # The metrics refresher: the first refresh reads every manifest once (and lists the whole store once,
    # to find the topic-partitions); the second lists each topic's metadata once and reads nothing.
    metrics = JobMetrics(meta, read_cache=False)
    # Each full refresh also lists the failing topics' records once (streaming.governance.quarantine; none here).
    metrics.refresh_store()
    assert counting.calls["get"] == TOPICS * SEGMENTS
    assert counting.calls["list"] == TOPICS + 1 + 1
    counting.calls.clear()
    metrics.refresh_store()
    assert counting.calls["list"] == TOPICS + 1
    assert counting.reads() == 0
    entries = metrics.registry.get_sample_value("streamoffload_entries_offloaded_total", {"topic": topic_name(42)})
    assert entries == SEGMENTS * 10

    # Retention: 100 MiB offloaded per topic-partition, 95 allowed: the 5 oldest ledgers go (lag 0).
    counting.calls.clear()
    policy = OffloadPolicy(retentionSizeInMB=95, managedLedgerOffloadDeletionLagMs=0)
    runner = RetentionRunner(meta, lambda _topic: policy, temporaries_interval_s=0, clock=lambda: NOW)
    first = runner.run_pass()
    assert first.errors == {}
    assert len(first.topics) == TOPICS
    for report in first.topics.values():
        assert report.marked_ledgers == [1000, 1001, 1002, 1003, 1004]
        assert len(report.deleted_segments) == 5
        assert report.compaction is not None
        assert len(report.compaction.folded_records) == 4  # the newest record stays
    # Every manifest once, and each deleted segment's once more: deleting needs the whole manifest. The runner's
    # view holds only the newest segments and folds the rest into sums (KEEP_RECENT), so the deleted ones, being
    # folded, cost one more listing of each topic's manifests.
    assert counting.calls["get"] == TOPICS * SEGMENTS + TOPICS * 5
    assert counting.calls["list"] == TOPICS + 1 + TOPICS

    counting.calls.clear()
    second = runner.run_pass()
    assert second.topics == {} and second.errors == {}
    assert counting.calls["list"] == TOPICS
    assert counting.reads() == 0
    assert counting.calls["put"] == counting.calls["delete"] == 0

    # What the first pass left: 95 segments, one deleted-segment record and a summary of the other 4.
    topic = topic_name(7)
    assert [m.ordinal for m in meta.offloaded_segments(topic)] == list(range(5, SEGMENTS))
    assert len(meta.deleted_segment_ids(topic)) == 1
    snap = MetadataView(meta).refresh(topic)
    assert snap.summary is not None and snap.summary.totals.segments == 4
    assert snap.deleted_totals().entries == 5 * 10
    assert snap.deleted_totals().entry_bytes == 5 * MIB

    # The metrics refresher sees the deletions and keeps its totals.
    counting.calls.clear()
    metrics.refresh_store()
    assert counting.calls["list"] == TOPICS + 1
    # What is new in each topic's metadata: 5 deletion marks, the deleted-segment record kept, the summary.
    assert counting.calls["get"] == TOPICS * (5 + 1 + 1)
    assert metrics.registry.get_sample_value("streamoffload_entries_offloaded_total", {"topic": topic}) == 1000
    assert metrics.registry.get_sample_value("streamoffload_segments", {"topic": topic, "status": "Offloaded"}) == 95


def _resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_the_view_keeps_well_under_a_kilobyte_per_segment(tmp_path: Path) -> None:
    """The job's views (retention's and the metrics') hold every segment the store holds, for as long as it
    runs: a decoded manifest kept for each cost ~5.4 KB of resident memory (a 10-minute soak's driver grew
    66 MiB), a record of what the passes read costs a fraction. Resident memory, not tracemalloc: protobuf
    messages live outside Python's allocator."""
    topics, segments = 8, 500
    root = tmp_path / "store"
    write_history(root, topics, segments)
    meta = MetadataStore(ScopedStore(FilesystemStore(root, fsync=False)))
    view = MetadataView(meta)
    view.refresh(topic_name(0))  # warm: imports, first allocations
    gc.collect()
    before = _resident_bytes()
    for i in range(1, topics):
        view.refresh(topic_name(i))
    gc.collect()
    per_segment = (_resident_bytes() - before) / ((topics - 1) * segments)
    assert sum(len(view.snapshot(topic_name(i)).offloaded()) for i in range(topics)) == topics * segments
    assert per_segment < 1024, f"{per_segment:.0f} bytes of resident memory per segment"


def test_a_change_costs_reads_of_what_changed_only(tmp_path: Path) -> None:
    root = tmp_path / "store"
    write_history(root, 10, 20, commits=True)
    counting = CountingStore(FilesystemStore(root, fsync=False))
    meta = MetadataStore(ScopedStore(counting))
    view = MetadataView(meta)
    for i in range(10):
        view.refresh(topic_name(i))
    topic = topic_name(3)
    meta.commit(sealed(topic, 20))  # one new segment
    meta.mark_ledger_deleted(topic, 1000, "delete-ledger command")
    counting.calls.clear()
    snap = view.refresh(topic)
    assert counting.calls["get"] == 2  # the new manifest and the new mark
    assert counting.calls["list"] == 1
    assert len(snap.offloaded()) == 21 and list(snap.marks) == [1000]
    assert sorted(snap.commits) == list(range(21))


def test_topics_are_rediscovered_rarely_and_extra_topics_join_at_once(tmp_path: Path) -> None:
    counting = CountingStore(FilesystemStore(tmp_path / "store", fsync=False))
    meta = MetadataStore(ScopedStore(counting))
    meta.commit(sealed(topic_name(0), 0))
    clock = [0.0]
    view = MetadataView(meta, rediscover_s=600, clock=lambda: clock[0])
    assert view.topics() == [topic_name(0)]
    meta.commit(sealed(topic_name(1), 0))
    counting.calls.clear()
    assert view.topics() == [topic_name(0)]  # not listed again yet
    assert view.topics([topic_name(1)]) == [topic_name(0), topic_name(1)]  # told of it
    assert counting.calls["list"] == 0
    meta.commit(sealed(topic_name(2), 0))
    clock[0] = 601
    assert view.topics() == [topic_name(0), topic_name(1), topic_name(2)]
    assert counting.calls["list"] == 1


def test_told_what_changed_a_pass_lists_only_that_and_the_rest_once_per_relist_interval(tmp_path: Path) -> None:
    """The job's passes (retention, metrics) with ``relist_s``: a quiet topic-partition costs no request until
    its relist time; one marked changed is listed at the next pass and its new segment seen."""
    counting = CountingStore(FilesystemStore(tmp_path / "store", fsync=False))
    meta = MetadataStore(ScopedStore(counting))
    for i in range(5):
        meta.commit(sealed(topic_name(i), 0))
    clock = [0.0]
    view = MetadataView(meta, relist_s=3600, clock=lambda: clock[0])
    policy = OffloadPolicy()

    def a_pass() -> int:
        counting.calls.clear()
        for name in view.topics():
            apply_retention(meta, name, policy, NOW, view=view)
        return counting.calls["list"]

    assert a_pass() == 1 + 5  # the store once (discovery), then each topic-partition once
    clock[0] = 60
    assert a_pass() == 0  # nothing changed, nothing listed
    meta.commit(sealed(topic_name(3), 1))
    view.mark_changed([topic_name(3)])
    clock[0] = 120
    assert a_pass() == 1  # only the one the job wrote
    assert len(view.snapshot(topic_name(3)).offloaded()) == 2
    meta.commit(sealed(topic_name(4), 1))  # written by another process: not marked
    clock[0] = 180
    assert a_pass() == 0
    assert len(view.snapshot(topic_name(4)).offloaded()) == 1  # not seen yet
    clock[0] = 3800
    assert a_pass() == 1 + 5  # the relist interval (and rediscovery) passed: everything once
    assert len(view.snapshot(topic_name(4)).offloaded()) == 2
    # Without relist_s every pass lists every topic-partition (a view of a store others write).
    plain = MetadataView(meta)
    counting.calls.clear()
    for _ in range(2):
        for name in plain.topics():
            plain.snapshot(name)
    assert counting.calls["list"] == 1 + 2 * 5


# -- compaction --------------------------------------------------------------------------------------


@pytest.fixture
def small(tmp_path: Path) -> tuple[FilesystemStore, MetadataStore]:
    store = FilesystemStore(tmp_path / "store", fsync=False)
    meta = MetadataStore(ScopedStore(store))
    for ordinal in range(6):
        manifest = sealed(TOPIC, ordinal)
        meta.commit(manifest)
        store.put(manifest.dataKey, b"d" * 10)
        store.put(manifest.indexKey, b"i")
    return store, meta


TOPIC = topic_name(0)


def delete_all(meta: MetadataStore, view: MetadataView) -> None:
    for ledger in range(1000, 1006):
        assert view.mark_ledger_deleted(TOPIC, ledger, "test", at_ms=NOW)
    assert len(view.apply_deletions(TOPIC, 0, NOW)) == 6


def test_deleted_segment_records_carry_counts_and_compaction_keeps_the_newest(
    small: tuple[FilesystemStore, MetadataStore],
) -> None:
    store, meta = small
    view = MetadataView(meta)
    delete_all(meta, view)
    records = {r.segment_id: r for r in view.refresh(TOPIC).deleted.values()}
    assert len(records) == 6 and all(r.has_counts and r.entries == 10 for r in records.values())

    report = view.compact(TOPIC, at_ms=NOW)
    assert len(report.folded_records) == 5
    # Every segment is gone, but the newest commit stays: it tells where the topic continues.
    assert sorted(report.removed_commits) == [0, 1, 2, 3, 4]
    assert meta.resume_point(TOPIC).next_ordinal == 6
    fresh = MetadataView(meta).refresh(TOPIC)
    [kept] = fresh.deleted.values()
    assert kept.ordinal == 5  # the newest deletion: status can still tell the topic was deleted by retention
    totals = fresh.deleted_totals()
    assert (totals.segments, totals.entries, totals.entry_bytes) == (6, 60, 6 * MIB)
    assert totals.seals == {"size": 3, "time": 3}
    assert [k.key for k in store.list(keys.topic_dir("", TOPIC)) if "/_meta/" not in k.key] == []
    # A second compaction has nothing to do.
    assert view.compact(TOPIC, at_ms=NOW).total == 0


def test_a_compaction_interrupted_after_its_summary_does_not_count_twice(
    small: tuple[FilesystemStore, MetadataStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    store, meta = small
    view = MetadataView(meta)
    delete_all(meta, view)
    real_delete = store.delete

    def crash_on_records(key: str) -> None:
        if keys.DELETED_SEGMENTS_DIR in key:
            raise OSError("killed")
        real_delete(key)

    monkeypatch.setattr(store, "delete", crash_on_records)
    with pytest.raises(OSError):
        view.compact(TOPIC, at_ms=NOW)
    monkeypatch.setattr(store, "delete", real_delete)
    after_crash = MetadataView(meta).refresh(TOPIC)
    assert len(after_crash.deleted) == 6 and after_crash.summary is not None
    assert after_crash.deleted_totals().segments == 6  # the summary's pending records are not added again

    report = MetadataView(meta).compact(TOPIC, at_ms=NOW)
    assert len(report.folded_records) == 5
    final = MetadataView(meta).refresh(TOPIC)
    assert len(final.deleted) == 1 and len(final.summaries) == 1
    assert final.deleted_totals().entries == 60


def test_two_compactions_at_once_fold_each_record_once(small: tuple[FilesystemStore, MetadataStore]) -> None:
    _store, meta = small
    delete_all(meta, MetadataView(meta))
    first, second = MetadataView(meta), MetadataView(meta)
    first.refresh(TOPIC)
    second.refresh(TOPIC)  # both saw the same summary (none) and the same records
    assert len(first.compact(TOPIC, at_ms=NOW).folded_records) == 5
    assert second.compact(TOPIC, at_ms=NOW).folded_records == []  # its summary version was taken
    assert MetadataView(meta).refresh(TOPIC).deleted_totals().segments == 6


def test_failure_notes_of_gone_attempts_go_after_the_grace(small: tuple[FilesystemStore, MetadataStore]) -> None:
    _store, meta = small
    gone, live = str(uuid.uuid4()), str(mf.manifest_uuid(meta.offloaded_segments(TOPIC)[0]))
    meta.record_failure(TOPIC, gone, "OSError: disk full")
    meta.record_failure(TOPIC, live, "OSError: disk full")
    view = MetadataView(meta)
    view.refresh(TOPIC)
    # Rounded up: a note's time is its file's, to the sub-millisecond; truncating ``now`` could put it a
    # fraction of a millisecond before the note, and the note a fraction short of the grace below.
    now = int(time.time() * 1000) + 1
    assert view.compact(TOPIC, grace_ms=3_600_000, at_ms=now).removed_failures == []  # young: maybe in flight
    assert view.compact(TOPIC, grace_ms=3_600_000, at_ms=now + 3_600_000).removed_failures == [gone]
    assert set(meta.failures(TOPIC)) == {live}


def test_legacy_protobuf_records_still_decode(small: tuple[FilesystemStore, MetadataStore]) -> None:
    store, meta = small
    manifest = meta.offloaded_segments(TOPIC)[0]
    key = meta.deleted_segment_key(manifest)
    store.put(key, mf.deleted_segment_record(manifest, 1234))
    record = DeletedRecord.decode(store.get(key), where=key)
    assert record.segment_id == str(mf.manifest_uuid(manifest)) and record.deleted_ms == 1234
    assert not record.has_counts and record.ordinal is None
    meta.delete_segment(manifest)  # rewrites it as JSON, with the counts
    assert DeletedRecord.decode(store.get(key), where=key).entries == 10


def test_metrics_totals_survive_retention_compaction_and_a_restart(
    small: tuple[FilesystemStore, MetadataStore],
) -> None:
    _store, meta = small
    live = JobMetrics(meta, read_cache=False)
    live.refresh_store()
    total = {"topic": TOPIC}
    assert live.registry.get_sample_value("streamoffload_entries_offloaded_total", total) == 60
    policy = OffloadPolicy(retentionSizeInMB=2, managedLedgerOffloadDeletionLagMs=0)
    runner = RetentionRunner(meta, lambda _t: policy, temporaries_interval_s=0, clock=lambda: NOW)
    report = runner.run_pass()
    assert len(report.topics[TOPIC].deleted_segments) == 4
    live.refresh_store()
    restarted = JobMetrics(meta, read_cache=False)
    restarted.refresh_store()
    for metrics in (live, restarted):
        get = metrics.registry.get_sample_value
        assert get("streamoffload_entries_offloaded_total", total) == 60
        assert get("streamoffload_bytes_offloaded_total", total) == 6 * MIB
        assert get("streamoffload_segment_size_bytes_count", {}) == 6  # one histogram for the job
        assert get("streamoffload_segment_size_bytes_bucket", {"le": "2097152.0"}) == 6
        assert get("streamoffload_namespace_entries_offloaded_total", {"namespace": "tenant/ns"}) == 60
        assert get("streamoffload_segments_sealed_total", {**total, "reason": "size"}) == 3
        assert get("streamoffload_segments", {**total, "status": "Offloaded"}) == 2


def test_apply_retention_without_a_view_still_works(small: tuple[FilesystemStore, MetadataStore]) -> None:
    _, meta = small
    report = apply_retention(meta, TOPIC, OffloadPolicy(retentionSizeInMB=3, managedLedgerOffloadDeletionLagMs=0), NOW)
    assert report.marked_ledgers == [1000, 1001, 1002] and len(report.deleted_segments) == 3


def test_the_runner_thread_runs_passes_until_stopped(small: tuple[FilesystemStore, MetadataStore]) -> None:
    _, meta = small
    policy = OffloadPolicy(retentionSizeInMB=1, managedLedgerOffloadDeletionLagMs=0)
    seen = threading.Event()
    runner = RetentionRunner(meta, lambda _t: policy, interval_s=0.05, temporaries_interval_s=0)
    original = runner.run_pass

    def run_pass(at_ms: int | None = None) -> Any:
        out = original(at_ms)
        if runner.passes >= 2:
            seen.set()
        return out

    runner.run_pass = run_pass  # type: ignore[method-assign]
    runner.start()
    try:
        assert seen.wait(10)
    finally:
        runner.stop()
    assert not runner.running
    assert [m.ordinal for m in meta.offloaded_segments(TOPIC)] == [5]
    passes = runner.passes
    time.sleep(0.2)
    assert runner.passes == passes  # stopped means stopped
