"""Reading topic-partitions by exact position range with pulsar-client (no Spark): probes against the embedded
broker, and a scripted fake reader for the faults pulsar-lite shows only by chance (duplicates, stalls, torn
batches, gaps). The exactness tests against the broker run on both readers in test_exact_ranges.py."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pulsar
import pytest

from streamoffload.codecs.entry import entry_messages
from streamoffload.embedded_broker import EmbeddedBroker
from streamoffload.produce import produce
from streamoffload.pulsar import client_reader
from streamoffload.pulsar.exactly_once import (
    BEFORE_EARLIEST,
    DataLossError,
    PulsarIOError,
    ReadEntry,
    ReaderSettings,
    ReadStats,
)
from streamoffload.pulsar.wire import field_varint
from tests.fixtures.broker import unique_topic

FAST = ReaderSettings(stall_timeout_ms=100, max_stall_timeout_ms=400, retry_timeout_s=20.0)


# --- the embedded broker ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def client(pulsar_broker: EmbeddedBroker) -> Iterator[Any]:
    c = client_reader.make_client(pulsar_broker.service_url)
    yield c
    c.close()


def test_probe_finds_the_next_entry(pulsar_broker: EmbeddedBroker, client: Any) -> None:
    topic = unique_topic("probe")
    produce(pulsar_broker.service_url, topic, 30, 100, batching=True, batch_size=10)
    entries = list(
        client_reader.read_range(
            client, topic, BEFORE_EARLIEST, client_reader.latest_position(client, topic), settings=FAST
        )
    )
    probe = client_reader.probe_after(client, topic, BEFORE_EARLIEST, settings=FAST)
    assert probe is not None and probe.position == entries[0].position
    assert probe.num_messages == entries[0].num_messages
    assert probe.approx_bytes >= 100 * probe.num_messages
    after_first = client_reader.probe_after(client, topic, entries[0].position, settings=FAST)
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
    entries = list(client_reader.read_range(client, "t", BEFORE_EARLIEST, (1, 4), settings=QUICK, stats=stats))
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
    entries = list(client_reader.read_range(client, "t", BEFORE_EARLIEST, (2, 3), settings=QUICK, stats=stats))
    assert positions(entries) == [(2, 0), (2, 1), (2, 2), (2, 3)]
    assert [e.num_messages for e in entries] == [3, 4, 2, 1]
    for entry in entries:
        payloads = [bytes(m.payload) for m in entry_messages(entry.payload)]
        assert payloads == [f"2:{entry.entry_id}:{i}".encode() for i in range(entry.num_messages)]
        assert all(m.batch_index == i for i, m in enumerate(entry_messages(entry.payload)))
    assert stats.duplicates == 1 and stats.reopens == 2


def test_gap_within_a_ledger_is_data_loss_once_confirmed() -> None:
    client = FakeClient([plain(1, 0, 1, 3, 4), plain(1, 3, 4)])
    with pytest.raises(DataLossError, match="t: entries between 1:1 and 1:3 are missing"):
        list(client_reader.read_range(client, "t", BEFORE_EARLIEST, (1, 4), settings=QUICK))
    assert len(client.opened_at) == 2  # the gap was re-read once before being believed


def test_gap_that_heals_on_reread_is_not_data_loss() -> None:
    client = FakeClient([plain(1, 0, 1, 3), plain(1, 2, 3)])
    entries = list(client_reader.read_range(client, "t", BEFORE_EARLIEST, (1, 3), settings=QUICK))
    assert positions(entries) == [(1, 0), (1, 1), (1, 2), (1, 3)]


def test_gap_skipped_when_fail_on_data_loss_is_off() -> None:
    client = FakeClient([plain(1, 0, 1) + plain(2, 5, 6), plain(2, 5, 6)])
    lenient = ReaderSettings(**{**QUICK.__dict__, "fail_on_data_loss": False})
    stats = ReadStats()
    entries = list(client_reader.read_range(client, "t", BEFORE_EARLIEST, (2, 6), settings=lenient, stats=stats))
    assert positions(entries) == [(1, 0), (1, 1), (2, 5), (2, 6)]
    assert stats.lost == [((1, 1), (2, 5))]


def test_missing_end_of_a_known_range_is_data_loss() -> None:
    client = FakeClient([plain(1, 5, 9), plain(1, 9)])
    with pytest.raises(DataLossError, match=r"entries after 1:5 up to 1:7 are missing \(the next entry"):
        list(client_reader.read_range(client, "t", (1, 4), (1, 7), settings=QUICK))


def test_capped_range_ends_quietly_at_a_ledger_boundary() -> None:
    # admission control capped the range at (1, 10) but ledger 1 ended at entry 6
    client = FakeClient([plain(1, 5, 6) + plain(3, 0, 1)])
    entries = list(client_reader.read_range(client, "t", (1, 4), (1, 10), settings=QUICK, end_is_known=False))
    assert positions(entries) == [(1, 5), (1, 6)]


def test_endless_stalls_give_up_with_a_clear_error() -> None:
    client = FakeClient([plain(1, 0)])
    budget = ReaderSettings(stall_timeout_ms=1, max_stall_timeout_ms=1, retry_timeout_s=0.2, initial_backoff_s=0.0)
    with pytest.raises(PulsarIOError, match=r"t: no progress reading positions \(1:0, 1:3\] for 0.2 s"):
        list(client_reader.read_range(client, "t", BEFORE_EARLIEST, (1, 3), settings=budget))
