"""A view that folds its older segments (``MetadataView(keep_recent=...)``) must decide and count exactly what a
view holding every segment does: the same ledgers marked, the same segments deleted, the same totals, whatever
another process deletes meanwhile; and what it holds must not grow with the store's history."""

from __future__ import annotations

import shutil
import tracemalloc
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamoffload.checkpoints import manifest as mf
from streamoffload.checkpoints.metadata_store import MetadataStore
from streamoffload.checkpoints.metadata_view import MetadataView
from streamoffload.checkpoints.policy import OffloadPolicy
from streamoffload.checkpoints.retention import apply_retention
from streamoffload.codecs.proto.offload_manifest_pb2 import SegmentManifest
from streamoffload.metrics.model import store_totals
from streamoffload.storage import keys
from streamoffload.storage.filesystem import FilesystemStore
from streamoffload.storage.location import ScopedStore

TOPIC = "persistent://tenant/ns/fold-partition-0"
BASE_MS = 1_700_000_000_000
MINUTE = 60_000


class History:
    """Segments of one topic-partition written into a store one after another: ``entries`` entries each, in
    ledgers of ``per_ledger`` entries, so a segment may run on from one ledger into the next."""

    def __init__(self, meta: MetadataStore, per_ledger: int) -> None:
        self.meta = meta
        self.per_ledger = per_ledger
        self.ordinal = 0
        self.next_entry = 0  # the topic's entry count so far

    def position(self, n: int) -> tuple[int, int]:
        return 100 + n // self.per_ledger, n % self.per_ledger

    def offload(self, entries: int) -> SegmentManifest:
        first, last = self.next_entry, self.next_entry + entries - 1
        spans = []
        n = first
        while n <= last:
            ledger, entry = self.position(n)
            upto = min(last, (ledger - 100 + 1) * self.per_ledger - 1)
            spans.append(mf.LedgerSpan(ledger, entry, self.position(upto)[1], upto - n + 1, (upto - n + 1) * 1000))
            n = upto + 1
        seg_id = mf.segment_uuid(TOPIC, self.ordinal, self.position(first))
        opened = mf.new_manifest(
            topic=TOPIC,
            segment_id=seg_id,
            ordinal=self.ordinal,
            format_version=2,
            start=self.position(first),
            assigned_ms=BASE_MS,
            data_key=keys.data_key("", TOPIC, seg_id),
            index_key=keys.index_key("", TOPIC, seg_id),
        )
        manifest = mf.sealed_manifest(
            opened,
            end=self.position(last),
            offloaded_ms=BASE_MS + self.ordinal * MINUTE + 500,
            spans=spans,
            data_length=entries * 1000 + 64,
            index_length=64,
            block_count=1,
            part_count=1,
            seal_reason=("size", "time", "entries")[self.ordinal % 3],
            publish_time_first=BASE_MS + self.ordinal * MINUTE,
            publish_time_last=BASE_MS + self.ordinal * MINUTE + entries,
        )
        self.meta.commit(manifest)  # as the job does: the commit object, then the Offloaded manifest
        self.ordinal += 1
        self.next_entry = last + 1
        return manifest


def _meta(root: Path) -> MetadataStore:
    return MetadataStore(ScopedStore(FilesystemStore(root, fsync=False)))


def _figures(view: MetadataView) -> tuple[object, ...]:
    """What the passes read of a topic-partition, as a folded and a full view must both tell it."""
    snap = view.refresh(TOPIC)
    totals = store_totals(snap)
    held = snap.offloaded()
    ledgers = dict.fromkeys(snap.fold.ledgers, 0) | {s.ledger_id: 0 for r in held for s in r.spans}
    newest = {lid: ledger.newest_ms for lid, ledger in snap.fold.ledgers.items()}
    for record in held:
        for span in record.spans:
            ledgers[span.ledger_id] += span.size
            newest[span.ledger_id] = max(newest.get(span.ledger_id, 0), record.publish_last_ms)
    for lid, ledger in snap.fold.ledgers.items():
        ledgers[lid] += ledger.size
    unmarked = {lid: (ledgers[lid], newest[lid]) for lid in ledgers if lid not in snap.marks}
    return (
        totals.segments,
        totals.entries,
        totals.bytes,
        sorted(totals.seals.items()),
        sorted(totals.sizes.counts),
        snap.fold.segments + len(held),
        snap.fold.totals.data_length + sum(r.data_length for r in held),
        sorted(snap.marks),
        unmarked,
    )


