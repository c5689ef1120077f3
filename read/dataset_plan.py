"""Offloaded topics as a batch dataset, without Spark: which segments, and which blocks of them, to read.

``streaming/source/offloaded_source.py`` (``spark.read.format("pulsar-offloaded")``) is a thin layer over this
module and ``read.dataset_read`` (the reading); tests and benchmarks call both directly.

**Planning** (:func:`plan`, on the driver) lists the ``Offloaded`` segments of each topic-partition and
keeps those that may hold a row inside the bounds, using the manifests alone: the position range
(``startLedgerId:startEntryId .. endLedgerId:endEntryId``) and the publish-time range
(``publishTimeFirst .. publishTimeLast``). A pruned segment's objects are never opened. A kept segment is
one :class:`ReadTask`; one whose data object is larger than ``max_partition_bytes`` is split into runs
of whole blocks, located through its index (the only object planning reads).

**Publish time order.** Pruning assumes that publish times grow with position, as they do for one
producer (a publish time is the producer's clock at send time). Several producers on one topic with
clocks apart by more than ``skew_ms`` (default 1 s) may interleave out of order by more than that; a
message published that much "out of order" right at a time bound could then be pruned. Position bounds
are always exact.
"""

from __future__ import annotations

import bisect
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from streamoffload.checkpoints import manifest as mf
from streamoffload.checkpoints.metadata_store import CorruptManifest, MetadataStore
from streamoffload.codecs.blocks import MAX_ID
from streamoffload.codecs.index import BlockLocation
from streamoffload.codecs.positions import Position
from streamoffload.codecs.proto.offload_manifest_pb2 import SegmentManifest
from streamoffload.codecs.topics import TopicName
from streamoffload.errors import ConfigError
from streamoffload.read.segment import SegmentReadHandle, TopicNotOffloadedError
from streamoffload.read.segment.errors import ReadError
from streamoffload.storage.base import ObjectStore
from streamoffload.storage.location import ScopedStore

# A quarter of Spark's spark.sql.files.maxPartitionBytes: a Python task decodes some tens of MB/s, so
# smaller tasks keep the cores evenly busy (the cost per task is one index read).
DEFAULT_MAX_PARTITION_BYTES = 32 * 1024 * 1024
DEFAULT_SKEW_MS = 1000


class CorruptManifestError(ReadError):
    """A segment manifest that may cover the requested range does not decode: reading around it would
    silently leave its entries out."""


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


ANY_TIME = TimeBounds()
"""No publish-time bound."""


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
    if isinstance(spec, str):
        raise ConfigError(f"option {option}: {spec!r} is neither a position nor 'earliest' ({topic})")
    ledger, entry = spec
    return (max(ledger, 0), entry + 1) if ledger >= 0 else None


def end_bound(spec: Position | str | None, topic: str, option: str = "endingOffsets") -> Position | None:
    """Last position to read (inclusive) from an ``endingOffsets`` value: what a live source's offset says
    it emitted last, so a streaming query's committed offsets can end a batch read."""
    if spec is None or spec == "latest":
        return None
    if spec == "earliest":
        raise ConfigError(f"option {option}: 'earliest' is not an end for a batch read ({topic})")
    if isinstance(spec, str):
        raise ConfigError(f"option {option}: {spec!r} is neither a position nor 'latest' ({topic})")
    ledger, entry = spec
    if ledger < 0:
        return (-1, -1)  # before everything: nothing to read
    return (ledger, entry) if entry >= 0 else (ledger - 1, MAX_ID)


def spec_for(spec: str | Mapping[str, Any], topic: str) -> Position | str | None:
    """A topic-partition's value in a parsed offsets option (``"*"`` for those not named; a partitioned
    topic's entry applies to its partitions)."""
    if isinstance(spec, str):
        return spec
    base = str(TopicName.parse(topic).base)
    value: Position | str | None = spec[topic] if topic in spec else spec[base] if base in spec else spec.get("*")
    return value


# --- which topics -----------------------------------------------------------------------------------------


