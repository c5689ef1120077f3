"""Offloaded topics as a batch dataset, without Spark: read the rows of one planned task.

``read.dataset_plan`` decides what to read; ``streaming/source/offloaded_source.py`` is the thin Spark
layer over both.

**Reading** (:func:`read_task`, in a task) opens the segment (``read.segment.SegmentReadHandle``:
every entry's CRC-32C is checked, corruption names the object and offset) and reads its position range.
A position bound starts the read at the index's block holding it. A publish-time bound starts it at the
block holding the first entry at or after the bound, and ends it after the last block starting at or
before the end bound: blocks are located by a binary search over the publish time of each block's first
entry (a few KB read per probe). The read stops at the first entry published at or after the end bound
(plus the skew, see ``offloaded_plan``). Every row is still checked against the bounds exactly. A time
window therefore reads about one block per topic-partition beyond the entries inside it (the block
holding its start), plus what the read-ahead fetched: blocks of a few MiB suit a tier queried by time
(Pulsar's default ``managedLedgerOffloadMaxBlockSizeInBytes`` is 64 MiB).
"""

from __future__ import annotations

import base64
from collections.abc import Iterator, Sequence
from typing import Any

from streamoffload.checkpoints.keyring import KeyRing
from streamoffload.codecs.blocks import BLOCK_HEADER_LENGTH, ENTRY_HEADER_LENGTH
from streamoffload.codecs.entry import decode_entry, split_messages
from streamoffload.codecs.errors import FormatError, TruncatedError
from streamoffload.codecs.index import BlockLocation
from streamoffload.codecs.positions import Position
from streamoffload.codecs.proto.pulsar_api_pb2 import MessageIdData
from streamoffload.codecs.topics import TopicName
from streamoffload.errors import StreamOffloadError
from streamoffload.read.dataset_plan import (
    ANY_TIME,
    DEFAULT_SKEW_MS,
    ReadTask,
    TimeBounds,
    block_start,
    position_before,
)
from streamoffload.read.segment import DEFAULT_READ_BUFFER_SIZE, SegmentReadHandle
from streamoffload.storage.base import ObjectStore
from streamoffload.storage.location import ScopedStore, StoreLocation

OUTPUT_MESSAGES = "messages"
OUTPUT_ENTRIES = "entries"
OUTPUTS = (OUTPUT_MESSAGES, OUTPUT_ENTRIES)

# Column names of pulsar-spark (streamnative/pulsar-spark), so its users' queries carry over, then what a
# tier has and pulsar-spark lacks.
MESSAGE_COLUMNS = (
    "value",
    "__key",
    "__topic",
    "__messageId",
    "__publishTime",
    "__eventTime",
    "__messageProperties",
    "__ledgerId",
    "__entryId",
    "__batchIndex",
    "__sequenceId",
    "__producerName",
)
MESSAGE_SCHEMA = (
    "value binary, __key binary, __topic string, __messageId binary, __publishTime timestamp, "
    "__eventTime timestamp, __messageProperties map<string,string>, __ledgerId long, __entryId long, "
    "__batchIndex int, __sequenceId long, __producerName string"
)
ENTRY_COLUMNS = ("topic", "ledger_id", "entry_id", "entry", "num_messages", "publish_time")
ENTRY_SCHEMA = "topic string, ledger_id long, entry_id long, entry binary, num_messages int, publish_time timestamp"
DEFAULT_BATCH_ROWS = 4096
DEFAULT_BATCH_BYTES = 32 << 20
_PROBE_BYTES = 4096  # a block's first entry header and metadata, for its publish time


class EncryptedEntryError(StreamOffloadError):
    """An end-to-end encrypted entry read as messages: its payload is ciphertext."""


# --- reading ----------------------------------------------------------------------------------------------


def _block_publish_time(store: ObjectStore, data_key: str, block: BlockLocation) -> int | None:
    """The publish time of a block's first entry, read with one small ranged GET (no checksum check: it is
    only a hint of where to start; the entries returned are checked when read)."""
    at = block.offset + BLOCK_HEADER_LENGTH
    head = store.get_range(data_key, at, ENTRY_HEADER_LENGTH + _PROBE_BYTES)
    if len(head) < ENTRY_HEADER_LENGTH:
        return None
    length = int.from_bytes(head[:4], "big")
    body = head[ENTRY_HEADER_LENGTH : ENTRY_HEADER_LENGTH + length]
    try:
        try:
            decoded = decode_entry(body, verify_checksum=False, where=data_key)
        except TruncatedError:
            decoded = decode_entry(
                store.get_range(data_key, at + ENTRY_HEADER_LENGTH, length), verify_checksum=False, where=data_key
            )
    except FormatError:
        return None  # the read itself will report what is wrong, with the checks of the read path
    return decoded.metadata.publish_time


