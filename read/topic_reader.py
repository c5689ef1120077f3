"""``TopicReader``: a topic-partition's offloaded history read back in one call, across segments, ledgers
and formats (v1 and v2 objects side by side), the segments found through the offload metadata.

It opens one ``read.segment.SegmentReadHandle`` per segment and keeps the latest open (LRU), so offsets
learned while reading are reused by later reads; all share one ``ChunkCache``."""

from __future__ import annotations

import bisect
from collections import OrderedDict
from collections.abc import Iterator
from typing import TYPE_CHECKING

from streamoffload.checkpoints.keyring import KeyRing
from streamoffload.checkpoints.metadata_store import CorruptManifest, MetadataStore
from streamoffload.codecs.positions import MAX_ID, Position
from streamoffload.read.segment import (
    DEFAULT_READ_BUFFER_SIZE,
    ChunkCache,
    EntryNotFoundError,
    ManifestMismatchError,
    MissingObjectError,
    OffloadedEntry,
    SegmentKeys,
    SegmentReadHandle,
    SegmentReadStats,
    TopicNotOffloadedError,
    shared_cache,
)
from streamoffload.storage.location import ScopedStore

if TYPE_CHECKING:
    from streamoffload.codecs.proto.offload_manifest_pb2 import SegmentManifest
    from streamoffload.codecs.topics import TopicName


def parse_position(text: str) -> Position:
    """``LEDGER:ENTRY`` as a position tuple."""
    ledger, sep, entry = text.partition(":")
    try:
        if not sep:
            raise ValueError
        position = (int(ledger), int(entry))
    except ValueError:
        raise ValueError(f"{text!r} is not a position LEDGER:ENTRY (two integers)") from None
    if not (0 <= position[0] <= MAX_ID and 0 <= position[1] <= MAX_ID):
        raise ValueError(f"position {text!r} is out of range (ids are 0..2^63-1)")
    return position


def _segment_holding(segments: list[SegmentManifest], position: Position) -> SegmentManifest | None:
    starts = [(m.startLedgerId, m.startEntryId) for m in segments]
    i = bisect.bisect_right(starts, position) - 1
    if i < 0 or (segments[i].endLedgerId, segments[i].endEntryId) < position:
        return None
    return segments[i]


