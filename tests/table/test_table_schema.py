"""Typed values where the topic has a schema (``offloadTableSchema``: ``table.schema``, ``table.dead_letters``):
a JSON-Schema topic and an Avro topic offloaded by the real segmenter and sink into a filesystem store, synced
into a SQLite catalog, read back by pyiceberg's scan and by DuckDB over the Parquet files the manifests list."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import duckdb
import fastavro
import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.table import Table
from pyiceberg.types import StructType

from streamoffload.checkpoints import manifest as mf
from streamoffload.checkpoints.metadata_store import MetadataStore
from streamoffload.checkpoints.policy import OffloadPolicy, validated_policy
from streamoffload.cli import main
from streamoffload.config import TableSettings, parse_config
from streamoffload.errors import ConfigError
from streamoffload.metrics.collector import JobMetrics
from streamoffload.storage.location import ScopedStore, parse_store_url
from streamoffload.streaming.job.tables import TableFollower
from streamoffload.table.catalog import catalog_settings, open_catalog
from streamoffload.table.maintenance import MaintenanceOptions, maintain_table
from streamoffload.table.position import table_position
from streamoffload.table.schema import TableSchemaError, parse_value_schema
from streamoffload.table.status import table_status
from streamoffload.table.sync import SyncHooks, SyncOptions, sync_topic
from tests.table.offload import EPOCH, Row, TopicOffload, row_tuple

EVENTS = "persistent://public/default/events"
READINGS = "persistent://public/default/readings"

EVENTS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "id": {"type": "integer"},
        "name": {"type": ["string", "null"]},
        "score": {"type": "number"},
        "ok": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "where": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
    "required": ["id", "score"],
}
LEVEL = {"level": {"type": ["integer", "null"]}}
"""An optional field added to EVENTS_SCHEMA."""

READINGS_SCHEMA: dict[str, Any] = {
    "type": "record",
    "name": "Reading",
    "fields": [
        {"name": "sensor", "type": "string"},
        {"name": "value", "type": "double"},
        {"name": "count", "type": "int"},
        {"name": "note", "type": ["null", "string"], "default": None},
        {
            "name": "location",
            "type": {
                "type": "record",
                "name": "Loc",
                "fields": [{"name": "lat", "type": "float"}, {"name": "lon", "type": "float"}],
            },
        },
        {"name": "samples", "type": {"type": "array", "items": "long"}},
        {"name": "labels", "type": {"type": "map", "values": "string"}},
        {"name": "raw", "type": "bytes"},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    ],
}
_PARSED_READINGS = fastavro.parse_schema(READINGS_SCHEMA)


def event(n: int, level: bool = False) -> dict[str, Any]:
    """Message n of the events topic, as its value's JSON and as ``value_decoded`` holds it."""
    doc: dict[str, Any] = {
        "id": n,
        "score": n / 4,
        "ok": n % 2 == 0,
        "tags": [f"t{n % 3}"] * (n % 3),
        "where": {"city": f"c{n % 5}"},
    }
    if n % 4:
        doc["name"] = f"name-{n}"
    if level:
        doc["level"] = n * 10
    return doc


def event_value(n: int, level: bool = False) -> bytes:
    if n % 9 == 4:
        return b'{"id": 1, "score": '
    if n % 9 == 7:
        return json.dumps({**event(n), "score": "high"}).encode()
    if n % 13 == 6:
        return json.dumps({k: v for k, v in event(n).items() if k != "id"}).encode()
    return json.dumps(event(n, level)).encode()


def event_error(n: int) -> str | None:
    if n % 9 == 4:
        return "not JSON: Expecting value: line 1 column 20 (char 19)"
    if n % 9 == 7:
        return "field 'score': expected number, got string \"high\""
    if n % 13 == 6:
        return "field 'id': required, missing"
    return None


def event_decoded(n: int, level: bool | None = False) -> dict[str, Any] | None:
    """``value_decoded`` of message n (``level``: None when the table has no such column)."""
    if event_error(n):
        return None
    doc = event(n)
    out = {
        "id": n,
        "name": doc.get("name"),
        "score": n / 4,
        "ok": doc["ok"],
        "tags": doc["tags"],
        "where": doc["where"],
    }
    if level is not None:
        out["level"] = n * 10 if level else None
    return out


