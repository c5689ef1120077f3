"""Append what the store has committed past a topic's table, exactly once: ``sync_topic``, ``rebuild_topic``.

A sync is a loop of commits. Each reads the table's position (``table.position``: the current snapshot's summary
says the last position held per topic-partition), takes the ``Offloaded`` segments past it (at most
``segments_per_commit``), reads their messages with the dataset reader (``read.dataset_read``: the rows
``pulsar-offloaded`` gives, CRC-checked), writes them as Parquet data files (pyarrow directly,
``table.data_files``: zstd, field ids, column statistics from pyarrow's footers; a file per read task and table
partition), then commits them in one Iceberg snapshot whose summary carries the new positions and the segments
it appended. The store is the truth and the table a view of it: the positions come from the table alone, so any
process may sync, and the job later can call ``sync_topic`` after its own commits.

**Exactly once.**

- A crash before the commit leaves data files no snapshot names (orphans: ``table.status.orphan_files``);
  the next sync starts from the same position and writes the same segments again, under the same names.
- A crash after the commit: the next sync reads the new position and appends nothing twice.
- A replayed sync with nothing new commits nothing (no empty snapshot).
- Two writers: each commit requires the snapshot it read the position from to still be current (Iceberg's
  optimistic concurrency; the SQL catalog swaps the metadata pointer only from the one it read). The loser gets
  ``CommitFailedException``, re-reads the position and writes only what is still missing. pyiceberg's own
  retry, which re-applies the same appended files on the new snapshot, is turned off for these tables
  (``commit.retry.num-retries`` = 0): it would append the winner's segments a second time.

**File names** are deterministic per attempt: ``00000-<n>-<uuid>.parquet`` in the partition's directory, with
the uuid derived from the table, the segment, the read task, the snapshot the attempt builds on and the writer
(``SyncOptions.writer``). A retry from the same snapshot (after a crash) writes the same files again rather than
new ones, so a crash loop leaves no more orphans than one attempt; once a commit lands, later attempts build on
another snapshot and never write a name a snapshot references. Two writers on the same snapshot with the same
writer name write identical bytes under identical names (on a filesystem warehouse a reader of the winner's
snapshot may then see a file being rewritten): the job will pass its writer epoch, so two jobs never do.

**A value schema** (``SyncOptions.value_schema``, the policy's ``offloadTableSchema``: ``table.schema``; from the
broker's registry: ``table.registry_schema``) adds the struct column ``value_decoded``, evolved before the first
commit of a sync; the records that do not decode go to the dead-letter table too, committed just before the topic
table's commit with the same positions (``table.dead_letters``). A schema that cannot be evolved stops the sync of
that topic (``TableSchemaError``).
"""

from __future__ import annotations

import collections
import functools
import itertools
import logging
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import pyarrow as pa
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import CommitFailedException, NoSuchTableError, TableAlreadyExistsError
from pyiceberg.manifest import DataFile
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.types import NestedField, StructType

from streamoffload.checkpoints import manifest as mf
from streamoffload.checkpoints.keyring import KeyRing
from streamoffload.checkpoints.metadata_store import CorruptManifest, MetadataStore
from streamoffload.codecs.positions import Position
from streamoffload.codecs.proto.offload_manifest_pb2 import SegmentManifest
from streamoffload.codecs.topics import TopicName
from streamoffload.read.dataset_plan import (
    DEFAULT_MAX_PARTITION_BYTES,
    PositionBounds,
    ReadTask,
    refuse_corrupt,
    resolve_topics,
    segment_tasks,
)
from streamoffload.read.dataset_read import read_tasks
from streamoffload.storage.location import ScopedStore
from streamoffload.table import dead_letters, layout, registry_schema
from streamoffload.table import schema as value_schemas
from streamoffload.table.data_files import DataFileWriter
from streamoffload.table.errors import TableError
from streamoffload.table.position import TablePosition, summary_properties, table_position

log = logging.getLogger(__name__)

_WRITE_QUEUE_BYTES = 64 << 20
"""The rows read and not yet written a sync holds: the read of the next segments overlaps the writes (pyarrow's
encoding lets go of the GIL, the reader mostly does not)."""

