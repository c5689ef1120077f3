"""The Spark source end to end on its default reader, the raw-entry reader (``reader=raw``), and on the
``pulsar-client`` fallback (``reader=client``), against the embedded broker.

Messages are published with ``pulsar-client`` under each compression codec, batched and not, with
explicit (non-consecutive) sequence ids, a producer name, properties, event times, keys and a null
value. On the raw reader the rows' entries are the stored bytes: they decode to exactly those fields and
payloads, compressed batches stay compressed, and each row equals what ``read_range_raw`` reads directly.
The client reader rebuilds entries: the same payloads, keys and properties, but uncompressed.

Not covered here, because pulsar-client cannot produce them against pulsar-lite: an empty (as opposed to
missing) key (the Python client drops an empty partition key) and a schema version (pulsar-lite assigns
none); the raw reader carries both untouched as metadata bytes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from streamoffload.codecs.entry import CompressionType, decode_entry, entry_messages
from streamoffload.embedded_broker import EmbeddedBroker
from streamoffload.errors import ConfigError
from streamoffload.pulsar import raw_reader as rr
from streamoffload.pulsar.exactly_once import BEFORE_EARLIEST
from streamoffload.streaming.source.offset_planner import SourcePlanner
from streamoffload.streaming.source.source_options import SourceOptions
from tests.fixtures.broker import unique_topic
from tests.pulsar.readers import CODECS, send_with_client
from tests.streaming.source.test_source_stream import rows_of, run_available_now, source_options

pytestmark = [pytest.mark.spark, pytest.mark.broker]

COUNT = 30
BATCH = 10


def publish(service_url: str, topic: str, codec: str, batched: bool) -> list[dict[str, Any]]:
    """Publish COUNT messages through pulsar-client; returns what was sent, in order."""
    sent: list[dict[str, Any]] = [
        {
            # compressible payloads, so a compressed batch is visibly smaller than its messages
            "payload": None if i == 7 else f"{topic} message {i:04d} ".encode() * 8,
            "key": f"k{i % 4}" if i % 5 else None,
            "properties": {"i": str(i), "codec": codec},
            "event_time": 1_750_000_000_000 + 3 * i,
            "sequence_id": 10_000 + 7 * i,
        }
        for i in range(COUNT)
    ]
    send_with_client(
        service_url,
        topic,
        sent,
        producer_name=f"src-{codec}-{int(batched)}",
        codec=codec,
        batched=batched,
        batch_max=BATCH,
        delay_ms=1000,
    )
    return sent


@pytest.fixture(scope="module")
def published(pulsar_broker: EmbeddedBroker) -> dict[str, tuple[str, bool, list[dict[str, Any]]]]:
    """One topic per codec and batching: ``{topic: (codec, batched, sent)}``."""
    out: dict[str, tuple[str, bool, list[dict[str, Any]]]] = {}
    for codec in CODECS:
        for batched in (False, True):
            topic = unique_topic(f"src-raw-{codec.lower()}-{'b' if batched else 'u'}")
            out[topic] = (codec, batched, publish(pulsar_broker.service_url, topic, codec, batched))
    return out


def rows_by_topic(rows: list[Any]) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for row in sorted(rows, key=lambda r: (r.topic, r.ledger_id, r.entry_id)):
        out.setdefault(row.topic, []).append(row)
    return out


def check_messages(topic: str, rows: list[Any], sent: list[dict[str, Any]], *, exact: bool) -> None:
    """The rows' messages are the published ones; ``exact``: also the producer's sequence ids, producer
    name and null value (what only the stored bytes carry)."""
    received = []
    for row in rows:
        assert row.size == len(row.entry)
        messages = entry_messages(row.entry)
        assert len(messages) == row.num_messages
        received += messages
    assert len(received) == len(sent), topic
    for msg, got in zip(sent, received, strict=True):
        assert bytes(got.payload) == (msg["payload"] or b""), (topic, msg["sequence_id"])
        assert got.key == msg["key"]
        assert got.properties == msg["properties"]
        assert got.event_time == msg["event_time"]
        if exact:
            assert got.sequence_id == msg["sequence_id"]
            assert got.null_value == (msg["payload"] is None)
            assert got.producer_name.startswith("src-")


def test_raw_reader_rows_are_the_stored_entries(
    spark: Any,
    pulsar_broker: EmbeddedBroker,
    published: dict[str, tuple[str, bool, list[dict[str, Any]]]],
    tmp_path: Path,
) -> None:
    url = pulsar_broker.service_url
    options = source_options(url, topics=",".join(published))  # reader=raw is the default
    assert SourceOptions.parse(options).reader == "raw"
    batches, _progress = run_available_now(spark, options, tmp_path / "cp")
    by_topic = rows_by_topic(rows_of(batches))
    assert set(by_topic) == set(published)
    raw = rr.RawClient(url)
    for topic, (codec, batched, sent) in published.items():
        rows = by_topic[topic]
        assert len({(r.ledger_id, r.entry_id) for r in rows}) == len(rows), f"{topic}: an entry twice"
        check_messages(topic, rows, sent, exact=True)
        if batched:
            assert len(rows) < COUNT, f"{topic}: batches were not kept as entries"
        else:
            assert len(rows) == COUNT
        for row in rows:
            decoded = decode_entry(row.entry)  # the producer's CRC-32C still holds
            md = decoded.metadata
            assert md.compression == CODECS[codec][1]
            assert md.publish_time == int(row.publish_time.timestamp() * 1000)
            if codec != "NONE" and row.num_messages > 1:
                assert len(decoded.payload) < md.uncompressed_size, f"{topic}: a compressed batch was inflated"
        # byte for byte what the raw reader reads directly from the broker
        end = rr.latest_position_raw(raw, topic)
        assert end is not None
        direct = list(rr.read_range_raw(raw, topic, BEFORE_EARLIEST, end))
        assert [(e.ledger_id, e.entry_id, e.payload) for e in direct] == [
            (r.ledger_id, r.entry_id, bytes(r.entry)) for r in rows
        ]


def test_client_reader_rebuilds_entries_uncompressed(
    spark: Any,
    pulsar_broker: EmbeddedBroker,
    published: dict[str, tuple[str, bool, list[dict[str, Any]]]],
    tmp_path: Path,
) -> None:
    url = pulsar_broker.service_url
    topics = [t for t, (codec, _b, _s) in published.items() if codec in ("NONE", "ZSTD")]
    options = source_options(url, topics=",".join(topics), reader="client")
    batches, _progress = run_available_now(spark, options, tmp_path / "cp")
    by_topic = rows_by_topic(rows_of(batches))
    assert set(by_topic) == set(topics)
    for topic in topics:
        _codec, batched, sent = published[topic]
        rows = by_topic[topic]
        check_messages(topic, rows, sent, exact=False)
        for row in rows:
            # the fallback's known loss: the client inflates, build_entry stores uncompressed
            assert decode_entry(row.entry).metadata.compression == CompressionType.NONE
        if batched:
            assert len(rows) < COUNT
            # and renumbers sequence ids: not the producer's 10000 + 7 i
            assert [m.sequence_id for m in entry_messages(rows[0].entry)][:2] != [10_000, 10_007]


@pytest.mark.parametrize("reader", ["raw", "client"])
def test_planner_positions_and_probes_on_both_readers(pulsar_broker: EmbeddedBroker, reader: str) -> None:
    url = pulsar_broker.service_url
    topic = unique_topic(f"planner-{reader}")
    publish(url, topic, "LZ4", batched=True)
    options = SourceOptions.parse(source_options(url, topics=topic, reader=reader))
    planner = SourcePlanner(options)
    try:
        start = planner.initial_offset()
        end = planner.latest_offset(start, None, 1)  # a byte limit: the size comes from a probe
        assert end[topic][1] == 0, end  # one entry admitted alone
        probed = planner.backlog()[topic].bytes
        assert probed is not None
        raw = rr.RawClient(url)
        entries = list(rr.read_range_raw(raw, topic, BEFORE_EARLIEST, rr.latest_position_raw(raw, topic)))
        assert len(entries) == COUNT // BATCH
        assert planner.latest_offset_report() == {topic: list(entries[-1].position)}
        stored = len(entries) * len(entries[0].payload)
        if reader == "raw":
            assert probed == stored  # the probe measured the first entry as stored: LZ4-compressed
            assert planner._raw is not None
            assert planner.raw_client is planner.raw_client  # one per planner
        else:
            assert probed > stored  # estimated from an inflated message
    finally:
        planner.close()
    assert planner._raw is None


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"reader": "kafka"}, "option reader: expected raw or client, got 'kafka'"),
        (
            {"pulsar.client.authPluginClassName": "org.apache.pulsar.client.impl.auth.oauth2.AuthenticationOAuth2"},
            "use the pulsar-client reader",
        ),
        (
            {"pulsar.client.authPluginClassName": "AuthenticationTls", "pulsar.client.authParams": "tlsCertFile:c"},
            "AuthenticationTls needs tlsCertFile",
        ),
    ],
)
def test_raw_reader_options_fail_on_the_driver(extra: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        SourceOptions.parse({"serviceUrl": "pulsar://h:1", "topics": "a", **extra})


def test_client_reader_accepts_what_only_pulsar_client_speaks() -> None:
    oauth = {
        "pulsar.client.authPluginClassName": "org.apache.pulsar.client.impl.auth.oauth2.AuthenticationOAuth2",
        "pulsar.client.authParams": '{"issuerUrl": "https://issuer", "privateKey": "file:///k", "audience": "a"}',
    }
    opts = SourceOptions.parse({"serviceUrl": "pulsar://h:1", "topics": "a", "READER": "Client", **oauth})
    assert opts.reader == "client"
