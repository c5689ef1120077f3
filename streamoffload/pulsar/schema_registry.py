"""A topic's schema from the broker's schema registry, over the binary protocol's ``GetSchema``.

``GetSchema`` (``codecs/proto/pulsar_api.proto``: ``CommandGetSchema`` -> ``CommandGetSchemaResponse``) names a
topic and optionally a version; the broker answers with the schema its registry holds for the topic (the latest,
or that version) and the version's number. Any broker of the cluster answers it (the registry is the cluster's, not
the owner's), so :class:`BrokerSchemaRegistry` asks the service URL's broker and does no lookup. A partitioned
topic's partitions share the partitioned topic's schema: the partition suffix is dropped, as the broker does.

Versions are numbered 0, 1, 2, ... per topic; on the wire (here and in ``MessageMetadata.schema_version``) a
version is its number as 8 bytes, big-endian (:func:`version_bytes`, :func:`version_number`).

What can go wrong, each one line naming the topic and the broker:

- :class:`NoSchemaError`: the topic has no schema (or not that version). Apache Pulsar answers ``TopicNotFound``
  with "Topic not found or no-schema" for both, and for a topic that does not exist.
- :class:`GetSchemaUnsupported`: the broker takes the connection but never answers ``GetSchema`` (pulsar-lite 0.2).
- :class:`RegistryUnreachable`: no connection (refused, reset, TLS) or no answer within the timeout.
- :class:`UnsupportedSchemaType`: a schema that is not a record (PROTOBUF, PROTOBUF_NATIVE, KEY_VALUE, STRING, the
  primitives, ...), raised by :meth:`BrokerSchema.record_definition`; the registry's answer itself is any type.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import struct
from collections.abc import Mapping
from dataclasses import dataclass

from google.protobuf.message import DecodeError

from streamoffload.codecs.proto.pulsar_api_pb2 import BaseCommand, CommandGetSchemaResponse, Schema, ServerError
from streamoffload.codecs.topics import TopicName
from streamoffload.pulsar.broker_connection import BrokerConnection, NoAnswerError
from streamoffload.pulsar.client_options import ConnectionConfig
from streamoffload.pulsar.exactly_once import PulsarIOError
from streamoffload.pulsar.wire import T, server_error
from streamoffload.redaction import redact

_VERSION = struct.Struct(">q")
RECORD_TYPES = ("AVRO", "JSON")
"""The schema types whose definition is a record (an Avro record schema, as JSON text): the ones a table decodes."""


class SchemaRegistryError(PulsarIOError):
    """The broker's schema registry could not give a topic's schema."""


class NoSchemaError(SchemaRegistryError):
    """The registry holds no schema for the topic (or not the version asked for)."""


class UnsupportedSchemaType(SchemaRegistryError):
    """The topic's schema is of a type whose values are not records (PROTOBUF, KEY_VALUE, STRING, ...)."""


class RegistryUnreachable(SchemaRegistryError):
    """No connection to the broker, or no answer from it within the timeout."""


class GetSchemaUnsupported(RegistryUnreachable):
    """The broker connected but does not answer ``GetSchema`` (pulsar-lite 0.2 ignores the command)."""


def version_bytes(version: int) -> bytes:
    """A schema version as the protocol carries it: 8 bytes, big-endian."""
    return _VERSION.pack(version)


def version_number(raw: bytes) -> int:
    """A schema version's number from its 8 bytes (``MessageMetadata.schema_version``, the response's)."""
    if len(raw) != _VERSION.size:
        raise ValueError(f"a schema version is {_VERSION.size} bytes, got {len(raw)}: {raw.hex()}")
    return int(_VERSION.unpack(raw)[0])


def schema_topic(topic: str) -> str:
    """The topic whose schema a topic has, in full: a partition's partitioned topic (``-partition-N`` dropped)."""
    return str(TopicName.parse(topic).base)


