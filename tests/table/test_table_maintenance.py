"""``streamoffload.table.maintenance`` on a real filesystem store and SQLite catalog (``test_table_sync``'s tier and
readers): compaction, snapshot expiry, retention and orphan removal, alone and racing a sync, and the CLI."""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from pyiceberg.manifest import DataFile
from pyiceberg.table import Table

from streamoffload.checkpoints import manifest as mf
from streamoffload.checkpoints.metadata_store import MetadataStore
from streamoffload.cli import main
from streamoffload.codecs.proto.offload_manifest_pb2 import SegmentManifest
from streamoffload.table.maintenance import (
    MaintenanceOptions,
    compact_table,
    drop_deleted_segments,
    expire_snapshots,
    maintain_table,
    remove_orphan_files,
)
from streamoffload.table.position import POSITIONS, segments_of, table_position
from streamoffload.table.status import orphan_files, referenced_files, referenced_metadata_files
from streamoffload.table.sync import SyncHooks, SyncOptions, sync_topic
from tests.table.offload import Row
from tests.table.test_table_sync import PARTS, TOPIC, Tier, assert_exact, current_files, publish
from tests.table.test_table_sync import tier as tier  # the fixture

DAY_DIRS = ("__publishTime_day=2023-11-14", "__publishTime_day=2023-11-15")
ALL_PARTITIONS = [f"partition={p}/{d}" for p in (0, 1) for d in DAY_DIRS]
FIRST_DAY = [f"partition={p}/{DAY_DIRS[0]}" for p in (0, 1)]


def files_per_partition(table: Table) -> dict[str, int]:
    """The current snapshot's data files per table partition directory (``partition=0/__publishTime_day=...``)."""
    return dict(Counter("/".join(f.split("/")[-3:-1]) for f in current_files(table)))


def small_syncs(tier: Tier, rounds: int) -> None:
    """``rounds`` syncs of two new entries per partition each: at least one data file per partition and sync."""
    for _ in range(rounds):
        publish(tier, (2, 2))
        sync_topic(tier.scoped, tier.catalog, TOPIC)


def assert_files_in_position_order(table: Table) -> None:
    for path in current_files(table):
        keys = [(r["ledger_id"], r["entry_id"], r["batch_index"]) for r in pq.read_table(path[7:]).to_pylist()]
        assert keys == sorted(keys), path


def test_compaction_bounds_the_files_and_keeps_every_row_and_the_position(tier: Tier) -> None:
    small_syncs(tier, 30)
    table = tier.table()
    before = files_per_partition(table)
    # 60 entries 5 min apart from 22:13:20: 22 on the first day (11 syncs), 38 on the next (19 syncs).
    assert before == {f"partition={p}/{DAY_DIRS[0]}": 11 for p in (0, 1)} | {
        f"partition={p}/{DAY_DIRS[1]}": 19 for p in (0, 1)
    }
    position = table_position(table)
    old_files = current_files(table)
    report = compact_table(table, MaintenanceOptions(min_files=4))
    table = tier.table()
    assert files_per_partition(table) == dict.fromkeys(ALL_PARTITIONS, 1)
    assert sorted((p.partition, p.files_before, p.files_after) for p in report.partitions) == sorted(
        (name, before[name], 1) for name in ALL_PARTITIONS
    )
    assert report.rewrite.removed_files == old_files and report.rewrite.added_files == current_files(table)
    assert report.rewrite.rewritten_rows == len(tier.rows) and report.rewrite.conflicts == 0
    assert_exact(table, tier.rows)
    assert_files_in_position_order(table)
    for path in current_files(table):  # written as the sync writes: no dictionary for a message's own bytes
        group = pq.ParquetFile(path[7:]).metadata.row_group(0)
        pages = {group.column(i).path_in_schema: group.column(i).has_dictionary_page for i in range(group.num_columns)}
        assert not pages["value"] and not pages["__messageId"] and pages["__topic"], path
    # One overwrite snapshot on the last sync's, carrying its positions and appending no segment.
    snapshot = table.current_snapshot()
    assert snapshot is not None and snapshot.summary is not None
    assert snapshot.snapshot_id == report.rewrite.snapshot_id and snapshot.parent_snapshot_id == position.snapshot_id
    assert snapshot.summary.operation.value == "overwrite" and segments_of(snapshot) == {}
    assert snapshot.summary["added-records"] == snapshot.summary["deleted-records"] == str(len(tier.rows))
    assert table_position(table).positions == position.positions
    # Nothing more to do: no snapshot.
    assert compact_table(table, MaintenanceOptions(min_files=4)).rewrite.snapshot_id is None
    # A sync after it appends exactly the new rows.
    new = publish(tier, (3, 0))
    again = sync_topic(tier.scoped, tier.catalog, TOPIC)
    assert again.rows == len(new) and again.conflicts == 0
    assert_exact(tier.table(), tier.rows)


