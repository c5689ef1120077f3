"""Compressed segments on a store with a minimum part size (S3, on moto): the segmenter gathers bigger parts, a
part that compressed below S3's 5 MiB (every part but the last) is filled up to it, the frame table skips the
filler, and everything reads back; a replayed seal, after the commit removed the parts' frame records, converges
on the same manifest. Without Spark or a broker: the sink fetches the entries from memory."""

from __future__ import annotations

import random
from typing import Any

import pytest

from streamoffload.checkpoints import manifest as mf
from streamoffload.checkpoints.keyring import KeyRing, encryption_key_id
from streamoffload.checkpoints.metadata_store import MetadataStore
from streamoffload.checkpoints.policy import COMPRESSED_PART_FACTOR, OffloadPolicy
from streamoffload.codecs.block_frames import CODEC_ZSTD
from streamoffload.read.topic_reader import TopicReader
from streamoffload.storage import keys
from streamoffload.storage.location import ScopedStore
from streamoffload.streaming.segmenter.segmenter import run_segmenter
from streamoffload.streaming.segmenter.segmenter_model import CONTROL_SEAL, MemoryState
from streamoffload.streaming.sink.entry_fetch import MemoryFetcher
from streamoffload.streaming.sink.sink import SegmentSink
from tests.fixtures.entries import Published, metas, triples

TOPIC = "persistent://public/default/zstd-parts-partition-0"
MIB = 1 << 20


def _json_entries(count: int, size: int) -> list[Published]:
    rnd = random.Random(5)
    out = []
    for i in range(count):
        doc = b'{"seq": %d, "sensor": "s-%d", "reading": %d, "pad": "' % (i, rnd.randint(0, 50), rnd.randint(0, 999))
        out.append(Published(7, i, (doc + b"a" * size)[: size - 2] + b'"}', publish_time=1_000 + i))
    return out


@pytest.mark.s3
def test_compressed_parts_below_s3s_minimum_are_filled_and_read_back(s3_store: Any) -> None:
    store = s3_store
    scoped = ScopedStore(store)
    keyring = KeyRing({"k1": bytes(range(32))})
    published = _json_entries(44 * 1024, 1024)  # 44 MiB of plaintext: more than one compressed part on S3
    fetcher = MemoryFetcher({TOPIC: {e.position: e.payload for e in published}})
    sink = SegmentSink(scoped, fetcher, keyring=keyring)
    policy = OffloadPolicy(
        managedLedgerOffloadMaxBlockSizeInBytes=4 * MIB,
        maxSizePerOffloadSegmentMbytes=1024,
        offloadCompression="zstd",
        offloadEncryptionKeyId="k1",
    )
    assert policy.min_part_bytes(store.min_part_size) == COMPRESSED_PART_FACTOR * 5 * MIB
    state = MemoryState()

    first, rest = metas(published[:-100]), metas(published[-100:])
    batch = run_segmenter(TOPIC, policy, state, first, now_ms=1, min_part_size=store.min_part_size)
    assert [a.part_number for a in batch if a.kind == "part"] == [1]  # 40 MiB and more: one part
    sink.apply(batch)
    seal = run_segmenter(TOPIC, policy, state, rest, [CONTROL_SEAL], now_ms=2, min_part_size=store.min_part_size)
    assert [a.part_number for a in seal if a.kind == "part"] == [2]  # the last part: no minimum
    sink.apply(seal)

    (manifest,) = MetadataStore(scoped).offloaded_segments(TOPIC)
    frames = mf.frame_table(manifest)
    assert frames is not None and encryption_key_id(manifest) == "k1"
    assert {f.codec for f in frames} == {CODEC_ZSTD}
    filled = [f.filler for f in frames if f.filler]
    assert len(filled) == 1  # the first part's last frame: the part filled up to 5 MiB, the last one not
    assert sum(f.stored_length + f.filler for f in frames[: len(frames) - 1]) >= 5 * MIB
    stored = store.head(manifest.dataKey).size
    assert stored < 6 * MIB < manifest.dataLength  # 44 MiB of JSON in about one 5 MiB part and a small last one
    assert not list(store.list(keys.part_frames_prefix(manifest.dataKey)))  # joined, then removed

    with TopicReader(scoped, keyring=keyring) as reader:
        got = [(e.ledger_id, e.entry_id, bytes(e.payload)) for e in reader.read(TOPIC)]
    assert got == triples(published)

    # A replay of the seal after its commit (the frame records are gone): the committed table serves it.
    sink_again = SegmentSink(scoped, fetcher, keyring=keyring)
    sink_again.apply(seal)
    (again,) = MetadataStore(scoped).offloaded_segments(TOPIC)
    assert mf.frame_table(again) == frames
