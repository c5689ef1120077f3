"""A manifest is trusted only where it stands: one whose topic or keys are not those its place in the store implies
(its topic directory, the store's prefix) is reported and left alone, never read as that topic's data and never
followed to delete anything (SPEC section 4)."""

from __future__ import annotations

import base64
import json
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from streamoffload.checkpoints import manifest as mf
from streamoffload.checkpoints.metadata_store import MetadataStore
from streamoffload.checkpoints.metadata_view import MetadataView
from streamoffload.cli import main
from streamoffload.codecs.proto.offload_manifest_pb2 import SegmentManifest
from streamoffload.read.dataset_plan import CorruptManifestError, PositionBounds, plan
from streamoffload.read.topic_reader import TopicReader
from streamoffload.storage import keys
from streamoffload.storage.filesystem import FilesystemStore
from streamoffload.storage.location import ScopedStore
from tests.read import History, offload, pulsar_entries

A = "persistent://public/default/a-partition-0"
B = "persistent://public/default/b-partition-0"
LATER = 10**13  # every object is older than any grace by then


def contents(store: FilesystemStore, prefix: str) -> dict[str, bytes]:
    """Every object under ``prefix`` but the writer lease's records (a short-grace cleanup takes the lease)."""
    return {info.key: store.get(info.key) for info in store.list(prefix) if "/_meta/writers/" not in f"/{info.key}"}


def read_all(scoped: ScopedStore, topic: str) -> list[tuple[int, int, bytes]]:
    with TopicReader(scoped) as reader:
        return [(e.ledger_id, e.entry_id, bytes(e.payload)) for e in reader.read(topic)]


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "store"


@pytest.fixture
def store(root: Path) -> FilesystemStore:
    return FilesystemStore(root, fsync=False)


@pytest.fixture
def histories(store: FilesystemStore) -> tuple[History, History]:
    """A (ledgers 3, 4) and B (ledgers 5, 6) offloaded side by side into one store."""
    a = replace(pulsar_entries({3: 30, 4: 20}, seed=1), topic=A)
    b = replace(pulsar_entries({5: 25, 6: 15}, seed=2), topic=B)
    offload(ScopedStore(store), a)
    offload(ScopedStore(store), b)
    return a, b


def put_at(meta: MetadataStore, key: str, manifest: SegmentManifest) -> None:
    meta.store.put(key, mf.encode_manifest(manifest))


def test_an_attempt_of_a_naming_bs_objects_deletes_nothing_of_b(
    store: FilesystemStore, histories: tuple[History, History]
) -> None:
    """Defect 1 of issue 52: cleanup (and recovery) of A followed an Assigned manifest of A to B's live data."""
    _, b = histories
    meta = MetadataStore(ScopedStore(store))
    victim = meta.offloaded_segments(B)[0]
    seg_id = uuid.uuid4()
    hostile = mf.new_manifest(
        topic=A,
        segment_id=seg_id,
        ordinal=99,
        format_version=2,
        start=(90, 0),
        assigned_ms=1,
        data_key=victim.dataKey,
        index_key=victim.indexKey,
        driver_properties={mf.PROP_UPLOAD_ID: "not-an-upload"},
    )
    key = meta.manifest_key(hostile)
    put_at(meta, key, hostile)
    before = contents(store, keys.topic_dir("", B))

    meta.recover(A)  # run start: abandons every attempt past the last commit
    meta.cleanup(A, grace_ms=0, at_ms=LATER)
    assert contents(store, keys.topic_dir("", B)) == before
    with pytest.raises(mf.MisplacedManifestError, match="names the data object"):
        meta.delete_segment(hostile)  # the last check before any deletion, however the manifest came
    assert contents(store, keys.topic_dir("", B)) == before
    assert read_all(ScopedStore(store), B) == b.expected
    assert store.get(key) == mf.encode_manifest(hostile)  # reported and left alone
    [bad] = meta.corrupt_manifests(A)
    assert (bad.key, bad.foreign) == (key, True)
    assert victim.dataKey in bad.error and bad.error.startswith(key + ": ")
    assert keys.data_key("", A, seg_id) in bad.error  # what the key must be there


def test_retention_does_not_follow_a_manifest_of_a_to_bs_objects(
    store: FilesystemStore, histories: tuple[History, History]
) -> None:
    """An Offloaded manifest of A (its topic rewritten) naming B's objects: every ledger it spans marked deleted,
    retention of A (the store's and the incremental view's) deletes nothing of B."""
    _, b = histories
    meta = MetadataStore(ScopedStore(store))
    victim = meta.offloaded_segments(B)[0]
    hostile = SegmentManifest()
    hostile.CopyFrom(victim)
    hostile.topic = A
    put_at(meta, meta.manifest_key(hostile), hostile)
    for span in mf.spans_of(hostile):
        meta.mark_ledger_deleted(A, span.ledger_id, "test", at_ms=1)
    before = contents(store, keys.topic_dir("", B))

    assert meta.apply_deletions(A, lag_ms=0, at_ms=LATER) == []
    assert MetadataView(meta).apply_deletions(A, lag_ms=0, at_ms=LATER) == []

    assert contents(store, keys.topic_dir("", B)) == before
    assert read_all(ScopedStore(store), B) == b.expected


