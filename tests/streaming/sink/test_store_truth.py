"""The store is the source of truth, without Spark: the writer lease, fenced commits, recovery from the
store, uploads bound to their segment. The segmenter and sink run here as plain Python, exactly as Spark
runs them, against both stores the job writes to: a real filesystem store and moto S3 (where a part short
of 5 MiB must be the last, and a phantom multipart upload is a real S3 upload)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from streamoffload.checkpoints import manifest as mf
from streamoffload.checkpoints.lease import FencedError, LeaseHeldError, WriterLease
from streamoffload.checkpoints.metadata_store import CommitConflictError, MetadataStore
from streamoffload.checkpoints.policy import OffloadPolicy
from streamoffload.codecs.entry import Message, build_entry
from streamoffload.storage.base import ObjectStore
from streamoffload.storage.filesystem import FilesystemStore
from streamoffload.storage.location import ScopedStore
from streamoffload.streaming.handoff.actions import Action, OpenAction
from streamoffload.streaming.handoff.entry import Entry
from streamoffload.streaming.segmenter.segmenter import run_segmenter
from streamoffload.streaming.segmenter.segmenter_model import CONTROL_SEAL, MemoryState
from streamoffload.streaming.sink.sink import SegmentSink
from tests.fixtures.entries import Published, holding, memory_sink, metas, triples
from tests.fixtures.readback import read_entries

TOPIC = "persistent://public/default/truth-partition-0"
POLICY = OffloadPolicy(managedLedgerOffloadMaxBlockSizeInBytes=4096, maxSizePerOffloadSegmentMbytes=0.02)


def published(first: int, count: int, ledger: int = 3) -> list[Published]:
    return [
        Published(
            ledger,
            i,
            build_entry([Message(f"m{i}".encode() * 20)], producer_name="p", sequence_id=i, publish_time=1000 + i),
            1000 + i,
        )
        for i in range(first, first + count)
    ]


def entries(first: int, count: int, ledger: int = 3) -> list[Entry]:
    """What the segmenter sees of ``published``'s entries."""
    return metas(published(first, count, ledger))


BROKER = holding(TOPIC, published(0, 500))
"""Every entry the tests here offload, where a sink fetches it (the same bytes each time)."""


def new_sink(store: ObjectStore) -> SegmentSink:
    """A sink as a (new) executor process has it: fetching from the broker."""
    return memory_sink(ScopedStore(store), fetcher=BROKER)


@pytest.fixture(params=["filesystem", pytest.param("s3", marks=pytest.mark.s3)])
def reopen(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[], ObjectStore]]:
    """One empty store, of each kind: each call opens a new handle on it, as another process (an executor,
    a second instance) has."""
    opened: list[ObjectStore] = []
    if request.param == "s3":
        from streamoffload.storage.s3 import S3Store

        bucket, settings = request.getfixturevalue("s3_bucket"), request.getfixturevalue("s3_settings")

        def new() -> ObjectStore:
            opened.append(S3Store(bucket, **settings))
            return opened[-1]
    else:

        def new() -> ObjectStore:
            opened.append(FilesystemStore(tmp_path / "store"))
            return opened[-1]

    yield new
    for store in opened:
        store.close()


@pytest.fixture
def store(reopen: Callable[[], ObjectStore]) -> ObjectStore:
    return reopen()


def offload(
    store: ObjectStore,
    batch: list[Entry],
    *,
    state: MemoryState,
    epoch: int,
    resume: tuple[list[int] | None, int] | None = None,
    controls: tuple[str, ...] = (),
    now_ms: int = 10_000,
) -> list[Action]:
    actions = run_segmenter(
        TOPIC,
        POLICY,
        state,
        batch,
        controls,
        now_ms=now_ms,
        epoch=epoch,
        resume=resume,
        min_part_size=store.min_part_size,
    )
    new_sink(store).apply(list(actions))
    return actions


# -- the lease -----------------------------------------------------------------------------------------


