"""Offloaded topics as a Spark DataFrame: ``spark.read.format("pulsar-offloaded")`` (a batch source).

Reads the ``Offloaded`` segments of a store (filesystem or S3) straight from their objects, no broker
involved; the planning and reading are ``read.dataset_read`` (plain Python). Register it with
``streamoffload.streaming.register(spark)``.

Options (names are case-insensitive, as Spark makes them):

``store``, ``s3.endpoint``, ``s3.region``
    ``file:///dir`` (or a path) or ``s3://bucket[/prefix]``; the S3 endpoint and region of an
    S3-compatible store (credentials come from the AWS chain).
``conf``
    A configuration file (``conf/streamoffload.toml``): its ``[store]`` where ``store`` is not given, and its
    ``[encryption] keysFile`` where ``keysFile`` is not. One of ``store`` and ``conf`` is required.
``topics`` (comma list; ``topic`` for one) or ``topicsPattern`` (``[persistent://]tenant/ns/REGEX``)
    A partitioned topic expands to the partitions the store holds; the regex matches a topic's local
    name, or its partitioned topic's, among the topics in the store.
``startingOffsets`` / ``endingOffsets``
    Positions as JSON ``{topic-partition: [ledgerId, entryId]}`` (a partitioned topic's name applies to
    its partitions, ``"*"`` to topics not named), as the live ``pulsar`` source's offsets: a start is the
    last position already processed (reading starts after it; ``[L, -1]`` starts at ledger L), an end is
    the last position read. Defaults ``earliest`` / ``latest`` (everything offloaded).
``startingTime`` / ``endingTime``
    Publish-time bounds ``[startingTime, endingTime)``: ms since the epoch or ISO-8601 (UTC unless it
    says otherwise).
``output``
    ``messages`` (default): one row per message, pulsar-spark's columns (``value``, ``__key``,
    ``__topic``, ``__messageId``, ``__publishTime``, ``__eventTime``, ``__messageProperties``) and
    ``__ledgerId``, ``__entryId``, ``__batchIndex``, ``__sequenceId``, ``__producerName``.
    ``entries``: one row per stored entry (``topic``, ``ledger_id``, ``entry_id``, ``entry``,
    ``num_messages``, ``publish_time``); encrypted entries come back as stored (they fail ``messages``).
``keysFile``
    The key file (JSON or TOML of key id = base64 key) of segments encrypted at rest; the environment's keys
    (``STREAMOFFLOAD_KEYS_FILE``, ``STREAMOFFLOAD_KEK_<id>``) are used too (``checkpoints.keyring``).
``maxPartitionBytes`` (32 MiB), ``openCostInBytes`` (4 MiB), ``publishTimeSkewMs`` (1000), ``readBufferSize`` (1 MiB)
    A segment larger than ``maxPartitionBytes`` is read by several tasks, each a run of whole blocks, and smaller
    ones are packed into a Spark partition up to it, each counted its size plus ``openCostInBytes`` (Spark's
    file sources' rule and names); the publish-time slack of pruning (see ``offloaded_read``); the ranged-GET
    size.
``maxMessageSize`` (5 MiB, Pulsar's broker default)
    The broker's ``maxMessageSize``: a compressed payload inflates to at most this plus 1 MiB of batch framing
    (``codecs.compression.max_uncompressed``); one that declares more is refused, naming its entry.

Filters in the query (``where``) on the publish time, topic, ledger id (and entry id with
``ledgerId =``) and ``__messageId =`` are pushed down (PySpark >= 4.1; ``register`` turns on
``spark.sql.python.filterPushdown.enabled``): they prune segments and blocks like the options, and Spark
still evaluates them on the rows.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from google.protobuf.message import DecodeError
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
    LessThan,
    LessThanOrEqual,
)
from pyspark.sql.types import StructType

from streamoffload.checkpoints.keyring import KeyRing
from streamoffload.codecs.blocks import MAX_ID
from streamoffload.codecs.compression import MAX_MESSAGE_SIZE, max_uncompressed
from streamoffload.codecs.proto.pulsar_api_pb2 import MessageIdData
from streamoffload.config import load_config
from streamoffload.errors import ConfigError
from streamoffload.read import dataset_plan as ofp
from streamoffload.read import dataset_read as ofr
from streamoffload.storage.location import StoreLocation, parse_store_url
from streamoffload.streaming.runtime.worker_gc import freeze_long_lived
from streamoffload.streaming.source.option_values import parse_size, parse_topic
from streamoffload.streaming.source.source_options import StartSpec, parse_pattern, parse_starting_offsets

if TYPE_CHECKING:
    import pyarrow as pa

SOURCE_NAME = "pulsar-offloaded"


@dataclass(frozen=True)
class OffloadedOptions:
    location: StoreLocation
    topics: tuple[str, ...] = ()
    topics_pattern: str | None = None
    starting: StartSpec = "earliest"
    ending: StartSpec = "latest"
    times: ofp.TimeBounds = field(default_factory=ofp.TimeBounds)
    output: str = ofr.OUTPUT_MESSAGES
    max_partition_bytes: int = ofp.DEFAULT_MAX_PARTITION_BYTES
    open_cost: int = ofp.DEFAULT_OPEN_COST_BYTES
    skew_ms: int = ofp.DEFAULT_SKEW_MS
    read_buffer_size: int = 1 << 20
    keys_file: str | None = None
    max_message_size: int = MAX_MESSAGE_SIZE

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> OffloadedOptions:
        """Validate the options (any letter case); errors name the option."""
        opts = {k.lower(): v for k, v in options.items()}

        def get(name: str) -> str | None:
            value = opts.get(name.lower())
            return None if value is None or str(value).strip() == "" else str(value).strip()

        store, conf = get("store"), get("conf")
        if not store and not conf:
            raise ConfigError(
                "option store is required: file:///dir or s3://bucket/prefix (or conf: a configuration file)"
            )
        config = load_config(conf) if conf else None
        if store:
            location = parse_store_url(store, endpoint=get("s3.endpoint"), region=get("s3.region"))
        else:
            assert config is not None
            location = config.store.location
        single, many, pattern = get("topic"), get("topics"), get("topicsPattern")
        if single and many:
            raise ConfigError("give the option topic or topics, not both")
        names = many or single
        if bool(names) == bool(pattern):
            raise ConfigError("give exactly one of the options topics (a comma list) and topicsPattern (a regex)")
        topics = tuple(dict.fromkeys(parse_topic(t, "topics") for t in (names or "").split(",") if t.strip()))
        if names and not topics:
            raise ConfigError(f"option topics: no topic names in {names!r}")
        if pattern:
            parse_pattern(pattern)
        starting = parse_starting_offsets(get("startingOffsets") or "earliest", "startingOffsets")
        ending = parse_starting_offsets(get("endingOffsets") or "latest", "endingOffsets")
        if starting == "latest":
            raise ConfigError("option startingOffsets: 'latest' is not a start for a batch read (use earliest or JSON)")
        if ending == "earliest":
            raise ConfigError("option endingOffsets: 'earliest' is not an end for a batch read (use latest or JSON)")
        lo, hi = get("startingTime"), get("endingTime")
        times = ofp.TimeBounds(
            None if lo is None else ofp.parse_time(lo, "startingTime"),
            None if hi is None else ofp.parse_time(hi, "endingTime"),
        )
        output = (get("output") or ofr.OUTPUT_MESSAGES).lower()
        if output not in ofr.OUTPUTS:
            raise ConfigError(f"option output: expected messages or entries, got {get('output')!r}")
        skew = get("publishTimeSkewMs") or str(ofp.DEFAULT_SKEW_MS)
        if not re.fullmatch(r"\d+", skew):
            raise ConfigError(f"option publishTimeSkewMs: expected milliseconds (an integer >= 0), got {skew!r}")
        max_bytes = parse_size(get("maxPartitionBytes") or str(ofp.DEFAULT_MAX_PARTITION_BYTES), "maxPartitionBytes")
        read_buffer = parse_size(get("readBufferSize") or "1m", "readBufferSize")
        if max_bytes <= 0 or read_buffer <= 0:
            raise ConfigError("options maxPartitionBytes and readBufferSize must be positive")
        open_cost = parse_size(get("openCostInBytes") or str(ofp.DEFAULT_OPEN_COST_BYTES), "openCostInBytes")
        max_message = parse_size(get("maxMessageSize") or str(MAX_MESSAGE_SIZE), "maxMessageSize")
        if max_message <= 0:
            raise ConfigError(f"option maxMessageSize must be positive, got {get('maxMessageSize')!r}")
        return cls(
            location=location,
            topics=topics,
            topics_pattern=pattern,
            starting=starting,
            ending=ending,
            times=times,
            output=output,
            max_partition_bytes=max_bytes,
            open_cost=open_cost,
            skew_ms=int(skew),
            read_buffer_size=read_buffer,
            keys_file=get("keysFile") or (config.encryption.keys_file if config is not None else None) or None,
            max_message_size=max_message,
        )

    @property
    def schema(self) -> str:
        return ofr.MESSAGE_SCHEMA if self.output == ofr.OUTPUT_MESSAGES else ofr.ENTRY_SCHEMA

    @property
    def columns(self) -> tuple[str, ...]:
        return ofr.MESSAGE_COLUMNS if self.output == ofr.OUTPUT_MESSAGES else ofr.ENTRY_COLUMNS


# --- pushed filters -------------------------------------------------------------------------------------


def _value_ms(value: Any) -> int | None:
    if isinstance(value, datetime):
        return ofp.datetime_ms(value)
    return None


@dataclass
class PushedBounds:
    """What the query's filters say about publish time, topics and positions (used for pruning only)."""

    times: ofp.TimeBounds = field(default_factory=ofp.TimeBounds)
    topics: set[str] | None = None
    _positions: ofp.PositionBounds = field(default_factory=ofp.PositionBounds)
    _ledger_eq: int | None = None
    _entry_filters: list[Filter] = field(default_factory=list)

    @property
    def positions(self) -> ofp.PositionBounds:
        """Position bounds: from ledger id filters, and entry id filters when the ledger id is fixed."""
        bounds = self._positions
        if self._ledger_eq is None:
            return bounds
        ledger = self._ledger_eq
        for f in self._entry_filters:
            entry = f.value  # type: ignore[attr-defined]
            if isinstance(f, EqualTo):
                bounds = bounds.narrowed((ledger, entry), (ledger, entry))
            elif isinstance(f, GreaterThan):
                bounds = bounds.narrowed((ledger, entry + 1), None)
            elif isinstance(f, GreaterThanOrEqual):
                bounds = bounds.narrowed((ledger, entry), None)
            elif isinstance(f, LessThan):
                bounds = bounds.narrowed(None, (ledger, entry - 1) if entry > 0 else (ledger - 1, MAX_ID))
            elif isinstance(f, LessThanOrEqual):
                bounds = bounds.narrowed(None, (ledger, entry))
        return bounds

    def add(self, f: Filter, columns: Sequence[str]) -> None:
        attribute = getattr(f, "attribute", None)
        name = attribute[0] if isinstance(attribute, tuple) and len(attribute) == 1 else None
        if name is None:
            return
        messages = "value" in columns
        publish, topic = ("__publishTime", "__topic") if messages else ("publish_time", "topic")
        ledger, entry = ("__ledgerId", "__entryId") if messages else ("ledger_id", "entry_id")
        if name == publish:
            self._time(f)
        elif name == topic:
            if isinstance(f, EqualTo) and isinstance(f.value, str):
                self._topics({f.value})
            elif isinstance(f, In) and all(isinstance(v, str) for v in f.value):
                self._topics(set(f.value))
        elif name == ledger and isinstance(getattr(f, "value", None), int):
            self._ledger(f, f.value)  # type: ignore[attr-defined]
        elif name == entry and isinstance(getattr(f, "value", None), int):
            self._entry_filters.append(f)
        elif name == "__messageId" and isinstance(f, EqualTo) and isinstance(f.value, (bytes, bytearray)):
            try:
                mid = MessageIdData.FromString(bytes(f.value))
            except DecodeError:  # not a message id: nothing to prune with
                return
            self._positions = self._positions.narrowed((mid.ledgerId, mid.entryId), (mid.ledgerId, mid.entryId))

    def _topics(self, names: set[str]) -> None:
        self.topics = names if self.topics is None else self.topics & names

    def _time(self, f: Filter) -> None:
        ms = _value_ms(getattr(f, "value", None))
        if ms is None:
            return
        # Whole milliseconds around the value: rows are in ms, and Spark re-checks the exact filter.
        if isinstance(f, (GreaterThan, GreaterThanOrEqual)):
            self.times = self.times.narrowed(ms, None)
        elif isinstance(f, (LessThan, LessThanOrEqual)):
            self.times = self.times.narrowed(None, ms + 1)
        elif isinstance(f, EqualTo):
            self.times = self.times.narrowed(ms, ms + 1)

    def _ledger(self, f: Filter, ledger: int) -> None:
        if isinstance(f, EqualTo):
            self._ledger_eq = ledger
            self._positions = self._positions.narrowed((ledger, 0), (ledger, MAX_ID))
        elif isinstance(f, GreaterThan):
            self._positions = self._positions.narrowed((ledger + 1, 0), None)
        elif isinstance(f, GreaterThanOrEqual):
            self._positions = self._positions.narrowed((ledger, 0), None)
        elif isinstance(f, LessThan):
            self._positions = self._positions.narrowed(None, (ledger - 1, MAX_ID))
        elif isinstance(f, LessThanOrEqual):
            self._positions = self._positions.narrowed(None, (ledger, MAX_ID))


