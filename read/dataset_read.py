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

import functools
import itertools
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from streamoffload.checkpoints.keyring import KeyRing
from streamoffload.codecs.blocks import BLOCK_HEADER_LENGTH, ENTRY_HEADER_LENGTH
from streamoffload.codecs.compression import MAX_UNCOMPRESSED
from streamoffload.codecs.entry import (
    CompressionType,
    DecodedEntry,
    decode_entry,
    metadata_num_messages,
    uncompressed_payload,
)
from streamoffload.codecs.entry_columns import MessageColumns, append_messages
from streamoffload.codecs.errors import FormatError, TruncatedError
from streamoffload.codecs.index import BlockLocation
from streamoffload.codecs.positions import Position
from streamoffload.codecs.proto.pulsar_api_pb2 import MessageIdData
from streamoffload.codecs.topics import TopicName
from streamoffload.read.batch_arrays import SplitBatch, split_batches, split_joined
from streamoffload.read.dataset_plan import (
    ANY_TIME,
    DEFAULT_SKEW_MS,
    ReadTask,
    TimeBounds,
    block_start,
    position_before,
)
from streamoffload.read.entry_arrays import BatchedEntries, batched_entries, batched_joined
from streamoffload.read.segment import DEFAULT_READ_BUFFER_SIZE, OffloadedEntry, SegmentReadHandle
from streamoffload.read.segment.errors import ReadError
from streamoffload.read.segment.runs import JoinedEntries
from streamoffload.read.wire_arrays import PAD, cut
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
# The same as Arrow schemas, as PySpark's ``to_arrow_schema`` makes them (timestamps in µs, UTC): what
# ``read_task`` yields, and what Spark's Python worker takes without converting anything row by row.
_TIMESTAMP = pa.timestamp("us", tz="UTC")
_PROPERTIES = pa.map_(pa.string(), pa.string())
MESSAGE_ARROW_SCHEMA = pa.schema(
    [
        ("value", pa.binary()),
        ("__key", pa.binary()),
        ("__topic", pa.string()),
        ("__messageId", pa.binary()),
        ("__publishTime", _TIMESTAMP),
        ("__eventTime", _TIMESTAMP),
        ("__messageProperties", _PROPERTIES),
        ("__ledgerId", pa.int64()),
        ("__entryId", pa.int64()),
        ("__batchIndex", pa.int32()),
        ("__sequenceId", pa.int64()),
        ("__producerName", pa.string()),
    ]
)
ENTRY_ARROW_SCHEMA = pa.schema(
    [
        ("topic", pa.string()),
        ("ledger_id", pa.int64()),
        ("entry_id", pa.int64()),
        ("entry", pa.binary()),
        ("num_messages", pa.int32()),
        ("publish_time", _TIMESTAMP),
    ]
)
DEFAULT_BATCH_ROWS = 16384  # fewer numpy and JVM steps per row than 4096 (bench/README.md, issue 25)
DEFAULT_BATCH_BYTES = 32 << 20
DEFAULT_RUN_BYTES = 4 << 20
"""``read_tasks``: the entry bytes of small tasks decoded as one run."""
_UNCOMPRESSED = int(CompressionType.NONE)
_PROBE_BYTES = 4096  # a block's first entry header and metadata, for its publish time


class EncryptedEntryError(ReadError):
    """An end-to-end encrypted entry read as messages: its payload is ciphertext."""


# --- reading ----------------------------------------------------------------------------------------------