DEFAULT_SEGMENTS_PER_COMMIT = 64
"""Segments appended by one Iceberg commit: a commit's summary names them, and a crash repeats at most this many."""
DEFAULT_MAX_CONFLICTS = 20
"""Commits lost to another writer before a sync gives up (each loss re-reads the table and re-plans)."""

TOPIC_PROPERTY = "streamoffload.topic"
STORE_PROPERTY = "streamoffload.store"
METADATA_VERSIONS_KEPT = 10
"""Previous ``metadata.json`` files a table keeps (Iceberg's ``write.metadata.previous-versions-max``); older ones
are deleted after each commit, or a table committing every 10 s piles up 8,640 a day."""
# Table properties the sync needs: no commit retried by pyiceberg on a new base (see the module notes), Parquet
# with zstd, format version 2, old metadata files deleted after a commit.
TABLE_PROPERTIES = {
    "commit.retry.num-retries": "0",
    "write.parquet.compression-codec": "zstd",
    "format-version": "2",
    "write.metadata.delete-after-commit.enabled": "true",
    "write.metadata.previous-versions-max": str(METADATA_VERSIONS_KEPT),
}
_METADATA_PROPERTIES = ("write.metadata.delete-after-commit.enabled", "write.metadata.previous-versions-max")
"""Set on a table made before the sync set them, unless it has its own."""
_NAMES = uuid.UUID("6b1d4e0a-4f5c-4b8e-9a49-0e1ceb3f7a01")
"""The namespace of data file uuids (``uuid5``)."""


class TableSyncError(TableError):
    """A table that cannot be synced from this store as it is (another topic's, another store's, ...)."""


class TableConflictError(TableSyncError):
    """Other writers kept committing first: the sync gave up after ``max_conflicts`` lost commits."""


@dataclass(frozen=True)
class Commit:
    """One snapshot a sync committed: the segments it appended per topic-partition, its rows and data files."""

    snapshot_id: int
    segments: dict[str, list[str]]
    rows: int
    files: list[str]
    dead_letters: int = 0
    """Rows appended to the dead-letter table just before (their snapshot records the same positions)."""


@dataclass(frozen=True)
class SyncOptions:
    """How a sync writes: ``segments_per_commit`` (a commit's summary names them; a crash repeats at most this
    many), ``max_conflicts`` (commits lost to other writers before it gives up), ``max_partition_bytes`` (a
    segment larger than this is read, and written, in runs of blocks of about this size: the memory a write
    takes), ``writer`` (part of every data file name: the job passes its writer epoch), ``keyring`` (a store
    encrypted at rest; None: the keys in the environment)."""

    segments_per_commit: int = DEFAULT_SEGMENTS_PER_COMMIT
    max_conflicts: int = DEFAULT_MAX_CONFLICTS
    max_partition_bytes: int = DEFAULT_MAX_PARTITION_BYTES
    writer: str = ""
    keyring: KeyRing | None = None
    value_schema: str = ""
    """The topic's ``offloadTableSchema`` (``table.schema``): values decoded into ``value_decoded``, those that do
    not decode also in the dead-letter table; empty: raw values only."""
    schema_registry: registry_schema.SchemaRegistry | None = None
    """Where ``offloadTableSchema = "broker"`` takes the topic's schema from (``table.registry_schema``)."""

    def __post_init__(self) -> None:
        if self.segments_per_commit < 1 or self.max_conflicts < 0 or self.max_partition_bytes < 1:
            raise ValueError(f"invalid sync options: {self}")


@dataclass
class SyncHooks:
    """Points where tests inject a crash or another writer: ``written`` runs after an attempt's data files are
    written and before its commit; ``before_commit`` runs right before each commit, after ``written``: the job
    checks there that it still holds its writer lease, and raises (nothing is committed) if not;
    ``dead_letters_committed`` (a test's crash point) between the dead-letter table's commit and the topic's."""

    written: Callable[[Table, list[DataFile]], None] | None = None
    before_commit: Callable[[], None] | None = None
    dead_letters_committed: Callable[[], None] | None = None
    """Runs between the dead-letter table's commit and the topic table's (a topic with a value schema)."""


