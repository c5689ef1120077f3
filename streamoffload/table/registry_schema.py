"""A topic's value schema from the broker's schema registry: ``offloadTableSchema = "broker"`` (``schema.BROKER``).

``lookup_value_schema`` is the sync's one hook: the policy's value gives no schema (empty), one of its own (inline or
``@PATH``: ``schema.parse_value_schema``) or the registry's. For the registry's, each sync asks the broker
(``pulsar.schema_registry``) for the topic's latest schema: its record is the table's ``value_decoded`` struct
(evolved as an inline schema's is). ``AVRO`` values are Avro binary; ``JSON`` values are JSON, described by an Avro
record as Pulsar's JSON schema type does (a JSON Schema document, as brokers before protocol version 13 stored, is
read as one). Other types (PROTOBUF, PROTOBUF_NATIVE, KEY_VALUE, STRING, the primitives) stop the sync with one
error naming the type, as do no schema at all and a broker that does not answer (pulsar-lite).

**Versions.** A message carries the version it was written with (``MessageMetadata.schema_version``,
``entry_schema_versions``). One of the sync's latest decodes with it; one of another version decodes with that
version's own schema (asked once per version) where that version evolves into the latest (``schema.check_evolution``:
the latest added optional fields only), the fields it lacks null; otherwise, or when the registry no longer has
it, the value is a dead letter naming the version and why. A message without a version decodes with the latest.
A version newer than the latest the sync asked for (registered since) stops the sync before its commit: the next
sync asks again and evolves the table first.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Protocol

import pyarrow as pa

from streamoffload.checkpoints.keyring import KeyRing
from streamoffload.codecs.entry import decode_entry
from streamoffload.pulsar.schema_registry import (
    BrokerSchema,
    NoSchemaError,
    SchemaRegistryError,
    UnsupportedSchemaType,
    version_number,
)
from streamoffload.read.dataset_plan import ReadTask
from streamoffload.read.dataset_read import OUTPUT_ENTRIES, read_task
from streamoffload.storage.location import ScopedStore
from streamoffload.table.schema import (
    BROKER,
    KEY,
    Decoder,
    TableSchemaError,
    ValueDecodeError,
    ValueSchema,
    check_evolution,
    document_schema,
    parse_value_schema,
)


class SchemaRegistry(Protocol):
    """Where a topic's schemas come from (``pulsar.schema_registry.BrokerSchemaRegistry``)."""

    def latest(self, topic: str) -> BrokerSchema: ...

    def version(self, topic: str, version: int) -> BrokerSchema: ...


def lookup_value_schema(text: str, topic: str, registry: SchemaRegistry | None) -> ValueSchema | None:
    """The value schema the policy's ``offloadTableSchema`` (``text``) gives ``topic``: None when empty; the
    registry's latest for ``broker`` (``TableSchemaError`` without a registry, or when it cannot give one)."""
    if not text:
        return None
    if text != BROKER:
        return parse_value_schema(text, topic)
    if registry is None:
        raise TableSchemaError(f'{topic}: {KEY} = "{BROKER}" needs the broker: give its service URL')
    try:
        latest = registry.latest(topic)
    except SchemaRegistryError as err:
        raise TableSchemaError(f'{KEY} = "{BROKER}": {err}') from None
    return versioned(latest, registry, topic)


def broker_value_schema(schema: BrokerSchema) -> ValueSchema:
    """The value schema of one registry version: Avro binary for ``AVRO``, JSON for ``JSON``."""
    doc = schema.record_definition()
    try:
        return document_schema(doc, json_values=schema.type == "JSON")
    except TableSchemaError as err:
        raise UnsupportedSchemaType(
            f"{schema.topic}: schema version {schema.version} ({schema.type}) in the broker's registry: {err}"
        ) from None


def versioned(latest: BrokerSchema, registry: SchemaRegistry, topic: str) -> ValueSchema:
    """``latest``'s value schema, decoding each message with its own version's schema (module notes)."""
    try:
        table = broker_value_schema(latest)
    except SchemaRegistryError as err:
        raise TableSchemaError(f'{KEY} = "{BROKER}": {err}') from None
    decoders: dict[int, Decoder] = {latest.version: table.decode}

    def refused(reason: str) -> Decoder:
        def decode(value: bytes) -> dict[str, object]:
            raise ValueDecodeError(reason)

        return decode

    def decoder_for(raw: bytes | None) -> Decoder:
        if raw is None:
            return table.decode
        try:
            number = version_number(raw)
        except ValueError as err:
            return refused(f"schema version: {err}")
        if number in decoders:
            return decoders[number]
        if number > latest.version:
            raise TableSchemaError(
                f"{topic}: a message has schema version {number}, newer than version {latest.version} this sync "
                "took from the broker's registry: nothing committed, the next sync evolves the table first"
            )
        try:
            own = broker_value_schema(registry.version(topic, number))
            check_evolution(own.struct, table.struct, topic)
        except (NoSchemaError, UnsupportedSchemaType, TableSchemaError) as err:
            decoders[number] = refused(f"schema version {number} does not decode into version {latest.version}: {err}")
        except SchemaRegistryError as err:  # the broker gone meanwhile: the sync stops, nothing committed
            raise TableSchemaError(f'{KEY} = "{BROKER}": {err}') from None
        else:
            decoders[number] = own.decode
        return decoders[number]

    return dataclasses.replace(table, decoder_for=decoder_for)


def entry_schema_versions(scoped: ScopedStore, task: ReadTask, keyring: KeyRing | None) -> dict[tuple[int, int], bytes]:
    """The ``schema_version`` of each entry of ``task`` that has one, by ``(ledger id, entry id)``: the task's entries
    read a second time (their metadata only is decoded), for topics whose schema has versions."""
    versions: dict[tuple[int, int], bytes] = {}
    for batch in read_task(scoped, task, output=OUTPUT_ENTRIES, keyring=keyring):
        ledgers = batch.column("ledger_id").to_pylist()
        entries = batch.column("entry_id").to_pylist()
        for ledger, entry, data in zip(ledgers, entries, batch.column("entry").to_pylist(), strict=True):
            metadata = decode_entry(data, verify_checksum=False).metadata  # the read checked the CRC
            if metadata.HasField("schema_version"):
                versions[(ledger, entry)] = metadata.schema_version
    return versions


def row_decoders(
    schema: ValueSchema, rows: pa.Table, versions: Callable[[], dict[tuple[int, int], bytes]]
) -> list[Decoder]:
    """The decoder of each of ``rows`` (the table's rows: ``ledger_id``, ``entry_id``): ``schema.decode`` for all of
    them, or for a schema with versions each row's version's (``versions``: ``entry_schema_versions``, read only
    then)."""
    decoder_for = schema.decoder_for
    if decoder_for is None:
        return [schema.decode] * rows.num_rows
    held = versions()
    ledgers = rows.column("ledger_id").to_pylist()
    entries = rows.column("entry_id").to_pylist()
    return [decoder_for(held.get((ledger, entry))) for ledger, entry in zip(ledgers, entries, strict=True)]


__all__ = [
    "SchemaRegistry",
    "broker_value_schema",
    "entry_schema_versions",
    "lookup_value_schema",
    "row_decoders",
    "versioned",
]
