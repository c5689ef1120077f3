"""The positions rows, defined once (``streaming.handoff.positions``): the rows the source builds read back as the
segmenter's entries, exactly; control rows as its control values; both schemas name the same columns."""

from __future__ import annotations

import pyarrow as pa

from streamoffload.streaming.handoff.entry import Entry
from streamoffload.streaming.handoff.positions import (
    CONTROL_COLUMNS,
    CONTROL_SCHEMA,
    POSITIONS_COLUMNS,
    POSITIONS_SCHEMA,
    PositionsBatch,
    control_row,
)
from streamoffload.streaming.source.pulsar_source import rows_batch

ARROW = {"string": pa.string(), "int": pa.int32(), "long": pa.int64(), "timestamp": pa.timestamp("us", tz="UTC")}
"""Spark's Arrow types for the DDL types (``to_arrow_schema``, without a session)."""


def test_the_sources_rows_read_back_as_the_segmenters_entries() -> None:
    schema = pa.schema([(name, ARROW[kind]) for name, kind in POSITIONS_COLUMNS])
    published_us = [1_700_000_000_123_000, None]
    batch = rows_batch(
        schema,
        ["persistent://t/n/a-partition-1"] * 2,
        [1, 1],
        [7, 7],
        [41, 42],
        published_us,
        [3, 1],
        None,
        [100, 2**31 - 1],
        [0xDEADBEEF, 1],
        [250, 1_000_000],
    )
    read = PositionsBatch.read(batch.to_pylist())
    assert read.entries == [Entry(7, 41, 100, 0xDEADBEEF, 1_700_000_000_123), Entry(7, 42, 2**31 - 1, 1, 0)]
    assert read.controls == []
    assert read.read_wait_us == 1_000_250


def test_control_rows_read_back_as_control_values_and_name_the_same_columns() -> None:
    names = [name for name, _ in CONTROL_COLUMNS]
    assert names == [name for name, _ in POSITIONS_COLUMNS] + ["control"]
    assert CONTROL_SCHEMA.startswith(POSITIONS_SCHEMA + ", ")
    row = control_row("persistent://t/n/a", '{"kind": "seal", "id": "r1"}')
    assert len(row) == len(names)
    read = PositionsBatch.read([dict(zip(names, row, strict=True)), {"control": "seal", "read_wait_us": None}])
    assert read.entries == [] and read.controls == ['{"kind": "seal", "id": "r1"}', "seal"]
    assert read.read_wait_us == 0
