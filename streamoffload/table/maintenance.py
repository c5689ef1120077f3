"""Keep a topic's table small and in step with the store: ``maintain_table`` runs, in this order,

1. **retention** (``drop_deleted_segments``): rows of segments the store no longer has (its retention or
   ``delete-ledger`` deleted them) leave the table. A row stays while any ``Offloaded`` segment of its
   topic-partition holds its position; the others are removed copy-on-write (a data file wholly gone is dropped,
   one partly gone rewritten with the rows that stay) in one overwrite snapshot;
2. **compaction** (``compact_table``): per table partition, the data files below ``target_file_bytes`` are
   rewritten into fewer larger ones (packed in position order up to the target) once more than ``min_files``
   of them exist, each new file sorted by position, in one overwrite snapshot that removes the old files and
   adds the new;
3. **snapshot expiry** (``expire_snapshots``, pyiceberg's ``table.maintenance.expire_snapshots()``): snapshots
   older than ``expire_older_than_s`` go, except the newest ``keep_snapshots`` (and the current one, and every
   one back to the newest that records the table's position: ``table.position``);
4. **orphan removal** (``remove_orphan_files``): data files no live snapshot names (``status.orphan_files``:
   failed sync attempts, files compaction and retention replaced once their snapshots expired), and manifest lists
   and manifests none names (expired snapshots', failed commits'), older than ``orphan_grace_s``. Old
   ``metadata.json`` files are pyiceberg's to drop after each commit (``write.metadata.delete-after-commit.enabled``,
   set by ``table.sync``).

A topic's dead-letter table (``table.dead_letters``) gets the same steps after its table: its position columns
are the same (found by name: their field ids differ), and its rows of deleted segments leave with theirs.

**Exactly once.** Retention and compaction commit like the sync (``table.sync``): their snapshot's summary
carries the base snapshot's positions unchanged (``position.summary_properties``, no segments), so
``table_position`` and the next sync see the same table; the commit requires the base snapshot to still be
current, and pyiceberg's commit retry is off on these tables. A commit lost to a sync (or another maintenance)
raises ``CommitFailedException``: the step re-reads the table and plans again from the new snapshot, so no row is
dropped or kept twice; the lost attempt's files are orphans. Each attempt's file names are deterministic (the
table, the step, the first file it replaces, the base snapshot and ``writer``), as the sync's are.

pyiceberg 0.12 has no ``replace`` snapshot producer (its summaries take append, overwrite and delete only), so a
compaction is an ``overwrite`` snapshot whose added and deleted records are equal: an incremental reader that
follows appends only must skip overwrite snapshots.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.catalog import Catalog
from pyiceberg.conversions import from_bytes
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.expressions import AlwaysTrue
from pyiceberg.io.pyarrow import ArrowScan
from pyiceberg.manifest import DataFile
from pyiceberg.table import FileScanTask, Table
from pyiceberg.table.snapshots import ancestors_of
from pyiceberg.types import IntegerType, LongType, PrimitiveType

from streamoffload.checkpoints import manifest as mf
from streamoffload.checkpoints.metadata_store import CorruptManifest, MetadataStore
from streamoffload.codecs.proto.offload_manifest_pb2 import SegmentManifest
from streamoffload.codecs.topics import TopicName
from streamoffload.storage.location import ScopedStore
from streamoffload.table import layout
from streamoffload.table.data_files import DataFileWriter
from streamoffload.table.errors import TableError
from streamoffload.table.position import POSITIONS, TablePosition, summary_properties, table_position
from streamoffload.table.status import DEFAULT_ORPHAN_GRACE_S, orphan_files, orphan_metadata_files
from streamoffload.table.sync import (
    DEFAULT_MAX_CONFLICTS,
    STORE_PROPERTY,
    SyncHooks,
    open_table,
    table_name,
)
from streamoffload.units import MIB

log = logging.getLogger(__name__)

DEFAULT_TARGET_FILE_BYTES = 128 * MIB
"""Compaction packs small files up to this many bytes per new file."""
DEFAULT_MIN_FILES = 5
"""A partition's small files are compacted once more than this many exist."""
DEFAULT_KEEP_SNAPSHOTS = 100
"""Snapshots expiry always keeps (the newest)."""
DEFAULT_EXPIRE_OLDER_THAN_S = 3600.0
"""Snapshots younger than this are kept: a reader planning on one has this long."""