class TopicReader:
    """Reads offloaded entries of topic-partitions from a scoped store (under its key prefix), across segments,
    ledgers and formats. Keeps up to ``max_open_segments`` handles open (LRU), so offsets learned while
    reading are reused by later reads; all share one ``ChunkCache``."""

    def __init__(
        self,
        scoped: ScopedStore,
        *,
        read_buffer_size: int = DEFAULT_READ_BUFFER_SIZE,
        cache: ChunkCache | None = None,
        readahead: bool | None = None,
        readahead_bytes: int | None = None,
        max_open_segments: int = 16,
        check_metadata: bool = True,
        local_files: bool = True,
        verify_checksums: bool = True,
        keyring: KeyRing | None = None,
    ) -> None:
        self.scoped = scoped
        self.keyring = keyring
        self.store = scoped.store
        self.metadata = MetadataStore(scoped)
        self.read_buffer_size = read_buffer_size
        self.cache = cache if cache is not None else shared_cache()
        self.readahead = readahead
        self.readahead_bytes = readahead_bytes
        self.check_metadata = check_metadata
        self.local_files = local_files
        self.verify_checksums = verify_checksums
        self.max_open_segments = max(1, max_open_segments)
        self._handles: OrderedDict[str, SegmentReadHandle] = OrderedDict()
        self._closed_stats = SegmentReadStats()
        # Offloaded segments per topic, for single-entry reads: listing and fetching every manifest per
        # read would cost more than the read. Refreshed when a position is not in the cached list.
        self._known_segments: dict[str, list[SegmentManifest]] = {}

    # -- segments ---------------------------------------------------------------------------------------

    def segments(
        self, topic: TopicName | str, start: Position | None = None, end: Position | None = None
    ) -> list[SegmentManifest]:
        """Offloaded segments of ``topic`` holding any position in ``[start, end]``; TopicNotOffloadedError if
        the topic has none at all."""
        found = self.metadata.segments_for_range(topic, start, end)
        if start is None and end is None:
            self._known_segments[str(topic)] = found  # the full list: single-entry reads use it
        if found:
            return found
        corrupt: list[CorruptManifest] = []
        if self.metadata.offloaded_segments(topic, corrupt):
            return found
        if corrupt:  # manifests there, none usable: they are the answer, not the other topics
            shown = "; ".join(c.error for c in corrupt[:3]) + ("; ..." if len(corrupt) > 3 else "")
            raise TopicNotOffloadedError(
                f"no readable offloaded segments for topic {topic} in {self.scoped.describe()}: "
                f"{len(corrupt)} manifest{'s' if len(corrupt) > 1 else ''} cannot be used: {shown}"
            )
        known = self.metadata.topics()
        shown = ", ".join(str(t) for t in known[:10]) + (", ..." if len(known) > 10 else "")
        raise TopicNotOffloadedError(
            f"no offloaded segments for topic {topic} in {self.scoped.describe()}"
            + (f" (topics with offloaded data: {shown})" if known else " (no topic has offloaded data there)")
        )

    def open_segment(self, segment: SegmentManifest | SegmentKeys) -> SegmentReadHandle:
        """A handle on one segment (reused while it stays among the ``max_open_segments`` latest)."""
        ident = segment.data_key if isinstance(segment, SegmentKeys) else segment.dataKey
        handle = self._handles.get(ident)
        if handle is not None:
            self._handles.move_to_end(ident)
            return handle
        handle = SegmentReadHandle.open(
            self.store,
            segment,
            read_buffer_size=self.read_buffer_size,
            cache=self.cache,
            readahead=self.readahead,
            readahead_bytes=self.readahead_bytes,
            check_metadata=self.check_metadata,
            local_files=self.local_files,
            verify_checksums=self.verify_checksums,
            keyring=self.keyring,
        )
        self._handles[ident] = handle
        while len(self._handles) > self.max_open_segments:
            _, old = self._handles.popitem(last=False)
            self._retire(old)
        return handle

    # -- reading ----------------------------------------------------------------------------------------

    def read(
        self, topic: TopicName | str, start: Position | None = None, end: Position | None = None
    ) -> Iterator[OffloadedEntry]:
        """Every offloaded entry of ``topic`` with a position in ``[start, end]`` (inclusive; None = open),
        in position order, across all its segments. Raises TopicNotOffloadedError for a topic without any."""
        segments = self.segments(topic, start, end)
        return self._read_segments(segments, start, end)

    def _read_segments(
        self, segments: list[SegmentManifest], start: Position | None, end: Position | None
    ) -> Iterator[OffloadedEntry]:
        last: Position | None = None
        for manifest in segments:
            handle = self.open_segment(manifest)
            iterator = handle.read_range(start, end)
            try:
                entry = next(iterator, None)
                if entry is None:
                    continue
                # Segments must follow each other (the metadata store skips overlapping ones; this guards
                # the objects): checked once per segment, not per entry.
                if last is not None and entry.position <= last:
                    raise ManifestMismatchError(
                        f"segment {handle.data_key} holds entry {entry.ledger_id}:{entry.entry_id}, which does "
                        f"not follow the previous segment's last entry {last[0]}:{last[1]} (overlapping segments)",
                        where=handle.data_key,
                    )
                yield entry
                for entry in iterator:
                    yield entry
                last = entry.position
            finally:
                close = getattr(iterator, "close", None)
                if close is not None:
                    close()

    def read_entry(self, topic: TopicName | str, position: Position) -> OffloadedEntry:
        """One entry by position; EntryNotFoundError if no offloaded segment holds it. The topic's segment
        list is cached between calls and refreshed when it does not cover ``position``."""
        name = str(topic)
        cached = self._known_segments.get(name)
        segment = _segment_holding(cached, position) if cached is not None else None
        if segment is None:
            cached = self._known_segments[name] = self.segments(topic)
            segment = _segment_holding(cached, position)
        if segment is None:
            raise EntryNotFoundError(
                f"entry {position[0]}:{position[1]} of {topic} is not offloaded ({self._coverage(topic)})"
            )
        try:
            handle = self.open_segment(segment)
        except MissingObjectError:
            # Deleted since it was listed (retention): forget the list; the caller sees the error.
            self._known_segments.pop(name, None)
            raise
        return handle.read_entry(*position)

    def read_objects(
        self,
        data_key: str,
        index_key: str | None = None,
        start: Position | None = None,
        end: Position | None = None,
        *,
        ledger_id: int | None = None,
    ) -> Iterator[OffloadedEntry]:
        """Entries of one segment named by its object keys (no metadata needed). ``index_key`` defaults to
        ``data_key + "-index"``; ``ledger_id`` is needed for a v1 object not named ``...-ledger-<id>``."""
        keys = SegmentKeys(data_key, index_key or data_key + "-index", ledger_id)
        return self.open_segment(keys).read_range(start, end)

    def _coverage(self, topic: TopicName | str) -> str:
        segments = self.metadata.offloaded_segments(topic)
        if not segments:
            return "the topic has no offloaded segments"
        spans = [f"{s.startLedgerId}:{s.startEntryId}..{s.endLedgerId}:{s.endEntryId}" for s in segments]
        shown = ", ".join(spans[:8]) + (f", ... ({len(spans)} segments)" if len(spans) > 8 else "")
        return f"offloaded ranges: {shown}"

    def coverage(self, topic: TopicName | str) -> str:
        """A human-readable list of the topic's offloaded position ranges (for error messages)."""
        return self._coverage(topic)

    # -- stats and lifecycle ----------------------------------------------------------------------------

    @property
    def stats(self) -> SegmentReadStats:
        total = SegmentReadStats()
        total.add(self._closed_stats)
        for handle in self._handles.values():
            total.add(handle.stats)
        return total

    @property
    def readahead_threads(self) -> int:
        return sum(h.readahead_threads for h in self._handles.values())

    def _retire(self, handle: SegmentReadHandle) -> None:
        handle.close()
        self._closed_stats.add(handle.stats)

    def close(self) -> None:
        while self._handles:
            _, handle = self._handles.popitem(last=False)
            self._retire(handle)

    def __enter__(self) -> TopicReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
