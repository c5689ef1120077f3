"""A topic offloaded in steps, through the real segmenter and sink (entries fetched from memory), with what each
message must be in the table: batched, unbatched and compressed entries, keys (and none), properties, event times.

``TopicOffload.publish`` offloads more entries (the open segment is sealed at the end of each call, so every
call commits whole segments), so a test can sync, offload more and sync again."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from streamoffload.checkpoints.policy import OffloadPolicy
from streamoffload.codecs.compression import compress
from streamoffload.codecs.entry import CompressionType, Message, build_entry, decode_entry, encode_entry
from streamoffload.codecs.proto.pulsar_api_pb2 import MessageIdData
from streamoffload.codecs.topics import TopicName
from streamoffload.storage.location import ScopedStore
from streamoffload.streaming.segmenter.segmenter import run_segmenter
from streamoffload.streaming.segmenter.segmenter_model import CONTROL_SEAL, MemoryState
from streamoffload.streaming.sink.sink import SegmentSink
from tests.fixtures.entries import Published, forget_sent, memory_sink, publish_to

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
DAY_MS = 86_400_000
FIRST_PUBLISH_MS = 1_700_000_000_000  # 2023-11-14T22:13:20Z: two hours before a day boundary


def message_id(ledger: int, entry: int, partition: int, batch_index: int, batch_size: int) -> bytes:
    """Pulsar's MessageIdData as its Java client serializes it (written here from the protocol, not the reader's)."""
    mid = MessageIdData(ledgerId=ledger, entryId=entry)
    if partition >= 0:
        mid.partition = partition
    if batch_index >= 0:
        mid.batch_index, mid.batch_size = batch_index, batch_size
    return mid.SerializeToString()


@dataclass(frozen=True)
class Row:
    """One message as the table must hold it."""

    topic: str
    ledger_id: int
    entry_id: int
    batch_index: int
    partition: int
    key: bytes | None
    value: bytes
    properties: tuple[tuple[str, str], ...]
    publish_ms: int
    event_ms: int | None
    message_id: bytes

    @property
    def position(self) -> tuple[str, int, int, int]:
        return (self.topic, self.ledger_id, self.entry_id, self.batch_index)


@dataclass
class TopicOffload:
    """One topic-partition offloaded step by step; ``rows`` is every message offloaded so far, in position order."""

    scoped: ScopedStore
    topic: str
    block_bytes: int = 2048
    segment_bytes: int = 6 * 1024
    first_ledger: int = 3
    entries_per_ledger: int = 40
    value_of: Callable[[int], bytes] | None = None
    """Message n's value (None: the topic, n and n % 37 bytes)."""
    rows: list[Row] = field(default_factory=list)
    _state: MemoryState = field(default_factory=MemoryState)
    _sink: SegmentSink | None = None
    _ledger: int = -1
    _entry: int = 0
    _seq: int = 0
    _n: int = 0
    _now: int = 1_000

    def __post_init__(self) -> None:
        self._sink = memory_sink(self.scoped)
        self._ledger = self.first_ledger
        self._partition = TopicName.parse(self.topic).partition
        self._policy = OffloadPolicy(
            managedLedgerOffloadMaxBlockSizeInBytes=self.block_bytes,
            maxSizePerOffloadSegmentMbytes=self.segment_bytes / (1024 * 1024),
            offloadBufferMaxBytes=4 * self.block_bytes,
            maxOffloadSegmentRolloverTimeMinutes=1e6,
        )

    def publish(self, entries: int, *, publish_step_ms: int = 60_000) -> list[Row]:
        """Offload ``entries`` more entries and seal: entry i is a batch of 1..4 messages, or a single
        message, LZ4- or ZSTD-compressed or not, by turns. Returns the new rows."""
        start = len(self.rows)
        pending: list[Published] = []
        for _ in range(entries):
            i = self._n
            publish = FIRST_PUBLISH_MS + i * publish_step_ms
            batch = [0, 3, 1, 4, 2][i % 5]  # 0: not batched
            codec = [CompressionType.NONE, CompressionType.LZ4, CompressionType.ZSTD][i % 3]
            messages = []
            for b in range(max(batch, 1)):
                n = self._seq + b
                key = None if n % 5 == 2 else f"key-{n % 4}"
                props = {"n": str(n), "topic": self.topic[-3:]} if n % 3 else {}
                value = (
                    self.value_of(n) if self.value_of else f"{self.topic}|{n}|".encode() + bytes([n % 256]) * (n % 37)
                )
                messages.append(Message(value, key=key, properties=props, event_time=0 if n % 4 == 1 else publish - 7))
            data = build_entry(
                messages, producer_name="table-test", sequence_id=self._seq, publish_time=publish, batched=batch > 0
            )
            if codec != CompressionType.NONE:
                decoded = decode_entry(data)
                md = decoded.metadata
                md.compression = codec
                md.uncompressed_size = len(decoded.payload)
                data = encode_entry(md, compress(codec, bytes(decoded.payload)))
            for b, m in enumerate(messages):
                self.rows.append(
                    Row(
                        self.topic,
                        self._ledger,
                        self._entry,
                        b if batch else -1,
                        self._partition,
                        None if m.key is None else m.key.encode(),
                        m.payload,
                        tuple(sorted(m.properties.items())),
                        publish,
                        m.event_time or None,
                        message_id(self._ledger, self._entry, self._partition, b if batch else -1, batch),
                    )
                )
            pending.append(Published(self._ledger, self._entry, data, publish))
            self._seq += len(messages)
            self._n += 1
            self._entry += 1
            if self._entry == self.entries_per_ledger:
                self._ledger, self._entry = self._ledger + 1, 0
        self._flush(pending, [CONTROL_SEAL])
        return self.rows[start:]

    def _flush(self, pending: list[Published], controls: list[str]) -> None:
        sink = self._sink
        assert sink is not None
        actions = run_segmenter(
            self.topic,
            self._policy,
            self._state,
            publish_to(sink, self.topic, pending),
            controls,
            now_ms=self._now,
            key_prefix=self.scoped.prefix,
            min_part_size=self.scoped.store.min_part_size,
        )
        sink.apply(actions)
        forget_sent(sink, self.topic, self._state)
        self._now += 1


def row_tuple(doc: dict[str, Any]) -> Row:
    """A table row read back (as a dict of Python values: bytes, datetimes or µs, pairs) as a ``Row``."""
    props = doc["__messageProperties"]
    if isinstance(props, dict):
        props = props.items()
    return Row(
        doc["__topic"],
        doc["ledger_id"],
        doc["entry_id"],
        doc["batch_index"],
        doc["partition"],
        doc["__key"],
        doc["value"],
        tuple(sorted((k, v) for k, v in props)),
        _ms(doc["__publishTime"]),
        None if doc["__eventTime"] is None else _ms(doc["__eventTime"]),
        doc["__messageId"],
    )


def _ms(value: Any) -> int:
    """ms since the epoch of a timestamp as a reader gives it (an aware datetime, or µs)."""
    if isinstance(value, int):
        return value // 1000
    return (value - EPOCH) // timedelta(milliseconds=1)
