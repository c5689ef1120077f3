"""``streamoffload table sync|rebuild|show|maintain``: the offloaded topics as Apache Iceberg tables (``table/``)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TextIO

from streamoffload.checkpoints.policy import MAX_RETENTION_MINUTES, OffloadPolicy
from streamoffload.cli_common import CommandError, add_store_args, config_from_args, float_arg, int_arg
from streamoffload.codecs.positions import Position

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog

    from streamoffload.config import PulsarSettings
    from streamoffload.storage.location import ScopedStore
    from streamoffload.table.maintenance import MaintenanceReport
    from streamoffload.table.status import TableStatus
    from streamoffload.table.sync import SyncReport

DESCRIPTION = """\
Publish the offloaded history as Apache Iceberg tables that any engine reads (Spark, Trino, DuckDB, polars,
pyiceberg): one table per topic, named tenant.namespace.topic (a partitioned topic's partitions in one table),
with pulsar-spark's columns (__key, value, __topic, __messageId, __publishTime, __eventTime,
__messageProperties) and each message's ledger_id, entry_id, batch_index and partition; partitioned by
partition and by day of __publishTime; Parquet with zstd.

The store stays the truth: `sync` appends what the store has committed past each table, exactly once (each
Iceberg snapshot records, per topic-partition, the last position it holds and the segments it appended; a
sync killed at any point, replayed, or racing another one converges to one copy of every message).
`rebuild` drops a table and derives it from the store again. `show` prints each table's position and how
far it is behind the store. `maintain` drops the rows of segments the store deleted (retention, delete-ledger),
compacts small data files, expires old snapshots and removes data files no snapshot names.

Typed values: a topic whose policy has offloadTableSchema (a JSON Schema or Avro record, inline or @FILE; or
"broker": its AVRO or JSON schema in the broker's schema registry, asked at each sync, each message decoded with
its own schema version) gets its value decoded into the struct column value_decoded; a value that does not decode
also goes to tenant.namespace.topic__dead_letters with the error.

