"""A store as a dry run would leave it, the real one untouched: an overlay that keeps writes and deletions.

``streamoffload cleanup --dry-run`` runs the real cleanup over it, so it plans exactly what the real run does.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence

from streamoffload.storage.base import (
    MultipartWrite,
    ObjectExistsError,
    ObjectInfo,
    ObjectNotFoundError,
    ObjectStore,
    PartData,
    PendingUpload,
)


class DryRunStore(ObjectStore):
    """A store as a cleanup would leave it, the real one untouched: reads go to ``inner``, writes and deletions
    are kept here and shown to later reads (a deleted key is gone, a written one is there), an abort of a
    multipart upload hides it from later listings. Only what cleanup does is supported: it starts no upload."""

    def __init__(self, inner: ObjectStore) -> None:
        self.inner = inner
        self.min_part_size = inner.min_part_size
        self.part_size = inner.part_size
        self.copies_parts = inner.copies_parts
        self.written: dict[str, tuple[bytes, ObjectInfo]] = {}
        self.deleted: set[str] = set()
        self.aborted: set[tuple[str, str]] = set()

    @property
    def url(self) -> str:
        return self.inner.url

    def put(
        self,
        key: str,
        data: bytes | memoryview,
        metadata: Mapping[str, str] | None = None,
        *,
        if_absent: bool = False,
    ) -> ObjectInfo:
        if if_absent and self.exists(key):
            raise ObjectExistsError(f"{self.url}: {key} exists")
        info = ObjectInfo(key, len(data), dict(metadata or {}), time.time())
        self.written[key] = (bytes(data), info)
        self.deleted.discard(key)
        return info

    def get(self, key: str) -> bytes:
        if key in self.written:
            return self.written[key][0]
        if key in self.deleted:
            raise ObjectNotFoundError(f"{self.url}: {key} not found")
        return self.inner.get(key)

    def get_range(self, key: str, start: int, length: int) -> bytes:
        if key in self.written or key in self.deleted:
            return self.get(key)[start : start + length]
        return self.inner.get_range(key, start, length)

    def head(self, key: str) -> ObjectInfo:
        if key in self.written:
            return self.written[key][1]
        if key in self.deleted:
            raise ObjectNotFoundError(f"{self.url}: {key} not found")
        return self.inner.head(key)

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        listed = {i.key: i for i in self.inner.list(prefix) if i.key not in self.deleted}
        listed.update({k: info for k, (_, info) in self.written.items() if k.startswith(prefix)})
        for key in sorted(listed):
            yield listed[key]

    def delete(self, key: str) -> None:
        self.written.pop(key, None)
        self.deleted.add(key)

    def start_multipart(self, key: str, metadata: Mapping[str, str] | None = None) -> MultipartWrite:
        raise NotImplementedError("a dry run of cleanup starts no upload")

    def resume_multipart(self, key: str, upload_id: str) -> MultipartWrite:
        return _DryRunUpload(self, key, upload_id)

    def pending_multiparts(self, prefix: str) -> Iterator[PendingUpload]:
        for upload in self.inner.pending_multiparts(prefix):
            if (upload.key, upload.upload_id) not in self.aborted:
                yield upload


class _DryRunUpload(MultipartWrite):
    def __init__(self, store: DryRunStore, key: str, upload_id: str) -> None:
        self.store = store
        self.key = key
        self.upload_id = upload_id

    def write_part(self, part_number: int, data: PartData) -> None:
        raise NotImplementedError("a dry run of cleanup writes no part")

    def complete(self, part_numbers: Sequence[int]) -> ObjectInfo:
        raise NotImplementedError("a dry run of cleanup completes no upload")

    def abort(self) -> None:
        self.store.aborted.add((self.key, self.upload_id))