@dataclass
class SyncReport:
    """What one sync of a topic did."""

    topic: str
    table: str
    created: bool = False
    commits: list[Commit] = field(default_factory=list)
    conflicts: int = 0
    position: TablePosition = field(default_factory=TablePosition)

    @property
    def rows(self) -> int:
        return sum(c.rows for c in self.commits)

    @property
    def segments(self) -> int:
        return sum(len(ids) for c in self.commits for ids in c.segments.values())

    @property
    def dead_letters(self) -> int:
        return sum(c.dead_letters for c in self.commits)


def table_name(topic: str | TopicName) -> str:
    return ".".join(layout.identifier(topic))


def store_name(scoped: ScopedStore) -> str:
    """The store as a table records it (its URL and prefix; no credentials are part of either)."""
    return scoped.describe()


def open_table(
    catalog: Catalog,
    scoped: ScopedStore,
    topic: TopicName,
    *,
    create: bool,
    partitioned: bool = False,
    dead: bool = False,
) -> tuple[Table | None, bool]:
    """The table of ``topic`` (a partitioned topic's, for a partition), checked to be this topic's and this store's;
    created if missing and ``create`` (partitioned by ``partition`` too if ``partitioned``: the store holds the
    topic's partitions). Returns it (None if missing and not created) and whether it was created. ``dead``: the
    topic's dead-letter table instead (``table.dead_letters``, unpartitioned)."""
    ident = dead_letters.identifier(layout.identifier(topic)) if dead else layout.identifier(topic)
    created = False
    try:
        table = catalog.load_table(ident)
    except NoSuchTableError:
        if not create:
            return None, False
        catalog.create_namespace_if_not_exists(ident[:2])
        properties = {**TABLE_PROPERTIES, TOPIC_PROPERTY: str(topic), STORE_PROPERTY: store_name(scoped)}
        try:
            if dead:
                table = catalog.create_table(ident, dead_letters.SCHEMA, properties=properties)
            else:
                spec = layout.partition_spec(partitioned)
                table = catalog.create_table(ident, layout.SCHEMA, partition_spec=spec, properties=properties)
            created = True
        except TableAlreadyExistsError:  # another writer created it first
            table = catalog.load_table(ident)
    check_table(table, scoped, topic, writing=create)
    return table, created


def check_table(table: Table, scoped: ScopedStore, topic: TopicName, *, writing: bool = False) -> None:
    """Refuse a table that is not ``topic``'s from this store; turn pyiceberg's commit retries off if they are on,
    and, for a sync (``writing``), old metadata files' deletion on unless the table says otherwise."""
    name = ".".join(table.name())
    props = table.properties
    if props.get(TOPIC_PROPERTY) != str(topic):
        held = props.get(TOPIC_PROPERTY)
        raise TableSyncError(
            f"table {name} is not the table of {topic}: "
            + (f"it holds {held}" if held else "it was not created by `streamoffload table sync`")
        )
    if props.get(STORE_PROPERTY) != store_name(scoped):
        raise TableSyncError(
            f"table {name} was derived from the store {props.get(STORE_PROPERTY)}, not {store_name(scoped)}: "
            "give the other store, another --catalog, or `streamoffload table rebuild` it from this store"
        )
    wanted = {k: TABLE_PROPERTIES[k] for k in _METADATA_PROPERTIES if writing and k not in props}
    if props.get("commit.retry.num-retries") != "0":
        log.info("table %s: turning pyiceberg's commit retries off (they would append twice)", name)
        wanted["commit.retry.num-retries"] = "0"
    if wanted:
        with table.transaction() as tx:
            tx.set_properties(wanted)


@dataclass(frozen=True)
class _Pending:
    """The segments of one topic-partition past the table's position."""

    topic: str
    after: Position | None
    segments: list[SegmentManifest]


def _position_after(position: Position | None) -> Position | None:
    return None if position is None else (position[0], position[1] + 1)


def _pending(listed: dict[str, list[SegmentManifest]], position: TablePosition, limit: int) -> list[_Pending]:
    """At most ``limit`` segments past the table's position, in position order per topic-partition."""
    out: list[_Pending] = []
    left = limit
    for topic, segments in listed.items():
        if left <= 0:
            break
        last = position.of(topic)
        ahead = [s for s in segments if last is None or mf.end_position(s) > last][:left]
        if ahead:
            out.append(_Pending(topic, last, ahead))
            left -= len(ahead)
    return out


