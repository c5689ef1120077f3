"""Counting a process's object store requests by operation, for benches (``bench/scale.py``: the store requests
per minute of a job that has nothing to do, issue 24).

Opt-in and off by default: with ``STREAMOFFLOAD_STORE_REQUEST_COUNTS=DIR`` in a process's environment, every store
``storage.location.open_store`` opens is wrapped in a :class:`CountingStore`, and the process's totals (since it
started, all its stores together) are written to ``DIR/<pid>.json`` about once a second while they change, and at
exit. Without the variable nothing is wrapped and nothing is counted.

Why files and not a metric: a job's store requests come from several processes (the driver's lease, retention and
metrics threads; the Python process that plans the control source; Spark's Python workers running the segmenter
and the sink), which all inherit the environment. A counter in the driver's ``/metrics`` would see only the
driver's share; the files are summed by whoever reads them (:func:`read_counts`). A process killed with SIGKILL
loses at most its last second of counts.

Operations are counted as the interface names them: ``list``, ``pending_multiparts``, ``get``, ``get_range``
(also each read of a ranged reader), ``head``, ``put``, ``delete``, ``start_multipart``, ``resume_multipart``,
``write_part``, ``complete``, ``abort``; a listing counts once however many pages S3 would need for it (1,000
keys a page). :data:`REQUEST_CLASSES` groups them as S3 bills them. Each is also counted by what its key is
(:func:`key_kind`: a topic's manifests, its whole ``_meta/`` listed, the lease, the policy versions, ...), so that
a figure can name the code that makes it.
"""

from __future__ import annotations

import atexit
import json
import os
import threading
import time
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from streamoffload.storage.base import MultipartWrite, ObjectInfo, ObjectStore, PartData, PendingUpload, RangedReader

ENV = "STREAMOFFLOAD_STORE_REQUEST_COUNTS"

REQUEST_CLASSES: dict[str, tuple[str, ...]] = {
    "LIST": ("list", "pending_multiparts"),
    "GET": ("get", "get_range"),
    "HEAD": ("head",),
    "PUT": ("put", "start_multipart", "write_part", "complete"),
    "DELETE": ("delete", "abort"),
}
"""S3's request classes: what each of the interface's operations is on S3 (``resume_multipart`` makes none)."""


def key_kind(key: str) -> str:
    """What a key (or listed prefix) is, without its topic: ``topic _meta/segments``, ``topic _meta/`` (a listing
    of a topic's whole ``_meta/``), ``topic data`` (data, index and checksum objects), ``store _meta/writers``
    (the lease), ``store _meta/policies``, ``store _control/requests``, ... (``storage/keys.py``'s layout)."""
    parts = key.split("/")
    for marker in ("_meta", "_control"):
        if marker in parts:
            i = parts.index(marker)
            scope = "topic" if i >= 3 else "store"
            sub = parts[i + 1] if i + 1 < len(parts) else ""
            return f"{scope} {marker}/{sub}"
    return "topic data" if len(parts) >= 4 else "store other"


