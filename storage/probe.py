"""Check at start that an object store does what streamoffload relies on, instead of failing (or silently
misbehaving) in the middle of a job.

S3-compatible stores differ: some ignore ``If-None-Match`` (a create-only PUT then overwrites, which breaks
fencing and exactly-once commits), some lack multipart ListParts/Abort or ListMultipartUploads. ``check_store``
exercises every capability the job uses, on a few small objects under ``<prefix>/_meta/probe/<random>``, and
removes them again:

- whole-object put/get/head with user metadata, ranged get;
- create-only put (``put(..., if_absent=True)``): a new key is created, an existing key raises
  ``ObjectExistsError`` and keeps its bytes;
- list by prefix, in key order; delete;
- multipart: start, write parts out of order (every part but the last at least ``min_part_size``), resume by
  upload id, complete with an explicit part list (a written part left out is not in the object), abort;
- ListMultipartUploads (``pending_multiparts``): NOT fatal, the job does not need it; only ``cleanup`` uses it
  to find stray uploads, so ``StoreReport.stray_upload_listing`` says whether it can.

A missing capability raises ``StoreCapabilityError`` naming it, the store and what to do. About 25 requests
(one part of ``min_part_size`` bytes, 5 MiB on S3): well under a second on a local endpoint.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from streamoffload.redaction import redact
from streamoffload.storage.base import (
    MultipartWrite,
    ObjectExistsError,
    ObjectStore,
    StorageError,
    TransientStorageError,
    UploadNotFoundError,
)
from streamoffload.storage.keys import META_DIR
from streamoffload.storage.location import ScopedStore

__all__ = ["PROBE_DIR", "Problem", "StoreCapabilityError", "StoreReport", "check_store"]

PROBE_DIR = f"{META_DIR}/probe"
_WHOLE = b"streamoffload store probe: whole object\n"

CONDITIONAL_CREATE = "If-None-Match (conditional create)"
WHOLE_OBJECTS = "whole-object put/get/head with user metadata"
RANGED_GET = "ranged get"
LISTING = "list by prefix in key order"
DELETE = "delete"
MULTIPART = "multipart upload (start, parts, resume by upload id, complete with a part list)"
MULTIPART_ABORT = "multipart abort"
STRAY_UPLOAD_LISTING = "ListMultipartUploads (listing unfinished multipart uploads)"

_WHY = {
    CONDITIONAL_CREATE: "it for fencing and exactly-once commits",
    WHOLE_OBJECTS: "it to write and read manifests and index objects",
    RANGED_GET: "it to read entries back from offloaded segments",
    LISTING: "it to find manifests and segments",
    DELETE: "it to remove superseded and expired objects",
    MULTIPART: "it to write data objects across micro-batches and executors",
    MULTIPART_ABORT: "it to discard the uploads of failed attempts",
}


@dataclass(frozen=True)
class Problem:
    """One capability the store lacks: ``capability`` names it, ``detail`` says what the probe saw."""

    capability: str
    detail: str

    @property
    def fatal(self) -> bool:
        return self.capability in _WHY


@dataclass(frozen=True)
class StoreReport:
    """What ``check_store`` found on a store that has everything the job needs."""

    url: str
    """The store's URL, with its endpoint when it has one."""
    stray_upload_listing: bool
    """Whether the store lists unfinished multipart uploads (ListMultipartUploads); without it, ``cleanup``
    cannot find uploads that crashed writers left behind (the job itself does not need it)."""
    notes: tuple[Problem, ...] = ()
    """Non-fatal findings (such as a missing ListMultipartUploads), with what the probe saw."""
    elapsed: float = 0.0
    """Seconds the probe took."""


class StoreCapabilityError(StorageError):
    """The store lacks something streamoffload relies on; the message names each missing capability."""

    def __init__(self, url: str, problems: Sequence[Problem]) -> None:
        self.url = url
        self.problems = tuple(problems)
        self.missing = tuple(p.capability for p in self.problems)
        parts = [f"{p.detail}; streamoffload needs {_WHY[p.capability]}" for p in self.problems]
        conditional = CONDITIONAL_CREATE in self.missing
        others = len(self.missing) > (1 if conditional else 0)
        wanted = " and ".join(
            ["supports conditional writes"] * conditional + ["implements the S3 operations streamoffload uses"] * others
        )
        advice = f"Use AWS S3, MinIO, or another store that {wanted}."
        super().__init__(f"{url} " + ". Also, it ".join(parts) + ". " + advice)