def _listed(
    metadata: MetadataStore, topics: Sequence[str], position: TablePosition
) -> dict[str, list[SegmentManifest]]:
    """Each topic-partition's ``Offloaded`` segments; refuses a manifest that does not decode past the table's
    position (appending around it would leave its messages out of the table for good)."""
    out = {}
    for topic in topics:
        corrupt: list[CorruptManifest] = []
        segments = metadata.offloaded_segments(topic, corrupt)
        refuse_corrupt(topic, corrupt, segments, _position_after(position.of(topic)), None)
        out[topic] = segments
    return out


@dataclass
class _Typed:
    """A topic with a value schema: its schema, its dead-letter table and where that is, the dead letters written."""

    schema: value_schemas.ValueSchema
    dead: Table
    position: TablePosition
    files: list[DataFile] = field(default_factory=list)
    rows: int = 0


def _evolve(table: Table, schema: value_schemas.ValueSchema, topic: str) -> None:
    """Give ``table`` the ``value_decoded`` struct of ``schema``: added, or evolved by name (``check_evolution``
    first: a change that cannot be evolved is a ``TableSchemaError``). No commit when it has it already."""
    try:
        old = table.schema().find_field(value_schemas.VALUE_DECODED)
    except ValueError:
        old = None
    if old is not None:
        if not isinstance(old.field_type, StructType):
            raise value_schemas.TableSchemaError(
                f"{topic}: table {table_name(topic)} has a column {value_schemas.VALUE_DECODED} that is not a struct"
            )
        value_schemas.check_evolution(old.field_type, schema.struct, topic)
    wanted = Schema(NestedField(1, value_schemas.VALUE_DECODED, schema.struct, required=False))
    with table.update_schema() as update:
        update.union_by_name(wanted)


def _decoded(
    values: pa.ChunkedArray, arrow: pa.Field, decoders: list[value_schemas.Decoder]
) -> tuple[pa.Array, list[tuple[int, str]]]:
    """The ``value_decoded`` column (``arrow``) of the raw ``values``, each decoded by its row's decoder, and the
    rows whose value does not decode, with why."""
    decoded: list[dict[str, object] | None] = []
    errors: list[tuple[int, str]] = []
    for i, raw in enumerate(values.to_pylist()):
        try:
            if raw is None:
                raise value_schemas.ValueDecodeError("no value (null)")
            decoded.append(decoders[i](raw))
        except value_schemas.ValueDecodeError as err:
            errors.append((i, str(err)))
            decoded.append(None)
    return pa.array(decoded, type=arrow.type), errors


def _task_columns(batches: list[pa.RecordBatch], partition: int) -> tuple[dict[str, pa.ChunkedArray], int]:
    """The table's columns of a read task's record batches (``layout.rows_of``), chunked as read, and their rows."""
    parts = [layout.rows_of(b, partition) for b in batches]
    names = parts[0].keys() if parts else ()
    return {n: pa.chunked_array([p[n] for p in parts]) for n in names}, sum(b.num_rows for b in batches)


