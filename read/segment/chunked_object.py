"""Ranged access to one data object: aligned, cached chunks for random access, plain ranges for scans.

How a range is read is the store's choice (``ObjectStore.open_ranged_reader``): one held descriptor for a
filesystem store, a ranged GET otherwise. Whether the reads are remote, and so how a sequential read is
planned and read ahead, is a property of that reader, not of the store's class.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from streamoffload.codecs.errors import TruncatedError
from streamoffload.read.segment.cache import ChunkCache
from streamoffload.read.segment.errors import MissingObjectError
from streamoffload.storage.base import ObjectNotFoundError, RangedReader
from streamoffload.units import MIB

DEFAULT_READ_BUFFER_SIZE = 1 * MIB
"""Pulsar's default ``managedLedgerOffloadReadBufferSizeInBytes``."""


@dataclass
class SegmentReadStats:
    """What a handle (or a TopicReader, summed over its handles) did."""

    gets: int = 0
    """Ranged GETs issued to the store (cache hits excluded)."""
    bytes_fetched: int = 0
    readahead_chunks: int = 0
    """Ranges the read-ahead (thread or workers) had read before the reader asked for them."""
    entries: int = 0

    def add(self, other: SegmentReadStats) -> None:
        self.gets += other.gets
        self.bytes_fetched += other.bytes_fetched
        self.readahead_chunks += other.readahead_chunks
        self.entries += other.entries


class ChunkedObject:
    """Ranged reads of one data object of known length: aligned, cached chunks ``[i * size, (i + 1) * size)``
    for random access, and plain ranges for sequential scans."""

    def __init__(
        self,
        reader: RangedReader,
        length: int,
        chunk_size: int,
        cache: ChunkCache | None,
        stats: SegmentReadStats,
    ) -> None:
        self.reader = reader
        self.key = reader.key
        self.length = length
        self.size = chunk_size
        self.cache = cache
        self.stats = stats
        self.count = (length + chunk_size - 1) // chunk_size
        self._cache_prefix = (reader.store.url, reader.key, chunk_size)
        self._stats_lock = threading.Lock()

    def read_range(self, start: int, length: int) -> bytes:
        """Bytes ``[start, start + length)`` with one ranged GET; a short or missing object raises an error
        naming the key and the offset where the data ends."""
        if start < 0 or start + length > self.length:
            raise TruncatedError(
                f"read of {length} bytes at {start} is outside the {self.length}-byte data object",
                offset=min(max(start, 0), self.length),
                where=self.key,
            )
        try:
            data = self.reader.read(start, length)
        except ObjectNotFoundError:
            raise MissingObjectError(
                f"data object {self.key} disappeared while being read (deleted by retention or cleanup?)", self.key
            ) from None
        with self._stats_lock:  # read-ahead workers count too
            self.stats.gets += 1
            self.stats.bytes_fetched += len(data)
        if len(data) != length:
            raise TruncatedError(
                f"data object ends after {start + len(data)} bytes, but its index says it has {self.length}",
                offset=start + len(data),
                where=self.key,
            )
        return data

    def fetch(self, index: int, *, keep: bool = True) -> bytes:
        """Aligned chunk ``index``, from the cache or the store (then cached, if ``keep``)."""
        cache = self.cache
        ident = (*self._cache_prefix, index)
        if cache is not None:
            data = cache.get(ident)
            if data is not None:
                return data
        start = index * self.size
        data = self.read_range(start, min(self.size, self.length - start))
        if keep and cache is not None:
            cache.put(ident, data)
        return data

    @property
    def remote(self) -> bool:
        """Whether reads go over the network (the store's reader says so; see ``RangedReader.remote``)."""
        return self.reader.remote

    def cache_key(self, index: int) -> tuple[str, str, int, int]:
        """The cache key of aligned chunk ``index`` (store, object, chunk size and index)."""
        return (*self._cache_prefix, index)

    def all_cached(self, start: int, length: int) -> bool:
        """Whether every chunk holding ``[start, start + length)`` is in the cache."""
        cache = self.cache
        if cache is None or not cache.max_bytes:
            return False
        last = (start + max(length, 1) - 1) // self.size
        return all((*self._cache_prefix, i) in cache for i in range(start // self.size, last + 1))

    def close(self) -> None:
        self.reader.close()


Range = tuple[int, memoryview]
"""A range read by a sequential scan: its offset in the data object and its bytes."""