def _where(store: ObjectStore) -> str:
    endpoint = getattr(store, "endpoint_url", None)
    return f"{store.url} (endpoint {redact(endpoint)})" if endpoint else store.url


def _said(err: BaseException) -> str:
    """An error's text without the store URL it usually starts with (the message names the store once)."""
    return str(err).split(": ", 1)[1] if str(err).startswith(("s3://", "file://")) and ": " in str(err) else str(err)


class _Probe:
    def __init__(self, store: ObjectStore, base: str) -> None:
        self.store = store
        self.base = base
        self.keys: list[str] = []
        """Every key the probe may have written, to delete at the end."""
        self.objects: set[str] = set()
        """The keys that should exist now."""
        self.uploads: list[MultipartWrite] = []
        """Multipart uploads not completed or aborted yet."""
        self.problems: list[Problem] = []
        self.stray_listing = False

    def key(self, name: str) -> str:
        key = f"{self.base}/{name}"
        self.keys.append(key)
        return key

    def check(self, capability: str, what: str, step: Callable[[], str | None]) -> bool:
        """Run ``step``; a returned string or a StorageError is a problem with ``capability``. A
        ``TransientStorageError`` (a full disk, S3 5xx through every retry) says nothing about what the store
        supports: it goes to the caller as it is, who may retry (``run`` does, at start-up)."""
        try:
            detail = step()
        except TransientStorageError:
            raise
        except StorageError as err:
            detail = f"fails {what}: {_said(err)}"
        if detail:
            self.problems.append(Problem(capability, detail))
            return False
        return True

    # --- the steps -----------------------------------------------------------------------------------

    def whole_objects(self) -> str | None:
        store, key, data = self.store, f"{self.base}/object", _WHOLE
        info = store.head(key)
        if info.size != len(data):
            return f"reports {info.size} bytes for an object of {len(data)} (head)"
        if dict(info.metadata).get("probe") != "whole":
            return f"does not keep user metadata: wrote {{'probe': 'whole'}}, head returned {dict(info.metadata)}"
        got = store.get(key)
        if got != data:
            return f"returns {len(got)} different bytes for an object of {len(data)} (get)"
        return None

    def ranged_get(self) -> str | None:
        key = f"{self.base}/object"
        got = self.store.get_range(key, 6, 7)
        if got != b"offload":
            return f"returns {got!r} for bytes [6, 13) of an object, not b'offload' (ranged get ignored?)"
        return None

    def conditional_create(self) -> str | None:
        store = self.store
        key = self.key("create-only")
        try:
            store.put(key, b"first", {"probe": "create"}, if_absent=True)
        except ObjectExistsError:
            return "refuses a create-only PUT (If-None-Match: *) of a key that does not exist"
        self.objects.add(key)
        try:
            store.put(key, b"second", if_absent=True)
        except ObjectExistsError:
            pass
        else:
            kept = store.get(key)
            if kept == b"second":
                return "ignores If-None-Match (conditional create): a second create-only PUT overwrote the object"
            return "ignores If-None-Match (conditional create): a second create-only PUT of an existing key succeeded"
        if store.get(key) != b"first":
            return "changed an object although the create-only PUT over it was refused (If-None-Match)"
        return None

    def multipart(self) -> str | None:
        store = self.store
        key = self.key("multipart")
        first = b"P" * max(store.min_part_size, 16)
        last, extra = b"last part", b"part left out of the list"
        write = store.start_multipart(key, {"probe": "multipart"})
        self.uploads.append(write)
        write.write_part(2, last)  # out of order, and the small part is the last one
        write.write_part(1, first)
        write.write_part(3, extra)  # written, but not in the part list: must not be in the object
        resumed = store.resume_multipart(key, write.upload_id)
        if resumed.upload_id != write.upload_id:
            return f"resumed upload {write.upload_id} as a different upload {resumed.upload_id}"
        info = resumed.complete([1, 2])  # (the head of the new object)
        self.uploads.remove(write)
        self.objects.add(key)
        if info.size != len(first) + len(last):
            return (
                f"assembled a multipart object of {info.size} bytes from parts [1, 2] of {len(first)} and "
                f"{len(last)} bytes (a written part left out of the list must not be included)"
            )
        if dict(info.metadata).get("probe") != "multipart":
            return f"does not keep the user metadata of a multipart upload: head returned {dict(info.metadata)}"
        seam = store.get_range(key, len(first) - 2, 6)
        if seam != first[-2:] + last[:4]:
            return f"returns {seam!r} across the part boundary of a completed multipart object"
        return None

    def abort_and_listing(self) -> str | None:
        store = self.store
        key = f"{self.base}/aborted"  # never becomes an object
        write = store.start_multipart(key)
        self.uploads.append(write)
        write.write_part(1, b"to be aborted")
        self.stray_listing_check(key, write.upload_id)
        write.abort()
        self.uploads.remove(write)
        try:
            store.resume_multipart(key, write.upload_id)
        except UploadNotFoundError:
            pass
        except StorageError:
            pass  # resume itself failed: reported by the multipart step
        else:
            return f"still knows multipart upload {write.upload_id} after aborting it"
        return None

    def stray_listing_check(self, key: str, upload_id: str) -> None:
        try:
            found = [u for u in self.store.pending_multiparts(self.base + "/") if u.upload_id == upload_id]
        except StorageError as err:
            self.problems.append(Problem(STRAY_UPLOAD_LISTING, f"cannot list unfinished uploads: {_said(err)}"))
            return
        if not found or found[0].key != key:
            self.problems.append(
                Problem(STRAY_UPLOAD_LISTING, f"does not list the unfinished multipart upload {upload_id} of {key}")
            )
            return
        self.stray_listing = True

    def listing(self) -> str | None:
        present = sorted(self.objects)
        listed = [info.key for info in self.store.list(self.base + "/")]
        if listed != present:
            return f"lists {listed} under {self.base}/, expected {present} (in key order)"
        return None

    def delete(self) -> str | None:
        for key in self.keys:
            self.store.delete(key)
            self.objects.discard(key)
        self.store.delete(f"{self.base}/never-written")  # deleting a missing key is not an error
        left = [info.key for info in self.store.list(self.base + "/")]
        if left:
            return f"still lists {left} after deleting them"
        self.keys.clear()  # nothing left for cleanup()
        return None

    def cleanup(self) -> None:
        """Best effort, after a failed step: leave nothing behind that the store lets us remove."""
        for write in self.uploads:
            with contextlib.suppress(StorageError):
                write.abort()
        for key in self.keys:
            with contextlib.suppress(StorageError):
                self.store.delete(key)


