"""The broker's schema registry on Apache Pulsar (``pulsar.schema_registry``, ``table.registry_schema``): topics
published with pulsar-client's ``AvroSchema`` and ``JsonSchema`` records, their schemas read back over ``GetSchema``
and compared with what the admin API says the registry holds, then offloaded by the job and synced into tables with
``offloadTableSchema = "broker"``: typed columns read back with pyiceberg for every message, and a second schema
version with an added optional field evolving the table."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pulsar
import pytest
from pulsar.schema import Array, AvroSchema, Double, Float, Integer, JsonSchema, Long, Map, Record, String

from streamoffload.config import load_config
from streamoffload.pulsar.schema_registry import BrokerSchemaRegistry, NoSchemaError
from streamoffload.pulsar_standalone import PulsarStandalone
from streamoffload.streaming.job.offload_job import OffloadJob
from streamoffload.table.catalog import catalog_settings, open_catalog
from tests.fixtures.job import write_job_config
from tests.pulsar.standalone.broker_truth import held_messages, new_namespace, rest_path


class OrderV1(Record):
    _avro_namespace = "shop"
    id = Long(required=True)
    item = String()
    amount = Double(required=True)


class OrderV2(Record):
    """``OrderV1`` with an optional field added: a second schema version Pulsar's default (FULL) accepts."""

    _avro_namespace = "shop"
    id = Long(required=True)
    item = String()
    amount = Double(required=True)
    note = String(required_default=True)


class Reading(Record):
    id = Long(required=True)


class ReadingAsText(Record):
    """``Reading`` with its field's type changed: a version that cannot be evolved (the namespace allows it)."""

    _avro_namespace = None
    id = String(required=True)


ReadingAsText.__name__ = "Reading"  # the same record name, as a producer that changed the field's type would have


class Event(Record):
    id = Integer(required=True)
    score = Float()
    tags = Array(String())
    labels = Map(String())


def order_v1(n: int) -> OrderV1:
    return OrderV1(id=n, item=None if n % 7 == 3 else f"item-{n}", amount=n * 1.25)


def order_v2(n: int) -> OrderV2:
    return OrderV2(id=n, item=f"item-{n}", amount=n * 1.25, note=None if n % 2 else f"note {n}")


def event(n: int) -> Event:
    return Event(id=n, score=n + 0.5, tags=[f"t{i}" for i in range(n % 3)], labels={"n": str(n)} if n % 2 else {})


def publish(broker: PulsarStandalone, topic: str, schema: Any, records: list[Any]) -> None:
    client = pulsar.Client(broker.service_url, operation_timeout_seconds=60)
    try:
        producer = client.create_producer(
            topic, schema=schema, batching_enabled=True, batching_max_messages=7, batching_max_publish_delay_ms=5
        )
        for record in records:
            producer.send_async(record, None)
        producer.flush()
        producer.close()
    finally:
        client.close()


def admin_schema(broker: PulsarStandalone, topic: str, version: int | None = None) -> Any:
    """The registry's schema of ``topic`` as the admin API shows it (``pulsar-admin schemas get``)."""
    path = f"/admin/v2/schemas/{rest_path(topic)}/schema" + ("" if version is None else f"/{version}")
    return broker.admin("GET", path)


@pytest.mark.pulsar
def test_the_registry_gives_the_schema_the_broker_holds(apache_pulsar: PulsarStandalone) -> None:
    namespace = new_namespace(apache_pulsar, "registry")
    orders, events, plain = (f"persistent://{namespace}/{name}" for name in ("orders", "events", "plain"))
    publish(apache_pulsar, orders, AvroSchema(OrderV1), [order_v1(1)])
    publish(apache_pulsar, orders, AvroSchema(OrderV2), [order_v2(2)])
    publish(apache_pulsar, events, JsonSchema(Event), [event(1)])
    publish(apache_pulsar, plain, pulsar.schema.BytesSchema(), [b"raw"])
    with BrokerSchemaRegistry(apache_pulsar.service_url, timeout_s=30) as registry:
        for topic, version in ((orders, None), (orders, 0), (orders, 1), (events, None)):
            held = admin_schema(apache_pulsar, topic, version)
            got = registry.latest(topic) if version is None else registry.version(topic, version)
            assert (got.type, got.version, got.definition.decode(), dict(got.properties)) == (
                held["type"],
                held["version"],
                held["data"],
                held["properties"],
            ), (topic, version)
            assert got.name == rest_path(topic)
        assert registry.latest(orders).version == 1 and registry.latest(events).type == "JSON"
        # Pulsar's JSON schema type carries an Avro record: the Python client's definition of Event.
        assert registry.latest(events).record_definition() == Event.schema()
        with pytest.raises(NoSchemaError) as caught:
            registry.latest(plain)
        assert str(caught.value).startswith(
            f"the schema registry at 127.0.0.1:{apache_pulsar.port} has no schema for {plain}: "
        )
        with pytest.raises(NoSchemaError, match=rf"has no schema version 5 for {orders}: "):
            registry.version(orders, 5)


