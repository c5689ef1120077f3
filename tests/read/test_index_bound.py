"""The index object is read no further than its manifest's ``indexLength`` (or a hard cap without a manifest), and
one of another length is refused naming it: a hostile or damaged index cannot make a reader allocate more."""

from __future__ import annotations

from pathlib import Path

import pytest

from streamoffload.checkpoints import manifest as mf
from streamoffload.codecs.errors import FormatError
from streamoffload.read.segment import SegmentKeys, SegmentReadHandle
from streamoffload.read.segment.checks import MAX_INDEX_READ_BYTES
from streamoffload.read.segment.errors import ManifestMismatchError
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
    SegmentReadHandle(store, segment).close()
    assert [a for a in store.asked if a[0] == segment.indexKey] == [(segment.indexKey, segment.indexLength + 1)]

    store.put(segment.indexKey, index + bytes(8 * 1024 * 1024))  # 8 MiB more than the manifest says
    store.asked.clear()
    with pytest.raises(
        ManifestMismatchError,
        match=f"^{segment.indexKey}: index object has more than {segment.indexLength} bytes, but its manifest "
        f"records {segment.indexLength}",
    ):
        SegmentReadHandle(store, segment)
    assert [a for a in store.asked if a[0] == segment.indexKey] == [(segment.indexKey, segment.indexLength + 1)]

    store.put(segment.indexKey, index[:-1])
    with pytest.raises(ManifestMismatchError, match=f"has {segment.indexLength - 1} bytes, but its manifest"):
        SegmentReadHandle(store, segment)


def test_an_index_length_past_the_cap_is_refused_before_any_read(
    store: CountingStore, segment: mf.SegmentManifest
) -> None:
    hostile = mf.SegmentManifest()
    hostile.CopyFrom(segment)
    hostile.indexLength = 2**40
    store.asked.clear()
    with pytest.raises(FormatError, match=f"^{segment.indexKey}: its manifest records an index of {2**40} bytes"):
        SegmentReadHandle(store, hostile)
    assert all(key != segment.indexKey for key, _ in store.asked)


def test_without_a_manifest_the_index_is_read_up_to_the_cap(store: CountingStore, segment: mf.SegmentManifest) -> None:
    store.asked.clear()
    SegmentReadHandle(store, SegmentKeys(segment.dataKey, segment.indexKey)).close()
    assert [a for a in store.asked if a[0] == segment.indexKey] == [(segment.indexKey, MAX_INDEX_READ_BYTES + 1)]
