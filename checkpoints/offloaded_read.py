"""Offloaded topics as a batch dataset, without Spark: plan input partitions, then read rows.

``streaming/offloaded_source.py`` (``spark.read.format("pulsar-offloaded")``) is a thin layer over this
module; tests and benchmarks call it directly.

**Planning** (:func:`plan`, on the driver) lists the ``Offloaded`` segments of each topic-partition and
keeps those that may hold a row inside the bounds, using the manifests alone: the position range
(``startLedgerId:startEntryId .. endLedgerId:endEntryId``) and the publish-time range
(``publishTimeFirst .. publishTimeLast``). A pruned segment's objects are never opened. A kept segment is
one :class:`ReadTask`; one whose data object is larger than ``max_partition_bytes`` is split into runs
of whole blocks, located through its index (the only object planning reads).

**Reading** (:func:`read_task`, in a task) opens the segment (``storage.read.SegmentReadHandle``:
every entry's CRC-32C is checked, corruption names the object and offset) and reads its position range.
A position bound starts the read at the index's block holding it. A publish-time bound starts it at the
block holding the first entry at or after the bound, and ends it after the last block starting at or
before the end bound: blocks are located by a binary search over the publish time of each block's first
entry (a few KB read per probe). The read stops at the first entry published at or after the end bound
(plus the skew below). Every row is still checked against the bounds exactly. A time window therefore
reads about one block per topic-partition beyond the entries inside it (the block holding its start),
plus what the read-ahead fetched: blocks of a few MiB suit a tier queried by time (Pulsar's default
``managedLedgerOffloadMaxBlockSizeInBytes`` is 64 MiB).

**Publish time order.** Pruning assumes that publish times grow with position, as they do for one
producer (a publish time is the producer's clock at send time). Several producers on one topic with
clocks apart by more than ``skew_ms`` (default 1 s) may interleave out of order by more than that; a
message published that much "out of order" right at a time bound could then be pruned. Position bounds
are always exact.
"""

from __future__ import annotations

import base64
import bisect
import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from streamoffload.checkpoints import manifest as mf
from streamoffload.checkpoints.metadata_store import CorruptManifest, MetadataStore
from streamoffload.codecs.blocks import BLOCK_HEADER_LENGTH, ENTRY_HEADER_LENGTH, MAX_ID
from streamoffload.codecs.entry import decode_entry, split_messages
from streamoffload.codecs.errors import FormatError, TruncatedError
from streamoffload.codecs.index import BlockLocation
from streamoffload.codecs.positions import Position
from streamoffload.codecs.proto.offload_manifest_pb2 import SegmentManifest
from streamoffload.codecs.proto.pulsar_api_pb2 import MessageIdData
from streamoffload.codecs.topics import TopicName
from streamoffload.errors import ConfigError, StreamOffloadError
from streamoffload.storage.base import ObjectStore
from streamoffload.storage.read import DEFAULT_READ_BUFFER_SIZE, SegmentReadHandle, TopicNotFoundError

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

# A quarter of Spark's spark.sql.files.maxPartitionBytes: a Python task decodes some tens of MB/s, so
# smaller tasks keep the cores evenly busy (the cost per task is one index read).
DEFAULT_MAX_PARTITION_BYTES = 32 * 1024 * 1024
DEFAULT_SKEW_MS = 1000
DEFAULT_BATCH_ROWS = 4096
DEFAULT_BATCH_BYTES = 32 << 20
_PROBE_BYTES = 4096  # a block's first entry header and metadata, for its publish time


class EncryptedEntryError(StreamOffloadError):
    """An end-to-end encrypted entry read as messages: its payload is ciphertext."""


class CorruptManifestError(StreamOffloadError):
    """A segment manifest that may cover the requested range does not decode: reading around it would
    silently leave its entries out."""


# --- where to read ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StoreLocation:
    """A store named by URL (``file:///dir``, a path, or ``s3://bucket[/prefix]``), opened in each task."""

    url: str
    endpoint: str | None = None
    region: str | None = None

    def open(self) -> tuple[ObjectStore, str]:
        """The store and the key prefix its topics live under. A filesystem store must exist (a mistyped
        path is an error, not a new empty store)."""
        from streamoffload.storage.urls import open_store, parse_store_url

        location = parse_store_url(self.url)
        if location.scheme == "s3":
            # Keys in manifests are relative to the bucket: open its root, read under the prefix.
            store = open_store(
                f"s3://{location.bucket}",
                endpoint_url=self.endpoint,
                region=self.region,
                path_style=True if self.endpoint else None,
            )
            return store, location.prefix
        return open_store(self.url, create=False), ""