def reading(n: int) -> dict[str, Any]:
    return {
        "sensor": f"s-{n % 3}",
        "value": n * 1.5,
        "count": -n,
        "note": None if n % 3 else f"note {n}",
        "location": {"lat": n / 8, "lon": -n / 16},
        "samples": [n, n * 2**40][: n % 3],
        "labels": {f"k{i}": f"v{n + i}" for i in range(n % 3)},
        "raw": bytes([n % 256]) * (n % 4),
        "at": 1_700_000_000_000 + n,
    }


def reading_value(n: int) -> bytes:
    if n % 10 == 3:
        return b""
    buffer = io.BytesIO()
    fastavro.schemaless_writer(buffer, _PARSED_READINGS, reading(n))
    if n % 10 == 7:
        return buffer.getvalue() + b"\x00\x01"
    return buffer.getvalue()


def reading_error(n: int) -> str | None:
    if n % 10 == 3:
        return "field 'sensor': Avro value ends early (0 bytes)"
    if n % 10 == 7:
        return "Avro value has 2 bytes past the end of the record"
    return None


@dataclass
class Tier:
    scoped: ScopedStore
    catalog: Catalog
    events: TopicOffload
    readings: TopicOffload

    def sync(self, topic: str, schema: dict[str, Any] | str, hooks: SyncHooks | None = None) -> Any:
        text = schema if isinstance(schema, str) else json.dumps(schema)
        return sync_topic(self.scoped, self.catalog, topic, SyncOptions(value_schema=text), hooks)

    def table(self, name: str) -> Table:
        return self.catalog.load_table(f"public.default.{name}")


@pytest.fixture
def tier(tmp_path: Path) -> Iterator[Tier]:
    location = parse_store_url(str(tmp_path / "store"))
    scoped = location.open()
    catalog = open_catalog(catalog_settings(location))
    yield Tier(
        scoped,
        catalog,
        TopicOffload(scoped, EVENTS, value_of=event_value),
        TopicOffload(scoped, READINGS, value_of=reading_value),
    )
    scoped.store.close()


def _plain(value: Any) -> Any:
    """A value as a reader gives it, with maps (pairs, or DuckDB's key and value lists) as dicts, and empty ones as
    empty lists (as pyiceberg gives them)."""
    if value == {}:
        return []
    if isinstance(value, dict):
        if set(value) == {"key", "value"} and isinstance(value["key"], list):
            return dict(zip(value["key"], value["value"], strict=True))
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        if value and all(isinstance(v, tuple) and len(v) == 2 for v in value):
            return {k: _plain(v) for k, v in value}
        return [_plain(v) for v in value]
    return value


def pyiceberg_docs(table: Table) -> list[dict[str, Any]]:
    docs = table.scan().to_arrow().to_pylist()
    return sorted(docs, key=lambda d: (d["ledger_id"], d["entry_id"], d["batch_index"]))


def duckdb_docs(table: Table) -> list[dict[str, Any]]:
    snapshot = table.current_snapshot()
    assert snapshot is not None
    files = [e.data_file.file_path for m in snapshot.manifests(table.io) for e in m.fetch_manifest_entry(table.io)]
    relation = duckdb.connect().read_parquet([f.removeprefix("file://") for f in files], union_by_name=True)
    docs = [dict(zip(relation.columns, values, strict=True)) for values in relation.fetchall()]
    return sorted(docs, key=lambda d: (d["ledger_id"], d["entry_id"], d["batch_index"]))


def decoded_by_position(table: Table) -> dict[str, list[tuple[tuple[int, int, int], Any]]]:
    """Each reader's ``value_decoded`` per position, maps as dicts."""
    return {
        read.__name__: [
            ((d["ledger_id"], d["entry_id"], d["batch_index"]), _plain(d["value_decoded"])) for d in read(table)
        ]
        for read in (pyiceberg_docs, duckdb_docs)
    }


def raw_rows(table: Table) -> list[Row]:
    return sorted((row_tuple(d) for d in pyiceberg_docs(table)), key=lambda r: r.position)


def dead_letters(table: Table) -> list[tuple[Any, ...]]:
    """The dead-letter table's rows as (ledger, entry, batch index, partition, topic, publish ms, value, error)."""
    docs = table.scan().to_arrow().to_pylist()
    out = [
        (
            d["ledger_id"],
            d["entry_id"],
            d["batch_index"],
            d["partition"],
            d["__topic"],
            (d["__publishTime"] - EPOCH) // timedelta(milliseconds=1),
            d["value"],
            d["error"],
        )
        for d in docs
    ]
    return sorted(out)


