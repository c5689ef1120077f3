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
filesystem, sooner than the kernel would have. :class:`FileSync` (``sync="file"``) is the per-file way, and what
platforms without ``syncfs`` (anything but Linux) get.

One :class:`GroupSync` per filesystem per process (:func:`syncer_for`), shared by every store on it; a forked
child builds its own (a lock held at ``fork`` would otherwise never be released in the child), and a store looks
its syncer up again when it finds itself in a new process.
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

SYNC_MODES = ("group", "file")
"""``group``: :class:`GroupSync` where the platform has ``syncfs`` (else per file); ``file``: :class:`FileSync`."""

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
    reports write-back errors since the descriptor last asked, so a long-lived one misses none)."""

    def __init__(self, fd: int, syncfs: _SyncFs) -> None:
        self._fd = fd
        self._syncfs = syncfs
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
        self.barrier()

    def descriptor(self, fd: int) -> None:
        self.barrier()

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
