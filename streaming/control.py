"""Control requests (manual ``offload-now``, and ``run --once``'s final seal) as a streaming source.

A request is a small JSON object in the store under ``<prefix>/_control/requests/<id>``, written
create-only. Ids are ``<time_ns>-<uuid4 hex>``: the uuid makes them unique without trusting any
clock; the time part only orders them for display. The ``streamoffload-control`` source turns new
requests into rows with the Pulsar source's ``positionsOnly`` schema plus a ``control`` column (a JSON string
``{"kind": "seal", "id": "<request id>"}``), unioned into the segmenter's input.

Requests travel through a source so that Spark records them in its offset log. An offset names
exactly the requests it covers (``{"ids": [...]}``, the sorted ids pending when Spark asked for
it): a micro-batch reads the ids of its end offset that its start offset does not name, by GETting
those ids (never by listing at execution time), so a replayed micro-batch sees exactly the requests
the failed attempt saw; ``commit`` deletes only the ids its offset names. A request deleted
meanwhile is skipped. Every pending id stays named in each offset until its deletion, so an id once
read is never read again, and a request that no offset names yet is never deleted.

What became of a request is kept under ``<prefix>/_control/status/<id>`` (JSON: state, topic,
segment, error, at_ms). The source marks a request "running" when it first puts it in an offset
(create-only, so it never overwrites an outcome); the sink records "done" (with the sealed
segment's uuid, or none when the topic had nothing open) or "failed" (with why). A request with an
object and no status yet is "pending". Status records older than 24 hours whose request object is
gone are deleted whenever new requests are submitted.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow

from streamoffload.codecs.topics import TopicName
from streamoffload.errors import StreamOffloadError
from streamoffload.storage import keys
from streamoffload.storage.base import ObjectExistsError, ObjectNotFoundError, ObjectStore, StorageError

log = logging.getLogger(__name__)

SOURCE_SCHEMA = (
    "topic STRING, partition INT, ledger_id LONG, entry_id LONG, publish_time TIMESTAMP, "
    "num_messages INT, size INT, crc32c LONG"
)
"""The offload job's Pulsar source rows (``positionsOnly``: no entry bytes), which control rows join."""
CONTROL_SCHEMA = SOURCE_SCHEMA + ", control STRING"


PENDING, RUNNING, DONE, FAILED = "pending", "running", "done", "failed"
RECORDED_STATES = (RUNNING, DONE, FAILED)
"""States a status record holds (pending is the absence of one)."""

STATUS_RETENTION_S = 24 * 3600.0
"""Status records of finished requests older than this are deleted when new requests are submitted."""


class UnknownRequestError(StreamOffloadError):
    """No request object and no status record for a request id."""


def requests_prefix(key_prefix: str) -> str:
    return keys.control_prefix(key_prefix, keys.CONTROL_REQUESTS)


def status_prefix(key_prefix: str) -> str:
    return keys.control_prefix(key_prefix, keys.CONTROL_STATUS)


def new_request_id(clock: Callable[[], float] = time.time) -> str:
    """``<time_ns>-<uuid4 hex>``: unique by the uuid alone; the time part (from ``clock``, seconds) only
    makes ids sort roughly by submission for display."""
    return f"{max(0, int(clock() * 1e9)):020d}-{uuid.uuid4().hex}"