def _time_window(
    store: ObjectStore,
    handle: SegmentReadHandle,
    blocks: Sequence[BlockLocation],
    times: TimeBounds,
    skew_ms: int,
) -> tuple[int, int]:
    """The run of ``blocks`` (indices, inclusive) that may hold entries published in ``times``: binary search
    over each block's first publish time (assumed to grow with position, within ``skew_ms``)."""
    probed: dict[int, int] = {}

    def time_of(i: int) -> int:
        if i not in probed:
            found = _block_publish_time(store, handle.data_key, blocks[i])
            if found is None:
                raise _Unprobed
            probed[i] = found
        return probed[i]

    def last_block_starting_at_or_before(limit: int) -> int:
        """Largest i with time_of(i) <= limit, or -1."""
        lo, hi = 0, len(blocks) - 1
        found = -1
        while lo <= hi:
            mid = (lo + hi) // 2
            if time_of(mid) <= limit:
                found, lo = mid, mid + 1
            else:
                hi = mid - 1
        return found

    first, last = 0, len(blocks) - 1
    try:
        if times.lo is not None:
            # The block holding the first entry at or after lo starts before lo (or is the first block).
            first = max(last_block_starting_at_or_before(times.lo - skew_ms - 1), 0)
        if times.hi is not None:
            last = last_block_starting_at_or_before(times.hi + skew_ms - 1)
    except _Unprobed:
        return 0, len(blocks) - 1  # a block that does not decode: read them all, so the read reports it
    return first, last


class _Unprobed(Exception):
    """A block's first entry did not decode while probing."""


def read_task(
    location: StoreLocation | ScopedStore,
    task: ReadTask,
    *,
    output: str = OUTPUT_MESSAGES,
    times: TimeBounds = ANY_TIME,
    skew_ms: int = DEFAULT_SKEW_MS,
    read_buffer_size: int = DEFAULT_READ_BUFFER_SIZE,
    keyring: KeyRing | None = None,
    batch_rows: int = DEFAULT_BATCH_ROWS,
    batch_bytes: int = DEFAULT_BATCH_BYTES,
) -> Iterator[list[list[Any]]]:
    """The rows of one task as column batches (lists in ``MESSAGE_COLUMNS`` or ``ENTRY_COLUMNS`` order;
    times in ms since the epoch, ``None`` for a missing event time)."""
    if isinstance(location, StoreLocation):
        store, owned = location.open(create=False).store, True  # in a Spark task: open it here, close it after
    else:
        store, owned = location.store, False
    segment = task.segment
    handle = SegmentReadHandle(store, segment, read_buffer_size=read_buffer_size, keyring=keyring)
    try:
        blocks = handle.index.blocks()
        last = len(blocks) - 1 if task.last_block < 0 else task.last_block
        start, end = task.start, task.end
        if times.lo is not None or times.hi is not None:
            mine = blocks[task.first_block : last + 1]
            first_i, last_i = _time_window(store, handle, mine, times, skew_ms)
            if last_i < first_i:
                return
            if first_i > 0:
                start = max(start, block_start(mine[first_i])) if start is not None else block_start(mine[first_i])
            if last_i < len(mine) - 1:
                stop = position_before(block_start(mine[last_i + 1]))
                end = min(end, stop) if end is not None else stop
            if start is not None and end is not None and start > end:
                return
        emit = _message_rows if output == OUTPUT_MESSAGES else _entry_rows
        yield from emit(handle, task.topic, start, end, times, skew_ms, batch_rows, batch_bytes)
    finally:
        handle.close()
        if owned:
            store.close()


def _stop_time(times: TimeBounds, skew_ms: int) -> int | None:
    """A publish time at which a read stops: with publish times growing with position (within ``skew_ms``),
    nothing after an entry published at ``hi + skew_ms`` or later is inside ``times``."""
    return None if times.hi is None else times.hi + skew_ms


