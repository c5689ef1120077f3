"""The chunk cache: an LRU of fetched chunks, bounded in bytes, shared by every read handle given it."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass

from streamoffload.units import MIB

DEFAULT_CACHE_BYTES = 64 * MIB


@dataclass(frozen=True, slots=True)
class CacheStats:
    hits: int
    misses: int
    evictions: int
    bytes: int
    max_bytes: int
    chunks: int


class ChunkCache:
    """An LRU of fetched chunks, bounded in bytes, safe to share between handles and threads.

    Offloaded objects are immutable once written (fresh UUID names), so a chunk never goes stale.
    A chunk larger than the whole bound is not cached.
    """

    def __init__(self, max_bytes: int = DEFAULT_CACHE_BYTES) -> None:
        if max_bytes < 0:
            raise ValueError(f"cache size must be >= 0 bytes, got {max_bytes}")
        self.max_bytes = max_bytes
        self._chunks: OrderedDict[Hashable, bytes] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        self.evictions = 0

    def get(self, key: Hashable) -> bytes | None:
        with self._lock:
            data = self._chunks.get(key)
            if data is None:
                self.misses += 1
                return None
            self._chunks.move_to_end(key)
            self.hits += 1
            return data

    def put(self, key: Hashable, data: bytes) -> None:
        size = len(data)
        if size > self.max_bytes:
            return
        with self._lock:
            old = self._chunks.pop(key, None)
            if old is not None:
                self._bytes -= len(old)
            self._chunks[key] = data
            self._bytes += size
            while self._bytes > self.max_bytes:
                _, evicted = self._chunks.popitem(last=False)
                self._bytes -= len(evicted)
                self.evictions += 1

    def __contains__(self, key: Hashable) -> bool:
        """Presence only: no hit or miss is counted and the LRU order is unchanged."""
        return key in self._chunks

    def clear(self) -> None:
        with self._lock:
            self._chunks.clear()
            self._bytes = 0

    @property
    def current_bytes(self) -> int:
        return self._bytes

    def stats(self) -> CacheStats:
        with self._lock:
            return CacheStats(self.hits, self.misses, self.evictions, self._bytes, self.max_bytes, len(self._chunks))


_shared_cache: ChunkCache | None = None
_shared_cache_lock = threading.Lock()


def shared_cache() -> ChunkCache:
    """The process-wide chunk cache (``DEFAULT_CACHE_BYTES``) that readers use unless given their own."""
    global _shared_cache
    with _shared_cache_lock:
        if _shared_cache is None:
            _shared_cache = ChunkCache(DEFAULT_CACHE_BYTES)
        return _shared_cache