def check_store(scoped: ScopedStore) -> StoreReport:
    """Exercise every capability the job relies on, on probe keys under ``<prefix>/_meta/probe/<random>``
    (removed again), and return what was found; raise ``StoreCapabilityError`` naming each capability the
    store lacks. Other ``StorageError``s (no such bucket, no credentials, unreachable) propagate as they are."""
    started = time.monotonic()
    store, prefix = scoped.store, scoped.prefix
    base = f"{prefix}/{PROBE_DIR}/{uuid.uuid4().hex}" if prefix else f"{PROBE_DIR}/{uuid.uuid4().hex}"
    probe = _Probe(store, base)
    try:
        # The first write is not wrapped: if even a plain put fails, the store is unusable for reasons
        # (credentials, bucket, network) its own error names better.
        key = probe.key("object")
        store.put(key, _WHOLE, {"probe": "whole"})
        probe.objects.add(key)
        if probe.check(WHOLE_OBJECTS, "whole-object put/get/head", probe.whole_objects):
            probe.check(RANGED_GET, "a ranged get", probe.ranged_get)
        probe.check(CONDITIONAL_CREATE, "a create-only PUT (If-None-Match: *)", probe.conditional_create)
        probe.check(MULTIPART, "a multipart upload", probe.multipart)
        probe.check(MULTIPART_ABORT, "aborting a multipart upload", probe.abort_and_listing)
        probe.check(LISTING, "listing by prefix", probe.listing)
        probe.check(DELETE, "deleting objects", probe.delete)
    finally:
        probe.cleanup()
    fatal = [p for p in probe.problems if p.fatal]
    if fatal:
        raise StoreCapabilityError(_where(store), fatal)
    return StoreReport(
        url=_where(store),
        stray_upload_listing=probe.stray_listing,
        notes=tuple(p for p in probe.problems if not p.fatal),
        elapsed=time.monotonic() - started,
    )
