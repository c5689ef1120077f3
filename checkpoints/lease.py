"""The writer lease: one job instance writes a store prefix at a time (fencing).

A lease is a numbered object ``<prefix>/_meta/writers/<epoch:020d>`` holding JSON (holder, host, pid,
renewal time, time to live). The highest epoch is the lease in force. Taking the lease means creating
the next epoch's object **create-only**, so of two instances racing for it exactly one wins; the holder
renews by rewriting its own epoch's object, which no one else writes.

An instance is its ``holder`` id: host name, a digest of the checkpoint path, and a random token of the
process, so two replicas with the same host name and path (containers) are two instances and never take each
other's live lease. The same process (``run`` restarting a run) takes its own lease over at once, and so does a
new process on the same host and path once the lease's process is provably gone (a restart after a crash: same
boot and PID namespace, and no process with its pid and start time); any other instance waits until the lease
expires (or is forced). Fencing does not rest on clocks: the epoch goes into every segment this writer opens,
every segment is committed create-only in its place in the topic's history (``MetadataStore.commit``), and a
writer checks before each commit that no later epoch exists, so a writer that lost the lease has its commits
refused.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import socket
import time
from dataclasses import MISSING, asdict, dataclass, fields, replace
from pathlib import Path

from streamoffload.checkpoints.errors import CheckpointError
from streamoffload.codecs.errors import FormatError
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

MAX_LEASE_TIME_MS = 253_402_300_799_999
"""The latest time a lease record may hold (9999-12-31 23:59:59.999 UTC, the last instant ``time.gmtime`` and
``datetime`` take everywhere): a record's renewal time plus its time to live, and each of them, are at most this."""

MAX_LEASE_NUMBER = 2**63 - 1
"""The largest epoch, pid or start time a lease record may hold (a Java long, as every number the store keeps):
an epoch still fits the key's 20 digits."""

_TIMES = ("acquired_ms", "renewed_ms", "ttl_ms")

CLEANUP_HOLDER = "streamoffload-cleanup"
"""The holder id of ``cleanup`` holding the lease (``checkpoints.cleanup_guard``), followed by its host."""


class LeaseHeldError(CheckpointError):
    """Another instance holds the writer lease of the store prefix."""


class CleanupRunningError(LeaseHeldError):
    """``cleanup`` holds the writer lease for as long as it removes orphans at a grace below
    ``LIVE_WRITER_GRACE_MS``: a job that meets it waits, it does not give up."""


class FencedError(CheckpointError):
    """This writer's lease was taken over: it must stop writing."""


_process_token = secrets.token_hex(4)


def _new_process_token() -> None:
    global _process_token
    _process_token = secrets.token_hex(4)


os.register_at_fork(after_in_child=_new_process_token)


def instance_id(checkpoint: str, host: str | None = None, token: str | None = None) -> str:
    """A job instance's id: ``<host>-<digest of host and checkpoint path>-<token>``, the token random per process
    (``token`` for tests), so two replicas with one host name and path are two instances."""
    host = host or socket.gethostname()
    digest = hashlib.sha256(f"{host}|{os.path.abspath(checkpoint)}".encode()).hexdigest()[:12]
    return f"{host}-{digest}-{token or _process_token}"


def cleanup_id(host: str | None = None) -> str:
    """``cleanup``'s holder id while it holds the lease: ``CLEANUP_HOLDER``, the host, and this process's token, so
    two cleanups on one host are two holders (the second is refused, not handed the first one's lease)."""
    return f"{CLEANUP_HOLDER}-{host or socket.gethostname()}-{_process_token}"


def _same_place(a: str, b: str) -> bool:
    """Whether two holder ids (``instance_id``) name the same host and checkpoint path (ids without a token,
    as written before it, never match)."""
    base_a, sep_a, _ = a.rpartition("-")
    base_b, sep_b, _ = b.rpartition("-")
    return bool(sep_a and sep_b) and base_a == base_b and base_a.count("-") >= 1


@dataclass(frozen=True)
class Process:
    """A process as the lease records it: its pid, the process space the pid means something in (boot id and PID
    namespace; "" where unknown), and its start time (clock ticks after boot: a reused pid differs)."""

    pid: int
    space: str
    started: int

    @classmethod
    def this(cls) -> Process:
        return cls(os.getpid(), _process_space(), _start_ticks(os.getpid()) or 0)

    def gone(self, space: str, pid: int, started: int) -> bool:
        """Whether the process ``pid`` (started at ``started``) of ``space`` is provably gone, seen from this one:
        only within the same space, where pids mean the same processes; elsewhere nothing is proved."""
        if not self.space or space != self.space or not started:
            return False
        return _start_ticks(pid) != started


def _process_space() -> str:
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        return f"{boot}/{os.readlink('/proc/self/ns/pid')}"
    except OSError:
        return ""