RETRIES = "commit.retry.num-retries"
_NAMES = uuid.UUID("0f3c7a52-9d4e-4a61-8c2b-5e7d1f90a3c4")
"""The namespace of maintenance data file uuids (``uuid5``): never one of the sync's names."""
_SORT = [
    ("partition", "ascending"),
    ("ledger_id", "ascending"),
    ("entry_id", "ascending"),
    ("batch_index", "ascending"),
]


@dataclass(frozen=True)
class _PositionIds:
    """The field ids of a table's position columns (a topic table's and its dead-letter table's differ)."""

    ledger: int
    entry: int
    partition: int

    @staticmethod
    def of(table: Table) -> _PositionIds:
        schema = table.schema()
        return _PositionIds(*(schema.find_field(n).field_id for n in ("ledger_id", "entry_id", "partition")))


STEPS = ("retention", "compact", "expire", "orphans")


class TableMaintenanceError(TableError):
    """A maintenance step that cannot run on a table as it is."""


@dataclass(frozen=True)
class MaintenanceOptions:
    """How ``maintain_table`` maintains a table (module notes): ``steps`` (of ``STEPS``, always run in that order),
    ``target_file_bytes`` and ``min_files`` (compaction), ``keep_snapshots`` and ``expire_older_than_s`` (expiry),
    ``orphan_grace_s`` (orphans younger than this may be a running sync's), ``max_conflicts`` (commits lost to
    other writers before a step gives up), ``writer`` (part of every new data file's name)."""

    steps: tuple[str, ...] = STEPS
    target_file_bytes: int = DEFAULT_TARGET_FILE_BYTES
    min_files: int = DEFAULT_MIN_FILES
    keep_snapshots: int = DEFAULT_KEEP_SNAPSHOTS
    expire_older_than_s: float = DEFAULT_EXPIRE_OLDER_THAN_S
    orphan_grace_s: float = DEFAULT_ORPHAN_GRACE_S
    max_conflicts: int = DEFAULT_MAX_CONFLICTS
    writer: str = ""

    def __post_init__(self) -> None:
        unknown = [s for s in self.steps if s not in STEPS]
        if (
            unknown
            or self.target_file_bytes < 1
            or self.min_files < 1
            or self.keep_snapshots < 1
            or self.expire_older_than_s < 0
            or self.orphan_grace_s < 0
            or self.max_conflicts < 0
        ):
            raise ValueError(f"invalid maintenance options: {self}")


@dataclass(frozen=True)
class Rewrite:
    """What one retention or compaction commit did: the snapshot, the files it removed and added, and the rows it
    removed (compaction: 0) and rewrote."""

    snapshot_id: int | None = None
    removed_files: list[str] = field(default_factory=list)
    added_files: list[str] = field(default_factory=list)
    removed_rows: int = 0
    rewritten_rows: int = 0
    conflicts: int = 0


@dataclass(frozen=True)
class PartitionFiles:
    """A table partition's data files before and after compaction (``partition=0/__publishTime_day=...``)."""

    partition: str
    files_before: int
    files_after: int


@dataclass(frozen=True)
class CompactionReport:
    rewrite: Rewrite = field(default_factory=Rewrite)
    partitions: list[PartitionFiles] = field(default_factory=list)
    """Only the partitions compacted."""


@dataclass(frozen=True)
class RetentionReport:
    rewrite: Rewrite = field(default_factory=Rewrite)
    removed_rows: dict[str, int] = field(default_factory=dict)
    """Per topic-partition."""
    skipped: dict[str, str] = field(default_factory=dict)
    """Topic-partitions left as they are, with why."""


