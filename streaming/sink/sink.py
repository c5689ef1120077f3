"""The sink: carries out the segmenter's actions (``streaming.handoff.actions``) against the object store, on
Spark executors, or on the driver behind the next micro-batch's read (``streaming.sink.pipeline``): each
topic-partition's in order, many topic-partitions at once on threads.

An ``OpenAction`` opens the segment, a ``PartAction`` fetches the entries its block layouts name
(``streaming.sink.entry_fetch``: re-read from the broker or the spool and checked, size and CRC-32C, against what
the source read), builds the blocks, stores them as the segment's policy says (``streaming.sink.at_rest``) and
uploads them as a numbered part, and a ``SealAction`` seals it: the commit protocol, its order and why it is
crash-safe, is ``streaming.sink.commit``.

A small segment in the clear that is opened and sealed in one micro-batch skips the upload and the Assigned
manifest: its data object is one PUT, then the seal as above (``_apply_whole``; DESIGN "Small segments in one
request").
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any, assert_never

from streamoffload.checkpoints import manifest as mf
from streamoffload.checkpoints.control_requests import record_request_status
from streamoffload.checkpoints.keyring import KeyRing
from streamoffload.checkpoints.metadata_store import MetadataStore
from streamoffload.codecs.block_frames import PartFrames
from streamoffload.codecs.positions import Position
from streamoffload.errors import StreamOffloadError
from streamoffload.storage import keys
from streamoffload.storage.base import Buffer, buffers_size
from streamoffload.storage.location import ScopedStore, StoreLocation
from streamoffload.streaming.governance.quarantine import TopicFailedError, is_topic_specific
from streamoffload.streaming.governance.rate_limits import RateLimiter, limiter_for, throttled_since
from streamoffload.streaming.handoff.actions import (
    Action,
    OpenAction,
    PartAction,
    RequestsAction,
    SealAction,
    SealReport,
    StatsAction,
)
from streamoffload.streaming.handoff.entry import EntryFetcher
from streamoffload.streaming.handoff.part_layout import (
    BlockLayout,
    block_chunks_of_part,
    checksum_records,
    decode_layouts,
    part_refs,
)
from streamoffload.streaming.runtime.faults import crash_point
from streamoffload.streaming.runtime.progress_files import TaskProgress
from streamoffload.streaming.sink.at_rest import BlockEncoding, encode_part, policy_compression_level, policy_key_id
from streamoffload.streaming.sink.commit import ReplayMismatchError, SegmentCommits, object_metadata
from streamoffload.streaming.sink.entry_fetch import CachingFetcher, PartReader, ReleasingFetcher, fetch_counts

log = logging.getLogger(__name__)


@dataclass
class SinkStats:
    """What one sink task did in a micro-batch; the driver sums its tasks' (``merge``). JSON from an executor to
    the driver (``to_json``/``from_json``): the typed reports inside are rebuilt, not left as dicts."""

    parts: int = 0
    part_bytes: int = 0
    fetch_seconds: float = 0.0
    """Time spent fetching and checking the parts' entries (the data plane's read)."""
    spooled_entries: int = 0
    """Entries the sink took from the spool; the rest it read from the broker (``broker_entries``)."""
    broker_entries: int = 0
    broker_reads: int = 0
    sealed: list[SealReport] = field(default_factory=list)
    opened: int = 0
    upload_seconds: list[float] = field(default_factory=list)
    errors: int = 0
    topics: dict[str, StatsAction] = field(default_factory=dict)
    """Per topic-partition figures from the segmenter (buffer, open segment, last position): its last
    ``StatsAction`` of the batch."""
    throttled: dict[str, dict[str, float]] = field(default_factory=dict)
    """Seconds the sink waited for the rate limits, by topic-partition and kind (``read``: its re-reads from the
    broker; ``upload``: its parts)."""

    def to_json(self) -> str:
        doc = asdict(self)
        doc["sealed"] = [seal.to_json() for seal in self.sealed]
        doc["topics"] = {topic: figures.to_json() for topic, figures in self.topics.items()}
        return json.dumps(doc)

    @classmethod
    def from_json(cls, text: str) -> SinkStats:
        doc = json.loads(text)
        doc["sealed"] = [SealReport.from_json(seal) for seal in doc.get("sealed", ())]
        doc["topics"] = {topic: StatsAction.from_json(figures) for topic, figures in doc.get("topics", {}).items()}
        return cls(**doc)

    def merge(self, other: SinkStats) -> None:
        """Add ``other``'s figures (another topic-partition's, from another thread) to these."""
        self.parts += other.parts
        self.part_bytes += other.part_bytes
        self.fetch_seconds += other.fetch_seconds
        self.spooled_entries += other.spooled_entries
        self.broker_entries += other.broker_entries
        self.broker_reads += other.broker_reads
        self.sealed.extend(other.sealed)
        self.opened += other.opened
        self.upload_seconds.extend(other.upload_seconds)
        self.errors += other.errors
        self.topics.update(other.topics)
        for topic, kinds in other.throttled.items():
            mine = self.throttled.setdefault(topic, {})
            for kind, seconds in kinds.items():
                mine[kind] = mine.get(kind, 0.0) + seconds


class ByteBudget:
    """Bytes of parts the sink's threads may hold at once: a part waits until it fits, except that a part is
    never refused when nothing else is held (so one part larger than the budget still goes, alone). Keeps the
    sink's memory at about one largest part however many threads write small ones."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self._cond = threading.Condition()

    @contextlib.contextmanager
    def hold(self, size: int) -> Iterator[None]:
        with self._cond:
            self._cond.wait_for(lambda: self.held == 0 or self.held + size <= self.limit)
            self.held += size
        try:
            yield
        finally:
            with self._cond:
                self.held -= size
                self._cond.notify_all()


