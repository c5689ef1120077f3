"""``table.data_files.DataFileWriter``: the sync's data files, written by pyarrow directly, carry what pyiceberg's own
writer gives for the same rows (partition, counts, bounds, field ids), one per table partition."""

from __future__ import annotations

import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.io.pyarrow import _dataframe_to_data_files
from pyiceberg.manifest import DataFile
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.table import Table
from pyiceberg.transforms import BucketTransform

from streamoffload.table import layout
from streamoffload.table.data_files import DataFileWriter
from streamoffload.table.sync import TABLE_PROPERTIES

DAY_US = 86_400_000_000
DAY0 = 20_000 * DAY_US  # 2024-10-04


def new_table(tmp_path: Path, partitioned: bool) -> Table:
    catalog = SqlCatalog("t", uri=f"sqlite:///{tmp_path}/c.db", warehouse=f"file://{tmp_path}/wh")
    catalog.create_namespace("n")
    spec = layout.partition_spec(partitioned)
    return catalog.create_table(("n", "t"), layout.SCHEMA, partition_spec=spec, properties=TABLE_PROPERTIES)


def columns(publish_us: list[int], partition: int) -> dict[str, pa.Array]:
    """Message rows in the dataset reader's types (``read.dataset_read.MESSAGE_ARROW_SCHEMA``)."""
    n = len(publish_us)
    ts = pa.timestamp("us", tz="UTC")
    return {
        "__key": pa.array([None if i % 3 == 0 else b"k%d" % (i % 2) for i in range(n)], pa.binary()),
        "value": pa.array([b"v" * (i + 1) for i in range(n)], pa.binary()),
        "__topic": pa.array(["persistent://t/n/x"] * n, pa.string()),
        "__messageId": pa.array([b"id%03d" % i for i in range(n)], pa.binary()),
        "__publishTime": pa.array(publish_us, ts),
        "__eventTime": pa.array([None] * n, ts),
        "__messageProperties": pa.array([[("a", str(i))] for i in range(n)], pa.map_(pa.string(), pa.string())),
        "ledger_id": pa.array([7] * n, pa.int64()),
        "entry_id": pa.array(list(range(10, 10 + n)), pa.int64()),
        "batch_index": pa.array([-1] * n, pa.int32()),
        "partition": pa.array([partition] * n, pa.int32()),
    }


def stats(f: DataFile) -> tuple[object, ...]:
    return (
        tuple(f.partition[i] for i in range(len(f.partition))),
        f.record_count,
        f.value_counts,
        f.null_value_counts,
        f.lower_bounds,
        f.upper_bounds,
    )


def test_the_files_carry_what_pyicebergs_writer_gives_one_per_partition(tmp_path: Path) -> None:
    table = new_table(tmp_path, partitioned=True)
    writer = DataFileWriter(table)
    # Rows of two days (a segment across midnight): two files.
    publish = [DAY0 + DAY_US - 2, DAY0 + DAY_US - 1, DAY0 + DAY_US, DAY0 + DAY_US + 5]
    rows = writer.rows(columns(publish, 3), len(publish))
    assert rows.schema.field("__key").type == pa.binary()  # the reader's types: nothing cast
    files = writer.write(rows, uuid.UUID(int=1))
    theirs = list(_dataframe_to_data_files(table.metadata, rows.cast(table.schema().as_arrow()), table.io))
    assert sorted(map(stats, files)) == sorted(map(stats, theirs))
    assert [stats(f)[0] for f in files] == [(3, 20_000), (3, 20_001)]
    assert [f.record_count for f in files] == [2, 2]
    assert [f.spec_id for f in files] == [table.spec().spec_id] * 2
    assert [Path(f.file_path).name for f in files] == [f"00000-{i}-{uuid.UUID(int=1)}.parquet" for i in (0, 1)]
    assert "/partition=3/__publishTime_day=2024-10-04/" in files[0].file_path
    for f in files:
        path = f.file_path.removeprefix("file://")
        assert f.file_size_in_bytes == Path(path).stat().st_size
        parquet = pq.ParquetFile(path)
        assert parquet.metadata.row_group(0).column(0).compression == "ZSTD"
        ids = [parquet.schema_arrow.field(n).metadata[b"PARQUET:field_id"] for n in parquet.schema_arrow.names]
        assert ids == [str(i).encode() for i in range(1, 12)]
    # Committed, pyiceberg reads them back by field id, row for row.
    with table.transaction() as tx, tx.update_snapshot().fast_append() as append:
        for f in files:
            append.append_data_file(f)
    back = table.scan().to_arrow().sort_by("entry_id")
    assert back.column("entry_id").to_pylist() == [10, 11, 12, 13]
    assert back.column("__key").to_pylist() == [None, b"k1", b"k0", None]
    assert back.column("__messageProperties").to_pylist() == [[("a", str(i))] for i in range(4)]