def _start_ticks(pid: int) -> int | None:
    """The start time of process ``pid`` (Linux ``/proc/<pid>/stat`` field 22), None when there is none."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return int(stat.rpartition(")")[2].split()[19])
    except (OSError, ValueError, IndexError):
        return None


@dataclass(frozen=True)
class LeaseRecord:
    holder: str
    epoch: int
    host: str
    pid: int
    acquired_ms: int
    renewed_ms: int
    ttl_ms: int
    space: str = ""
    """The process space of ``pid`` (``Process``); "" in records written before it."""
    started: int = 0
    """The start time of ``pid`` (``Process``); 0 in records written before it."""

    @property
    def expires_ms(self) -> int:
        return self.renewed_ms + self.ttl_ms

    def encode(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def decode(cls, data: bytes, where: str) -> LeaseRecord:
        """The record at ``where``; ``FormatError`` naming it for anything but a JSON object of the fields, with
        every number in its range (times up to ``MAX_LEASE_TIME_MS``, the others up to ``MAX_LEASE_NUMBER``)."""
        try:
            doc = json.loads(data)
        except (ValueError, UnicodeDecodeError) as err:
            raise FormatError(f"not a writer lease record (not JSON: {err})", where=where) from None
        if not isinstance(doc, dict):
            raise FormatError("not a writer lease record (not a JSON object)", where=where)
        values: dict[str, object] = {}
        for f in fields(cls):
            want = str if f.type == "str" else int
            if f.name not in doc:
                if f.default is not MISSING:  # a field added later: records written before lack it
                    continue
                raise FormatError(f"not a writer lease record: no {f.name!r}", where=where)
            value = doc[f.name]
            if isinstance(value, bool) or not isinstance(value, want):
                kind = "text" if want is str else "an integer"
                raise FormatError(f"not a writer lease record: {f.name!r} is {value!r}, not {kind}", where=where)
            most = MAX_LEASE_TIME_MS if f.name in _TIMES else MAX_LEASE_NUMBER
            if isinstance(value, int) and not 0 <= value <= most:
                raise FormatError(f"not a writer lease record: {f.name!r} is {value}, outside 0..{most}", where=where)
            values[f.name] = value
        record = cls(**values)  # type: ignore[arg-type]
        if record.expires_ms > MAX_LEASE_TIME_MS:
            raise FormatError(
                f"not a writer lease record: it expires at {record.expires_ms} ms (renewed_ms + ttl_ms), after "
                f"{MAX_LEASE_TIME_MS}",
                where=where,
            )
        return record


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

    def __init__(
        self, scoped: ScopedStore, holder: str, *, ttl_ms: int = DEFAULT_TTL_MS, process: Process | None = None
    ) -> None:
        self.scoped = scoped
        self.store = scoped.store
        self.prefix = scoped.prefix
        self.holder = holder
        self.ttl_ms = ttl_ms
        self.process = Process.this() if process is None else process
        """This process, as its lease records say (injected by tests)."""
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

    def _epochs(self) -> list[int]:
        """The epochs listed, ascending (names that are not an epoch are not the lease's)."""
        names = (info.key.rsplit("/", 1)[-1] for info in self.store.list(self._dir()))
        return sorted(int(name) for name in names if len(name) == 20 and name.isdigit())

    def current(self) -> LeaseRecord | None:
        """The lease in force (highest epoch), or None; ``FormatError`` naming a record that is not one."""
        return self._current_of(self._epochs())

    def _current_of(self, epochs: list[int]) -> LeaseRecord | None:
        for epoch in reversed(epochs):
            try:
                return LeaseRecord.decode(self.store.get(self._key(epoch)), where=self._key(epoch))
            except ObjectNotFoundError:
                continue
        return None

    def _mine(self, current: LeaseRecord) -> bool:
        """Whether ``current`` is this instance's to take over at once: this process's own, or one of the same
        host and checkpoint path whose process is provably gone (a restart after a crash)."""
        if current.holder == self.holder:
            return True
        return _same_place(current.holder, self.holder) and self.process.gone(
            current.space, current.pid, current.started
        )

    def acquire(self, *, force: bool = False, now_ms: int | None = None) -> LeaseRecord:
        """Take the lease: a new epoch. Refused while another instance's lease is live (unless ``force``)."""
        now = _now_ms() if now_ms is None else now_ms
        # One listing for both the lease in force and the next epoch: listing again after the check could see a
        # lease another instance took meanwhile and step past it, unchecked (two winners). With one listing, an
        # instance that took the lease since picked the same next epoch, and the create-only put refuses one.
        epochs = self._epochs()
        try:
            current = self._current_of(epochs)
        except FormatError as err:
            if not force:
                raise FormatError(
                    f"{err.reason}; if no instance writes this prefix, `run --take-over` takes the lease past it",
                    where=err.where,
                ) from None
            current = None
        if current is not None and not self._mine(current) and current.expires_ms > now and not force:
            held = CleanupRunningError if current.holder.startswith(CLEANUP_HOLDER) else LeaseHeldError
            raise held(
                f"the store prefix {self.store.url}/{self.prefix} is being written by {_describe(current, now)}. "
                "Stop that instance, wait for its lease to expire, or offload into another prefix."
            )
        epoch = max(current.epoch if current else 0, epochs[-1] if epochs else 0) + 1
        me = self.process
        record = LeaseRecord(
            self.holder, epoch, socket.gethostname(), me.pid, now, now, self.ttl_ms, me.space, me.started
        )
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
                taker = LeaseRecord.decode(self.store.get(self._key(epoch + 1)), where=self._key(epoch + 1))
                who = f"instance {taker.holder} (pid {taker.pid} on {taker.host}, epoch {taker.epoch})"
            except (ObjectNotFoundError, FormatError):
                who = f"epoch {epoch + 1}"
            raise FencedError(f"this job's writer lease (epoch {epoch}) was taken over by {who}; stopping")

    def renew(self, now_ms: int | None = None) -> LeaseRecord:
        """Extend the lease; ``FencedError`` if it was taken over meanwhile."""
        self.check()
        assert self.record is not None
        now = _now_ms() if now_ms is None else now_ms
        record = replace(self.record, renewed_ms=now)
        self.store.put(self._key(record.epoch), record.encode())
        self.record = record
        return record

    def release(self) -> None:
        """Let the lease expire now (a clean stop), unless it was already taken over."""
        if self.record is None:
            return
        try:
            self.check()
            self.store.put(self._key(self.epoch), replace(self.record, ttl_ms=0).encode())
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