@dataclass(frozen=True)
class BrokerSchema:
    """One version of a topic's schema, as the registry holds it."""

    topic: str
    """The topic asked about (a partitioned topic's partitions share its schema)."""
    name: str
    """The registry's name of the schema (``tenant/namespace/topic``)."""
    type: str
    """Pulsar's schema type as Java's SchemaType names it: ``AVRO``, ``JSON``, ``PROTOBUF``, ``KEY_VALUE``, ..."""
    definition: bytes
    """The schema's data, byte for byte as the registry holds it (for AVRO and JSON: an Avro schema as JSON)."""
    version: int
    properties: tuple[tuple[str, str], ...] = ()

    def record_definition(self) -> dict[str, object]:
        """The definition of an AVRO or JSON schema as a JSON object: Pulsar's JSON schema carries an Avro record
        schema too (since protocol version 13; brokers before that stored a JSON Schema document, which is
        returned as it is). :class:`UnsupportedSchemaType` for any other type, or a definition that is no object."""
        where = f"{self.topic}: schema version {self.version} in the broker's registry"
        if self.type not in RECORD_TYPES:
            raise UnsupportedSchemaType(
                f"{where} is of type {self.type}: only AVRO and JSON schemas (records) decode into table columns"
            )
        try:
            doc: object = json.loads(self.definition)
        except ValueError as err:
            raise UnsupportedSchemaType(f"{where}: its {self.type} definition is not JSON: {err}") from None
        if not isinstance(doc, dict):
            raise UnsupportedSchemaType(
                f"{where}: its {self.type} definition is not a JSON object, got {type(doc).__name__}"
            )
        return doc


def get_schema_command(request_id: int, topic: str, version: int | None = None) -> BaseCommand:
    """``GetSchema`` for ``topic``'s schema: the latest, or ``version``."""
    cmd = BaseCommand(type=T.GET_SCHEMA)
    cmd.getSchema.request_id = request_id
    cmd.getSchema.topic = schema_topic(topic)
    if version is not None:
        cmd.getSchema.schema_version = version_bytes(version)
    return cmd


def parse_schema_response(
    response: CommandGetSchemaResponse, topic: str, broker: str, version: int | None = None
) -> BrokerSchema:
    """The schema a ``GetSchemaResponse`` carries for ``topic`` (its ``version``, None: the latest, asked of
    ``broker``); its error as an exception."""
    where = f"{topic} at {broker}"
    if response.HasField("error_code"):
        reason = response.error_message or "no reason given"
        if response.error_code == ServerError.TopicNotFound:
            which = "no schema" if version is None else f"no schema version {version}"
            raise NoSchemaError(f"the schema registry at {broker} has {which} for {topic}: {reason}")
        raise SchemaRegistryError(f"GetSchema of {where} failed: {reason} ({server_error(response.error_code)})")
    if not response.HasField("schema"):
        raise SchemaRegistryError(f"GetSchema of {where}: the answer carries neither a schema nor an error")
    if not response.HasField("schema_version"):
        raise SchemaRegistryError(f"GetSchema of {where}: the answer carries no schema version")
    try:
        held = version_number(response.schema_version)
    except ValueError as err:
        raise SchemaRegistryError(f"GetSchema of {where}: {err}") from None
    if version is not None and held != version:
        raise SchemaRegistryError(f"GetSchema of {where}: asked for schema version {version}, got {held}")
    schema = response.schema
    kind = Schema.Type.Name(schema.type) if schema.type in Schema.Type.values() else str(schema.type)
    return BrokerSchema(
        topic=topic,
        name=schema.name,
        type=kind,
        definition=schema.schema_data,
        version=held,
        properties=tuple((p.key, p.value) for p in schema.properties),
    )


def get_schema(conn: BrokerConnection, topic: str, version: int | None = None) -> BrokerSchema:
    """``topic``'s schema (the latest, or ``version``) from the broker of ``conn``."""
    rid = conn.next_request_id()
    answer = conn.request(get_schema_command(rid, topic, version), rid, f"GetSchema of {topic}")
    return parse_schema_response(answer.getSchemaResponse, topic, conn.name, version)


