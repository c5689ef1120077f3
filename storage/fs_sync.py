"""Making a filesystem store's writes durable: per file, or one ``syncfs(2)`` for every thread waiting at once.

A filesystem store makes each write durable before the next step that depends on it (the bytes before the
rename, the rename before the commit that refers to it). With one ``fsync`` per file, a seal of a small segment
costs about ten of them, and on ext4 each is a journal commit of its own: the sink's threads then queue on the
journal (bench/README, "Issue 24, session 39": ~0.2 s of a 1.5 s micro-batch at 1,000 topic-partitions).

:class:`GroupSync` is a group commit instead. A thread that needs its writes durable waits for a ``syncfs`` that
starts after it asked; one waiting thread runs it, for itself and every thread that asked in the meantime. A
``syncfs`` writes back everything dirty on the filesystem and commits the journal once, so a burst of seals costs a
few of them instead of thousands of ``fsync``\\ s. Durability is the same: what a thread wrote before asking is on
disk when it returns, and a write-back error (reported by ``syncfs`` since Linux 5.8, for the whole filesystem)
fails every thread that round served. The price: it also writes back other programs' dirty data on the same
filesystem, and the job's own, such as the spool of a large backlog (scratch, never needed on disk). So while
fewer than :data:`SYNCFS_MIN_FILES` files are being made durable at once, each thread fsyncs its own instead.
:class:`FileSync` (``sync="file"``) is the per-file way alone, and what platforms without ``syncfs`` (anything but
Linux) get.

One :class:`GroupSync` per filesystem per process (:func:`syncer_for`), shared by every store on it; a forked
child builds its own (a lock held at ``fork`` would otherwise never be released in the child), and a store looks
its syncer up again when it finds itself in a new process.
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Protocol

SYNC_MODES = ("group", "file")
"""``group``: :class:`GroupSync` where the platform has ``syncfs`` (else per file); ``file``: :class:`FileSync`."""

SYNCFS_MIN_FILES = 8
"""While fewer files than this are being made durable at once, each is fsynced by its thread; beyond, threads wait
for a ``syncfs``. The sink of a drain over 4 topic-partitions makes 1-4 files durable at a time: there ``syncfs``
also wrote back the spool, 322 rounds taking 1.61 s of the sink's 1.8 s of writes (600 MB; bench/README,
"offload"). At 1,000 topic-partitions dozens wait at once, and ``syncfs`` keeps their seals off the journal's
queue."""

_FAILED_ROUNDS_KEPT = 64


class Syncer(Protocol):
    def paths(self, paths: Iterable[Path]) -> None:
        """``paths`` (files, and directories whose entries changed) durable when this returns."""

    def descriptor(self, fd: int) -> None:
        """What was written through ``fd`` durable when this returns."""


class FileSync:
    """One ``fsync`` per file or directory."""

    def paths(self, paths: Iterable[Path]) -> None:
        for path in paths:
            fsync_path(path)

    def descriptor(self, fd: int) -> None:
        os.fsync(fd)


class GroupSync:
    """Group commit over ``syncfs`` of the filesystem that holds ``fd`` (an open directory, kept open: ``syncfs``
    reports write-back errors since the descriptor last asked, so a long-lived one misses none), and an ``fsync``
    per file (``sync_one``: a path or a descriptor) while fewer than ``min_files`` are being made durable."""

    def __init__(
        self,
        fd: int,
        syncfs: _SyncFs,
        sync_one: Callable[[Path | int], None] | None = None,
        min_files: int = SYNCFS_MIN_FILES,
    ) -> None:
        self._fd = fd
        self._syncfs = syncfs
        self._sync_one = sync_one or _sync_one
        self._min_files = min_files
        self._direct = 0  # files being fsynced one by one now, by the threads that wrote them
        self.direct = 0
        """Files fsynced one by one (for tests and benches)."""
        self._cond = threading.Condition(threading.Lock())
        self._started = 0  # rounds begun
        self._done = 0  # rounds finished (in order: one runs at a time)
        self._running = False
        self._failed: dict[int, OSError] = {}
        self.rounds = 0
        """``syncfs`` calls made (for tests and benches)."""

    def close(self) -> None:
        os.close(self._fd)

    def paths(self, paths: Iterable[Path]) -> None:
        self._files(list(paths))

    def descriptor(self, fd: int) -> None:
        self._files([fd])

    def _files(self, files: Sequence[Path | int]) -> None:
        """``files`` durable: an ``fsync`` each while fewer than ``min_files`` are being fsynced so (this call's
        included), else a ``syncfs`` round (``barrier``)."""
        with self._cond:
            direct = self._direct + len(files) < self._min_files
            if direct:
                self._direct += len(files)
        if not direct:
            self.barrier()
            return
        try:
            for file in files:
                self._sync_one(file)
        finally:
            with self._cond:
                self._direct -= len(files)
                self.direct += len(files)

    def barrier(self) -> None:
        """Return once a ``syncfs`` that began after this call has finished; raise its error if it failed."""
        with self._cond:
            need = self._started + 1  # a round already running may have begun before our writes
            while self._done < need:
                if self._running:
                    self._cond.wait()
                    continue
                self._running = True
                self._started += 1
                this = self._started
                self._cond.release()
                error: OSError | None = None
                try:
                    self._syncfs(self._fd)
                except OSError as err:
                    error = err
                finally:
                    self._cond.acquire()
                    self._running = False
                    self._done = this
                    self.rounds += 1
                    if error is not None:
                        self._failed[this] = error
                        for old in sorted(self._failed)[:-_FAILED_ROUNDS_KEPT]:
                            del self._failed[old]
                    self._cond.notify_all()
            # Rounds from ``need`` on all began after our writes; if one failed, its write-back may have lost them.
            for served, error in self._failed.items():
                if served >= need:
                    raise OSError(error.errno, f"syncfs: {error.strerror}")


def _sync_one(file: Path | int) -> None:
    if isinstance(file, int):
        os.fsync(file)
    else:
        fsync_path(file)


class _SyncFs(Protocol):
    def __call__(self, fd: int) -> None: ...


def _libc_syncfs() -> _SyncFs | None:
    """``syncfs(2)`` through the C library, or None where there is none (the call releases the GIL)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        function = libc.syncfs
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int]
    function.restype = ctypes.c_int

    def syncfs(fd: int) -> None:
        if function(fd) != 0:
            code = ctypes.get_errno()
            raise OSError(code, os.strerror(code))

    return syncfs


_SYNCFS = _libc_syncfs() if os.name == "posix" and hasattr(os, "O_DIRECTORY") else None
_LOCK = threading.Lock()
_GROUPS: dict[int, GroupSync] = {}


def _forget_after_fork() -> None:
    """A forked child builds its own groups: the parent's locks may have been held by a thread the child lacks."""
    global _LOCK
    _LOCK = threading.Lock()
    for group in _GROUPS.values():
        group.close()
    _GROUPS.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)


def syncer_for(root: Path, mode: str) -> Syncer:
    """How a store at ``root`` makes writes durable: ``mode`` is one of :data:`SYNC_MODES`."""
    if mode not in SYNC_MODES:
        raise ValueError(f"sync mode {mode!r}: use one of {', '.join(SYNC_MODES)}")
    if mode == "file" or _SYNCFS is None:
        return FileSync()
    device = os.stat(root).st_dev
    with _LOCK:
        group = _GROUPS.get(device)
        if group is None:
            fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            group = _GROUPS[device] = GroupSync(fd, _SYNCFS)
        return group


def fsync_path(path: Path, flags: int = 0) -> None:
    """fsync a file (or, with ``os.O_DIRECTORY``, a directory) by its name."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