def _decoded_rows(table: Any) -> list[tuple[tuple[int, int, int], dict[str, Any] | None]]:
    rows = (
        table.scan()
        .to_arrow()
        .sort_by([("ledger_id", "ascending"), ("entry_id", "ascending"), ("batch_index", "ascending")])
    )
    return [
        ((r["ledger_id"], r["entry_id"], r["batch_index"]), r["value_decoded"])
        for r in rows.select(["ledger_id", "entry_id", "batch_index", "value_decoded"]).to_pylist()
    ]


def _positions(broker: PulsarStandalone, topic: str) -> list[tuple[int, int, int]]:
    return [(m.ledger_id, m.entry_id, m.batch_index) for m in held_messages(broker, topic)]


@pytest.mark.pulsar
@pytest.mark.spark
def test_tables_take_their_schema_from_the_registry_and_evolve_with_it(
    spark: Any, apache_pulsar: PulsarStandalone, tmp_path: Path
) -> None:
    namespace = new_namespace(apache_pulsar, "typed")
    orders, events = f"persistent://{namespace}/orders", f"persistent://{namespace}/events"
    readings = f"persistent://{namespace}/readings"
    apache_pulsar.admin("PUT", f"/admin/v2/namespaces/{namespace}/schemaCompatibilityStrategy", "ALWAYS_COMPATIBLE")
    publish(apache_pulsar, orders, AvroSchema(OrderV1), [order_v1(n) for n in range(40)])
    publish(apache_pulsar, events, JsonSchema(Event), [event(n) for n in range(25)])
    publish(apache_pulsar, readings, AvroSchema(Reading), [Reading(id=n) for n in range(5)])
    publish(apache_pulsar, readings, AvroSchema(ReadingAsText), [ReadingAsText(id=f"r{n}") for n in range(3)])
    topics = [orders, events, readings]
    path = write_job_config(tmp_path, apache_pulsar.service_url, topics=topics, max_message_size=4096)
    with path.open("a") as fh:
        fh.write(f'\n[namespaces."{namespace}"]\noffloadTable = true\noffloadTableSchema = "broker"\n')
    config = load_config(path)
    OffloadJob(config, str(path)).run_once(spark)
    catalog = open_catalog(catalog_settings(config.store.location))

    def expected_v1(n: int) -> dict[str, Any]:
        return {"id": n, "item": None if n % 7 == 3 else f"item-{n}", "amount": n * 1.25}

    table = catalog.load_table((*namespace.split("/"), "orders"))
    rows = _decoded_rows(table)
    assert [p for p, _ in rows] == _positions(apache_pulsar, orders)
    assert [v for _, v in rows] == [expected_v1(n) for n in range(40)]
    assert any(p[2] >= 0 for p, _ in rows)  # batched entries: one schema version for a whole batch
    ev_rows = _decoded_rows(catalog.load_table((*namespace.split("/"), "events")))
    assert [p for p, _ in ev_rows] == _positions(apache_pulsar, events)
    assert [v for _, v in ev_rows] == [
        {"id": n, "score": n + 0.5, "tags": [f"t{i}" for i in range(n % 3)], "labels": [("n", str(n))] if n % 2 else []}
        for n in range(25)
    ]
    for topic in (orders, events):  # every value decoded: no dead letters
        dead = catalog.load_table((*namespace.split("/"), topic.rsplit("/", 1)[1] + "__dead_letters"))
        assert dead.scan().to_arrow().num_rows == 0
    # A topic whose latest version changed a field's type: the table is the latest's, and the first version's values,
    # which do not evolve into it, are dead letters naming their version and the field.
    held = _positions(apache_pulsar, readings)
    assert _decoded_rows(catalog.load_table((*namespace.split("/"), "readings"))) == list(
        zip(held, [None] * 5 + [{"id": f"r{n}"} for n in range(3)], strict=True)
    )
    dead_rows = catalog.load_table((*namespace.split("/"), "readings__dead_letters")).scan().to_arrow().to_pylist()
    assert sorted((d["ledger_id"], d["entry_id"], d["batch_index"], d["error"]) for d in dead_rows) == [
        (
            *position,
            f"schema version 0 does not decode into version 1: {readings}: offloadTableSchema changes the type of "
            "'id' from long to string",
        )
        for position in held[:5]
    ]

    # A second version adds an optional field: the table gains the column, the first version's rows read it null,
    # and they still decode with their own version (Avro binary of version 0 does not decode with version 1's).
    publish(apache_pulsar, orders, AvroSchema(OrderV2), [order_v2(n) for n in range(40, 70)])
    assert admin_schema(apache_pulsar, orders)["version"] == 1
    OffloadJob(config, str(path)).run_once(spark)
    table = catalog.load_table((*namespace.split("/"), "orders"))
    struct = table.schema().find_field("value_decoded").field_type
    assert [f.name for f in struct.fields] == ["id", "item", "amount", "note"]
    rows = _decoded_rows(table)
    assert [p for p, _ in rows] == _positions(apache_pulsar, orders)
    assert [v for _, v in rows] == [{**expected_v1(n), "note": None} for n in range(40)] + [
        {"id": n, "item": f"item-{n}", "amount": n * 1.25, "note": None if n % 2 else f"note {n}"}
        for n in range(40, 70)
    ]
    dead = catalog.load_table((*namespace.split("/"), "orders__dead_letters"))
    assert dead.scan().to_arrow().num_rows == 0