def test_compaction_packs_up_to_the_target_size_and_leaves_few_files_alone(tier: Tier) -> None:
    small_syncs(tier, 11)  # the first day only: 11 files per partition
    table = tier.table()
    sizes = sorted(f.file_size_in_bytes for f in _data_files(table))
    assert compact_table(table, MaintenanceOptions(min_files=11)).rewrite.snapshot_id is None  # not more than 11
    target = sizes[-1] * 4  # about four of them per new file
    report = compact_table(table, MaintenanceOptions(target_file_bytes=target, min_files=2))
    table = tier.table()
    counts = files_per_partition(table)
    assert set(counts) == {f"partition={p}/{DAY_DIRS[0]}" for p in (0, 1)}
    assert all(3 <= n <= 6 for n in counts.values()), counts  # 11 files of at most target/4 each, packed in order
    assert all(f.file_size_in_bytes < target for f in _data_files(table))
    assert report.rewrite.rewritten_rows == len(tier.rows)
    assert_exact(table, tier.rows)
    assert_files_in_position_order(table)


def _data_files(table: Table) -> list[DataFile]:
    return [task.file for task in table.scan().plan_files()]


def test_a_compaction_that_loses_its_commit_to_a_sync_plans_again(tier: Tier) -> None:
    small_syncs(tier, 8)
    new: list[Row] = []

    def sync_in_between(_table: Table, _files: list[DataFile]) -> None:
        if not new:
            new.extend(publish(tier, (3, 2)))
            sync_topic(tier.scoped, tier.other_catalog(), TOPIC)

    with tier.table().transaction() as tx:  # on again: a retry would carry the stale positions over the sync's
        tx.set_properties({"commit.retry.num-retries": "4"})
    report = compact_table(tier.table(), MaintenanceOptions(min_files=2), SyncHooks(written=sync_in_between))
    table = tier.table()
    assert table.properties["commit.retry.num-retries"] == "0"
    assert report.rewrite.conflicts == 1 and report.rewrite.rewritten_rows == len(tier.rows)
    assert_exact(table, tier.rows)
    assert files_per_partition(table) == dict.fromkeys(FIRST_DAY, 1)  # 8 syncs: all on the first day
    store_ends = {t: mf.end_position(MetadataStore(tier.scoped).offloaded_segments(t)[-1]) for t in PARTS}
    assert table_position(table).positions == store_ends  # the sync's positions, carried on
    assert orphan_files(table, grace_s=0) != []  # the lost attempt's files


def test_a_sync_that_loses_its_commit_to_a_compaction_appends_once(tier: Tier) -> None:
    small_syncs(tier, 8)
    new = publish(tier, (4, 3))
    compacted: list[int | None] = []

    def compact_in_between(_table: Table, _files: list[DataFile]) -> None:
        if not compacted:
            other = tier.other_catalog().load_table("public.default.orders")
            compacted.append(compact_table(other, MaintenanceOptions(min_files=2)).rewrite.snapshot_id)

    report = sync_topic(tier.scoped, tier.catalog, TOPIC, hooks=SyncHooks(written=compact_in_between))
    assert compacted[0] is not None and report.conflicts == 1 and report.rows == len(new)
    table = tier.table()
    assert_exact(table, tier.rows)
    snapshot = table.current_snapshot()
    assert snapshot is not None and snapshot.parent_snapshot_id == compacted[0]


