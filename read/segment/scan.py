"""The two ways the walk of a read handle gets bytes: random access through aligned, cached chunks
(``ChunkScan``, single-entry reads) and a forward stream of ranges (``SequentialStream``, scans)."""

from __future__ import annotations

from collections.abc import Callable

from streamoffload.codecs.blocks import ENTRY_HEADER_LENGTH
from streamoffload.codecs.errors import TruncatedError
from streamoffload.read.segment.chunked_object import ChunkedObject, Range


class ChunkScan:
    """Random access by absolute offset through aligned chunks (single-entry reads). Chunks come from the
    cache when it has them; only the chunks an entry is returned from are put into it (the chunks a walk
    merely passes through, to read entry headers, would crowd it out).

    ``cur`` holds the bytes last read, starting at offset ``cur_start``: the walk decodes entry headers from
    them directly, without a call per entry (the same holds for ``SequentialStream``)."""

    __slots__ = ("_chunks", "_cur_index", "_joined", "cur", "cur_start")

    def __init__(self, chunks: ChunkedObject) -> None:
        self._chunks = chunks
        self._cur_index = -1
        self.cur = memoryview(b"")
        self.cur_start = 0
        self._joined: dict[int, bytes] = {}  # the chunks of the last read that spanned several

    def _load(self, index: int) -> memoryview:
        if index != self._cur_index:
            if index >= self._chunks.count:
                raise TruncatedError(
                    f"read past the end of the {self._chunks.length}-byte data object",
                    offset=self._chunks.length,
                    where=self._chunks.key,
                )
            self.cur = memoryview(self._chunks.fetch(index, keep=False))
            self._cur_index = index
            self.cur_start = index * self._chunks.size
        return self.cur

    def read(self, offset: int, n: int) -> memoryview:
        """Bytes ``[offset, offset + n)``: a view of one chunk when they lie in it, else joined."""
        rel = offset - self.cur_start
        if self._cur_index < 0 or rel < 0 or rel + n > len(self.cur):
            self._load(offset // self._chunks.size)
            rel = offset - self.cur_start
        if rel + n <= len(self.cur):
            return self.cur[rel : rel + n]
        self._joined = {self._cur_index: self.cur.obj}  # type: ignore[dict-item]
        pieces = [self.cur[rel:]]
        got = len(pieces[0])
        while got < n:
            chunk = self._load(self._cur_index + 1)
            self._joined[self._cur_index] = chunk.obj  # type: ignore[assignment]
            take = min(n - got, len(chunk))
            pieces.append(chunk[:take])
            got += take
        return memoryview(b"".join(pieces))

    def keep(self, offset: int, n: int) -> None:
        """Put the chunks holding ``[offset, offset + n)`` (an entry being returned) into the cache."""
        cache = self._chunks.cache
        if cache is None or not cache.max_bytes:
            return
        size = self._chunks.size
        for index in range(offset // size, (offset + max(n, 1) - 1) // size + 1):
            data = self.cur.obj if index == self._cur_index else self._joined.get(index)
            if data is not None:
                cache.put(self._chunks.cache_key(index), data)  # type: ignore[arg-type]


class SequentialStream:
    """Sequential access for the walk, in one of two ways:

    - over ranges handed to it in order (``next_range``: a read-ahead, or a contiguous planner), joining an
      entry that crosses the end of one range with the next;
    - on demand (``next_range`` None; local files): when the walk needs bytes the current range does not
      hold, the next range is read starting exactly there, ``read_buffer_size`` long or as long as the
      entry. So a range never ends inside an entry the walk has to return: nothing is joined, block padding
      is never read (the walk jumps over it), and the only bytes read twice are the part of an entry that
      a previous range ended in. The walk parses each entry once (a planner would parse it a second time).

    Anything else (corrupt framing pointing backwards) is read directly.
    """

    __slots__ = ("_chunks", "_limit", "_next", "_stats", "_threaded", "cur", "cur_start")
    exact_fraction = 0.25
    """On demand, an entry of at least this fraction of the read buffer is read alone (measured best of
    1/8, 1/4, 1/2 and never with 64 KiB-1 MiB entries: 9% more bytes read than the object, against 35%)."""

    def __init__(
        self,
        chunks: ChunkedObject,
        next_range: Callable[[], Range | None] | None,
        *,
        threaded: bool = False,
        limit: int = 0,
    ) -> None:
        self._chunks = chunks
        self._next = next_range
        self._threaded = threaded
        self._limit = limit or chunks.length  # demand reads stop here (the end of the last block to read)
        self._stats = chunks.stats
        self.cur = memoryview(b"")
        self.cur_start = 0

    def _advance(self) -> bool:
        assert self._next is not None
        item = self._next()
        if item is None:
            return False
        if self._threaded:
            self._stats.readahead_chunks += 1
        self.cur_start, self.cur = item
        return True

    def read(self, offset: int, n: int) -> memoryview:
        rel = offset - self.cur_start
        if 0 <= rel <= len(self.cur) - n:
            return self.cur[rel : rel + n]
        if self._next is None:
            size = self._chunks.size
            # A large entry is read alone (with the header after it): what a full buffer would add after it
            # is mostly part of another entry, which would be read again.
            want = n + ENTRY_HEADER_LENGTH if n >= size * SequentialStream.exact_fraction else max(size, n)
            limit = self._limit if offset + n <= self._limit else self._chunks.length
            self.cur = memoryview(self._chunks.read_range(offset, min(want, max(limit - offset, n))))
            self.cur_start = offset
            return self.cur[:n]
        while offset >= self.cur_start + len(self.cur):
            if not self._advance():
                break
        rel = offset - self.cur_start
        if 0 <= rel <= len(self.cur) - n:
            return self.cur[rel : rel + n]
        if 0 <= rel < len(self.cur):
            # Crosses the end of this range: join it with the next ones (they follow without a gap).
            pieces = [self.cur[rel:]]
            got = len(pieces[0])
            while got < n and self._advance():
                if self.cur_start != offset + got:
                    break
                take = min(n - got, len(self.cur))
                pieces.append(self.cur[:take])
                got += take
            if got == n:
                return memoryview(b"".join(pieces))
        return memoryview(self._chunks.read_range(offset, n))

    def keep(self, offset: int, n: int) -> None:
        """Sequential scans do not fill the cache."""
