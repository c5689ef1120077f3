"""What a topic's Iceberg table is: its name, schema and partitioning, and its rows from the dataset reader's.

One table per topic: a partitioned topic's partitions share one table, partitioned by ``partition`` and by
day of ``__publishTime``; a plain topic's table by day alone. The identifier is the topic's tenant, namespace
and local name (``public.default.orders``), as Pulsar SQL named tables.

Columns are pulsar-spark's (``__key``, ``value``, ``__topic``, ``__messageId``, ``__publishTime``,
``__eventTime``, ``__messageProperties``) and the position of each message in the topic (``ledger_id``,
``entry_id``, ``batch_index``: -1 when not batched, ``partition``: -1 for a topic that is not partitioned). The
rows come from ``read.dataset_read`` (the ``pulsar-offloaded`` reader's Arrow batches), renamed here:
there is one message decoder in the project.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import DayTransform, IdentityTransform
from pyiceberg.types import (
    BinaryType,
    IntegerType,
    LongType,
    MapType,
    NestedField,
    StringType,
    TimestamptzType,
)

from streamoffload.codecs.topics import TopicName

Identifier = tuple[str, str, str]

SCHEMA = Schema(
    NestedField(1, "__key", BinaryType(), required=False),
    NestedField(2, "value", BinaryType(), required=False),
    NestedField(3, "__topic", StringType(), required=True),
    NestedField(4, "__messageId", BinaryType(), required=True),
    NestedField(5, "__publishTime", TimestamptzType(), required=True),
    NestedField(6, "__eventTime", TimestamptzType(), required=False),
    NestedField(
        7,
        "__messageProperties",
        MapType(key_id=12, key_type=StringType(), value_id=13, value_type=StringType(), value_required=False),
        required=True,
    ),
    NestedField(8, "ledger_id", LongType(), required=True),
    NestedField(9, "entry_id", LongType(), required=True),
    NestedField(10, "batch_index", IntegerType(), required=True),
    NestedField(11, "partition", IntegerType(), required=True),
)

_COLUMNS = [f.name for f in SCHEMA.fields]
# The dataset reader's column for each table column that is not named the same.
_RENAMED = {"ledger_id": "__ledgerId", "entry_id": "__entryId", "batch_index": "__batchIndex"}

DAY_FIELD = "__publishTime_day"


def partition_spec(partitioned: bool) -> PartitionSpec:
    """By ``partition`` (a partitioned topic only), then by day of ``__publishTime``."""
    fields = [PartitionField(source_id=5, field_id=1001, transform=DayTransform(), name=DAY_FIELD)]
    if partitioned:
        fields.insert(0, PartitionField(source_id=11, field_id=1000, transform=IdentityTransform(), name="partition"))
    return PartitionSpec(*fields)


def table_topic(topic: str | TopicName) -> TopicName:
    """The topic a topic-partition's table is for: a partitioned topic, for one of its partitions."""
    return (topic if isinstance(topic, TopicName) else TopicName.parse(topic)).base


def identifier(topic: str | TopicName) -> Identifier:
    """The table's identifier: ``(tenant, namespace, local name)`` of the (partitioned) topic."""
    base = table_topic(topic)
    return (base.tenant, base.namespace, base.local_name)


def rows_of(batch: pa.RecordBatch, partition: int) -> dict[str, pa.Array]:
    """A record batch of ``read.dataset_read.MESSAGE_ARROW_SCHEMA`` as the table's columns by name, in the reader's
    types (``table.data_files`` writes them as they are: no copy)."""
    columns: dict[str, pa.Array] = {}
    for name in _COLUMNS:
        if name == "partition":
            columns[name] = pa.array(np.full(batch.num_rows, partition, dtype=np.int32))
        else:
            columns[name] = batch.column(_RENAMED.get(name, name))
    return columns
