"""Reading local files by range: short-read-safe ``pread`` and the filesystem store's ranged readers."""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING, Any

from streamoffload.storage.base import ObjectNotFoundError, RangedReader
from streamoffload.storage.keys import check_key

if TYPE_CHECKING:
    from streamoffload.storage.filesystem import FilesystemStore


def pread_exact(fd: int, start: int, length: int) -> bytes:
    """``length`` bytes at ``start``, shorter only at the end of the file. Regular files return short
    reads only at the end, but a reader must not depend on that (SPEC 7: short reads on streams)."""
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

    def __init__(self, store: FilesystemStore, key: str) -> None:
        super().__init__(store, key)
        self._path = store.root.joinpath(*check_key(key).split("/"))
        self._file: Any = None
        self._lock = threading.Lock()

    def _fd(self) -> int:
        with self._lock:
            if self._file is None:
                try:
                    self._file = open(self._path, "rb", buffering=0)  # noqa: SIM115 - closed by close()
                except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
                    raise ObjectNotFoundError(self.key) from None
            return int(self._file.fileno())

    def read(self, start: int, length: int) -> bytes:
        return pread_exact(self._fd(), start, length)

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None
