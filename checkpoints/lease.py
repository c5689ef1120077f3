"""The writer lease: one job instance writes a store prefix at a time (fencing).

A lease is a numbered object ``<prefix>/_meta/writers/<epoch:020d>`` holding JSON (holder, host, pid,
renewal time, time to live). The highest epoch is the lease in force. Taking the lease means creating
the next epoch's object **create-only**, so of two instances racing for it exactly one wins; the holder
renews by rewriting its own epoch's object, which no one else writes.

An instance is its ``holder`` id: the same host and checkpoint path make the same id, so a restart after a
crash takes its own lease over at once, while another instance must wait until the lease expires (or is
forced). Fencing does not rest on clocks: the epoch goes into every segment this writer opens, every segment
is committed create-only in its place in the topic's history (``MetadataStore.commit``), and a writer checks
before each commit that no later epoch exists, so a writer that lost the lease has its commits refused.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import time
from dataclasses import asdict, dataclass

from streamoffload.errors import StreamOffloadError
from streamoffload.storage import keys
from streamoffload.storage.base import ObjectExistsError, ObjectNotFoundError
from streamoffload.storage.location import ScopedStore

DEFAULT_TTL_MS = 60_000
KEEP_EPOCHS = 5

COMMIT_WINDOW_MS = 300_000
"""The longest a writer lets pass between the first write of a seal (a small segment's objects, which no manifest
names until the commit; a completed upload and its index) and the commit that names them: the sink refuses a
later commit, and the attempt is written again. ``cleanup`` beside a live lease relies on it."""

LIVE_WRITER_GRACE_MS = 2 * COMMIT_WINDOW_MS
"""The shortest grace ``cleanup`` takes while another instance's lease is live: the commit window, and as much
again for the commit request itself and for the store's clock and cleanup's disagreeing."""

CLEANUP_HOLDER = "streamoffload-cleanup"
"""The holder id of ``cleanup`` holding the lease (``checkpoints.cleanup_guard``), followed by its host."""


class LeaseHeldError(StreamOffloadError):
    """Another instance holds the writer lease of the store prefix."""


class CleanupRunningError(LeaseHeldError):
    """``cleanup`` holds the writer lease for as long as it removes orphans at a grace below
    ``LIVE_WRITER_GRACE_MS``: a job that meets it waits, it does not give up."""


class FencedError(StreamOffloadError):
    """This writer's lease was taken over: it must stop writing."""


def instance_id(checkpoint: str, host: str | None = None) -> str:
    """A stable id for a job instance: its host and checkpoint path (a restart is the same instance)."""
    host = host or socket.gethostname()
    digest = hashlib.sha256(f"{host}|{os.path.abspath(checkpoint)}".encode()).hexdigest()[:12]
    return f"{host}-{digest}"


@dataclass(frozen=True)
class LeaseRecord:
    holder: str
    epoch: int
    host: str
    pid: int
    acquired_ms: int
    renewed_ms: int
    ttl_ms: int

    @property
    def expires_ms(self) -> int:
        return self.renewed_ms + self.ttl_ms

    def encode(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def decode(cls, data: bytes) -> LeaseRecord:
        doc = json.loads(data)
        return cls(**{k: doc[k] for k in cls.__dataclass_fields__})


def _now_ms() -> int:
    return int(time.time() * 1000)


def _describe(record: LeaseRecord, now_ms: int) -> str:
    left = (record.expires_ms - now_ms) / 1000
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(record.expires_ms / 1000))
    return (
        f"instance {record.holder} (pid {record.pid} on {record.host}, epoch {record.epoch}); "
        f"its lease expires at {when}" + (f", in {left:.0f} s" if left > 0 else "")
    )