def test_a_compaction_killed_before_its_commit_writes_the_same_files_again(tier: Tier) -> None:
    small_syncs(tier, 4)
    written: list[str] = []

    class Crash(Exception):
        pass

    def crash(_table: Table, files: list[DataFile]) -> None:
        written.extend(f.file_path for f in files)
        raise Crash

    with pytest.raises(Crash):
        compact_table(tier.table(), MaintenanceOptions(min_files=2), SyncHooks(written=crash))
    assert len(tier.table().metadata.snapshots) == 4 and orphan_files(tier.table(), grace_s=0) == sorted(written)
    report = compact_table(tier.table(), MaintenanceOptions(min_files=2))
    assert report.rewrite.added_files == sorted(written)  # the same names: a crash loop leaves no more orphans
    assert orphan_files(tier.table(), grace_s=0) == []
    assert_exact(tier.table(), tier.rows)


def test_expiry_keeps_the_newest_snapshots_and_then_orphans_go(tier: Tier) -> None:
    small_syncs(tier, 6)
    table = tier.table()
    compact_table(table, MaintenanceOptions(min_files=2))
    table = tier.table()
    before_expiry = sorted(table.metadata.snapshots, key=lambda s: s.sequence_number or 0)
    ids = [s.snapshot_id for s in before_expiry]
    assert len(ids) == 7
    # Younger than the age: all kept.
    young = expire_snapshots(table, MaintenanceOptions(keep_snapshots=1, expire_older_than_s=3600))
    assert young.expired == [] and len(tier.table().metadata.snapshots) == 7
    later = time.time() + 7200
    three = expire_snapshots(table, MaintenanceOptions(keep_snapshots=3, expire_older_than_s=3600), now=later)
    assert sorted(three.expired) == sorted(ids[:4]) and three.kept == ids[4:]
    table = tier.table()
    assert [s.snapshot_id for s in table.metadata.snapshots] == ids[4:]
    # The sync files compaction replaced are still named by the kept syncs' snapshots: none is an orphan.
    assert orphan_files(table, grace_s=0) == []
    one = expire_snapshots(table, MaintenanceOptions(keep_snapshots=1, expire_older_than_s=0), now=later)
    assert one.kept == ids[-1:]
    table = tier.table()
    replaced = orphan_files(table, grace_s=0)
    assert replaced and not set(replaced) & referenced_files(table)
    removed = remove_orphan_files(table, grace_s=0)
    assert removed.removed == replaced and not any(Path(f[7:]).exists() for f in replaced)
    # The expired snapshots' manifest lists went too; what the live one names stays.
    expired_lists = {s.manifest_list for s in before_expiry if s.snapshot_id != ids[-1]}
    assert expired_lists and expired_lists <= set(removed.removed_metadata)
    assert all(Path(f[7:]).exists() for f in referenced_metadata_files(tier.table()))
    assert_exact(tier.table(), tier.rows)
    assert table_position(tier.table()).snapshot_id == ids[-1]


def test_expiry_keeps_the_snapshot_that_records_the_position(tier: Tier) -> None:
    """Another engine's snapshot has no positions: the sync's one under it stays, or the table would be refused."""
    small_syncs(tier, 3)
    table = tier.table()
    with table.transaction() as tx:
        tx.overwrite(table.scan().to_arrow())
    table = tier.table()
    ids = [s.snapshot_id for s in table.metadata.snapshots]
    report = expire_snapshots(table, MaintenanceOptions(keep_snapshots=1, expire_older_than_s=0))
    assert sorted(report.expired) == sorted(ids[:2]) and report.kept == ids[2:]
    table = tier.table()
    assert table.metadata.snapshots[0].summary is not None and table.metadata.snapshots[0].summary[POSITIONS]
    assert table_position(table).positions and sync_topic(tier.scoped, tier.catalog, TOPIC).commits == []


def delete_ledger(tier: Tier, topic: str, ledger: int) -> list[SegmentManifest]:
    """``delete-ledger --now``: mark the ledger deleted and delete the segments it alone held."""
    meta = MetadataStore(tier.scoped)
    assert meta.mark_ledger_deleted(topic, ledger, "test")
    return meta.apply_deletions(topic, 0)


