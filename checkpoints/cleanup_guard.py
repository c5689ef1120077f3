"""What ``cleanup`` may delete beside the writers of a store prefix (DESIGN "Cleanup beside a writer").

``cleanup`` deletes what no manifest or commit names: a small segment's objects between its ``put_many`` and
its commit look exactly like that, and so do a live write's temporary files and an upload not yet recorded in
its Assigned manifest. Only two things tell them apart from a dead attempt's leftovers, and the guard asks for
one of them:

- **age**, while another instance's writer lease is live: a writer commits what it wrote within
  ``COMMIT_WINDOW_MS`` or not at all (the sink refuses a later commit), so anything older than
  ``LIVE_WRITER_GRACE_MS`` that nothing names will never be named. A shorter grace is refused, naming the holder;
- **the lease itself**, when no writer's lease is live and the grace is shorter: cleanup takes the lease (a new
  epoch, holder ``streamoffload-cleanup-<host>-<token>``) before it looks at anything, so every earlier writer's
  commit is refused (``check_epoch``) and no job starts until cleanup releases it (a job that meets it waits).
  Before each deletion of something nothing names, the guard checks that nobody took the lease over meanwhile.
"""

from __future__ import annotations

import time
from types import TracebackType

from streamoffload.checkpoints.errors import CheckpointError
from streamoffload.checkpoints.lease import (
    COMMIT_WINDOW_MS,
    DEFAULT_TTL_MS,
    LIVE_WRITER_GRACE_MS,
    FencedError,
    LeaseHeldError,
    WriterLease,
    cleanup_id,
    describe_lease,
)
from streamoffload.storage.location import ScopedStore


class CleanupRefusedError(CheckpointError):
    """A grace too short beside a live writer, or cleanup's own lease taken over while it ran."""


def _minutes(ms: int) -> str:
    return f"{ms / 60_000:g}"


class CleanupGuard:
    """The permission of one cleanup run over a store prefix, for one grace. Take it with :meth:`take`, check it
    before each deletion of an object nothing names (:meth:`check`), release it at the end (a context manager)."""

    def __init__(self, scoped: ScopedStore, grace_ms: int, lease: WriterLease | None = None) -> None:
        self.scoped = scoped
        self.grace_ms = grace_ms
        self.lease = lease
        """The writer lease this cleanup holds (a grace below ``LIVE_WRITER_GRACE_MS``), else None."""
        self._renewed = time.monotonic()

    @classmethod
    def take(cls, scoped: ScopedStore, grace_ms: int, *, now_ms: int | None = None) -> CleanupGuard:
        """Permission for ``grace_ms``: refused (``CleanupRefusedError``) if it is below ``LIVE_WRITER_GRACE_MS``
        while another instance's lease is live; taken with the writer lease if it is below that and no lease is
        live; else granted as it is (cleanup runs beside whatever writer comes)."""
        now = int(time.time() * 1000) if now_ms is None else now_ms
        lease = WriterLease(scoped, cleanup_id(), ttl_ms=DEFAULT_TTL_MS)
        if grace_ms >= LIVE_WRITER_GRACE_MS:
            return cls(scoped, grace_ms)
        current = lease.current()
        if current is not None and current.holder != lease.holder and current.expires_ms > now:
            raise cls._refusal(scoped, grace_ms, describe_lease(current, now))
        try:
            lease.acquire(now_ms=now)
        except LeaseHeldError:  # a writer took it between the two reads
            current = lease.current()
            raise cls._refusal(
                scoped, grace_ms, describe_lease(current, now) if current else "another instance"
            ) from None
        return cls(scoped, grace_ms, lease)

    @staticmethod
    def _refusal(scoped: ScopedStore, grace_ms: int, holder: str) -> CleanupRefusedError:
        store = scoped.store.url + (f"/{scoped.prefix}" if scoped.prefix else "")
        return CleanupRefusedError(
            f"cleanup with a grace of {_minutes(grace_ms)} minutes refused: {store} is being written by {holder}. "
            f"A writer commits what it writes up to {_minutes(COMMIT_WINDOW_MS)} minutes later, so beside it cleanup "
            f"needs --grace-minutes {_minutes(LIVE_WRITER_GRACE_MS)} or more; any grace once it has stopped"
        )

    def admit(self, grace_ms: int) -> None:
        """Refuse a grace shorter than the one this permission was taken for."""
        if grace_ms < self.grace_ms:
            raise CleanupRefusedError(
                f"cleanup with a grace of {_minutes(grace_ms)} minutes under a permission taken for "
                f"{_minutes(self.grace_ms)}"
            )

    def check(self) -> None:
        """Before deleting something nothing names: with the lease held, renew it when a third of its time to live
        has passed, and stop (``CleanupRefusedError``) if another instance took it over meanwhile."""
        if self.lease is None:
            return
        try:
            if time.monotonic() - self._renewed >= self.lease.ttl_ms / 3000:
                self.lease.renew()
                self._renewed = time.monotonic()
            else:
                self.lease.check()
        except FencedError as err:
            raise CleanupRefusedError(f"cleanup stopped: {err}") from None

    def release(self) -> None:
        if self.lease is not None:
            self.lease.release()
            self.lease = None

    def __enter__(self) -> CleanupGuard:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, err: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.release()
