"""The index object is read no further than its manifest's ``indexLength`` (or a hard cap without a manifest), and
one of another length is refused naming it: a hostile or damaged index cannot make a reader allocate more."""

from __future__ import annotations

from pathlib import Path

import pytest

from streamoffload.checkpoints import manifest as mf
from streamoffload.codecs.errors import FormatError
from streamoffload.codecs.topics import TopicName
from streamoffload.read.segment import SegmentKeys, SegmentReadHandle, checks
from streamoffload.read.segment.checks import MAX_INDEX_READ_BYTES
from streamoffload.read.segment.errors import ManifestMismatchError
from streamoffload.read.verify import segment as verify_segment_module
from streamoffload.read.verify import verify_topic
from streamoffload.storage.filesystem import FilesystemStore
from streamoffload.storage.location import ScopedStore
from tests.read import TOPIC, offload, pulsar_entries


class CountingStore(FilesystemStore):
    """A filesystem store that records what its reads of whole objects and of ranges asked for."""

    def __init__(self, root: Path) -> None:
        super().__init__(root, fsync=False)
        self.asked: list[tuple[str, int | None]] = []

    def get(self, key: str) -> bytes:
        self.asked.append((key, None))
        return super().get(key)

    def get_range(self, key: str, start: int, length: int) -> bytes:
        self.asked.append((key, length))
        return super().get_range(key, start, length)


@pytest.fixture
def store(tmp_path: Path) -> CountingStore:
    return CountingStore(tmp_path / "store")


@pytest.fixture
def segment(store: CountingStore) -> mf.SegmentManifest:
    return offload(ScopedStore(store), pulsar_entries({3: 40})).offloaded_segments(TOPIC)[0]


def test_the_index_is_read_up_to_its_recorded_length_and_a_longer_one_is_refused(
    store: CountingStore, segment: mf.SegmentManifest
) -> None:
    index = store.get(segment.indexKey)
    assert len(index) == segment.indexLength
    store.asked.clear()
    SegmentReadHandle.open(store, segment).close()
    assert [a for a in store.asked if a[0] == segment.indexKey] == [(segment.indexKey, segment.indexLength + 1)]

    longer = segment.indexLength + 8 * 1024 * 1024
    store.put(segment.indexKey, index + bytes(8 * 1024 * 1024))  # 8 MiB more than the manifest says
    store.asked.clear()
    with pytest.raises(
        ManifestMismatchError,
        match=f"^{segment.indexKey}: index object has {longer} bytes, but its manifest records {segment.indexLength}$",
    ):
        SegmentReadHandle.open(store, segment)
    assert [a for a in store.asked if a[0] == segment.indexKey] == []  # refused on its HEAD

    # Without the HEAD (check_metadata=False) it is read up to the recorded length and one more, and refused.
    store.asked.clear()
    with pytest.raises(
        ManifestMismatchError,
        match=f"^{segment.indexKey}: index object has more than {segment.indexLength} bytes, but its manifest "
        f"records {segment.indexLength} \\(at byte offset {segment.indexLength + 1}\\)$",
    ):
        SegmentReadHandle.open(store, segment, check_metadata=False)
    assert [a for a in store.asked if a[0] == segment.indexKey] == [(segment.indexKey, segment.indexLength + 1)]

    store.put(segment.indexKey, index[:-1])
    with pytest.raises(ManifestMismatchError, match=f"has {segment.indexLength - 1} bytes, but its manifest"):
        SegmentReadHandle.open(store, segment)


def test_an_index_length_past_the_cap_is_refused_before_any_read(
    store: CountingStore, segment: mf.SegmentManifest
) -> None:
    hostile = mf.SegmentManifest()
    hostile.CopyFrom(segment)
    hostile.indexLength = 2**40
    store.asked.clear()
    with pytest.raises(FormatError, match=f"^{segment.indexKey}: its manifest records an index of {2**40} bytes"):
        SegmentReadHandle.open(store, hostile)
    assert all(key != segment.indexKey for key, _ in store.asked)


def test_an_index_length_larger_than_the_object_is_refused_before_any_read(
    store: CountingStore, segment: mf.SegmentManifest
) -> None:
    """A manifest claiming an index within the cap but larger than the object (its HEAD says how large): refused
    naming both sizes, and nothing of the index is read (nor allocated to the claimed length)."""
    hostile = mf.SegmentManifest()
    hostile.CopyFrom(segment)
    hostile.indexLength = MAX_INDEX_READ_BYTES
    store.asked.clear()
    with pytest.raises(
        ManifestMismatchError,
        match=f"^{segment.indexKey}: index object has {segment.indexLength} bytes, but its manifest records "
        f"{MAX_INDEX_READ_BYTES}$",
    ):
        SegmentReadHandle.open(store, hostile)
    assert all(key != segment.indexKey for key, _ in store.asked)


def test_without_a_manifest_the_index_is_read_up_to_its_size_or_the_cap(
    store: CountingStore, segment: mf.SegmentManifest, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.asked.clear()
    SegmentReadHandle.open(store, SegmentKeys(segment.dataKey, segment.indexKey)).close()
    assert [a for a in store.asked if a[0] == segment.indexKey] == [(segment.indexKey, segment.indexLength + 1)]
    store.asked.clear()
    SegmentReadHandle.open(store, SegmentKeys(segment.dataKey, segment.indexKey), check_metadata=False).close()
    assert [a for a in store.asked if a[0] == segment.indexKey] == [(segment.indexKey, MAX_INDEX_READ_BYTES + 1)]

    monkeypatch.setattr(checks, "MAX_INDEX_READ_BYTES", segment.indexLength - 1)  # an index above the cap
    store.asked.clear()
    with pytest.raises(
        ManifestMismatchError,
        match=f"^{segment.indexKey}: index object has {segment.indexLength} bytes, more than the "
        f"{segment.indexLength - 1} a reader takes$",
    ):
        SegmentReadHandle.open(store, SegmentKeys(segment.dataKey, segment.indexKey))
    assert all(key != segment.indexKey for key, _ in store.asked)


def test_verify_reads_an_index_up_to_its_size_and_one_too_large_not_at_all(
    store: CountingStore, segment: mf.SegmentManifest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``verify`` asked for the cap plus one of every index (64 MiB taken by a filesystem read whatever the
    object held): it asks for the size its HEAD said and one more, and one above the cap is a problem unread."""
    topic = TopicName.parse(segment.topic)
    store.asked.clear()
    assert verify_topic(ScopedStore(store), topic, crc=True).all_problems == []
    assert [a for a in store.asked if a[0] == segment.indexKey] == [(segment.indexKey, segment.indexLength + 1)]

    monkeypatch.setattr(verify_segment_module, "MAX_INDEX_READ_BYTES", segment.indexLength - 1)
    store.asked.clear()
    problems = verify_topic(ScopedStore(store), topic, crc=True).all_problems
    assert [(p.object, p.error, p.message) for p in problems if p.object == segment.indexKey] == [
        (
            segment.indexKey,
            "IndexTooLarge",
            f"index object has {segment.indexLength} bytes, more than a reader takes ({segment.indexLength - 1})",
        )
    ]
    assert [a for a in store.asked if a[0] == segment.indexKey] == []