The catalog, named "streamoffload", is pyiceberg's SQL catalog (over SQLAlchemy: SQLite, or PostgreSQL for
production) or its REST catalog (--catalog rest+https://host/path, with --catalog-property key=value for its
credential, token, scope, ...: Polaris, Glue, Unity, Nessie, Iceberg's REST server). By default, for a store on
a filesystem, a SQLite file under the store: <store>/_iceberg/catalog.db, its warehouse <store>/_iceberg/warehouse.
Passwords and secret properties are never shown."""

EPILOG = """\
examples:
  streamoffload table sync --store var/demo/store                      # every topic of the store
  streamoffload table sync --store var/demo/store demo-orders --json
  streamoffload table show --store var/demo/store
  streamoffload table show --store var/demo/store --orphans            # data files of failed attempts
  streamoffload table rebuild --store var/demo/store persistent://public/default/demo-orders
  streamoffload table maintain --store var/demo/store demo-orders      # retention, compaction, expiry, orphans
  streamoffload table maintain --store var/demo/store --only compact --target-file-mb 64 --min-files 8
  streamoffload table sync --store s3://bucket/pulsar --s3-endpoint http://127.0.0.1:9000 \\
      --catalog sqlite:////var/offload/catalog.db --warehouse s3://bucket/iceberg
  streamoffload table sync --store var/demo/store \
      --catalog postgresql+psycopg2://offload:PASSWORD@db.internal:5432/iceberg --warehouse s3://bucket/iceberg
  streamoffload table sync --store var/demo/store --catalog rest+https://polaris.internal/api/catalog \
      --warehouse streamoffload --catalog-property credential=CLIENT_ID:CLIENT_SECRET \
      --catalog-property scope=PRINCIPAL_ROLE:ALL

then, e.g. with polars:
  from pyiceberg.catalog.sql import SqlCatalog; import polars as pl
  catalog = SqlCatalog("streamoffload", uri="sqlite:///var/demo/store/_iceberg/catalog.db")
  pl.scan_iceberg(catalog.load_table("public.default.demo-orders")).group_by("__key").len().collect()
"""


class TableCommandError(CommandError):
    """The table command cannot run as asked (pyiceberg missing, ...)."""


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "table",
        help="publish the offloaded topics as Apache Iceberg tables (sync, rebuild, show, maintain)",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = parser.add_subparsers(dest="table_action", metavar="ACTION", required=True)
    for name, help_text, topics_help in (
        ("sync", "append what the store has committed past each table", "topics to sync (default: every topic)"),
        ("rebuild", "drop a topic's table and derive it from the store again", "the topic whose table to rebuild"),
        ("show", "each table's position and lag behind the store", "topics to show (default: every topic)"),
        (
            "maintain",
            "drop deleted segments' rows, compact small files, expire old snapshots, remove orphan files",
            "topics whose tables to maintain (default: every topic)",
        ),
    ):
        action = actions.add_parser(
            name,
            help=help_text,
            description=MAINTAIN_DESCRIPTION if name == "maintain" else f"{help_text[0].upper()}{help_text[1:]}.",
            epilog=EPILOG,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        add_store_args(action)
        group = action.add_argument_group("tables")
        group.add_argument(
            "--catalog",
            metavar="URI",
            help="the catalog: a SQLAlchemy URI (sqlite:////abs/catalog.db, postgresql+psycopg2://user:pw@host/db), "
            "a SQLite file (default, for a filesystem store: <store>/_iceberg/catalog.db), or a REST catalog "
            "rest+http(s)://host/path",
        )
        group.add_argument(
            "--catalog-property",
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help="a pyiceberg catalog property, repeatable: a REST catalog's credential, token, scope, "
            "oauth2-server-uri, header.NAME, s3.*, ... (secret values are never shown)",
        )
        group.add_argument(
            "--warehouse",
            metavar="URL",
            help="where new tables' files go: file:///dir, s3://bucket/prefix or a directory (default: 'warehouse' "
            "beside a SQLite catalog's file); a REST catalog's server gets it as its warehouse (default: its own)",
        )
        if name == "rebuild":
            action.add_argument("table_topics", metavar="TOPIC", nargs=1, help=topics_help)
        else:
            action.add_argument("table_topics", metavar="TOPIC", nargs="*", help=topics_help)
        if name in ("sync", "rebuild"):
            group.add_argument(
                "--segments-per-commit",
                type=int,
                default=None,
                metavar="N",
                help="segments appended per Iceberg commit (default 64; a crash repeats at most this many)",
            )
            group.add_argument(
                "--keys-file", metavar="FILE", help="key-encryption keys of a store encrypted at rest (JSON)"
            )
            group.add_argument(
                "--service-url",
                metavar="URL",
                help='the broker whose schema registry topics with offloadTableSchema = "broker" take their schema '
                "from (default: --conf's [pulsar] service_url, with its client options)",
            )
        if name == "show":
            group.add_argument(
                "--orphans", action="store_true", help="list data files no snapshot references (failed attempts)"
            )
            group.add_argument(
                "--orphan-grace-minutes",
                type=float,
                default=60.0,
                metavar="MIN",
                help="with --orphans, leave out files younger than this: a running sync's (default 60)",
            )
        if name == "maintain":
            _maintain_args(group)
        action.add_argument("--json", action="store_true", help="one JSON document instead of text")
        action.set_defaults(func=run)


MAINTAIN_DESCRIPTION = """\
Maintain each table, in this order (--only picks steps):

  retention  rows of segments the store no longer has (its retention or delete-ledger deleted them) leave the
             table: a data file wholly gone is dropped, one partly gone rewritten (copy-on-write), in one snapshot.
             Rows of segments the store still has always stay.
  compact    per table partition, once more than --min-files data files are smaller than --target-file-mb, they
             are rewritten into files of up to that size, sorted by position, in one snapshot.
  expire     snapshots older than --expire-older-than-minutes go, except the newest --keep-snapshots (readers can
             no longer time-travel to them).
  orphans    data files no remaining snapshot names (failed attempts; files compaction and retention replaced,
             once expiry dropped the snapshots naming them), and manifests none names, older than
             --orphan-grace-minutes, are deleted.

Each snapshot carries the table's position unchanged, so a sync goes on where it was. Running beside a sync is
safe: whichever commits second re-reads the table and plans again; no row is dropped or kept twice."""


MAINTAIN_STEPS = ("retention", "compact", "expire", "orphans")
"""``table.maintenance.STEPS``, here so that building the parser imports no pyiceberg (nor its defaults below)."""


def _maintain_args(group: argparse._ArgumentGroup) -> None:
    group.add_argument(
        "--only",
        action="append",
        choices=MAINTAIN_STEPS,
        metavar="STEP",
        help=f"run only this step (repeatable; one of {', '.join(MAINTAIN_STEPS)}; default: all, in that order)",
    )
    group.add_argument(
        "--target-file-mb",
        type=float,
        metavar="MB",
        help="compaction writes files of up to this size; smaller ones are compacted (default 128)",
    )
    group.add_argument(
        "--min-files",
        type=int,
        metavar="N",
        help="compact a partition once it has more than N small files (default 5)",
    )
    group.add_argument(
        "--keep-snapshots",
        type=int,
        metavar="K",
        help="expiry always keeps the newest K snapshots (default 100)",
    )
    group.add_argument(
        "--expire-older-than-minutes",
        type=float,
        metavar="MIN",
        help="expire snapshots older than this (default 60)",
    )
    group.add_argument(
        "--orphan-grace-minutes",
        type=float,
        metavar="MIN",
        help="leave orphan files younger than this: a running sync's (default 60)",
    )


def run(args: argparse.Namespace, *, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    try:
        from streamoffload.table.catalog import catalog_property, catalog_settings, open_catalog
    except ModuleNotFoundError as err:
        raise TableCommandError(
            f"`streamoffload table` needs pyiceberg ({err.name} is not installed): pip install 'streamoffload[table]'"
        ) from None
    if args.table_action in ("sync", "rebuild"):
        int_arg(args.segments_per_commit, "--segments-per-commit", 1, 1_000_000, "segments per commit")
    config, _ = config_from_args(args)
    location = config.store.location
    settings = catalog_settings(
        location,
        args.catalog,
        args.warehouse,
        s3_endpoint=args.s3_endpoint,
        s3_region=args.s3_region,
        properties=dict(catalog_property(p) for p in args.catalog_property),
    )
    scoped = location.open(create=False)  # a mistyped path is an error, not a new empty store
    catalog = open_catalog(settings)
    topics = _topics(scoped, args.table_topics)
    if args.table_action == "show":
        return _show(args, scoped, catalog, topics, out)
    if args.table_action == "maintain":
        return _maintain(args, scoped, catalog, topics, out)
    return _sync(args, scoped, catalog, topics, out, config.policy_for, config.pulsar)


def _topics(scoped: ScopedStore, named: list[str]) -> list[str]:
    """The topics (partitioned topics whole) named, or every topic of the store."""
    from streamoffload.checkpoints.metadata_store import MetadataStore
    from streamoffload.codecs.topics import TopicName

    if named:
        return list(dict.fromkeys(str(TopicName.parse(t).base) for t in named))
    found = sorted({str(t.base) for t in MetadataStore(scoped).topics()})
    if not found:
        raise TableCommandError(f"the store {scoped.describe()} has no offloaded topics")
    return found


def _sync(
    args: argparse.Namespace,
    scoped: ScopedStore,
    catalog: Catalog,
    topics: list[str],
    out: TextIO,
    policy_for: Callable[[str], OffloadPolicy],
    pulsar: PulsarSettings,
) -> int:
    from streamoffload.checkpoints.keyring import KeyRing
    from streamoffload.pulsar.schema_registry import BrokerSchemaRegistry
    from streamoffload.table.sync import DEFAULT_SEGMENTS_PER_COMMIT, SyncOptions, rebuild_topic, sync_topic

    registry = BrokerSchemaRegistry(pulsar.service_url, pulsar.client)  # asked only for "broker" topics
    options = SyncOptions(
        segments_per_commit=args.segments_per_commit or DEFAULT_SEGMENTS_PER_COMMIT,
        keyring=KeyRing.with_file(args.keys_file),
        schema_registry=registry,
    )
    step = rebuild_topic if args.table_action == "rebuild" else sync_topic
    reports = []
    with registry:
        for topic in topics:
            schema = policy_for(topic).offloadTableSchema  # the topic's value schema: typed columns, dead letters
            report = step(scoped, catalog, topic, dataclasses.replace(options, value_schema=schema))
            reports.append(report)
            if not args.json:
                print(_sync_line(report, args.table_action), file=out)
    if args.json:
        print(json.dumps({"tables": [_sync_doc(r) for r in reports]}, indent=2), file=out)
    return 0


def _sync_line(report: SyncReport, action: str) -> str:
    head = f"{report.topic} -> {report.table}"
    snapshot = f"snapshot {report.position.snapshot_id}" if report.position.snapshot_id is not None else "no snapshot"
    if not report.commits:
        return f"{head}: up to date ({snapshot})" if action == "sync" else f"{head}: rebuilt, empty"
    verb = "rebuilt with" if action == "rebuild" else "appended"
    conflicts = f", {report.conflicts} commit(s) lost to another writer and redone" if report.conflicts else ""
    return (
        f"{head}: {verb} {report.rows} message(s) of {report.segments} segment(s) in {len(report.commits)} "
        f"commit(s){conflicts} ({snapshot})"
    )


def _position(position: Position | None) -> list[int] | None:
    return None if position is None else list(position)


def _sync_doc(report: SyncReport) -> dict[str, Any]:
    return {
        "topic": report.topic,
        "table": report.table,
        "created": report.created,
        "rows": report.rows,
        "segments": report.segments,
        "conflicts": report.conflicts,
        "snapshot_id": report.position.snapshot_id,
        "positions": {t: _position(p) for t, p in sorted(report.position.positions.items())},
        "commits": [
            {"snapshot_id": c.snapshot_id, "segments": c.segments, "rows": c.rows, "files": c.files}
            for c in report.commits
        ],
    }


def _show(args: argparse.Namespace, scoped: ScopedStore, catalog: Catalog, topics: list[str], out: TextIO) -> int:
    from streamoffload.table.status import table_status

    grace = float_arg(args.orphan_grace_minutes, "--orphan-grace-minutes", 0, MAX_RETENTION_MINUTES, "minutes")
    statuses = [table_status(scoped, catalog, t, orphans=args.orphans, grace_s=(grace or 0.0) * 60.0) for t in topics]
    if args.json:
        print(json.dumps({"tables": [s.as_dict() for s in statuses]}, indent=2), file=out)
        return 0
    for status in statuses:
        print(render_status(status), file=out)
    return 0


def _at(position: Position | None) -> str:
    return "-" if position is None else f"{position[0]}:{position[1]}"


def render_status(status: TableStatus) -> str:
    """A table's status as text: one line for the table, one per topic-partition, then its orphans if asked."""
    if status.segments_behind:
        behind = f"{status.segments_behind} segment(s), {status.entries_behind} entries behind the store"
    else:
        behind = "caught up with the store"
    if not status.exists:
        head = f"{status.table} ({status.topic}): no table yet (run `streamoffload table sync`), {behind}"
    else:
        when = (
            datetime.fromtimestamp(status.committed_ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%SZ")
            if status.committed_ms is not None
            else "-"
        )
        head = (
            f"{status.table} ({status.topic}): snapshot {status.snapshot_id} at {when}, {status.rows} rows in "
            f"{status.data_files} data file(s), {behind}"
        )
        if status.dead_letters is not None:
            head += (
                f"; {status.dead_letters} dead letter(s) (values that did not decode) in {status.table}__dead_letters"
            )
    lines = [head]
    for p in status.partitions:
        lag = f"{p.segments_behind} segment(s), {p.entries_behind} entries behind" if p.segments_behind else "caught up"
        lines.append(f"  {p.topic}: table at {_at(p.table_position)}, store at {_at(p.store_position)}: {lag}")
    if status.orphans is not None:
        colon = ":" if status.orphans else ""
        lines.append(f"  {len(status.orphans)} orphan data file(s) (no snapshot references them){colon}")
        lines += [f"    {path}" for path in status.orphans]
    return "\n".join(lines)


def _maintain(args: argparse.Namespace, scoped: ScopedStore, catalog: Catalog, topics: list[str], out: TextIO) -> int:
    from streamoffload.table.maintenance import MaintenanceOptions, maintain_table

    defaults = MaintenanceOptions()
    target_mb = float_arg(args.target_file_mb, "--target-file-mb", 0.001, 1024 * 1024, "megabytes")
    expire = float_arg(
        args.expire_older_than_minutes, "--expire-older-than-minutes", 0, MAX_RETENTION_MINUTES, "minutes"
    )
    grace = float_arg(args.orphan_grace_minutes, "--orphan-grace-minutes", 0, MAX_RETENTION_MINUTES, "minutes")
    min_files = int_arg(args.min_files, "--min-files", 1, 1_000_000, "files")
    keep = int_arg(args.keep_snapshots, "--keep-snapshots", 1, 1_000_000, "snapshots")
    options = MaintenanceOptions(
        steps=tuple(s for s in MAINTAIN_STEPS if not args.only or s in args.only),
        target_file_bytes=defaults.target_file_bytes if target_mb is None else max(round(target_mb * 2**20), 1),
        min_files=defaults.min_files if min_files is None else min_files,
        keep_snapshots=defaults.keep_snapshots if keep is None else keep,
        expire_older_than_s=defaults.expire_older_than_s if expire is None else expire * 60.0,
        orphan_grace_s=defaults.orphan_grace_s if grace is None else grace * 60.0,
    )
    reports = [maintain_table(scoped, catalog, t, options) for t in topics]
    if args.json:
        print(json.dumps({"tables": [r.as_dict() for r in reports]}, indent=2), file=out)
        return 0
    for report in reports:
        print(_maintain_line(report), file=out)
    return 0


def _maintain_line(report: MaintenanceReport) -> str:
    """One line per table: what each step that ran did."""
    head = f"{report.topic} -> {report.table}"
    if not report.exists:
        return f"{head}: no table yet (run `streamoffload table sync`)"
    steps = []
    if report.retention is not None:
        r = report.retention
        if r.rewrite.snapshot_id is None:
            steps.append("retention: nothing deleted")
        else:
            steps.append(
                f"retention: removed {r.rewrite.removed_rows} row(s) of deleted segments "
                f"({len(r.rewrite.removed_files)} file(s) dropped or rewritten)"
            )
        steps += [f"retention left {topic} alone: {why}" for topic, why in sorted(r.skipped.items())]
    if report.compaction is not None:
        c = report.compaction
        if c.rewrite.snapshot_id is None:
            steps.append("compaction: nothing to do")
        else:
            steps.append(
                f"compaction: {len(c.rewrite.removed_files)} file(s) into {len(c.rewrite.added_files)} in "
                f"{len(c.partitions)} partition(s)"
            )
    if report.expiry is not None:
        steps.append(f"expiry: {len(report.expiry.expired)} snapshot(s) expired, {len(report.expiry.kept)} kept")
    if report.orphans is not None:
        orphans = report.orphans
        steps.append(
            f"orphans: {len(orphans.removed)} data file(s) and {len(orphans.removed_metadata)} manifest file(s) removed"
        )
    snapshot = report.position.snapshot_id
    return f"{head}: {'; '.join(steps)} (snapshot {snapshot})"