def in_segments(row: Row, segments: list[SegmentManifest]) -> bool:
    return any(
        s.topic == row.topic and mf.start_position(s) <= (row.ledger_id, row.entry_id) <= mf.end_position(s)
        for s in segments
    )


def test_retention_drops_exactly_the_deleted_segments_rows(tier: Tier) -> None:
    for _ in range(7):  # 49 entries of partition 0: ledger 3 (40 entries) and ledger 4; segments of 7 entries
        publish(tier, (7, 3))
        sync_topic(tier.scoped, tier.catalog, TOPIC)
    table = tier.table()
    compact_table(table, MaintenanceOptions(min_files=2))  # files that hold both ledgers: partly rewritten below
    assert drop_deleted_segments(tier.scoped, tier.table()).rewrite.snapshot_id is None  # nothing deleted yet
    position = table_position(tier.table())
    deleted = delete_ledger(tier, PARTS[0], 3)
    assert [mf.end_position(s) for s in deleted] == [(3, 6), (3, 13), (3, 20), (3, 27), (3, 34)]
    spanning = [r for r in tier.rows if r.topic == PARTS[0] and r.ledger_id == 3 and r.entry_id >= 35]
    assert spanning  # entries 35..39 of ledger 3 are in the segment (3,35)..(4,1), which the store still has
    expected = [r for r in tier.rows if not in_segments(r, deleted)]
    report = drop_deleted_segments(tier.scoped, tier.table())
    table = tier.table()
    assert report.removed_rows == {PARTS[0]: len(tier.rows) - len(expected)} and report.skipped == {}
    assert_exact(table, expected)
    assert set(spanning) <= set(expected)
    assert table_position(table).positions == position.positions
    snapshot = table.current_snapshot()
    assert snapshot is not None and snapshot.summary is not None
    assert snapshot.summary["deleted-records"] == str(report.rewrite.rewritten_rows + report.rewrite.removed_rows)
    assert not any("partition=1" in f for f in report.rewrite.removed_files)  # the other partition untouched
    # Again: nothing more to drop. A sync after it appends only what is new, and not the deleted rows again.
    assert drop_deleted_segments(tier.scoped, table).rewrite.snapshot_id is None
    new = publish(tier, (2, 2))
    assert sync_topic(tier.scoped, tier.catalog, TOPIC).rows == len(new)
    assert_exact(tier.table(), sorted(expected + new, key=lambda r: r.position))


def test_retention_racing_a_sync_when_every_segment_of_a_partition_is_gone(tier: Tier) -> None:
    """Partition 0 loses all its segments; a sync commits new ones (still of ledger 3) between retention's write and
    its commit: retention plans again and drops only the deleted segments' rows."""
    for _ in range(3):
        publish(tier, (4, 2))
        sync_topic(tier.scoped, tier.catalog, TOPIC)
    deleted = delete_ledger(tier, PARTS[0], 3)
    assert len(deleted) == 3 and MetadataStore(tier.scoped).offloaded_segments(PARTS[0]) == []
    gone = [r for r in tier.rows if in_segments(r, deleted)]
    new: list[Row] = []

    def sync_in_between(_table: Table, _files: list[DataFile]) -> None:
        if not new:
            new.extend(publish(tier, (3, 1)))
            sync_topic(tier.scoped, tier.other_catalog(), TOPIC)

    report = drop_deleted_segments(tier.scoped, tier.table(), hooks=SyncHooks(written=sync_in_between))
    assert report.rewrite.conflicts == 1 and report.removed_rows == {PARTS[0]: len(gone)}
    assert any(r.topic == PARTS[0] and r.ledger_id == 3 for r in new)  # ledger 3 marked, these segments kept
    table = tier.table()
    assert_exact(table, [r for r in tier.rows if r not in gone])
    store_ends = {t: mf.end_position(MetadataStore(tier.scoped).offloaded_segments(t)[-1]) for t in PARTS}
    assert table_position(table).positions == store_ends