@dataclass(frozen=True)
class TimeBounds:
    """Publish times ``[lo, hi)`` in ms since the epoch (None = open)."""

    lo: int | None = None
    hi: int | None = None

    def contains(self, ms: int) -> bool:
        return (self.lo is None or ms >= self.lo) and (self.hi is None or ms < self.hi)

    def narrowed(self, lo: int | None, hi: int | None) -> TimeBounds:
        """The intersection with ``[lo, hi)``."""
        new_lo = self.lo if lo is None else lo if self.lo is None else max(self.lo, lo)
        new_hi = self.hi if hi is None else hi if self.hi is None else min(self.hi, hi)
        return TimeBounds(new_lo, new_hi)

    @property
    def empty(self) -> bool:
        return self.lo is not None and self.hi is not None and self.lo >= self.hi


@dataclass(frozen=True)
class PositionBounds:
    """Positions ``[start, end]``, both inclusive (None = open)."""

    start: Position | None = None
    end: Position | None = None

    def narrowed(self, start: Position | None, end: Position | None) -> PositionBounds:
        new_start = self.start if start is None else start if self.start is None else max(self.start, start)
        new_end = self.end if end is None else end if self.end is None else min(self.end, end)
        return PositionBounds(new_start, new_end)

    @property
    def empty(self) -> bool:
        return self.start is not None and self.end is not None and self.start > self.end


def parse_time(text: str, option: str) -> int:
    """Milliseconds since the epoch from an integer (ms) or an ISO-8601 timestamp (UTC unless it says)."""
    value = text.strip()
    if re.fullmatch(r"-?\d+", value):
        return int(value)
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise ConfigError(
            f"option {option}: expected milliseconds since the epoch or an ISO-8601 timestamp "
            f"(e.g. 2026-03-01T00:00:00Z), got {text!r}"
        ) from None
    return datetime_ms(parsed)