class WriterLease:
    """The lease of one store prefix, as seen by one instance."""

    def __init__(self, scoped: ScopedStore, holder: str, *, ttl_ms: int = DEFAULT_TTL_MS) -> None:
        self.scoped = scoped
        self.store = scoped.store
        self.prefix = scoped.prefix
        self.holder = holder
        self.ttl_ms = ttl_ms
        self.record: LeaseRecord | None = None

    @property
    def epoch(self) -> int:
        if self.record is None:
            raise FencedError("the writer lease has not been acquired")
        return self.record.epoch

    def _dir(self) -> str:
        return keys.prefix_meta_prefix(self.prefix, keys.WRITERS)

    def _key(self, epoch: int) -> str:
        return self._dir() + f"{epoch:020d}"

    def current(self) -> LeaseRecord | None:
        """The lease in force (highest epoch), or None."""
        epochs = sorted(int(info.key.rsplit("/", 1)[-1]) for info in self.store.list(self._dir()))
        for epoch in reversed(epochs):
            try:
                return LeaseRecord.decode(self.store.get(self._key(epoch)))
            except ObjectNotFoundError:
                continue
        return None

    def acquire(self, *, force: bool = False, now_ms: int | None = None) -> LeaseRecord:
        """Take the lease: a new epoch. Refused while another holder's lease is live (unless ``force``)."""
        now = _now_ms() if now_ms is None else now_ms
        current = self.current()
        if current is not None and current.holder != self.holder and current.expires_ms > now and not force:
            held = CleanupRunningError if current.holder.startswith(CLEANUP_HOLDER) else LeaseHeldError
            raise held(
                f"the store prefix {self.store.url}/{self.prefix} is being written by {_describe(current, now)}. "
                "Stop that instance, wait for its lease to expire, or offload into another prefix."
            )
        epoch = (current.epoch if current else 0) + 1
        record = LeaseRecord(self.holder, epoch, socket.gethostname(), os.getpid(), now, now, self.ttl_ms)
        try:
            self.store.put(self._key(epoch), record.encode(), if_absent=True)
        except ObjectExistsError:
            winner = self.current()
            raise LeaseHeldError(
                f"another instance took the writer lease of {self.store.url}/{self.prefix} at the same moment: "
                + (_describe(winner, now) if winner else f"epoch {epoch}")
            ) from None
        self.record = record
        for old in range(max(1, epoch - KEEP_EPOCHS - 50), epoch - KEEP_EPOCHS + 1):
            self.store.delete(self._key(old))
        return record

    def check(self) -> None:
        """Raise ``FencedError`` if a later epoch exists (another instance took over)."""
        epoch = self.epoch
        if _taken_over(self.scoped, epoch):
            try:
                taker = LeaseRecord.decode(self.store.get(self._key(epoch + 1)))
                who = f"instance {taker.holder} (pid {taker.pid} on {taker.host}, epoch {taker.epoch})"
            except (ObjectNotFoundError, ValueError, KeyError):
                who = f"epoch {epoch + 1}"
            raise FencedError(f"this job's writer lease (epoch {epoch}) was taken over by {who}; stopping")

    def renew(self, now_ms: int | None = None) -> LeaseRecord:
        """Extend the lease; ``FencedError`` if it was taken over meanwhile."""
        self.check()
        assert self.record is not None
        now = _now_ms() if now_ms is None else now_ms
        record = LeaseRecord(**{**asdict(self.record), "renewed_ms": now, "pid": os.getpid()})
        self.store.put(self._key(record.epoch), record.encode())
        self.record = record
        return record

    def release(self) -> None:
        """Let the lease expire now (a clean stop), unless it was already taken over."""
        if self.record is None:
            return
        try:
            self.check()
            self.store.put(self._key(self.epoch), LeaseRecord(**{**asdict(self.record), "ttl_ms": 0}).encode())
        except FencedError:
            pass


def describe_lease(record: LeaseRecord, now_ms: int) -> str:
    """Who holds a lease and until when, for an error message."""
    return _describe(record, now_ms)


def _taken_over(scoped: ScopedStore, epoch: int) -> bool:
    """A later epoch exists, or ours is gone (later holders prune epochs older than ``KEEP_EPOCHS``)."""
    base = keys.prefix_meta_prefix(scoped.prefix, keys.WRITERS)
    store = scoped.store
    return store.exists(base + f"{epoch + 1:020d}") or not store.exists(base + f"{epoch:020d}")


def check_epoch(scoped: ScopedStore, epoch: int) -> None:
    """Executor-side fencing check before a commit: refuse if a later epoch than ``epoch`` exists.
    Epoch 0 is a writer without a lease (the segmenter and sink used as a library, in tests)."""
    if epoch > 0 and _taken_over(scoped, epoch):
        raise FencedError(f"the writer lease of epoch {epoch} was taken over by a later instance; commit refused")
