"""What Apache Pulsar holds, read with ``pulsar-client`` (not with the code under test), and its admin calls the
tier's tests share."""

from __future__ import annotations

import uuid

import pulsar

from streamoffload.pulsar_standalone import PulsarStandalone
from tests.fixtures.readback import ReadMessage


def held_messages(broker: PulsarStandalone, topic_partition: str) -> list[ReadMessage]:
    """Every message the broker holds on ``topic_partition``, from the earliest, with its position (as
    ``tests.fixtures.readback`` reads the store's, so the two compare as they are)."""
    client = pulsar.Client(broker.service_url, operation_timeout_seconds=60)
    try:
        reader = client.create_reader(topic_partition, pulsar.MessageId.earliest)
        out = []
        while reader.has_message_available():
            m = reader.read_next(60_000)
            mid = m.message_id()
            key = m.partition_key() or None
            out.append(ReadMessage(mid.ledger_id(), mid.entry_id(), mid.batch_index(), m.data(), key, m.properties()))
        return out
    finally:
        client.close()


def new_namespace(broker: PulsarStandalone, prefix: str) -> str:
    """A fresh namespace of tenant ``public`` (``public/<prefix>-<hex>``), created through the admin API."""
    namespace = f"public/{prefix}-{uuid.uuid4().hex[:8]}"
    broker.admin("PUT", f"/admin/v2/namespaces/{namespace}")
    return namespace


def create_partitioned(broker: PulsarStandalone, topic: str, partitions: int) -> None:
    """A partitioned topic (``pulsar-admin topics create-partitioned-topic``)."""
    broker.admin("PUT", f"/admin/v2/persistent/{rest_path(topic)}/partitions", partitions)


def internal_ledgers(broker: PulsarStandalone, topic_partition: str) -> list[int]:
    """The ledger ids the managed ledger lists now (``pulsar-admin topics stats-internal``)."""
    stats = broker.admin("GET", f"/admin/v2/persistent/{rest_path(topic_partition)}/internalStats")
    return [int(ledger["ledgerId"]) for ledger in stats["ledgers"]]


def rest_path(topic: str) -> str:
    """``tenant/namespace/local`` of a ``persistent://`` name, as the admin API's paths take it."""
    return topic.removeprefix("persistent://")
