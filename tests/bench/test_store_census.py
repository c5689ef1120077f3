"""The soak's census of a store: Offloaded segments' objects told apart from everything else, counting only
what the listing holds."""

from __future__ import annotations

from pathlib import Path

from bench.store_census import StoreCensus, segment_object_keys
from streamoffload.checkpoints import manifest as mf
from streamoffload.checkpoints.metadata_store import MetadataStore
from streamoffload.codecs.proto.offload_manifest_pb2 import SegmentManifest
from streamoffload.storage.filesystem import FilesystemStore
from streamoffload.storage.location import ScopedStore
from tests.checkpoints.segments import NOW, opened, write_segment


def _store(tmp_path: Path) -> tuple[ScopedStore, MetadataStore]:
    scoped = ScopedStore(FilesystemStore(tmp_path, fsync=False), "tier")
    return scoped, MetadataStore(scoped)


def test_offloaded_segments_account_for_their_objects_and_the_rest_is_loose(tmp_path: Path) -> None:
    scoped, meta = _store(tmp_path)
    for ordinal in range(3):
        write_segment(meta, ordinal, [10 + ordinal], publish_last=NOW)
    opened(meta, 3, (20, 0))  # the open segment's Assigned manifest: loose
    scoped.store.put("tier/stray", b"x")  # loose

    count = StoreCensus(scoped).count()

    # data, index, manifest and commit per segment (no checksum records in these manifests)
    assert (count.objects, count.offloaded_segments, count.offloaded_topics) == (3 * 4 + 2, 3, 1)
    assert count.loose_objects == 2


def test_a_segments_objects_missing_from_the_listing_are_not_counted_for_it(tmp_path: Path) -> None:
    # A manifest read after the listing may be Offloaded while the listing missed some of its objects (sealed
    # in between), or an object was lost: either way loose objects must not go below what the listing holds.
    scoped, meta = _store(tmp_path)
    done = write_segment(meta, 0, [10], publish_last=NOW)
    census = StoreCensus(scoped)
    assert census.count().loose_objects == 0
    scoped.store.delete(done.dataKey)
    scoped.store.delete(done.indexKey)

    count = census.count()

    assert (count.objects, count.offloaded_segments, count.loose_objects) == (2, 1, 0)


def test_segment_object_keys_name_the_data_index_checksums_and_commit() -> None:
    manifest = mf.decode_manifest(mf.encode_manifest(_sealed_with_checksums()))

    assert segment_object_keys("tier", manifest) == [
        manifest.dataKey,
        manifest.indexKey,
        manifest.dataKey + "-crc-1",
        manifest.dataKey + "-crc-2",
        "tier/tenant/ns/t/_meta/commits/00000000000000000007",
    ]


def _sealed_with_checksums() -> SegmentManifest:
    manifest = mf.new_manifest(
        topic="persistent://tenant/ns/t",
        segment_id=mf.segment_uuid("persistent://tenant/ns/t", 7, (10, 0)),
        ordinal=7,
        format_version=2,
        start=(10, 0),
        assigned_ms=NOW,
        data_key="tier/t/d",
        index_key="tier/t/d-index",
        driver_properties={mf.PROP_BLOCK_CHECKSUMS: "crc32c"},
    )
    manifest.blockCount = 2
    return manifest
