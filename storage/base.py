"""The one small interface every object store implements (filesystem and S3 alike).

Modelled on pyiceberg's FileIO and Pulsar's BlobStore usage: whole-object put, multipart write with
ordered, numbered parts, ranged get, head with user metadata, list by prefix, delete. Stores are
synchronous (Spark tasks and the CLI are); the S3 store runs an async core underneath.

Keys are '/'-separated strings relative to the store root; build them with ``storage.keys``.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from streamoffload.codecs.errors import StreamOffloadError


class StorageError(StreamOffloadError):
    """An object store operation failed (after retries, where the store retries)."""


class ObjectNotFoundError(StorageError):
    """The key does not exist."""

    def __init__(self, key: str, store: str = "") -> None:
        self.key = key
        super().__init__(f"object not found: {key}" + (f" in {store}" if store else ""))


class ObjectExistsError(StorageError):
    """A conditional create found the key already present."""

    def __init__(self, key: str) -> None:
        self.key = key
        super().__init__(f"object already exists: {key}")


@dataclass(frozen=True)
class ObjectInfo:
    key: str
    size: int
    metadata: Mapping[str, str] = field(default_factory=dict)
    """User metadata (lowercase keys). ``list`` may leave it empty; ``head`` fills it."""
    last_modified: float = 0.0
    """Seconds since the epoch."""


@dataclass(frozen=True)
class PendingUpload:
    """An unfinished multipart write found in the store (for cleanup of abandoned attempts)."""

    key: str
    upload_id: str
    initiated: float
    """Seconds since the epoch."""


class MultipartWrite(abc.ABC):
    """An object written as numbered parts, visible only once ``complete`` succeeds.

    Parts may be written in any order and rewritten (same number, same or new bytes): that is what
    makes a replayed Spark micro-batch idempotent. ``complete`` assembles exactly the part numbers
    it is given, in ascending order. A store may require every part but the last to have at least
    ``ObjectStore.min_part_size`` bytes.
    """

    key: str
    upload_id: str

    @abc.abstractmethod
    def write_part(self, part_number: int, data: bytes | memoryview) -> None: ...

    @abc.abstractmethod
    def complete(self, part_numbers: Sequence[int]) -> ObjectInfo: ...

    @abc.abstractmethod
    def abort(self) -> None: ...


class ObjectStore(abc.ABC):
    """An object store. Implementations: ``FilesystemStore``, ``S3Store``."""

    min_part_size: int = 1
    """Smallest allowed size of a multipart part other than the last (S3: 5 MiB)."""

    @property
    @abc.abstractmethod
    def url(self) -> str:
        """Where the store is (``file:///root`` or ``s3://bucket/prefix``), never with credentials."""

    @abc.abstractmethod
    def put(
        self,
        key: str,
        data: bytes | memoryview,
        metadata: Mapping[str, str] | None = None,
        *,
        if_absent: bool = False,
    ) -> ObjectInfo:
        """Write a whole object atomically. With ``if_absent``, raise ``ObjectExistsError`` instead
        of overwriting an existing key (S3 ``If-None-Match: *``)."""

    @abc.abstractmethod
    def get(self, key: str) -> bytes: ...

    @abc.abstractmethod
    def get_range(self, key: str, start: int, length: int) -> bytes:
        """Bytes ``[start, start + length)``; shorter only at the end of the object."""

    @abc.abstractmethod
    def head(self, key: str) -> ObjectInfo:
        """Size and user metadata; ``ObjectNotFoundError`` when absent."""

    def exists(self, key: str) -> bool:
        try:
            self.head(key)
        except ObjectNotFoundError:
            return False
        return True

    @abc.abstractmethod
    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        """Objects whose key starts with ``prefix``, in key order."""

    @abc.abstractmethod
    def delete(self, key: str) -> None:
        """Delete a key; deleting a missing key is not an error."""

    @abc.abstractmethod
    def start_multipart(self, key: str, metadata: Mapping[str, str] | None = None) -> MultipartWrite: ...

    @abc.abstractmethod
    def resume_multipart(self, key: str, upload_id: str) -> MultipartWrite:
        """Re-attach to an unfinished multipart write (after a crash or on another executor)."""

    @abc.abstractmethod
    def pending_multiparts(self, prefix: str) -> Iterator[PendingUpload]:
        """Unfinished multipart writes under ``prefix``."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections; the store must not be used afterwards."""

    def __enter__(self) -> ObjectStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
