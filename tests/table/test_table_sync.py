"""``streamoffload.table``: a topic's Iceberg table synced from a real filesystem store (written by the real
segmenter and sink) into a real SQLite catalog, read back by three readers that share no code with the writer's
read path: pyiceberg's scan, polars' ``scan_iceberg`` and DuckDB over the Parquet files the manifests list."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import polars as pl
import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.manifest import DataFile
from pyiceberg.table import Table

from streamoffload.checkpoints import manifest as mf
from streamoffload.checkpoints.metadata_store import MetadataStore
from streamoffload.storage.location import ScopedStore, StoreLocation, parse_store_url
from streamoffload.table.catalog import CatalogSettings, catalog_settings, open_catalog
from streamoffload.table.position import POSITIONS, STORE, TablePositionError, segments_of, table_position
from streamoffload.table.status import orphan_files, referenced_files, table_status
from streamoffload.table.sync import (
    METADATA_VERSIONS_KEPT,
    SyncHooks,
    SyncOptions,
    TableSyncError,
    rebuild_topic,
    sync_topic,
)
from tests.table.offload import Row, TopicOffload, row_tuple

TOPIC = "persistent://public/default/orders"
PARTS = [f"{TOPIC}-partition-{i}" for i in range(2)]
IDENT = "public.default.orders"


@dataclass
class Tier:
    """A store, its catalog (the default SQLite one here; tests/table/test_catalogs.py runs some of these tests on
    the others), and the partitions of one topic being offloaded."""

    location: StoreLocation
    scoped: ScopedStore
    settings: CatalogSettings
    catalog: Catalog
    offloads: list[TopicOffload]

    @property
    def rows(self) -> list[Row]:
        return sorted((r for o in self.offloads for r in o.rows), key=lambda r: r.position)

    def table(self) -> Table:
        return self.catalog.load_table(IDENT)

    def segment_ids(self, topic: str) -> list[str]:
        return [str(mf.manifest_uuid(m)) for m in MetadataStore(self.scoped).offloaded_segments(topic)]

    def other_catalog(self) -> Catalog:
        """A second handle on the same catalog: another process's view."""
        return open_catalog(self.settings)


@pytest.fixture
def tier(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Tier]:
    monkeypatch.setenv("POLARS_ICEBERG_PLANNER", "pyiceberg")  # polars' planner plugin is not installed
    location = parse_store_url(str(tmp_path / "store"))
    scoped = location.open()
    offloads = [TopicOffload(scoped, t) for t in PARTS]
    settings = catalog_settings(location)
    yield Tier(location, scoped, settings, open_catalog(settings), offloads)
    scoped.store.close()


def publish(tier: Tier, entries: tuple[int, int]) -> list[Row]:
    """Offload more entries of each partition; returns the new rows in position order."""
    new = [r for o, n in zip(tier.offloads, entries, strict=True) for r in o.publish(n, publish_step_ms=300_000)]
    return sorted(new, key=lambda r: r.position)


def pyiceberg_rows(table: Table) -> list[Row]:
    return sorted((row_tuple(d) for d in table.scan().to_arrow().to_pylist()), key=lambda r: r.position)


def polars_rows(table: Table) -> list[Row]:
    return sorted((row_tuple(d) for d in pl.scan_iceberg(table).collect().to_dicts()), key=lambda r: r.position)


def current_files(table: Table) -> list[str]:
    """The data files the current snapshot's manifests list (read by pyiceberg's manifest reader)."""
    snapshot = table.current_snapshot()
    assert snapshot is not None
    return sorted(e.data_file.file_path for m in snapshot.manifests(table.io) for e in m.fetch_manifest_entry(table.io))


def duckdb_rows(table: Table) -> list[Row]:
    files = [f.removeprefix("file://") for f in current_files(table)]
    relation = duckdb.connect().read_parquet(files)
    docs = [dict(zip(relation.columns, values, strict=True)) for values in relation.fetchall()]
    return sorted((row_tuple(d) for d in docs), key=lambda r: r.position)


def assert_exact(table: Table, expected: list[Row]) -> None:
    """Every reader sees every expected message exactly once, every column exact."""
    assert len({r.position for r in expected}) == len(expected)
    for read in (pyiceberg_rows, polars_rows, duckdb_rows):
        got = read(table)
        assert got == expected, read.__name__