@dataclass(frozen=True)
class ExpiryReport:
    expired: list[int] = field(default_factory=list)
    kept: list[int] = field(default_factory=list)
    conflicts: int = 0


@dataclass(frozen=True)
class OrphanReport:
    removed: list[str] = field(default_factory=list)
    """Data files."""
    removed_metadata: list[str] = field(default_factory=list)
    """Manifest lists and manifests of expired snapshots and failed commits."""


@dataclass
class MaintenanceReport:
    """What ``maintain_table`` did to one topic's table (None: the step did not run)."""

    topic: str
    table: str
    exists: bool = True
    retention: RetentionReport | None = None
    compaction: CompactionReport | None = None
    expiry: ExpiryReport | None = None
    orphans: OrphanReport | None = None
    position: TablePosition = field(default_factory=TablePosition)
    dead_letters: MaintenanceReport | None = None
    """The same steps on the topic's dead-letter table (None: it has none)."""

    @property
    def files_compacted(self) -> int:
        """Data files compaction replaced, here and in the dead-letter table."""
        own = len(self.compaction.rewrite.removed_files) if self.compaction is not None else 0
        return own + (self.dead_letters.files_compacted if self.dead_letters is not None else 0)

    @property
    def snapshots_expired(self) -> int:
        own = len(self.expiry.expired) if self.expiry is not None else 0
        return own + (self.dead_letters.snapshots_expired if self.dead_letters is not None else 0)

    @property
    def orphans_removed(self) -> int:
        """Files orphan removal deleted (data files, manifest lists and manifests)."""
        own = len(self.orphans.removed) + len(self.orphans.removed_metadata) if self.orphans is not None else 0
        return own + (self.dead_letters.orphans_removed if self.dead_letters is not None else 0)

    @property
    def rows_retained_away(self) -> int:
        """Rows retention removed (of segments the store no longer has), here and in the dead-letter table."""
        own = self.retention.rewrite.removed_rows if self.retention is not None else 0
        return own + (self.dead_letters.rows_retained_away if self.dead_letters is not None else 0)

    def as_dict(self) -> dict[str, object]:
        """The report as JSON values."""
        doc: dict[str, object] = {
            "topic": self.topic,
            "table": self.table,
            "exists": self.exists,
            "snapshot_id": self.position.snapshot_id,
            "positions": {t: list(p) for t, p in sorted(self.position.positions.items())},
        }
        for name, step in (
            ("retention", self.retention),
            ("compaction", self.compaction),
            ("expiry", self.expiry),
            ("orphans", self.orphans),
        ):
            doc[name] = None if step is None else asdict(step)
        if self.dead_letters is not None:
            doc["dead_letters"] = self.dead_letters.as_dict()
        return doc


# -- the commit shared by retention and compaction ------------------------------------------------------------------


@dataclass(frozen=True)
class _Plan:
    """One attempt's change: data files to remove, the new files' rows, and what the step counts."""

    removed: list[DataFile]
    written: list[DataFile]
    removed_rows: int
    rewritten_rows: int


def _write(table: Table, rows: pa.Table, step: str, replaces: str, base: int, writer: str) -> list[DataFile]:
    """``rows`` (all of one table partition) as new data files, named by the step, the first file they replace,
    the base snapshot and the writer (module notes)."""
    write_uuid = uuid.uuid5(_NAMES, f"{table.metadata.table_uuid}/{step}/{replaces}/{base}/{writer}")
    data = rows.sort_by(_SORT)
    files = DataFileWriter(table)  # as the sync writes them (no dictionary for a message's own bytes)
    return files.write(files.rows(dict(zip(data.column_names, data.columns, strict=True)), data.num_rows), write_uuid)


def _read(table: Table, tasks: Sequence[FileScanTask], columns: Sequence[str] | None = None) -> pa.Table:
    """Data files' rows as pyiceberg reads them (by field id, in the table's current schema)."""
    schema = table.schema() if columns is None else table.schema().select(*columns)
    return ArrowScan(table.metadata, table.io, schema, AlwaysTrue()).to_table(tasks)