class BrokerSchemaRegistry:
    """Topics' schemas from the broker at ``service_url``: :meth:`latest` asks every time, :meth:`version` once per
    topic and version (a version never changes). One connection, opened at the first question and kept (a kept
    one that fails is replaced once: the broker closes idle connections); ``close`` closes it. ``client_options``
    are the source's ``pulsar.client.*`` options without the prefix (authentication, TLS)."""

    def __init__(
        self,
        service_url: str,
        client_options: Mapping[str, str] | None = None,
        *,
        timeout_s: float | None = None,
    ) -> None:
        self.service_url = service_url
        self.broker = redact(service_url)
        self.timeout_s = timeout_s
        """Both the connect and the answer timeout; None: the client options' (connectionTimeoutMs,
        operationTimeoutSeconds: 10 s and 30 s by default, as Pulsar's clients)."""
        self._timeout_s = 0.0
        self._options = dict(client_options or {})
        self._conn: BrokerConnection | None = None
        self._versions: dict[tuple[str, int], BrokerSchema] = {}

    def latest(self, topic: str) -> BrokerSchema:
        """``topic``'s newest schema."""
        schema = self._ask(topic, None)
        self._versions[(schema_topic(topic), schema.version)] = schema
        return schema

    def version(self, topic: str, version: int) -> BrokerSchema:
        """Version ``version`` of ``topic``'s schema."""
        key = (schema_topic(topic), version)
        if key not in self._versions:
            self._versions[key] = self._ask(topic, version)
        return self._versions[key]

    def _ask(self, topic: str, version: int | None) -> BrokerSchema:
        asked = "the latest schema" if version is None else f"schema version {version}"
        asked = f"cannot ask {self.broker} for {asked} of {topic}"
        kept = self._conn is not None
        try:
            return get_schema(self._connection(asked), topic, version)
        except NoAnswerError:
            self.close()
            if kept:  # a kept connection may be half-open: a new one tells
                return self._ask(topic, version)
            raise GetSchemaUnsupported(
                f"{asked}: no answer to GetSchema within {self._timeout_s:g} s (pulsar-lite has no "
                "schema registry: give offloadTableSchema inline or as @FILE instead)"
            ) from None
        except SchemaRegistryError:
            raise
        except (PulsarIOError, OSError, DecodeError) as err:  # an ERROR answer, a reset, a broken frame
            self.close()
            if not kept:
                raise RegistryUnreachable(redact(f"{asked}: {str(err) or type(err).__name__}")) from None
        # A kept connection the broker closed meanwhile (idle, or the broker restarted): once more, on a new one.
        return self._ask(topic, version)

    def _connection(self, asked: str) -> BrokerConnection:
        if self._conn is None:
            # Parsed here, not at construction: a job whose topics never ask holds a registry it cannot use harmlessly.
            config = ConnectionConfig.parse(self.service_url, self._options)
            if self.timeout_s is not None:
                config = dataclasses.replace(
                    config, connect_timeout_s=self.timeout_s, operation_timeout_s=self.timeout_s
                )
            self._timeout_s = config.operation_timeout_s
            try:
                self._conn = BrokerConnection(config, config.service)
            except (PulsarIOError, OSError, DecodeError) as err:  # refused, unresolvable, TLS, no CONNECTED
                raise RegistryUnreachable(redact(f"{asked}: {str(err) or type(err).__name__}")) from None
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(OSError):
                self._conn.close()
            self._conn = None

    def __enter__(self) -> BrokerSchemaRegistry:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = [
    "RECORD_TYPES",
    "BrokerSchema",
    "BrokerSchemaRegistry",
    "GetSchemaUnsupported",
    "NoSchemaError",
    "RegistryUnreachable",
    "SchemaRegistryError",
    "UnsupportedSchemaType",
    "get_schema",
    "get_schema_command",
    "parse_schema_response",
    "schema_topic",
    "version_bytes",
    "version_number",
]
