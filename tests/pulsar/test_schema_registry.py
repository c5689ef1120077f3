"""The broker's schema registry over ``GetSchema`` (``pulsar.schema_registry``), without a broker: the command's
bytes, every kind of answer parsed, and a broker that is not there. (Against Apache Pulsar and pulsar-lite:
``tests/pulsar/test_schema_registry_pulsar.py``.)"""

from __future__ import annotations

import socket
import struct
import threading

import pytest

from streamoffload.codecs.proto.pulsar_api_pb2 import BaseCommand, CommandGetSchemaResponse, KeyValue, Schema
from streamoffload.embedded_broker import free_port
from streamoffload.pulsar.schema_registry import (
    BrokerSchema,
    BrokerSchemaRegistry,
    NoSchemaError,
    RegistryUnreachable,
    SchemaRegistryError,
    UnsupportedSchemaType,
    get_schema_command,
    parse_schema_response,
    schema_topic,
    version_bytes,
    version_number,
)
from streamoffload.pulsar.wire import T, frame, request_id_of

TOPIC = "persistent://public/default/orders"
AVRO = b'{"type": "record", "name": "Order", "fields": [{"name": "id", "type": "long"}]}'


def response(**fields: object) -> CommandGetSchemaResponse:
    return CommandGetSchemaResponse(request_id=7, **fields)  # type: ignore[arg-type]


def test_versions_are_eight_bytes_big_endian() -> None:
    assert version_bytes(0) == b"\x00" * 8
    assert version_bytes(258) == b"\x00\x00\x00\x00\x00\x00\x01\x02"
    assert version_number(b"\x00\x00\x00\x00\x00\x00\x01\x02") == 258
    with pytest.raises(ValueError, match=r"^a schema version is 8 bytes, got 2: 0102$"):
        version_number(b"\x01\x02")


def test_get_schema_asks_for_the_partitioned_topic_and_the_version() -> None:
    assert schema_topic(f"{TOPIC}-partition-3") == TOPIC
    assert schema_topic("orders") == TOPIC  # a short name in full, as the broker names schemas
    latest = get_schema_command(5, f"{TOPIC}-partition-3")
    assert latest.type == BaseCommand.GET_SCHEMA == T.GET_SCHEMA == 34
    assert not latest.getSchema.HasField("schema_version")
    # BaseCommand{type=34, getSchema(34)={request_id=5, topic=TOPIC, schema_version=2}}, field by field.
    body = bytes([0x08, 34, 0x92, 0x02]) + bytes([2 + 2 + len(TOPIC) + 2 + 8])
    body += bytes([0x08, 5, 0x12, len(TOPIC)]) + TOPIC.encode() + bytes([0x1A, 8]) + version_bytes(2)
    assert get_schema_command(5, TOPIC, 2).SerializeToString() == body


def test_an_answer_carries_the_schema_as_the_registry_holds_it() -> None:
    answer = response(
        schema=Schema(
            name="public/default/orders",
            schema_data=AVRO,
            type=Schema.AVRO,
            properties=[KeyValue(key="k", value="v")],
        ),
        schema_version=version_bytes(3),
    )
    cmd = BaseCommand(type=T.GET_SCHEMA_RESPONSE, getSchemaResponse=answer)
    assert request_id_of(cmd) == 7  # a waiting request finds its answer
    parsed = BaseCommand.FromString(frame(cmd)[8:])  # and it survives the wire
    assert parse_schema_response(parsed.getSchemaResponse, TOPIC, "127.0.0.1:6650") == BrokerSchema(
        topic=TOPIC,
        name="public/default/orders",
        type="AVRO",
        definition=AVRO,
        version=3,
        properties=(("k", "v"),),
    )


def test_the_types_are_named_as_pulsar_admin_names_them() -> None:
    names = {v.number: v.name for v in Schema.Type.DESCRIPTOR.values}
    assert names == {
        0: "NONE",
        1: "STRING",
        2: "JSON",
        3: "PROTOBUF",
        4: "AVRO",
        5: "BOOLEAN",
        6: "INT8",
        7: "INT16",
        8: "INT32",
        9: "INT64",
        10: "FLOAT",
        11: "DOUBLE",
        12: "DATE",
        13: "TIME",
        14: "TIMESTAMP",
        15: "KEY_VALUE",
        16: "INSTANT",
        17: "LOCAL_DATE",
        18: "LOCAL_TIME",
        19: "LOCAL_DATE_TIME",
        20: "PROTOBUF_NATIVE",
    }
    odd = response(schema=Schema(name="n", schema_data=b"", type=Schema.KEY_VALUE), schema_version=version_bytes(0))
    assert parse_schema_response(odd, TOPIC, "b").type == "KEY_VALUE"


