"""A deliberately simple reference reader for tests: walks every offloaded segment of a topic with
the codecs alone (whole-object reads, no caches), independent of the read handle under test."""

from __future__ import annotations

from dataclasses import dataclass

from streamoffload.checkpoints import manifest as mf
from streamoffload.checkpoints.keyring import segment_cipher
from streamoffload.checkpoints.metadata_store import MetadataStore
from streamoffload.codecs.block_cipher import OVERHEAD, decrypt_block, stored_length
from streamoffload.codecs.block_frames import decompress_block, stored_blocks, stored_size
from streamoffload.codecs.blocks import iter_blocks
from streamoffload.codecs.entry import entry_messages
from streamoffload.codecs.index import OffloadIndex
from streamoffload.storage import keys
from streamoffload.storage.base import ObjectStore
from streamoffload.storage.location import ScopedStore


@dataclass(frozen=True)
class ReadMessage:
    ledger_id: int
    entry_id: int
    batch_index: int
    payload: bytes
    key: str | None
    properties: dict[str, str]


def read_entries(scoped: ScopedStore, topic: str) -> list[tuple[int, int, bytes]]:
    store = scoped.store
    meta = MetadataStore(scoped)
    out: list[tuple[int, int, bytes]] = []
    for manifest in meta.offloaded_segments(topic):
        data = store.get(manifest.dataKey)
        v1_ledger = manifest.startLedgerId if manifest.formatVersion == 1 else None
        index = OffloadIndex.decode(store.get(manifest.indexKey), ledger_id=v1_ledger)
        cipher = segment_cipher(manifest, None)  # encrypted at rest: the keys of the environment
        frames = mf.frame_table(manifest)  # compressed at rest: where each block's frame lies
        if cipher is not None or frames is not None:
            blocks = index.blocks()
            laid = stored_blocks([(b.offset, b.length) for b in blocks], frames, OVERHEAD)
            if frames is None:
                assert len(data) == stored_length(index.data_object_length, len(blocks)), manifest.dataKey
            else:
                assert len(data) == stored_size(frames), manifest.dataKey
            plain = []
            for b in laid:
                frame = data[b.stored_offset : b.stored_offset + b.stored_length]
                if cipher is not None:
                    frame = decrypt_block(cipher.data_key, cipher.segment_id, b.plain_offset, frame)
                plain.append(decompress_block(b.codec, frame, b.plain_length))
            data = b"".join(plain)
        assert index.data_object_length == len(data) == manifest.dataLength, manifest.dataKey
        for block in iter_blocks(data):
            ledger = block.header.ledger_id if block.header.ledger_id is not None else v1_ledger
            assert ledger is not None
            assert index.lookup(ledger, block.header.first_entry_id).offset == block.offset
            out.extend((ledger, e.entry_id, bytes(e.payload)) for e in block.entries)
        assert out[-1][:2] == mf.end_position(manifest)
    return out


def read_messages(scoped: ScopedStore, topic: str) -> list[ReadMessage]:
    return [
        ReadMessage(ledger, entry, m.batch_index, bytes(m.payload), m.key, dict(m.properties))
        for ledger, entry, payload in read_entries(scoped, topic)
        for m in entry_messages(payload)
    ]


def store_keys(store: ObjectStore) -> set[str]:
    return {info.key for info in store.list("")}


def referenced_keys(scoped: ScopedStore, topics: list[str]) -> set[str]:
    """Data and index keys, and block checksum records, of every offloaded segment: what a converged store
    holds besides metadata. Every segment the job writes has its records (one per block)."""
    meta = MetadataStore(scoped)
    out = set()
    for m in (m for t in topics for m in meta.offloaded_segments(t)):
        assert mf.checksum_blocks(m) == m.blockCount > 0, f"segment {m.dataKey} recorded no checksums"
        out |= {m.dataKey, m.indexKey, *(keys.block_checksums_key(m.dataKey, n) for n in range(1, m.blockCount + 1))}
    return out