def _block_publish_time(handle: SegmentReadHandle, store: ObjectStore, block: BlockLocation) -> int | None:
    """The publish time of a block's first entry, read with one small ranged GET (no checksum check: it is
    only a hint of where to start; the entries returned are checked when read). A segment stored encrypted or
    compressed is read through its handle's plaintext view (the block's frame is fetched whole)."""
    data_key = handle.data_key

    def get_range(offset: int, length: int) -> bytes:
        if handle.transformed:
            return handle.read_plain(offset, length)
        return store.get_range(data_key, offset, length)

    at = block.offset + BLOCK_HEADER_LENGTH
    head = get_range(at, ENTRY_HEADER_LENGTH + _PROBE_BYTES)
    if len(head) < ENTRY_HEADER_LENGTH:
        return None
    length = int.from_bytes(head[:4], "big")
    body = head[ENTRY_HEADER_LENGTH : ENTRY_HEADER_LENGTH + length]
    try:
        try:
            decoded = decode_entry(body, verify_checksum=False, where=data_key)
        except TruncatedError:
            decoded = decode_entry(get_range(at + ENTRY_HEADER_LENGTH, length), verify_checksum=False, where=data_key)
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
            found = _block_publish_time(handle, store, blocks[i])
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
    max_uncompressed: int = MAX_UNCOMPRESSED,
) -> Iterator[pa.RecordBatch]:
    """The rows of one task as Arrow record batches of ``MESSAGE_ARROW_SCHEMA`` or ``ENTRY_ARROW_SCHEMA``
    (``rows`` turns one into dicts); a compressed payload inflates to at most ``max_uncompressed`` bytes
    (``codecs.compression.max_uncompressed`` of the broker's ``maxMessageSize``)."""
    if isinstance(location, StoreLocation):
        store, owned = location.open(create=False).store, True  # in a Spark task: open it here, close it after
    else:
        store, owned = location.store, False
    segment = task.segment
    handle = SegmentReadHandle.open(store, segment, read_buffer_size=read_buffer_size, keyring=keyring)
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
        if output == OUTPUT_MESSAGES:
            yield from _message_rows(
                handle, task.topic, start, end, times, skew_ms, batch_rows, batch_bytes, max_uncompressed
            )
        else:
            yield from _entry_rows(handle, task.topic, start, end, times, skew_ms, batch_rows, batch_bytes)
    finally:
        handle.close()
        if owned:
            store.close()


def read_tasks(
    location: StoreLocation | ScopedStore,
    tasks: Sequence[ReadTask],
    *,
    read_buffer_size: int = DEFAULT_READ_BUFFER_SIZE,
    keyring: KeyRing | None = None,
    batch_rows: int = DEFAULT_BATCH_ROWS,
    batch_bytes: int = DEFAULT_BATCH_BYTES,
    max_uncompressed: int = MAX_UNCOMPRESSED,
    run_bytes: int = DEFAULT_RUN_BYTES,
) -> Iterator[tuple[int, pa.RecordBatch]]:
    """The message rows of each of ``tasks`` in turn (each read whole: no time bounds), the same record batches
    ``read_task`` gives, each with its task's index. Consecutive small tasks of one topic, together under
    ``run_bytes`` of data, are decoded as one run (``_runs``): a table sync reads many small
    segments, and a run's fixed numpy steps, paid once per segment, were most of its read. (Not all of them at
    once: what a caller does with a run's rows, such as writing them, can overlap the next run's decoding.)"""
    if isinstance(location, StoreLocation):
        store, owned = location.open(create=False).store, True
    else:
        store, owned = location.store, False

    def streamed(i: int, handle: SegmentReadHandle, task: ReadTask) -> Iterator[tuple[int, pa.RecordBatch]]:
        rows = _message_rows(
            handle,
            task.topic,
            task.start,
            task.end,
            ANY_TIME,
            DEFAULT_SKEW_MS,
            batch_rows,
            batch_bytes,
            max_uncompressed,
        )
        return ((i, batch) for batch in rows)

    try:
        for streams, run in _runs(tasks, run_bytes, batch_bytes):
            group: list[tuple[int, str, int]] = []  # (task, data key, how many of ``read`` are its entries)
            read = JoinedEntries()  # the group's entries: read, not decoded
            for i in run:
                task = tasks[i]
                handle = SegmentReadHandle.open(store, task.segment, read_buffer_size=read_buffer_size, keyring=keyring)
                try:
                    if streams:
                        yield from streamed(i, handle, task)
                        continue
                    mark = read.mark()
                    try:
                        group.append((i, handle.data_key, handle.read_into(read, task.start, task.end)))
                    except Exception:  # read again as read_task reads: its rows before the failure, then its error
                        read.truncate(mark)
                        yield from _group_rows(task.topic, group, read, batch_rows, batch_bytes, max_uncompressed)
                        group, read = [], JoinedEntries()
                        yield from streamed(i, handle, task)
                finally:
                    handle.close()
            yield from _group_rows(tasks[run[0]].topic, group, read, batch_rows, batch_bytes, max_uncompressed)
    finally:
        if owned:
            store.close()