def _write(
    scoped: ScopedStore,
    table: Table,
    pending: list[_Pending],
    base: int | None,
    options: SyncOptions,
    typed: _Typed | None = None,
) -> tuple[list[DataFile], int]:
    """Write the pending segments' messages as data files of ``table`` (``table.data_files``: pyarrow directly,
    in the table's schema), a file per read task, in a thread while the next tasks are read (``read_tasks``:
    small ones as one run), up to ``_WRITE_QUEUE_BYTES`` ahead; returns them and their rows. With a value schema,
    also the dead letters past the dead-letter table's position, as its data files (``typed.files``)."""
    files: list[DataFile] = []
    rows = 0
    table_uuid = table.metadata.table_uuid
    writer = DataFileWriter(table)
    dead_writer = DataFileWriter(typed.dead) if typed is not None else None
    names = writer.arrow_schema.names
    decoded = writer.arrow_schema.field(value_schemas.VALUE_DECODED) if value_schemas.VALUE_DECODED in names else None
    writing: collections.deque[tuple[Future[list[DataFile]], int]] = collections.deque()  # in order, with bytes
    held = 0  # the bytes of the rows in the writer's queue
    with ThreadPoolExecutor(1, thread_name_prefix="table-write") as pool:
        for part in pending:
            partition = TopicName.parse(part.topic).partition
            bounds = PositionBounds(start=_position_after(part.after))
            named: list[tuple[uuid.UUID, int]] = []  # each task's segment and its index there: its files' names
            tasks: list[ReadTask] = []
            for segment in part.segments:
                segment_id = mf.manifest_uuid(segment)
                found = segment_tasks(scoped.store, part.topic, segment, bounds, options.max_partition_bytes)
                named += [(segment_id, i) for i in range(len(found))]
                tasks += found
            read = read_tasks(scoped, tasks, keyring=options.keyring)
            for t, batches in itertools.groupby(read, key=lambda pair: pair[0]):
                columns, num_rows = _task_columns([batch for _, batch in batches], partition)
                if num_rows == 0:
                    continue
                segment_id, i = named[t]
                write_uuid = uuid.uuid5(_NAMES, f"{table_uuid}/{segment_id}/{i}/{base}/{options.writer}")
                if decoded is not None:
                    versions = functools.partial(
                        registry_schema.entry_schema_versions, scoped, tasks[t], options.keyring
                    )
                    columns[value_schemas.VALUE_DECODED] = _value_decoded(
                        columns, num_rows, decoded, typed, dead_writer, part.topic, write_uuid, versions
                    )
                while writing and held >= _WRITE_QUEUE_BYTES:  # the reader runs ahead of the writer this far
                    done, size = writing.popleft()
                    files += done.result()
                    held -= size
                data = writer.rows(columns, num_rows)
                writing.append((pool.submit(writer.write, data, write_uuid), data.nbytes))
                held += data.nbytes
                rows += num_rows
        for done, _ in writing:
            files += done.result()
    return files, rows


def _value_decoded(
    columns: dict[str, pa.ChunkedArray],
    num_rows: int,
    arrow: pa.Field,
    typed: _Typed | None,
    dead_writer: DataFileWriter | None,
    topic: str,
    write_uuid: uuid.UUID,
    versions: Callable[[], dict[tuple[int, int], bytes]],
) -> pa.ChunkedArray:
    """A read task's ``value_decoded`` column (``arrow``); with a schema, its dead letters past the dead-letter
    table's position written as that table's files (``typed.files``); without one (the topic had a schema, no
    longer), nulls (``pa.nulls`` of a struct has null children, which Parquet refuses under a required field)."""
    if typed is None or dead_writer is None:
        return pa.chunked_array([pa.array([None] * num_rows, type=arrow.type)])
    ids = pa.table({"ledger_id": columns["ledger_id"], "entry_id": columns["entry_id"]})
    column, errors = _decoded(columns["value"], arrow, registry_schema.row_decoders(typed.schema, ids, versions))
    if errors:
        dead = dead_letters.past(dead_letters.dead_letter_rows(pa.table(columns), errors), typed.position.of(topic))
        if dead.num_rows:
            dead_uuid = uuid.uuid5(_NAMES, f"{write_uuid}/{typed.position.snapshot_id}")
            typed.files += dead_writer.write(
                dead_writer.rows(dict(zip(dead.column_names, dead.columns, strict=True)), dead.num_rows), dead_uuid
            )
            typed.rows += dead.num_rows
    return pa.chunked_array([column])


