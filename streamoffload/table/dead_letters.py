"""The dead-letter table of a topic with a value schema: the records whose value does not decode, never dropped.

``public.default.orders__dead_letters`` beside ``public.default.orders``: each record that does not fit the
schema (``table.schema``), with the error (one line, naming the field), its position (``ledger_id``,
``entry_id``, ``batch_index``, ``partition``), ``__topic``, ``__messageId``, ``__publishTime`` and its raw
``value``. The record stays in the topic's table too (raw columns, ``value_decoded`` null): the table holds every
message, the dead letters say which did not decode and why.

**Exactly once.** Iceberg commits one table at a time, so a sync commits the dead letters of a step first, with
the same ``streamoffload.positions`` summary as the topic table's commit that follows (``table.position``; its own
where it is ahead: its positions never go back). A
crash between the two leaves the dead-letter table ahead; the repeated step writes only dead letters past its
position (``past``), so none is written twice and none is lost. Unpartitioned: a few rows, in few files.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.schema import Schema
from pyiceberg.types import BinaryType, IntegerType, LongType, NestedField, StringType, TimestamptzType

from streamoffload.codecs.positions import Position
from streamoffload.table.layout import Identifier

SUFFIX = "__dead_letters"

SCHEMA = Schema(
    NestedField(1, "ledger_id", LongType(), required=True),
    NestedField(2, "entry_id", LongType(), required=True),
    NestedField(3, "batch_index", IntegerType(), required=True),
    NestedField(4, "partition", IntegerType(), required=True),
    NestedField(5, "__topic", StringType(), required=True),
    NestedField(6, "__messageId", BinaryType(), required=True),
    NestedField(7, "__publishTime", TimestamptzType(), required=True),
    NestedField(8, "value", BinaryType(), required=False),
    NestedField(9, "error", StringType(), required=True),
)
ARROW_SCHEMA = SCHEMA.as_arrow()


def identifier(table: Identifier) -> Identifier:
    """The dead-letter table of the topic table ``table``."""
    return (table[0], table[1], table[2] + SUFFIX)


def dead_letter_rows(rows: pa.Table, errors: list[tuple[int, str]]) -> pa.Table:
    """The rows of the topic table's ``rows`` at the indices of ``errors``, with their error, as dead letters."""
    picked = rows.take(pa.array([i for i, _ in errors], pa.int64()))
    columns = [
        pa.array([" ".join(e.split()) for _, e in errors], pa.string()) if f.name == "error" else picked.column(f.name)
        for f in ARROW_SCHEMA
    ]
    return pa.Table.from_arrays(columns, names=ARROW_SCHEMA.names).cast(ARROW_SCHEMA)


def past(rows: pa.Table, position: Position | None) -> pa.Table:
    """The dead letters of ``rows`` after ``position`` (the dead-letter table's, for their topic-partition)."""
    if position is None or rows.num_rows == 0:
        return rows
    ledger, entry = rows.column("ledger_id"), rows.column("entry_id")
    after = pc.or_(
        pc.greater(ledger, position[0]), pc.and_(pc.equal(ledger, position[0]), pc.greater(entry, position[1]))
    )
    return rows.filter(after)
