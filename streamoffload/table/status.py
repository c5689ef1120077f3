"""Where a topic's table stands against the store: its position and lag (``table_status``), and the data files no
snapshot holds (``orphan_files``).

**Orphans** are the data files of attempts that never committed: a sync killed between writing Parquet and its
commit, or one that lost its commit to another writer. They are listed here (``streamoffload table show
--orphans``) and never read by any engine (a reader follows the snapshots). A file younger than the grace period
may belong to a sync still running, so only older ones are listed as removable; ``table maintain`` removes them
(``table.maintenance.remove_orphan_files``), with the files compaction and retention replaced once the snapshots
holding them are expired.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from pyarrow import fs as pafs
from pyiceberg.catalog import Catalog
from pyiceberg.table import Table

from streamoffload.checkpoints import manifest as mf
from streamoffload.checkpoints.metadata_store import MetadataStore
from streamoffload.codecs.positions import Position
from streamoffload.codecs.proto.offload_manifest_pb2 import SegmentManifest
from streamoffload.codecs.topics import TopicName
from streamoffload.read.dataset_plan import resolve_topics
from streamoffload.storage.location import ScopedStore
from streamoffload.table import layout
from streamoffload.table.position import table_position
from streamoffload.table.sync import open_table, table_name

DEFAULT_ORPHAN_GRACE_S = 3600.0


@dataclass(frozen=True)
class PartitionLag:
    """One topic-partition: the last position the table holds, the store's last offloaded one, and what lies
    between (whole segments, and their entries)."""

    topic: str
    table_position: Position | None
    store_position: Position | None
    segments_behind: int
    entries_behind: int

    def as_dict(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "table_position": list(self.table_position) if self.table_position else None,
            "store_position": list(self.store_position) if self.store_position else None,
            "segments_behind": self.segments_behind,
            "entries_behind": self.entries_behind,
        }


@dataclass(frozen=True)
class TableStatus:
    """A topic's table: whether it exists, its current snapshot and totals, and each partition's lag."""

    topic: str
    table: str
    exists: bool
    location: str | None = None
    snapshot_id: int | None = None
    committed_ms: int | None = None
    rows: int = 0
    data_files: int = 0
    partitions: list[PartitionLag] = field(default_factory=list)
    orphans: list[str] | None = None
    dead_letters: int | None = None
    """Rows of its dead-letter table (``table.dead_letters``: values that did not decode); None: it has none."""

    @property
    def segments_behind(self) -> int:
        return sum(p.segments_behind for p in self.partitions)

    @property
    def entries_behind(self) -> int:
        return sum(p.entries_behind for p in self.partitions)

    def as_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "topic": self.topic,
            "table": self.table,
            "exists": self.exists,
            "location": self.location,
            "snapshot_id": self.snapshot_id,
            "committed_ms": self.committed_ms,
            "rows": self.rows,
            "data_files": self.data_files,
            "segments_behind": self.segments_behind,
            "entries_behind": self.entries_behind,
            "partitions": [p.as_dict() for p in self.partitions],
        }
        if self.orphans is not None:
            doc["orphans"] = self.orphans
        if self.dead_letters is not None:
            doc["dead_letters"] = self.dead_letters
        return doc


def segment_entries(segment: SegmentManifest, after: Position | None = None) -> int:
    """The entries of a segment past ``after`` (all of them when None), from its ledger spans."""
    total = 0
    for span in mf.spans_of(segment):
        first = span.first_entry_id
        if after is not None:
            if span.ledger_id < after[0]:
                continue
            if span.ledger_id == after[0]:
                first = max(first, after[1] + 1)
        total += max(span.last_entry_id - first + 1, 0)
    return total


def _partition_lag(metadata: MetadataStore, topic: str, held: Position | None) -> PartitionLag:
    segments = metadata.offloaded_segments(topic)
    ahead = [s for s in segments if held is None or mf.end_position(s) > held]
    return PartitionLag(
        topic,
        held,
        mf.end_position(segments[-1]) if segments else None,
        len(ahead),
        sum(segment_entries(s, held) for s in ahead),
    )


def table_status(
    scoped: ScopedStore,
    catalog: Catalog,
    topic: str | TopicName,
    *,
    orphans: bool = False,
    grace_s: float = DEFAULT_ORPHAN_GRACE_S,
) -> TableStatus:
    """Where ``topic``'s table stands against the store (a table not created yet is all lag)."""
    base = layout.table_topic(topic)
    metadata = MetadataStore(scoped)
    topics = resolve_topics(metadata, [str(base)])
    table, _ = open_table(catalog, scoped, base, create=False)
    if table is None:
        return TableStatus(
            str(base), table_name(base), False, partitions=[_partition_lag(metadata, t, None) for t in topics]
        )
    position = table_position(table)
    current = table.current_snapshot()
    summary = current.summary if current is not None else None
    dead, _ = open_table(catalog, scoped, base, create=False, dead=True)
    return TableStatus(
        str(base),
        table_name(base),
        True,
        location=table.location(),
        snapshot_id=position.snapshot_id,
        committed_ms=current.timestamp_ms if current is not None else None,
        rows=int(summary["total-records"] or 0) if summary is not None else 0,
        data_files=int(summary["total-data-files"] or 0) if summary is not None else 0,
        partitions=[_partition_lag(metadata, t, position.of(t)) for t in topics],
        orphans=orphan_files(table, grace_s=grace_s) if orphans else None,
        dead_letters=None if dead is None else _rows(dead),
    )


