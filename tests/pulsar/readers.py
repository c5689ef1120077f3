"""What the source's reader tests share: the two range readers (``client_reader`` over pulsar-client, ``raw_reader``
over the binary protocol) behind one interface, so the exactness tests run once on each; the checks of what
they read; and publishing through pulsar-client with every codec and metadata field set."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pulsar

from streamoffload.codecs.entry import CompressionType, entry_messages
from streamoffload.codecs.positions import Position
from streamoffload.produce import expected_key, expected_payload, expected_properties
from streamoffload.pulsar import client_reader
from streamoffload.pulsar import raw_reader as rr
from streamoffload.pulsar.exactly_once import ReadEntry

READERS = ("client", "raw")

CODECS = {
    "NONE": (pulsar.CompressionType.NONE, CompressionType.NONE),
    "LZ4": (pulsar.CompressionType.LZ4, CompressionType.LZ4),
    "ZLIB": (pulsar.CompressionType.ZLib, CompressionType.ZLIB),
    "ZSTD": (pulsar.CompressionType.ZSTD, CompressionType.ZSTD),
    "SNAPPY": (pulsar.CompressionType.SNAPPY, CompressionType.SNAPPY),
}
"""Codec name -> (pulsar-client's compression type, the wire's)."""


@dataclass
class RangeReader:
    """One of the two readers of exact position ranges, with its client."""

    kind: str
    client: Any

    def latest(self, topic: str) -> Position | None:
        if self.kind == "raw":
            return rr.latest_position_raw(self.client, topic)
        return client_reader.latest_position(self.client, topic)

    def read(self, topic: str, start: Position, end: Position, **kwargs: Any) -> Iterator[ReadEntry]:
        read_range = rr.read_range_raw if self.kind == "raw" else client_reader.read_range
        return read_range(self.client, topic, start, end, **kwargs)

    def close(self) -> None:
        self.client.close()


def open_reader(kind: str, service_url: str, options: Mapping[str, str] | None = None) -> RangeReader:
    client = rr.RawClient(service_url, options) if kind == "raw" else client_reader.make_client(service_url, options)
    return RangeReader(kind, client)


def check_messages(entries: list[ReadEntry], topic: str, payload_size: int, keys: int = 0, first_seq: int = 0) -> int:
    """Every message in order, with the payload, key and properties `produce` gave it; returns the count."""
    seq = first_seq
    for entry in entries:
        messages = entry_messages(entry.payload)
        assert len(messages) == entry.num_messages
        for msg in messages:
            assert bytes(msg.payload) == expected_payload(topic, seq, payload_size), (entry.position, seq)
            assert msg.key == expected_key(seq, keys)
            assert msg.properties == expected_properties(seq, {"src": "io"})
            assert msg.publish_time == entry.publish_time
            seq += 1
    return seq - first_seq


def assert_strictly_increasing(entries: list[ReadEntry]) -> None:
    positions = [e.position for e in entries]
    assert positions == sorted(set(positions)), "positions repeat or go backwards"


def send_with_client(
    service_url: str,
    topic: str,
    messages: list[dict[str, Any]],
    *,
    producer_name: str,
    codec: str,
    batched: bool,
    batch_max: int,
    delay_ms: int,
) -> None:
    """Publish ``messages`` in order through pulsar-client: each a dict of ``payload`` (None: a null value),
    ``key`` (None: none), ``properties``, ``event_time`` and ``sequence_id``."""
    client = pulsar.Client(service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    try:
        producer = client.create_producer(
            topic,
            producer_name=producer_name,
            compression_type=CODECS[codec][0],
            batching_enabled=batched,
            batching_max_messages=batch_max,
            batching_max_publish_delay_ms=delay_ms,
        )
        for msg in messages:
            kwargs: dict[str, Any] = {
                "properties": msg["properties"],
                "event_timestamp": msg["event_time"],
                "sequence_id": msg["sequence_id"],
            }
            if msg["key"] is not None:
                kwargs["partition_key"] = msg["key"]
            producer.send_async(msg["payload"], None, **kwargs)
        producer.flush()
        producer.close()
    finally:
        client.close()