def _runs(tasks: Sequence[ReadTask], run_bytes: int, batch_bytes: int) -> list[tuple[bool, list[int]]]:
    """``read_tasks``' plan: consecutive tasks of one topic (their indices) read as one run of at most
    ``run_bytes``, or one task streamed (True: one whose size is unknown or at least ``batch_bytes``)."""
    out: list[tuple[bool, list[int]]] = []
    run: list[int] = []
    size = 0
    for i, task in enumerate(tasks):
        small = 0 < task.data_bytes < batch_bytes
        if run and (not small or task.topic != tasks[run[0]].topic or size + task.data_bytes > run_bytes):
            out.append((False, run))
            run, size = [], 0
        if not small:
            out.append((True, [i]))
            continue
        run.append(i)
        size += task.data_bytes
    if run:
        out.append((False, run))
    return out


def _group_rows(
    topic: str,
    group: Sequence[tuple[int, str, int]],
    read: JoinedEntries,
    batch_rows: int,
    batch_bytes: int,
    max_uncompressed: int,
) -> Iterator[tuple[int, pa.RecordBatch]]:
    """The record batches of the tasks of ``group`` (each: its index, its data key, how many of the entries
    ``read`` holds, in order, are its), each task's cut as ``read_task`` cuts them, decoded as one run; irregular
    anywhere, each task's entries one by one (the same rows, or the error naming the entry)."""
    if not group or not len(read):
        return
    joined = read.joined(PAD)
    starts = np.array(read.starts, dtype=np.int64)
    sizes = np.array(read.lengths, dtype=np.int64)
    ledgers = read.ledger_ids()
    run = batched_joined(joined, starts, sizes, max_uncompressed=max_uncompressed)
    batches = None
    owners: list[int] = []  # each batch's task
    if run is not None:
        ends: list[int] = []  # into the run: where each task's batches end
        first = 0
        for i, _, count in group:
            cut_at = _batch_ends(run, np.arange(first, first + count), batch_rows, batch_bytes, whole=True)
            ends += [first + end for end in cut_at]
            owners += [i] * len(cut_at)
            first += count
        ids = EntryIds(np.array(ledgers, dtype=np.int64), np.array(read.entry_ids, dtype=np.int64))
        batches = _run_batches(topic, TopicName.parse(topic).partition, run, np.arange(len(read)), ends, ids)
    if batches is not None:
        yield from zip(owners, batches, strict=True)
        return
    view = memoryview(joined)
    first = 0
    for i, data_key, count in group:
        entries = [
            OffloadedEntry(ledgers[k], read.entry_ids[k], view[starts[k] : starts[k] + sizes[k]])
            for k in range(first, first + count)
        ]
        first += count
        decoded = (
            (entry.ledger_id, entry.entry_id, d, where)
            for entry, d, where in _decoded_in_window(data_key, entries, ANY_TIME, DEFAULT_SKEW_MS, f" of {topic}")
        )
        rows = message_batches(
            topic, decoded, batch_rows=batch_rows, batch_bytes=batch_bytes, max_uncompressed=max_uncompressed
        )
        yield from ((i, batch) for batch in rows)


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
    return _decoded_in_window(handle.data_key, handle.read_range(start, end), times, skew_ms, where_suffix)


def _decoded_in_window(
    data_key: str, raw: Iterable[OffloadedEntry], times: TimeBounds, skew_ms: int, where_suffix: str
) -> Iterator[tuple[OffloadedEntry, DecodedEntry, str]]:
    """``_entries_in_window`` of the entries ``raw`` read from ``data_key``."""
    stop = _stop_time(times, skew_ms)
    for entry in raw:
        where = f"{data_key}: entry {entry.ledger_id}:{entry.entry_id}{where_suffix}"
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
) -> Iterator[pa.RecordBatch]:
    ledgers: list[int] = []
    entries: list[int] = []
    datas: list[bytes] = []
    counts: list[int] = []
    publish: list[int] = []
    pending = 0
    for entry, decoded, _where in _entries_in_window(handle, start, end, times, skew_ms, ""):
        ledgers.append(entry.ledger_id)
        entries.append(entry.entry_id)
        datas.append(bytes(entry.payload))
        counts.append(decoded.num_messages)
        publish.append(decoded.metadata.publish_time)
        pending += len(entry.payload)
        if len(ledgers) >= batch_rows or pending >= batch_bytes:
            yield _entry_batch(topic, ledgers, entries, datas, counts, publish)
            ledgers, entries, datas, counts, publish = [], [], [], [], []
            pending = 0
    if ledgers:
        yield _entry_batch(topic, ledgers, entries, datas, counts, publish)