# --- the source ------------------------------------------------------------------------------------------


class OffloadedPartition(InputPartition):
    """A Spark partition: read tasks (``ofp.pack_tasks``), read one after the other; none reads nothing."""

    def __init__(self, tasks: Sequence[ofp.ReadTask]) -> None:
        super().__init__(tuple(tasks))
        self.tasks = tuple(tasks)

    def __repr__(self) -> str:
        if not self.tasks:
            return "OffloadedPartition(empty)"
        return f"OffloadedPartition({', '.join(ofp.describe(t) for t in self.tasks)})"


class OffloadedReader(DataSourceReader):
    def __init__(self, options: OffloadedOptions, schema: StructType) -> None:
        self.options = options
        self.schema = schema
        self.pushed = PushedBounds()

    def pushFilters(self, filters: list[Filter]) -> Iterator[Filter]:
        for f in filters:
            self.pushed.add(f, self.options.columns)
            yield f  # pruning only: Spark still evaluates every filter on the rows

    def _times(self) -> ofp.TimeBounds:
        return self.options.times.narrowed(self.pushed.times.lo, self.pushed.times.hi)

    def partitions(self) -> Sequence[InputPartition]:
        opts = self.options
        scoped = opts.location.open(create=False)  # a mistyped path is an error, not a new empty store
        try:
            from streamoffload.checkpoints.metadata_store import MetadataStore

            metadata = MetadataStore(scoped)
            pattern = parse_pattern(opts.topics_pattern) if opts.topics_pattern else None
            topics = ofp.resolve_topics(metadata, opts.topics, pattern)
            if self.pushed.topics is not None:
                topics = [t for t in topics if t in self.pushed.topics]
            positions = {
                t: ofp.PositionBounds(
                    ofp.start_bound(ofp.spec_for(opts.starting, t), t), ofp.end_bound(ofp.spec_for(opts.ending, t), t)
                ).narrowed(self.pushed.positions.start, self.pushed.positions.end)
                for t in topics
            }
            tasks = ofp.plan(
                scoped,
                topics,
                positions,
                self._times(),
                skew_ms=opts.skew_ms,
                max_partition_bytes=opts.max_partition_bytes,
            )
        finally:
            scoped.store.close()
        # Spark wants at least one partition; an empty one reads nothing.
        groups = ofp.pack_tasks(tasks, opts.max_partition_bytes, opts.open_cost)
        return [OffloadedPartition(group) for group in groups] or [OffloadedPartition(())]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        """Arrow record batches built column by column (``read.dataset_read``): Spark's Python worker passes
        them on as they are, with no conversion per row."""
        from pyspark.sql.pandas.types import to_arrow_schema

        freeze_long_lived()
        tasks: tuple[ofp.ReadTask, ...] = partition.tasks  # type: ignore[attr-defined]
        schema = to_arrow_schema(self.schema, timezone="UTC")
        opts = self.options
        keyring = KeyRing.with_file(opts.keys_file)
        times = self._times()
        most = max_uncompressed(opts.max_message_size)
        batches: Iterator[pa.RecordBatch]
        if opts.output == ofr.OUTPUT_MESSAGES and times.lo is None and times.hi is None:
            # Small segments one after the other are decoded as one run (``read_tasks``).
            rows = ofr.read_tasks(
                opts.location,
                tasks,
                read_buffer_size=opts.read_buffer_size,
                keyring=keyring,
                max_uncompressed=most,
            )
            batches = (batch for _, batch in rows)
        else:
            batches = (
                batch
                for task in tasks
                for batch in ofr.read_task(
                    opts.location,
                    task,
                    output=opts.output,
                    times=times,
                    skew_ms=opts.skew_ms,
                    read_buffer_size=opts.read_buffer_size,
                    keyring=keyring,
                    max_uncompressed=most,
                )
            )
        for batch in batches:
            # A schema given with .schema(...) that differs from ours is cast to (as Spark would, in its
            # worker, for rows); a wrong one fails there, naming the column.
            yield batch if batch.schema.equals(schema) else batch.cast(schema)


class OffloadedDataSource(DataSource):
    """``spark.read.format("pulsar-offloaded")``: see the module docstring."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> str:
        return OffloadedOptions.parse(self.options).schema

    def reader(self, schema: StructType) -> DataSourceReader:
        return OffloadedReader(OffloadedOptions.parse(self.options), schema)


__all__ = ["SOURCE_NAME", "OffloadedDataSource", "OffloadedOptions", "OffloadedReader", "PushedBounds"]
