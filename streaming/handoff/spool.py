"""The executor-local spool: the source tasks keep the bytes they read, so the sink need not read them again.

In the offload job the query carries positions; the sink needs the bytes. Where the sink runs on the
machine where the source ran (always in ``local[n]``), the source task writes each range's entries to a
spool file as it reads them, and the sink's :class:`SpoolFetcher` takes them from there, falling back to
the broker (``entry_fetch.BrokerFetcher``) for whatever no spool file holds. The bytes are checked like
any other read (size and CRC-32C against the query's positions, ``entry_fetch.match``), so a torn or stale
spool file can cost a broker read, never a wrong byte.

Layout: ``<root>/<sha256(topic)[:32]>/<a>-<b>-<c>-<d>.spool`` for the source range ``(a:b, c:d]`` (the
source's exact range; every entry of it is in the file), records ``i64 ledgerId, i64 entryId, u32 n, n
bytes``. A file is written under a temporary name and renamed when the range is complete, so a reader sees
whole files only. Files and directories are private (0600 / 0700). Bounded: a range is spooled only while
the spool's files stay under ``max_bytes`` (else the sink reads it from the broker). The sink removes a
topic-partition's files once it has written parts past their end (:meth:`SpoolFetcher.release`); the job
removes an earlier run's spool when a run starts.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import mmap
import os
import struct
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from streamoffload.codecs.positions import Position
from streamoffload.storage.base import Buffer
from streamoffload.streaming.errors import StreamingError
from streamoffload.streaming.handoff.entry import EntryFetcher

log = logging.getLogger(__name__)

_RECORD = struct.Struct(">qqI")
RECORD_HEADER_BYTES = _RECORD.size
"""A spooled entry's bytes beyond its own (``run --once``'s progress takes them off a spool file's size)."""
FILE_MODE = 0o600
DIR_MODE = 0o700
SUFFIX = ".spool"


def topic_dir(root: str | Path, topic: str) -> Path:
    return Path(root) / hashlib.sha256(topic.encode()).hexdigest()[:32]


class _SpoolUsage:
    """The spool's size as this process last counted it, plus what this process spooled since: a source task
    counts the spool's files before each range, and at a thousand topic-partitions a count is thousands of
    ``stat`` calls (15% of a source task's time at 100). Counted again when the figure is older than
    ``max_age_s`` or reaches half the bound: the bound holds unless other tasks spool more than half of it
    within ``max_age_s`` (1 GiB in a second by default)."""

    def __init__(self, max_age_s: float = 1.0) -> None:
        self.max_age_s = max_age_s
        self._counted: dict[str, tuple[float, int]] = {}
        self._lock = threading.Lock()

    def room(self, root: str | Path, max_bytes: int) -> int:
        key = os.fspath(root)
        now = time.monotonic()
        with self._lock:
            at, size = self._counted.get(key, (float("-inf"), 0))
            if now - at > self.max_age_s or size * 2 >= max_bytes:
                size = spool_bytes(root)
                self._counted[key] = (now, size)
            return max_bytes - size

    def added(self, root: str | Path, size: int) -> None:
        with self._lock:
            key = os.fspath(root)
            if key in self._counted:
                at, total = self._counted[key]
                self._counted[key] = (at, total + size)


_USAGE = _SpoolUsage()


def spool_bytes(root: str | Path) -> int:
    """Bytes in the spool's files (finished and in progress)."""
    total = 0
    with contextlib.suppress(FileNotFoundError):
        for sub in os.scandir(root):
            if sub.is_dir():
                with contextlib.suppress(FileNotFoundError):
                    for f in os.scandir(sub.path):
                        with contextlib.suppress(FileNotFoundError):
                            total += f.stat().st_size
    return total


@dataclass(frozen=True)
class SpoolFile:
    path: Path
    start: Position
    """The range is ``(start, end]``."""
    end: Position

    @classmethod
    def parse(cls, path: Path) -> SpoolFile | None:
        if not path.name.endswith(SUFFIX):
            return None
        try:
            a, b, c, d = (int(x) for x in path.name[: -len(SUFFIX)].split("_"))
        except ValueError:
            return None
        return cls(path, (a, b), (c, d))