def expected_dead(rows: list[Row], error_of: Any) -> list[tuple[Any, ...]]:
    return sorted(
        (r.ledger_id, r.entry_id, r.batch_index, r.partition, r.topic, r.publish_ms, r.value, error_of(n))
        for n, r in enumerate(rows)
        if error_of(n)
    )


def test_a_json_schema_topic_has_typed_columns_and_its_bad_records_dead_letters(tier: Tier) -> None:
    rows = tier.events.publish(40)
    report = tier.sync(EVENTS, EVENTS_SCHEMA)
    table = tier.table("events")
    assert raw_rows(table) == rows  # every message, raw columns exact, the bad ones too
    expected = [(r.position[1:], event_decoded(n, None)) for n, r in enumerate(rows)]
    for reader, got in decoded_by_position(table).items():
        assert got == expected, reader
    dead = expected_dead(rows, event_error)
    assert {d[7] for d in dead} == {event_error(4), event_error(7), event_error(6)}
    assert dead_letters(tier.table("events__dead_letters")) == dead
    assert report.dead_letters == len(dead) and report.rows == len(rows)
    # Both tables' snapshots record the same positions: the dead letters' commit first.
    assert table_position(tier.table("events__dead_letters")).positions == table_position(table).positions
    field = table.schema().find_field("value_decoded")
    assert not field.required and isinstance(field.field_type, StructType)
    fields = {f.name: (str(f.field_type), f.required) for f in field.field_type.fields}
    assert fields == {
        "id": ("long", True),
        "name": ("string", False),
        "score": ("double", True),
        "ok": ("boolean", False),
        "tags": (fields["tags"][0], False),
        "where": (fields["where"][0], False),
    }
    assert fields["tags"][0].startswith("list<string>") and fields["where"][0].startswith("struct<")


def test_dead_letters_leave_with_their_segments_and_are_compacted(tier: Tier) -> None:
    """``maintain_table`` runs its steps on the dead-letter table too: when the store deletes a ledger's
    segments (``delete-ledger``), their dead letters leave with their rows; its small files are compacted."""
    rows: list[Row] = []
    for _ in range(6):  # 6 segments of 9 entries: ledger 3 (40 entries), then ledger 4
        rows += tier.events.publish(9)
        tier.sync(EVENTS, EVENTS_SCHEMA)
    dead_table = tier.table("events__dead_letters")
    assert len(list(dead_table.scan().plan_files())) == 6
    meta = MetadataStore(tier.scoped)
    assert meta.mark_ledger_deleted(EVENTS, 3, "test")
    deleted = meta.apply_deletions(EVENTS, 0)
    gone = {
        (r.ledger_id, r.entry_id)
        for r in rows
        if any(mf.start_position(s) <= (r.ledger_id, r.entry_id) <= mf.end_position(s) for s in deleted)
    }
    assert gone and len(deleted) == 4  # the segments ending at (3,8) .. (3,35); (3,36)..(4,4) is kept
    report = maintain_table(tier.scoped, tier.catalog, EVENTS, MaintenanceOptions(min_files=1))
    kept = [r for r in rows if (r.ledger_id, r.entry_id) not in gone]
    assert raw_rows(tier.table("events")) == kept
    expected = expected_dead(rows, event_error)
    dead_table = tier.table("events__dead_letters")
    assert dead_letters(dead_table) == [d for d in expected if (d[0], d[1]) not in gone]
    assert report.dead_letters is not None and report.dead_letters.retention is not None
    assert report.dead_letters.rows_retained_away == len(expected) - len(dead_letters(dead_table)) > 0
    assert report.rows_retained_away == len(rows) - len(kept) + report.dead_letters.rows_retained_away
    assert len(list(dead_table.scan().plan_files())) == 1
    assert report.dead_letters.files_compacted >= 2
    assert table_position(dead_table).positions == table_position(tier.table("events")).positions
    assert report.as_dict()["dead_letters"]["table"] == "public.default.events__dead_letters"
    # The status counts them.
    assert table_status(tier.scoped, tier.catalog, EVENTS).dead_letters == len(dead_letters(dead_table))
    # A sync after it appends only what is new, dead letters too.
    more = tier.events.publish(9)
    tier.sync(EVENTS, EVENTS_SCHEMA)
    new_dead = [d for d in expected_dead(rows + more, event_error) if (d[0], d[1]) not in gone]
    assert dead_letters(tier.table("events__dead_letters")) == new_dead


