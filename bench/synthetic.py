"""A synthetic offloaded store without a broker or Spark: real Pulsar entries (``codecs.entry.build_entry``)
through the real segmenter and sink (fetching the entries from memory), so tests and ``bench/dataframe.py``
know every message's position, key, properties and publish time."""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from bench.entries import Published, forget_sent, memory_sink, publish_to
from streamoffload.checkpoints.policy import OffloadPolicy
from streamoffload.codecs.entry import Message, MessageMetadata, build_entry, decode_entry, encode_entry
from streamoffload.storage.base import ObjectStore, RangedReader
from streamoffload.storage.location import ScopedStore
from streamoffload.streaming.segmenter.segmenter import run_segmenter
from streamoffload.streaming.segmenter.segmenter_model import CONTROL_SEAL, MemoryState

MIB = 1024 * 1024


@dataclass(frozen=True)
class Sent:
    """One message as written: its position and fields."""

    ledger_id: int
    entry_id: int
    batch_index: int
    payload: bytes
    key: str | None
    properties: dict[str, str]
    publish_time: int
    event_time: int
    sequence_id: int


def build_topic(
    scoped: ScopedStore,
    topic: str,
    *,
    entries: int,
    batch: int = 1,
    payload_size: int = 100,
    first_publish_ms: int = 1_700_000_000_000,
    publish_step_ms: int = 1000,
    entries_per_ledger: int = 1_000_000,
    block_bytes: int = 8192,
    segment_bytes: int = 64 * 1024,
    keys: int = 5,
    seed: int = 1,
    keep: bool = True,
    encrypted: frozenset[int] = frozenset(),
    checksummed: bool = True,
) -> tuple[list[Sent], int]:
    """Offload ``entries`` entries of ``batch`` messages each (batch 1: not batched); publish times grow by
    ``publish_step_ms`` per entry. Entries numbered in ``encrypted`` carry an encryption algorithm (field 14
    of MessageMetadata), as end-to-end encrypted ones do. Returns the messages (when ``keep``) and the
    entry bytes written. ``checksummed=False`` stores entries without their optional 0x0e01 section, as
    pulsar-lite hands them out: then only the CRC-32C recorded at offload covers them."""
    rnd = random.Random(seed)
    pool = rnd.randbytes(payload_size + 4096)
    state = MemoryState()
    sink = memory_sink(scoped)
    policy = OffloadPolicy(
        managedLedgerOffloadMaxBlockSizeInBytes=block_bytes,
        maxSizePerOffloadSegmentMbytes=segment_bytes / MIB,
        offloadBufferMaxBytes=4 * block_bytes,
        maxOffloadSegmentRolloverTimeMinutes=1e6,
    )
    sent: list[Sent] = []
    pending: list[Published] = []
    pending_bytes = written = 0
    ledger, entry_id, seq = 3, 0, 0
    now = 1_000

    def flush(controls: list[str]) -> None:
        nonlocal pending, pending_bytes, now
        actions = run_segmenter(
            topic,
            policy,
            state,
            publish_to(sink, topic, pending),
            controls,
            now_ms=now,
            key_prefix=scoped.prefix,
            min_part_size=scoped.store.min_part_size,
        )
        sink.apply(actions)
        forget_sent(sink, topic, state)  # only what a later part may name stays in memory
        pending, pending_bytes, now = [], 0, now + 1

    for i in range(entries):
        publish = first_publish_ms + i * publish_step_ms
        messages = []
        for b in range(batch):
            n = seq + b
            start = rnd.randrange(0, 4096)
            payload = n.to_bytes(8, "big") + pool[start : start + max(payload_size - 8, 0)]
            key = None if n % 7 == 3 else f"key-{n % keys}"
            props = {"n": str(n)} if n % 3 else {}
            messages.append(Message(payload, key=key, properties=props, event_time=0 if n % 4 == 1 else publish - 5))
        data = build_entry(
            messages, producer_name="synthetic", sequence_id=seq, publish_time=publish, batched=batch > 1
        )
        if i in encrypted:
            decoded = decode_entry(data)
            md = MessageMetadata.FromString(decoded.metadata.SerializeToString() + bytes([14 << 3 | 2, 3]) + b"aes")
            data = encode_entry(md, decoded.payload)
        if not checksummed:
            data = data[6:]  # magic 0x0e01 and the CRC-32C
        if keep:
            for b, m in enumerate(messages):
                sent.append(
                    Sent(
                        ledger,
                        entry_id,
                        b if batch > 1 else -1,
                        m.payload,
                        m.key,
                        m.properties,
                        publish,
                        m.event_time,
                        seq + b,
                    )
                )
        seq += batch
        pending.append(Published(ledger, entry_id, data, publish))
        pending_bytes += len(data)
        written += len(data)
        entry_id += 1
        if entry_id == entries_per_ledger:
            ledger, entry_id = ledger + 2, 0
        if pending_bytes >= 16 * MIB:
            flush([])
    flush([CONTROL_SEAL])
    return sent, written


@dataclass
class CountingStore:
    """A view of a store that counts what is read from it: bytes per key (GET and ranged GET) and HEADs.
    Not an ``ObjectStore`` subclass on purpose: its ranged reader is the default one, so reads of a
    filesystem store go through ``get_range`` too, and every byte is counted."""

    inner: ObjectStore
    read: dict[str, int] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return self.inner.url

    @property
    def min_part_size(self) -> int:
        return self.inner.min_part_size

    @property
    def bytes_read(self) -> int:
        return sum(self.read.values())

    def get(self, key: str) -> bytes:
        data = self.inner.get(key)
        self.read[key] = self.read.get(key, 0) + len(data)
        return data

    def get_range(self, key: str, start: int, length: int) -> bytes:
        data = self.inner.get_range(key, start, length)
        self.read[key] = self.read.get(key, 0) + len(data)
        return data

    def list(self, prefix: str) -> Iterator[Any]:
        return self.inner.list(prefix)

    def open_ranged_reader(self, key: str, *, hold_open: bool = True) -> RangedReader:
        return RangedReader(self, key)  # type: ignore[arg-type]

    def head(self, key: str) -> Any:
        return self.inner.head(key)

    def exists(self, key: str) -> bool:
        return self.inner.exists(key)

    def close(self) -> None:
        pass