PART_BUDGET = 64 << 20
"""Bytes of parts a sink task holds at once over its threads (``ByteBudget``): small parts of many
topic-partitions go together, a part as large as a default block goes alone, as it did before. A part mapped
from the spool holds none where the store writes it without a copy (``SegmentSink._held_bytes``)."""

SINK_THREADS = 32
"""Topic-partitions a sink task writes at once. Each store request waits on the store (a filesystem's group
``syncfs``, an S3 round trip) far longer than it computes, and a micro-batch of a job over many topic-partitions
seals many small segments, each a handful of requests: one at a time, a task spent most of its time waiting (the
scale bench, 100 topic-partitions: ~0.1 task s per segment). With 8, at 10,000 topic-partitions the threads still
spent 64% of their time waiting for a ``syncfs`` (each seal waits for ~5, one after the other, ~150 seals per
task and micro-batch); one ``syncfs`` serves every thread waiting at once, so more threads share each. 32 is also
the S3 store's connection pool. Memory stays bounded by ``ByteBudget``."""


def _checksum_objects(action: PartAction, part: PlannedPart) -> list[tuple[str, bytes]]:
    """The checksum records of a part's blocks, as (key, record); none for a segment opened without them."""
    if action.first_block is None:
        return []
    return [
        (keys.block_checksums_key(action.data_key, block), record)
        for block, record in checksum_records(part.blocks, action.first_block, action.offset)
    ]


WHOLE_SEGMENT_BYTES = 8 << 20
"""A segment in the clear of at most this many bytes, opened and sealed in one micro-batch, is written as one
object by one PUT (``SegmentSink._apply_whole``) rather than through a multipart upload and an Assigned manifest:
a job over many topic-partitions seals many small segments, and each multipart one costs about twice the store
requests (bench/segment_cost.py). The parts are joined in memory, so the bound is a memory bound too (8 MiB:
the size above which S3 clients switch to multipart uploads)."""