def test_the_jobs_follower_counts_the_dead_letters_it_appends(tier: Tier, tmp_path: Path) -> None:
    rows = tier.events.publish(30)
    policy = OffloadPolicy(offloadTable=True, offloadTableSchema=json.dumps(EVENTS_SCHEMA))
    follower = TableFollower(
        parse_store_url(str(tmp_path / "store")), TableSettings(), lambda _t: policy, epoch=1, check_lease=lambda: None
    )
    follower.mark([EVENTS])
    follower.sync_due()
    [figures] = follower.figures()
    dead = expected_dead(rows, event_error)
    assert (figures.rows_appended, figures.dead_letters_appended) == (len(rows), len(dead)) and dead
    metrics = JobMetrics(read_cache=False)
    metrics.table_figures = follower.figures
    samples = {s.name: s.value for f in metrics.registry.collect() for s in f.samples}
    assert samples["streamoffload_table_dead_letters_appended_total"] == len(dead)
    follower.stop()


def test_an_avro_topic_has_typed_columns_and_its_bad_records_dead_letters(tier: Tier) -> None:
    rows = tier.readings.publish(30)
    tier.sync(READINGS, READINGS_SCHEMA)
    table = tier.table("readings")
    assert raw_rows(table) == rows
    expected = [(r.position[1:], None if reading_error(n) else _plain(reading(n))) for n, r in enumerate(rows)]
    for reader, got in decoded_by_position(table).items():
        assert got == expected, reader
    assert dead_letters(tier.table("readings__dead_letters")) == expected_dead(rows, reading_error)
    types = {f.name: str(f.field_type) for f in table.schema().find_field("value_decoded").field_type.fields}
    assert types["count"] == "int" and types["location"].startswith("struct<") and types["at"] == "long"
    assert types["labels"].startswith("map<string, string>") and types["raw"] == "binary"


def test_a_truncated_avro_value_is_a_dead_letter_naming_the_field(tier: Tier) -> None:
    good = reading_value(1)

    def value_of(n: int) -> bytes:
        return good[:-1] if n == 1 else reading_value(0)

    offload = TopicOffload(tier.scoped, "persistent://public/default/cut", value_of=value_of)
    rows = offload.publish(3)
    tier.sync("persistent://public/default/cut", READINGS_SCHEMA)
    dead = dead_letters(tier.table("cut__dead_letters"))
    assert [d[:3] for d in dead] == [rows[1].position[1:]]
    assert dead[0][7] == f"field 'at': Avro value ends early ({len(good) - 1} bytes)"


def test_an_added_optional_field_evolves_the_table(tier: Tier) -> None:
    first = tier.events.publish(12)
    tier.sync(EVENTS, EVENTS_SCHEMA)
    tier.events.value_of = lambda n: event_value(n, level=True)
    second = tier.events.publish(10)
    evolved = {**EVENTS_SCHEMA, "properties": {**EVENTS_SCHEMA["properties"], **LEVEL}}
    tier.sync(EVENTS, evolved)
    table = tier.table("events")
    rows = first + second
    assert raw_rows(table) == rows
    expected = [(r.position[1:], event_decoded(n, n >= len(first))) for n, r in enumerate(rows)]
    for reader, got in decoded_by_position(table).items():
        assert got == expected, reader
    level = table.schema().find_field("value_decoded.level")
    assert str(level.field_type) == "long" and not level.required


def test_a_partitioned_topics_dead_letters_carry_their_partition(tier: Tier) -> None:
    topic = "persistent://public/default/parted"
    parts = [TopicOffload(tier.scoped, f"{topic}-partition-{i}", value_of=event_value) for i in range(2)]
    rows = [r for p, n in zip(parts, (12, 9), strict=True) for r in p.publish(n)]
    tier.sync(topic, EVENTS_SCHEMA)
    dead = dead_letters(tier.table("parted__dead_letters"))
    expected = sorted(d for p in parts for d in expected_dead(p.rows, event_error))
    assert dead == expected and {d[3] for d in dead} == {0, 1}
    got = sorted(raw_rows(tier.table("parted")), key=lambda r: (r.partition, r.position))
    assert got == sorted(rows, key=lambda r: (r.partition, r.position))
    positions = table_position(tier.table("parted")).positions
    assert set(positions) == {f"{topic}-partition-0", f"{topic}-partition-1"}
    assert table_position(tier.table("parted__dead_letters")).positions == positions


