"""Segments written through the metadata store as the sink writes them: an Assigned manifest create-only,
the data and index objects, then the commit that publishes the Offloaded manifest."""

from __future__ import annotations

from collections.abc import Sequence

from streamoffload.checkpoints import manifest as mf
from streamoffload.checkpoints.metadata_store import MetadataStore
from streamoffload.codecs.proto.offload_manifest_pb2 import SegmentManifest
from streamoffload.storage import keys
from streamoffload.units import MIB

TOPIC = "persistent://tenant/ns/orders-partition-0"

HOUR_MS = 3_600_000
NOW = 1_700_000_000_000 + 30 * 24 * HOUR_MS


def opened(meta: MetadataStore, ordinal: int, start: tuple[int, int], *, epoch: int = 0) -> SegmentManifest:
    """Open segment ``ordinal`` at ``start``: its Assigned manifest, written create-only."""
    seg_id = mf.segment_uuid(TOPIC, ordinal, start, epoch)
    manifest = mf.new_manifest(
        topic=TOPIC,
        segment_id=seg_id,
        ordinal=ordinal,
        format_version=2,
        start=start,
        assigned_ms=NOW - 48 * HOUR_MS,
        data_key=keys.data_key(meta.prefix, TOPIC, seg_id),
        index_key=keys.index_key(meta.prefix, TOPIC, seg_id),
        driver_properties={mf.PROP_EPOCH: str(epoch)},
    )
    return meta.open_attempt(manifest)


def sealed(opened_manifest: SegmentManifest, spans: Sequence[mf.LedgerSpan], *, publish_last: int) -> SegmentManifest:
    size = sum(span.size for span in spans)
    last = max(spans, key=lambda s: s.ledger_id)
    return mf.sealed_manifest(
        opened_manifest,
        end=(last.ledger_id, last.last_entry_id),
        offloaded_ms=publish_last + 1_000,
        spans=spans,
        data_length=size + 128,
        index_length=32,
        block_count=1,
        part_count=1,
        seal_reason="size",
        publish_time_first=publish_last - 1_000,
        publish_time_last=publish_last,
    )


def write_segment(
    meta: MetadataStore,
    ordinal: int,
    ledgers: Sequence[int],
    *,
    size: int = MIB,
    publish_last: int,
    epoch: int = 0,
) -> SegmentManifest:
    """Segment ``ordinal`` holding entries 0..9 of each of ``ledgers`` (``size`` bytes per ledger), committed."""
    manifest = opened(meta, ordinal, (ledgers[0], 0), epoch=epoch)
    spans = [mf.LedgerSpan(ledger, 0, 9, 10, size) for ledger in ledgers]
    done = sealed(manifest, spans, publish_last=publish_last)
    meta.store.put(done.dataKey, b"d" * 128)
    meta.store.put(done.indexKey, b"i" * 32)
    meta.commit(done)
    return done


def readable_ledgers(meta: MetadataStore) -> list[int]:
    """The first ledger of every readable segment, in order."""
    return [m.startLedgerId for m in meta.offloaded_segments(TOPIC)]
