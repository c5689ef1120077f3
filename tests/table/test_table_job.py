"""The job keeping Iceberg tables current (``streaming.job.tables``): the ``offloadTable`` policy key and the
``[table]`` section; the follower on a real filesystem store (written by the real segmenter and sink) and a real
SQLite catalog, with a test clock for its commit interval; and the job itself on pulsar-lite: the continuous job
keeps the table of a topic with ``offloadTable`` on exact (and makes none for a topic with it off), a run killed
between its Parquet files and its commit converges when started again, and a run whose writer lease was taken
over never commits."""

from __future__ import annotations

import logging
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import polars as pl
import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.manifest import DataFile
from pyiceberg.table import Table

from streamoffload.checkpoints.lease import WriterLease
from streamoffload.checkpoints.policy import OffloadPolicy
from streamoffload.cli import main
from streamoffload.config import Config, PolicySource, TableSettings, load_config, parse_config
from streamoffload.errors import ConfigError
from streamoffload.metrics.collector import JobMetrics
from streamoffload.storage.location import StoreLocation, parse_store_url
from streamoffload.streaming.job.offload_job import OffloadJob
from streamoffload.streaming.job.report import BatchReport
from streamoffload.streaming.job.tables import TableFigures, TableFollower
from streamoffload.streaming.sink.sink import SinkStats
from streamoffload.table.catalog import catalog_settings, open_catalog
from streamoffload.table.position import segments_of
from streamoffload.table.status import orphan_files, referenced_files
from streamoffload.table.sync import SyncHooks
from tests.fixtures.broker import unique_topic
from tests.fixtures.job import poll, write_job_config
from tests.fixtures.reports import seal_report
from tests.table.offload import Row, TopicOffload
from tests.table.test_table_e2e import Sent, as_sent, publish
from tests.table.test_table_sync import assert_exact, current_files

ON = "persistent://public/default/orders"
ON_PARTS = [f"{ON}-partition-{i}" for i in range(2)]
ON_TABLE = "public.default.orders"
OFF = "persistent://public/default/audit"
POLICY = {"topics": {ON: {"offloadTable": True}}}


# -- the policy key and the [table] section ------------------------------------------------------------------------


def test_offload_table_follows_the_policy_levels() -> None:
    config = parse_config(
        {
            "offload": {"offloadTable": True},
            "namespaces": {"public/quiet": {"offloadTable": False}},
            "topics": {"persistent://public/quiet/loud": {"offloadTable": True}},
        },
        "c.toml",
    )
    assert OffloadPolicy().offloadTable is False
    assert config.policy_for(ON).offloadTable is True  # [offload]
    assert config.policy_for("persistent://public/quiet/x").offloadTable is False  # the namespace's
    assert config.policy_for("persistent://public/quiet/loud-partition-3").offloadTable is True  # the topic's


def test_offload_table_must_be_a_boolean() -> None:
    with pytest.raises(ConfigError, match=r"^c\.toml: topics\.'orders'\.offloadTable must be bool, got str 'yes'$"):
        parse_config({"topics": {"orders": {"offloadTable": "yes"}}}, "c.toml")
    with pytest.raises(ConfigError, match=r"^c\.toml: offload\.offloadTable must be true or false, got 1$"):
        from streamoffload.checkpoints.policy import validated_policy

        validated_policy({"offloadTable": 1}, "c.toml", "offload")


def test_offload_table_is_reloaded_live(tmp_path: Path) -> None:
    path = tmp_path / "offload.toml"
    path.write_text(f'[topics."{ON}"]\noffloadTable = false\n')
    source = PolicySource(load_config(path), str(path), min_interval_s=0.0)
    assert source.policy_for(ON).offloadTable is False
    path.write_text(f'[topics."{ON}"]\noffloadTable = true\n# edited\n')
    assert source.policy_for(ON_PARTS[1]).offloadTable is True
    # A published policy version carries it, as every key (executors and later runs read those).
    from streamoffload.streaming.governance.policy_versions import PolicyVersions, policy_document

    versions = PolicyVersions([(5, policy_document(source.current()))])
    assert versions.policy_at(ON_PARTS[0], 10).offloadTable is True