def test_a_messages_own_bytes_are_written_without_a_dictionary(tmp_path: Path) -> None:
    """A message's value and id are its own: no dictionary for them (it would hold every value once more); the
    other columns keep theirs, the map's key and value too."""
    table = new_table(tmp_path, partitioned=False)
    writer = DataFileWriter(table)
    [f] = writer.write(writer.rows(columns([DAY0 + i for i in range(50)], -1), 50), uuid.UUID(int=4))
    group = pq.ParquetFile(f.file_path.removeprefix("file://")).metadata.row_group(0)
    dictionary = {group.column(i).path_in_schema: group.column(i).has_dictionary_page for i in range(12)}
    assert dictionary == {
        "__key": True,
        "value": False,
        "__topic": True,
        "__messageId": False,
        "__publishTime": True,
        "__eventTime": True,
        "__messageProperties.key_value.key": True,
        "__messageProperties.key_value.value": True,
        "ledger_id": True,
        "entry_id": True,
        "batch_index": True,
        "partition": True,
    }
    back = pq.read_table(f.file_path.removeprefix("file://"))
    assert back.column("value").to_pylist() == [b"v" * (i + 1) for i in range(50)]
    assert back.column("__messageId").to_pylist() == [b"id%03d" % i for i in range(50)]


def test_one_partition_is_one_file_and_a_missing_optional_column_is_null(tmp_path: Path) -> None:
    table = new_table(tmp_path, partitioned=False)
    writer = DataFileWriter(table)
    given = columns([DAY0 + 1, DAY0 + 2, DAY0 + 3], -1)
    del given["__eventTime"]
    [f] = writer.write(writer.rows(given, 3), uuid.UUID(int=2))
    assert stats(f)[0] == (20_000,)
    assert f.null_value_counts[6] == 3
    assert writer.write(writer.rows(columns([], -1), 0), uuid.UUID(int=3)) == []


def test_a_spec_with_another_transform_is_written_by_pyicebergs_writer(tmp_path: Path) -> None:
    catalog = SqlCatalog("t", uri=f"sqlite:///{tmp_path}/c.db", warehouse=f"file://{tmp_path}/wh")
    catalog.create_namespace("n")
    spec = PartitionSpec(PartitionField(source_id=9, field_id=1000, transform=BucketTransform(2), name="b"))
    table = catalog.create_table(("n", "t"), layout.SCHEMA, partition_spec=spec, properties=TABLE_PROPERTIES)
    writer = DataFileWriter(table)
    files = writer.write(writer.rows(columns([DAY0 + i for i in range(6)], -1), 6), uuid.UUID(int=4))
    assert sum(f.record_count for f in files) == 6 and len(files) == len({f.partition[0] for f in files})
    with table.transaction() as tx, tx.update_snapshot().fast_append() as append:
        for f in files:
            append.append_data_file(f)
    assert sorted(table.scan().to_arrow().column("entry_id").to_pylist()) == list(range(10, 16))