class SegmentSink:
    """Applies the segmenter's actions (``streaming.handoff.actions``): each topic-partition's in order, up to
    ``threads`` topic-partitions at once."""

    def __init__(
        self,
        scoped: ScopedStore,
        fetcher: EntryFetcher | None = None,
        *,
        threads: int = SINK_THREADS,
        part_budget: int = 0,
        limiter: RateLimiter | None = None,
        keyring: KeyRing | None = None,
        whole_segment_bytes: int = WHOLE_SEGMENT_BYTES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``fetcher`` supplies the entries the parts name (the broker, in the job). ``part_budget``: bytes of
        parts held at once over the threads (0: one part at a time, whatever its size). ``limiter``: the job's
        rate limits (``streaming.governance.rate_limits``), here the upload limit of the parts. ``keyring``: the
        key-encryption keys of encrypted segments (default: the environment's, ``checkpoints.keyring``).
        ``whole_segment_bytes``: segments up to this size opened and sealed in one batch are written as one object
        (0: every segment through a multipart upload). ``clock``: seconds, for the commit window
        (``COMMIT_WINDOW_MS``)."""
        self.limiter = limiter
        self.scoped = scoped
        self.store = scoped.store
        self.fetcher = fetcher
        self.threads = max(1, threads)
        self.budget = ByteBudget(part_budget)
        self.commits = SegmentCommits(scoped, keyring, clock)
        self.whole_segment_bytes = whole_segment_bytes

    @property
    def metadata(self) -> MetadataStore:
        return self.commits.metadata

    def apply(self, actions: Iterable[Action], progress: TaskProgress | None = None) -> SinkStats:
        """Apply a task's actions, each topic-partition's in order; topic-partitions are independent (their own
        segments, uploads and commits), so up to ``threads`` of them go at once. They are small (layouts,
        indexes, manifests: no entry bytes), so they are read ahead to find the runs of consecutive parts each
        topic-partition's read can cover.

        A topic-partition stops at its first failure, the others finish (what they wrote is what a replay
        writes again); then the failure is raised: one that is not a topic's own first (it fails the batch),
        else the first topic's as :class:`TopicFailedError` (the job sets that topic aside)."""
        actions = list(actions)
        parts = _plan_parts(actions)
        by_topic: dict[str, list[int]] = {}
        for i, action in enumerate(actions):
            by_topic.setdefault(action.topic, []).append(i)
        counts_before = fetch_counts(self.fetcher)
        throttled_before = self.limiter.throttled() if self.limiter is not None else {}
        groups = list(by_topic.values())
        if self.threads == 1 or len(groups) <= 1:
            results = [self._apply_topic(actions, group, parts, progress) for group in groups]
        else:
            with ThreadPoolExecutor(min(self.threads, len(groups)), thread_name_prefix="sink") as pool:
                results = list(pool.map(lambda group: self._apply_topic(actions, group, parts, progress), groups))
        if progress is not None:
            progress.flush()
        stats = SinkStats()
        failures: list[tuple[str, Exception]] = []
        for topic_stats, failure in results:
            stats.merge(topic_stats)
            if failure is not None:
                failures.append(failure)
        after = fetch_counts(self.fetcher)
        stats.spooled_entries, stats.broker_entries, stats.broker_reads = (
            a - b for a, b in zip(after, counts_before, strict=True)
        )
        stats.throttled = throttled_since(self.limiter, throttled_before)
        for topic, info in stats.topics.items():  # the source's read waits, as the segmenter reported them
            waited = info.read_throttled_s
            if waited > 0:
                kinds = stats.throttled.setdefault(topic, {})
                kinds["read"] = kinds.get("read", 0.0) + waited
        if failures:
            for _topic, err in failures:
                if not is_topic_specific(err):
                    raise err
            topic, err = failures[0]
            raise TopicFailedError(topic, err) from err
        return stats

    def _apply_topic(
        self,
        actions: list[Action],
        indexes: list[int],
        parts: dict[int, PlannedPart],
        progress: TaskProgress | None = None,
    ) -> tuple[SinkStats, tuple[str, Exception] | None]:
        """One topic-partition's actions, in order, with its own reader: its stats, and its failure if any; each
        part written (not one a replay skips) told to ``progress``."""
        stats = SinkStats()
        reader = PartReader(self.fetcher) if self.fetcher is not None else None
        whole = _whole_segments(actions, indexes, self.whole_segment_bytes)
        done: set[int] = set()  # the parts and seals of segments written whole
        absent: set[str] = set()  # data objects this run found missing (a store request per part saved)
        try:
            for i in indexes:
                if i in done:
                    continue
                action = actions[i]
                try:
                    segment = whole.get(i)
                    parts_before = stats.parts
                    if segment is None:
                        self._apply_one(action, stats, reader, parts.get(i), absent)
                    else:
                        action = actions[segment.seal]  # what a failure is recorded against
                        done.update(segment.parts, [segment.seal])
                        self._apply_whole(actions, segment, stats, reader, parts)
                    if progress is not None and stats.parts > parts_before:
                        for j in segment.parts if segment is not None else (i,):
                            _tell_progress(progress, action.topic, parts[j])
                except Exception as err:
                    stats.errors += 1
                    self._record_failure(action, err)
                    return stats, (action.topic, err)
            return stats, None
        finally:
            if reader is not None:
                reader.close()
                stats.fetch_seconds += reader.stats.seconds

    def _apply_one(
        self,
        action: Action,
        stats: SinkStats,
        reader: PartReader | None = None,
        part: PlannedPart | None = None,
        absent: set[str] | None = None,
    ) -> None:
        match action:
            case StatsAction():
                stats.topics[action.topic] = action
            case OpenAction():
                self.commits.open(mf.decode_manifest(action.manifest))
                crash_point("after-open")
                stats.opened += 1
            case PartAction():
                self._apply_part(action, stats, reader, part, absent)
            case SealAction():
                self._apply_seal(action, stats)
            case RequestsAction():
                self._requests_done(action.topic, action.requests, None)
            case _:
                assert_never(action)

    def _apply_part(
        self,
        action: PartAction,
        stats: SinkStats,
        reader: PartReader | None,
        part: PlannedPart | None,
        absent: set[str] | None = None,
    ) -> None:
        """Write a part, unless its data object exists (a replay of a completed segment). ``absent``: data objects
        this run of the topic-partition's actions already found missing: only the segment's own seal, later in
        the run, completes it (an old writer that completed it since fails the part: the upload is gone)."""
        data_key = action.data_key
        if absent is None or data_key not in absent:
            if self.commits.object_exists(data_key):
                return
            if absent is not None:
                absent.add(data_key)
        started = time.monotonic()
        throttled = 0.0
        upload = self.commits.upload_for(data_key, action.manifest_key)
        part = part or _plan_parts([action])[0]
        encoding = self.commits.encoding_for(data_key, action.manifest_key)
        with self.budget.hold(self._held_bytes(action, part, encoding)):
            data, frames = self._part_chunks(action, part, reader, encoding)
            if frames is not None:
                # Before the part (the seal joins them into the manifest's table); deterministic like it.
                self.store.put(keys.part_frames_key(data_key, action.part_number), frames.encode())
            self._put_checksum_records(action, part)
            size = buffers_size(data)
            if self.limiter is not None:  # the part's bytes pass when the wait ends
                throttled += self.limiter.acquire("upload", action.topic, size)
            upload.write_part(action.part_number, data)
            del data
        self._release(action.topic, part.last)
        crash_point("after-part")
        stats.upload_seconds.append(time.monotonic() - started - throttled)  # the throttle is counted apart
        stats.parts += 1
        stats.part_bytes += size

    def _apply_seal(
        self, action: SealAction, stats: SinkStats, whole_size: int | None = None, begun: float | None = None
    ) -> None:
        started = time.monotonic()
        self.commits.seal(action, whole_size, begun)
        stats.upload_seconds.append(time.monotonic() - started)
        self._requests_done(action.topic, action.requests, action.segment)
        stats.sealed.append(action.summary())

    def _apply_whole(
        self,
        actions: list[Action],
        segment: WholeSegment,
        stats: SinkStats,
        reader: PartReader | None,
        parts: dict[int, PlannedPart],
    ) -> None:
        """A small segment in the clear, opened, written and sealed in this batch, as one object: its checksum
        records, the data object in one PUT (no multipart upload, no Assigned manifest) and its index, together,
        then the seal's lease check and commit (DESIGN "Small segments in one request"). Always written, never
        skipped: a replay writes the same bytes under the same names, and a failed attempt's objects are
        overwritten or left to ``cleanup``."""
        opened = actions[segment.open]
        assert isinstance(opened, OpenAction)
        topic, data_key = opened.topic, opened.data_key
        started = time.monotonic()
        throttled = 0.0
        crash_point("after-open")
        part_actions = [_part_action(actions[i]) for i in segment.parts]
        planned = [parts.get(i) or _plan_parts([actions[i]])[0] for i in segment.parts]
        seal = actions[segment.seal]
        assert isinstance(seal, SealAction)
        with self.budget.hold(sum(action.length for action in part_actions)):
            chunks: list[Buffer] = []
            objects: list[tuple[str, bytes, Mapping[str, str] | None]] = []
            for part_action, part in zip(part_actions, planned, strict=True):
                data, _ = self._part_chunks(part_action, part, reader)
                objects.extend((key, record, None) for key, record in _checksum_objects(part_action, part))
                chunks.extend(data)
            crash_point("after-part")
            size = buffers_size(chunks)
            if size != seal.data_length:  # before anything is written under the segment's names
                raise ReplayMismatchError(
                    f"{topic}: a segment's parts built {size} bytes, its index says {seal.data_length}"
                )
            if self.limiter is not None:
                throttled += self.limiter.acquire("upload", topic, size)
            metadata = object_metadata(topic, opened.segment)
            objects.append((data_key, b"".join(chunks), metadata))
            objects.append((seal.index_key, seal.index, metadata))
            # The records, the data and the index at once: no reader finds any of them before the commit, and
            # nothing names them until then (the commit window starts here).
            begun = self.commits.clock()
            self.store.put_many(objects)
            del chunks, objects
        self.commits.forget_upload(data_key)
        self._release(topic, planned[-1].last)
        stats.opened += 1
        stats.parts += 1
        stats.part_bytes += size
        stats.upload_seconds.append(time.monotonic() - started - throttled)
        self._apply_seal(seal, stats, whole_size=size, begun=begun)

    def _put_checksum_records(self, action: PartAction, part: PlannedPart) -> None:
        """The part's blocks' checksum records: before the part and the manifest; a replay writes the same bytes
        under the same names."""
        for key, record in _checksum_objects(action, part):
            self.store.put(key, record)

    def _part_chunks(
        self,
        action: PartAction,
        part: PlannedPart,
        reader: PartReader | None,
        encoding: BlockEncoding | None = None,
    ) -> tuple[list[Buffer], PartFrames | None]:
        """The part's bytes, as buffers: its entries fetched and checked, then its blocks built as the layouts
        say (headers and padding around the fetched entries, not joined: the store writes them as they are).
        A compressed or encrypted segment's blocks are then stored as ``at_rest.encode_part`` says; with
        compression, also the part's frames (the sink records them beside the part)."""
        if reader is None:
            raise StreamOffloadError("this sink has no entry fetcher: it cannot write parts")
        topic = action.topic
        payloads = reader.take(topic, part_refs(part.blocks), part.blocks[0].after, part.run_end)
        blocks = block_chunks_of_part(action.format, part.blocks, payloads)
        if (size := sum(buffers_size(b) for b in blocks)) != action.length:
            raise ReplayMismatchError(f"{topic}: a part built {size} bytes, its layout says {action.length}")
        if encoding is None or encoding.plain:
            return [chunk for block in blocks for chunk in block], None
        return encode_part(
            encoding,
            part.blocks,
            blocks,
            payloads,
            offset=action.offset,
            min_part_size=self.store.min_part_size,
            last=action.last,
        )

    def _held_bytes(self, action: PartAction, part: PlannedPart, encoding: BlockEncoding) -> int:
        """What a part holds of the sink's byte budget: its length, but nothing when its entries are mapped from
        the spool and stored as they are by a store that does not copy them (a filesystem's ``pwritev``). Then
        the part makes no copy of them (its headers and padding aside), and with Pulsar's 64 MiB blocks a budget
        of one block would write one topic-partition's part at a time. An S3 body is a copy: it holds."""
        fetcher = self.fetcher
        if not encoding.plain or self.store.copies_parts or not isinstance(fetcher, CachingFetcher):
            return action.length
        return 0 if fetcher.holds(action.topic, part.blocks[0].after, part.last) else action.length

    def _release(self, topic: str, upto: Position) -> None:
        """The entries of ``topic`` up to ``upto`` are written: a fetcher that keeps them (the spool) may let go."""
        if isinstance(self.fetcher, ReleasingFetcher):
            self.fetcher.release(topic, upto)

    def _requests_done(self, topic: str, request_ids: Iterable[str], segment: str | None) -> None:
        for request_id in request_ids:
            record_request_status(self.scoped, request_id, "done", topic=topic, segment=segment)

    def _record_failure(self, action: Action, err: BaseException) -> None:
        if not isinstance(action, OpenAction | PartAction | SealAction):
            return
        why = f"{type(err).__name__}: {err}"
        try:
            self.commits.metadata.record_failure(action.topic, action.segment, why)
            if isinstance(action, SealAction):
                for request_id in action.requests:
                    record_request_status(self.scoped, request_id, "failed", topic=action.topic, error=why)
        except Exception:  # the store itself may be what failed; the next run retries the segment
            log.warning("could not record the failure of segment %s", action.segment, exc_info=True)


@dataclass(frozen=True)
class WholeSegment:
    """The actions (by index) of a segment written whole: its ``open``, its ``parts`` and its ``seal``."""

    open: int
    parts: tuple[int, ...]
    seal: int


def _whole_segments(actions: list[Action], indexes: list[int], limit: int) -> dict[int, WholeSegment]:
    """Of one topic-partition's actions (``indexes``, in order), the segments to write whole, by the index of
    their ``open``: opened and sealed here, neither encrypted nor compressed (their bytes are then a function of
    their layouts alone, so a replay writes the same object), of at most ``limit`` bytes."""
    found: dict[int, WholeSegment] = {}
    opened: OpenAction | None = None
    at = 0  # the index of ``opened``
    parts: list[int] = []
    size = 0
    for i in indexes:
        action = actions[i]
        if isinstance(action, OpenAction):
            manifest = mf.decode_manifest(action.manifest)
            plain = not policy_key_id(manifest) and policy_compression_level(manifest) is None
            opened, at, parts, size = (action if plain else None), i, [], 0
        elif not isinstance(action, PartAction | SealAction) or opened is None:
            continue
        elif action.segment != opened.segment:
            opened = None
        elif isinstance(action, PartAction):
            parts.append(i)
            size += action.length
            if size > limit:
                opened = None
        else:
            if parts:
                found[at] = WholeSegment(at, tuple(parts), i)
            opened = None
    return found


def _tell_progress(progress: TaskProgress, topic: str, part: PlannedPart) -> None:
    entries = [entry for block in part.blocks for entry in block.entries]
    progress.wrote(topic, part.blocks[0].after, part.last, len(entries), sum(size for _, size, _ in entries))


def _part_action(action: Action) -> PartAction:
    assert isinstance(action, PartAction), action
    return action


@dataclass
class PlannedPart:
    """A part action's block layouts, decoded once, and where the run of consecutive parts it belongs to ends."""

    blocks: list[BlockLayout]
    run_end: tuple[int, int]

    @property
    def last(self) -> tuple[int, int]:
        return (self.blocks[-1].ledger_id, self.blocks[-1].entries[-1][0])


def _plan_parts(actions: list[Action]) -> dict[int, PlannedPart]:
    """The part actions (by index), each with the last position of the run of consecutive parts of its
    topic-partition it belongs to, so one read covers the run (``PartReader``)."""
    planned: dict[int, PlannedPart] = {}
    current: dict[str, PlannedPart] = {}  # topic -> the last part of its open run
    runs: dict[int, list[PlannedPart]] = {}  # id of a run's first part -> the run
    for i, action in enumerate(actions):
        if not isinstance(action, PartAction):
            continue
        part = PlannedPart(decode_layouts(action.layouts), (0, 0))
        previous = current.get(action.topic)
        run = runs[id(previous)] if previous is not None and previous.last == part.blocks[0].after else []
        run.append(part)
        runs[id(part)] = run
        current[action.topic] = planned[i] = part
    for part in planned.values():
        part.run_end = runs[id(part)][-1].last
    return planned


_SINKS: dict[tuple[StoreLocation, str, str | None], SegmentSink] = {}


def sink_for(location: StoreLocation, fetcher_factory: Any = None, keys_file: str | None = None) -> SegmentSink:
    """One sink (and store connection, and broker fetcher) per executor process, store and source.
    ``keys_file``: the job's ``encryption.keys_file`` (the environment's keys are added to it)."""
    ident = (location, repr(fetcher_factory), keys_file)
    sink = _SINKS.get(ident)
    if sink is None:
        fetcher = fetcher_factory() if fetcher_factory is not None else None
        limiter = limiter_for(getattr(fetcher_factory, "rate_limits", None))
        keyring = KeyRing.with_file(keys_file)
        sink = _SINKS[ident] = SegmentSink(
            location.open(), fetcher, part_budget=PART_BUDGET, limiter=limiter, keyring=keyring
        )
    return sink
