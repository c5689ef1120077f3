"""The filesystem store's group commit (``storage/fs_sync.py``): one ``syncfs`` serves every thread that waits at
once, never one that began before a thread's writes, and a failed one fails every thread it served; while few
files are made durable at once, each is fsynced by its own thread, and its error is that thread's."""

from __future__ import annotations

import errno
import os
import threading
import time
from pathlib import Path

import pytest

from streamoffload.storage import fs_sync
from streamoffload.storage.base import StorageError
from streamoffload.storage.filesystem import FilesystemStore
from streamoffload.storage.fs_sync import FileSync, GroupSync, syncer_for


class FakeSyncFs:
    """A ``syncfs`` that records, at its start, how many writes had been made, and takes a while."""

    def __init__(self, seconds: float = 0.01) -> None:
        self.seconds = seconds
        self.lock = threading.Lock()
        self.writes = 0
        self.started_after: list[int] = []
        self.fail_next: OSError | None = None

    def write(self) -> int:
        with self.lock:
            self.writes += 1
            return self.writes

    def __call__(self, fd: int) -> None:
        with self.lock:
            self.started_after.append(self.writes)
            error, self.fail_next = self.fail_next, None
        time.sleep(self.seconds)
        if error is not None:
            raise error


def test_a_barrier_returns_only_after_a_syncfs_that_began_after_its_write() -> None:
    fake = FakeSyncFs()
    group = GroupSync(-1, fake)
    covered: list[bool] = []
    errors: list[BaseException] = []

    def writer() -> None:
        try:
            for _ in range(20):
                mine = fake.write()
                group.barrier()
                covered.append(any(after >= mine for after in fake.started_after))
        except BaseException as err:  # pragma: no cover - reported below
            errors.append(err)

    threads = [threading.Thread(target=writer) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors
    assert len(covered) == 160 and all(covered)
    # Grouped: far fewer syncfs calls than barriers (each round serves the threads that waited meanwhile).
    assert group.rounds == len(fake.started_after) < 100


def test_one_thread_alone_gets_one_syncfs_per_barrier() -> None:
    fake = FakeSyncFs(0)
    group = GroupSync(-1, fake)
    for _ in range(3):
        group.barrier()
    assert group.rounds == 3


def test_a_failed_syncfs_fails_every_thread_it_served_and_the_next_round_is_clean() -> None:
    fake = FakeSyncFs(0.05)
    group = GroupSync(-1, fake)
    fake.fail_next = OSError(errno.EIO, "Input/output error")
    outcomes: list[str] = []

    def waiter() -> None:
        try:
            group.barrier()
            outcomes.append("ok")
        except OSError as err:
            outcomes.append(f"errno {err.errno}")

    first = threading.Thread(target=waiter)
    first.start()
    deadline = time.monotonic() + 10
    while not fake.started_after:  # the failing round has begun: the next three wait for a round of their own
        assert time.monotonic() < deadline, "the first barrier never called syncfs"
        time.sleep(0.001)
    others = [threading.Thread(target=waiter) for _ in range(3)]
    for t in others:
        t.start()
    for t in [first, *others]:
        t.join(10)
    assert outcomes[0] == f"errno {errno.EIO}"
    assert outcomes[1:] == ["ok"] * 3
    group.barrier()  # and later barriers are not failed by an old round


class SlowFsync:
    """An ``fsync`` per file that records its files, and how many ran at once at most."""

    def __init__(self, seconds: float = 0.0, fail: object = None) -> None:
        self.seconds = seconds
        self.fail = fail
        self.lock = threading.Lock()
        self.files: list[object] = []
        self.running = self.most = 0

    def __call__(self, file: Path | int) -> None:
        with self.lock:
            self.files.append(file)
            self.running += 1
            self.most = max(self.most, self.running)
        try:
            time.sleep(self.seconds)
            if file == self.fail:
                raise OSError(errno.EIO, "Input/output error")
        finally:
            with self.lock:
                self.running -= 1


def test_a_few_files_at_once_are_fsynced_each_and_no_syncfs_runs() -> None:
    fake, each = FakeSyncFs(0), SlowFsync()
    group = GroupSync(-1, fake, each, min_files=8)
    group.paths([Path("a"), Path("b")])
    group.descriptor(5)
    assert each.files == [Path("a"), Path("b"), 5]
    assert group.rounds == 0 and group.direct == 3
    group.paths([Path(str(i)) for i in range(8)])  # as many as min_files in one call: one syncfs instead
    assert group.rounds == 1 and group.direct == 3 and len(each.files) == 3


def test_beyond_min_files_at_once_a_thread_waits_for_a_syncfs_instead() -> None:
    release = threading.Event()
    each = SlowFsync()
    fake = FakeSyncFs(0)

    def held(file: Path | int) -> None:
        each(file)
        release.wait(30)

    group = GroupSync(-1, fake, held, min_files=3)
    first = [threading.Thread(target=group.descriptor, args=(i,)) for i in (1, 2)]
    for t in first:
        t.start()
    deadline = time.monotonic() + 10
    while len(each.files) < 2:  # two files being fsynced one by one, held there
        assert time.monotonic() < deadline, "the first two threads never fsynced their files"
        time.sleep(0.001)
    group.descriptor(3)  # a third at once would make min_files: it is served by a syncfs, not held
    assert group.rounds == 1 and sorted(each.files) == [1, 2]  # type: ignore[type-var]
    release.set()
    for t in first:
        t.join(10)
    assert group.direct == 2
    group.descriptor(4)  # alone again: its own fsync
    assert group.rounds == 1 and group.direct == 3


def test_an_fsync_error_reaches_the_thread_whose_file_it_was() -> None:
    each = SlowFsync(fail=Path("bad"))
    group = GroupSync(-1, FakeSyncFs(0), each)
    with pytest.raises(OSError, match="Input/output error"):
        group.paths([Path("ok"), Path("bad")])
    group.paths([Path("fine")])  # the next caller is not failed by it
    assert each.files == [Path("ok"), Path("bad"), Path("fine")] and group.rounds == 0


def test_syncer_for_per_file_and_unknown_modes(tmp_path: Path) -> None:
    assert isinstance(syncer_for(tmp_path, "file"), FileSync)
    with pytest.raises(ValueError, match="sync mode 'fast'"):
        syncer_for(tmp_path, "fast")
    with pytest.raises(StorageError, match="sync 'fast' is not one of group, file"):
        FilesystemStore(tmp_path / "store", sync="fast")


@pytest.mark.skipif(fs_sync._SYNCFS is None, reason="no syncfs on this platform")
def test_stores_on_one_filesystem_share_one_group_and_a_fork_gets_its_own(tmp_path: Path) -> None:
    a, b = FilesystemStore(tmp_path / "a"), FilesystemStore(tmp_path / "b")
    assert isinstance(a._syncer(), GroupSync)
    assert a._syncer() is b._syncer()
    parent_group = a._syncer()
    before = parent_group.direct
    a.put("k", b"v")
    assert a._syncer().direct > before, "a put made durable by an fsync of its own: nothing else waited"
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe
        ok = a._syncer() is not parent_group and a._syncer().direct == 0
        a.put("child", b"c")
        os.write(write, b"1" if ok and a.get("child") == b"c" else b"0")
        os._exit(0)
    os.close(write)
    assert os.read(read, 1) == b"1", "the child built its own group and wrote through it"
    os.waitpid(pid, 0)
    os.close(read)
    assert a.get("child") == b"c"
