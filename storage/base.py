"""The one small interface every object store implements (filesystem and S3 alike).

Modelled on pyiceberg's FileIO and Pulsar's BlobStore usage: whole-object put, multipart write with
ordered, numbered parts, ranged get, head with user metadata, list by prefix, delete. Stores are
synchronous (Spark tasks and the CLI are); the S3 store runs an async core underneath.

Keys are '/'-separated strings relative to the store root; build them with ``storage.keys``.
"""

from __future__ import annotations

import abc
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from streamoffload.errors import StreamOffloadError


class StorageError(StreamOffloadError):
    """An object store operation failed (after retries, where the store retries)."""


class TransientStorageError(StorageError):
    """The store failed in a way a later attempt may not: a full disk or another I/O error of a filesystem
    store, S3 answering 5xx, throttling or resetting connections through all of the client's retries. Not a
    verdict on what the store supports (``storage.probe`` lets it through as it is, to be retried)."""


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


class InvalidKeyError(StorageError, ValueError):
    """A key that is not a valid, portable object key (see ``storage.keys.check_key``)."""

    def __init__(self, key: str, reason: str) -> None:
        self.key = key
        self.reason = reason
        super().__init__(f"invalid object key {key!r}: {reason}")


class UploadNotFoundError(StorageError):
    """A multipart upload id that the store does not know (completed, aborted, or never started)."""

    def __init__(self, key: str, upload_id: str, store: str = "") -> None:
        self.key = key
        self.upload_id = upload_id
        super().__init__(
            f"multipart upload {upload_id} of {key} not found"
            + (f" in {store}" if store else "")
            + " (already completed or aborted?)"
        )


class PartTooSmallError(StorageError):
    """``complete`` was given a part, other than the last, smaller than the store's minimum part size."""


_METADATA_KEY_RE = re.compile(r"^[a-z0-9][a-z0-9_-]*$")
MAX_METADATA_BYTES = 2048
"""S3's limit on the total size of user metadata (names plus values)."""


def normalize_metadata(metadata: Mapping[str, str] | None) -> dict[str, str]:
    """User metadata as every store keeps it: lowercase names of ``[a-z0-9_-]``, printable ASCII values,
    at most 2 KiB in all (S3's rules, enforced everywhere so a filesystem store accepts nothing S3 would
    refuse)."""
    if not metadata:
        return {}
    out: dict[str, str] = {}
    total = 0
    for name, value in metadata.items():
        if not isinstance(name, str) or not isinstance(value, str):
            raise StorageError(f"user metadata names and values must be str, got {name!r}: {value!r}")
        low = name.lower()
        if not _METADATA_KEY_RE.match(low):
            raise StorageError(f"invalid user metadata name {name!r}: use letters, digits, '-' and '_'")
        if any(not (32 <= ord(c) < 127) for c in value):
            raise StorageError(f"user metadata {name!r} has a value that is not printable ASCII: {value!r}")
        if low in out:
            raise StorageError(f"user metadata name {name!r} given twice (names are case-insensitive)")
        out[low] = value
        total += len(low) + len(value)
    if total > MAX_METADATA_BYTES:
        raise StorageError(f"user metadata is {total} bytes, more than the {MAX_METADATA_BYTES} bytes S3 allows")
    return out


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


MAX_PART_NUMBER = 10_000
"""The highest multipart part number (S3's limit, enforced by every store)."""


def check_part_number(number: int) -> int:
    """``number`` if it is a valid part number (an int in ``[1, MAX_PART_NUMBER]``), else ``ValueError``."""
    if isinstance(number, bool) or not isinstance(number, int) or not 1 <= number <= MAX_PART_NUMBER:
        raise ValueError(f"part numbers are integers in [1, {MAX_PART_NUMBER}], got {number!r}")
    return number


def check_part_list(part_numbers: Sequence[int]) -> list[int]:
    """The part numbers ``complete`` was given, validated and in ascending order."""
    numbers = [check_part_number(n) for n in part_numbers]
    if not numbers:
        raise ValueError("complete() needs at least one part number")
    if len(set(numbers)) != len(numbers):
        raise ValueError(f"complete() was given duplicate part numbers: {sorted(numbers)}")
    return sorted(numbers)


