"""Apache Pulsar's own offloader reads the objects our writer made, byte for byte (tests/fixtures/pulsar_reader).

The segmenter and sink write real Pulsar entries (batched and not, with their 0x0e01 checksum) to moto. Pulsar
keeps offloaded objects at the bucket root and no setting of its offloader moves them under a prefix; ours
live in a topic directory under a prefix. So each ledger is read twice in one JVM: through
``readOffloaded`` from a server-side copy of its objects at the bucket root (how a broker opens an offloaded
ledger), and in place through the read handle's ``open`` with our keys. Either way every entry must come back
at its exact position with its exact bytes.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from streamoffload.checkpoints.metadata_store import MetadataStore
from streamoffload.codecs.metadata import msb_lsb_to_uuid
from streamoffload.codecs.proto.offload_manifest_pb2 import SegmentManifest
from streamoffload.storage import keys
from streamoffload.storage.location import ScopedStore
from streamoffload.streaming.sink.commit import managed_ledger_name
from tests.fixtures.pulsar_reader import LedgerRead, read_offloaded
from tests.read import History, offload, pulsar_entries

pytestmark = [pytest.mark.pulsar, pytest.mark.s3]

PREFIX = "offload/cluster-a"
# Ledger 3 spans many 4 KiB blocks (entries never split, blocks padded), ledger 5 holds one entry.
LEDGERS = {3: 60, 5: 1, 8: 45}


def uuid_of(manifest: SegmentManifest) -> str:
    return str(msb_lsb_to_uuid(manifest.uidMsb, manifest.uidLsb))


def copy_to_bucket_root(client: Any, bucket: str, manifests: list[SegmentManifest]) -> None:
    """Each segment's data and index objects, byte for byte with their user metadata, under the same names
    at the bucket root: where Pulsar's offloader looks for them."""
    for manifest in manifests:
        for key in (manifest.dataKey, manifest.indexKey):
            client.copy_object(Bucket=bucket, Key=key.rsplit("/", 1)[1], CopySource={"Bucket": bucket, "Key": key})


def by_ledger(history: History) -> dict[int, list[tuple[int, int, bytes]]]:
    out: dict[int, list[tuple[int, int, bytes]]] = {}
    for ledger, entry, payload in history.expected:
        out.setdefault(ledger, []).append((ledger, entry, payload))
    return out


def test_pulsar_reads_our_v1_objects_byte_for_byte(
    s3_store: Any, s3_bucket: str, s3_client: Any, moto_server: str
) -> None:
    history = pulsar_entries(LEDGERS, seed=11)
    meta: MetadataStore = offload(ScopedStore(s3_store, PREFIX), history, switch_at=0)  # all ledger-based
    manifests = meta.offloaded_segments(history.topic)
    assert [(m.formatVersion, m.startLedgerId, m.startEntryId, m.endEntryId) for m in manifests] == [
        (1, 3, 0, 59),
        (1, 5, 0, 0),
        (1, 8, 0, 44),
    ]
    copy_to_bucket_root(s3_client, s3_bucket, manifests)
    topic_dir = keys.topic_dir(PREFIX, history.topic)
    reads = [LedgerRead(m.startLedgerId, uuid=uuid_of(m)) for m in manifests] + [
        LedgerRead(m.startLedgerId, uuid=uuid_of(m), key_prefix=topic_dir) for m in manifests
    ]

    run = read_offloaded(moto_server, s3_bucket, managed_ledger_name(history.topic), reads)

    expected = by_ledger(history)
    for read, result in zip(reads, run.results, strict=True):
        where = f"ledger {read.ledger_id} {'in ' + read.key_prefix if read.key_prefix else 'at the bucket root'}"
        assert result.error is None, f"{where}: Pulsar's reader refused it: {result.error}\n{run.stderr[-3000:]}"
        want = expected[read.ledger_id]
        # The handle's view of the ledger comes from the LedgerMetadataFormat in our index.
        assert (result.last_add_confirmed, result.length, result.closed) == (
            want[-1][1],
            sum(len(payload) for _, _, payload in want),
            True,
        ), where
        assert result.entries == want, where
    assert run.returncode == 0


def test_pulsars_streaming_read_handle_reads_our_v2_objects(
    s3_store: Any, s3_bucket: str, s3_client: Any, moto_server: str
) -> None:
    """No Pulsar release writes or reads v2 objects on a broker (PIP-76 part II is unmerged; ManagedLedgerImpl
    opens offloaded ledgers only through readOffloaded(ledgerId, uuid, ...)), but tiered-storage-jcloud ships
    BlobStoreBackedReadHandleImplV2 behind readOffloaded(ledgerId, OffloadContext, ...). It reads every entry
    of ours, with the last entry taken from our index's LedgerInfo.entries; of a ledger spread over several
    segments it returns the later segments' entries first (it walks the indices from the last)."""
    history = pulsar_entries(LEDGERS, seed=11)
    meta = offload(ScopedStore(s3_store, PREFIX), history)  # all streaming, 24 kB segments
    manifests = meta.offloaded_segments(history.topic)
    segments: dict[int, list[SegmentManifest]] = {}
    for manifest in manifests:
        for info in manifest.ledgers:
            segments.setdefault(info.ledgerId, []).append(manifest)
    # Ledgers 3 and 8 each span two segments, whose boundaries are where the entries come back out of order.
    starts = {
        ledger: [m.startEntryId if m.startLedgerId == ledger else 0 for m in held] for ledger, held in segments.items()
    }
    assert starts == {3: [0, 39], 5: [0], 8: [0, 16]}, starts
    copy_to_bucket_root(s3_client, s3_bucket, manifests)
    topic_dir = keys.topic_dir(PREFIX, history.topic)
    reads = [LedgerRead(ledger, segments=tuple(uuid_of(m) for m in held)) for ledger, held in segments.items()] + [
        LedgerRead(ledger, segments=tuple(uuid_of(m) for m in held), key_prefix=topic_dir)
        for ledger, held in segments.items()
    ]

    run = read_offloaded(moto_server, s3_bucket, managed_ledger_name(history.topic), reads)

    expected = by_ledger(history)
    for read, result in zip(reads, run.results, strict=True):
        where = f"ledger {read.ledger_id} {'in ' + read.key_prefix if read.key_prefix else 'at the bucket root'}"
        assert result.error is None, f"{where}: Pulsar's reader refused it: {result.error}\n{run.stderr[-3000:]}"
        want = expected[read.ledger_id]
        assert (result.last_add_confirmed, result.closed) == (want[-1][1], True), where
        # Segment by segment, the last first; within a segment in position order.
        bounds = [*starts[read.ledger_id], len(want)]
        runs = [want[a:b] for a, b in itertools.pairwise(bounds)]
        assert result.entries == [entry for segment in reversed(runs) for entry in segment], where
    assert run.returncode == 0