class RequestCounts:
    """Counts of store requests by operation. The process-wide one (every store ``open_store`` wraps) writes
    itself to ``DIR/<pid>.json`` (module docstring); one made by a caller and given to :class:`CountingStore`
    counts that store's requests only and writes nothing (``snapshot`` reads it)."""

    def __init__(self, *, to_files: bool = False) -> None:
        self.lock = threading.Lock()
        self.counts: Counter[str] = Counter()
        self.where: Counter[str] = Counter()
        """``"<op> <key_kind(key)>"`` -> requests: which objects the requests were about."""
        self.pid = os.getpid()
        self.dirty = False
        self.thread: threading.Thread | None = None
        self.to_files = to_files

    def snapshot(self) -> dict[str, int]:
        with self.lock:
            return dict(self.counts)

    def snapshot_where(self) -> dict[str, int]:
        with self.lock:
            return dict(self.where)

    def add(self, op: str, key: str) -> None:
        with self.lock:
            if self.pid != os.getpid():  # a forked child: its own counts, its own writer thread
                self._reset()
            self.counts[op] += 1
            self.where[f"{op} {key_kind(key)}"] += 1
            self.dirty = True
            if self.to_files and self.thread is None:
                self.thread = threading.Thread(target=self._loop, name="store-request-counts", daemon=True)
                self.thread.start()

    def _reset(self) -> None:
        self.counts = Counter()
        self.where = Counter()
        self.pid = os.getpid()
        self.thread = None
        self.dirty = False

    def _loop(self) -> None:
        while True:
            time.sleep(1.0)
            self.write()

    def after_fork(self) -> None:
        """In a forked child: a fresh lock (another thread may have held the parent's) and counts of its own."""
        self.lock = threading.Lock()
        self._reset()

    def write(self) -> None:
        directory = os.environ.get(ENV)
        with self.lock:
            if not directory or not self.dirty or self.pid != os.getpid():
                return
            snapshot, self.dirty = {"ops": dict(self.counts), "where": dict(self.where)}, False
        path = Path(directory) / f"{self.pid}.json"
        tmp = path.with_name(f".{path.name}.tmp")
        try:
            tmp.write_text(json.dumps(snapshot))
            os.replace(tmp, path)
        except OSError:
            with self.lock:
                self.dirty = True  # try again in a second


_COUNTS = RequestCounts(to_files=True)
atexit.register(_COUNTS.write)
os.register_at_fork(after_in_child=_COUNTS.after_fork)


def counting_enabled() -> bool:
    return bool(os.environ.get(ENV))


def _process_files(directory: str | Path) -> dict[int, dict[str, dict[str, int]]]:
    out: dict[int, dict[str, dict[str, int]]] = {}
    for path in Path(directory).glob("*.json"):
        try:
            doc = json.loads(path.read_text())
            out[int(path.stem)] = {part: {k: int(v) for k, v in doc[part].items()} for part in ("ops", "where")}
        except (OSError, ValueError, KeyError, AttributeError):
            continue  # being replaced: the rename makes that rare; the next read has it
    return out


def counts_by_process(directory: str | Path) -> dict[int, dict[str, int]]:
    """Per process (pid) that wrote into ``directory``: its counts by operation."""
    return {pid: doc["ops"] for pid, doc in _process_files(directory).items()}


def where_by_process(directory: str | Path) -> dict[int, dict[str, int]]:
    """Per process (pid) that wrote into ``directory``: its counts by ``"<op> <key_kind>"``."""
    return {pid: doc["where"] for pid, doc in _process_files(directory).items()}


def read_counts(directory: str | Path) -> dict[str, int]:
    """The counts of every process that wrote into ``directory``, summed by operation."""
    total: Counter[str] = Counter()
    for counts in counts_by_process(directory).values():
        total.update(counts)
    return dict(total)


def by_class(counts: Mapping[str, int]) -> dict[str, int]:
    """``counts`` (by operation) by S3 request class (:data:`REQUEST_CLASSES`)."""
    return {name: sum(counts.get(op, 0) for op in ops) for name, ops in REQUEST_CLASSES.items()}


class _CountingReader(RangedReader):
    def __init__(self, inner: RangedReader, count: Any, key: str) -> None:
        self._inner = inner
        self._count = count
        self.key = key
        self.remote = inner.remote
        self.readahead = inner.readahead

    def read(self, start: int, length: int) -> bytes:
        self._count("get_range", self.key)
        return self._inner.read(start, length)

    def close(self) -> None:
        self._inner.close()