def _rows(table: Table) -> int:
    """The rows of ``table``'s current snapshot (its summary's ``total-records``)."""
    current = table.current_snapshot()
    summary = current.summary if current is not None else None
    return int(summary["total-records"] or 0) if summary is not None else 0


def referenced_files(table: Table) -> set[str]:
    """Every data file a snapshot of ``table`` (any, not only the current) holds. A manifest's entry for a file its
    snapshot deleted (a compaction's, a retention's) does not count: the parent snapshot holds that file while it
    is there, and once it is expired no snapshot does."""
    out: set[str] = set()
    for snapshot in table.metadata.snapshots:
        for manifest in snapshot.manifests(table.io):
            for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
                out.add(entry.data_file.file_path)
    return out


def _fs_path(url: str) -> str:
    """A file's URL as a path in pyarrow's filesystem for it (``/dir/x`` locally, ``bucket/key`` on S3)."""
    parts = urlsplit(url)
    return parts.path if parts.scheme in ("", "file") else f"{parts.netloc}{parts.path}"


def _filesystem(table: Table, location: str) -> pafs.FileSystem:
    """pyarrow's filesystem for a table location, as the table's own FileIO reaches it."""
    parts = urlsplit(location)
    fs_by_scheme = getattr(table.io, "fs_by_scheme", None)
    if fs_by_scheme is not None:
        return fs_by_scheme(parts.scheme or "file", parts.netloc or None)
    return pafs.FileSystem.from_uri(location)[0]


def orphan_files(table: Table, *, grace_s: float = DEFAULT_ORPHAN_GRACE_S, now: float | None = None) -> list[str]:
    """The Parquet files under the table's ``data/`` that no snapshot references, older than ``grace_s``
    (younger ones may be a running sync's), as URLs; sorted."""
    return _unreferenced(table, "data", ".parquet", lambda: referenced_files(table), grace_s, now)


def referenced_metadata_files(table: Table) -> set[str]:
    """The manifest lists of ``table``'s snapshots and the manifests they list."""
    out: set[str] = set()
    for snapshot in table.metadata.snapshots:
        out.add(snapshot.manifest_list)
        out.update(manifest.manifest_path for manifest in snapshot.manifests(table.io))
    return out


def orphan_metadata_files(
    table: Table, *, grace_s: float = DEFAULT_ORPHAN_GRACE_S, now: float | None = None
) -> list[str]:
    """The manifest lists and manifests (``.avro`` under ``metadata/``) no snapshot names, older than ``grace_s``
    (a running commit writes its own before it commits), as URLs; sorted."""
    return _unreferenced(table, "metadata", ".avro", lambda: referenced_metadata_files(table), grace_s, now)


def _unreferenced(
    table: Table, folder: str, suffix: str, referenced: Callable[[], set[str]], grace_s: float, now: float | None
) -> list[str]:
    """The files ending in ``suffix`` under the table's ``folder`` that are not ``referenced``, older than
    ``grace_s``. The files are listed before the references are read: a file committed meanwhile is young."""
    location = table.location().rstrip("/") + "/" + folder
    scheme = urlsplit(location).scheme or "file"
    infos = _filesystem(table, location).get_file_info(
        pafs.FileSelector(_fs_path(location), recursive=True, allow_not_found=True)
    )
    held = {_fs_path(f) for f in referenced()}
    cutoff = (time.time() if now is None else now) - grace_s
    out = []
    for info in infos:
        if info.type != pafs.FileType.File or not info.path.endswith(suffix) or info.path in held:
            continue
        if info.mtime is not None and info.mtime.timestamp() > cutoff:
            continue
        out.append(f"{scheme}://{info.path}")
    return sorted(out)
