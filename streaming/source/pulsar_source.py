"""The Pulsar source for Spark Structured Streaming: ``spark.readStream.format("pulsar")`` (also registered as
``streamoffload-pulsar``, a name no JVM source has: :data:`OWN_SOURCE_NAME`).

Rows, by the ``output`` option:

- ``messages`` (the default): one row per **message**, in streamnative/pulsar-spark's columns and the tier's
  (:data:`MESSAGE_SCHEMA`, the same as the ``pulsar-offloaded`` source's, built by the same code:
  ``read.dataset_read.message_batches``): batches split, compressed payloads inflated, ``__messageId`` the
  Java client's serialized ``MessageIdData``.
- ``entries``: one row per Pulsar **entry** (:data:`SCHEMA`): ``entry`` holds the entry in Pulsar's
  headers-and-payload format, byte for byte as the broker sends it with ``reader=raw``
  (``streamoffload/pulsar/raw_reader.py``), rebuilt from its messages with ``reader=client``
  (``streamoffload/pulsar/client_reader.py``); ``codecs.entry.entry_messages(entry)`` splits it into its
  messages. ``partition`` is the partition index (-1 for a topic that is not a partition).
- with ``positionsOnly`` (the offload job): ``POSITIONS_SCHEMA``, an entry's position, size and CRC-32C.

The options, their defaults and what each does: ``docs/source-options.md`` (written from
``source_options.OPTIONS`` by ``scripts/gen_source_options.py``).

The Spark classes here are thin: ``source_options.py`` parses the options, ``offset_planner.SourcePlanner`` makes
every driver-side decision (discovery, positions, admission control, backlog) in plain Python. Offsets are JSON
``{topic-partition: [ledgerId, entryId]}``, the last position emitted (``[-1, -1]`` before the first entry); a
micro-batch reads exactly ``(start, end]`` of each topic-partition with new data. :meth:`PulsarStreamReader.backlog`
(latest and consumed positions, entries and bytes behind; ``entries`` exact within a ledger, a lower bound
across ledgers) lives in Spark's Python source-runner process, so other processes read it through
``backlogFile``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pyspark.errors import AnalysisException
from pyspark.sql import SparkSession
from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from streamoffload.checkpoints.keyring import KeyRing
from streamoffload.codecs.compression import max_uncompressed
from streamoffload.codecs.entry import DecodedEntry, crc32c, decode_entry
from streamoffload.codecs.positions import Position
from streamoffload.codecs.topics import TopicName
from streamoffload.errors import ConfigError
from streamoffload.pulsar import client_reader
from streamoffload.pulsar import raw_reader as rr
from streamoffload.pulsar.exactly_once import BEFORE_EARLIEST, Probe, ReadEntry, ReaderSettings, ReadStats
from streamoffload.read.dataset_read import DEFAULT_BATCH_ROWS, MESSAGE_ARROW_SCHEMA, MESSAGE_SCHEMA, message_batches
from streamoffload.read.through import BrokerFront, TierView, read_through_range, stored_entries
from streamoffload.read.topic_reader import TopicReader
from streamoffload.streaming.governance.quarantine import TopicFailedError, is_topic_specific
from streamoffload.streaming.governance.rate_limits import ReadWaits, limiter_for, throttled_reads
from streamoffload.streaming.handoff.positions import POSITIONS_SCHEMA
from streamoffload.streaming.handoff.spool import SpoolWriter
from streamoffload.streaming.runtime.interleave import interleave
from streamoffload.streaming.runtime.worker_gc import freeze_long_lived
from streamoffload.streaming.source.backlog import PartitionBacklog
from streamoffload.streaming.source.input_partitions import Range, group_ranges, split_ranges
from streamoffload.streaming.source.offset_planner import SourcePlanner, position_of, split_offsets
from streamoffload.streaming.source.source_options import OUTPUT_ENTRIES, SourceOptions, output_of, positions_only

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger(__name__)

SOURCE_NAME = "pulsar"
"""pulsar-spark's short name, so its queries carry over; where pulsar-spark's jar is on the classpath, Spark
refuses to register a Python source under a JVM source's name (SPARK-46522), and use :data:`OWN_SOURCE_NAME`."""
OWN_SOURCE_NAME = "streamoffload-pulsar"
SCHEMA = (
    "topic string, partition int, ledger_id long, entry_id long, publish_time timestamp, "
    "num_messages int, entry binary, size int"
)
"""The rows of ``output=entries``."""


