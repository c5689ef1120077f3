"""Whether the broker answers, and the running job's health record.

A job whose broker is gone must not stop: ``OffloadJob.run_forever`` keeps starting runs with capped backoff
while :func:`broker_unreachable` names a cause, and says so in three places: one log line per attempt, the
``streamoffload_broker_unreachable`` gauge (the job's metrics read :class:`JobHealth`) and the store's
``<prefix>/_meta/health/job`` record, which ``streamoffload status`` shows (it runs in another process).
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from dataclasses import asdict, dataclass, replace
from typing import Any

from streamoffload.redaction import redact
from streamoffload.storage import keys
from streamoffload.storage.base import ObjectNotFoundError
from streamoffload.storage.location import ScopedStore

log = logging.getLogger(__name__)

BROKER_BACKOFF_CAP_S = 30.0
"""The longest wait between two attempts while the broker is unreachable: the job notices it is back soon."""


def health_key(prefix: str) -> str:
    return keys.prefix_meta_prefix(prefix, keys.HEALTH) + "job"


def _endpoints(service_url: str) -> list[tuple[str, int]]:
    """``pulsar://a:6650,b:6650`` (or ``pulsar+ssl://``) to its hosts and ports."""
    scheme, _, rest = service_url.partition("://")
    default = 6651 if scheme.endswith("+ssl") else 6650
    out = []
    for item in rest.strip("/").split(","):
        host, _, port = item.strip().rpartition(":") if item.count(":") else (item.strip(), "", "")
        out.append((host.strip("[]") or "127.0.0.1", int(port) if port.isdigit() else default))
    return out


def broker_unreachable(service_url: str, timeout_s: float = 2.0) -> str | None:
    """None when one of the service URL's hosts accepts a TCP connection; else why none does (one line)."""
    cause = "no host in the service URL"
    for host, port in _endpoints(service_url):
        try:
            with socket.create_connection((host, port), timeout=timeout_s):
                return None
        except OSError as err:
            cause = (err.strerror or str(err) or type(err).__name__).lower()
    return cause


@dataclass(frozen=True)
class JobHealth:
    """What the job is doing about its broker, for ``status`` and the metrics."""

    broker_url: str = ""
    broker_unreachable: bool = False
    cause: str = ""
    since_ms: int = 0
    """When the broker was first found unreachable in this series of attempts (0: it is reachable)."""
    attempts: int = 0
    """Runs tried in this series."""
    retry_in_s: float = 0.0
    query_restarts: int = 0
    """Runs started again after a failure, since the job started."""
    updated_ms: int = 0

    def line(self) -> str:
        """One line for ``status``: empty while the broker answers."""
        if not self.broker_unreachable:
            return ""
        since = time.strftime("%H:%M:%S", time.localtime(self.since_ms / 1000))
        updated = time.strftime("%H:%M:%S", time.localtime(self.updated_ms / 1000))
        return (
            f"JOB: broker {self.broker_url} unreachable since {since}: {self.cause}; "
            f"retrying every {self.retry_in_s:.0f} s or less (attempt {self.attempts}, as of {updated})"
        )


class HealthTracker:
    """The job's health, kept in memory (metrics) and mirrored to the store (``status``); writing it never
    fails the job (the store may be the thing that is away)."""

    def __init__(self, scoped: ScopedStore | None, broker_url: str) -> None:
        self.scoped = scoped
        """Where the record is mirrored (None: not yet, in memory only)."""
        self._lock = threading.Lock()
        self.current = JobHealth(broker_url=redact(broker_url))  # the record is kept in the store

    def clear_stale(self) -> None:
        """At a job's start: a record an earlier process left saying the broker was away is no longer true."""
        if self.scoped is not None:
            stale = read_health(self.scoped)
            if stale is not None and stale.broker_unreachable:
                self._publish()

    def broker_down(self, cause: str, retry_in_s: float) -> JobHealth:
        now = int(time.time() * 1000)
        with self._lock:
            h = self.current
            self.current = replace(
                h,
                broker_unreachable=True,
                cause=redact(cause),
                since_ms=h.since_ms or now,
                attempts=h.attempts + 1,
                retry_in_s=retry_in_s,
                updated_ms=now,
            )
        self._publish()
        return self.current

    def broker_up(self) -> JobHealth | None:
        """The broker answers: returns the record of the outage just ended, if there was one."""
        with self._lock:
            ended = self.current if self.current.broker_unreachable else None
            if ended is None:
                return None
            self.current = JobHealth(
                broker_url=ended.broker_url, query_restarts=ended.query_restarts, updated_ms=int(time.time() * 1000)
            )
        self._publish()
        return ended

    def restarted(self) -> None:
        with self._lock:
            self.current = replace(self.current, query_restarts=self.current.query_restarts + 1)

    def _publish(self) -> None:
        if self.scoped is None:
            return
        try:
            record = json.dumps(asdict(self.current), sort_keys=True).encode()
            self.scoped.store.put(health_key(self.scoped.prefix), record)
        except Exception as err:
            log.debug("cannot write the job's health record: %s", err)


def read_health(scoped: ScopedStore) -> JobHealth | None:
    """The job's last health record in the store, or None."""
    try:
        doc: dict[str, Any] = json.loads(scoped.store.get(health_key(scoped.prefix)))
    except ObjectNotFoundError:
        return None
    except Exception as err:
        log.debug("cannot read the job's health record: %s", err)
        return None
    known = {k: v for k, v in doc.items() if k in JobHealth.__dataclass_fields__}
    return JobHealth(**known)