def test_orphans_go_only_when_no_snapshot_names_them_and_they_are_old(tier: Tier) -> None:
    small_syncs(tier, 2)
    publish(tier, (3, 3))
    crashed: list[str] = []

    class Crash(Exception):
        pass

    def crash(_table: Table, files: list[DataFile]) -> None:
        crashed.extend(f.file_path for f in files)
        raise Crash

    with pytest.raises(Crash):
        sync_topic(tier.scoped, tier.catalog, TOPIC, hooks=SyncHooks(written=crash))
    table = tier.table()
    assert remove_orphan_files(table, grace_s=3600).removed == []  # young: maybe a running sync's
    assert all(Path(f[7:]).exists() for f in crashed)
    assert remove_orphan_files(table, grace_s=0).removed == sorted(crashed)
    assert not any(Path(f[7:]).exists() for f in crashed)
    # A sync writing while orphans are removed: its fresh files are younger than the grace and stay.
    fresh: list[str] = []

    def remove_meanwhile(table: Table, files: list[DataFile]) -> None:
        fresh.extend(f.file_path for f in files)
        assert remove_orphan_files(tier.other_catalog().load_table("public.default.orders"), grace_s=60).removed == []

    report = sync_topic(tier.scoped, tier.catalog, TOPIC, SyncOptions(writer="w"), SyncHooks(written=remove_meanwhile))
    assert sorted(f for c in report.commits for f in c.files) == sorted(fresh)
    # Files live snapshots name are never removed, however old.
    assert remove_orphan_files(tier.table(), grace_s=0, now=time.time() + 10 * 86_400).removed == []
    assert all(Path(f[7:]).exists() for f in referenced_files(tier.table()))
    assert_exact(tier.table(), tier.rows)


def test_maintain_runs_every_step(tier: Tier) -> None:
    small_syncs(tier, 5)
    options = MaintenanceOptions(min_files=2, keep_snapshots=1, expire_older_than_s=0, orphan_grace_s=0)
    report = maintain_table(tier.scoped, tier.catalog, PARTS[0], options)
    assert report.table == "public.default.orders" and report.exists
    assert report.retention is not None and report.retention.rewrite.snapshot_id is None
    assert report.compaction is not None and report.compaction.rewrite.snapshot_id is not None
    assert report.expiry is not None and report.expiry.kept == [report.compaction.rewrite.snapshot_id]
    assert report.orphans is not None and report.orphans.removed == report.compaction.rewrite.removed_files
    table = tier.table()
    assert files_per_partition(table) == dict.fromkeys(FIRST_DAY, 1)
    assert_exact(table, tier.rows)


def test_the_maintain_command(tier: Tier, capsys: pytest.CaptureFixture[str]) -> None:
    small_syncs(tier, 4)
    root = str(tier.location.path)
    args = ["table", "maintain", "--store", root, "--min-files", "2", "--keep-snapshots", "1"]
    args += ["--expire-older-than-minutes", "0", "--orphan-grace-minutes", "0"]
    assert main([*args, "orders", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)["tables"][0]
    assert doc["table"] == "public.default.orders"
    assert sorted((p["partition"], p["files_before"], p["files_after"]) for p in doc["compaction"]["partitions"]) == [
        (f"partition={p}/{DAY_DIRS[0]}", 4, 1) for p in (0, 1)
    ]
    assert len(doc["orphans"]["removed"]) == 8 and doc["expiry"]["kept"] == [doc["snapshot_id"]]
    assert len(doc["orphans"]["removed_metadata"]) >= 4  # the 4 syncs' manifest lists at least
    assert main([*args, "--only", "compact"]) == 0
    assert capsys.readouterr().out == (
        f"{TOPIC} -> public.default.orders: compaction: nothing to do (snapshot {doc['snapshot_id']})\n"
    )
    assert_exact(tier.table(), tier.rows)
    assert main([*args, "--min-files", "0"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("streamoffload table: error: ") and "--min-files 0" in err and err.count("\n") == 1
    with pytest.raises(SystemExit):
        main(["table", "maintain", "--help"])
    out = capsys.readouterr().out
    assert "--target-file-mb" in out and "--keep-snapshots" in out and "retention" in out