def _name(start: Position, end: Position) -> str:
    return f"{start[0]}_{start[1]}_{end[0]}_{end[1]}{SUFFIX}"


def _write_all(fd: int, head: bytes, data: bytes | bytearray) -> None:
    written = os.writev(fd, [head, data])
    if written < len(head) + len(data):  # a short write (a signal, a nearly full disk): finish plainly
        rest = memoryview(head + data)[written:]
        while rest:
            rest = rest[os.write(fd, rest) :]


class SpoolWriter:
    """Spools one source range ``(start, end]`` as the source task reads it; gives up (removing what it
    wrote) when the spool would pass ``max_bytes``."""

    def __init__(self, root: str, topic: str, start: Position, end: Position, max_bytes: int) -> None:
        self.root = root
        self.directory = topic_dir(root, topic)
        self.start, self.end = start, end
        self.max_bytes = max_bytes
        self._file: Any = None
        self._tmp: Path | None = None
        self._room = 0
        self.written = 0
        try:
            room = _USAGE.room(root, max_bytes)
            if room <= 0:
                return
            self._tmp = self.directory / f".{_name(start, end)}.{os.getpid()}.tmp"
            fd = self._create()
            # Unbuffered: each entry is one writev of its record header and its bytes, with no copy into a
            # Python buffer first (entries are ~100 KiB; the copy was a pass over every spooled byte).
            self._file = open(fd, "wb", buffering=0)  # noqa: SIM115 (closed in finish/abandon)
            self._room = room
        except OSError as err:
            log.warning("spool %s: not spooling (%s); the sink reads the range from the broker", root, err)
            self._abandon()

    def _create(self) -> int:
        """Open the temporary file, making the topic-partition's directory first if it is missing. A sink that
        released the directory's last file removes it (``SpoolFetcher.release``), possibly between our
        ``mkdir`` and our ``open``: then it is made again, once more."""
        assert self._tmp is not None
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
        for attempt in range(3):
            try:
                return os.open(self._tmp, flags, FILE_MODE)
            except FileNotFoundError:
                if attempt == 2:
                    raise
                Path(self.root).mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
                with contextlib.suppress(FileExistsError):
                    self.directory.mkdir(mode=DIR_MODE)
        raise AssertionError("unreachable")

    @property
    def active(self) -> bool:
        return self._file is not None

    def add(self, ledger_id: int, entry_id: int, data: bytes | bytearray) -> None:
        if self._file is None:
            return
        size = _RECORD.size + len(data)
        if self.written + size > self._room:
            self._abandon()  # over the bound: this range is read from the broker again
            return
        try:
            _write_all(self._file.fileno(), _RECORD.pack(ledger_id, entry_id, len(data)), data)
            self.written += size
        except OSError as err:
            log.warning("spool: writing %s failed (%s); the sink reads the range from the broker", self._tmp, err)
            self._abandon()

    def finish(self) -> None:
        """The whole range was read: publish the file (a rename, so readers see whole files only)."""
        if self._file is None or self._tmp is None:
            return
        try:
            self._file.close()
            self._file = None
            os.replace(self._tmp, self.directory / _name(self.start, self.end))
            _USAGE.added(self.root, self.written)
            self._tmp = None
        except OSError as err:
            log.warning("spool: publishing %s failed (%s)", self._tmp, err)
            self._abandon()

    def abandon(self) -> None:
        """Remove what this writer wrote unless it finished (a failed or cancelled read)."""
        self._abandon()

    def _abandon(self) -> None:
        if self._file is not None:
            with contextlib.suppress(OSError):
                self._file.close()
            self._file = None
        if self._tmp is not None:
            with contextlib.suppress(OSError):
                self._tmp.unlink()
            self._tmp = None


