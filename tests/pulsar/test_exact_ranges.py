"""Exact position ranges against the embedded broker, on both readers (``client``: ``client_reader`` over
pulsar-client; ``raw``: ``raw_reader`` over the binary protocol): every entry once and in order, sub-ranges
that partition a topic, a ledger rollover, a broker restart mid-read, a broker gone for good."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from streamoffload.codecs.entry import entry_messages
from streamoffload.embedded_broker import EmbeddedBroker
from streamoffload.produce import expected_payload, produce
from streamoffload.pulsar.exactly_once import BEFORE_EARLIEST, PulsarIOError, ReaderSettings, ReadStats
from tests.fixtures.broker import ROLLOVER_ENTRIES, unique_topic
from tests.pulsar.readers import READERS, RangeReader, assert_strictly_increasing, check_messages, open_reader

FAST = ReaderSettings(stall_timeout_ms=100, max_stall_timeout_ms=400, retry_timeout_s=20.0)


@pytest.fixture(scope="module", params=READERS)
def reader(request: pytest.FixtureRequest, pulsar_broker: EmbeddedBroker) -> Iterator[RangeReader]:
    opened = open_reader(request.param, pulsar_broker.service_url)
    yield opened
    opened.close()


def test_latest_position_of_empty_and_written_topics(pulsar_broker: EmbeddedBroker, reader: RangeReader) -> None:
    topic = unique_topic(f"{reader.kind}-latest")
    assert reader.latest(topic) is None
    summary = produce(pulsar_broker.service_url, topic, 10, 8, batching=False)
    last = summary.partitions[topic].last_message_id
    assert last is not None
    assert reader.latest(topic) == (last[0], last[1])


@pytest.mark.parametrize("batching", [False, True], ids=["unbatched", "batched"])
def test_reads_every_entry_once_with_exact_messages(
    pulsar_broker: EmbeddedBroker, reader: RangeReader, batching: bool
) -> None:
    topic = unique_topic(f"{reader.kind}-io")
    produce(
        pulsar_broker.service_url, topic, 600, 200, keys=3, properties={"src": "io"}, batching=batching, batch_size=25
    )
    end = reader.latest(topic)
    assert end is not None
    stats = ReadStats()
    entries = list(reader.read(topic, BEFORE_EARLIEST, end, settings=FAST, stats=stats))
    assert_strictly_increasing(entries)
    assert entries[-1].position == end
    assert check_messages(entries, topic, 200, keys=3) == 600
    assert stats.entries == len(entries) and stats.messages == 600
    assert stats.bytes == sum(len(e.payload) for e in entries)
    assert all(e.topic == topic and e.size == len(e.payload) for e in entries)
    if batching:
        assert len(entries) < 600 and any(e.num_messages > 1 for e in entries)
    else:
        assert len(entries) == 600


def test_sub_ranges_partition_the_topic_exactly(pulsar_broker: EmbeddedBroker, reader: RangeReader) -> None:
    topic = unique_topic(f"{reader.kind}-subrange")
    produce(pulsar_broker.service_url, topic, 300, 50, properties={"src": "io"}, batching=True, batch_size=7)
    end = reader.latest(topic)
    assert end is not None
    whole = list(reader.read(topic, BEFORE_EARLIEST, end, settings=FAST))
    cut_a, cut_b = whole[10].position, whole[25].position
    parts = [
        list(reader.read(topic, BEFORE_EARLIEST, cut_a, settings=FAST)),
        list(reader.read(topic, cut_a, cut_b, settings=FAST)),
        list(reader.read(topic, cut_b, end, settings=FAST)),
    ]
    assert [len(p) for p in parts] == [11, 15, len(whole) - 26]
    assert [e for p in parts for e in p] == whole
    assert list(reader.read(topic, end, end, settings=FAST)) == []


def test_reads_across_a_ledger_rollover(reader: RangeReader, rollover_topic: tuple[str, int]) -> None:
    topic, count = rollover_topic
    end = reader.latest(topic)
    assert end is not None
    entries = list(reader.read(topic, BEFORE_EARLIEST, end, settings=FAST))
    assert len(entries) == count
    assert_strictly_increasing(entries)
    ledgers = sorted({e.ledger_id for e in entries})
    assert len(ledgers) == 2, ledgers
    first_ledger = [e for e in entries if e.ledger_id == ledgers[0]]
    assert len(first_ledger) == ROLLOVER_ENTRIES and first_ledger[-1].entry_id == ROLLOVER_ENTRIES - 1
    assert entries[ROLLOVER_ENTRIES].position == (ledgers[1], 0)
    for seq in (0, ROLLOVER_ENTRIES - 1, ROLLOVER_ENTRIES, count - 1):
        (msg,) = entry_messages(entries[seq].payload)
        assert bytes(msg.payload) == expected_payload(topic, seq, 16)
    # a range that starts at the last entry of the first ledger and crosses into the next one
    tail = list(reader.read(topic, first_ledger[-2].position, (ledgers[1], 1), settings=FAST))
    assert [e.position for e in tail] == [first_ledger[-1].position, (ledgers[1], 0), (ledgers[1], 1)]


@pytest.mark.parametrize("kind", READERS)
def test_survives_a_broker_restart_mid_read(make_broker: Callable[..., EmbeddedBroker], kind: str) -> None:
    broker = make_broker()
    topic = unique_topic(f"{kind}-restart")
    produce(broker.service_url, topic, 2000, 100, properties={"src": "io"}, batching=False)
    reader = open_reader(kind, broker.service_url, {"operationTimeoutSeconds": "5"})
    try:
        end = reader.latest(topic)
        assert end is not None
        stats = ReadStats()
        it = reader.read(topic, BEFORE_EARLIEST, end, settings=FAST, stats=stats)
        entries = [next(it) for _ in range(500)]
        broker.restart()
        entries += list(it)
        assert_strictly_increasing(entries)
        assert check_messages(entries, topic, 100) == 2000
        if kind == "raw":  # pulsar-client may reconnect its reader by itself, without a re-subscription of ours
            assert stats.reopens >= 1
        # writes after the restart read on seamlessly from where the range ended (SPEC 6 expects a
        # new ledger here; pulsar-lite 0.2.0 was seen to keep appending to the same one)
        produce(broker.service_url, topic, 50, 100, properties={"src": "io"}, batching=False)
        new_end = reader.latest(topic)
        assert new_end is not None and new_end > end
        more = list(reader.read(topic, end, new_end, settings=FAST))
        assert check_messages(more, topic, 100) == 50  # a second produce() numbers from 0 again
    finally:
        reader.close()


@pytest.mark.parametrize("kind", READERS)
def test_broker_gone_is_a_clear_error_after_the_retry_budget(
    make_broker: Callable[..., EmbeddedBroker], kind: str
) -> None:
    broker = make_broker()
    topic = unique_topic(f"{kind}-gone")
    produce(broker.service_url, topic, 20, 10, batching=False)
    reader = open_reader(kind, broker.service_url, {"operationTimeoutSeconds": "2", "connectionTimeoutMs": "500"})
    try:
        end = reader.latest(topic)
        assert end is not None
        broker.stop()
        budget = ReaderSettings(stall_timeout_ms=100, max_stall_timeout_ms=200, retry_timeout_s=1.5, max_backoff_s=0.3)
        # the raw reader also says which protocol step failed
        doing = ".*subscribing" if kind == "raw" else ""
        with pytest.raises(PulsarIOError, match=rf"{topic}: no progress reading positions \(-1:-1, {doing}"):
            list(reader.read(topic, BEFORE_EARLIEST, end, settings=budget))
    finally:
        reader.close()
