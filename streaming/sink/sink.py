"""The sink: carries out the segmenter's actions against the object store, on Spark executors.

Order within a segment is the crash-safety argument: ``open`` starts the multipart upload and writes
the Assigned manifest recording its id (create-only: a replay keeps to what was written first);
``part`` fetches the entries its block layouts name (``streaming.sink.entry_fetch``: re-read from the broker
and checked, size and CRC-32C, against what the source read), builds the blocks and uploads them as a
numbered part into that upload (rewriting a part is harmless: the same entries make the same bytes); ``seal`` completes
the data object with the exact part list, writes the index, checks the writer still holds the lease,
commits the segment create-only in its place in the topic's history, and writes the Offloaded manifest,
last. A replayed micro-batch therefore converges on the same objects, a reader never sees half a
segment, and a fenced writer's commit is refused. No manifest is ever read and then overwritten.

A small segment in the clear that is opened and sealed in one micro-batch skips the upload and the Assigned
manifest: its data object is one PUT, then the seal as above (``_apply_whole``; DESIGN "Small segments in one
request").
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, assert_never
from urllib.parse import quote

from streamoffload import __version__
from streamoffload.checkpoints import manifest as mf
from streamoffload.checkpoints.control_requests import record_request_status
from streamoffload.checkpoints.keyring import (
    KeyRing,
    SegmentCipher,
    copy_encryption,
    encryption_key_id,
    segment_cipher,
    with_new_data_key,
)
from streamoffload.checkpoints.lease import COMMIT_WINDOW_MS, FencedError, check_epoch
from streamoffload.checkpoints.metadata_store import MetadataStore, delete_part_frames
from streamoffload.codecs.block_cipher import encrypt_block, stored_length
from streamoffload.codecs.block_frames import (
    CODEC_NONE,
    DEFAULT_LEVEL,
    FILLER,
    Frame,
    PartFrames,
    compress_block,
    encode_table,
    stored_size,
)
from streamoffload.codecs.entry import entry_incompressible
from streamoffload.codecs.proto.offload_manifest_pb2 import SegmentManifest
from streamoffload.codecs.topics import TopicName
from streamoffload.errors import StreamOffloadError
from streamoffload.storage import keys
from streamoffload.storage.base import Buffer, MultipartWrite, ObjectNotFoundError, buffers_size
from streamoffload.storage.keys import FORMAT_VERSION_METADATA_KEY, SUPPORTED_FORMAT_VERSION
from streamoffload.storage.location import ScopedStore, StoreLocation
from streamoffload.streaming.control.quarantine import TopicFailedError, is_topic_specific
from streamoffload.streaming.control.rate_limits import RateLimiter, limiter_for, throttled_since
from streamoffload.streaming.handoff.actions import (
    Action,
    OpenAction,
    PartAction,
    RequestsAction,
    SealAction,
    StatsAction,
)
from streamoffload.streaming.handoff.part_layout import (
    BlockLayout,
    block_chunks_of_part,
    checksum_records,
    decode_layouts,
    part_refs,
)
from streamoffload.streaming.runtime.faults import crash_point
from streamoffload.streaming.sink.entry_fetch import EntryFetcher, PartReader, fetch_counts

log = logging.getLogger(__name__)

MANAGED_LEDGER_KEY = "managedledgername"
SOFTWARE_VERSION_KEY = "streamoffloadversion"
SEGMENT_KEY = "streamoffloadsegment"


class ReplayMismatchError(StreamOffloadError):
    """A replayed seal disagrees with the data object a failed attempt already completed."""


def managed_ledger_name(topic: str) -> str:
    """Pulsar's managed-ledger name of a topic-partition: ``tenant/namespace/persistent/local-name``."""
    name = TopicName.parse(topic)
    return f"{name.tenant}/{name.namespace}/{name.domain}/{name.local_name}"


def object_metadata(topic: str, segment: str) -> dict[str, str]:
    return {
        FORMAT_VERSION_METADATA_KEY: SUPPORTED_FORMAT_VERSION,
        # S3 metadata values are ASCII: a topic with other characters is percent-encoded here.
        MANAGED_LEDGER_KEY: quote(managed_ledger_name(topic), safe="/-._~"),
        SOFTWARE_VERSION_KEY: __version__,
        SEGMENT_KEY: segment,
    }