def _entry_batch(
    topic: str, ledgers: list[int], entries: list[int], datas: list[bytes], counts: list[int], publish: list[int]
) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays(
        [
            pa.array([topic] * len(ledgers), pa.string()),
            pa.array(ledgers, pa.int64()),
            pa.array(entries, pa.int64()),
            pa.array(datas, pa.binary()),
            pa.array(counts, pa.int32()),
            _timestamps(pa.array(publish, pa.int64())),
        ],
        schema=ENTRY_ARROW_SCHEMA,
    )


def _timestamps(ms: pa.Array) -> pa.Array:
    """Milliseconds since the epoch as Spark's timestamps (µs); a value that does not fit is an error."""
    return pc.multiply_checked(ms, 1000).cast(_TIMESTAMP)


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


class _MessageBatch:
    """The rows of a run of entries, turned into one Arrow record batch with no Python object per row or field.
    Batched entries are split all at once (``read.batch_arrays``); when that finds anything irregular, or an
    entry is not a batch, the entries are split one by one into per-field lists (``codecs.entry_columns``),
    which gives the same rows or raises the error naming the first entry at fault."""

    def __init__(self, topic: str, partition: int, max_uncompressed: int = MAX_UNCOMPRESSED) -> None:
        self.topic = topic
        self.partition = partition
        self.max_uncompressed = max_uncompressed
        self.pending: list[tuple[int, int, DecodedEntry, str]] = []
        self.messages = 0
        self.payload_bytes = 0

    def add(self, ledger_id: int, entry_id: int, decoded: DecodedEntry, where: str) -> None:
        self.pending.append((ledger_id, entry_id, decoded, where))
        md = decoded.metadata
        self.messages += max(metadata_num_messages(md), 0)
        size = len(decoded.payload)
        self.payload_bytes += size if md.compression == _UNCOMPRESSED else max(size, md.uncompressed_size)

    def check(self) -> None:
        """Split the entries one by one, for the error of the first one at fault, if any."""
        self._one_by_one()

    @property
    def ids(self) -> list[bytes]:
        """Each message's ``__messageId`` (for tests and tools)."""
        sizes = np.array([_batch_size(d) for _, _, d, _ in self.pending], dtype=np.int64)
        ids = message_ids(
            np.array([ledger for ledger, _, _, _ in self.pending], dtype=np.int64),
            np.array([entry for _, entry, _, _ in self.pending], dtype=np.int64),
            self.partition,
            sizes,
            np.maximum(sizes, 1),
        )
        return [bytes(i) for i in ids.to_pylist()]

    def to_arrow(self) -> pa.RecordBatch:
        split = self._split()
        if split is None:
            cols, batch_sizes = self._one_by_one()
            return self._from_columns(cols, batch_sizes)
        metadata = [d.metadata for _, _, d, _ in self.pending]
        counts = [md.num_messages_in_batch for md in metadata]
        events = pa.array(split.event_time)
        return self._record_batch(
            value=split.value,
            key=split.key,
            events=events,
            properties=split.properties,
            batch_index=pa.array(split.batch_index),
            sequence_id=pa.array(split.sequence_id),
            counts=counts,
            batch_sizes=counts,
            publish_times=[md.publish_time for md in metadata],
            producers=[md.producer_name for md in metadata],
        )

    def _split(self) -> SplitBatch | None:
        payloads = []
        for _, _, decoded, where in self.pending:
            md = decoded.metadata
            if not md.HasField("num_messages_in_batch") or type(md.producer_name) is not str:
                return None
            if md.compression == _UNCOMPRESSED:
                payloads.append(decoded.payload)
                continue
            try:
                payloads.append(uncompressed_payload(decoded, where, self.max_uncompressed))
            except Exception:  # the one-by-one split raises it, after any earlier entry's error
                return None
        metadata = [d.metadata for _, _, d, _ in self.pending]
        return split_batches(
            payloads,
            [md.num_messages_in_batch for md in metadata],
            [md.event_time for md in metadata],
            [md.sequence_id for md in metadata],
        )

    def _one_by_one(self) -> tuple[MessageColumns, list[int]]:
        cols = MessageColumns()
        for _, _, decoded, where in self.pending:
            append_messages(decoded, cols, where=where, max_uncompressed=self.max_uncompressed)
        return cols, cols.batch_sizes

    def _from_columns(self, cols: MessageColumns, batch_sizes: list[int]) -> pa.RecordBatch:
        n = cols.messages
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(cols.value_sizes, out=offsets[1:])
        validity = None
        if cols.null_values:
            valid = np.ones(n, dtype=bool)
            valid[cols.null_values] = False
            validity = pa.array(valid).buffers()[1]
        value = pa.Array.from_buffers(
            pa.binary(),
            n,
            [validity, pa.array(offsets, pa.int32()).buffers()[1], pa.py_buffer(b"".join(cols.value_parts))],
            null_count=len(cols.null_values),
        )
        properties = pa.MapArray.from_arrays(
            pa.array(cols.prop_offsets, pa.int32()),
            pa.array(cols.prop_keys, pa.string()),
            pa.array(cols.prop_values, pa.string()),
            type=_PROPERTIES,
        )
        return self._record_batch(
            value=value,
            key=pa.array(cols.keys, pa.binary()),
            events=pa.array(cols.event_times, pa.int64()),
            properties=properties,
            batch_index=pa.array(cols.batch_indexes, pa.int32()),
            sequence_id=pa.array(cols.sequence_ids, pa.int64()),
            counts=cols.counts,
            batch_sizes=batch_sizes,
            publish_times=cols.publish_times,
            producers=cols.producer_names,
        )

    def _record_batch(
        self,
        *,
        value: pa.Array,
        key: pa.Array,
        events: pa.Array,
        properties: pa.Array,
        batch_index: pa.Array,
        sequence_id: pa.Array,
        counts: list[int],
        batch_sizes: list[int],
        publish_times: list[int],
        producers: list[str],
    ) -> pa.RecordBatch:
        return _rows(
            self.topic,
            self.partition,
            _Columns(value, key, events, properties, batch_index, sequence_id),
            ledgers=np.array([ledger for ledger, _, _, _ in self.pending], dtype=np.int64),
            entries=np.array([entry for _, entry, _, _ in self.pending], dtype=np.int64),
            counts=np.array(counts, dtype=np.int64),
            batch_sizes=np.array(batch_sizes, dtype=np.int64),
            publish_times=pa.array(publish_times, pa.int64()),
            producers=pa.array(producers, pa.string()),
        )