def row_schema(options: Mapping[str, str]) -> str:
    """The source's columns for these options (``output``, ``positionsOnly``)."""
    if positions_only(options):
        return POSITIONS_SCHEMA
    return SCHEMA if output_of(options) == OUTPUT_ENTRIES else MESSAGE_SCHEMA


# ---------------------------------------------------------------------------------------------
# Spark


class PulsarRangePartition(InputPartition):
    """The position ranges ``(start, end]`` one task reads, one after the other: usually one topic-partition's
    range; several when a micro-batch has more ranges than ``maxPartitions`` (``input_ranges.group_ranges``)."""

    def __init__(self, ranges: Sequence[Range]) -> None:
        super().__init__(tuple(ranges))
        self.ranges = tuple(ranges)

    def __repr__(self) -> str:
        shown = ", ".join(f"{r.topic} ({r.start[0]}:{r.start[1]}, {r.end[0]}:{r.end[1]}]" for r in self.ranges[:3])
        more = f" and {len(self.ranges) - 3} more" if len(self.ranges) > 3 else ""
        return f"PulsarRangePartition({shown}{more})"


class SealMarkerPartition(InputPartition):
    """``sealAtEnd``'s markers, in the last micro-batch: one seal marker row per topic-partition, no entries."""

    def __init__(self, topics: list[str]) -> None:
        super().__init__(tuple(topics))
        self.topics = topics


class PulsarStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Spark's view of the source; the work is done by :class:`SourcePlanner` (driver) and
    :func:`raw_reader.read_range_raw` or :func:`client_reader.read_range` (tasks). Constructed on executors
    too, so ``__init__`` only parses."""

    def __init__(self, options: Mapping[str, str], schema: StructType | None = None) -> None:
        self.options = SourceOptions.parse(options)
        if self.options.ending_offsets is not None:
            raise ConfigError(
                "option endingOffsets applies to batch reads (spark.read.format('pulsar')); a streaming query "
                "reads on as data arrives"
            )
        if self.options.seal_at_end and not self.options.positions_only and self.options.output != OUTPUT_ENTRIES:
            raise ConfigError("option sealAtEnd: its seal markers are entry rows; give output=entries too")
        self.schema = schema
        self._planner: SourcePlanner | None = None

    @property
    def planner(self) -> SourcePlanner:
        if self._planner is None:
            self._planner = SourcePlanner(self.options)
        return self._planner

    def initialOffset(self) -> dict[str, list[int]]:
        return self.planner.initial_offset()

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_entries_per_trigger is not None:
            return ReadMaxRows(self.options.max_entries_per_trigger)
        if self.options.max_bytes_per_trigger is not None:
            return ReadMaxBytes(self.options.max_bytes_per_trigger)
        return ReadAllAvailable()

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        max_entries: int | None = None
        max_bytes: int | None = None
        if isinstance(limit, ReadMaxRows):
            max_entries, max_bytes = limit.max_rows, self.options.max_bytes_per_trigger
        elif isinstance(limit, ReadMaxBytes):
            max_entries, max_bytes = self.options.max_entries_per_trigger, limit.max_bytes
        elif not isinstance(limit, ReadAllAvailable):
            log.warning("pulsar source: read limit %r is not supported; reading all available", limit)
        return self.planner.latest_offset(start, max_entries, max_bytes)

    def reportLatestOffset(self) -> dict[str, list[int]] | None:
        return self.planner.latest_offset_report()

    def prepareForTriggerAvailableNow(self) -> None:
        self.planner.prepare_available_now()

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        starts, sealed_before = split_offsets(start)
        ends, sealed = split_offsets(end)
        ranges: list[Range] = []
        for tp in sorted(ends):
            s = starts.get(tp, BEFORE_EARLIEST)
            e = ends[tp]
            if e > s:
                ranges.append(Range(tp, s, e, self.planner.end_is_known(tp, e)))
        partitions: list[InputPartition] = list(_input_partitions(self.planner.cut_stored(ranges), self.options))
        if sealed and not sealed_before:
            partitions.append(SealMarkerPartition(sorted(ends)))
        return partitions

    def read(self, partition: InputPartition) -> Iterator[Any]:
        freeze_long_lived()
        if isinstance(partition, SealMarkerPartition):
            yield seal_markers(partition.topics, self.schema, self.options.positions_only)
            return
        assert isinstance(partition, PulsarRangePartition)
        yield from read_partition(self.options, partition, self.schema, topic_errors=True)

    def commit(self, end: dict[str, Any]) -> None:
        self.planner.commit(end)

    def stop(self) -> None:
        if self._planner is not None:
            self._planner.close()

    def backlog(self) -> dict[str, PartitionBacklog]:
        """Per topic-partition backlog as of the last trigger or commit (see the module docstring)."""
        return self.planner.backlog()


def arrow_schema(schema: StructType | None, positions_only: bool = False) -> Any:
    from pyspark.sql.pandas.types import to_arrow_schema

    if schema is None:
        parsed = StructType.fromDDL(POSITIONS_SCHEMA if positions_only else SCHEMA)
        assert isinstance(parsed, StructType)  # a DDL of columns is a struct
        schema = parsed
    return to_arrow_schema(schema, timezone="UTC")


def rows_batch(
    pa_schema: Any,
    topics: Sequence[str],
    partitions: Sequence[int],
    ledger_ids: Sequence[int],
    entry_ids: Sequence[int],
    publish_us: Sequence[int | None],
    counts: Sequence[int],
    entries: Sequence[bytes | bytearray | None] | None,
    sizes: Sequence[int],
    crcs: Sequence[int] | None = None,
    waits: Sequence[int] | None = None,
) -> Any:
    """The source's rows as one Arrow record batch, built column by column: ``SCHEMA`` with ``entries``,
    ``POSITIONS_SCHEMA`` with ``crcs`` (and ``waits``, else zeros) instead."""
    import pyarrow as pa

    columns = [
        pa.array(topics, pa.string()),
        pa.array(partitions, pa.int32()),
        pa.array(ledger_ids, pa.int64()),
        pa.array(entry_ids, pa.int64()),
        pa.array(publish_us, pa.timestamp("us", tz="UTC")),
        pa.array(counts, pa.int32()),
    ]
    if crcs is None:
        columns += [pa.array(entries, pa.binary()), pa.array(sizes, pa.int32())]
    else:
        columns += [
            pa.array(sizes, pa.int32()),
            pa.array(crcs, pa.int64()),
            pa.array(waits if waits is not None else [0] * len(sizes), pa.int64()),
        ]
    return pa.RecordBatch.from_arrays(columns, schema=pa_schema)


def seal_markers(topics: Sequence[str], schema: StructType | None, positions_only: bool = False) -> Any:
    """The seal marker rows (``sealAtEnd``): ``ledger_id = entry_id = -1``, no entry, no publish time."""
    n = len(topics)
    partitions = [TopicName.parse(tp).partition for tp in topics]
    none = [None] * n
    pa_schema = arrow_schema(schema, positions_only)
    crcs = [0] * n if positions_only else None
    return rows_batch(pa_schema, topics, partitions, [-1] * n, [-1] * n, none, [0] * n, none, [0] * n, crcs)


READ_THREADS = 4
"""Ranges a task of the offload job (``positionsOnly``, the raw reader) reads at once (``runtime.interleave``):
each waits on the broker far longer than it computes. At 10,000 topic-partitions a task reads ~150 short ranges
per micro-batch, and one after the other ~65% of its samples were in a socket read. Each range still has its
own consumer, its own spool file and its rows in order. The task's ``RawClient`` keeps up to
``raw_reader._MAX_IDLE`` (also 4) connections for the next consumers: no more connections per task than that."""


def _input_partitions(ranges: list[Range], options: SourceOptions) -> list[PulsarRangePartition]:
    pieces = split_ranges(ranges, options.min_partitions)
    # minPartitions wins over a smaller maxPartitions: packing must not undo the cutting.
    most = max(options.max_partitions, options.min_partitions)
    return [PulsarRangePartition(group) for group in group_ranges(pieces, most)]


def read_partition(
    options: SourceOptions, partition: PulsarRangePartition, schema: StructType | None, *, topic_errors: bool = False
) -> Iterator[Any]:
    """The rows of a partition's ranges as Arrow record batches: each range's in order, one range after the other,
    or (the job's ``positionsOnly`` raw reads) up to ``READ_THREADS`` ranges at once, their batches interleaved.

    ``topic_errors``: an error that belongs to one topic-partition (lost or corrupt entries) is raised as
    :class:`TopicFailedError` naming it, so the offload job sets that topic-partition aside (quarantine);
    a broker that cannot be reached is everyone's problem and fails the batch as it is."""
    if options.reader == "raw":
        # The task's own client: its ranges' consumers take turns on its connections (its threads share it);
        # none is shared between tasks.
        client: Any = rr.RawClient(options.service_url, options.client_opts)
        read_range: Callable[..., Iterator[ReadEntry]] = rr.read_range_raw
        probe: Callable[..., Probe | None] = rr.probe_after_raw
        latest: Callable[[Any, str], Position | None] = rr.latest_position_raw
    else:
        client = client_reader.shared_client(options.service_url, options.client_opts)
        read_range = client_reader.read_range
        probe = client_reader.probe_after
        latest = client_reader.latest_position
    tier: TierView | None = None
    stored: TopicReader | None = None
    if options.offloaded is not None:
        tier = TierView(options.offloaded)
        stored = TopicReader(tier.scoped, keyring=KeyRing.with_file(options.offloaded_keys_file))
        read_range = _read_through(tier, stored, read_range, probe, latest)

    def rows(r: Range) -> Iterator[Any]:
        try:
            yield from _read_range_rows(options, r, schema, client, read_range)
        except Exception as err:
            if not topic_errors or not is_topic_specific(err):
                raise
            raise TopicFailedError(r.topic, err) from err

    # The offload job's rows (positions, no bytes) are small, so its task reads several ranges at once; a plain
    # read's rows carry the entries, and the read-through and pulsar-client readers share state across ranges.
    threads = READ_THREADS if options.positions_only and options.reader == "raw" and tier is None else 1
    try:
        yield from interleave(partition.ranges, rows, threads, name="source-read")
    finally:
        if stored is not None:
            stored.close()
        if options.reader == "raw":
            client.close()


def _read_through(
    tier: TierView,
    stored: TopicReader,
    read_broker: Callable[..., Iterator[ReadEntry]],
    probe: Callable[..., Probe | None],
    latest: Callable[[Any, str], Position | None],
) -> Callable[..., Iterator[ReadEntry]]:
    """A ``read_range`` that reads what the store holds from the store and the rest from the broker
    (``offloaded.store``; ``read/through.py``)."""

    def read_range(
        client: Any,
        topic: str,
        start: Position,
        end: Position,
        *,
        settings: ReaderSettings,
        end_is_known: bool = True,
        stats: ReadStats | None = None,
    ) -> Iterator[ReadEntry]:
        def broker(after: Position, last: Position, known: bool) -> Iterator[ReadEntry]:
            return read_broker(client, topic, after, last, settings=settings, end_is_known=known, stats=stats)

        return read_through_range(
            topic,
            start,
            end,
            history=tier.history(topic, fresh=True),
            read_stored=lambda after, last: stored_entries(stored, topic, after, last),
            read_broker=broker,
            broker=BrokerFront(
                lambda after: probe(client, topic, after, settings=settings), lambda: latest(client, topic)
            ),
            end_is_known=end_is_known,
            fail_on_data_loss=settings.fail_on_data_loss,
            store_name=f"the store ({tier.describe()})",
            stats=stats,
        )

    return read_range


def _read_range_rows(
    options: SourceOptions,
    rng: Range,
    schema: StructType | None,
    client: Any,
    read_range: Callable[..., Iterator[ReadEntry]],
) -> Iterator[Any]:
    """The rows of one range as Arrow record batches, built column by column: Spark's worker then
    skips its per-row conversion of tuples (measured here: 0.7 µs per row this way, 3.3 µs as tuples)."""
    stats = ReadStats()
    started = time.monotonic()
    waited = ReadWaits()
    entries = throttled_reads(  # the offload job's read limits (rateLimits), else as read
        limiter_for(options.rate_limits),
        rng.topic,
        read_range(
            client,
            rng.topic,
            rng.start,
            rng.end,
            settings=options.reader_settings(),
            end_is_known=rng.end_known,
            stats=stats,
        ),
        lambda e: len(e.payload),
        waited.add,
    )
    if options.positions_only or options.output == OUTPUT_ENTRIES:
        yield from _entry_rows(options, rng, schema, entries, waited)
    else:
        yield from _message_rows(options, rng, schema, entries)
    log.info(
        "pulsar source: %s reader: read %s in %.2f s: %d entries, %d messages, %d bytes; %d duplicates dropped, "
        "%d stalls, %d reader re-opens, %d errors",
        options.reader,
        rng,
        time.monotonic() - started,
        stats.entries,
        stats.messages,
        stats.bytes,
        stats.duplicates,
        stats.stalls,
        stats.reopens,
        stats.errors,
    )


def _message_rows(
    options: SourceOptions, rng: Range, schema: StructType | None, entries: Iterator[ReadEntry]
) -> Iterator[pa.RecordBatch]:
    """``output=messages``: the range's messages in pulsar-spark's columns, split and inflated by
    ``read.dataset_read.message_batches`` (what ``pulsar-offloaded`` reads with), in record batches of up to
    ``DEFAULT_BATCH_ROWS`` messages (as ``pulsar-offloaded``'s) or ``arrowBatchBytes``. Not ``arrowBatchEntries``'
    2000: batches are split a batch index at a time across the entries of a record batch, so few entries per
    record batch is slow (measured here, 100,000 messages in batches of 1000: 7 k messages/s at 2000 rows,
    52 k at 16384)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    pa_schema = MESSAGE_ARROW_SCHEMA if schema is None else to_arrow_schema(schema, timezone="UTC")
    topic = rng.topic

    def decoded() -> Iterator[tuple[int, int, DecodedEntry, str]]:
        for entry in entries:
            where = f"{topic}: entry {entry.ledger_id}:{entry.entry_id}"
            # The raw reader checked the CRC-32C on receipt, the read path on reading the store.
            yield (
                entry.ledger_id,
                entry.entry_id,
                decode_entry(entry.payload, verify_checksum=False, where=where),
                where,
            )

    for batch in message_batches(
        topic,
        decoded(),
        batch_rows=DEFAULT_BATCH_ROWS,
        batch_bytes=options.arrow_batch_bytes,
        max_uncompressed=max_uncompressed(options.max_message_size),
    ):
        # A schema given with .schema(...) that differs from ours is cast to, as Spark would for rows.
        yield batch if batch.schema.equals(pa_schema) else batch.cast(pa_schema)


def _entry_rows(
    options: SourceOptions, rng: Range, schema: StructType | None, entries: Iterator[ReadEntry], waited: ReadWaits
) -> Iterator[pa.RecordBatch]:
    """``output=entries`` (an entry's bytes) and the offload job's ``positionsOnly`` rows (its CRC-32C, and the
    bytes in the task's spool file for the sink)."""
    pa_schema = arrow_schema(schema, options.positions_only)
    positions_only = options.positions_only
    partition_index = TopicName.parse(rng.topic).partition
    spool = (
        SpoolWriter(options.spool_dir, rng.topic, rng.start, rng.end, options.spool_max_bytes)
        if positions_only and options.spool_dir
        else None
    )
    ledger_ids: list[int] = []
    entry_ids: list[int] = []
    publish: list[int] = []
    counts: list[int] = []
    datas: list[bytes | bytearray] = []
    sizes: list[int] = []
    crcs: list[int] = []
    waits: list[int] = []
    pending_bytes = 0

    def batch() -> Any:
        n = len(sizes)
        publish_us = [t * 1000 for t in publish]
        topics, partitions = [rng.topic] * n, [partition_index] * n
        return rows_batch(
            pa_schema,
            topics,
            partitions,
            ledger_ids,
            entry_ids,
            publish_us,
            counts,
            None if positions_only else datas,
            sizes,
            crcs if positions_only else None,
            waits if positions_only else None,
        )

    try:
        for entry in entries:
            ledger_ids.append(entry.ledger_id)
            entry_ids.append(entry.entry_id)
            publish.append(entry.publish_time)
            counts.append(entry.num_messages)
            sizes.append(len(entry.payload))
            if positions_only:
                crcs.append(crc32c(entry.payload))
                waits.append(waited.take_us())
                if spool is not None:
                    spool.add(entry.ledger_id, entry.entry_id, entry.payload)
            else:
                datas.append(entry.payload)
                pending_bytes += len(entry.payload)
            if len(sizes) >= options.arrow_batch_entries or pending_bytes >= options.arrow_batch_bytes:
                yield batch()
                for column in (ledger_ids, entry_ids, publish, counts, datas, sizes, crcs, waits):
                    column.clear()
                pending_bytes = 0
        if sizes:
            yield batch()
        if spool is not None:
            spool.finish()
    finally:
        if spool is not None:
            spool.abandon()  # a read that failed leaves no temporary file behind (no-op once finished)


class PulsarBatchReader(DataSourceReader):
    """``spark.read.format("pulsar")``: each topic-partition from ``startingOffsets`` to ``endingOffsets``
    (inclusive; default ``latest`` as the read is planned), one range per topic-partition (input partitions as
    for the stream: ``minPartitions``, ``maxPartitions``)."""

    def __init__(self, options: Mapping[str, str], schema: StructType | None = None) -> None:
        self.options = SourceOptions.parse(options)
        self.schema = schema

    def plan(self, planner: SourcePlanner) -> list[PulsarRangePartition]:
        start = {tp: position_of(v) for tp, v in planner.initial_offset().items()}
        ending = self.options.ending_offsets or "latest"
        latest = planner.latest_positions(sorted(start))
        ranges: list[Range] = []
        for tp in sorted(start):
            choice = ending if isinstance(ending, str) else ending.get(tp, ending.get("*", "latest"))
            last = latest[tp]
            end = last if choice == "latest" else choice
            if end is None:
                continue  # an empty topic-partition
            if last is None or end > last:  # type: ignore[operator]
                raise ConfigError(
                    f"option endingOffsets: {tp} ends at {end[0]}:{end[1]} (a position it does not hold yet; "
                    f"its latest is {'none: it is empty' if last is None else f'{last[0]}:{last[1]}'})"
                )
            if end > start[tp]:  # type: ignore[operator]
                ranges.append(Range(tp, start[tp], end, end == last))  # type: ignore[arg-type]
        return _input_partitions(planner.cut_stored(ranges), self.options)

    def partitions(self) -> Sequence[InputPartition]:
        planner = SourcePlanner(self.options)
        try:
            return self.plan(planner)
        finally:
            planner.close()

    def read(self, partition: InputPartition) -> Iterator[Any]:
        freeze_long_lived()
        if not isinstance(partition, PulsarRangePartition):
            return  # nothing to read: Spark runs one task with its own partition when the plan has none
        yield from read_partition(self.options, partition, self.schema)


class PulsarDataSource(DataSource):
    """``spark.readStream.format("pulsar")`` and ``spark.read.format("pulsar")``: see the module docstring
    for options and rows."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> str:
        return row_schema(self.options)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return PulsarStreamReader(self.options, schema)

    def reader(self, schema: StructType) -> DataSourceReader:
        return PulsarBatchReader(self.options, schema)


class OwnNamePulsarDataSource(PulsarDataSource):
    """The same source as ``streamoffload-pulsar``: a name no JVM source has, so it registers and resolves
    beside pulsar-spark's jar (which takes ``pulsar``: SPARK-46522, SPARK-50426)."""

    @classmethod
    def name(cls) -> str:
        return OWN_SOURCE_NAME


def register_unless_taken(spark: SparkSession, source: type[DataSource]) -> bool:
    """Register a Python data source unless a built-in or JVM source has its name (Spark refuses it with
    ``DATA_SOURCE_ALREADY_EXISTS``); returns whether it was registered."""
    try:
        spark.dataSource.register(source)
    except AnalysisException as err:
        if "DATA_SOURCE_ALREADY_EXISTS" not in str(err):
            raise
        log.warning(
            "data source name %r is taken by a built-in or JVM source (pulsar-spark's jar on the classpath?): "
            "format(%r) reads with that one; streamoffload's live source is format('streamoffload-pulsar')",
            source.name(),
            source.name(),
        )
        return False
    return True


__all__ = [
    "MESSAGE_SCHEMA",
    "OWN_SOURCE_NAME",
    "SCHEMA",
    "SOURCE_NAME",
    "OwnNamePulsarDataSource",
    "PulsarBatchReader",
    "PulsarDataSource",
    "PulsarRangePartition",
    "PulsarStreamReader",
    "read_partition",
    "register_unless_taken",
]