def _commit_rewrite(
    table: Table,
    plan: Callable[[Table, TablePosition], _Plan | None],
    what: str,
    max_conflicts: int,
    hooks: SyncHooks | None,
) -> Rewrite:
    """Plan on the current snapshot, write, commit one overwrite snapshot carrying the base's positions; plan
    again after a commit lost to another writer (module notes)."""
    conflicts = 0
    table.refresh()
    if table.properties.get(RETRIES) != "0":
        # A retry on a new base would commit this base's positions over a sync's newer ones (module notes).
        log.info("table %s: turning pyiceberg's commit retries off before the %s", _name(table), what)
        with table.transaction() as tx:
            tx.set_properties({RETRIES: "0"})
    while True:
        table.refresh()
        position = table_position(table)
        if position.snapshot_id is None:
            return Rewrite(conflicts=conflicts)
        change = plan(table, position)
        if change is None:
            return Rewrite(conflicts=conflicts)
        if hooks is not None and hooks.written is not None:
            hooks.written(table, change.written)
        store = table.properties.get(STORE_PROPERTY, "")
        properties = summary_properties(position.positions, {}, store)
        try:
            tx = table.transaction()
            with tx.update_snapshot(snapshot_properties=properties).overwrite() as overwrite:
                for old in change.removed:
                    overwrite.delete_data_file(old)
                for new in change.written:
                    overwrite.append_data_file(new)
            tx.commit_transaction()
        except CommitFailedException as err:
            conflicts += 1
            log.info("table %s: %s lost its commit to another writer (%s); planning again", _name(table), what, err)
            if conflicts > max_conflicts:
                raise TableMaintenanceError(
                    f"table {_name(table)}: {what} lost {conflicts} commits in a row to other writers; nothing was "
                    "changed, run it again"
                ) from None
            continue
        current = table.current_snapshot()
        assert current is not None
        return Rewrite(
            current.snapshot_id,
            sorted(f.file_path for f in change.removed),
            sorted(f.file_path for f in change.written),
            change.removed_rows,
            change.rewritten_rows,
            conflicts,
        )


def _name(table: Table) -> str:
    return ".".join(table.name())


def _partition_key(task: FileScanTask) -> tuple[int, tuple[object, ...]]:
    record = task.file.partition
    return task.file.spec_id, tuple(record[i] for i in range(len(record)))


def _by_partition(tasks: Iterable[FileScanTask]) -> dict[tuple[int, tuple[object, ...]], list[FileScanTask]]:
    out: dict[tuple[int, tuple[object, ...]], list[FileScanTask]] = {}
    for task in tasks:
        out.setdefault(_partition_key(task), []).append(task)
    return out


def _bound(data_file: DataFile, field_id: int, upper: bool, kind: PrimitiveType | None = None) -> int | None:
    """A file's lower (or upper) bound of an integer column, from its column statistics (None: not recorded)."""
    bounds = data_file.upper_bounds if upper else data_file.lower_bounds
    raw = bounds.get(field_id) if bounds else None
    return None if raw is None else int(from_bytes(kind or LongType(), raw))


def _first_position(task: FileScanTask, ids: _PositionIds) -> tuple[int, int, str]:
    """A file's order in its partition: its lowest ledger and entry (from its column statistics), then its name."""
    return (
        _bound(task.file, ids.ledger, False) or 0,
        _bound(task.file, ids.entry, False) or 0,
        task.file.file_path,
    )


# -- compaction -----------------------------------------------------------------------------------------------------


