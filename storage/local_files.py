"""Reading local files by range: short-read-safe ``pread`` and the filesystem store's ranged readers."""

from __future__ import annotations

import os
import stat
import sys
import threading
from pathlib import Path
from typing import Any

from streamoffload.storage.base import ObjectNotFoundError, ObjectStore, RangedReader
from streamoffload.storage.keys import check_key


def pread_exact(fd: int, start: int, length: int, size: int | None = None) -> bytes:
    """``length`` bytes at ``start``, shorter only at the end of the file. Regular files return short
    reads only at the end, but a reader must not depend on that (SPEC 7: short reads on streams).

    No more is asked of the kernel than the file holds past ``start`` (its ``size``, from ``fstat`` when not
    given): ``os.pread`` allocates the length it is asked for before it reads, so a request for 64 MiB of a
    2 KiB object would take 64 MiB (and one for 2**62 bytes fail), however little came back."""
    if length:
        length = min(length, max(0, (_size(fd) if size is None else size) - start))
    data = os.pread(fd, length, start) if length else b""
    if 0 < len(data) < length:
        pieces = [data]
        got = len(data)
        while got < length:
            more = os.pread(fd, length - got, start + got)
            if not more:
                break
            pieces.append(more)
            got += len(more)
        data = b"".join(pieces)
    return data


def _size(fd: int) -> int:
    """The size of a regular file; for anything else (a stream) a size that bounds nothing."""
    st = os.fstat(fd)
    return st.st_size if stat.S_ISREG(st.st_mode) else sys.maxsize


class ReopeningFileReader(RangedReader):
    """``get_range`` per read, on local files: nothing is remote, and with no descriptor held the kernel's
    read-ahead does not follow the reader, so a read-ahead thread pays off."""

    remote = False


class FileRangedReader(RangedReader):
    """Ranged reads of one object through a single open descriptor.

    ``FilesystemStore.get_range`` opens the file and re-validates the key on every call, which costs about
    as much as copying a 1 MiB chunk from the page cache; a reader of many ranges of the same immutable
    object validates the key once and keeps the file open (``pread`` is safe from several threads). The
    kernel reads ahead through the held descriptor, so a read-ahead thread would only add hand-over costs.
    """

    remote = False
    readahead = False

    def __init__(self, store: ObjectStore, key: str, root: Path) -> None:
        """``root``: the store's root folder (given, not read from ``FilesystemStore``, which imports this)."""
        super().__init__(store, key)
        self._path = root.joinpath(*check_key(key).split("/"))
        self._file: Any = None
        self._size = 0
        self._lock = threading.Lock()

    def _fd(self) -> int:
        with self._lock:
            if self._file is None:
                try:
                    self._file = open(self._path, "rb", buffering=0)  # noqa: SIM115 - closed by close()
                except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
                    raise ObjectNotFoundError(self.key) from None
                self._size = _size(self._file.fileno())  # an object is immutable: its size once
            return int(self._file.fileno())

    def read(self, start: int, length: int) -> bytes:
        fd = self._fd()
        return pread_exact(fd, start, length, self._size)

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None