def test_bs_manifest_copied_into_a_is_not_read_as_as_data_and_verify_names_it(
    capsys: pytest.CaptureFixture[str], root: Path, store: FilesystemStore, histories: tuple[History, History]
) -> None:
    """Defect 1 of issue 52: `read A --messages` returned A's messages and B's."""
    a, b = histories
    meta = MetadataStore(ScopedStore(store))
    copied = meta.offloaded_segments(B)[0]
    key = keys.manifest_key("", A, copied.startLedgerId, copied.startEntryId, mf.manifest_uuid(copied))
    put_at(meta, key, copied)

    assert read_all(ScopedStore(store), A) == a.expected
    assert {m.topic for m in meta.offloaded_segments(A)} == {A}
    tasks = plan(ScopedStore(store), [A], {})  # the dataset reader: A's segments only
    assert {mf.decode_manifest(t.manifest).topic for t in tasks} == {A}
    assert read_all(ScopedStore(store), B) == b.expected

    code = main(["read", "--store", root.as_uri(), A, "--messages"])
    out, err = capsys.readouterr()
    assert code == 0
    lines: list[dict[str, Any]] = [json.loads(line) for line in out.splitlines()]
    expected = [
        (entry.ledger_id, entry.entry_id, msg.payload)
        for entry in a.entries
        for msg in a.messages[(entry.ledger_id, entry.entry_id)]
    ]
    assert [(d["ledger_id"], d["entry_id"], base64.b64decode(d["payload"])) for d in lines] == expected
    assert key in err and "is of topic" in err and B in err

    code = main(["verify", "--store", root.as_uri(), "--json", A])
    out, _ = capsys.readouterr()
    assert code != 0
    [problem] = json.loads(out)["problems"]
    assert (problem["object"], problem["error"]) == (key, "MisplacedManifest")
    assert B in problem["message"]


def test_a_commit_of_b_in_as_history_stops_recovery_and_writes_nothing_into_b(
    store: FilesystemStore, histories: tuple[History, History]
) -> None:
    meta = MetadataStore(ScopedStore(store))
    last_b = meta.last_commit(B)
    assert last_b is not None
    key = keys.commit_key("", A, meta.resume_point(A).next_ordinal)
    put_at(meta, key, last_b)
    meta.store.delete(meta.manifest_key(last_b))  # recovery would publish it (into B's directory)
    before = contents(store, keys.topic_dir("", B))

    with pytest.raises(mf.MisplacedManifestError, match=f"^{key}: segment manifest is of topic"):
        meta.recover(A)
    assert contents(store, keys.topic_dir("", B)) == before


def test_a_store_copied_to_a_new_prefix_is_refused_as_moved_and_nothing_is_deleted(
    store: FilesystemStore, histories: tuple[History, History]
) -> None:
    """Its manifests name the old prefix: a read says the store was moved, cleanup leaves every object alone."""
    for info in list(store.list("")):
        store.put("copy/" + info.key, store.get(info.key), dict(info.metadata))
    copy = MetadataStore(ScopedStore(store, "copy"))
    before = contents(store, "copy/")

    assert copy.offloaded_segments(A) == []
    corrupt = copy.corrupt_manifests(A)
    assert corrupt and not any(c.foreign for c in corrupt)
    assert "the store was moved or copied from no prefix" in corrupt[0].error
    with pytest.raises(CorruptManifestError, match="moved or copied"):
        plan(ScopedStore(store, "copy"), [A], {A: PositionBounds()})
    copy.cleanup(A, grace_ms=0, at_ms=LATER)
    copy.cleanup(B, grace_ms=0, at_ms=LATER)
    assert contents(store, "copy/") == before


def test_check_place_names_the_manifest_and_what_it_named() -> None:
    seg_id = uuid.uuid4()
    good = mf.new_manifest(
        topic=A,
        segment_id=seg_id,
        ordinal=3,
        format_version=1,
        start=(7, 0),
        assigned_ms=1,
        data_key=keys.data_key("tier", A, seg_id, ledger_id=7),
        index_key=keys.index_key("tier", A, seg_id, ledger_id=7),
    )
    key = keys.manifest_key("tier", A, 7, 0, seg_id)
    assert mf.check_place(good, key=key, prefix="tier", topic=A) is good
    assert mf.check_place(good, key=keys.commit_key("tier", A, 3), prefix="/tier/", topic=A) is good

    def refused(manifest: SegmentManifest, *, at: str = key, prefix: str = "tier") -> mf.MisplacedManifestError:
        with pytest.raises(mf.MisplacedManifestError) as err:
            mf.check_place(manifest, key=at, prefix=prefix, topic=A)
        assert str(err.value).startswith(at + ": ")
        return err.value

    assert refused(good, at=keys.commit_key("tier", A, 4)).named == key
    moved = refused(good, at=keys.manifest_key("elsewhere", A, 7, 0, seg_id), prefix="elsewhere")
    assert moved.moved_from == "tier" and "moved or copied from prefix 'tier'" in str(moved)
    other = SegmentManifest()
    other.CopyFrom(good)
    other.indexKey = keys.index_key("tier", B, seg_id, ledger_id=7)
    err = refused(other)
    assert (err.named, err.moved_from) == (other.indexKey, None) and good.indexKey in str(err)
    other.CopyFrom(good)
    other.dataKey = keys.data_key("tier", A, seg_id)  # the v2 name of a v1 segment
    assert refused(other).named == other.dataKey
    other.CopyFrom(good)
    other.topic = "not a topic//"
    assert refused(other).named == "not a topic//"