def compact_table(
    table: Table, options: MaintenanceOptions | None = None, hooks: SyncHooks | None = None
) -> CompactionReport:
    """Rewrite each partition's small files into fewer larger ones, in one snapshot (module notes); ``hooks.written``
    runs between an attempt's writes and its commit."""
    options = options or MaintenanceOptions()
    partitions: list[PartitionFiles] = []

    def plan(table: Table, position: TablePosition) -> _Plan | None:
        assert position.snapshot_id is not None
        ids = _PositionIds.of(table)
        partitions.clear()
        removed: list[DataFile] = []
        written: list[DataFile] = []
        rows = 0
        spec = table.spec()
        for key, tasks in sorted(_by_partition(table.scan().plan_files()).items(), key=lambda kv: repr(kv[0])):
            small = sorted(
                (t for t in tasks if t.file.file_size_in_bytes < options.target_file_bytes and not t.delete_files),
                key=lambda t: _first_position(t, ids),
            )
            if len(small) <= options.min_files:
                continue
            bins: list[list[FileScanTask]] = [[]]
            size = 0
            for task in small:
                if bins[-1] and size + task.file.file_size_in_bytes > options.target_file_bytes:
                    bins.append([])
                    size = 0
                bins[-1].append(task)
                size += task.file.file_size_in_bytes
            new_files = 0
            for group in bins:
                if len(group) < 2:
                    continue
                data = _read(table, group)
                expected = sum(t.file.record_count for t in group)
                if data.num_rows != expected:
                    raise TableMaintenanceError(
                        f"table {_name(table)}: compaction read {data.num_rows} rows from files that list {expected}"
                    )
                files = _write(table, data, "compact", group[0].file.file_path, position.snapshot_id, options.writer)
                removed += [t.file for t in group]
                written += files
                new_files += len(files)
                rows += data.num_rows
            if new_files:
                compacted = sum(len(g) for g in bins if len(g) >= 2)
                name = spec.partition_to_path(tasks[0].file.partition, table.schema()) if key[1] else ""
                partitions.append(PartitionFiles(name, len(tasks), len(tasks) - compacted + new_files))
        if not removed:
            return None
        return _Plan(removed, written, 0, rows)

    rewrite = _commit_rewrite(table, plan, "compaction", options.max_conflicts, hooks)
    return CompactionReport(rewrite, list(partitions) if rewrite.snapshot_id is not None else [])


# -- retention ------------------------------------------------------------------------------------------------------

_Intervals = dict[int, list[tuple[int, int]]]
"""Per ledger, the entry ranges (inclusive) the store's segments hold."""


def _held(segments: Sequence[SegmentManifest]) -> _Intervals:
    """The positions ``segments`` hold, per ledger (a segment's ledger spans)."""
    out: _Intervals = {}
    for segment in segments:
        for span in mf.spans_of(segment):
            out.setdefault(span.ledger_id, []).append((span.first_entry_id, span.last_entry_id))
    return out


def _held_mask(ledgers: pa.Array, entries: pa.Array, held: _Intervals) -> pa.Array:
    """Which rows' positions the store still holds."""
    mask = _none(len(ledgers))
    for ledger in pc.unique(ledgers).to_pylist():
        in_ledger = pc.equal(ledgers, ledger)
        for first, last in held.get(ledger, []):
            inside = pc.and_(pc.greater_equal(entries, first), pc.less_equal(entries, last))
            mask = pc.or_(mask, pc.and_(in_ledger, inside))
    return mask


def _none(rows: int) -> pa.Array:
    return pa.array(np.zeros(rows, dtype=bool))


def _wholly_held(data_file: DataFile, held: _Intervals, ids: _PositionIds) -> bool:
    """Whether a file's column statistics alone show the store holds every row (one ledger, entries in a span)."""
    low, high = _bound(data_file, ids.ledger, False), _bound(data_file, ids.ledger, True)
    first, last = _bound(data_file, ids.entry, False), _bound(data_file, ids.entry, True)
    if low is None or low != high or first is None or last is None:
        return False
    return any(a <= first and last <= b for a, b in held.get(low, []))


