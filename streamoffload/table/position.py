"""How far a table has taken its topic from the store: recorded in the summary of every snapshot the sync commits.

Each snapshot's summary holds, besides Iceberg's own counts:

- ``streamoffload.positions``: per topic-partition, the last position whose messages the table holds
  (``{"persistent://t/n/x-partition-0": [ledgerId, entryId], ...}``), for every topic-partition the table
  holds, not only those of this commit: the current snapshot alone says where the table is;
- ``streamoffload.segments``: the segments this commit appended, per topic-partition, by id;
- ``streamoffload.store``: the store the rows came from.

A snapshot committed by someone else (a compaction, another engine) has none of them: the position is then the
latest ancestor's that has. A table with data and no such ancestor was not made by the sync (or lost its history
to a snapshot expiry): reading it as empty would append everything again, so it is refused.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from pyiceberg.table import Table
from pyiceberg.table.snapshots import Snapshot, ancestors_of

from streamoffload.codecs.positions import Position
from streamoffload.table.errors import TableError

POSITIONS = "streamoffload.positions"
SEGMENTS = "streamoffload.segments"
STORE = "streamoffload.store"


class TablePositionError(TableError):
    """A table's snapshots do not say which messages it holds."""


@dataclass(frozen=True)
class TablePosition:
    """Where a table is: its last position per topic-partition, and the snapshot that says so."""

    positions: dict[str, Position] = field(default_factory=dict)
    snapshot_id: int | None = None
    """The current snapshot (None: the table has none)."""

    def of(self, topic: str) -> Position | None:
        return self.positions.get(topic)


def summary_properties(positions: dict[str, Position], segments: dict[str, list[str]], store: str) -> dict[str, str]:
    """The properties a sync's snapshot summary carries (module notes)."""
    return {
        POSITIONS: json.dumps({t: list(p) for t, p in sorted(positions.items())}, separators=(",", ":")),
        SEGMENTS: json.dumps(segments, separators=(",", ":"), sort_keys=True),
        STORE: store,
    }


def _decode_positions(text: str, where: str) -> dict[str, Position]:
    try:
        raw: Any = json.loads(text)
        out: dict[str, Position] = {}
        for topic, position in raw.items():
            ledger, entry = position
            if not (isinstance(topic, str) and type(ledger) is int and type(entry) is int):
                raise ValueError(topic)
            out[topic] = (ledger, entry)
        return out
    except (ValueError, TypeError, AttributeError):
        raise TablePositionError(f"{where}: {POSITIONS} is not a map of topic-partitions to [ledger, entry]") from None


def segments_of(snapshot: Snapshot) -> dict[str, list[str]]:
    """The segments a snapshot's commit appended, per topic-partition ({} for one the sync did not commit)."""
    text = snapshot.summary[SEGMENTS] if snapshot.summary is not None else None
    if not text:
        return {}
    try:
        raw = json.loads(text)
        return {str(t): [str(s) for s in ids] for t, ids in raw.items()}
    except (ValueError, TypeError, AttributeError):
        raise TablePositionError(f"snapshot {snapshot.snapshot_id}: {SEGMENTS} is not a map of lists") from None


def table_position(table: Table) -> TablePosition:
    """The position of ``table`` as its current snapshot (or latest ancestor with one) records it."""
    current = table.current_snapshot()
    if current is None:
        return TablePosition()
    name = ".".join(table.name())
    for snapshot in ancestors_of(current, table.metadata):
        text = snapshot.summary[POSITIONS] if snapshot.summary is not None else None
        if text:
            where = f"table {name}, snapshot {snapshot.snapshot_id}"
            return TablePosition(_decode_positions(text, where), current.snapshot_id)
    records = current.summary["total-records"] if current.summary is not None else None
    if records in (None, "0"):
        return TablePosition({}, current.snapshot_id)
    raise TablePositionError(
        f"table {name} holds {records} rows but none of its snapshots records which messages "
        f"({POSITIONS}): it was not written by `streamoffload table sync`, or its history was expired; "
        "run `streamoffload table rebuild` to derive it from the store again"
    )
