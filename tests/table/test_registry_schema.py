"""A table's value schema from the broker's registry (``offloadTableSchema = "broker"``: ``table.registry_schema``):
registry versions mapped to decoders (Pulsar's JSON type over its Avro record definition), each message decoded with
its own version or a dead letter, and pulsar-lite, which has no registry, refused in one line. (Against Apache
Pulsar: ``tests/pulsar/test_schema_registry_pulsar.py``.)"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import fastavro
import pytest

from streamoffload.cli import main
from streamoffload.embedded_broker import EmbeddedBroker
from streamoffload.pulsar.schema_registry import BrokerSchema, NoSchemaError, UnsupportedSchemaType, version_bytes
from streamoffload.storage.location import parse_store_url
from streamoffload.table.registry_schema import broker_value_schema, lookup_value_schema
from streamoffload.table.schema import TableSchemaError, ValueDecodeError
from tests.table.offload import TopicOffload

TOPIC = "persistent://public/default/orders"


def avro_record(*fields: dict[str, Any]) -> dict[str, Any]:
    return {"type": "record", "name": "Order", "namespace": "shop", "fields": list(fields)}


ID = {"name": "id", "type": "long"}
ITEM = {"name": "item", "type": ["null", "string"]}
NOTE = {"name": "note", "type": ["null", "string"], "default": None}


def schema(kind: str, doc: dict[str, Any], version: int = 0) -> BrokerSchema:
    return BrokerSchema(TOPIC, "public/default/orders", kind, json.dumps(doc, indent=True).encode(), version)


def avro_bytes(doc: dict[str, Any], value: dict[str, Any]) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(doc), value)
    return out.getvalue()


class Versions:
    """A registry's versions of one topic, in memory (``table.registry_schema.SchemaRegistry``)."""

    def __init__(self, *schemas: BrokerSchema) -> None:
        self.schemas = list(schemas)
        self.asked: list[int | None] = []

    def latest(self, topic: str) -> BrokerSchema:
        self.asked.append(None)
        return self.schemas[-1]

    def version(self, topic: str, version: int) -> BrokerSchema:
        self.asked.append(version)
        for s in self.schemas:
            if s.version == version:
                return s
        raise NoSchemaError(f"the schema registry at b has no schema version {version} for {topic}: gone")


def test_json_values_are_checked_against_the_avro_record_pulsar_describes_them_with() -> None:
    doc = avro_record(
        {"name": "id", "type": "int"},
        {"name": "score", "type": ["null", "float"]},
        {"name": "tags", "type": ["null", {"type": "array", "items": "string"}]},
        {"name": "labels", "type": {"type": "map", "values": ["null", "long"]}},
        {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["A", "B"]}},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    )
    value_schema = broker_value_schema(schema("JSON", doc))
    assert value_schema.kind == "json"
    value = {"id": 7, "score": 1.5, "tags": ["a"], "labels": {"x": 1, "y": None}, "kind": "B", "at": 1700000000000}
    assert value_schema.decode(json.dumps(value).encode()) == {**value, "labels": [("x", 1), ("y", None)]}
    assert value_schema.decode(b'{"id": -2147483648, "labels": {}, "kind": "A", "at": 0}') == {
        "id": -(2**31),
        "score": None,
        "tags": None,
        "labels": [],
        "kind": "A",
        "at": 0,
    }
    for bad, error in (
        ('{"id": 2147483648, "labels": {}, "kind": "A", "at": 0}', "field 'id': integer out of range: 2147483648"),
        ('{"id": 1, "score": 1e39, "labels": {}, "kind": "A", "at": 0}', "field 'score': number out of range: 1e+39"),
        (
            '{"id": 1, "labels": {"x": "1"}, "kind": "A", "at": 0}',
            "field 'labels{x}': expected integer, got string \"1\"",
        ),
        ('{"id": 1, "labels": [], "kind": "A", "at": 0}', "field 'labels': expected object, got array []"),
        ('{"id": 1, "labels": {}, "at": 0}', "field 'kind': required, missing"),
    ):
        with pytest.raises(ValueDecodeError) as caught:
            value_schema.decode(bad.encode())
        assert str(caught.value) == error


def test_avro_values_and_an_old_json_schema_definition() -> None:
    doc = avro_record(ID, ITEM)
    avro = broker_value_schema(schema("AVRO", doc))
    assert avro.kind == "avro"
    assert avro.decode(avro_bytes(doc, {"id": 3, "item": "x"})) == {"id": 3, "item": "x"}
    # Brokers before protocol version 13 held a JSON Schema document for the JSON type: read as one.
    old = {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]}
    assert broker_value_schema(schema("JSON", old)).decode(b'{"id": 4}') == {"id": 4}