def _store_holdings(
    scoped: ScopedStore, position: TablePosition, skipped: dict[str, str]
) -> dict[int, tuple[str, _Intervals]]:
    """Per ``partition`` value, its topic-partition and what the store holds of it; topic-partitions whose
    holdings cannot be known are left out, with why, in ``skipped``."""
    metadata = MetadataStore(scoped)
    out: dict[int, tuple[str, _Intervals]] = {}
    for topic in sorted(position.positions):
        corrupt: list[CorruptManifest] = []
        segments = metadata.offloaded_segments(topic, corrupt)
        if corrupt:
            skipped[topic] = (
                f"{len(corrupt)} manifest(s) do not decode (e.g. {corrupt[0].key}): what they hold is unknown"
            )
            continue
        if not segments and not metadata.deleted_segment_ids(topic):
            skipped[topic] = "the store has neither segments nor deletion records of it"
            continue
        out[TopicName.parse(topic).partition] = (topic, _held(segments))
    return out


def drop_deleted_segments(
    scoped: ScopedStore,
    table: Table,
    options: MaintenanceOptions | None = None,
    hooks: SyncHooks | None = None,
) -> RetentionReport:
    """Remove from ``table`` the rows of segments ``scoped`` no longer has, in one snapshot (module notes)."""
    options = options or MaintenanceOptions()
    removed_rows: dict[str, int] = {}
    skipped: dict[str, str] = {}

    def plan(table: Table, position: TablePosition) -> _Plan | None:
        assert position.snapshot_id is not None
        ids = _PositionIds.of(table)
        removed_rows.clear()
        skipped.clear()
        holdings = _store_holdings(scoped, position, skipped)
        skipped_parts = {TopicName.parse(t).partition for t in skipped}
        removed: list[DataFile] = []
        written: list[DataFile] = []
        kept_rows = dropped_rows = 0
        for task in sorted(table.scan().plan_files(), key=lambda t: t.file.file_path):
            if task.delete_files:
                continue  # not a file the sync or maintenance wrote: left alone
            part = _bound(task.file, ids.partition, False, IntegerType())
            one_part = part is not None and part == _bound(task.file, ids.partition, True, IntegerType())
            if one_part and part in holdings and _wholly_held(task.file, holdings[part][1], ids):
                continue  # its statistics alone show the store holds every row
            keys = _read(table, [task], ["partition", "ledger_id", "entry_id"])
            parts = set(pc.unique(keys.column("partition")).to_pylist())
            if parts & skipped_parts or not parts <= set(holdings):
                continue  # rows of a topic-partition whose holdings are unknown: left alone
            mask = _none(keys.num_rows)
            for p in parts:
                in_part = pc.equal(keys.column("partition"), p)
                held = _held_mask(keys.column("ledger_id"), keys.column("entry_id"), holdings[p][1])
                mask = pc.or_(mask, pc.and_(in_part, held))
            keep = pc.sum(mask).as_py() or 0
            if keep == keys.num_rows:
                continue
            for p in parts:
                gone = pc.sum(pc.and_(pc.equal(keys.column("partition"), p), pc.invert(mask))).as_py() or 0
                if gone:
                    topic = holdings[p][0]
                    removed_rows[topic] = removed_rows.get(topic, 0) + gone
            removed.append(task.file)
            dropped_rows += keys.num_rows - keep
            if keep:
                rows = _read(table, [task]).filter(mask)
                written += _write(table, rows, "retain", task.file.file_path, position.snapshot_id, options.writer)
                kept_rows += keep
        if not removed:
            return None
        return _Plan(removed, written, dropped_rows, kept_rows)

    rewrite = _commit_rewrite(table, plan, "retention", options.max_conflicts, hooks)
    return RetentionReport(rewrite, dict(removed_rows) if rewrite.snapshot_id is not None else {}, dict(skipped))


# -- snapshot expiry ------------------------------------------------------------------------------------------------