@dataclass(frozen=True, slots=True)
class _Columns:
    """The per-message columns of a run of entries, in ``MESSAGE_ARROW_SCHEMA``'s types but for the times."""

    value: pa.Array
    key: pa.Array
    events: pa.Array  # int64 ms, 0 when unset
    properties: pa.Array
    batch_index: pa.Array
    sequence_id: pa.Array


def _rows(
    topic: str,
    partition: int,
    columns: _Columns,
    *,
    ledgers: np.ndarray,
    entries: np.ndarray,
    counts: np.ndarray,
    batch_sizes: np.ndarray,
    publish_times: pa.Array,
    producers: pa.Array,
) -> pa.RecordBatch:
    """The record batch of a run of entries (``ledgers``, ``entries``, each with ``counts`` messages and its
    ``batch_sizes``, 0 for an entry that is not a batch), from the per-message columns and what is the same for
    every message of an entry."""
    n = len(columns.value)
    rows_entry = pa.array(np.repeat(np.arange(len(counts)), counts))  # each row's entry
    ids = message_ids(ledgers, entries, partition, batch_sizes, counts)
    name = topic.encode()
    topics = pa.Array.from_buffers(
        pa.string(),
        n,
        [None, pa.py_buffer(np.arange(0, (n + 1) * len(name), len(name), dtype=np.int32)), pa.py_buffer(name * n)],
    )
    events = columns.events
    arrays = [
        columns.value,
        columns.key,
        topics,
        ids,
        _timestamps(publish_times.take(rows_entry)),
        _timestamps(pc.if_else(pc.equal(events, 0), None, events)),  # pulsar-spark: no event time is null
        columns.properties,
        pa.array(np.repeat(ledgers, counts)),
        pa.array(np.repeat(entries, counts)),
        columns.batch_index,
        columns.sequence_id,
        producers.take(rows_entry),
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=MESSAGE_ARROW_SCHEMA)