def submit_requests(
    store: ObjectStore,
    key_prefix: str,
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
                store.put(requests_prefix(key_prefix) + request_id, body.encode(), if_absent=True)
            except ObjectExistsError:  # a uuid4 collision: never in practice, but never overwrite either
                continue
            break
        ids.append(request_id)
    expire_statuses(store, key_prefix, now=clock())
    return ids


def pending_requests(store: ObjectStore, key_prefix: str) -> list[str]:
    """Ids of the request objects in the store (read or not; ``commit`` deletes the ones read), sorted."""
    prefix = requests_prefix(key_prefix)
    return sorted(info.key[len(prefix) :] for info in store.list(prefix))


# --- status records ---------------------------------------------------------------------------------


def record_request_status(
    store: ObjectStore,
    key_prefix: str,
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
    body = {"id": request_id, "state": state, "topic": topic, "segment": segment, "error": error}
    body["at_ms"] = int(time.time() * 1000)
    with contextlib.suppress(ObjectExistsError):  # raised only with if_absent: a record is already there
        store.put(status_prefix(key_prefix) + request_id, json.dumps(body).encode(), if_absent=if_absent)


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


def _state_of(store: ObjectStore, key_prefix: str, request_id: str, *, has_status: bool = True) -> RequestState | None:
    status = _get_json(store, status_prefix(key_prefix) + request_id) if has_status else None
    if status is None:
        request = _get_json(store, requests_prefix(key_prefix) + request_id)
        if request is None:
            # Read (and deleted) since it was listed: its outcome is recorded by now, if anywhere.
            status = _get_json(store, status_prefix(key_prefix) + request_id)
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


def request_status(store: ObjectStore, key_prefix: str, request_id: str) -> dict[str, Any]:
    """What became of one request: ``RequestState.as_dict()`` (state pending | running | done | failed)."""
    state = _state_of(store, key_prefix, request_id)
    if state is None:
        raise UnknownRequestError(
            f"no offload request {request_id} in {store.url} under {requests_prefix(key_prefix)!r} "
            "(never submitted, or finished more than a day ago)"
        )
    return state.as_dict()


def list_requests(store: ObjectStore, key_prefix: str, topic: str | None = None) -> list[RequestState]:
    """Every request the store knows (pending ones, and finished ones until their status expires), sorted
    by id; with ``topic``, only those of that topic-partition or, for a topic, of any of its partitions."""
    req_prefix, st_prefix = requests_prefix(key_prefix), status_prefix(key_prefix)
    ids = {info.key[len(req_prefix) :] for info in store.list(req_prefix)}
    with_status = {info.key[len(st_prefix) :] for info in store.list(st_prefix)}
    wanted = _topic_filter(topic)
    out = []
    for request_id in sorted(ids | with_status):
        state = _state_of(store, key_prefix, request_id, has_status=request_id in with_status)
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


def expire_statuses(
    store: ObjectStore, key_prefix: str, *, max_age_s: float = STATUS_RETENTION_S, now: float | None = None
) -> int:
    """Delete status records last written more than ``max_age_s`` ago (by the store's clock) whose
    request object is gone; returns how many. A still-pending request keeps its record."""
    cutoff = (time.time() if now is None else now) - max_age_s
    req_prefix, st_prefix = requests_prefix(key_prefix), status_prefix(key_prefix)
    old = [info for info in store.list(st_prefix) if info.last_modified and info.last_modified < cutoff]
    if not old:
        return 0
    pending = {info.key[len(req_prefix) :] for info in store.list(req_prefix)}
    expired = 0
    for info in old:
        if info.key[len(st_prefix) :] not in pending:
            store.delete(info.key)
            expired += 1
    return expired


# --- the streaming source ---------------------------------------------------------------------------


def control_value(kind: str, request_id: str, effective_ms: int | None = None) -> str:
    """The ``control`` column of a request's row."""
    doc: dict[str, Any] = {"kind": kind, "id": request_id}
    if effective_ms is not None:
        doc["effective_ms"] = effective_ms
    return json.dumps(doc)


def _offset(ids: Iterable[str]) -> dict[str, Any]:
    # Canonical: one key, sorted unique ids (Spark compares offsets as JSON text).
    return {"ids": sorted(set(ids))}


def _named(offset: dict[str, Any] | None) -> set[str]:
    return set((offset or {}).get("ids", []))


def _legacy_last(offset: dict[str, Any] | None) -> str | None:
    """The ``{"last": id}`` offset of checkpoints written before offsets named their ids."""
    last = (offset or {}).get("last")
    return last if isinstance(last, str) else None


def _new_ids(start: dict[str, Any] | None, end: dict[str, Any]) -> list[str]:
    """Ids ``end`` names that ``start`` does not (nor covers, for an old ``{"last": id}`` start)."""
    seen, last = _named(start), _legacy_last(start)
    return sorted(i for i in _named(end) if i not in seen and (last is None or i > last))


class _Ids(InputPartition):
    def __init__(self, ids: Sequence[str]) -> None:
        self.ids = list(ids)


def _open_store(options: dict[str, str]) -> ObjectStore:
    from streamoffload.config import StoreSettings

    return StoreSettings(**json.loads(options["store"])).open()


class ControlStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: dict[str, str]) -> None:
        # Spark hands Python data sources their option names lowercased.
        self.options = {k.lower(): v for k, v in options.items()}
        self.key_prefix = self.options.get("keyprefix", "")
        self._store: ObjectStore | None = None
        self._available_now: set[str] | None = None

    @property
    def store(self) -> ObjectStore:
        if self._store is None:
            self._store = _open_store(self.options)
        return self._store

    def initialOffset(self) -> dict[str, Any]:
        return _offset(())

    def latestOffset(self, start: dict[str, Any] | None = None, limit: Any = None) -> dict[str, Any]:
        # Requests are tiny and few: no read limit applies (Spark passes one under AvailableNow).
        start = start if start is not None else self.initialOffset()
        ids = pending_requests(self.store, self.key_prefix)
        if self._available_now is not None:
            ids = [i for i in ids if i in self._available_now]
        end = _offset(ids)
        new = _new_ids(start, end)
        if not new:
            return start  # nothing new (deleted ids alone do not make a batch)
        self._mark_running(new)
        return end

    def _mark_running(self, ids: Sequence[str]) -> None:
        prefix = requests_prefix(self.key_prefix)
        for request_id in ids:
            try:
                request = _get_json(self.store, prefix + request_id)
                # Only what an operator asked for has a status (not the job's own policy wake-ups).
                if request is not None and request.get("kind", "seal") == "seal":
                    record_request_status(
                        self.store,
                        self.key_prefix,
                        request_id,
                        RUNNING,
                        topic=str(request.get("topic", "")),
                        if_absent=True,
                    )
            except StorageError as err:  # only the status display suffers
                log.warning("could not mark offload request %s running: %s", request_id, err)

    def prepareForTriggerAvailableNow(self) -> None:
        # Trigger.AvailableNow: requests made after the query started wait for the next run.
        self._available_now = set(pending_requests(self.store, self.key_prefix))

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        new = _new_ids(start, end)
        return [_Ids(new)] if new else []

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        assert isinstance(partition, _Ids)
        store = _open_store(self.options)
        prefix = requests_prefix(self.key_prefix)
        for request_id in partition.ids:
            request = _get_json(store, prefix + request_id)
            if request is None:
                continue  # deleted meanwhile (e.g. by ``run --once`` after its own seal)
            kind = str(request.get("kind", "seal"))
            value = control_value(kind, request_id, request.get("effective_ms"))
            yield (request["topic"], -1, -1, -1, None, 0, 0, 0, value)

    def commit(self, end: dict[str, Any]) -> None:
        # Only the requests this offset names: one submitted since is not named and survives.
        prefix = requests_prefix(self.key_prefix)
        for request_id in sorted(_named(end)):
            self.store.delete(prefix + request_id)


class ControlDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "streamoffload-control"

    def schema(self) -> str:
        return CONTROL_SCHEMA

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return ControlStreamReader(dict(self.options))