def spool_files(root: str | Path, topic: str) -> list[SpoolFile]:
    """A topic-partition's finished spool files, by range start."""
    directory = topic_dir(root, topic)
    found: list[SpoolFile] = []
    with contextlib.suppress(FileNotFoundError):
        for entry in os.scandir(directory):
            parsed = SpoolFile.parse(Path(entry.path))
            if parsed is not None:
                found.append(parsed)
    return sorted(found, key=lambda f: f.start)


class TornSpoolError(StreamingError):
    """A spool file ends inside a record: the rest of its range is read from the broker."""


def read_spool_file(path: Path) -> Iterator[tuple[Position, memoryview]]:
    """A spool file's entries, as read-only views of the file mapped into memory (no copy into new ``bytes``:
    the sink checks each entry's CRC-32C and hands it to the store from the page cache, where reading it was
    a copy of every spooled byte into fresh memory); :class:`TornSpoolError` at a torn record.

    The mapping stays while any view of it is held and goes with the last one. A published spool file is never
    written again (only renamed into place, then removed), so a mapped page cannot vanish under a reader."""
    with open(path, "rb", buffering=0) as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            return
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    with contextlib.suppress(AttributeError, OSError):  # read ahead: the sink takes the file front to back
        mapped.madvise(mmap.MADV_SEQUENTIAL)
    view = memoryview(mapped)
    offset = 0
    while offset < size:
        if offset + _RECORD.size > size:
            raise TornSpoolError(path)
        ledger, entry, n = _RECORD.unpack_from(view, offset)
        offset += _RECORD.size
        if offset + n > size:
            raise TornSpoolError(path)
        yield (ledger, entry), view[offset : offset + n]
        offset += n


@dataclass
class SpoolFetcher:
    """``EntryFetcher`` over the spool, then ``fallback`` (the broker) for what the spool does not hold."""

    root: str
    fallback: EntryFetcher
    spooled: int = 0
    """Entries served from the spool (the rest the fallback read: its ``stats``)."""
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    """The sink's threads stream several topic-partitions at once: the count is shared."""

    @property
    def source(self) -> str:
        return f"the spool {self.root} or {self.fallback.source}"

    def stream(self, topic: str, after: Position, end: Position) -> Iterator[tuple[Position, Buffer]]:
        position = after
        for spooled in spool_files(self.root, topic):
            if position >= end:
                return
            if not (spooled.start <= position < spooled.end):
                continue
            try:
                for pos, data in read_spool_file(spooled.path):
                    if pos <= position:
                        continue
                    if pos > end:
                        return
                    with self._lock:
                        self.spooled += 1
                    yield pos, data
                    position = pos
            except (FileNotFoundError, TornSpoolError):
                break  # released meanwhile (another sink task wrote these parts), or torn: the broker has them
            else:
                position = max(position, min(spooled.end, end))
        if position < end:
            yield from self.fallback.stream(topic, position, end)

    def holds(self, topic: str, after: Position, end: Position) -> bool:
        """Whether the spool's files cover ``(after, end]`` of ``topic``: streaming it then maps them, and
        allocates none of its entries (unless a file turns out torn or gone, when the broker is read)."""
        position = after
        for spooled in spool_files(self.root, topic):
            if spooled.start <= position < spooled.end:
                position = spooled.end
            if position >= end:
                return True
        return position >= end

    def release(self, topic: str, upto: Position) -> None:
        """Remove the topic-partition's spool files that end at or before ``upto`` (their entries are in
        parts already written)."""
        left = False
        for spooled in spool_files(self.root, topic):
            if spooled.end <= upto:
                with contextlib.suppress(FileNotFoundError):
                    spooled.path.unlink()
            else:
                left = True
        if not left:
            # An empty directory goes too: counting the spool (``spool_bytes``) walks every directory, and at
            # 10,000 topic-partitions, most of them quiet, that walk was ~15% of a source task's time. Not
            # removed while a writer's temporary file (or another's spool file) is in it; a writer whose
            # directory went makes it again (``SpoolWriter._create``).
            with contextlib.suppress(OSError):
                topic_dir(self.root, topic).rmdir()
