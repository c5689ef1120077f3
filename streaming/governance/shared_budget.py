"""The job's total rate limits as one budget shared by every process of a machine (DESIGN "Rate limits").

A job-wide limit is one token bucket (``token_bucket.BucketState``) per kind whose state lives in a small file,
``<dir>/<kind>.bucket``: a process books its bytes by locking the file (``flock``), reading the state, booking and
writing it back, then sleeps the wait it was given outside the lock. So the Spark tasks of a ``local`` master (its
Python workers, the source's and the sink's) draw on one budget at the full total, whichever of them are busy:
one busy topic-partition may use all of it, eight share it. Bookings are first come, first served across the
processes, as in one bucket across threads.

The clock is the machine's monotonic clock (``time.monotonic``: on Linux one ``CLOCK_MONOTONIC`` for every process),
so a state written by one process is read in the same time by the others. The file outlives a run: a new run
finds at most ``capacity`` tokens in it, as a bucket that went idle would.

Pure apart from :class:`FileBucketStore`: :class:`SharedBucket` books through any :class:`BucketStore`, so tests
share a :class:`MemoryBucketStore` between several buckets (the processes) with a fake clock.
"""

from __future__ import annotations

import fcntl
import os
import struct
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from streamoffload.streaming.governance.token_bucket import BucketState

_RECORD = struct.Struct("<4d")  # rate, capacity, tokens, at


class BucketStore(Protocol):
    """Where a shared bucket's state lives: ``update`` reads it (``None`` before the first booking), lets
    ``change`` book on it and writes back what ``change`` returns, all under one lock that every sharer takes."""

    def update(self, change: Callable[[BucketState | None], tuple[BucketState, float]]) -> float: ...


class MemoryBucketStore:
    """A state in this process (the tests' stand-in for the file: several :class:`SharedBucket` share one)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.state: BucketState | None = None

    def update(self, change: Callable[[BucketState | None], tuple[BucketState, float]]) -> float:
        with self._lock:
            self.state, wait = change(self.state)
            return wait


class FileBucketStore:
    """The state in a 32-byte file, locked with ``flock`` across processes (and a lock across this process's
    threads, which share its descriptor). The file is opened at the first booking of each process: a Spark worker
    forked from another does not share its parent's descriptor, nor so its lock."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._pid = 0

    def _open(self) -> int:
        if self._fd is None or self._pid != os.getpid():
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
            self._pid = os.getpid()
        return self._fd

    def update(self, change: Callable[[BucketState | None], tuple[BucketState, float]]) -> float:
        with self._lock:
            fd = self._open()
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                raw = os.pread(fd, _RECORD.size, 0)
                state = BucketState(*_RECORD.unpack(raw)) if len(raw) == _RECORD.size else None
                new, wait = change(state)
                os.pwrite(fd, _RECORD.pack(new.rate, new.capacity, new.tokens, new.at), 0)
                return wait
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)


class SharedBucket:
    """A token bucket whose state is ``store``'s, shared with every other bucket on the same store. Its rate and
    capacity are the caller's at each booking (a policy edit applies from the next one, as ``set_rate``)."""

    def __init__(
        self,
        store: BucketStore,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.store = store
        self._clock = clock
        self._sleep = sleep

    def reserve(self, n: int | float, rate: float, capacity: float) -> float:
        """Book ``n`` bytes at ``rate`` bytes per second (burst ``capacity``); the seconds to wait."""
        if n <= 0 or not rate > 0:
            return 0.0

        def book(state: BucketState | None) -> tuple[BucketState, float]:
            now = self._clock()
            if state is None or state.at > now:  # new, or written before this machine's clock restarted
                state = BucketState(rate, capacity, 0.0, now)  # empty: no burst the moment a job starts
            elif state.rate != rate or state.capacity != capacity:
                state.set_rate(now, rate, capacity)
            return state, state.reserve(now, n)

        return self.store.update(book)

    def acquire(self, n: int | float, rate: float, capacity: float) -> float:
        """Book ``n`` bytes and sleep until they may pass; the seconds slept."""
        wait = self.reserve(n, rate, capacity)
        if wait > 0:
            self._sleep(wait)
        return wait


class SharedBudgets:
    """The job's totals of one machine: a :class:`SharedBucket` per kind, in ``directory``."""

    def __init__(
        self,
        directory: str | Path,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        store: Callable[[Path], BucketStore] = FileBucketStore,
    ) -> None:
        self.directory = Path(directory)
        self._clock, self._sleep, self._store = clock, sleep, store
        self._buckets: dict[str, SharedBucket] = {}
        self._lock = threading.Lock()

    def bucket(self, kind: str) -> SharedBucket:
        with self._lock:
            bucket = self._buckets.get(kind)
            if bucket is None:
                store = self._store(self.directory / f"{kind}.bucket")
                bucket = self._buckets[kind] = SharedBucket(store, clock=self._clock, sleep=self._sleep)
            return bucket
