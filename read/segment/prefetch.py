"""Read-ahead for sequential scans: one planner thread (local files read without a held descriptor) or
several ranged GETs in flight on worker threads (remote stores)."""

from __future__ import annotations

import queue
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from streamoffload.read.segment.chunked_object import ChunkedObject, Range


class Prefetcher:
    """Runs a range planner on a background thread, keeping at most ``window`` bytes of ranges ready that
    the reader has not taken yet (and at least one). Errors are handed to the reader in order.

    Ranges travel through a ``SimpleQueue`` (its blocking ``get`` is the cheapest hand-over between
    threads CPython has); the byte bound is a counter the planner waits on only when the window is full.
    """

    _END = object()

    def __init__(self, produce: Callable[[], Range | None], window: int, name: str) -> None:
        self._produce = produce
        self._window = window
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._ready_bytes = 0
        self._finished = False  # the reader took the end marker (or an error)
        self._stopped = False
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name=f"streamoffload-readahead:{name}", daemon=True)
        self._thread.start()

    @property
    def ready_bytes(self) -> int:
        return self._ready_bytes

    @property
    def window(self) -> int:
        return self._window

    def _run(self) -> None:
        cond = self._cond
        while True:
            if self._ready_bytes and self._ready_bytes >= self._window:
                with cond:
                    # At least one range is always allowed, whatever the window.
                    while not self._stopped and self._ready_bytes and self._ready_bytes >= self._window:
                        cond.wait()
            if self._stopped:
                return
            try:
                item = self._produce()
            except BaseException as exc:  # handed to the reader, which raises it where it reads
                self._queue.put(exc)
                return
            if item is None:
                self._queue.put(self._END)
                return
            with cond:
                self._ready_bytes += len(item[1])
            self._queue.put(item)

    def get(self) -> Range | None:
        """The next range, None at the end; raises the error that stopped the planner."""
        if self._finished:
            return None
        item = self._queue.get()
        if item is self._END:
            self._finished = True
            return None
        if isinstance(item, BaseException):
            self._finished = True
            raise item
        with self._cond:
            self._ready_bytes -= len(item[1])
            if not self._ready_bytes or self._ready_bytes < self._window:
                self._cond.notify()
        return item  # type: ignore[no-any-return]

    def close(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        self._thread.join()
        while not self._queue.empty():  # release the ranges nobody will read
            self._queue.get_nowait()
        self._ready_bytes = 0

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()


class ParallelPrefetcher:
    """Read-ahead for remote stores: back-to-back ranges fetched by up to ``window / read_buffer_size``
    worker threads at once (at most 8), handed to the reader in order. A remote GET is mostly waiting
    (first-byte latency), so several in flight are what makes a catch-up read fast; one thread reading
    ahead would only overlap the reader's decoding with one wait at a time."""

    MAX_WORKERS = 8

    def __init__(self, chunks: ChunkedObject, begin: int, end: int, window: int, name: str) -> None:
        self._chunks = chunks
        self._size = chunks.size
        self._pos = begin
        self._end = end
        self._window = max(window, self._size)
        self._depth = max(1, min(self.MAX_WORKERS, self._window // self._size))
        self._pending: deque[tuple[int, Future[bytes]]] = deque()
        self._pool = ThreadPoolExecutor(max_workers=self._depth, thread_name_prefix=f"streamoffload-readahead:{name}")
        self._closed = False
        self._fill()

    def _fill(self) -> None:
        while len(self._pending) < self._depth and self._pos < self._end:
            start, length = self._pos, min(self._size, self._end - self._pos)
            self._pending.append((start, self._pool.submit(self._chunks.read_range, start, length)))
            self._pos += length

    @property
    def window(self) -> int:
        return self._depth * self._size

    @property
    def ready_bytes(self) -> int:
        """Bytes fetched and not yet handed to the reader."""
        total = 0
        for _, future in list(self._pending):
            if future.done() and not future.cancelled() and future.exception() is None:
                total += len(future.result())
        return total

    def get(self) -> Range | None:
        """The next range in order, None at the end; raises the error of the GET that failed."""
        if self._closed or not self._pending:
            return None
        start, future = self._pending.popleft()
        data = future.result()  # raises the GET's error here, in order
        self._fill()
        return start, memoryview(data)

    def close(self) -> None:
        self._closed = True
        for _, future in self._pending:
            future.cancel()
        self._pending.clear()
        self._pool.shutdown(wait=True, cancel_futures=True)

    @property
    def alive(self) -> bool:
        return not self._closed