def test_a_schema_taken_off_the_policy_leaves_new_rows_undecoded(tier: Tier) -> None:
    first = tier.events.publish(6)
    tier.sync(EVENTS, EVENTS_SCHEMA)
    second = tier.events.publish(4)
    assert tier.sync(EVENTS, "").rows == len(second)
    rows = first + second
    table = tier.table("events")
    assert raw_rows(table) == rows
    expected = [(r.position[1:], event_decoded(n, None) if n < len(first) else None) for n, r in enumerate(rows)]
    for reader, got in decoded_by_position(table).items():
        assert got == expected, reader


@pytest.mark.parametrize(
    ("change", "error"),
    [
        (
            {"properties": {**EVENTS_SCHEMA["properties"], "score": {"type": "string"}}},
            "persistent://public/default/events: offloadTableSchema changes the type of 'score' from double to string",
        ),
        (
            {
                "properties": {**EVENTS_SCHEMA["properties"], **LEVEL, "seq": {"type": "integer"}},
                "required": ["id", "score", "seq"],
            },
            "persistent://public/default/events: offloadTableSchema adds the required field 'seq': rows already in "
            "the table have none (add it as optional)",
        ),
        (
            {"properties": {k: v for k, v in EVENTS_SCHEMA["properties"].items() if k != "score"}, "required": ["id"]},
            "persistent://public/default/events: offloadTableSchema removes the required field 'score'",
        ),
        (
            {
                "properties": {
                    **EVENTS_SCHEMA["properties"],
                    "where": {"type": "object", "properties": {"city": {"type": "integer"}}},
                }
            },
            "persistent://public/default/events: offloadTableSchema changes the type of 'where.city' from string to "
            "long",
        ),
    ],
)
def test_a_change_that_cannot_evolve_is_refused_naming_the_field_and_other_topics_go_on(
    tier: Tier, change: dict[str, Any], error: str
) -> None:
    first = tier.events.publish(8)
    tier.sync(EVENTS, EVENTS_SCHEMA)
    before = tier.table("events").metadata
    tier.events.publish(5)
    tier.readings.publish(4)
    with pytest.raises(TableSchemaError) as caught:
        tier.sync(EVENTS, {**EVENTS_SCHEMA, **change})
    assert str(caught.value) == error
    table = tier.table("events")
    assert table.metadata.current_schema_id == before.current_schema_id
    assert table.metadata.snapshots == before.snapshots and raw_rows(table) == first
    assert tier.sync(READINGS, READINGS_SCHEMA).rows == len(tier.readings.rows)  # another topic syncs on


def test_a_replayed_sync_and_a_crash_between_the_two_commits_duplicate_nothing(tier: Tier) -> None:
    first = tier.events.publish(20)
    tier.sync(EVENTS, EVENTS_SCHEMA)
    second = tier.events.publish(18)

    class Crash(Exception):
        pass

    def crash() -> None:
        raise Crash

    with pytest.raises(Crash):
        tier.sync(EVENTS, EVENTS_SCHEMA, SyncHooks(dead_letters_committed=crash))
    table, dead = tier.table("events"), tier.table("events__dead_letters")
    assert raw_rows(table) == first and len(dead.metadata.snapshots) == 2  # the dead letters are ahead
    report = tier.sync(EVENTS, EVENTS_SCHEMA)
    assert report.dead_letters == 0 and report.rows == len(second)  # written before the crash
    metadata = tier.table("events").metadata_location
    replay = tier.sync(EVENTS, EVENTS_SCHEMA)
    assert replay.commits == [] and tier.table("events").metadata_location == metadata  # no schema commit either
    rows = first + second
    table, dead = tier.table("events"), tier.table("events__dead_letters")
    assert raw_rows(table) == rows and len(table.metadata.snapshots) == 2 and len(dead.metadata.snapshots) == 2
    assert dead_letters(dead) == expected_dead(rows, event_error)
    for reader, got in decoded_by_position(table).items():
        assert got == [(r.position[1:], event_decoded(n, None)) for n, r in enumerate(rows)], reader