def message_ids(
    ledgers: np.ndarray, entries: np.ndarray, partition: int, batch_sizes: np.ndarray, counts: np.ndarray
) -> pa.Array:
    """The ``__messageId`` of every message of entries (``ledgers``, ``entries``, ``counts`` messages each, with
    ``batch_sizes``, 0 for an entry that is not a batch), as ``message_id`` makes each, as a binary array: each
    entry's fields (ledger 1, entry 2, partition 3) as varints written by numpy, then each message's batch index
    and size (4, 6; ``_batch_suffixes``) joined to them by Arrow. Protobuf writes fields in number order, and a
    message is the concatenation of its fields."""
    n_entries = len(ledgers)
    prefix = np.zeros((n_entries, 3 * 11), dtype=np.uint8)
    prefix_len = np.zeros(n_entries, dtype=np.int64)
    rows = np.arange(n_entries)
    fields = [(0x08, ledgers), (0x10, entries)]
    if partition >= 0:
        fields.append((0x18, np.full(n_entries, partition, dtype=np.int64)))
    for tag, values in fields:
        _put_field(prefix, rows, prefix_len, tag, values)
    offsets = np.zeros(n_entries + 1, dtype=np.int32)
    np.cumsum(prefix_len, out=offsets[1:])
    data = prefix[np.arange(prefix.shape[1]) < prefix_len[:, None]]
    prefixes = pa.Array.from_buffers(pa.binary(), n_entries, [None, pa.py_buffer(offsets), pa.py_buffer(data)])
    rows_entry = pa.array(np.repeat(rows, counts))
    sizes = np.unique(batch_sizes)
    table, at = _batch_suffixes(tuple(sizes.tolist()))
    # Message j of an entry with batch size s is suffix at[s] + j (one empty suffix, at[0], for every message of
    # an entry that is not a batch).
    base = np.asarray(at, dtype=np.int64)[np.searchsorted(sizes, batch_sizes)]
    first = np.cumsum(counts) - counts
    index = np.arange(int(counts.sum()), dtype=np.int64) - np.repeat(first, counts)
    index = np.where(np.repeat(batch_sizes > 0, counts), index, 0) + np.repeat(base, counts)
    return pc.binary_join_element_wise(prefixes.take(rows_entry), table.take(pa.array(index)), b"")


@functools.lru_cache(maxsize=64)
def _batch_suffixes(sizes: tuple[int, ...]) -> tuple[pa.Array, tuple[int, ...]]:
    """The ``batch_index`` and ``batch_size`` fields (4 and 6) of each message of a batch of each of ``sizes``
    (0: not a batch, no fields), back to back as one binary array, and where each size's start."""
    suffixes: list[bytes] = []
    at = []
    for size in sizes:
        at.append(len(suffixes))
        if size <= 0:
            suffixes.append(b"")
        else:
            suffixes += (MessageIdData(batch_index=i, batch_size=size).SerializePartialToString() for i in range(size))
    return pa.array(suffixes, pa.binary()), tuple(at)


def _put_field(out: np.ndarray, rows: np.ndarray, at: np.ndarray, tag: int, values: np.ndarray) -> None:
    """Write the one-byte ``tag`` and the varint of ``values`` (non-negative) at column ``at`` of ``out``'s
    ``rows``; ``at`` moves past them."""
    out[rows, at] = tag
    v = values.astype(np.uint64)
    size = np.ones(len(v), dtype=np.int64)
    for k in range(1, 10):
        size += v >= np.uint64(1 << (7 * k))
    for k in range(int(size.max(initial=1))):
        byte = ((v >> np.uint64(7 * k)) & np.uint64(0x7F)).astype(np.uint8)
        byte |= np.where(size > k + 1, 0x80, 0).astype(np.uint8)
        live = size > k
        out[rows[live], at[live] + 1 + k] = byte[live]
    at += 1 + size


def _batch_size(decoded: DecodedEntry) -> int:
    md = decoded.metadata
    return md.num_messages_in_batch if md.HasField("num_messages_in_batch") else 0


