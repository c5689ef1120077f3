"""Control requests (manual ``offload-now``, and ``run --once``'s final seal) as a streaming source.

The requests and their status records are plain objects in the store (``checkpoints/control_requests.py``).
The ``streamoffload-control`` source turns new requests into rows with the Pulsar source's
``positionsOnly`` schema plus a ``control`` column (a JSON string ``{"kind": "seal", "id": "<request id>"}``),
unioned into the segmenter's input.

Requests travel through a source so that Spark records them in its offset log. An offset names
exactly the requests it covers (``{"ids": [...]}``, the sorted ids pending when Spark asked for
it): a micro-batch reads the ids of its end offset that its start offset does not name, by GETting
those ids (never by listing at execution time), so a replayed micro-batch sees exactly the requests
the failed attempt saw; ``commit`` deletes only the ids its offset names. A request deleted
meanwhile is skipped. Every pending id stays named in each offset until its deletion, so an id once
read is never read again, and a request that no offset names yet is never deleted. The source marks a
request "running" when it first puts it in an offset.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow

from streamoffload.checkpoints.control_requests import (
    RUNNING,
    control_value,
    pending_requests,
    read_request,
    record_request_status,
    requests_prefix,
)
from streamoffload.storage.base import StorageError
from streamoffload.storage.location import ScopedStore, StoreLocation
from streamoffload.streaming.handoff.positions import CONTROL_SCHEMA, control_row

log = logging.getLogger(__name__)

# --- the streaming source ---------------------------------------------------------------------------


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


def _open_store(options: dict[str, str]) -> ScopedStore:
    """The store the ``store`` option names: a ``StoreLocation`` as JSON (the job writes ``asdict`` of it)."""
    return StoreLocation(**json.loads(options["store"])).open()


class ControlStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: dict[str, str]) -> None:
        # Spark hands Python data sources their option names lowercased.
        self.options = {k.lower(): v for k, v in options.items()}
        self._store: ScopedStore | None = None
        self._available_now: set[str] | None = None

    @property
    def scoped(self) -> ScopedStore:
        if self._store is None:
            self._store = _open_store(self.options)
        return self._store

    def initialOffset(self) -> dict[str, Any]:
        return _offset(())

    def latestOffset(self, start: dict[str, Any] | None = None, limit: Any = None) -> dict[str, Any]:
        # Requests are tiny and few: no read limit applies (Spark passes one under AvailableNow).
        start = start if start is not None else self.initialOffset()
        ids = pending_requests(self.scoped)
        if self._available_now is not None:
            ids = [i for i in ids if i in self._available_now]
        end = _offset(ids)
        new = _new_ids(start, end)
        if not new:
            return start  # nothing new (deleted ids alone do not make a batch)
        self._mark_running(new)
        return end

    def _mark_running(self, ids: Sequence[str]) -> None:
        for request_id in ids:
            try:
                request = read_request(self.scoped, request_id)
                # Only what an operator asked for has a status (not the job's own policy wake-ups).
                if request is not None and request.get("kind", "seal") == "seal":
                    record_request_status(
                        self.scoped,
                        request_id,
                        RUNNING,
                        topic=str(request.get("topic", "")),
                        if_absent=True,
                    )
            except StorageError as err:  # only the status display suffers
                log.warning("could not mark offload request %s running: %s", request_id, err)

    def prepareForTriggerAvailableNow(self) -> None:
        # Trigger.AvailableNow: requests made after the query started wait for the next run.
        self._available_now = set(pending_requests(self.scoped))

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        new = _new_ids(start, end)
        return [_Ids(new)] if new else []

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        assert isinstance(partition, _Ids)
        scoped = _open_store(self.options)
        for request_id in partition.ids:
            request = read_request(scoped, request_id)
            if request is None:
                continue  # deleted meanwhile (e.g. by ``run --once`` after its own seal)
            kind = str(request.get("kind", "seal"))
            value = control_value(kind, request_id, request.get("effective_ms"))
            yield control_row(request["topic"], value)

    def commit(self, end: dict[str, Any]) -> None:
        # Only the requests this offset names: one submitted since is not named and survives.
        prefix = requests_prefix(self.scoped.prefix)
        for request_id in sorted(_named(end)):
            self.scoped.store.delete(prefix + request_id)


class ControlDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "streamoffload-control"

    def schema(self) -> str:
        return CONTROL_SCHEMA

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return ControlStreamReader(dict(self.options))
