"""What a store holds while a job writes to it, told apart: the objects of Offloaded segments, which grow with
the traffic as they should, and everything else, which should not.

Every Offloaded segment accounts for a fixed set of objects (``storage/keys.py``): its data object, its index,
one checksum record per block, its manifest and its commit. What is left over ("loose" objects) is what is
in flight or forgotten: the open segments' Assigned manifests, committed segments whose manifest is not yet
rewritten Offloaded, failure notes, superseded attempts, the lease and the policy versions. With steady
traffic it stays near one open segment per topic-partition plus a few; a leak (objects an aborted attempt
leaves, notes written per batch, ...) makes it grow. Unfinished multipart uploads are counted apart (the
store's own list of them: a staging directory on a filesystem store, ``ListMultipartUploads`` on S3).
"""

from __future__ import annotations

from dataclasses import dataclass

from streamoffload.checkpoints import manifest as mf
from streamoffload.codecs.errors import FormatError
from streamoffload.codecs.proto.offload_manifest_pb2 import SegmentManifest
from streamoffload.storage import keys
from streamoffload.storage.base import ObjectNotFoundError
from streamoffload.storage.location import ScopedStore

SEGMENTS_DIR = "/_meta/segments/"


@dataclass
class StoreCount:
    objects: int
    """Every object the store lists under the prefix."""
    offloaded_segments: int
    offloaded_topics: int
    """Topic-partitions with at least one Offloaded segment."""
    loose_objects: int
    """Objects that belong to no Offloaded segment (see the module docstring)."""
    open_uploads: int


class StoreCensus:
    """Counts a store's objects on demand. An Offloaded manifest never changes again, so each is read once and
    remembered; a manifest not yet Offloaded is read again at the next count (about one per topic-partition).
    A count lists the whole prefix: on a filesystem store about a second per few hundred thousand objects."""

    def __init__(self, scoped: ScopedStore) -> None:
        self.store = scoped.store
        self.prefix = scoped.prefix
        self._offloaded: dict[str, tuple[str, ...]] = {}
        """Offloaded manifest key -> the keys of the objects its segment accounts for, the commit included."""

    def count(self) -> StoreCount:
        listed = {info.key for info in self.store.list(f"{self.prefix}/" if self.prefix else "")}
        accounted = 0
        segments = 0
        topics: set[str] = set()
        for key in listed:
            if SEGMENTS_DIR not in key:
                continue
            owned = self._offloaded.get(key) or self._read_offloaded(key)
            if owned:
                # Only what this listing holds: a segment sealed between the listing and the manifest's read (a
                # listing of ~300,000 objects takes seconds) had fewer of its objects listed than it owns.
                accounted += sum(1 for owned_key in owned if owned_key in listed)
                segments += 1
                topics.add(key.partition(SEGMENTS_DIR)[0])
        uploads = sum(1 for _ in self.store.pending_multiparts(f"{self.prefix}/" if self.prefix else ""))
        return StoreCount(len(listed), segments, len(topics), len(listed) - accounted, uploads)

    def _read_offloaded(self, key: str) -> tuple[str, ...]:
        try:
            manifest = mf.decode_manifest(self.store.get(key), where=key)
        except (ObjectNotFoundError, FormatError):
            return ()  # deleted between list and get, or caught mid-write on a store without atomic puts
        if manifest.status != mf.OFFLOADED:
            return ()
        owned = (key, *segment_object_keys(self.prefix, manifest))
        self._offloaded[key] = owned
        return owned


def segment_object_keys(prefix: str, manifest: SegmentManifest) -> list[str]:
    """The keys of an Offloaded segment's objects besides its manifest (``storage/keys.py``): its data object,
    index, one checksum record per block, and its commit."""
    data = manifest.dataKey
    crcs = [keys.block_checksums_key(data, block) for block in range(1, mf.checksum_blocks(manifest) + 1)]
    return [data, manifest.indexKey, *crcs, keys.commit_key(prefix, manifest.topic, manifest.ordinal)]
