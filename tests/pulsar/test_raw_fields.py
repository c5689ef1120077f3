"""Fields ``pulsar-client`` cannot publish, carried by the raw-entry reader into the store.

End to end (real pulsar-lite, real Spark, the offload job into a filesystem store): entries with an
empty key (as opposed to a missing one, both unbatched and inside a batch), a ``null_partition_key``,
a ``schema_version`` and a ``highest_sequence_id`` are published with the protocol-level producer of
``tests/fixtures/raw_producer.py``. The stored entries are byte for byte what the broker hands out
and decode to exactly those fields.

What pulsar-lite does to them (found here): it delivers every entry **without its ``0x0e01``
checksum section** (magic and CRC-32C, 6 bytes), whoever produced it (pulsar-client too); everything after that
-- metadata size, ``MessageMetadata``, payload -- is byte for byte what the producer sent. So on
pulsar-lite the stored entries are the sent bytes minus those 6 bytes, and no CRC-32C can be checked on
receipt (``decode_entry`` accepts such entries, as Pulsar does for pre-v6 clients). A real broker keeps
the checksum; the raw reader verifies it then (the scripted-broker tests of ``test_raw_reader.py``).

Unit level (a scripted broker, crafted frames): an entry behind broker entry metadata (``0x0e02``,
PIP-70), which pulsar-lite never produces.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from streamoffload.codecs.entry import (
    MAGIC_CRC32C,
    Message,
    MessageMetadata,
    build_entry,
    crc32c,
    decode_entry,
    encode_entry,
    entry_messages,
    parse_broker_entry_metadata,
)
from streamoffload.codecs.proto.pulsar_api_pb2 import BrokerEntryMetadata
from streamoffload.config import load_config
from streamoffload.embedded_broker import EmbeddedBroker
from streamoffload.pulsar import raw_reader as rr
from streamoffload.pulsar.exactly_once import BEFORE_EARLIEST, PulsarIOError, ReaderSettings, ReadStats
from streamoffload.streaming.job.offload_job import OffloadJob
from tests.fixtures.broker import unique_topic
from tests.fixtures.job import fs_store, write_config
from tests.fixtures.raw_producer import RawProducer
from tests.fixtures.readback import read_entries
from tests.pulsar.test_raw_reader import FAST, ScriptedBroker, scripted  # noqa: F401 (fixture)

SCHEMA_V3 = (3).to_bytes(8, "big")  # Pulsar's schema versions are 8-byte big-endian longs
CHECKSUM_SECTION = 6  # u16 magic 0x0e01 + u32 CRC-32C


def _with(entry: bytes, **fields: Any) -> bytes:
    """``entry`` with extra ``MessageMetadata`` fields set, re-encoded (fresh CRC-32C)."""
    decoded = decode_entry(entry)
    md = MessageMetadata()
    md.CopyFrom(decoded.metadata)
    for name, value in fields.items():
        setattr(md, name, value)
    return encode_entry(md, bytes(decoded.payload))


def _entries() -> list[tuple[bytes, int, int]]:
    """``(entry bytes, sequence id, message count)`` of what the test publishes, in order."""
    empty_key = build_entry(
        [Message(b"empty key", key="", properties={"k": "empty"}, event_time=1_700_000_000_001)],
        producer_name="raw-fields",
        sequence_id=41,
        publish_time=1_750_000_000_001,
        batched=False,
    )
    schema = _with(
        build_entry(
            [Message(b"with schema v3", key="k1")],
            producer_name="raw-fields",
            sequence_id=42,
            publish_time=1_750_000_000_002,
            batched=False,
        ),
        schema_version=SCHEMA_V3,
    )
    null_key = _with(
        build_entry(
            [Message(b"null key")],
            producer_name="raw-fields",
            sequence_id=43,
            publish_time=1_750_000_000_003,
            batched=False,
        ),
        null_partition_key=True,
    )
    batch = _with(
        build_entry(
            [Message(b"b0", key=""), Message(b"b1", key="k"), Message(b"b2"), Message(b"b3", key="", sequence_id=60)],
            producer_name="raw-fields",
            sequence_id=50,
            publish_time=1_750_000_000_004,
            batched=True,
        ),
        schema_version=SCHEMA_V3,
    )
    return [(empty_key, 41, 1), (schema, 42, 1), (null_key, 43, 1), (batch, 50, 4)]


def _check_fields(stored: list[bytes]) -> None:
    """The stored entries decode to exactly the published fields."""
    assert len(stored) == 4
    one = entry_messages(stored[0])[0]
    assert one.key == "" and decode_entry(stored[0]).metadata.HasField("partition_key")  # empty, not missing
    assert (bytes(one.payload), one.properties, one.event_time, one.sequence_id) == (
        b"empty key",
        {"k": "empty"},
        1_700_000_000_001,
        41,
    )
    md = decode_entry(stored[1]).metadata
    assert md.schema_version == SCHEMA_V3 and md.partition_key == "k1" and md.sequence_id == 42
    md = decode_entry(stored[2]).metadata
    assert md.null_partition_key and entry_messages(stored[2])[0].key is None
    decoded = decode_entry(stored[3])
    assert decoded.metadata.schema_version == SCHEMA_V3 and decoded.metadata.highest_sequence_id == 60
    batch = entry_messages(stored[3])
    assert [m.key for m in batch] == ["", "k", None, ""]
    assert [bytes(m.payload) for m in batch] == [b"b0", b"b1", b"b2", b"b3"]
    assert [m.sequence_id for m in batch] == [50, 51, 52, 60]


@pytest.mark.spark
@pytest.mark.broker
def test_empty_key_null_key_and_schema_version_reach_the_store(
    spark: Any, pulsar_broker: EmbeddedBroker, tmp_path: Path
) -> None:
    topic = unique_topic("raw-fields")
    sent = _entries()
    with RawProducer(pulsar_broker.service_url, topic, producer_name="raw-fields") as producer:
        positions = [producer.send(entry, seq, count) for entry, seq, count in sent]
    assert positions == sorted(positions) and len(set(positions)) == 4

    # What pulsar-lite hands out: the sent bytes after their checksum section.
    raw = rr.RawClient(pulsar_broker.service_url)
    stats = ReadStats()
    direct = list(rr.read_range_raw(raw, topic, BEFORE_EARLIEST, positions[-1], settings=FAST, stats=stats))
    for (entry, _seq, count), got in zip(sent, direct, strict=True):
        assert int.from_bytes(entry[:2], "big") == MAGIC_CRC32C
        assert int.from_bytes(entry[2:6], "big") == crc32c(entry[CHECKSUM_SECTION:])
        assert got.payload == entry[CHECKSUM_SECTION:], "pulsar-lite changed more than the checksum section"
        assert decode_entry(got.payload).checksum is None and got.num_messages == count
    assert stats.messages == 7

    config_path = write_config(tmp_path, pulsar_broker.service_url, [topic], fs_store(tmp_path))
    config = load_config(config_path)
    OffloadJob(config, str(config_path)).run_once(spark)
    stored = read_entries(config.store.location.open(), topic)
    assert [(ledger, entry) for ledger, entry, _ in stored] == positions
    assert [data for _, _, data in stored] == [e.payload for e in direct]  # byte for byte what the broker has
    _check_fields([data for _, _, data in stored])


def test_broker_entry_metadata_prefix_passes_through(scripted: Any) -> None:  # noqa: F811 (the fixture)
    """A crafted ``0x0e02`` entry: emitted untouched, its message count read past the prefix, and its
    CRC-32C (which covers only what follows the ``0x0e01`` magic) still checked."""
    inner = build_entry([Message(b"x", key=""), Message(b"y")], producer_name="p", sequence_id=9, publish_time=77)
    prefixed = encode_entry(
        decode_entry(inner).metadata,
        bytes(decode_entry(inner).payload),
        broker_entry_metadata=BrokerEntryMetadata(broker_timestamp=1_750_000_000_999, index=41),
    )
    assert prefixed[:2] == b"\x0e\x02" and prefixed.endswith(inner)
    corrupt = bytearray(prefixed)
    corrupt[-1] ^= 1
    broker: ScriptedBroker = scripted(entries=[(7, 0, prefixed), (7, 1, bytes(corrupt))])
    stats = ReadStats()
    budget = ReaderSettings(stall_timeout_ms=100, max_stall_timeout_ms=100, retry_timeout_s=0.5)
    it = rr.read_range_raw(rr.RawClient(broker.url), "t", BEFORE_EARLIEST, (7, 1), settings=budget, stats=stats)
    first = next(it)
    assert first.payload == prefixed and first.num_messages == 2 and first.publish_time == 77
    decoded = decode_entry(first.payload)
    assert decoded.broker_entry_metadata is not None
    meta = parse_broker_entry_metadata(decoded.broker_entry_metadata)
    assert (meta.broker_timestamp, meta.index) == (1_750_000_000_999, 41)
    assert [m.key for m in entry_messages(first.payload)] == ["", None]
    with pytest.raises(PulsarIOError, match=r"no progress .* last problem: receiving: .*checksum mismatch"):
        next(it)  # the corrupt copy is refused every time it is delivered
    assert stats.errors >= 1