def test_no_schema_and_other_refusals_are_one_line_each() -> None:
    # Apache Pulsar's answer for a topic without a schema (or without that version, or no topic at all).
    missing = response(error_code=11, error_message="Topic not found or no-schema")
    with pytest.raises(NoSchemaError) as caught:
        parse_schema_response(missing, TOPIC, "127.0.0.1:6650")
    assert str(caught.value) == (
        f"the schema registry at 127.0.0.1:6650 has no schema for {TOPIC}: Topic not found or no-schema"
    )
    with pytest.raises(NoSchemaError, match=rf"^the schema registry at b has no schema version 4 for {TOPIC}: "):
        parse_schema_response(missing, TOPIC, "b", 4)
    with pytest.raises(SchemaRegistryError) as refused:
        parse_schema_response(response(error_code=0, error_message="boom"), TOPIC, "b")
    assert type(refused.value) is SchemaRegistryError
    assert str(refused.value) == f"GetSchema of {TOPIC} at b failed: boom (UnknownError)"
    with pytest.raises(SchemaRegistryError, match=r"carries neither a schema nor an error$"):
        parse_schema_response(response(), TOPIC, "b")
    schema = Schema(name="n", schema_data=AVRO, type=Schema.AVRO)
    with pytest.raises(SchemaRegistryError, match=r"carries no schema version$"):
        parse_schema_response(response(schema=schema), TOPIC, "b")
    with pytest.raises(SchemaRegistryError, match=r": a schema version is 8 bytes, got 1: 07$"):
        parse_schema_response(response(schema=schema, schema_version=b"\x07"), TOPIC, "b")
    with pytest.raises(SchemaRegistryError, match=r": asked for schema version 2, got 3$"):
        parse_schema_response(response(schema=schema, schema_version=version_bytes(3)), TOPIC, "b", 2)


@pytest.mark.parametrize("kind", ["PROTOBUF", "PROTOBUF_NATIVE", "KEY_VALUE", "STRING", "INT64"])
def test_only_avro_and_json_records_have_a_record_definition(kind: str) -> None:
    schema = BrokerSchema(TOPIC, "public/default/orders", kind, b"{}", 2)
    with pytest.raises(UnsupportedSchemaType) as caught:
        schema.record_definition()
    assert str(caught.value) == (
        f"{TOPIC}: schema version 2 in the broker's registry is of type {kind}: only AVRO and JSON schemas "
        "(records) decode into table columns"
    )


def test_avro_and_json_definitions_are_json_objects() -> None:
    assert BrokerSchema(TOPIC, "n", "JSON", AVRO, 0).record_definition()["name"] == "Order"
    with pytest.raises(UnsupportedSchemaType, match=r": its AVRO definition is not a JSON object, got str$"):
        BrokerSchema(TOPIC, "n", "AVRO", b'"string"', 0).record_definition()
    with pytest.raises(UnsupportedSchemaType, match=r": its JSON definition is not JSON: "):
        BrokerSchema(TOPIC, "n", "JSON", b"{nope", 0).record_definition()


def test_a_broker_that_is_not_there_is_one_line_naming_it_and_the_topic() -> None:
    port = free_port("127.0.0.1")  # nothing listens there
    with BrokerSchemaRegistry(f"pulsar://127.0.0.1:{port}", timeout_s=2) as registry:
        with pytest.raises(RegistryUnreachable) as caught:
            registry.latest(TOPIC)
        with pytest.raises(
            RegistryUnreachable, match=rf"^cannot ask pulsar://127\.0\.0\.1:{port} for schema version 1"
        ):
            registry.version(TOPIC, 1)
    message = str(caught.value)
    assert message.startswith(f"cannot ask pulsar://127.0.0.1:{port} for the latest schema of {TOPIC}: "), message
    assert "\n" not in message and "refused" in message.lower()


class ClosingBroker:
    """A scripted broker on a loopback socket: answers CONNECT and GetSchema (version ``n`` on its ``n``-th
    connection), then closes each connection after one answer, as a broker closes an idle one."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.connections = 0
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            with conn:
                self.connections += 1
                for _ in range(2):  # CONNECT, then one GetSchema
                    header = conn.recv(8, socket.MSG_WAITALL)
                    total, size = struct.unpack(">II", header)
                    cmd = BaseCommand.FromString(conn.recv(total - 4, socket.MSG_WAITALL)[:size])
                    if cmd.type == T.CONNECT:
                        conn.sendall(frame(BaseCommand(type=T.CONNECTED, connected={"server_version": "scripted"})))
                    else:
                        answer = response(
                            schema=Schema(name="n", schema_data=AVRO, type=Schema.AVRO),
                            schema_version=version_bytes(self.connections),
                        )
                        answer.request_id = cmd.getSchema.request_id
                        conn.sendall(frame(BaseCommand(type=T.GET_SCHEMA_RESPONSE, getSchemaResponse=answer)))

    def close(self) -> None:
        self.server.close()


def test_a_kept_connection_the_broker_closed_is_replaced() -> None:
    broker = ClosingBroker()
    try:
        with BrokerSchemaRegistry(f"pulsar://127.0.0.1:{broker.port}", timeout_s=5) as registry:
            assert registry.latest(TOPIC).version == 1
            assert registry.latest(TOPIC).version == 2  # the first connection was closed: asked again on a second
        assert broker.connections == 2
    finally:
        broker.close()