def resolve_topics(
    metadata: MetadataStore, topics: Sequence[str], pattern: tuple[str, re.Pattern[str]] | None = None
) -> list[str]:
    """The topic-partitions to read: each named topic that has offloaded data, or, for a partitioned topic,
    its partitions found in the store; or every topic of a ``topicsPattern`` namespace whose local name (or
    partitioned topic's) matches the regex. A name with nothing offloaded is an error naming the store."""
    known = {str(t): t for t in metadata.topics()}

    def missing(what: str) -> TopicNotOffloadedError:
        names = sorted(known)
        shown = ", ".join(names[:10]) + (", ..." if len(names) > 10 else "")
        return TopicNotOffloadedError(
            f"{what} has no offloaded data in {metadata.scoped.describe()}"
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
    """Raise ``CorruptManifestError`` if a manifest of ``topic`` that does not decode (or is not trusted where it
    stands, its store moved to a new prefix) may hold a position in ``[start, end]``: it starts at or before
    ``end`` (its key tells where it starts) and no readable segment starts between it and ``start`` (segments
    do not overlap, so such a segment would end it before ``start``). A foreign manifest (another topic's, or
    naming objects not its segment's) holds none of the topic's entries: the read goes on without it."""
    if not corrupt:
        return
    starts = sorted(mf.start_position(m) for m in readable)
    for bad in corrupt:
        if bad.foreign:
            continue
        if bad.start is not None and end is not None and bad.start > end:
            continue
        if bad.start is not None and start is not None and any(bad.start < s <= start for s in starts):
            continue
        why = bad.error.removeprefix(bad.key + ": ")
        raise CorruptManifestError(
            f"topic {topic}: the segment manifest {bad.key} cannot be used ({why}); "
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


def block_start(block: BlockLocation) -> Position:
    return (block.ledger_id, block.first_entry_id)


def position_before(position: Position) -> Position:
    """The last position before ``position`` (ledger boundaries included)."""
    ledger, entry = position
    return (ledger, entry - 1) if entry > 0 else (ledger - 1, MAX_ID)


def plan(
    scoped: ScopedStore,
    topics: Sequence[str],
    positions: Mapping[str, PositionBounds],
    times: TimeBounds = ANY_TIME,
    *,
    skew_ms: int = DEFAULT_SKEW_MS,
    max_partition_bytes: int = DEFAULT_MAX_PARTITION_BYTES,
) -> list[ReadTask]:
    """The read tasks of ``topics`` (resolved topic-partitions) within the bounds; see the module notes."""
    metadata = MetadataStore(scoped)
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
            tasks += segment_tasks(scoped.store, topic, segment, bounds, max_partition_bytes)
    return tasks


def segment_tasks(
    store: ObjectStore, topic: str, segment: SegmentManifest, bounds: PositionBounds, max_bytes: int
) -> list[ReadTask]:
    """The read tasks of one segment within ``bounds``: the whole segment, or runs of whole blocks of about
    ``max_bytes`` when its data object is larger (located through its index)."""
    encoded = mf.encode_manifest(segment)
    if segment.dataLength <= max_bytes or segment.blockCount <= 1:
        return [ReadTask(topic, encoded, bounds.start, bounds.end, data_bytes=segment.dataLength)]
    # Only the index is read (check_metadata=False: no HEADs; the task's own handle checks the objects).
    handle = SegmentReadHandle.open(store, segment, check_metadata=False)
    try:
        blocks = handle.index.blocks()
    finally:
        handle.close()
    starts = [block_start(b) for b in blocks]
    first = 0 if bounds.start is None else max(bisect.bisect_right(starts, bounds.start) - 1, 0)
    last = len(blocks) - 1 if bounds.end is None else max(bisect.bisect_right(starts, bounds.end) - 1, 0)
    tasks: list[ReadTask] = []
    run_start = first
    run_bytes = 0
    for i in range(first, last + 1):
        run_bytes += blocks[i].length
        if run_bytes >= max_bytes or i == last:
            start = bounds.start if run_start == first else starts[run_start]
            end = bounds.end if i == last else position_before(starts[i + 1])
            tasks.append(ReadTask(topic, encoded, start, end, run_start, i, run_bytes))
            run_start, run_bytes = i + 1, 0
    return tasks


DEFAULT_OPEN_COST_BYTES = 4 * 1024 * 1024
"""What opening a task is counted as, in bytes, when tasks are packed (Spark's ``spark.sql.files.openCostInBytes``)."""


def pack_tasks(
    tasks: Sequence[ReadTask],
    max_bytes: int = DEFAULT_MAX_PARTITION_BYTES,
    open_cost: int = DEFAULT_OPEN_COST_BYTES,
) -> list[list[ReadTask]]:
    """``tasks`` in order, packed into groups of at most ``max_bytes`` (each task its data bytes plus
    ``open_cost``), as Spark packs small files into its partitions: many small segments (a topic sealed every few
    seconds) are one Spark task each no more. A task of unknown size is a group of its own."""
    groups: list[list[ReadTask]] = []
    size = 0
    for task in tasks:
        cost = task.data_bytes + open_cost
        if not groups or not task.data_bytes or not groups[-1][-1].data_bytes or size + cost > max_bytes:
            groups.append([task])
            size = cost
        else:
            groups[-1].append(task)
            size += cost
    return groups


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
