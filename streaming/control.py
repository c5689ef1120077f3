"""Control requests (manual ``offload-now``, and ``run --once``'s final seal) as a streaming source.

A request is a small JSON object in the store under ``<prefix>/_control/requests/<id>``; ids sort by
time. The ``streamoffload-control`` source turns new requests into rows with the Pulsar source's
schema plus a ``control`` column, unioned into the segmenter's input. Because requests travel
through a source, Spark records them in its offset log: a replayed micro-batch sees exactly the
requests the failed attempt saw, which keeps the segmenter deterministic.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow

from streamoffload.storage.base import ObjectNotFoundError, ObjectStore

SOURCE_SCHEMA = (
    "topic STRING, partition INT, ledger_id LONG, entry_id LONG, publish_time TIMESTAMP, "
    "num_messages INT, entry BINARY, size INT"
)
CONTROL_SCHEMA = SOURCE_SCHEMA + ", control STRING"

REQUESTS_DIR = "_control/requests/"


def requests_prefix(key_prefix: str) -> str:
    return f"{key_prefix.strip('/')}/{REQUESTS_DIR}" if key_prefix.strip("/") else REQUESTS_DIR


def new_request_id() -> str:
    return f"{time.time_ns():020d}-{uuid.uuid4().hex[:12]}"


def submit_requests(store: ObjectStore, key_prefix: str, topics: Sequence[str], kind: str = "seal") -> list[str]:
    """Write one request per topic-partition; returns the request ids."""
    ids = []
    for topic in topics:
        request_id = new_request_id()
        body = json.dumps({"topic": topic, "kind": kind, "requested_ms": int(time.time() * 1000), "pid": os.getpid()})
        store.put(requests_prefix(key_prefix) + request_id, body.encode())
        ids.append(request_id)
    return ids


def pending_requests(store: ObjectStore, key_prefix: str) -> list[str]:
    prefix = requests_prefix(key_prefix)
    return [info.key[len(prefix) :] for info in store.list(prefix)]


class _Range(InputPartition):
    def __init__(self, after: str, upto: str) -> None:
        self.after, self.upto = after, upto


def _open_store(options: dict[str, str]) -> ObjectStore:
    from streamoffload.config import StoreSettings

    return StoreSettings(**json.loads(options["store"])).open()


class ControlStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: dict[str, str]) -> None:
        # Spark hands Python data sources their option names lowercased.
        self.options = {k.lower(): v for k, v in options.items()}
        self.key_prefix = self.options.get("keyprefix", "")
        self._store: ObjectStore | None = None
        self._available_now: str | None = None

    @property
    def store(self) -> ObjectStore:
        if self._store is None:
            self._store = _open_store(self.options)
        return self._store

    def initialOffset(self) -> dict[str, str]:
        return {"last": ""}

    def latestOffset(self, start: dict[str, str] | None = None, limit: Any = None) -> dict[str, str]:
        # Requests are tiny and few: no read limit applies (Spark passes one under AvailableNow).
        ids = pending_requests(self.store, self.key_prefix)
        last = max(ids) if ids else ""
        if self._available_now is not None:
            last = min(last, self._available_now)
        return {"last": last}

    def prepareForTriggerAvailableNow(self) -> None:
        # Trigger.AvailableNow: requests made after the query started wait for the next run.
        ids = pending_requests(self.store, self.key_prefix)
        self._available_now = max(ids) if ids else ""

    def partitions(self, start: dict[str, str], end: dict[str, str]) -> Sequence[InputPartition]:
        if end["last"] <= start["last"]:
            return []
        return [_Range(start["last"], end["last"])]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        assert isinstance(partition, _Range)
        store = _open_store(self.options)
        prefix = requests_prefix(self.key_prefix)
        for request_id in pending_requests(store, self.key_prefix):
            if not (partition.after < request_id <= partition.upto):
                continue
            try:
                request = json.loads(store.get(prefix + request_id))
            except ObjectNotFoundError:
                continue
            yield (request["topic"], -1, -1, -1, None, 0, None, 0, request.get("kind", "seal"))

    def commit(self, end: dict[str, str]) -> None:
        # Requests at or before a committed offset are never read again.
        prefix = requests_prefix(self.key_prefix)
        for request_id in pending_requests(self.store, self.key_prefix):
            if request_id <= end["last"]:
                self.store.delete(prefix + request_id)


class ControlDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "streamoffload-control"

    def schema(self) -> str:
        return CONTROL_SCHEMA

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return ControlStreamReader(dict(self.options))