def _entries_in_window(
    handle: SegmentReadHandle,
    start: Position | None,
    end: Position | None,
    times: TimeBounds,
    skew_ms: int,
    where_suffix: str,
) -> Iterator[tuple[Any, Any, str]]:
    """The entries of ``(start, end]`` whose publish time is inside ``times``, decoded, each with the place
    to name in errors; stops at the first entry past the end bound (publish times grow with position)."""
    stop = _stop_time(times, skew_ms)
    for entry in handle.read_range(start, end):
        where = f"{handle.data_key}: entry {entry.ledger_id}:{entry.entry_id}{where_suffix}"
        decoded = decode_entry(entry.payload, verify_checksum=False, where=where)  # the read checked the CRC
        publish_time = decoded.metadata.publish_time
        if not times.contains(publish_time):
            if stop is not None and publish_time >= stop:
                break
            continue
        yield entry, decoded, where


def _entry_rows(
    handle: SegmentReadHandle,
    topic: str,
    start: Position | None,
    end: Position | None,
    times: TimeBounds,
    skew_ms: int,
    batch_rows: int,
    batch_bytes: int,
) -> Iterator[list[list[Any]]]:
    columns: list[list[Any]] = [[] for _ in ENTRY_COLUMNS]
    topics, ledgers, entries, datas, counts, publish = columns
    pending = 0
    for entry, decoded, _where in _entries_in_window(handle, start, end, times, skew_ms, ""):
        md = decoded.metadata
        topics.append(topic)
        ledgers.append(entry.ledger_id)
        entries.append(entry.entry_id)
        datas.append(bytes(entry.payload))
        counts.append(decoded.num_messages)
        publish.append(md.publish_time)
        pending += len(entry.payload)
        if len(topics) >= batch_rows or pending >= batch_bytes:
            yield columns
            columns = [[] for _ in ENTRY_COLUMNS]
            topics, ledgers, entries, datas, counts, publish = columns
            pending = 0
    if topics:
        yield columns


def message_id(ledger_id: int, entry_id: int, partition: int, batch_index: int, batch_size: int) -> bytes:
    """Pulsar's serialized ``MessageIdData`` as its Java client's ``MessageId.toByteArray()`` writes it:
    partition only for a partition, batch index and size only for a message of a batch."""
    mid = MessageIdData(ledgerId=ledger_id, entryId=entry_id)
    if partition >= 0:
        mid.partition = partition
    if batch_index >= 0:
        mid.batch_index = batch_index
        mid.batch_size = batch_size
    return mid.SerializeToString()


def _message_rows(
    handle: SegmentReadHandle,
    topic: str,
    start: Position | None,
    end: Position | None,
    times: TimeBounds,
    skew_ms: int,
    batch_rows: int,
    batch_bytes: int,
) -> Iterator[list[list[Any]]]:
    partition = TopicName.parse(topic).partition
    columns: list[list[Any]] = [[] for _ in MESSAGE_COLUMNS]
    pending = 0
    for entry, decoded, where in _entries_in_window(handle, start, end, times, skew_ms, f" of {topic}"):
        if decoded.encrypted:
            raise EncryptedEntryError(
                f"{where} is end-to-end encrypted: its messages cannot be read here "
                "(read it with the option output=entries for the stored bytes)"
            )
        messages = split_messages(decoded, where=where)
        size = len(messages) if decoded.is_batch else 0
        values, keys, topics, ids, publish, events, props, ledgers, entries, indexes, seqs, producers = columns
        for msg in messages:
            values.append(None if msg.null_value else bytes(msg.payload))
            if msg.key is None:
                keys.append(None)
            else:
                keys.append(base64.b64decode(msg.key) if msg.key_b64_encoded else msg.key.encode())
            topics.append(topic)
            ids.append(message_id(entry.ledger_id, entry.entry_id, partition, msg.batch_index, size))
            publish.append(msg.publish_time)
            events.append(msg.event_time or None)  # pulsar-spark: no event time is null
            props.append(list(msg.properties.items()))
            ledgers.append(entry.ledger_id)
            entries.append(entry.entry_id)
            indexes.append(msg.batch_index)
            seqs.append(msg.sequence_id)
            producers.append(msg.producer_name)
            pending += len(msg.payload)
        if len(columns[0]) >= batch_rows or pending >= batch_bytes:
            yield columns
            columns = [[] for _ in MESSAGE_COLUMNS]
            pending = 0
    if columns[0]:
        yield columns


def rows(batch: list[list[Any]], names: Sequence[str]) -> list[dict[str, Any]]:
    """A column batch as dicts (for tests and tools)."""
    return [dict(zip(names, values, strict=True)) for values in zip(*batch, strict=True)]