def test_a_schema_file_is_read_with_at(tier: Tier, tmp_path: Path) -> None:
    path = tmp_path / "events.json"
    path.write_text(json.dumps(EVENTS_SCHEMA))
    rows = tier.events.publish(5)
    tier.sync(EVENTS, f"@{path}")
    got = decoded_by_position(tier.table("events"))["pyiceberg_docs"]
    assert got == [(r.position[1:], event_decoded(n, None)) for n, r in enumerate(rows)]


def test_table_sync_takes_each_topics_schema_from_the_configuration(
    tier: Tier, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = tier.events.publish(6)
    tier.readings.publish(3)
    (tmp_path / "events.json").write_text(json.dumps(EVENTS_SCHEMA))
    conf = tmp_path / "offload.toml"
    conf.write_text(f'[topics."{EVENTS}"]\noffloadTableSchema = "@{tmp_path / "events.json"}"\n')
    store = str(tmp_path / "store")
    assert main(["table", "sync", "--conf", str(conf), "--store", store, "--json"]) == 0
    by_table = {t["table"]: t for t in json.loads(capsys.readouterr().out)["tables"]}
    assert sorted(by_table) == ["public.default.events", "public.default.readings"]
    got = decoded_by_position(tier.table("events"))["pyiceberg_docs"]
    assert got == [(r.position[1:], event_decoded(n, None)) for n, r in enumerate(rows)]
    assert dead_letters(tier.table("events__dead_letters")) == expected_dead(rows, event_error)
    assert "value_decoded" not in tier.table("readings").schema().column_names  # no schema in its policy


def test_the_policy_key_follows_the_levels_and_its_errors_name_it() -> None:
    inline = json.dumps(EVENTS_SCHEMA)
    config = parse_config(
        {
            "namespaces": {"public/default": {"offloadTableSchema": "@/etc/schemas/default.json"}},
            "topics": {EVENTS: {"offloadTableSchema": inline}},
        },
        "c.toml",
    )
    assert config.policy_for(EVENTS).offloadTableSchema == inline
    assert config.policy_for(READINGS).offloadTableSchema == "@/etc/schemas/default.json"
    assert config.policy_for("persistent://other/ns/x").offloadTableSchema == ""
    with pytest.raises(ConfigError, match=r"^c\.toml: topics\.'orders'\.offloadTableSchema must be str, got int 3$"):
        parse_config({"topics": {"orders": {"offloadTableSchema": 3}}}, "c.toml")
    with pytest.raises(ConfigError) as caught:
        validated_policy({"offloadTableSchema": "{not json"}, "c.toml", "offload")
    assert str(caught.value) == (
        "c.toml: offload.offloadTableSchema must be empty, a JSON Schema or Avro record as JSON text, @PATH to a "
        "file holding one, or \"broker\" (the broker's schema registry), got '{not json'"
    )


@pytest.mark.parametrize(
    ("text", "error"),
    [
        (
            '{"type": "array"}',
            't: offloadTableSchema must be a JSON Schema ("type": "object") or an Avro record '
            '("type": "record"), got type \'array\'',
        ),
        (
            '{"type": "object", "properties": {"a": {"type": "date"}}}',
            "t: offloadTableSchema: field 'a': unsupported type 'date'",
        ),
        (
            '{"type": "object", "properties": {"a": {"type": ["string", "integer"]}}}',
            "t: offloadTableSchema: field 'a': type must be one type, or one and \"null\", got ['string', 'integer']",
        ),
        (
            '{"type": "record", "name": "R", "fields": [{"name": "u", "type": ["int", "string"]}]}',
            "t: offloadTableSchema: field 'u': a union must be null and one other type, got ['int', 'string']",
        ),
        (
            "@/nonexistent/schema.json",
            "t: offloadTableSchema: cannot read /nonexistent/schema.json: No such file or directory",
        ),
    ],
)
def test_a_schema_that_does_not_map_is_one_error_naming_the_field(text: str, error: str) -> None:
    with pytest.raises(TableSchemaError) as caught:
        parse_value_schema(text, "t")
    assert str(caught.value) == error