def _message_rows(
    handle: SegmentReadHandle,
    topic: str,
    start: Position | None,
    end: Position | None,
    times: TimeBounds,
    skew_ms: int,
    batch_rows: int,
    batch_bytes: int,
    max_uncompressed: int = MAX_UNCOMPRESSED,
) -> Iterator[pa.RecordBatch]:
    """The message rows of ``[start, end]`` inside ``times``, in record batches cut where ``message_batches``
    cuts them. Runs of batched entries, or of single messages, compressed or not, are decoded all at once
    (``read.entry_arrays``, ``read.batch_arrays``); from the first run in which anything is irregular, the entries
    go one by one (``message_batches``), which gives the same rows or raises the error naming the entry."""
    raw: Iterator[OffloadedEntry] = iter(handle.read_range(start, end))
    partition = TopicName.parse(topic).partition
    stop = _stop_time(times, skew_ms)
    pending: list[OffloadedEntry] = []  # read, not yet in a record batch: the next batch starts with them
    exhausted = False

    def one_by_one(rest: Iterable[OffloadedEntry]) -> Iterator[pa.RecordBatch]:
        entries = _decoded_in_window(handle.data_key, rest, times, skew_ms, f" of {topic}")
        decoded = ((entry.ledger_id, entry.entry_id, d, where) for entry, d, where in entries)
        return message_batches(
            topic, decoded, batch_rows=batch_rows, batch_bytes=batch_bytes, max_uncompressed=max_uncompressed
        )

    while True:
        try:  # a run: at least a batch's worth of entries (in count or in bytes) beyond those pending
            count = size = 0
            while not exhausted and count < batch_rows and size < batch_bytes:
                entry = next(raw, None)
                if entry is None:
                    exhausted = True
                else:
                    pending.append(entry)
                    count += 1
                    size += len(entry.payload)
        except Exception as exc:  # the read failed: the entries before it first, as one by one would have
            yield from one_by_one(itertools.chain(pending, _raising(exc)))  # raises it, unless a time bound
            return  # ended the read before it
        if not pending:
            return
        run = batched_entries([entry.payload for entry in pending], max_uncompressed=max_uncompressed)
        if run is None:
            yield from one_by_one(itertools.chain(pending, raw))
            return
        inside = np.ones(len(pending), dtype=bool)
        if times.lo is not None:
            inside &= run.publish_time >= times.lo
        if times.hi is not None:
            inside &= run.publish_time < times.hi
        if stop is not None:
            past = np.flatnonzero(~inside & (run.publish_time >= stop))
            if len(past):  # nothing after it is inside the window: the read ends here
                inside[past[0] :] = False
                exhausted, raw = True, iter(())
        kept = np.flatnonzero(inside)
        ends = _batch_ends(run, kept, batch_rows, batch_bytes, whole=exhausted)
        if ends:
            batches = _run_batches(topic, partition, run, kept[: ends[-1]], ends, EntryIds.of(pending))
            if batches is None:
                yield from one_by_one(itertools.chain((pending[i] for i in kept.tolist()), raw))
                return
            yield from batches
        pending = [pending[i] for i in kept[ends[-1] if ends else 0 :].tolist()]
        if exhausted and not pending:
            return


def _batch_ends(run: BatchedEntries, kept: np.ndarray, batch_rows: int, batch_bytes: int, *, whole: bool) -> list[int]:
    """Where the record batches of the ``kept`` entries of ``run`` end (exclusive, into ``kept``), cut where
    ``message_batches`` cuts them: once a batch holds ``batch_rows`` messages or ``batch_bytes`` payload bytes;
    with ``whole``, the rest is a last batch too."""
    messages = np.cumsum(run.num_messages[kept])
    payload = np.cumsum(run.payload_bytes[kept])
    ends: list[int] = []
    first = 0
    while first < len(kept):
        before_messages = messages[first - 1] if first else 0
        before_payload = payload[first - 1] if first else 0
        full = np.flatnonzero(
            (messages[first:] - before_messages >= batch_rows) | (payload[first:] - before_payload >= batch_bytes)
        )
        if not len(full):
            if whole:
                ends.append(len(kept))
            break
        first += int(full[0]) + 1
        ends.append(first)
    return ends


@dataclass(frozen=True)
class EntryIds:
    """The ledger and entry ids of a run's entries (int64, in the run's order)."""

    ledger_ids: np.ndarray
    entry_ids: np.ndarray

    @classmethod
    def of(cls, entries: Sequence[OffloadedEntry]) -> EntryIds:
        return cls(
            np.array([entry.ledger_id for entry in entries], dtype=np.int64),
            np.array([entry.entry_id for entry in entries], dtype=np.int64),
        )


def _run_batches(
    topic: str,
    partition: int,
    run: BatchedEntries,
    chosen: np.ndarray,
    ends: Sequence[int],
    ids: EntryIds,
) -> list[pa.RecordBatch] | None:
    """The record batches of the ``chosen`` entries of ``run`` (whose ids are ``ids``), cut after ``ends`` of
    them: built as one (``_run_batch``: its fixed steps once a run) and sliced; None when anything in them is
    irregular."""
    batch = _run_batch(topic, partition, run, chosen, ids)
    if batch is None:
        return None
    rows = np.concatenate(([0], np.cumsum(run.num_messages[chosen])))
    out = []
    first = 0
    for end in ends:
        out.append(batch.slice(int(rows[first]), int(rows[end] - rows[first])))
        first = end
    return out


