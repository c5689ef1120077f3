"""Real offloaded histories made by the segmenter and sink, for the read-path tests and bench/fuzz.py.

Histories hold real Pulsar entries (batched and not, with keys and properties), several ledgers, several
segments, and, with ``switch_at``, a streaming (v2) prefix followed by ledger-based (v1) segments. Blocks
are tiny (``BLOCK_SIZE``) so that a few KiB make many blocks and segments.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from bench.entries import Published, holding, memory_sink, metas, triples
from streamoffload.checkpoints.metadata_store import MetadataStore
from streamoffload.checkpoints.policy import OffloadPolicy
from streamoffload.codecs.entry import Message, build_entry
from streamoffload.storage.location import ScopedStore
from streamoffload.streaming.handoff.actions import Action
from streamoffload.streaming.segmenter.segmenter import run_segmenter
from streamoffload.streaming.segmenter.segmenter_model import CONTROL_SEAL, MemoryState
from streamoffload.streaming.sink.sink import SegmentSink

TOPIC = "persistent://public/default/orders-partition-0"
BLOCK_SIZE = 4096
SEGMENT_BYTES = 24_000
MIB = 1024 * 1024


@dataclass
class History:
    """What was offloaded: every entry (with its bytes) in position order, and the messages each entry holds."""

    topic: str
    entries: list[Published]
    messages: dict[tuple[int, int], list[Message]] = field(default_factory=dict)

    @property
    def expected(self) -> list[tuple[int, int, bytes]]:
        return triples(self.entries)

    def positions(self) -> list[tuple[int, int]]:
        return [(e.ledger_id, e.entry_id) for e in self.entries]


def pulsar_entries(
    ledgers: dict[int, int], *, seed: int = 7, max_payload: int = 900, checksummed: bool = True
) -> History:
    """Real Pulsar entries: about a third batched (2-4 messages), keys and properties on most messages.
    ``checksummed=False``: without their optional 0x0e01 checksum section, as pulsar-lite hands them out."""
    rnd = random.Random(seed)
    entries: list[Published] = []
    messages: dict[tuple[int, int], list[Message]] = {}
    seq = 0
    for ledger, count in ledgers.items():
        for entry_id in range(count):
            n = rnd.choice([1, 1, 2, 4])
            msgs = [
                Message(
                    payload=rnd.randbytes(rnd.randint(0, max_payload // n)),
                    key=None if rnd.random() < 0.2 else f"key-{rnd.randint(0, 99)}",
                    properties={} if rnd.random() < 0.3 else {"p": str(rnd.randint(0, 9)), "ü": "ß"},
                    event_time=rnd.choice([0, 1_700_000_000_000 + entry_id]),
                )
                for _ in range(n)
            ]
            publish = 1_700_000_000_000 + seq
            data = build_entry(msgs, producer_name="test-producer", sequence_id=seq, publish_time=publish)
            if not checksummed:
                data = strip_checksum(data)
            seq += n
            entries.append(Published(ledger, entry_id, data, publish))
            messages[(ledger, entry_id)] = msgs
    return History(TOPIC, entries, messages)


def _apply(sink: SegmentSink, actions: list[Action]) -> None:
    sink.apply(actions)


def offload(
    scoped: ScopedStore,
    history: History,
    *,
    switch_at: int | None = None,
    block_size: int = BLOCK_SIZE,
    segment_bytes: int = SEGMENT_BYTES,
    batch: int = 40,
    compression: str = "none",
    encryption_key_id: str = "",
) -> MetadataStore:
    """Offload ``history`` through the segmenter and the sink: streaming (v2) for the entries before
    ``switch_at`` (all of them when None), ledger-based (v1) after; then seal. The sink fetches the entries'
    bytes from ``history``. ``compression``: the policy's ``offloadCompression`` (blocks compressed at rest);
    ``encryption_key_id``: its ``offloadEncryptionKeyId`` (the sink takes the key from the environment)."""
    state = MemoryState()
    sink = memory_sink(scoped, holding(history.topic, history.entries))

    def policy(method: str) -> OffloadPolicy:
        return OffloadPolicy(
            method=method,
            managedLedgerOffloadMaxBlockSizeInBytes=block_size,
            maxSizePerOffloadSegmentMbytes=segment_bytes / MIB,
            offloadBufferMaxBytes=64 * MIB,
            offloadCompression=compression,
            offloadEncryptionKeyId=encryption_key_id,
        )

    now = 1_000
    entries = metas(history.entries)
    for i in range(0, len(entries), batch):
        method = "ledger" if switch_at is not None and i >= switch_at else "streaming"
        chunk = entries[i : i + batch]
        _apply(
            sink,
            run_segmenter(
                history.topic,
                policy(method),
                state,
                chunk,
                now_ms=now,
                key_prefix=scoped.prefix,
                min_part_size=scoped.store.min_part_size,
            ),
        )
        now += 10
    final = "ledger" if switch_at is not None else "streaming"
    _apply(
        sink,
        run_segmenter(
            history.topic,
            policy(final),
            state,
            [],
            [CONTROL_SEAL],
            now_ms=now,
            key_prefix=scoped.prefix,
            min_part_size=scoped.store.min_part_size,
        ),
    )
    return MetadataStore(scoped)


def strip_checksum(entry: bytes) -> bytes:
    """The entry without its ``0x0e01`` section (magic and CRC-32C, 6 bytes): what pulsar-lite delivers."""
    assert entry[:2] == b"\x0e\x01", entry[:2]
    return entry[6:]