def test_the_table_section(tmp_path: Path) -> None:
    assert Config().table == TableSettings(None, None, 64, "10s")
    assert TableSettings().commit_interval_s == 10.0
    path = tmp_path / "conf" / "offload.toml"
    path.parent.mkdir()
    path.write_text(
        '[table]\ncatalog = "tables/catalog.db"\nwarehouse = "s3://bucket/iceberg"\nsegments_per_commit = 8\n'
        'commit_interval = "1m30s"\n'
    )
    table = load_config(path).table
    assert table == TableSettings(str(path.parent / "tables/catalog.db"), "s3://bucket/iceberg", 8, "1m30s")
    assert table.commit_interval_s == 90.0
    for text, error in (
        ('commit_interval = "soon"', r"table\.commit_interval: expected a duration like 90s"),
        ('commit_interval = "0s"', r"table\.commit_interval must be positive and at most a day, got '0s'"),
        ("segments_per_commit = 0", r"table\.segments_per_commit must be between 1 and 1000000, got 0"),
        ("catalog = 3", r"table\.catalog must be a string, got int 3"),
        ("catalogue = 'x'", r"unknown key table\.catalogue \(did you mean 'catalog'\?\)"),
    ):
        with pytest.raises(ConfigError, match=rf"^c: {error}"):
            parse_config(tomllib.loads(f"[table]\n{text}\n"), "c")


def test_the_documented_configuration_shows_the_defaults() -> None:
    config = load_config(Path(__file__).resolve().parents[2] / "conf" / "streamoffload.toml")
    assert config.table == TableSettings()
    assert config.policy_for(ON).offloadTable is False


# -- the follower, on a real store and catalog, with a test clock --------------------------------------------------


@dataclass
class Clock:
    now: float = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Tier:
    location: StoreLocation
    offloads: list[TopicOffload]
    off: TopicOffload
    clock: Clock

    def catalog(self) -> Catalog:
        return open_catalog(catalog_settings(self.location))

    def table(self) -> Table:
        return self.catalog().load_table(ON_TABLE)

    def publish(self, entries: tuple[int, int]) -> list[Row]:
        new = [r for o, n in zip(self.offloads, entries, strict=True) for r in o.publish(n, publish_step_ms=300_000)]
        return sorted(new, key=lambda r: r.position)

    @property
    def rows(self) -> list[Row]:
        return sorted((r for o in self.offloads for r in o.rows), key=lambda r: r.position)

    def follower(
        self, settings: TableSettings | None = None, check_lease: Callable[[], None] = lambda: None
    ) -> TableFollower:
        return TableFollower(
            self.location,
            settings or TableSettings(commit_interval="10s"),
            parse_config(POLICY, "t").policy_for,
            epoch=7,
            check_lease=check_lease,
            clock=self.clock,
        )