Buffer = bytes | bytearray | memoryview
PartData = Buffer | Sequence[Buffer]
"""A part's bytes: one buffer, or buffers whose concatenation is the part (written without joining them where
the store can: ``os.pwritev`` on a filesystem)."""


def part_buffers(data: PartData) -> list[Buffer]:
    """The buffers of ``data``, in order."""
    return [data] if isinstance(data, bytes | bytearray | memoryview) else list(data)


def buffers_size(buffers: Sequence[Buffer]) -> int:
    return sum(b.nbytes if isinstance(b, memoryview) else len(b) for b in buffers)


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
    def write_part(self, part_number: int, data: PartData) -> None: ...

    @abc.abstractmethod
    def complete(self, part_numbers: Sequence[int]) -> ObjectInfo: ...

    @abc.abstractmethod
    def abort(self) -> None: ...


class RangedReader:
    """Ranged reads of one object, opened by ``ObjectStore.open_ranged_reader``: the store decides how a
    ranged read is done (pyiceberg's ``InputFile.open(seekable=True)``). This default issues one
    ``get_range`` per read; a store with a cheaper way (a held file descriptor) returns its own reader."""

    remote = True
    """Reads go over the network: a sequential read is best done as back-to-back ranges (an entry crossing
    a range end joined in memory, nothing fetched twice) with several reads in flight at once."""
    readahead = True
    """A read-ahead thread pays off for a sequential read (no one else reads ahead)."""

    def __init__(self, store: ObjectStore, key: str) -> None:
        self.store = store
        self.key = key

    def read(self, start: int, length: int) -> bytes:
        """Bytes ``[start, start + length)``; shorter only at the end of the object; ``ObjectNotFoundError``
        when the object is absent."""
        return self.store.get_range(self.key, start, length)

    def close(self) -> None:
        """Release what the reader holds; it must not be used afterwards."""


class ObjectStore(abc.ABC):
    """An object store. Implementations: ``FilesystemStore``, ``S3Store``."""

    min_part_size: int = 1
    """Smallest allowed size of a multipart part other than the last (S3: 5 MiB)."""

    part_size: int = 1
    """The bytes the segmenter gathers into a part (but a segment's last): at least ``min_part_size``, and more
    where a part costs more than its bytes. A segment that stays below it until its seal is written whole, in
    one batch, without an Assigned manifest or a multipart upload (``sink.WHOLE_SEGMENT_BYTES``)."""

    copies_parts: bool = True
    """Writing a part makes a copy of its bytes while it is written (an HTTP body joined from its buffers): a
    writer budgeting its memory counts a part's whole length even when its buffers are mapped from a file."""

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

    def put_many(self, objects: Sequence[tuple[str, bytes | memoryview, Mapping[str, str] | None]]) -> None:
        """Write several whole objects ``(key, data, metadata)``, each atomically, in no set order; all are
        durable when this returns. For objects no reader looks for until a later write names them (a segment's
        checksum records, data and index, before its commit): a store may write them at once (S3: concurrent
        PUTs) or make them durable together (a filesystem: one directory sync). This default writes them one by
        one."""
        for key, data, metadata in objects:
            self.put(key, data, metadata)

    @abc.abstractmethod
    def get(self, key: str) -> bytes: ...

    @abc.abstractmethod
    def get_range(self, key: str, start: int, length: int) -> bytes:
        """Bytes ``[start, start + length)``; shorter only at the end of the object."""

    @abc.abstractmethod
    def head(self, key: str) -> ObjectInfo:
        """Size and user metadata; ``ObjectNotFoundError`` when absent."""

    def open_ranged_reader(self, key: str, *, hold_open: bool = True) -> RangedReader:
        """A reader of ranges of one (immutable) object, for many reads of it. ``hold_open=False`` asks the
        store to hold nothing between reads (each read sees the object as it is then); this default holds
        nothing anyway."""
        return RangedReader(self, key)

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
