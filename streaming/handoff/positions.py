"""The positions rows: what the Pulsar source gives the segmenter in the offload job (``positionsOnly``), one row
per entry with its position, size and CRC-32C, not its bytes. Control rows (``streamoffload-control``, and the
job's seal markers) join them with a ``control`` column.

One definition for both sides: the source declares its schema from ``POSITIONS_COLUMNS`` and the control source
from ``CONTROL_COLUMNS``; the segmenter reads the rows back with :meth:`PositionsBatch.read`, by these names.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from streamoffload.streaming.handoff.entry import Entry

TOPIC = "topic"
PARTITION = "partition"
LEDGER_ID = "ledger_id"
ENTRY_ID = "entry_id"
PUBLISH_TIME = "publish_time"
NUM_MESSAGES = "num_messages"
SIZE = "size"
CRC32C = "crc32c"
READ_WAIT_US = "read_wait_us"
"""How long the read limits (``rateLimits``) held the read back just before this entry: the segmenter reports it,
so the job's throttle metric counts the source's waits, not only the sink's."""
CONTROL = "control"
"""A control request's value (``ControlRequest.parse``); None in an entry's row."""

POSITIONS_COLUMNS: tuple[tuple[str, str], ...] = (
    (TOPIC, "string"),
    (PARTITION, "int"),
    (LEDGER_ID, "long"),
    (ENTRY_ID, "long"),
    (PUBLISH_TIME, "timestamp"),
    (NUM_MESSAGES, "int"),
    (SIZE, "int"),
    (CRC32C, "long"),
    (READ_WAIT_US, "long"),
)
"""The columns of ``positionsOnly`` rows, in order, with their Spark SQL types."""
CONTROL_COLUMNS: tuple[tuple[str, str], ...] = (*POSITIONS_COLUMNS, (CONTROL, "string"))
"""The control source's columns: the positions columns (unused, but a union by name needs them) and ``control``."""


def ddl(columns: Iterable[tuple[str, str]]) -> str:
    """A schema as Spark's DDL string."""
    return ", ".join(f"{name} {kind}" for name, kind in columns)


POSITIONS_SCHEMA = ddl(POSITIONS_COLUMNS)
CONTROL_SCHEMA = ddl(CONTROL_COLUMNS)


def control_row(topic: str, value: str) -> tuple[object, ...]:
    """A control row in ``CONTROL_COLUMNS`` order: no position (ledger and entry -1), no entry."""
    return (topic, -1, -1, -1, None, 0, 0, 0, 0, value)


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_ONE_MS = timedelta(milliseconds=1)


def epoch_ms(value: datetime | None) -> int:
    """A row's timestamp as milliseconds since the epoch, exactly (integer arithmetic); 0 for none (a control
    row, a seal marker). Spark hands rows their timestamps with a zone; one without is taken as UTC."""
    if value is None:
        return 0
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return (value - _EPOCH) // _ONE_MS


@dataclass
class PositionsBatch:
    """One topic-partition's input rows of a micro-batch, read back: its entries, its control values, and how
    long the source's read limits held them back."""

    entries: list[Entry] = field(default_factory=list)
    controls: list[str] = field(default_factory=list)
    read_wait_us: int = 0

    @classmethod
    def read(cls, rows: Iterable[Mapping[str, object]]) -> PositionsBatch:
        """``rows`` as dicts by column name (``Row.asDict()``): the positions columns, and ``control`` where the
        job joined the control rows (absent or None in an entry's row)."""
        batch = cls()
        for values in rows:
            batch.read_wait_us += _count(values, READ_WAIT_US)
            control = values.get(CONTROL)
            if control is not None:
                batch.controls.append(str(control))
                continue
            published = values.get(PUBLISH_TIME)
            batch.entries.append(
                Entry(
                    _long(values, LEDGER_ID),
                    _long(values, ENTRY_ID),
                    _long(values, SIZE),
                    _long(values, CRC32C),
                    epoch_ms(published) if isinstance(published, datetime) else 0,
                )
            )
        return batch


def _long(values: Mapping[str, object], column: str) -> int:
    value = values.get(column)
    if not isinstance(value, int):
        raise ValueError(f"a positions row's {column!r} is {value!r}, not an integer")
    return value


def _count(values: Mapping[str, object], column: str) -> int:
    """A column that may be absent or null (0 then)."""
    value = values.get(column)
    return 0 if value is None else _long(values, column)