@dataclass
class SinkStats:
    parts: int = 0
    part_bytes: int = 0
    fetch_seconds: float = 0.0
    """Time spent fetching and checking the parts' entries (the data plane's read)."""
    spooled_entries: int = 0
    """Entries the sink took from the spool; the rest it read from the broker (``broker_entries``)."""
    broker_entries: int = 0
    broker_reads: int = 0
    sealed: list[dict[str, Any]] = field(default_factory=list)
    opened: int = 0
    upload_seconds: list[float] = field(default_factory=list)
    errors: int = 0
    topics: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Per topic-partition figures from the segmenter (buffer, open segment, last position)."""
    throttled: dict[str, dict[str, float]] = field(default_factory=dict)
    """Seconds the sink waited for the rate limits, by topic-partition and kind (``read``: its re-reads from the
    broker; ``upload``: its parts)."""

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


class _Bounded:
    """A small LRU map: per-executor caches must not grow with the number of segments ever written.
    Shared by the sink's threads (one per topic-partition at a time), hence the lock."""

    def __init__(self, limit: int = 1024) -> None:
        self.limit = limit
        self._items: OrderedDict[str, Any] = OrderedDict()
        self._lock = threading.Lock()

    def remember(self, key: str, value: Any) -> None:
        with self._lock:
            self._items[key] = value
            self._items.move_to_end(key)
            while len(self._items) > self.limit:
                self._items.popitem(last=False)

    def get(self, key: str) -> Any:
        with self._lock:
            return self._items.get(key)

    def pop(self, key: str, default: Any = None) -> Any:
        with self._lock:
            return self._items.pop(key, default)

    def __contains__(self, key: str) -> bool:
        with self._lock:
            return key in self._items


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
topic-partitions go together, a part as large as a default block goes alone, as it did before."""

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


class CommitWindowError(StreamOffloadError, TimeoutError):
    """A seal whose commit would come later than ``COMMIT_WINDOW_MS`` after its first write: refused, so that what
    ``cleanup`` beside the job takes for orphans never gets a commit. A timeout of the writer, not of the topic:
    the run starts again and writes the segment again."""


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
        rate limits (``streaming.control.rate_limits``), here the upload limit of the parts. ``keyring``: the
        key-encryption keys of encrypted segments (default: the environment's, ``checkpoints.keyring``).
        ``whole_segment_bytes``: segments up to this size opened and sealed in one batch are written as one object
        (0: every segment through a multipart upload). ``clock``: seconds, for the commit window
        (``COMMIT_WINDOW_MS``)."""
        self.clock = clock
        self.limiter = limiter
        self.scoped = scoped
        self.store = scoped.store
        self.fetcher = fetcher
        self.threads = max(1, threads)
        self.budget = ByteBudget(part_budget)
        self.metadata = MetadataStore(scoped)
        self.keyring = keyring
        self.whole_segment_bytes = whole_segment_bytes
        self._uploads = _Bounded()  # data key -> the MultipartWrite its Assigned manifest recorded
        self._encodings = _Bounded()  # data key -> its BlockEncoding (cipher, compression)
        self._done = _Bounded()  # data keys whose object already exists (a replay after success)

    def apply(self, actions: Iterable[Action]) -> SinkStats:
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
            results = [self._apply_topic(actions, group, parts) for group in groups]
        else:
            with ThreadPoolExecutor(min(self.threads, len(groups)), thread_name_prefix="sink") as pool:
                results = list(pool.map(lambda group: self._apply_topic(actions, group, parts), groups))
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
            waited = float(info.get("read_throttled_s") or 0.0)
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
        self, actions: list[Action], indexes: list[int], parts: dict[int, PlannedPart]
    ) -> tuple[SinkStats, tuple[str, Exception] | None]:
        """One topic-partition's actions, in order, with its own reader: its stats, and its failure if any."""
        stats = SinkStats()
        reader = PartReader(self.fetcher) if self.fetcher is not None else None
        whole = _whole_segments(actions, indexes, self.whole_segment_bytes)
        done: set[int] = set()  # the parts and seals of segments written whole
        try:
            for i in indexes:
                if i in done:
                    continue
                action = actions[i]
                try:
                    segment = whole.get(i)
                    if segment is None:
                        self._apply_one(action, stats, reader, parts.get(i))
                    else:
                        action = actions[segment.seal]  # what a failure is recorded against
                        done.update(segment.parts, [segment.seal])
                        self._apply_whole(actions, segment, stats, reader, parts)
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
    ) -> None:
        match action:
            case StatsAction():
                stats.topics[action.topic] = action.figures()
            case OpenAction():
                self._open(mf.decode_manifest(action.manifest))
                crash_point("after-open")
                stats.opened += 1
            case PartAction():
                self._apply_part(action, stats, reader, part)
            case SealAction():
                self._apply_seal(action, stats)
            case RequestsAction():
                self._requests_done(action.topic, action.requests, None)
            case _:
                assert_never(action)

    def _apply_part(
        self, action: PartAction, stats: SinkStats, reader: PartReader | None, part: PlannedPart | None
    ) -> None:
        data_key = action.data_key
        if self._object_exists(data_key):
            return
        started = time.monotonic()
        throttled = 0.0
        upload = self._upload_for(data_key, action.manifest_key)
        part = part or _plan_parts([action])[0]
        with self.budget.hold(action.length):
            encoding = self._encoding_for(data_key, action.manifest_key)
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
        release = getattr(self.fetcher, "release", None)  # the spool: these entries are written now
        if release is not None:
            release(action.topic, part.last)
        crash_point("after-part")
        stats.upload_seconds.append(time.monotonic() - started - throttled)  # the throttle is counted apart
        stats.parts += 1
        stats.part_bytes += size

    def _apply_seal(
        self, action: SealAction, stats: SinkStats, whole_size: int | None = None, begun: float | None = None
    ) -> None:
        started = time.monotonic()
        self._seal(action, whole_size, begun)
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
            objects: list[tuple[str, Buffer, Mapping[str, str] | None]] = []
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
            begun = self.clock()
            self.store.put_many(objects)
            del chunks, objects
        self._uploads.pop(data_key, None)
        release = getattr(self.fetcher, "release", None)
        if release is not None:
            release(topic, planned[-1].last)
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
        A compressed segment's blocks are each compressed (``codecs.block_frames``), then an encrypted
        segment's each sealed (``codecs.block_cipher``) at their plaintext offsets. With compression, also the
        part's frames (the sink records them beside the part)."""
        if reader is None:
            raise StreamOffloadError("this sink has no entry fetcher: it cannot write parts")
        topic = action.topic
        payloads = reader.take(topic, part_refs(part.blocks), part.blocks[0].after, part.run_end)
        blocks = block_chunks_of_part(action.format, part.blocks, payloads)
        if (size := sum(buffers_size(b) for b in blocks)) != action.length:
            raise ReplayMismatchError(f"{topic}: a part built {size} bytes, its layout says {action.length}")
        if encoding is None or encoding.plain:
            return [chunk for block in blocks for chunk in block], None
        offset = action.offset
        stored: list[Buffer] = []
        frames: list[Frame] = []
        first = 0
        for layout, chunks in zip(part.blocks, blocks, strict=True):
            plain = b"".join(chunks)
            codec = CODEC_NONE
            body: Buffer = plain
            if encoding.level is not None:
                entries = payloads[first : first + len(layout.entries)]
                skip = all(entry_incompressible(entry) for entry in entries)
                codec, body = compress_block(plain, encoding.level, skip=skip)
            first += len(layout.entries)
            cipher = encoding.cipher
            if cipher is not None:
                body = encrypt_block(cipher.data_key, cipher.segment_id, offset, body)
            stored.append(body)
            frames.append(Frame(codec, buffers_size([body])))
            offset += layout.length
        if encoding.level is None:
            return stored, None
        filler = self.store.min_part_size - sum(f.stored_length for f in frames)
        if filler > 0 and not action.last:
            # S3 refuses a part below its minimum but the last: fill this one up; the table skips the filler.
            stored.append(FILLER * filler)
            frames[-1] = Frame(frames[-1].codec, frames[-1].stored_length, filler)
        return stored, PartFrames(tuple(frames))

    def _encoding_for(self, data_key: str, manifest_key: str) -> BlockEncoding:
        """How the segment ``data_key`` belongs to stores its blocks, from its Assigned manifest (remembered when
        this sink opened or resumed it; read otherwise)."""
        encoding = self._encodings.get(data_key)
        if encoding is not None:
            return encoding  # type: ignore[no-any-return]
        return self._remember_encoding(self._written_manifest(manifest_key))

    def _remember_encoding(self, written: SegmentManifest) -> BlockEncoding:
        cipher = segment_cipher(written, self._keys()) if encryption_key_id(written) else None
        encoding = BlockEncoding(cipher, _policy_compression_level(written))
        self._encodings.remember(written.dataKey, encoding)
        return encoding

    def _object_exists(self, key: str) -> bool:
        if key in self._done:
            return True
        if self.store.exists(key):
            self._done.remember(key, True)
            return True
        return False

    def _open(self, manifest: SegmentManifest) -> None:
        """Start the segment's multipart upload and record its id in the Assigned manifest, written
        create-only. A replay finds the manifest written first and keeps to its upload; an upload this
        attempt started in vain is aborted at once (never the one holding parts)."""
        key = self.metadata.manifest_key(manifest)
        if self.store.exists(key):
            written = self.metadata.read_manifest(key, manifest.topic)
            if written.status != mf.OFFLOADED:
                self._resume(written)
            return
        segment = str(mf.manifest_uuid(manifest))
        # No manifest, so no attempt of this segment completed: a data object under its key is what an attempt
        # written whole left before its commit (``_apply_whole``), and parts must not be skipped for it.
        self.store.delete(manifest.dataKey)
        self._done.pop(manifest.dataKey, None)
        key_id = _policy_key_id(manifest)
        if key_id:
            # A fresh data key, recorded (wrapped) in the Assigned manifest before any part is written: the
            # create-only write below makes the first attempt's key the one every replay uses.
            manifest = with_new_data_key(manifest, key_id, self._keys())
        upload = self.store.start_multipart(manifest.dataKey, object_metadata(manifest.topic, segment))
        recorded = mf.with_driver_property(manifest, mf.PROP_UPLOAD_ID, upload.upload_id)
        written = self.metadata.open_attempt(recorded)
        if mf.driver_property(written, mf.PROP_UPLOAD_ID) != upload.upload_id:
            upload.abort()
            if written.status != mf.OFFLOADED:
                self._resume(written)
            return
        self._remember_encoding(written)
        self._uploads.remember(manifest.dataKey, upload)

    def _resume(self, written: SegmentManifest) -> MultipartWrite:
        upload_id = mf.driver_property(written, mf.PROP_UPLOAD_ID)
        if not upload_id:
            raise StreamOffloadError(
                f"{written.topic}: segment {mf.manifest_uuid(written)} has no recorded upload id "
                "(written by an older version); run `streamoffload cleanup` and restart"
            )
        upload = self.store.resume_multipart(written.dataKey, upload_id)
        self._remember_encoding(written)
        self._uploads.remember(written.dataKey, upload)
        return upload

    def _keys(self) -> KeyRing:
        if self.keyring is None:
            self.keyring = KeyRing.from_env()
        return self.keyring

    def _upload_for(self, data_key: str, manifest_key: str) -> MultipartWrite:
        upload = self._uploads.get(data_key)
        if upload is not None:
            return upload
        # Another executor opened the segment: its manifest says which upload holds the parts.
        return self._resume(self._written_manifest(manifest_key))

    def _written_manifest(self, manifest_key: str) -> SegmentManifest:
        """The Assigned manifest of an open segment, as the first attempt wrote it."""
        try:
            written = self.store.get(manifest_key)
        except ObjectNotFoundError:
            raise FencedError(
                f"the manifest {manifest_key} of this open segment is gone: a newer writer recovered the topic "
                "and abandoned the segment, so this writer must stop"
            ) from None
        return mf.decode_manifest(written, where=manifest_key)

    def _seal(self, action: SealAction, whole_size: int | None = None, begun: float | None = None) -> None:
        """Complete the data object, put the index, check the lease and commit (``whole_size``: the size of the
        data object the sink has just put whole, with its index, at ``begun`` on ``clock``). The commit follows
        the seal's first write within ``COMMIT_WINDOW_MS`` or not at all (``CommitWindowError``)."""
        begun = self.clock() if begun is None else begun
        data_key = action.data_key
        topic, segment = action.topic, action.segment
        expected = action.data_length
        parts = action.part_count
        sealed = mf.decode_manifest(action.manifest)
        level = _policy_compression_level(sealed)
        if level is not None:
            # Where each stored block lies: the parts' frame records, joined into the manifest's table.
            frames = self._frame_table(sealed, parts)
            sealed = mf.with_driver_property(sealed, mf.PROP_COMPRESSION, "zstd")
            sealed = mf.with_driver_property(sealed, mf.PROP_FRAMES, encode_table(frames))
        if _policy_key_id(sealed):
            # The data key is the Assigned manifest's (the sink's, not the segmenter's): the Offloaded one keeps it.
            key = self.metadata.manifest_key(sealed)
            sealed = copy_encryption(self.metadata.read_manifest(key, sealed.topic), sealed)
            if encryption_key_id(sealed) is None:
                raise StreamOffloadError(f"{topic}: segment {segment} should be encrypted but its manifest has no key")
            expected = stored_length(expected, sealed.blockCount)
        if level is not None:
            expected = stored_size(frames)
        if whole_size is not None:
            pass  # written whole, its size checked before (_apply_whole)
        elif self._object_exists(data_key):
            size = self.store.head(data_key).size
            if size != expected:
                raise ReplayMismatchError(
                    f"{topic}: segment {segment}: data object {data_key} has {size} bytes but the replayed seal "
                    f"expects {expected}; the replay differs from the attempt that completed it"
                )
        else:
            upload = self._upload_for(data_key, self.metadata.manifest_key(sealed))
            written = upload.complete(list(range(1, parts + 1)))
            self._uploads.pop(data_key, None)
            self._done.remember(data_key, True)
            if written.size != expected:
                raise ReplayMismatchError(
                    f"{topic}: segment {segment}: completed data object {data_key} has {written.size} bytes, "
                    f"expected {expected}"
                )
        crash_point("after-complete")
        if whole_size is None:
            self.store.put(action.index_key, action.index, object_metadata(topic, segment))
        crash_point("after-index")
        # Fencing: a writer whose lease was taken over commits nothing; and the commit itself is
        # create-only in the segment's place in the topic's history, so two writers never both win.
        check_epoch(self.scoped, action.epoch)
        # `cleanup` beside the job deletes what nothing names once it is older than twice this window: a seal's
        # objects are named by its commit in time, or never.
        elapsed = self.clock() - begun
        if elapsed * 1000 > COMMIT_WINDOW_MS:
            raise CommitWindowError(
                f"{topic}: segment {segment}: its commit came {elapsed:.0f} s after its seal's first write, later "
                f"than the {COMMIT_WINDOW_MS / 1000:.0f} s cleanup beside the job allows; not committed, written again"
            )
        self.metadata.commit(sealed)
        if level is not None:
            delete_part_frames(self.store, data_key, parts)  # the manifest holds them now

    def _frame_table(self, sealed: SegmentManifest, parts: int) -> tuple[Frame, ...]:
        """The segment's frame table from its parts' frame records; on a replay after the commit (which deleted
        them), the committed manifest's."""
        topic, segment, data_key = sealed.topic, mf.manifest_uuid(sealed), sealed.dataKey
        frames: list[Frame] = []
        for n in range(1, parts + 1):
            key = keys.part_frames_key(data_key, n)
            try:
                frames.extend(PartFrames.decode(self.store.get(key), where=key).frames)
            except ObjectNotFoundError:
                committed = self._committed_frames(sealed)
                if committed is not None:
                    return committed
                raise StreamOffloadError(
                    f"{topic}: segment {segment}: the frame record {key} of part {n} is missing, so where its "
                    "compressed blocks lie is unknown; the segment is retried"
                ) from None
        if len(frames) != sealed.blockCount:
            raise ReplayMismatchError(
                f"{topic}: segment {segment}: its {parts} parts record {len(frames)} compressed blocks, "
                f"its index {sealed.blockCount}"
            )
        return tuple(frames)

    def _committed_frames(self, sealed: SegmentManifest) -> tuple[Frame, ...] | None:
        key = keys.commit_key(self.scoped.prefix, sealed.topic, sealed.ordinal)
        try:
            committed = mf.decode_manifest(self.store.get(key), where=key)
        except ObjectNotFoundError:
            return None
        if mf.manifest_uuid(committed) != mf.manifest_uuid(sealed):
            return None
        return mf.frame_table(committed)

    def _requests_done(self, topic: str, request_ids: Iterable[str], segment: str | None) -> None:
        for request_id in request_ids:
            record_request_status(self.scoped, request_id, "done", topic=topic, segment=segment)

    def _record_failure(self, action: Action, err: BaseException) -> None:
        if not isinstance(action, OpenAction | PartAction | SealAction):
            return
        why = f"{type(err).__name__}: {err}"
        try:
            self.metadata.record_failure(action.topic, action.segment, why)
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
            plain = not _policy_key_id(manifest) and _policy_compression_level(manifest) is None
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


@dataclass(frozen=True)
class BlockEncoding:
    """How a segment's blocks are stored: sealed with ``cipher`` (None: in the clear), compressed at ``level``
    (None: as they are), both from the policy its Assigned manifest recorded."""

    cipher: SegmentCipher | None = None
    level: int | None = None

    @property
    def plain(self) -> bool:
        return self.cipher is None and self.level is None


def _policy_key_id(manifest: SegmentManifest) -> str:
    """The encryption key id of the policy the segment was opened under ("" : not encrypted)."""
    return mf.policy_field(manifest, "offloadEncryptionKeyId")


def _policy_compression_level(manifest: SegmentManifest) -> int | None:
    """The zstd level of the policy the segment was opened under (None: not compressed)."""
    if mf.policy_field(manifest, "offloadCompression", "none") == "none":
        return None
    return int(mf.policy_field(manifest, "offloadCompressionLevel", str(DEFAULT_LEVEL)))


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


_SINKS: dict[tuple[StoreLocation, str], SegmentSink] = {}


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