def sync_topic(
    scoped: ScopedStore,
    catalog: Catalog,
    topic: str | TopicName,
    options: SyncOptions | None = None,
    hooks: SyncHooks | None = None,
) -> SyncReport:
    """Append to ``topic``'s table (created if new) every message the store has committed past it (module notes).
    ``topic`` is a topic, a partitioned topic (all its partitions) or one of its partitions (the whole topic)."""
    options = options or SyncOptions()
    base_topic = layout.table_topic(topic)
    metadata = MetadataStore(scoped)
    topics = resolve_topics(metadata, [str(base_topic)])
    partitioned = any(TopicName.parse(t).is_partition for t in topics)
    schema = registry_schema.lookup_value_schema(options.value_schema, str(base_topic), options.schema_registry)
    table, created = open_table(catalog, scoped, base_topic, create=True, partitioned=partitioned)
    assert table is not None
    dead: Table | None = None
    if schema is not None:
        _evolve(table, schema, str(base_topic))
        dead, _ = open_table(catalog, scoped, base_topic, create=True, dead=True)
    report = SyncReport(str(base_topic), table_name(base_topic), created=created)
    position = table_position(table)
    listed = _listed(metadata, topics, position)
    while True:
        pending = _pending(listed, position, options.segments_per_commit)
        if not pending:
            report.position = position
            return report
        typed = None if schema is None or dead is None else _Typed(schema, dead, table_position(dead))
        files, rows = _write(scoped, table, pending, position.snapshot_id, options, typed)
        positions = dict(position.positions)
        segments: dict[str, list[str]] = {}
        for part in pending:
            positions[part.topic] = mf.end_position(part.segments[-1])
            segments[part.topic] = [str(mf.manifest_uuid(s)) for s in part.segments]
        if hooks is not None and hooks.written is not None:
            hooks.written(table, files)
        if hooks is not None and hooks.before_commit is not None:
            hooks.before_commit()
        properties = summary_properties(positions, segments, store_name(scoped))
        try:
            if typed is not None and typed.files:
                ahead = {**typed.position.positions, **positions}  # where the dead letters are ahead, theirs
                ahead.update((t, p) for t, p in typed.position.positions.items() if p > positions.get(t, p))
                _commit(typed.dead, typed.files, summary_properties(ahead, segments, store_name(scoped)))
                if hooks is not None and hooks.dead_letters_committed is not None:
                    hooks.dead_letters_committed()
            snapshot_id = _commit(table, files, properties)
        except CommitFailedException as err:
            report.conflicts += 1
            log.info("table %s: another writer committed first (%s); re-reading it", report.table, err)
            if report.conflicts > options.max_conflicts:
                raise TableConflictError(
                    f"table {report.table}: {report.conflicts} commits in a row lost to other writers; nothing "
                    "was appended twice, run the sync again"
                ) from None
            table.refresh()
            if dead is not None:
                dead.refresh()
            position = table_position(table)
            continue
        dead_rows = 0 if typed is None else typed.rows
        report.commits.append(Commit(snapshot_id, segments, rows, [f.file_path for f in files], dead_rows))
        position = table_position(table)


def _commit(table: Table, files: list[DataFile], properties: dict[str, str]) -> int:
    """Commit ``files`` as one fast-append snapshot with ``properties`` in its summary, on the snapshot the position
    was read from (``table``'s current one): ``CommitFailedException`` if another writer committed since."""
    tx = table.transaction()
    with tx.update_snapshot(snapshot_properties=properties).fast_append() as append:
        for data_file in files:
            append.append_data_file(data_file)
    tx.commit_transaction()
    current = table.current_snapshot()
    assert current is not None
    return current.snapshot_id


def rebuild_topic(
    scoped: ScopedStore,
    catalog: Catalog,
    topic: str | TopicName,
    options: SyncOptions | None = None,
    hooks: SyncHooks | None = None,
) -> SyncReport:
    """Drop ``topic``'s table (its data files, manifests and metadata with it; its dead-letter table too) and derive
    it again from the store.
    Only a table the sync made for this topic is dropped (of any store). A crash part way leaves a table that a
    sync completes."""
    base_topic = layout.table_topic(topic)
    resolve_topics(MetadataStore(scoped), [str(base_topic)])  # a topic with nothing offloaded: an error first
    ident = layout.identifier(base_topic)
    try:
        table = catalog.load_table(ident)
    except NoSuchTableError:
        table = None
    if table is not None:
        held = table.properties.get(TOPIC_PROPERTY)
        if held != str(base_topic):
            raise TableSyncError(
                f"table {table_name(base_topic)} is not the table of {base_topic} "
                + (f"(it holds {held})" if held else "(it was not created by `streamoffload table sync`)")
                + ": it is left as it is"
            )
        catalog.purge_table(ident)
    try:  # its dead letters are derived from the store too
        dead = catalog.load_table(dead_letters.identifier(ident))
    except NoSuchTableError:
        dead = None
    if dead is not None and dead.properties.get(TOPIC_PROPERTY) == str(base_topic):
        catalog.purge_table(dead_letters.identifier(ident))
    return sync_topic(scoped, catalog, base_topic, options, hooks)