def expire_snapshots(
    table: Table, options: MaintenanceOptions | None = None, *, now: float | None = None
) -> ExpiryReport:
    """Expire the snapshots older than ``expire_older_than_s`` beyond the newest ``keep_snapshots``, through
    pyiceberg's ``ExpireSnapshots``; never the current one (nor a branch head or tag), nor one back to the newest
    recording the position."""
    options = options or MaintenanceOptions()
    conflicts = 0
    while True:
        table.refresh()
        snapshots = sorted(table.metadata.snapshots, key=lambda s: (s.sequence_number or 0, s.timestamp_ms))
        protected = {s.snapshot_id for s in snapshots[-options.keep_snapshots :]}
        protected |= {ref.snapshot_id for ref in table.metadata.refs.values()}  # branch heads and tags
        for snapshot in ancestors_of(table.current_snapshot(), table.metadata):
            protected.add(snapshot.snapshot_id)
            if snapshot.summary is not None and snapshot.summary[POSITIONS]:
                break
        cutoff_ms = ((time.time() if now is None else now) - options.expire_older_than_s) * 1000
        expired = [s.snapshot_id for s in snapshots if s.snapshot_id not in protected and s.timestamp_ms < cutoff_ms]
        kept = [s.snapshot_id for s in snapshots if s.snapshot_id not in expired]
        if not expired:
            return ExpiryReport([], kept, conflicts)
        try:
            table.maintenance.expire_snapshots().by_ids(expired).commit()
        except CommitFailedException as err:
            conflicts += 1
            log.info(
                "table %s: snapshot expiry lost its commit to another writer (%s); planning again", _name(table), err
            )
            if conflicts > options.max_conflicts:
                raise TableMaintenanceError(
                    f"table {_name(table)}: snapshot expiry lost {conflicts} commits in a row to other writers; "
                    "run it again"
                ) from None
            continue
        return ExpiryReport(expired, kept, conflicts)


# -- orphans --------------------------------------------------------------------------------------------------------


def remove_orphan_files(
    table: Table, *, grace_s: float = DEFAULT_ORPHAN_GRACE_S, now: float | None = None
) -> OrphanReport:
    """Delete the data files, manifest lists and manifests no live snapshot names, older than ``grace_s``
    (``status.orphan_files``, ``status.orphan_metadata_files``: they list the files before they read the snapshots,
    so a file committed meanwhile is either young or named)."""
    table.refresh()
    data = orphan_files(table, grace_s=grace_s, now=now)
    metadata = orphan_metadata_files(table, grace_s=grace_s, now=now)
    for url in data + metadata:
        table.io.delete(url)
    return OrphanReport(data, metadata)


# -- all of it ------------------------------------------------------------------------------------------------------


def maintain_table(
    scoped: ScopedStore,
    catalog: Catalog,
    topic: str | TopicName,
    options: MaintenanceOptions | None = None,
    hooks: SyncHooks | None = None,
    *,
    now: float | None = None,
) -> MaintenanceReport:
    """Run ``options.steps`` on ``topic``'s table (module notes), then on its dead-letter table if it has one
    (``report.dead_letters``: its rows of segments the store no longer has go too, its files are compacted); a
    topic with no table yet is left alone."""
    options = options or MaintenanceOptions()
    base = layout.table_topic(topic)
    report = MaintenanceReport(str(base), table_name(base))
    table, _ = open_table(catalog, scoped, base, create=False)
    if table is None:
        report.exists = False
        return report
    _maintain(scoped, table, report, options, hooks, now)
    dead, _ = open_table(catalog, scoped, base, create=False, dead=True)
    if dead is not None:
        report.dead_letters = MaintenanceReport(str(base), ".".join(dead.name()))
        _maintain(scoped, dead, report.dead_letters, options, hooks, now)
    return report


def _maintain(
    scoped: ScopedStore,
    table: Table,
    report: MaintenanceReport,
    options: MaintenanceOptions,
    hooks: SyncHooks | None,
    now: float | None,
) -> None:
    if "retention" in options.steps:
        report.retention = drop_deleted_segments(scoped, table, options, hooks)
    if "compact" in options.steps:
        report.compaction = compact_table(table, options, hooks)
    if "expire" in options.steps:
        report.expiry = expire_snapshots(table, options, now=now)
    if "orphans" in options.steps:
        report.orphans = remove_orphan_files(table, grace_s=options.orphan_grace_s, now=now)
    table.refresh()
    report.position = table_position(table)