def _raising(exc: Exception) -> Iterator[OffloadedEntry]:
    raise exc
    yield  # a generator: raises when reached


def _run_batch(
    topic: str, partition: int, run: BatchedEntries, chosen: np.ndarray, ids: EntryIds
) -> pa.RecordBatch | None:
    """The record batch of the ``chosen`` entries of ``run`` (whose ids are ``ids``), or None when splitting
    their batches finds anything irregular."""
    counts = run.num_messages[chosen]
    take = pa.array(chosen)
    if run.batched:
        split = split_joined(
            run.joined,
            run.total,
            run.payload_at[chosen],
            run.payload_end[chosen],
            counts,
            run.event_time[chosen],
            run.sequence_id[chosen],
        )
        if split is None:
            return None
        columns = _Columns(
            split.value,
            split.key,
            pa.array(split.event_time),
            split.properties,
            pa.array(split.batch_index),
            pa.array(split.sequence_id),
        )
        batch_sizes = counts
    else:  # single messages: the entry's payload, key and properties (``split_messages``)
        assert run.key is not None and run.properties is not None and run.null_value is not None
        null = run.null_value[chosen]
        value = cut(pa.py_buffer(run.joined), run.total, run.payload_at[chosen], run.payload_end[chosen], null)
        columns = _Columns(
            value,
            run.key.take(take),
            pa.array(run.event_time[chosen]),
            run.properties.take(take),
            pa.array(np.full(len(chosen), -1, dtype=np.int32)),
            pa.array(run.sequence_id[chosen]),
        )
        batch_sizes = np.zeros(len(chosen), dtype=np.int64)
    return _rows(
        topic,
        partition,
        columns,
        ledgers=ids.ledger_ids[chosen],
        entries=ids.entry_ids[chosen],
        counts=counts,
        batch_sizes=batch_sizes,
        publish_times=pa.array(run.publish_time[chosen]),
        producers=run.producer.take(take),
    )


def message_batches(
    topic: str,
    entries: Iterator[tuple[int, int, DecodedEntry, str]],
    *,
    batch_rows: int = DEFAULT_BATCH_ROWS,
    batch_bytes: int = DEFAULT_BATCH_BYTES,
    max_uncompressed: int = MAX_UNCOMPRESSED,
) -> Iterator[pa.RecordBatch]:
    """pulsar-spark's message rows (``MESSAGE_ARROW_SCHEMA``) of one topic-partition's decoded entries, in order:
    each ``(ledger id, entry id, decoded entry, where)``, ``where`` naming the entry in errors. Batches are split
    and compressed payloads inflated (to at most ``max_uncompressed`` bytes); a record batch is handed out once
    it holds ``batch_rows`` messages or ``batch_bytes`` payload bytes. Both the ``pulsar-offloaded`` source and
    the live ``pulsar`` source build their message rows here."""
    partition = TopicName.parse(topic).partition
    batch = _MessageBatch(topic, partition, max_uncompressed)
    while True:
        try:
            ledger_id, entry_id, decoded, where = next(entries)
            if decoded.encrypted:
                raise EncryptedEntryError(
                    f"{where} is end-to-end encrypted: its messages cannot be read here "
                    "(read it with the option output=entries for the stored bytes)"
                )
        except StopIteration:
            break
        except Exception:
            # Entries are split when their batch is built; one read before this failure may be at fault too,
            # and its error comes first, as it would have if it had been split on arrival.
            batch.check()
            raise
        batch.add(ledger_id, entry_id, decoded, where)
        if batch.messages >= batch_rows or batch.payload_bytes >= batch_bytes:
            yield batch.to_arrow()
            batch = _MessageBatch(topic, partition, max_uncompressed)
    if batch.pending:
        yield batch.to_arrow()


def rows(batch: pa.RecordBatch, names: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """A batch of ``read_task`` as dicts (for tests and tools): times in ms since the epoch (None for a
    missing event time), properties as (key, value) pairs."""
    columns = []
    for field, column in zip(batch.schema, batch.columns, strict=True):
        if pa.types.is_timestamp(field.type):
            column = pc.divide(column.cast(pa.int64()), 1000)
        columns.append(column.to_pylist())
    names = batch.schema.names if names is None else names
    return [dict(zip(names, values, strict=True)) for values in zip(*columns, strict=True)]