class _CountingUpload(MultipartWrite):
    def __init__(self, inner: MultipartWrite, count: Any) -> None:
        self._inner = inner
        self._count = count
        self.key = inner.key
        self.upload_id = inner.upload_id

    def write_part(self, part_number: int, data: PartData) -> None:
        self._count("write_part", self.key)
        self._inner.write_part(part_number, data)

    def complete(self, part_numbers: Sequence[int]) -> ObjectInfo:
        self._count("complete", self.key)
        return self._inner.complete(part_numbers)

    def abort(self) -> None:
        self._count("abort", self.key)
        self._inner.abort()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "_inner":  # not set yet (unpickling): no recursion
            raise AttributeError(name)
        return getattr(self._inner, name)


class CountingStore(ObjectStore):
    """``inner``, counting every request into ``counts`` (by default this process's totals: module docstring).
    Anything beyond the interface (a filesystem store's ``root`` or ``remove_stale_temporaries``) is ``inner``'s."""

    def __init__(self, inner: ObjectStore, counts: RequestCounts | None = None) -> None:
        self._inner = inner
        self._counts = counts or _COUNTS
        self.min_part_size = inner.min_part_size
        self.part_size = inner.part_size
        self.copies_parts = inner.copies_parts

    def _count(self, op: str, key: str) -> None:
        self._counts.add(op, key)

    def __reduce__(self) -> tuple[Any, ...]:
        # Shipped to another process (a Spark closure): there it counts into that process's totals.
        return (CountingStore, (self._inner,))

    @property
    def url(self) -> str:
        return self._inner.url

    def __repr__(self) -> str:
        return f"CountingStore({self._inner!r})"

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "_inner":  # not set yet (unpickling): no recursion
            raise AttributeError(name)
        return getattr(self._inner, name)

    def put(
        self,
        key: str,
        data: bytes | memoryview,
        metadata: Mapping[str, str] | None = None,
        *,
        if_absent: bool = False,
    ) -> ObjectInfo:
        self._count("put", key)
        return self._inner.put(key, data, metadata, if_absent=if_absent)

    def put_many(self, objects: Sequence[tuple[str, bytes | memoryview, Mapping[str, str] | None]]) -> None:
        for key, _data, _metadata in objects:
            self._count("put", key)
        self._inner.put_many(objects)

    def get(self, key: str) -> bytes:
        self._count("get", key)
        return self._inner.get(key)

    def get_range(self, key: str, start: int, length: int) -> bytes:
        self._count("get_range", key)
        return self._inner.get_range(key, start, length)

    def head(self, key: str) -> ObjectInfo:
        self._count("head", key)
        return self._inner.head(key)

    def open_ranged_reader(self, key: str, *, hold_open: bool = True) -> RangedReader:
        return _CountingReader(self._inner.open_ranged_reader(key, hold_open=hold_open), self._count, key)

    def exists(self, key: str) -> bool:
        self._count("head", key)
        return self._inner.exists(key)

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        self._count("list", prefix)
        return self._inner.list(prefix)

    def delete(self, key: str) -> None:
        self._count("delete", key)
        self._inner.delete(key)

    def start_multipart(self, key: str, metadata: Mapping[str, str] | None = None) -> MultipartWrite:
        self._count("start_multipart", key)
        return _CountingUpload(self._inner.start_multipart(key, metadata), self._count)

    def resume_multipart(self, key: str, upload_id: str) -> MultipartWrite:
        self._count("resume_multipart", key)
        return _CountingUpload(self._inner.resume_multipart(key, upload_id), self._count)

    def pending_multiparts(self, prefix: str) -> Iterator[PendingUpload]:
        self._count("pending_multiparts", prefix)
        return self._inner.pending_multiparts(prefix)

    def close(self) -> None:
        self._inner.close()


def maybe_counting(store: ObjectStore) -> ObjectStore:
    """``store`` counted when the environment asks for it (:data:`ENV`), else ``store`` itself."""
    return CountingStore(store) if counting_enabled() else store


__all__ = [
    "ENV",
    "REQUEST_CLASSES",
    "CountingStore",
    "RequestCounts",
    "by_class",
    "counting_enabled",
    "counts_by_process",
    "maybe_counting",
    "read_counts",
]