@pytest.fixture
def tier(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Tier:
    monkeypatch.setenv("POLARS_ICEBERG_PLANNER", "pyiceberg")
    location = parse_store_url(str(tmp_path / "store"))
    scoped = location.open()
    return Tier(location, [TopicOffload(scoped, t) for t in ON_PARTS], TopicOffload(scoped, OFF), Clock())


def sealed(*topics: str) -> BatchReport:
    """A micro-batch's report that sealed a segment of each of ``topics`` (what the follower reads of it)."""
    return BatchReport(0, 0.1, SinkStats(sealed=[seal_report(t, "s") for t in topics]))


def test_the_follower_syncs_tables_with_offload_table_on_at_most_once_per_interval(tier: Tier) -> None:
    first = tier.publish((20, 12))
    tier.off.publish(10)
    follower = tier.follower()
    follower.on_batch(sealed(*ON_PARTS, OFF))
    assert follower.sync_due() is None  # nothing left to sync
    table = tier.table()
    assert_exact(table, first)
    assert not tier.catalog().table_exists(("public", "default", "audit"))  # offloadTable off: no table
    [figures] = follower.figures()
    assert (figures.topic, figures.table, figures.commits, figures.commit_failures) == (ON, ON_TABLE, 1, 0)
    assert (figures.rows_appended, figures.files_appended) == (len(first), len(current_files(table)))
    assert figures.bytes_appended == sum(Path(f.removeprefix("file://")).stat().st_size for f in current_files(table))
    assert (figures.segments_behind, figures.entries_behind, figures.last_error) == (0, 0, None)
    assert figures.last_commit_s is not None and abs(figures.last_commit_s - time.time()) < 60
    first_snapshot = table.current_snapshot()
    assert first_snapshot is not None

    # Seals 3 s and 5 s later wait for the interval's end (10 s after the sync) and go into one commit.
    second = tier.publish((6, 0))
    tier.clock.now += 3
    follower.on_batch(sealed(ON_PARTS[0]))
    assert follower.sync_due() == 7.0
    third = tier.publish((0, 4))
    tier.clock.now += 2
    follower.on_batch(sealed(ON_PARTS[1]))
    assert follower.sync_due() == 5.0
    assert len(tier.table().metadata.snapshots) == 1
    tier.clock.now += 5
    assert follower.sync_due() is None
    table = tier.table()
    assert_exact(table, tier.rows)
    snapshot = table.current_snapshot()
    assert snapshot is not None and snapshot.parent_snapshot_id == first_snapshot.snapshot_id
    assert len(table.metadata.snapshots) == 2
    added = segments_of(snapshot)
    assert set(added) == set(ON_PARTS) and snapshot.summary is not None
    assert snapshot.summary["added-records"] == str(len(second) + len(third))
    [figures] = follower.figures()
    assert (figures.commits, figures.rows_appended) == (2, len(tier.rows))

    # The metrics export each table's figures.
    metrics = JobMetrics(read_cache=False)
    metrics.table_figures = follower.figures
    samples = {(s.name, s.labels.get("table")): s.value for f in metrics.registry.collect() for s in f.samples}
    assert samples[("streamoffload_table_commits_total", ON_TABLE)] == 2
    assert samples[("streamoffload_table_rows_appended_total", ON_TABLE)] == len(tier.rows)
    assert samples[("streamoffload_table_data_files_appended_total", ON_TABLE)] == figures.files_appended
    assert samples[("streamoffload_table_bytes_appended_total", ON_TABLE)] == figures.bytes_appended
    assert samples[("streamoffload_table_commit_failures_total", ON_TABLE)] == 0
    assert samples[("streamoffload_table_lag_segments", ON_TABLE)] == 0
    assert samples[("streamoffload_table_lag_entries", ON_TABLE)] == 0
    assert samples[("streamoffload_table_last_commit_timestamp_seconds", ON_TABLE)] == figures.last_commit_s


def test_a_failing_sync_is_logged_in_one_line_counted_and_retried_next_interval(
    tier: Tier, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    rows = tier.publish((9, 5))
    blocker = tmp_path / "tables"
    blocker.write_text("a file where the catalog's directory should be")
    settings = TableSettings(str(blocker / "catalog.db"), str(tmp_path / "warehouse"), commit_interval="30s")
    follower = tier.follower(settings)
    follower.on_batch(sealed(ON_PARTS[0]))
    with caplog.at_level(logging.WARNING, logger="streamoffload.streaming.job.tables"):
        assert follower.sync_due() == 30.0  # tried again one interval later
    [record] = caplog.records
    message = record.getMessage()
    assert "\n" not in message and message.startswith(f"table {ON_TABLE}: sync failed (TableConfigError: catalog ")
    assert message.endswith("cannot create its directory: File exists); trying again in 30 s")
    [figures] = follower.figures()
    assert (figures.commits, figures.commit_failures) == (0, 1)
    assert figures.last_error is not None and figures.last_error.startswith("TableConfigError: catalog ")
    blocker.unlink()
    tier.clock.now += 29
    assert follower.sync_due() == 1.0  # not due yet
    tier.clock.now += 1
    assert follower.sync_due() is None
    catalog = open_catalog(catalog_settings(tier.location, settings.catalog, settings.warehouse))
    assert_exact(catalog.load_table(ON_TABLE), rows)
    [figures] = follower.figures()
    assert (figures.commits, figures.commit_failures, figures.last_error) == (1, 1, None)


def test_a_follower_whose_lease_was_taken_over_never_commits(tier: Tier) -> None:
    tier.publish((7, 3))
    scoped = tier.location.open()
    ours = WriterLease(scoped, "job-a")
    ours.acquire()
    WriterLease(scoped, "job-b").acquire(force=True)  # another instance takes the prefix over
    follower = tier.follower(check_lease=ours.check)
    follower.on_batch(sealed(*ON_PARTS))
    assert follower.sync_due() is None
    table = tier.table()  # created (no rows: creating commits nothing), never committed to
    assert table.current_snapshot() is None and table.metadata.snapshots == []
    [figures] = follower.figures()
    assert (figures.commits, figures.commit_failures) == (0, 1)
    assert figures.last_error is not None and figures.last_error.startswith(
        "FencedError: this job's writer lease (epoch 1) was taken over by instance job-b"
    )
    # It stays out: later seals are not synced by it.
    tier.publish((2, 0))
    follower.on_batch(sealed(ON_PARTS[0]))
    tier.clock.now += 60
    follower.sync_due()
    assert tier.table().metadata.snapshots == []
    # The attempt's Parquet files are orphans, never read.
    assert orphan_files(tier.table(), grace_s=0) != []


# -- the job on pulsar-lite ----------------------------------------------------------------------------------------


def job_config(tmp_path: Path, service_url: str, on: str, off: str, *, interval: str = "1s") -> Path:
    path = write_job_config(tmp_path, service_url, topics=[on, off], block_bytes=8192, segment_mb=0.01)
    with path.open("a") as f:
        f.write(f'\n[topics."{on}"]\noffloadTable = true\n\n[table]\ncommit_interval = "{interval}"\n')
    return path


def table_name(topic: str) -> str:
    return f"public.default.{topic.rsplit('/', 1)[1]}"


def read_sent(table: Table) -> dict[str, list[Sent]]:
    """The table's rows as three readers that share no code see them: pyiceberg's scan, polars and DuckDB (over
    the Parquet files the current snapshot lists)."""
    files = [f.removeprefix("file://") for f in current_files(table)]
    relation = duckdb.connect().read_parquet(files)
    return {
        "pyiceberg": sorted(as_sent(d) for d in table.scan().to_arrow().to_pylist()),
        "polars": sorted(as_sent(d) for d in pl.scan_iceberg(table).collect().to_dicts()),
        "duckdb": sorted(as_sent(dict(zip(relation.columns, v, strict=True))) for v in relation.fetchall()),
    }


def assert_table_holds(table: Table, sent: list[Sent]) -> None:
    want = sorted(sent)
    assert len({s[:4] for s in want}) == len(want)
    for reader, got in read_sent(table).items():
        assert got == want, reader


@pytest.mark.spark
@pytest.mark.broker
@pytest.mark.slow
def test_the_running_job_keeps_the_table_of_a_topic_with_offload_table_on_exact(
    pulsar_broker: Any,
    running_job: Callable[[Path], OffloadJob],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("POLARS_ICEBERG_PLANNER", "pyiceberg")
    on, off = unique_topic("tjob-on"), unique_topic("tjob-off")
    sent = publish(pulsar_broker.service_url, on, 90, batched=True)
    other = publish(pulsar_broker.service_url, off, 40, batched=False)
    ends = {topic: tuple(max(s[1:3] for s in msgs)) for topic, msgs in ((on, sent), (off, other))}
    job = running_job(job_config(tmp_path, pulsar_broker.service_url, on, off))

    def read_to_the_end() -> bool:
        stats = dict(job.last_topic_stats)
        return all(t in stats and stats[t].last_position == end for t, end in ends.items())

    poll(read_to_the_end, 180, "the job read both topics to their last entry")
    from streamoffload.checkpoints.control_requests import submit_requests

    submit_requests(job.location.open(), [on, off])  # offload-now: seal the open segments
    catalog = open_catalog(catalog_settings(job.location))

    def table_complete() -> bool:
        figures = job.table_figures()
        return bool(figures) and figures[0].rows_appended == len(sent) and figures[0].segments_behind == 0

    poll(table_complete, 180, f"the table of {on} holds its {len(sent)} messages")
    assert_table_holds(catalog.load_table(table_name(on)), sent)
    assert not catalog.table_exists(tuple(table_name(off).split(".")))
    [figures] = job.table_figures()
    assert (figures.topic, figures.table, figures.commit_failures, figures.entries_behind) == (
        on,
        table_name(on),
        0,
        0,
    )
    assert figures.commits >= 1 and figures.files_appended == len(current_files(catalog.load_table(table_name(on))))
    assert job.tables is not None and job.tables.running

    # `streamoffload status` shows the table, caught up.
    assert main(["status", "--store", str(tmp_path / "store"), "--no-broker"]) == 0
    out = capsys.readouterr().out
    assert "Iceberg tables:" in out
    assert f"{table_name(on)} ({on}): snapshot " in out and f", {len(sent)} rows in " in out
    assert "caught up with the store" in out and table_name(off) not in out


class Killed(BaseException):
    """The job's process killed between a table's Parquet files and its commit (nothing of it runs on)."""


@pytest.mark.spark
@pytest.mark.broker
@pytest.mark.slow
def test_a_run_killed_between_parquet_and_commit_converges_when_started_again(
    spark: Any, pulsar_broker: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("POLARS_ICEBERG_PLANNER", "pyiceberg")
    on, off = unique_topic("tkill-on"), unique_topic("tkill-off")
    sent = publish(pulsar_broker.service_url, on, 70, batched=True)
    sent += publish(pulsar_broker.service_url, on, 25, batched=False)
    publish(pulsar_broker.service_url, off, 10, batched=False)
    path = job_config(tmp_path, pulsar_broker.service_url, on, off)
    written: list[str] = []

    def kill(_table: Table, files: list[DataFile]) -> None:
        written.extend(f.file_path for f in files)
        raise Killed

    killed = OffloadJob(load_config(path), str(path))
    killed.table_hooks = SyncHooks(written=kill)
    with pytest.raises(Killed):
        killed.run_once(spark)
    catalog = open_catalog(catalog_settings(killed.location))
    table = catalog.load_table(table_name(on))
    assert table.metadata.snapshots == [] and written
    assert orphan_files(table, grace_s=0) == sorted(written)

    again = OffloadJob(load_config(path), str(path))  # the restart (a new process: nothing carried)
    again.run_once(spark)
    table = catalog.load_table(table_name(on))
    assert_table_holds(table, sent)
    committed = referenced_files(table)
    assert committed and not committed & set(written)  # the new run's own names (its epoch), never the orphans'
    assert not catalog.table_exists(tuple(table_name(off).split(".")))


def test_a_run_whose_lease_was_taken_over_never_commits_and_its_successor_converges(tier: Tier, tmp_path: Path) -> None:
    """The job's own wiring (its lease, its follower), on a store the real segmenter and sink wrote; the runs sync as
    `run --once` does when nothing is new (no Spark, no broker)."""
    rows = tier.publish((18, 11))
    path = write_job_config(tmp_path, "pulsar://127.0.0.1:9", topics=ON_PARTS)
    with path.open("a") as f:
        f.write(f'\n[topics."{ON}"]\noffloadTable = true\n')
    successor = "tfence-successor"

    def take_over(_table: Table, _files: list[DataFile]) -> None:
        # Another instance takes the prefix over between this run's Parquet files and its commit.
        WriterLease(first.location.open(), successor).acquire(force=True)

    first = OffloadJob(load_config(path), str(path))
    first.table_hooks = SyncHooks(written=take_over)
    first.begin_run()
    try:
        first.sync_tables()  # refused: not committed
    finally:
        first.end_run()
    assert tier.table().metadata.snapshots == []
    [figures] = first.table_figures()
    assert (figures.commits, figures.commit_failures) == (0, 1)
    assert figures.last_error is not None and figures.last_error.startswith("FencedError: this job's writer lease")
    assert f"was taken over by instance {successor}" in figures.last_error

    second = OffloadJob(load_config(path), str(path), instance=successor)
    second.begin_run()
    try:
        second.sync_tables()
    finally:
        second.end_run()
    assert_exact(tier.table(), rows)
    assert [(f.commits, f.commit_failures, f.rows_appended) for f in second.table_figures()] == [(1, 0, len(rows))]


def test_table_figures_are_typed_for_the_metrics() -> None:
    # The exported families carry the `table` label only (no topic label: a table is a partitioned topic's).
    metrics = JobMetrics(read_cache=False)
    metrics.table_figures = lambda: [TableFigures(ON, ON_TABLE, commits=3, commit_failures=1, rows_appended=9)]
    families = {f.name: f for f in metrics.registry.collect() if f.name.startswith("streamoffload_table_")}
    assert {s.labels["table"] for f in families.values() for s in f.samples} == {ON_TABLE}
    # Gauges not known yet have no sample rather than a made-up 0.
    assert families["streamoffload_table_lag_segments"].samples == []
    assert families["streamoffload_table_last_commit_timestamp_seconds"].samples == []


# -- the job's table maintenance -----------------------------------------------------------------------------------


def test_the_table_sections_maintenance_keys() -> None:
    defaults = TableSettings()
    assert (defaults.maintain_every, defaults.compact_min_files, defaults.keep_snapshots) == ("10m", 5, 100)
    assert (defaults.maintain_every_s, defaults.compact_target_file_bytes) == (600.0, 128 * 1024 * 1024)
    table = parse_config(
        tomllib.loads(
            '[table]\nmaintain_every = "1h30m"\ncompact_min_files = 3\ncompact_target_file_size = "64MiB"\n'
            "keep_snapshots = 7\n"
        ),
        "c",
    ).table
    assert (table.maintain_every_s, table.compact_min_files, table.compact_target_file_bytes) == (5400.0, 3, 64 << 20)
    assert table.keep_snapshots == 7
    assert parse_config({"table": {"maintain_every": "0"}}, "c").table.maintain_every_s == 0.0
    assert (defaults.snapshot_max_age, defaults.snapshot_max_age_s) == ("10m", 600.0)
    assert parse_config({"table": {"snapshotMaxAge": "2h"}}, "c").table.snapshot_max_age_s == 7200.0
    assert parse_config({"table": {"snapshot_max_age": "0"}}, "c").table.snapshot_max_age_s == 0.0
    for text, error in (
        ('maintain_every = "often"', r"table\.maintain_every: expected a duration like 90s.* \(or \"0\": never\)$"),
        ('maintain_every = "8d"', r"table\.maintain_every must be at most 7 days, got '8d'$"),
        ("compact_min_files = 0", r"table\.compact_min_files must be at least 1, got 0$"),
        ('compact_target_file_size = "big"', r"table\.compact_target_file_size: expected a size like "),
        ('compact_target_file_size = "0"', r"table\.compact_target_file_size must be at least 1 byte, got '0'$"),
        ("keep_snapshots = 0", r"table\.keep_snapshots must be at least 1, got 0$"),
        ("maintain_every = 600", r"table\.maintain_every must be str, got int 600"),
        ('snapshot_max_age = "soon"', r"table\.snapshot_max_age: expected a duration like 90s.* \(or \"0\"\)$"),
        ('snapshot_max_age = "31d"', r"table\.snapshot_max_age must be at most 30 days, got '31d'$"),
    ):
        with pytest.raises(ConfigError, match=rf"^c: {error}"):
            parse_config(tomllib.loads(f"[table]\n{text}\n"), "c")


def files_per_partition(table: Table) -> dict[str, int]:
    """Data files of the current snapshot, by table partition path."""
    counts: dict[str, int] = {}
    for task in table.scan().plan_files():
        path = table.spec().partition_to_path(task.file.partition, table.schema())
        counts[path] = counts.get(path, 0) + 1
    return dict(sorted(counts.items()))


def test_the_follower_maintains_each_table_it_syncs_at_the_interval_after_a_sync(
    tier: Tier, caplog: pytest.LogCaptureFixture
) -> None:
    settings = TableSettings(commit_interval="10s", maintain_every="60s", compact_min_files=2)
    follower = tier.follower(settings)
    # Six syncs 10 s apart, each of a new segment of each partition: one more data file per partition each.
    for i in range(6):
        tier.publish((2, 1))
        follower.on_batch(sealed(*ON_PARTS))
        assert follower.sync_due() is None
        if i < 5:
            tier.clock.now += 10
    table = tier.table()
    before = files_per_partition(table)
    synced = set(current_files(table))
    assert set(before.values()) == {6}  # not maintained yet: 50 s since the run's start
    [figures] = follower.figures()
    assert (figures.maintenances, figures.files_compacted) == (0, 0)

    # The sync 60 s after the start is followed by a maintenance: each partition's 6 small files become 1.
    tier.clock.now += 10
    tier.publish((1, 1))
    follower.on_batch(sealed(*ON_PARTS))
    with caplog.at_level(logging.INFO, logger="streamoffload.streaming.job.tables"):
        assert follower.sync_due() is None
    table = tier.table()
    assert files_per_partition(table) == {path: 1 for path in before}
    assert_exact(table, tier.rows)
    [figures] = follower.figures()
    assert (figures.commits, figures.maintenances, figures.maintenance_failures) == (7, 1, 0)
    assert figures.files_compacted == 7 * len(before)
    assert figures.snapshots_expired == 0  # all younger than the 10 min expiry keeps (snapshot_max_age)
    snapshot = table.current_snapshot()
    assert snapshot is not None and snapshot.summary is not None and snapshot.summary.operation.value == "overwrite"
    assert not set(current_files(table)) & synced  # the small files were replaced
    [line] = [r.getMessage() for r in caplog.records if "maintained" in r.getMessage()]
    assert line.startswith(f"table {ON_TABLE}: maintained in ") and line.endswith(
        f"s: {7 * len(before)} data file(s) compacted, 0 snapshot(s) expired, 0 orphan file(s) removed, 0 row(s) "
        "of deleted segments removed"
    )
    # The maintenance counters are metrics.
    metrics = JobMetrics(read_cache=False)
    metrics.table_figures = follower.figures
    samples = {(s.name, s.labels.get("table")): s.value for f in metrics.registry.collect() for s in f.samples}
    assert samples[("streamoffload_table_maintenances_total", ON_TABLE)] == 1
    assert samples[("streamoffload_table_maintenance_failures_total", ON_TABLE)] == 0
    assert samples[("streamoffload_table_files_compacted_total", ON_TABLE)] == 7 * len(before)
    assert samples[("streamoffload_table_snapshots_expired_total", ON_TABLE)] == 0
    assert samples[("streamoffload_table_orphan_files_removed_total", ON_TABLE)] == 0
    assert samples[("streamoffload_table_retention_rows_removed_total", ON_TABLE)] == 0
    assert samples[("streamoffload_table_dead_letters_appended_total", ON_TABLE)] == 0

    # The next sync, 10 s later, is not followed by one: the next is due 60 s after this one.
    for _ in range(5):
        tier.clock.now += 10
        tier.publish((1, 0))
        follower.on_batch(sealed(ON_PARTS[0]))
        follower.sync_due()
    assert follower.figures()[0].maintenances == 1
    tier.clock.now += 10
    tier.publish((1, 0))
    follower.on_batch(sealed(ON_PARTS[0]))
    follower.sync_due()
    assert follower.figures()[0].maintenances == 2
    table = tier.table()
    assert max(files_per_partition(table).values()) == 1
    assert_exact(table, tier.rows)


def test_the_follower_expires_snapshots_older_than_snapshot_max_age(tier: Tier) -> None:
    """Beyond the newest ``keep_snapshots``, snapshots older than ``snapshot_max_age`` go at a maintenance: "0"
    expires every one not kept; the default (10 min) none of a run this young."""
    for max_age, expired in (("0", 2), ("10m", 0)):
        settings = TableSettings(
            commit_interval="10s",
            maintain_every="30s",
            compact_min_files=1000,
            keep_snapshots=2,
            snapshot_max_age=max_age,
        )
        follower = tier.follower(settings)
        before = len(tier.table().metadata.snapshots) if expired == 0 else 0
        for _ in range(4):  # 4 syncs 10 s apart; the 4th, 30 s after the start, is followed by a maintenance
            tier.publish((1, 1))
            follower.on_batch(sealed(*ON_PARTS))
            follower.sync_due()
            tier.clock.now += 10
        [figures] = follower.figures()
        assert (figures.maintenances, figures.maintenance_failures, figures.files_compacted) == (1, 0, 0)
        assert figures.snapshots_expired == expired
        metrics = JobMetrics(read_cache=False)
        metrics.table_figures = follower.figures
        samples = {(s.name, s.labels.get("table")): s.value for f in metrics.registry.collect() for s in f.samples}
        assert samples[("streamoffload_table_snapshots_expired_total", ON_TABLE)] == expired
        assert len(tier.table().metadata.snapshots) == (2 if expired else before + 4)
        assert_exact(tier.table(), tier.rows)


def test_maintenance_every_0_never_runs_and_a_failing_one_is_counted(
    tier: Tier, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    never = tier.follower(TableSettings(commit_interval="1s", maintain_every="0", compact_min_files=1))
    for _ in range(3):
        tier.publish((1, 1))
        never.on_batch(sealed(*ON_PARTS))
        never.sync_due()
        tier.clock.now += 3600
    assert never.figures()[0].maintenances == 0
    assert set(files_per_partition(tier.table()).values()) == {3}

    # A lease lost before a maintenance: nothing maintained, counted, and the follower stays out.
    scoped = tier.location.open()
    ours = WriterLease(scoped, "job-a")
    ours.acquire()
    calls = {"n": 0}

    def check() -> None:
        calls["n"] += 1
        if calls["n"] > 1:  # the sync's check passes; the maintenance's does not
            WriterLease(scoped, "job-b").acquire(force=True)
            ours.check()

    fenced = tier.follower(TableSettings(commit_interval="1s", maintain_every="1s", compact_min_files=1), check)
    tier.clock.now += 10
    tier.publish((1, 0))
    fenced.on_batch(sealed(ON_PARTS[0]))
    with caplog.at_level(logging.ERROR, logger="streamoffload.streaming.job.tables"):
        fenced.sync_due()
    [figures] = fenced.figures()
    assert (figures.commits, figures.maintenances, figures.maintenance_failures) == (1, 0, 1)
    assert figures.last_error is not None and figures.last_error.startswith("FencedError: this job's writer lease")
    assert [r.getMessage().split(":")[0] for r in caplog.records] == [f"table {ON_TABLE}"]
    table = tier.table()
    assert max(files_per_partition(table).values()) == 4  # not compacted
    assert_exact(table, tier.rows)