def datetime_ms(value: datetime) -> int:
    """ms since the epoch; a naive datetime is taken as UTC."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return (value - datetime(1970, 1, 1, tzinfo=UTC)) // _MS


_MS = datetime(1970, 1, 1, 0, 0, 0, 1000, tzinfo=UTC) - datetime(1970, 1, 1, tzinfo=UTC)


def start_bound(spec: Position | str | None, topic: str, option: str = "startingOffsets") -> Position | None:
    """First position to read from a ``startingOffsets`` value: the last position already processed, as in
    the live source, so reading starts after it (``[L, -1]``: ledger L's first entry)."""
    if spec is None or spec == "earliest":
        return None
    if spec == "latest":
        raise ConfigError(f"option {option}: 'latest' is not a start for a batch read ({topic})")
    ledger, entry = spec  # type: ignore[misc]
    return (max(ledger, 0), entry + 1) if ledger >= 0 else None


def end_bound(spec: Position | str | None, topic: str, option: str = "endingOffsets") -> Position | None:
    """Last position to read (inclusive) from an ``endingOffsets`` value: what a live source's offset says
    it emitted last, so a streaming query's committed offsets can end a batch read."""
    if spec is None or spec == "latest":
        return None
    if spec == "earliest":
        raise ConfigError(f"option {option}: 'earliest' is not an end for a batch read ({topic})")
    ledger, entry = spec  # type: ignore[misc]
    if ledger < 0:
        return (-1, -1)  # before everything: nothing to read
    return (ledger, entry) if entry >= 0 else (ledger - 1, MAX_ID)


def spec_for(spec: str | Mapping[str, Any], topic: str) -> Position | str | None:
    """A topic-partition's value in a parsed offsets option (``"*"`` for those not named; a partitioned
    topic's entry applies to its partitions)."""
    if isinstance(spec, str):
        return spec
    if topic in spec:
        return spec[topic]
    base = str(TopicName.parse(topic).base)
    if base in spec:
        return spec[base]
    return spec.get("*")


# --- which topics -----------------------------------------------------------------------------------------


def resolve_topics(
    metadata: MetadataStore, topics: Sequence[str], pattern: tuple[str, re.Pattern[str]] | None = None
) -> list[str]:
    """The topic-partitions to read: each named topic that has offloaded data, or, for a partitioned topic,
    its partitions found in the store; or every topic of a ``topicsPattern`` namespace whose local name (or
    partitioned topic's) matches the regex. A name with nothing offloaded is an error naming the store."""
    known = {str(t): t for t in metadata.topics()}

    def missing(what: str) -> TopicNotFoundError:
        names = sorted(known)
        shown = ", ".join(names[:10]) + (", ..." if len(names) > 10 else "")
        where = metadata.store.url + (f" under prefix {metadata.prefix!r}" if metadata.prefix else "")
        return TopicNotFoundError(
            f"{what} has no offloaded data in {where}"
            + (f" (topics with offloaded data: {shown})" if names else " (no topic has offloaded data there)")
        )

    out: list[str] = []
    if pattern is not None:
        namespace, regex = pattern
        for name, parsed in sorted(known.items()):
            if parsed.namespace_name != namespace:
                continue
            if regex.fullmatch(parsed.local_name) or regex.fullmatch(parsed.base.local_name):
                out.append(name)
        if not out:
            raise missing(f"topicsPattern {namespace}/{regex.pattern}")
        return _partition_order(out)
    for topic in topics:
        parsed = TopicName.parse(topic)
        if str(parsed) in known:
            out.append(str(parsed))
            continue
        partitions = [n for n, t in known.items() if t.is_partition and t.base == parsed]
        if not partitions:
            raise missing(f"topic {parsed}")
        out += partitions
    return _partition_order(list(dict.fromkeys(out)))


def _partition_order(names: list[str]) -> list[str]:
    def key(name: str) -> tuple[str, int]:
        parsed = TopicName.parse(name)
        return (str(parsed.base), parsed.partition)

    return sorted(names, key=key)


def refuse_corrupt(
    topic: str,
    corrupt: Sequence[CorruptManifest],
    readable: Sequence[SegmentManifest],
    start: Position | None,
    end: Position | None,
) -> None:
    """Raise ``CorruptManifestError`` if a manifest of ``topic`` that does not decode may hold a position in
    ``[start, end]``: it starts at or before ``end`` (its key tells where it starts) and no readable segment
    starts between it and ``start`` (segments do not overlap, so such a segment would end it before
    ``start``)."""
    if not corrupt:
        return
    starts = sorted(mf.start_position(m) for m in readable)
    for bad in corrupt:
        if bad.start is not None and end is not None and bad.start > end:
            continue
        if bad.start is not None and start is not None and any(bad.start < s <= start for s in starts):
            continue
        why = bad.error.removeprefix(bad.key + ": ")
        raise CorruptManifestError(
            f"topic {topic}: the segment manifest {bad.key} does not decode ({why}); "
            "its entries may be in the requested range, so nothing is read (run `streamoffload verify`)"
        )


# --- planning ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReadTask:
    """One input partition: a run of whole blocks (all of them by default) of one segment, and the
    position range to read from it."""

    topic: str
    manifest: bytes
    """The segment's framed manifest (``manifest.encode_manifest``): a task needs no listing."""
    start: Position | None
    end: Position | None
    first_block: int = 0
    last_block: int = -1
    """Block indices, in data-object order, inclusive; -1 = the last block."""
    data_bytes: int = 0

    @property
    def segment(self) -> SegmentManifest:
        return mf.decode_manifest(self.manifest, where=f"read task of {self.topic}")


def segment_in_time(segment: SegmentManifest, times: TimeBounds, skew_ms: int) -> bool:
    """Whether a segment's publish-time range (from its manifest) may reach into ``times``."""
    ends_before = (
        times.lo is not None and segment.HasField("publishTimeLast") and segment.publishTimeLast < times.lo - skew_ms
    )
    starts_after = (
        times.hi is not None and segment.HasField("publishTimeFirst") and segment.publishTimeFirst >= times.hi + skew_ms
    )
    return not (ends_before or starts_after)


def _segment_in_positions(segment: SegmentManifest, bounds: PositionBounds) -> bool:
    return (bounds.start is None or mf.end_position(segment) >= bounds.start) and (
        bounds.end is None or mf.start_position(segment) <= bounds.end
    )


def _block_start(block: BlockLocation) -> Position:
    return (block.ledger_id, block.first_entry_id)


def _before(position: Position) -> Position:
    """The last position before ``position`` (ledger boundaries included)."""
    ledger, entry = position
    return (ledger, entry - 1) if entry > 0 else (ledger - 1, MAX_ID)


def plan(
    store: ObjectStore,
    prefix: str,
    topics: Sequence[str],
    positions: Mapping[str, PositionBounds],
    times: TimeBounds = TimeBounds(),
    *,
    skew_ms: int = DEFAULT_SKEW_MS,
    max_partition_bytes: int = DEFAULT_MAX_PARTITION_BYTES,
) -> list[ReadTask]:
    """The read tasks of ``topics`` (resolved topic-partitions) within the bounds; see the module notes."""
    metadata = MetadataStore(store, prefix)
    tasks: list[ReadTask] = []
    if times.empty:
        return tasks
    for topic in topics:
        bounds = positions.get(topic, PositionBounds())
        if bounds.empty:
            continue
        corrupt: list[CorruptManifest] = []
        segments = metadata.offloaded_segments(topic, corrupt)
        refuse_corrupt(topic, corrupt, segments, bounds.start, bounds.end)
        for segment in segments:
            if not _segment_in_positions(segment, bounds) or not segment_in_time(segment, times, skew_ms):
                continue
            tasks += _split(store, topic, segment, bounds, max_partition_bytes)
    return tasks


def _split(
    store: ObjectStore, topic: str, segment: SegmentManifest, bounds: PositionBounds, max_bytes: int
) -> list[ReadTask]:
    encoded = mf.encode_manifest(segment)
    if segment.dataLength <= max_bytes or segment.blockCount <= 1:
        return [ReadTask(topic, encoded, bounds.start, bounds.end, data_bytes=segment.dataLength)]
    # Only the index is read (check_metadata=False: no HEADs; the task's own handle checks the objects).
    handle = SegmentReadHandle(store, segment, check_metadata=False)
    try:
        blocks = handle.index.blocks()
    finally:
        handle.close()
    starts = [_block_start(b) for b in blocks]
    first = 0 if bounds.start is None else max(bisect.bisect_right(starts, bounds.start) - 1, 0)
    last = len(blocks) - 1 if bounds.end is None else max(bisect.bisect_right(starts, bounds.end) - 1, 0)
    tasks: list[ReadTask] = []
    run_start = first
    run_bytes = 0
    for i in range(first, last + 1):
        run_bytes += blocks[i].length
        if run_bytes >= max_bytes or i == last:
            start = bounds.start if run_start == first else starts[run_start]
            end = bounds.end if i == last else _before(starts[i + 1])
            tasks.append(ReadTask(topic, encoded, start, end, run_start, i, run_bytes))
            run_start, run_bytes = i + 1, 0
    return tasks


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
    location: StoreLocation | tuple[ObjectStore, str],
    task: ReadTask,
    *,
    output: str = OUTPUT_MESSAGES,
    times: TimeBounds = TimeBounds(),
    skew_ms: int = DEFAULT_SKEW_MS,
    read_buffer_size: int = DEFAULT_READ_BUFFER_SIZE,
    batch_rows: int = DEFAULT_BATCH_ROWS,
    batch_bytes: int = DEFAULT_BATCH_BYTES,
) -> Iterator[list[list[Any]]]:
    """The rows of one task as column batches (lists in ``MESSAGE_COLUMNS`` or ``ENTRY_COLUMNS`` order;
    times in ms since the epoch, ``None`` for a missing event time)."""
    if isinstance(location, StoreLocation):
        store, _prefix = location.open()
        owned = True
    else:
        store, owned = location[0], False
    segment = task.segment
    handle = SegmentReadHandle(store, segment, read_buffer_size=read_buffer_size)
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
                start = max(start, _block_start(mine[first_i])) if start is not None else _block_start(mine[first_i])
            if last_i < len(mine) - 1:
                stop = _before(_block_start(mine[last_i + 1]))
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


def describe(task: ReadTask) -> str:
    return json.dumps(
        {
            "topic": task.topic,
            "segment": str(mf.manifest_uuid(task.segment)),
            "start": task.start,
            "end": task.end,
            "blocks": [task.first_block, task.last_block],
        }
    )


__all__ = [
    "DEFAULT_MAX_PARTITION_BYTES",
    "DEFAULT_SKEW_MS",
    "ENTRY_COLUMNS",
    "ENTRY_SCHEMA",
    "MESSAGE_COLUMNS",
    "MESSAGE_SCHEMA",
    "OUTPUTS",
    "OUTPUT_ENTRIES",
    "OUTPUT_MESSAGES",
    "CorruptManifestError",
    "EncryptedEntryError",
    "PositionBounds",
    "ReadTask",
    "StoreLocation",
    "TimeBounds",
    "datetime_ms",
    "end_bound",
    "message_id",
    "parse_time",
    "plan",
    "read_task",
    "refuse_corrupt",
    "resolve_topics",
    "rows",
    "segment_in_time",
    "spec_for",
    "start_bound",
]