def test_sync_publishes_every_message_once_with_its_columns(tier: Tier) -> None:
    expected = publish(tier, (50, 23))
    assert {r.batch_index for r in expected} >= {-1, 0, 3}  # batched and single messages
    assert any(r.key is None for r in expected) and any(r.properties for r in expected)
    report = sync_topic(tier.scoped, tier.catalog, TOPIC)
    table = tier.table()
    assert report.created and report.table == IDENT and report.rows == len(expected)
    assert_exact(table, expected)
    # One snapshot, whose summary names every segment of the store and each partition's last position.
    assert len(table.metadata.snapshots) == 1
    snapshot = table.current_snapshot()
    assert snapshot is not None
    assert segments_of(snapshot) == {t: tier.segment_ids(t) for t in PARTS}
    assert sum(len(ids) for ids in segments_of(snapshot).values()) >= 4  # several segments per partition
    store_ends = {t: mf.end_position(MetadataStore(tier.scoped).offloaded_segments(t)[-1]) for t in PARTS}
    assert table_position(table).positions == store_ends
    assert snapshot.summary is not None and snapshot.summary[STORE] == tier.scoped.describe()
    assert snapshot.summary["added-records"] == str(len(expected))
    # Partitioned by partition and day; Parquet with zstd; rows in position order within each file.
    days = {(r.partition, r.publish_ms // 86_400_000) for r in expected}
    assert len(days) == 4  # both partitions cross a day boundary
    files = current_files(table)
    dirs = {tuple(f.split("/")[-3:-1]) for f in files}
    assert {d[0] for d in dirs} == {"partition=0", "partition=1"}
    assert {d[1] for d in dirs} == {"__publishTime_day=2023-11-14", "__publishTime_day=2023-11-15"}
    for path in files:
        parquet = pq.ParquetFile(path.removeprefix("file://"))
        assert {parquet.metadata.row_group(0).column(c).compression for c in range(11)} == {"ZSTD"}
        keys = [(r["ledger_id"], r["entry_id"], r["batch_index"]) for r in parquet.read().to_pylist()]
        assert keys == sorted(keys)


def test_a_second_sync_appends_exactly_the_new_segments_and_a_replay_nothing(tier: Tier) -> None:
    first = publish(tier, (20, 12))
    sync_topic(tier.scoped, tier.catalog, TOPIC)
    before = {t: tier.segment_ids(t) for t in PARTS}
    parent = tier.table().current_snapshot()
    assert parent is not None
    second = publish(tier, (17, 0))  # only partition 0 has more
    report = sync_topic(tier.scoped, tier.catalog, TOPIC)
    table = tier.table()
    assert_exact(table, sorted(first + second, key=lambda r: r.position))
    assert len(report.commits) == 1 and report.rows == len(second)
    snapshot = table.current_snapshot()
    assert snapshot is not None and snapshot.parent_snapshot_id == parent.snapshot_id
    new_ids = [s for s in tier.segment_ids(PARTS[0]) if s not in before[PARTS[0]]]
    assert new_ids and segments_of(snapshot) == {PARTS[0]: new_ids}
    assert snapshot.summary is not None and snapshot.summary["added-records"] == str(len(second))
    # The summary still holds partition 1's position, which this commit did not move.
    assert table_position(table).of(PARTS[1]) == (3, 11)
    # A replay with nothing new: no snapshot.
    replay = sync_topic(tier.scoped, tier.catalog, TOPIC)
    assert replay.commits == [] and replay.position.snapshot_id == snapshot.snapshot_id
    assert len(tier.table().metadata.snapshots) == 2


def test_commits_of_n_segments_each(tier: Tier) -> None:
    expected = publish(tier, (40, 25))
    segments = sum(len(tier.segment_ids(t)) for t in PARTS)
    report = sync_topic(tier.scoped, tier.catalog, TOPIC, SyncOptions(segments_per_commit=2))
    assert [sum(len(v) for v in c.segments.values()) for c in report.commits] == [2] * (segments // 2) + [1] * (
        segments % 2
    )
    table = tier.table()
    assert len(table.metadata.snapshots) == len(report.commits)
    assert_exact(table, expected)


class Crash(Exception):
    """A process killed between writing its data files and committing them."""


def test_a_crash_between_the_parquet_write_and_the_commit_converges(tier: Tier) -> None:
    first = publish(tier, (15, 9))
    sync_topic(tier.scoped, tier.catalog, TOPIC)
    second = publish(tier, (22, 14))
    written: list[str] = []

    def crash(_table: Table, files: list[DataFile]) -> None:
        written.extend(f.file_path for f in files)
        raise Crash

    with pytest.raises(Crash):
        sync_topic(tier.scoped, tier.catalog, TOPIC, hooks=SyncHooks(written=crash))
    table = tier.table()
    assert len(table.metadata.snapshots) == 1  # nothing committed
    assert_exact(table, first)
    assert written and orphan_files(table, grace_s=0) == sorted(written)  # the attempt's files, listed
    assert orphan_files(table, grace_s=3600) == []  # too young to be anyone's leftovers yet
    # The next sync writes the same segments again, from the same snapshot: under the same names.
    report = sync_topic(tier.scoped, tier.catalog, TOPIC)
    table = tier.table()
    assert_exact(table, sorted(first + second, key=lambda r: r.position))
    assert sorted(f for c in report.commits for f in c.files) == sorted(written)
    assert orphan_files(table, grace_s=0) == []


def test_two_writers_racing_never_append_twice(tier: Tier) -> None:
    """The first writer's commit lands between the second's read of the table and its commit: the second's commit
    fails, it re-reads the table and appends only what is still missing."""
    first = publish(tier, (10, 10))
    sync_topic(tier.scoped, tier.catalog, TOPIC)
    second = publish(tier, (30, 18))
    raced: list[int] = []
    loser_files: list[str] = []

    def race(_table: Table, files: list[DataFile]) -> None:
        if raced:
            return
        loser_files.extend(f.file_path for f in files)
        winner = sync_topic(tier.scoped, tier.other_catalog(), TOPIC, SyncOptions(segments_per_commit=1, writer="a"))
        raced.append(len(winner.commits))

    report = sync_topic(tier.scoped, tier.catalog, TOPIC, SyncOptions(writer="b"), SyncHooks(written=race))
    assert raced and raced[0] >= 2
    assert report.conflicts == 1 and report.commits == []  # the winner had appended everything
    table = tier.table()
    assert_exact(table, sorted(first + second, key=lambda r: r.position))
    assert orphan_files(table, grace_s=0) == sorted(loser_files)


def test_a_writer_that_lost_part_of_the_race_appends_the_rest(tier: Tier) -> None:
    """The other writer committed only some segments (it stopped part way): the loser appends the others."""
    expected = publish(tier, (30, 18))
    raced: list[bool] = []

    class Stop(Exception):
        pass

    def race(_table: Table, _files: list[DataFile]) -> None:
        if raced:
            return
        raced.append(True)

        def stop_after_first(_t: Table, _f: list[DataFile], calls: list[int] = []) -> None:  # noqa: B006
            calls.append(1)
            if len(calls) > 1:
                raise Stop

        with pytest.raises(Stop):
            sync_topic(
                tier.scoped,
                tier.other_catalog(),
                TOPIC,
                SyncOptions(segments_per_commit=2, writer="a"),
                SyncHooks(written=stop_after_first),
            )

    report = sync_topic(tier.scoped, tier.catalog, TOPIC, SyncOptions(writer="b"), SyncHooks(written=race))
    assert report.conflicts == 1 and len(report.commits) == 1
    table = tier.table()
    assert len(table.metadata.snapshots) == 2  # the winner's one commit, then the rest
    assert_exact(table, expected)


def test_pyiceberg_commit_retries_are_turned_off(tier: Tier) -> None:
    """pyiceberg retries a failed commit on the new snapshot with the same files: that would append the winner's
    segments twice. A table whose retries were turned on again gets them turned off before a sync commits."""
    publish(tier, (5, 5))
    sync_topic(tier.scoped, tier.catalog, TOPIC)
    with tier.table().transaction() as tx:
        tx.set_properties({"commit.retry.num-retries": "4"})
    publish(tier, (5, 5))
    sync_topic(tier.scoped, tier.catalog, TOPIC)
    assert tier.table().properties["commit.retry.num-retries"] == "0"


def test_old_metadata_files_are_deleted_after_each_commit(tier: Tier) -> None:
    """A table keeps its current ``metadata.json`` and the previous ``METADATA_VERSIONS_KEPT``: one committed every
    10 s would otherwise pile up 8,640 a day. A table made without the setting gets it at its next sync."""
    for _ in range(METADATA_VERSIONS_KEPT + 4):
        publish(tier, (1, 1))
        sync_topic(tier.scoped, tier.catalog, TOPIC)
    table = tier.table()
    assert table.properties["write.metadata.delete-after-commit.enabled"] == "true"
    files = sorted((Path(table.location().removeprefix("file://")) / "metadata").glob("*.metadata.json"))
    assert len(files) == METADATA_VERSIONS_KEPT + 1
    assert len(table.metadata.metadata_log) == METADATA_VERSIONS_KEPT
    with table.transaction() as tx:
        tx.remove_properties("write.metadata.delete-after-commit.enabled", "write.metadata.previous-versions-max")
    publish(tier, (1, 1))
    sync_topic(tier.scoped, tier.catalog, TOPIC)
    properties = tier.table().properties
    assert properties["write.metadata.delete-after-commit.enabled"] == "true"
    assert properties["write.metadata.previous-versions-max"] == str(METADATA_VERSIONS_KEPT)
    assert_exact(tier.table(), tier.rows)


def test_rebuild_derives_the_table_again(tier: Tier) -> None:
    expected = publish(tier, (12, 7))
    sync_topic(tier.scoped, tier.catalog, TOPIC)
    old = tier.table()
    old_files = referenced_files(old)
    report = rebuild_topic(tier.scoped, tier.catalog, PARTS[1])  # a partition names its topic's table
    table = tier.table()
    assert report.created and table.metadata.table_uuid != old.metadata.table_uuid
    assert len(table.metadata.snapshots) == 1
    assert_exact(table, expected)
    assert not any(Path(f.removeprefix("file://")).exists() for f in old_files)  # purged


def test_a_table_of_another_store_or_not_ours_is_refused(tier: Tier, tmp_path: Path) -> None:
    publish(tier, (5, 5))
    sync_topic(tier.scoped, tier.catalog, TOPIC)
    other = parse_store_url(str(tmp_path / "other")).open()
    TopicOffload(other, PARTS[0]).publish(3)
    with pytest.raises(TableSyncError, match=r"was derived from the store .*store, not .*other"):
        sync_topic(other, tier.catalog, TOPIC)
    tier.catalog.create_table("public.default.audit", schema=tier.table().schema())
    TopicOffload(tier.scoped, "persistent://public/default/audit").publish(3)
    with pytest.raises(TableSyncError, match="not the table of persistent://public/default/audit"):
        sync_topic(tier.scoped, tier.catalog, "audit")
    with pytest.raises(TableSyncError, match="it is left as it is"):
        rebuild_topic(tier.scoped, tier.catalog, "audit")
    assert tier.catalog.table_exists("public.default.audit")


def test_status_counts_what_the_table_lacks(tier: Tier) -> None:
    synced = publish(tier, (20, 6))
    missing = tier_status(tier)
    assert missing["exists"] is False and missing["entries_behind"] == 26
    sync_topic(tier.scoped, tier.catalog, TOPIC)
    segments_before = len(tier.segment_ids(PARTS[0]))
    publish(tier, (13, 0))
    status = tier_status(tier)
    lag = {p["topic"]: p for p in status["partitions"]}
    assert lag[PARTS[0]]["segments_behind"] == len(tier.segment_ids(PARTS[0])) - segments_before
    assert lag[PARTS[0]]["entries_behind"] == 13 and lag[PARTS[1]]["entries_behind"] == 0
    assert lag[PARTS[0]]["table_position"] == [3, 19] and lag[PARTS[0]]["store_position"] == [3, 32]
    assert status["exists"] and status["rows"] == len(synced) and status["segments_behind"] > 0


def tier_status(tier: Tier) -> dict[str, Any]:
    return table_status(tier.scoped, tier.catalog, TOPIC).as_dict()


def test_a_rewrite_by_another_engine_keeps_the_position(tier: Tier) -> None:
    """A snapshot committed by someone else has no positions in its summary: its ancestor's hold."""
    expected = publish(tier, (5, 5))
    sync_topic(tier.scoped, tier.catalog, TOPIC)
    table = tier.table()
    with table.transaction() as tx:
        tx.overwrite(table.scan().to_arrow())  # a compaction, say: the same rows in new files
    snapshot = tier.table().current_snapshot()
    assert snapshot is not None and snapshot.summary is not None and snapshot.summary[POSITIONS] is None
    assert sync_topic(tier.scoped, tier.catalog, TOPIC).commits == []
    assert_exact(tier.table(), expected)


def test_a_table_with_rows_and_no_positions_is_refused(tier: Tier) -> None:
    """Rows, and no snapshot saying which messages they are: syncing would append them all again."""
    publish(tier, (5, 5))
    sync_topic(tier.scoped, tier.catalog, TOPIC)
    old = tier.table()
    rows = old.scan().to_arrow()
    tier.catalog.drop_table(IDENT)
    bare = tier.catalog.create_table(IDENT, schema=old.schema(), properties=dict(old.properties))
    bare.append(rows)
    with pytest.raises(TablePositionError, match=f"table {IDENT} holds {rows.num_rows} rows but none of its snapshots"):
        sync_topic(tier.scoped, tier.catalog, TOPIC)