operation = st.one_of(
    st.tuples(st.just("offload"), st.integers(1, 6), st.integers(1, 25)),
    st.tuples(st.just("retain"), st.integers(0, 40), st.integers(-1, 30)),
    st.tuples(st.just("other"), st.integers(0, 40), st.integers(-1, 30)),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    keep=st.integers(1, 4),
    per_ledger=st.integers(5, 40),
    ops=st.lists(operation, min_size=1, max_size=12),
)
def test_a_folded_view_decides_and_counts_as_a_full_one(
    tmp_path_factory: object, keep: int, per_ledger: int, ops: list[tuple[str, int, int]]
) -> None:
    """Two copies of one store, the same operations on each: retention and compaction through a folded view on
    one, through a full view on the other, and deletions by another process (a view of its own) on both. After
    each step the stores hold the same keys, and a fresh full view, the folded view and the full view read the
    same figures."""
    base = tmp_path_factory.mktemp("fold")  # type: ignore[attr-defined]
    roots = [base / "folded", base / "full"]
    metas = [_meta(root) for root in roots]
    histories = [History(meta, per_ledger) for meta in metas]
    views = [MetadataView(metas[0], keep_recent=keep), MetadataView(metas[1])]
    for op, a, b in ops:
        for i in (0, 1):
            if op == "offload":
                for _ in range(a):
                    histories[i].offload(b)
            else:
                policy = OffloadPolicy(
                    retentionSizeInMB=-1 if b < 0 else b * 1000 / 1_048_576,
                    retentionTimeInMinutes=a,
                    managedLedgerOffloadDeletionLagMs=0,
                )
                at = BASE_MS + (histories[i].ordinal + 1) * MINUTE
                view = views[i] if op == "retain" else MetadataView(metas[i])
                apply_retention(metas[i], TOPIC, policy, at, view=view)
                view.compact(TOPIC, grace_ms=0, at_ms=at)
        stored = [sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()) for root in roots]
        assert stored[0] == stored[1], f"after {op}: the stores differ"
        fresh = _figures(MetadataView(metas[1]))
        assert _figures(views[0]) == fresh, f"after {op}: the folded view reads differently"
        assert _figures(views[1]) == fresh
        held = views[0].refresh(TOPIC).segments
        assert len([r for r in held.values() if r.offloaded]) <= keep
    for root in roots:
        shutil.rmtree(root)


def test_what_a_folded_view_holds_does_not_grow_with_the_history(tmp_path: Path) -> None:
    """Python memory held by a folded view after refreshes over 200 and then 1,200 segments (10 per ledger):
    what grows is a group per ledger, not a record per segment (a full view holds ~1.6 KB per segment)."""
    meta = _meta(tmp_path / "store")
    history = History(meta, per_ledger=10 * 7)
    view = MetadataView(meta, keep_recent=4)
    tracemalloc.start()
    try:
        for _ in range(200):
            history.offload(7)
        view.refresh(TOPIC)
        small = tracemalloc.take_snapshot()
        for _ in range(1000):
            history.offload(7)
        view.refresh(TOPIC)
        large = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    view_file = str(Path(mf.__file__).with_name("metadata_view.py"))
    grown = sum(
        stat.size_diff
        for stat in large.compare_to(small, "filename")
        if stat.traceback[0].filename in (view_file, str(Path(mf.__file__).with_name("deleted_segments.py")))
    )
    # 100 more ledgers (a group and a ledger entry each, ~1 KB) and nothing per segment: under 200 bytes a segment.
    assert grown < 1000 * 200, f"the folded view grew {grown} bytes over 1,000 more segments"
    snap = view.refresh(TOPIC)
    assert len(snap.segments) == 4
    assert snap.fold.segments == 1196
    assert len(snap.fold.groups) == 120
    assert list(snap.commits) == [1199], "the newest commit only (no segment was deleted)"


def test_a_segment_written_among_the_folded_ones_is_read(tmp_path: Path) -> None:
    """Keys appear only after the newest in normal running; one that appears among the folded keys (another
    process) makes the view read the topic-partition again rather than miss it or count it twice."""
    meta = _meta(tmp_path / "store")
    history = History(meta, per_ledger=10)
    kept = [history.offload(5) for _ in range(12)]
    view = MetadataView(meta, keep_recent=2)
    assert view.refresh(TOPIC).fold.segments == 10
    # Delete one folded manifest and write it back: the count per ledger changes twice, the totals do not.
    victim = kept[3]
    meta.store.delete(meta.manifest_key(victim))
    snap = view.refresh(TOPIC)
    assert snap.fold.segments == 9
    assert store_totals(snap).segments == 11
    meta.put_manifest(victim)
    snap = view.refresh(TOPIC)
    assert store_totals(snap).segments == 12
    assert _figures(view) == _figures(MetadataView(meta))
    # Both segments of ledger 101 (entries 10-19) go, so its group does; then one comes back where no group is.
    gone = [m for m in kept if m.startLedgerId == 101]
    assert len(gone) == 2
    for manifest in gone:
        meta.store.delete(meta.manifest_key(manifest))
    assert store_totals(view.refresh(TOPIC)).segments == 10
    assert 101 not in view.refresh(TOPIC).fold.groups
    meta.put_manifest(gone[0])
    snap = view.refresh(TOPIC)
    assert store_totals(snap).segments == 11
    assert _figures(view) == _figures(MetadataView(meta))


def test_the_metrics_count_folded_segments_and_forget_them_one_by_one(tmp_path: Path) -> None:
    """The metrics' store view folds (its default); the per-topic figures still cover every segment, and the
    segments the collector counted are remembered one by one only until the view folds them."""
    from streamoffload.metrics.collector import JobMetrics

    meta = _meta(tmp_path / "store")
    history = History(meta, per_ledger=10)
    written = [history.offload(4) for _ in range(30)]
    metrics = JobMetrics(meta, read_cache=False, keep_recent=3)
    metrics.refresh_store()
    sample = metrics.registry.get_sample_value
    assert sample("streamoffload_segments", {"topic": TOPIC, "status": "Offloaded"}) == 30
    assert sample("streamoffload_stored_bytes", {"topic": TOPIC}) == sum(m.dataLength for m in written)
    assert sample("streamoffload_entries_offloaded_total", {"topic": TOPIC}) == 120
    state = metrics._topics[TOPIC]
    assert len(state.counted) == 3 and state.counted_segments == 3
    for _ in range(10):
        history.offload(4)
    metrics.refresh_store()
    assert sample("streamoffload_segments", {"topic": TOPIC, "status": "Offloaded"}) == 40
    assert sample("streamoffload_entries_offloaded_total", {"topic": TOPIC}) == 160
    assert len(state.counted) == 3