def test_two_instances_started_at_once_one_wins_and_the_other_is_told_who_holds_it(
    reopen: Callable[[], ObjectStore], store: ObjectStore
) -> None:
    results: dict[str, Any] = {}
    barrier = threading.Barrier(2)

    def start(name: str) -> None:
        lease = WriterLease(ScopedStore(reopen()), f"instance-{name}")
        barrier.wait()
        try:
            results[name] = lease.acquire()
        except LeaseHeldError as err:
            results[name] = err

    threads = [threading.Thread(target=start, args=(n,)) for n in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    errors = [v for v in results.values() if isinstance(v, LeaseHeldError)]
    winners = [v for v in results.values() if not isinstance(v, LeaseHeldError)]
    assert len(errors) == 1 and len(winners) == 1
    assert winners[0].holder in str(errors[0]) and "expires" in str(errors[0])
    assert WriterLease(ScopedStore(store), "x").current() == winners[0]


def test_a_restart_of_the_same_instance_takes_its_lease_at_once_others_wait_for_expiry(store: ObjectStore) -> None:
    first = WriterLease(ScopedStore(store, "p"), "host-a", ttl_ms=60_000)
    assert first.acquire(now_ms=1_000).epoch == 1
    with pytest.raises(LeaseHeldError, match="host-a"):
        WriterLease(ScopedStore(store, "p"), "host-b").acquire(now_ms=2_000)
    # The same instance after a crash: no waiting.
    again = WriterLease(ScopedStore(store, "p"), "host-a")
    assert again.acquire(now_ms=3_000).epoch == 2
    with pytest.raises(FencedError, match="epoch 2"):
        first.renew()
    # Another instance takes over once the lease has expired, and fences the old holder.
    taker = WriterLease(ScopedStore(store, "p"), "host-b")
    assert taker.acquire(now_ms=3_000 + 60_001).epoch == 3
    with pytest.raises(FencedError, match="host-b"):
        again.check()
    taker.renew()


# -- fenced commits --------------------------------------------------------------------------------------


def test_a_zombie_writer_cannot_commit_after_it_was_fenced(store: ObjectStore) -> None:
    meta = MetadataStore(ScopedStore(store))
    zombie_lease = WriterLease(ScopedStore(store), "zombie")
    zombie_lease.acquire()
    zombie_state = MemoryState()
    offload(store, entries(0, 30), state=zombie_state, epoch=zombie_lease.epoch)
    assert not meta.offloaded_segments(TOPIC), "nothing sealed yet: the zombie's segment is open"

    # A new instance takes over (forced), recovers from the store, and offloads the same entries.
    owner = WriterLease(ScopedStore(store), "owner")
    owner.acquire(force=True)
    point = meta.recover(TOPIC)
    assert point.last is None and point.next_ordinal == 0
    assert not meta.manifests(TOPIC), "the zombie's attempt was abandoned"
    owner_state = MemoryState()
    offload(store, entries(0, 40), state=owner_state, epoch=owner.epoch, resume=(point.last, point.next_ordinal))
    offload(store, [], state=owner_state, epoch=owner.epoch, controls=(CONTROL_SEAL,))

    # The zombie wakes up and seals: its lease check refuses the commit ...
    with pytest.raises(FencedError):
        offload(store, entries(30, 10), state=zombie_state, epoch=zombie_lease.epoch, controls=(CONTROL_SEAL,))
    # ... and even a writer that skipped the check cannot take the committed place.
    seal = run_segmenter(TOPIC, POLICY, MemoryState(), entries(0, 40), (CONTROL_SEAL,), now_ms=10_000, epoch=99)
    sealed = mf.decode_manifest(next(a for a in seal if a.kind == "seal").manifest)
    with pytest.raises(CommitConflictError, match="already committed"):
        meta.commit(sealed)

    assert read_entries(ScopedStore(store), TOPIC) == triples(published(0, 40))


def test_recovery_resumes_after_the_last_commit_and_publishes_a_commit_a_crash_left_unpublished(
    store: ObjectStore,
) -> None:
    meta = MetadataStore(ScopedStore(store))
    state = MemoryState()
    epoch = WriterLease(ScopedStore(store), "me").acquire().epoch
    offload(store, entries(0, 25), state=state, epoch=epoch)
    offload(store, [], state=state, epoch=epoch, controls=(CONTROL_SEAL,))
    [first] = meta.offloaded_segments(TOPIC)
    # A crash between the commit and the Offloaded manifest leaves the manifest Assigned.
    store.put(meta.manifest_key(first), mf.encode_manifest(_assigned(first)))
    assert not meta.offloaded_segments(TOPIC)
    # An unfinished attempt after it, from the crashed run.
    offload(store, entries(25, 10), state=state, epoch=epoch)
    assert len(meta.manifests(TOPIC)) == 2

    point = meta.recover(TOPIC)
    assert point.last == (3, 24) and point.next_ordinal == 1
    assert [mf.manifest_uuid(m) for m in meta.offloaded_segments(TOPIC)] == [mf.manifest_uuid(first)]
    assert len(meta.manifests(TOPIC)) == 1, "the unfinished attempt is gone"
    assert not list(store.pending_multiparts("")), "and its upload aborted (by the id its manifest recorded)"

    # The next run continues exactly there, with a new epoch: nothing is written twice or skipped.
    state2 = MemoryState()
    epoch2 = WriterLease(ScopedStore(store), "me").acquire().epoch
    offload(store, entries(25, 20), state=state2, epoch=epoch2, resume=(list(point.last or ()), point.next_ordinal))
    offload(store, [], state=state2, epoch=epoch2, controls=(CONTROL_SEAL,))
    assert read_entries(ScopedStore(store), TOPIC) == triples(published(0, 45))
    assert [m.ordinal for m in meta.offloaded_segments(TOPIC)] == [0, 1]


def _assigned(sealed: Any) -> Any:
    out = mf.SegmentManifest()
    out.CopyFrom(sealed)
    out.status = mf.ASSIGNED
    return out


# -- uploads bound to their segment ---------------------------------------------------------------------


def test_a_phantom_multipart_upload_neither_wedges_the_segment_nor_survives_cleanup(store: ObjectStore) -> None:
    meta = MetadataStore(ScopedStore(store))
    state = MemoryState()
    actions = offload(store, entries(0, 30), state=state, epoch=0)
    data_key = next(a.data_key for a in actions if a.kind == "open")
    # A retried create (or anything else) starts a second upload of the same key after the parts.
    phantom = store.start_multipart(data_key)
    phantom.write_part(1, b"junk")
    # Another executor (a fresh sink: no cached upload) writes the next parts and seals.
    offload(store, entries(30, 30), state=state, epoch=0, controls=(CONTROL_SEAL,))
    assert read_entries(ScopedStore(store), TOPIC) == triples(published(0, 60))
    [pending] = list(store.pending_multiparts(""))
    assert pending.upload_id == phantom.upload_id, "the upload that held the parts was completed, not aborted"
    report = meta.cleanup(TOPIC, grace_ms=0)
    assert report.aborted_uploads == [data_key]
    assert not list(store.pending_multiparts(""))


def test_an_open_replayed_after_a_lost_race_keeps_to_the_recorded_upload(store: ObjectStore) -> None:
    state = MemoryState()
    part = store.min_part_size
    actions = run_segmenter(TOPIC, POLICY, state, entries(0, 30), (), now_ms=10_000, epoch=0, min_part_size=part)
    open_row = next(a for a in actions if isinstance(a, OpenAction))
    first, second = new_sink(store), new_sink(store)
    first.apply([open_row])
    second.apply([open_row])  # a speculative or retried task: its own create is aborted at once
    [pending] = list(store.pending_multiparts(""))
    manifest = mf.decode_manifest(
        store.get(MetadataStore(ScopedStore(store)).manifest_key(mf.decode_manifest(open_row.manifest)))
    )
    assert mf.driver_property(manifest, mf.PROP_UPLOAD_ID) == pending.upload_id
    second.apply(list([a for a in actions if a.kind != "open"]))
    seal = run_segmenter(TOPIC, POLICY, state, [], (CONTROL_SEAL,), now_ms=10_000, epoch=0, min_part_size=part)
    new_sink(store).apply(list(seal))
    assert read_entries(ScopedStore(store), TOPIC) == triples(published(0, 30))


def test_a_segment_keeps_the_policy_it_was_opened_under(tmp_path: Path) -> None:
    state = MemoryState()
    run_segmenter(TOPIC, POLICY, state, entries(0, 5), (), now_ms=10_000, epoch=0)
    bigger = OffloadPolicy(managedLedgerOffloadMaxBlockSizeInBytes=1 << 20, maxSizePerOffloadSegmentMbytes=64)
    actions = run_segmenter(TOPIC, bigger, state, entries(5, 400), (), now_ms=10_001, epoch=0)
    # The old (small) policy still governs the open segment: it is sealed by size ...
    seals = [a for a in actions if a.kind == "seal"]
    assert seals and all(mf.decode_manifest(a.manifest).dataLength <= POLICY.max_segment_bytes for a in seals)
    recorded = mf.driver_property(mf.decode_manifest(seals[0].manifest), mf.PROP_POLICY)
    assert recorded is not None and '"managedLedgerOffloadMaxBlockSizeInBytes":4096' in recorded
    # ... and the next segment opens under the new one.
    opens = [mf.decode_manifest(a.manifest) for a in actions if a.kind == "open"]
    assert opens and '"managedLedgerOffloadMaxBlockSizeInBytes":1048576' in str(
        mf.driver_property(opens[-1], mf.PROP_POLICY)
    )


def test_a_disabled_topic_offloads_what_it_already_read_and_then_seals(store: ObjectStore) -> None:
    state = MemoryState()
    disabled = OffloadPolicy(enabled=False, managedLedgerOffloadMaxBlockSizeInBytes=4096)
    actions = run_segmenter(
        TOPIC, disabled, state, entries(0, 12), (), now_ms=10_000, epoch=0, min_part_size=store.min_part_size
    )
    new_sink(store).apply(list(actions))
    [seal] = [a for a in actions if a.kind == "seal"]
    assert mf.decode_manifest(seal.manifest).sealReason == "disabled"
    assert read_entries(ScopedStore(store), TOPIC) == triples(published(0, 12)), "paused, never skipped"


# -- small segments written whole -------------------------------------------------------------------------


def test_a_small_segment_sealed_in_its_batch_is_one_put_with_no_upload_and_no_assigned_manifest(
    store: ObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    meta = MetadataStore(ScopedStore(store))

    def no_upload(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a small segment sealed in its own batch started a multipart upload")

    monkeypatch.setattr(store, "start_multipart", no_upload)
    written: list[str] = []
    put, put_many = store.put, store.put_many

    def recording_put(key: str, *args: Any, **kwargs: Any) -> Any:
        written.append(key)
        return put(key, *args, **kwargs)

    def recording_put_many(objects: Any) -> None:
        written.extend(key for key, _data, _metadata in objects)
        put_many(objects)

    monkeypatch.setattr(store, "put", recording_put)
    monkeypatch.setattr(store, "put_many", recording_put_many)
    actions = offload(store, entries(0, 12), state=MemoryState(), epoch=0, controls=(CONTROL_SEAL,))
    [sealed] = meta.offloaded_segments(TOPIC)
    manifest_key = meta.manifest_key(sealed)
    assert written.count(manifest_key) == 1, "the manifest is written once, Offloaded, last"
    assert written[-1] == manifest_key
    assert written.index(sealed.dataKey) < written.index(sealed.indexKey) < written.index(manifest_key)
    assert read_entries(ScopedStore(store), TOPIC) == triples(published(0, 12))
    info = store.head(sealed.dataKey)
    assert info.size == sealed.dataLength and info.metadata["s3managedledgeroffloaderformatversion"] == "1"

    # A replay of the batch (a retried task, or a restart before Spark recorded it) writes the same objects.
    before = {k: store.get(k) for k in (sealed.dataKey, sealed.indexKey)}
    new_sink(store).apply(list(actions))
    assert {k: store.get(k) for k in before} == before
    assert [mf.manifest_uuid(m) for m in meta.offloaded_segments(TOPIC)] == [mf.manifest_uuid(sealed)]
    assert read_entries(ScopedStore(store), TOPIC) == triples(published(0, 12))


def test_a_run_asks_once_whether_a_segment_object_exists_not_before_every_part(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Parts of a segment written in one run: one existence check of its data object (S3: one HEAD, not one per
    part); a replay of the run after its seal asks once too and writes no part."""
    store = FilesystemStore(tmp_path / "store")
    asked: list[str] = []
    parts: list[str] = []
    exists = store.exists
    monkeypatch.setattr(store, "exists", lambda key: asked.append(key) or exists(key))
    start = store.start_multipart

    def recording_start(key: str, *args: Any, **kwargs: Any) -> Any:
        upload = start(key, *args, **kwargs)
        write = upload.write_part
        upload.write_part = lambda n, data: parts.append(f"{key}#{n}") or write(n, data)  # type: ignore[method-assign]
        return upload

    monkeypatch.setattr(store, "start_multipart", recording_start)
    state = MemoryState()
    actions = offload(store, entries(0, 150), state=state, epoch=0)  # open, and a part for each full block
    [data_key] = {p.split("#")[0] for p in parts}
    assert len(parts) >= 3, parts  # a segment of several parts: the case this test is about
    assert asked.count(data_key) == 1
    offload(store, entries(150, 10), state=state, epoch=0, controls=(CONTROL_SEAL,))
    [sealed] = MetadataStore(ScopedStore(store)).offloaded_segments(TOPIC)
    assert sealed.dataKey == data_key
    assert read_entries(ScopedStore(store), TOPIC) == triples(published(0, 160))

    asked.clear()
    parts.clear()
    new_sink(store).apply(list(actions))  # a replay of the first run: the object exists, every part is skipped
    assert asked.count(data_key) == 1 and not parts
    assert read_entries(ScopedStore(store), TOPIC) == triples(published(0, 160))


def test_what_a_failed_whole_write_left_never_makes_a_later_attempt_skip_its_parts(
    store: ObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An attempt written whole fails after its data object (here at the index); the next attempt of the same
    segment (same epoch, ordinal and start: the same name) has other entries and spans two batches, so it goes
    through a multipart upload, which must not take the stale object for its own completed one."""
    meta = MetadataStore(ScopedStore(store))
    put_many = store.put_many

    def failing_index(objects: Any) -> None:
        put_many([o for o in objects if not o[0].endswith("-index")])
        raise OSError("injected: the store failed at the index")

    monkeypatch.setattr(store, "put_many", failing_index)
    with pytest.raises(Exception, match="injected"):
        offload(store, entries(0, 12), state=MemoryState(), epoch=0, controls=(CONTROL_SEAL,))
    monkeypatch.setattr(store, "put_many", put_many)
    assert not meta.offloaded_segments(TOPIC)
    stale = [info.key for info in store.list("") if "/_meta/" not in info.key and "-crc-" not in info.key]
    assert len(stale) == 1, stale  # the data object, and no manifest names it

    point = meta.recover(TOPIC)
    state = MemoryState()
    resume = (list(point.last or ()), point.next_ordinal) if point.last else None
    offload(store, entries(0, 5), state=state, epoch=0, resume=resume)
    offload(store, entries(5, 3), state=state, epoch=0, controls=(CONTROL_SEAL,))
    [sealed] = meta.offloaded_segments(TOPIC)
    assert sealed.dataKey == stale[0], "the same segment name: the case this test is about"
    assert read_entries(ScopedStore(store), TOPIC) == triples(published(0, 8))
    report = meta.cleanup(TOPIC, grace_ms=0)
    assert not report.orphan_objects and not list(store.pending_multiparts(""))
