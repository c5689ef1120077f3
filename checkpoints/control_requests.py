"""Control requests in the store: what ``offload-now`` (and ``run --once``'s final seal) asks of the job, and
what became of each request. Plain Python on a ``ScopedStore`` (the store and its key prefix); the Spark
source that turns requests into rows of the job's query is ``streaming/source/control_source.py``, so
``offload-now`` and ``offload-status`` never load Spark.

A request is a small JSON object in the store under ``<prefix>/_control/requests/<id>``, written
create-only. Ids are ``<time_ns>-<uuid4 hex>``: the uuid makes them unique without trusting any
clock; the time part only orders them for display.

What became of a request is kept under ``<prefix>/_control/status/<id>`` (JSON: state, topic,
segment, error, at_ms). The job's source marks a request "running" when it first puts it in an offset
(create-only, so it never overwrites an outcome); the sink records "done" (with the sealed
segment's uuid, or none when the topic had nothing open) or "failed" (with why). A request with an
object and no status yet is "pending". Status records older than 24 hours whose request object is
gone are deleted whenever new requests are submitted.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from streamoffload.checkpoints.errors import CheckpointError
from streamoffload.codecs.topics import TopicName
from streamoffload.errors import StreamOffloadError
from streamoffload.storage import keys
from streamoffload.storage.base import ObjectExistsError, ObjectNotFoundError, ObjectStore
from streamoffload.storage.location import ScopedStore

PENDING, RUNNING, DONE, FAILED = "pending", "running", "done", "failed"
RECORDED_STATES = (RUNNING, DONE, FAILED)
"""States a status record holds (pending is the absence of one)."""

STATUS_RETENTION_S = 24 * 3600.0
"""Status records of finished requests older than this are deleted when new requests are submitted."""


class UnknownRequestError(CheckpointError):
    """No request object and no status record for a request id."""


def requests_prefix(prefix: str) -> str:
    return keys.control_prefix(prefix, keys.CONTROL_REQUESTS)


def status_prefix(prefix: str) -> str:
    return keys.control_prefix(prefix, keys.CONTROL_STATUS)


def new_request_id(clock: Callable[[], float] = time.time) -> str:
    """``<time_ns>-<uuid4 hex>``: unique by the uuid alone; the time part (from ``clock``, seconds) only
    makes ids sort roughly by submission for display."""
    return f"{max(0, int(clock() * 1e9)):020d}-{uuid.uuid4().hex}"


def submit_requests(
    scoped: ScopedStore,
    topics: Sequence[str],
    kind: str = "seal",
    *,
    clock: Callable[[], float] = time.time,
    effective_ms: int | None = None,
) -> list[str]:
    """Write one request per topic-partition (create-only); returns the request ids, in ``topics`` order.
    Also deletes status records older than a day whose request is gone (see ``expire_statuses``).
    ``effective_ms`` goes with a ``policy`` request: when the new policy version takes effect."""
    ids = []
    for topic in topics:
        doc = {"topic": topic, "kind": kind, "requested_ms": int(clock() * 1000), "pid": os.getpid()}
        if effective_ms is not None:
            doc["effective_ms"] = effective_ms
        body = json.dumps(doc)
        while True:
            request_id = new_request_id(clock)
            try:
                scoped.store.put(requests_prefix(scoped.prefix) + request_id, body.encode(), if_absent=True)
            except ObjectExistsError:  # a uuid4 collision: never in practice, but never overwrite either
                continue
            break
        ids.append(request_id)
    expire_statuses(scoped, now=clock())
    return ids


def pending_requests(scoped: ScopedStore) -> list[str]:
    """Ids of the request objects in the store (read or not; ``commit`` deletes the ones read), sorted."""
    prefix = requests_prefix(scoped.prefix)
    return sorted(info.key[len(prefix) :] for info in scoped.store.list(prefix))


# --- status records ---------------------------------------------------------------------------------


def record_request_status(
    scoped: ScopedStore,
    request_id: str,
    state: str,
    *,
    topic: str,
    segment: str | None = None,
    error: str | None = None,
    if_absent: bool = False,
) -> None:
    """Record what became of a request: "running", "done" (``segment``: the sealed segment's uuid, or
    None when the topic had nothing open) or "failed" (``error``: why). With ``if_absent`` an existing
    record is kept (the source marks "running" that way, so it never hides an outcome)."""
    if state not in RECORDED_STATES:
        raise ValueError(f"request status must be one of {', '.join(RECORDED_STATES)}, not {state!r}")
    body: dict[str, str | int | None] = {"id": request_id, "state": state, "topic": topic, "segment": segment}
    body["error"] = error
    body["at_ms"] = int(time.time() * 1000)
    with contextlib.suppress(ObjectExistsError):  # raised only with if_absent: a record is already there
        scoped.store.put(status_prefix(scoped.prefix) + request_id, json.dumps(body).encode(), if_absent=if_absent)


@dataclass(frozen=True)
class RequestState:
    """One request and what became of it."""

    id: str
    topic: str
    state: str
    """pending | running | done | failed"""
    kind: str = "seal"
    segment: str | None = None
    error: str | None = None
    at_ms: int | None = None
    """When the state was recorded (None while pending)."""

    @property
    def finished(self) -> bool:
        return self.state in (DONE, FAILED)

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "topic": self.topic,
            "state": self.state,
            "kind": self.kind,
            "segment": self.segment,
            "error": self.error,
            "at_ms": self.at_ms,
        }


def _get_json(store: ObjectStore, key: str) -> dict[str, Any] | None:
    try:
        value = json.loads(store.get(key))
    except ObjectNotFoundError:
        return None
    return value if isinstance(value, dict) else None


def _state_of(scoped: ScopedStore, request_id: str, *, has_status: bool = True) -> RequestState | None:
    status = _get_json(scoped.store, status_prefix(scoped.prefix) + request_id) if has_status else None
    if status is None:
        request = _get_json(scoped.store, requests_prefix(scoped.prefix) + request_id)
        if request is None:
            # Read (and deleted) since it was listed: its outcome is recorded by now, if anywhere.
            status = _get_json(scoped.store, status_prefix(scoped.prefix) + request_id)
            if status is None:
                return None
        else:
            return RequestState(request_id, str(request.get("topic", "")), PENDING, str(request.get("kind", "seal")))
    return RequestState(
        request_id,
        str(status.get("topic", "")),
        str(status.get("state", "")),
        segment=status.get("segment"),
        error=status.get("error"),
        at_ms=status.get("at_ms"),
    )


def request_status(scoped: ScopedStore, request_id: str) -> dict[str, Any]:
    """What became of one request: ``RequestState.as_dict()`` (state pending | running | done | failed)."""
    state = _state_of(scoped, request_id)
    if state is None:
        raise UnknownRequestError(
            f"no offload request {request_id} in {scoped.store.url} under {requests_prefix(scoped.prefix)!r} "
            "(never submitted, or finished more than a day ago)"
        )
    return state.as_dict()


def list_requests(scoped: ScopedStore, topic: str | None = None) -> list[RequestState]:
    """Every request the store knows (pending ones, and finished ones until their status expires), sorted
    by id; with ``topic``, only those of that topic-partition or, for a topic, of any of its partitions."""
    req_prefix, st_prefix = requests_prefix(scoped.prefix), status_prefix(scoped.prefix)
    ids = {info.key[len(req_prefix) :] for info in scoped.store.list(req_prefix)}
    with_status = {info.key[len(st_prefix) :] for info in scoped.store.list(st_prefix)}
    wanted = _topic_filter(topic)
    out = []
    for request_id in sorted(ids | with_status):
        state = _state_of(scoped, request_id, has_status=request_id in with_status)
        if state is not None and state.kind == "seal" and wanted(state.topic):
            out.append(state)
    return out


def _topic_filter(topic: str | None) -> Callable[[str], bool]:
    if topic is None:
        return lambda _: True
    name = TopicName.parse(topic)

    def wanted(candidate: str) -> bool:
        try:
            parsed = TopicName.parse(candidate)
        except StreamOffloadError:
            return False
        return parsed == name or (not name.is_partition and parsed.base == name)

    return wanted


def expire_statuses(scoped: ScopedStore, *, max_age_s: float = STATUS_RETENTION_S, now: float | None = None) -> int:
    """Delete status records last written more than ``max_age_s`` ago (by the store's clock) whose
    request object is gone; returns how many. A still-pending request keeps its record."""
    cutoff = (time.time() if now is None else now) - max_age_s
    req_prefix, st_prefix = requests_prefix(scoped.prefix), status_prefix(scoped.prefix)
    old = [info for info in scoped.store.list(st_prefix) if info.last_modified and info.last_modified < cutoff]
    if not old:
        return 0
    pending = {info.key[len(req_prefix) :] for info in scoped.store.list(req_prefix)}
    expired = 0
    for info in old:
        if info.key[len(st_prefix) :] not in pending:
            scoped.store.delete(info.key)
            expired += 1
    return expired


def control_value(kind: str, request_id: str, effective_ms: int | None = None) -> str:
    """The ``control`` column of a request's row."""
    doc: dict[str, Any] = {"kind": kind, "id": request_id}
    if effective_ms is not None:
        doc["effective_ms"] = effective_ms
    return json.dumps(doc)


def read_request(scoped: ScopedStore, request_id: str) -> dict[str, Any] | None:
    """A request object's JSON, or None when it is gone (read and deleted since it was listed)."""
    return _get_json(scoped.store, requests_prefix(scoped.prefix) + request_id)
