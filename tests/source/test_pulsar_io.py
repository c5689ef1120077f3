"""Reading topic-partitions by exact position range (no Spark): against the embedded broker, and
against a scripted fake reader for the faults pulsar-lite shows only by chance (duplicates, stalls,
torn batches, gaps)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pulsar
import pytest

from streamoffload.codecs.entry import entry_messages
from streamoffload.embedded_broker import EmbeddedBroker
from streamoffload.produce import expected_key, expected_payload, expected_properties, produce
from streamoffload.streaming import pulsar_io as pio
from streamoffload.streaming.ranges import (
    BEFORE_EARLIEST,
    DataLossError,
    PulsarIOError,
    ReadEntry,
    ReaderSettings,
    ReadStats,
)
from streamoffload.streaming.wire import field_varint
from tests.fixtures.broker import ROLLOVER_ENTRIES, unique_topic

FAST = ReaderSettings(stall_timeout_ms=100, max_stall_timeout_ms=400, retry_timeout_s=20.0)


def check_messages(entries: list[ReadEntry], topic: str, payload_size: int, keys: int = 0, first_seq: int = 0) -> int:
    """Every message in order, with the payload, key and properties `produce` gave it; returns the count."""
    seq = first_seq
    for entry in entries:
        messages = entry_messages(entry.data)
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


# --- the embedded broker ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def client(pulsar_broker: EmbeddedBroker) -> Iterator[Any]:
    c = pio.make_client(pulsar_broker.service_url)
    yield c
    c.close()


def test_latest_position_of_empty_and_written_topics(pulsar_broker: EmbeddedBroker, client: Any) -> None:
    topic = unique_topic("latest")
    assert pio.latest_position(client, topic) is None
    summary = produce(pulsar_broker.service_url, topic, 10, 8, batching=False)
    last = summary.partitions[topic].last_message_id
    assert last is not None
    assert pio.latest_position(client, topic) == (last[0], last[1])


@pytest.mark.parametrize("batching", [False, True], ids=["unbatched", "batched"])
def test_reads_every_entry_once_with_exact_messages(pulsar_broker: EmbeddedBroker, client: Any, batching: bool) -> None:
    topic = unique_topic("io")
    produce(
        pulsar_broker.service_url, topic, 600, 200, keys=3, properties={"src": "io"}, batching=batching, batch_size=25
    )
    end = pio.latest_position(client, topic)
    assert end is not None
    stats = ReadStats()
    entries = list(pio.read_range(client, topic, BEFORE_EARLIEST, end, settings=FAST, stats=stats))
    assert_strictly_increasing(entries)
    assert entries[-1].position == end
    assert check_messages(entries, topic, 200, keys=3) == 600
    assert stats.entries == len(entries) and stats.messages == 600
    assert all(e.topic == topic and e.size == len(e.data) for e in entries)
    if batching:
        assert len(entries) < 600 and any(e.num_messages > 1 for e in entries)
    else:
        assert len(entries) == 600


def test_sub_ranges_partition_the_topic_exactly(pulsar_broker: EmbeddedBroker, client: Any) -> None:
    topic = unique_topic("subrange")
    produce(pulsar_broker.service_url, topic, 300, 50, properties={"src": "io"}, batching=True, batch_size=7)
    end = pio.latest_position(client, topic)
    assert end is not None
    whole = list(pio.read_range(client, topic, BEFORE_EARLIEST, end, settings=FAST))
    cut_a, cut_b = whole[10].position, whole[25].position
    parts = [
        list(pio.read_range(client, topic, BEFORE_EARLIEST, cut_a, settings=FAST)),
        list(pio.read_range(client, topic, cut_a, cut_b, settings=FAST)),
        list(pio.read_range(client, topic, cut_b, end, settings=FAST)),
    ]
    assert [len(p) for p in parts] == [11, 15, len(whole) - 26]
    assert [e for p in parts for e in p] == whole
    assert list(pio.read_range(client, topic, end, end, settings=FAST)) == []


def test_reads_across_a_ledger_rollover(client: Any, rollover_topic: tuple[str, int]) -> None:
    topic, count = rollover_topic
    end = pio.latest_position(client, topic)
    assert end is not None
    entries = list(pio.read_range(client, topic, BEFORE_EARLIEST, end, settings=FAST))
    assert len(entries) == count
    assert_strictly_increasing(entries)
    ledgers = sorted({e.ledger_id for e in entries})
    assert len(ledgers) == 2, ledgers
    first_ledger = [e for e in entries if e.ledger_id == ledgers[0]]
    assert len(first_ledger) == ROLLOVER_ENTRIES and first_ledger[-1].entry_id == ROLLOVER_ENTRIES - 1
    assert entries[ROLLOVER_ENTRIES].position == (ledgers[1], 0)
    for seq in (0, ROLLOVER_ENTRIES - 1, ROLLOVER_ENTRIES, count - 1):
        (msg,) = entry_messages(entries[seq].data)
        assert bytes(msg.payload) == expected_payload(topic, seq, 16)
    # a range that starts at the last entry of the first ledger and crosses into the next one
    tail = list(pio.read_range(client, topic, first_ledger[-2].position, (ledgers[1], 1), settings=FAST))
    assert [e.position for e in tail] == [first_ledger[-1].position, (ledgers[1], 0), (ledgers[1], 1)]


def test_survives_a_broker_restart_mid_read(make_broker: Callable[..., EmbeddedBroker]) -> None:
    broker = make_broker()
    topic = unique_topic("restart")
    produce(broker.service_url, topic, 2000, 100, properties={"src": "io"}, batching=False)
    client = pio.make_client(broker.service_url, {"operationTimeoutSeconds": "5"})
    try:
        end = pio.latest_position(client, topic)
        assert end is not None
        stats = ReadStats()
        it = pio.read_range(client, topic, BEFORE_EARLIEST, end, settings=FAST, stats=stats)
        entries = [next(it) for _ in range(500)]
        broker.restart()
        entries += list(it)
        assert_strictly_increasing(entries)
        assert check_messages(entries, topic, 100) == 2000
        # writes after the restart read on seamlessly from where the range ended (SPEC 6 expects a
        # new ledger here; pulsar-lite 0.2.0 was seen to keep appending to the same one)
        produce(broker.service_url, topic, 50, 100, properties={"src": "io"}, batching=False)
        new_end = pio.latest_position(client, topic)
        assert new_end is not None and new_end > end
        more = list(pio.read_range(client, topic, end, new_end, settings=FAST))
        assert check_messages(more, topic, 100) == 50  # a second produce() numbers from 0 again
    finally:
        client.close()


def test_broker_gone_is_a_clear_error_after_the_retry_budget(make_broker: Callable[..., EmbeddedBroker]) -> None:
    broker = make_broker()
    topic = unique_topic("gone")
    produce(broker.service_url, topic, 20, 10, batching=False)
    client = pio.make_client(broker.service_url, {"operationTimeoutSeconds": "2", "connectionTimeoutMs": "500"})
    try:
        end = pio.latest_position(client, topic)
        assert end is not None
        broker.stop()
        budget = ReaderSettings(stall_timeout_ms=100, max_stall_timeout_ms=200, retry_timeout_s=1.5, max_backoff_s=0.3)
        with pytest.raises(PulsarIOError, match=rf"{topic}: no progress reading positions \(-1:-1, "):
            list(pio.read_range(client, topic, BEFORE_EARLIEST, end, settings=budget))
    finally:
        client.close()


def test_probe_finds_the_next_entry(pulsar_broker: EmbeddedBroker, client: Any) -> None:
    topic = unique_topic("probe")
    produce(pulsar_broker.service_url, topic, 30, 100, batching=True, batch_size=10)
    entries = list(pio.read_range(client, topic, BEFORE_EARLIEST, pio.latest_position(client, topic), settings=FAST))
    probe = pio.probe_after(client, topic, BEFORE_EARLIEST, settings=FAST)
    assert probe is not None and probe.position == entries[0].position
    assert probe.num_messages == entries[0].num_messages
    assert probe.approx_bytes >= 100 * probe.num_messages
    after_first = pio.probe_after(client, topic, entries[0].position, settings=FAST)
    assert after_first is not None and after_first.position == entries[1].position


# --- scripted faults ----------------------------------------------------------------------------


def _id_bytes(ledger: int, entry: int, batch_index: int, batch_size: int) -> bytes:
    out = field_varint(1, ledger) + field_varint(2, entry)
    if batch_index >= 0:
        out += field_varint(4, batch_index) + field_varint(6, batch_size)
    return out


@dataclass
class FakeId:
    ledger: int
    entry: int
    index: int = -1
    size: int = 0

    def ledger_id(self) -> int:
        return self.ledger

    def entry_id(self) -> int:
        return self.entry

    def batch_index(self) -> int:
        return self.index

    def serialize(self) -> bytes:
        return _id_bytes(self.ledger, self.entry, self.index, self.size)


@dataclass
class FakeMessage:
    mid: FakeId

    def message_id(self) -> FakeId:
        return self.mid

    def data(self) -> bytes:
        return f"{self.mid.ledger}:{self.mid.entry}:{self.mid.index}".encode()

    def partition_key(self) -> str:
        return ""

    def ordering_key(self) -> str:
        return ""

    def properties(self) -> dict[str, str]:
        return {}

    def event_timestamp(self) -> int:
        return 0

    def publish_timestamp(self) -> int:
        return 1000 + self.mid.entry

    def producer_name(self) -> str:
        return "fake"


STALL = object()


@dataclass
class FakeClient:
    """Each reader opening plays the next script (messages and STALLs) as written, whatever its
    start position, like a broker replaying too much; an exhausted script stalls."""

    scripts: list[list[Any]]
    opened_at: list[Any] = field(default_factory=list)

    def create_reader(self, topic: str, start: Any, receiver_queue_size: int = 1000) -> FakeReader:
        self.opened_at.append(start)
        script = self.scripts.pop(0) if self.scripts else []
        return FakeReader(list(script))


@dataclass
class FakeReader:
    script: list[Any]

    def read_next(self, timeout_millis: int) -> FakeMessage:
        if not self.script:
            raise pulsar.Timeout("stalled")
        item = self.script.pop(0)
        if item is STALL:
            raise pulsar.Timeout("stalled")
        return item

    def close(self) -> None:
        pass


def plain(ledger: int, *entries: int) -> list[FakeMessage]:
    return [FakeMessage(FakeId(ledger, e)) for e in entries]


def batch(ledger: int, entry: int, size: int, indexes: list[int] | None = None) -> list[FakeMessage]:
    return [FakeMessage(FakeId(ledger, entry, i, size)) for i in (range(size) if indexes is None else indexes)]


QUICK = ReaderSettings(stall_timeout_ms=1, max_stall_timeout_ms=2, retry_timeout_s=5.0, initial_backoff_s=0.0)


def positions(entries: list[ReadEntry]) -> list[tuple[int, int]]:
    return [e.position for e in entries]


def test_duplicates_and_stalls_are_absorbed() -> None:
    client = FakeClient(
        [
            [*plain(1, 0, 1, 1, 0, 2), STALL],  # duplicates, then a stall with 3..4 still due
            plain(1, 1, 2, 3, 4),  # the re-opened reader replays from before the last position
        ]
    )
    stats = ReadStats()
    entries = list(pio.read_range(client, "t", BEFORE_EARLIEST, (1, 4), settings=QUICK, stats=stats))
    assert positions(entries) == [(1, 0), (1, 1), (1, 2), (1, 3), (1, 4)]
    assert stats.duplicates == 4 and stats.stalls == 1 and stats.reopens == 1
    assert len(client.opened_at) == 2


def test_batches_are_regrouped_and_torn_batches_reread() -> None:
    client = FakeClient(
        [
            batch(2, 0, 3) + batch(2, 1, 4, [0, 1, 1, 2]) + [STALL],  # a duplicate inside, then torn
            batch(2, 1, 4) + batch(2, 2, 2, [0]) + batch(2, 3, 1),  # entry 2 arrives incomplete
            batch(2, 2, 2) + batch(2, 3, 1),
        ]
    )
    stats = ReadStats()
    entries = list(pio.read_range(client, "t", BEFORE_EARLIEST, (2, 3), settings=QUICK, stats=stats))
    assert positions(entries) == [(2, 0), (2, 1), (2, 2), (2, 3)]
    assert [e.num_messages for e in entries] == [3, 4, 2, 1]
    for entry in entries:
        payloads = [bytes(m.payload) for m in entry_messages(entry.data)]
        assert payloads == [f"2:{entry.entry_id}:{i}".encode() for i in range(entry.num_messages)]
        assert all(m.batch_index == i for i, m in enumerate(entry_messages(entry.data)))
    assert stats.duplicates == 1 and stats.reopens == 2


def test_gap_within_a_ledger_is_data_loss_once_confirmed() -> None:
    client = FakeClient([plain(1, 0, 1, 3, 4), plain(1, 3, 4)])
    with pytest.raises(DataLossError, match="t: entries between 1:1 and 1:3 are missing"):
        list(pio.read_range(client, "t", BEFORE_EARLIEST, (1, 4), settings=QUICK))
    assert len(client.opened_at) == 2  # the gap was re-read once before being believed


def test_gap_that_heals_on_reread_is_not_data_loss() -> None:
    client = FakeClient([plain(1, 0, 1, 3), plain(1, 2, 3)])
    entries = list(pio.read_range(client, "t", BEFORE_EARLIEST, (1, 3), settings=QUICK))
    assert positions(entries) == [(1, 0), (1, 1), (1, 2), (1, 3)]


def test_gap_skipped_when_fail_on_data_loss_is_off() -> None:
    client = FakeClient([plain(1, 0, 1) + plain(2, 5, 6), plain(2, 5, 6)])
    lenient = ReaderSettings(**{**QUICK.__dict__, "fail_on_data_loss": False})
    stats = ReadStats()
    entries = list(pio.read_range(client, "t", BEFORE_EARLIEST, (2, 6), settings=lenient, stats=stats))
    assert positions(entries) == [(1, 0), (1, 1), (2, 5), (2, 6)]
    assert stats.lost == [((1, 1), (2, 5))]


def test_missing_end_of_a_known_range_is_data_loss() -> None:
    client = FakeClient([plain(1, 5, 9), plain(1, 9)])
    with pytest.raises(DataLossError, match=r"entries after 1:5 up to 1:7 are missing \(the next entry"):
        list(pio.read_range(client, "t", (1, 4), (1, 7), settings=QUICK))


def test_capped_range_ends_quietly_at_a_ledger_boundary() -> None:
    # admission control capped the range at (1, 10) but ledger 1 ended at entry 6
    client = FakeClient([plain(1, 5, 6) + plain(3, 0, 1)])
    entries = list(pio.read_range(client, "t", (1, 4), (1, 10), settings=QUICK, end_is_known=False))
    assert positions(entries) == [(1, 5), (1, 6)]


def test_endless_stalls_give_up_with_a_clear_error() -> None:
    client = FakeClient([plain(1, 0)])
    budget = ReaderSettings(stall_timeout_ms=1, max_stall_timeout_ms=1, retry_timeout_s=0.2, initial_backoff_s=0.0)
    with pytest.raises(PulsarIOError, match=r"t: no progress reading positions \(1:0, 1:3\] for 0.2 s"):
        list(pio.read_range(client, "t", BEFORE_EARLIEST, (1, 3), settings=budget))