def test_schemas_a_table_cannot_decode_are_said_so() -> None:
    with pytest.raises(UnsupportedSchemaType) as caught:
        broker_value_schema(schema("JSON", avro_record(ID, {"name": "raw", "type": "bytes"}), 2))
    assert str(caught.value) == (
        f"{TOPIC}: schema version 2 (JSON) in the broker's registry: field 'raw': bytes in a JSON schema have no one "
        "encoding (Java's clients write base64, Python's the text itself): not decoded"
    )
    with pytest.raises(UnsupportedSchemaType, match=r"\(AVRO\) in the broker's registry: must be a JSON Schema "):
        broker_value_schema(schema("AVRO", {"type": "array", "items": "long"}))
    with pytest.raises(TableSchemaError) as refused:
        lookup_value_schema("broker", TOPIC, Versions(schema("PROTOBUF_NATIVE", {"x": 1})))
    assert str(refused.value) == (
        f'offloadTableSchema = "broker": {TOPIC}: schema version 0 in the broker\'s registry is of type '
        "PROTOBUF_NATIVE: only AVRO and JSON schemas (records) decode into table columns"
    )
    with pytest.raises(TableSchemaError, match=rf'^{TOPIC}: offloadTableSchema = "broker" needs the broker: '):
        lookup_value_schema("broker", TOPIC, None)
    assert lookup_value_schema("", TOPIC, None) is None
    inline = lookup_value_schema(json.dumps(avro_record(ID)), TOPIC, None)
    assert inline is not None and inline.decoder_for is None


def test_each_message_decodes_with_its_own_version_or_is_a_dead_letter() -> None:
    v0, v1 = avro_record(ID, ITEM), avro_record(ID, ITEM, NOTE)
    changed = avro_record({"name": "id", "type": "string"}, ITEM)
    registry = Versions(
        schema("AVRO", v0, 0), schema("AVRO", changed, 1), schema("AVRO", avro_record(ID), 2), schema("AVRO", v1, 4)
    )
    table = lookup_value_schema("broker", TOPIC, registry)
    assert table is not None and table.decoder_for is not None
    assert [f.name for f in table.struct.fields] == ["id", "item", "note"]
    old, new = avro_bytes(v0, {"id": 1, "item": "a"}), avro_bytes(v1, {"id": 2, "item": None, "note": "n"})
    decoder_for = table.decoder_for
    assert decoder_for(version_bytes(4))(new) == {"id": 2, "item": None, "note": "n"}
    assert decoder_for(None)(new) == {"id": 2, "item": None, "note": "n"}  # no version: the latest's
    assert decoder_for(version_bytes(0))(old) == {"id": 1, "item": "a"}  # 'note' is null in the table
    with pytest.raises(ValueDecodeError):
        table.decode(old)  # what decoding version 0's bytes with the latest would do
    assert decoder_for(version_bytes(2))(avro_bytes(avro_record(ID), {"id": 5})) == {"id": 5}
    for version, error in (
        (
            1,
            "schema version 1 does not decode into version 4: persistent://public/default/orders: offloadTableSchema "
            "changes the type of 'id' from string to long",
        ),
        (
            3,
            "schema version 3 does not decode into version 4: the schema registry at b has no schema version 3 for "
            "persistent://public/default/orders: gone",
        ),
    ):
        with pytest.raises(ValueDecodeError) as caught:
            decoder_for(version_bytes(version))(old)
        assert str(caught.value) == error
    with pytest.raises(ValueDecodeError, match=r"^schema version: a schema version is 8 bytes, got 1: 01$"):
        decoder_for(b"\x01")(old)
    assert registry.asked == [None, 0, 2, 1, 3]  # each version asked once, the latest's never again
    for _ in range(3):
        decoder_for(version_bytes(0))(old)
    assert registry.asked == [None, 0, 2, 1, 3]
    with pytest.raises(TableSchemaError) as newer:
        decoder_for(version_bytes(5))
    assert str(newer.value) == (
        f"{TOPIC}: a message has schema version 5, newer than version 4 this sync took from the broker's registry: "
        "nothing committed, the next sync evolves the table first"
    )


def test_pulsar_lite_has_no_registry_one_line_names_the_topic_and_the_broker(
    pulsar_broker: EmbeddedBroker, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "store"
    TopicOffload(parse_store_url(str(root)).open(), TOPIC).publish(3)
    conf = tmp_path / "c.toml"
    conf.write_text(
        '[pulsar.client]\noperationTimeoutSeconds = "1"\n\n'
        f'[store]\nroot = "{root}"\n\n[topics."{TOPIC}"]\noffloadTableSchema = "broker"\n'
    )
    assert main(["table", "sync", "--conf", str(conf), "--service-url", pulsar_broker.service_url, TOPIC]) == 1
    err = capsys.readouterr().err
    assert err == (
        f'streamoffload table: error: offloadTableSchema = "broker": cannot ask {pulsar_broker.service_url} for the '
        f"latest schema of {TOPIC}: no answer to GetSchema within 1 s (pulsar-lite has no schema registry: give "
        "offloadTableSchema inline or as @FILE instead)\n"
    )
