"""The raw-entry reader (streamoffload/pulsar/raw_reader.py): entries byte for byte as pulsar-client's producer
wrote them and the broker stores them, read over the binary protocol from the real embedded broker
(its exactness tests, shared with the client reader, are in test_exact_ranges.py); scripted faults; and the connection
features against a scripted broker (auth, redirects, proxies) and a TLS terminator in front of the
real broker.

What is tested against what:
- the real pulsar-lite broker: connect, lookup (answered with Connect to itself), non-durable
  subscription, flow, messages, GetLastMessageId, close; duplicates, stalls, restart, rollover;
- a TLS-terminating proxy in front of the real broker: pulsar+ssl:// and client certificates, in
  test_raw_tls.py;
- a scripted broker on a socket: token and basic auth data in CONNECT, AUTH_CHALLENGE, lookup
  Redirect, proxy_through_service_url, and a corrupt entry (CRC-32C) on receipt.
"""

from __future__ import annotations

import contextlib
import select
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from streamoffload.codecs.compression import compress
from streamoffload.codecs.entry import CompressionType, MessageMetadata, decode_entry, encode_entry, entry_messages
from streamoffload.codecs.proto.pulsar_api_pb2 import BaseCommand, CommandLookupTopicResponse, ServerError
from streamoffload.embedded_broker import EmbeddedBroker
from streamoffload.errors import ConfigError
from streamoffload.produce import produce
from streamoffload.pulsar import client_reader
from streamoffload.pulsar import raw_reader as rr
from streamoffload.pulsar.client_options import ServiceAddress
from streamoffload.pulsar.exactly_once import (
    BEFORE_EARLIEST,
    DataLossError,
    Probe,
    PulsarIOError,
    ReadEntry,
    ReaderSettings,
    ReadStats,
    TopicNotFoundError,
)
from streamoffload.pulsar.latest_positions import HeldPositions, latest_positions_raw
from streamoffload.pulsar.subscription_names import NAMES
from tests.fixtures.broker import unique_topic
from tests.pulsar.readers import CODECS, assert_strictly_increasing, send_with_client

FAST = ReaderSettings(stall_timeout_ms=100, max_stall_timeout_ms=400, retry_timeout_s=20.0)
T = BaseCommand.Type


@pytest.fixture(scope="module")
def raw(pulsar_broker: EmbeddedBroker) -> rr.RawClient:
    return rr.RawClient(pulsar_broker.service_url)


def read_all(client: Any, topic: str, **kwargs: Any) -> list[ReadEntry]:
    end = rr.latest_position_raw(client, topic)
    assert end is not None
    return list(rr.read_range_raw(client, topic, BEFORE_EARLIEST, end, settings=FAST, **kwargs))


# --- fidelity ----------------------------------------------------------------------------------


@pytest.mark.parametrize("batched", [False, True], ids=["unbatched", "batched"])
@pytest.mark.parametrize("codec", list(CODECS))
def test_entries_are_the_producers_bytes(
    pulsar_broker: EmbeddedBroker, raw: rr.RawClient, codec: str, batched: bool
) -> None:
    wire_codec = CODECS[codec][1]
    topic = unique_topic(f"raw-{codec}-{batched}")
    count = 24
    sent: list[dict[str, Any]] = [
        {
            "payload": (f"message {i} of {topic} ".encode() * 6) if i != 5 else None,  # one null value
            "key": f"key-{i % 3}" if i % 4 else None,
            "properties": {"i": str(i), "codec": codec},
            "event_time": 1_700_000_000_000 + i,
            "sequence_id": 5000 + 2 * i,  # explicit, and not consecutive
        }
        for i in range(count)
    ]
    send_with_client(
        pulsar_broker.service_url,
        topic,
        sent,
        producer_name=f"producer-{codec}",
        codec=codec,
        batched=batched,
        batch_max=8,
        delay_ms=50,
    )

    stats = ReadStats()
    entries = read_all(raw, topic, stats=stats)
    assert_strictly_increasing(entries)
    assert stats.messages == count and stats.entries == len(entries)
    received = []
    for entry in entries:
        decoded = decode_entry(entry.payload)  # the CRC-32C holds: the bytes are the producer's
        md = decoded.metadata
        assert md.producer_name == f"producer-{codec}"
        assert decoded.num_messages == entry.num_messages and md.publish_time == entry.publish_time
        assert md.compression == wire_codec
        if batched:
            assert md.HasField("num_messages_in_batch")
        if wire_codec != CompressionType.NONE and entry.num_messages > 1:
            assert len(decoded.payload) < md.uncompressed_size, "a compressed batch must stay compressed"
        messages = entry_messages(entry.payload)
        assert md.sequence_id == messages[0].sequence_id  # the producer's, not renumbered from 0
        received += messages
    assert len(received) == count
    for msg, got in zip(sent, received, strict=True):
        expected = msg["payload"] if msg["payload"] is not None else b""
        assert bytes(got.payload) == expected
        assert got.null_value == (msg["payload"] is None)
        assert got.key == msg["key"]
        assert got.properties == msg["properties"]
        assert got.event_time == msg["event_time"]
        assert got.sequence_id == msg["sequence_id"]
        assert got.producer_name == f"producer-{codec}"
    if not batched:
        assert len(entries) == count


# --- the raw reader beside the client reader (the exactness tests of both: test_exact_ranges.py) ---


def test_same_positions_and_messages_as_the_client_reader(pulsar_broker: EmbeddedBroker, raw: rr.RawClient) -> None:
    topic = unique_topic("raw-vs-client")
    produce(pulsar_broker.service_url, topic, 200, 40, keys=2, properties={"src": "io"}, batching=True, batch_size=9)
    client = client_reader.make_client(pulsar_broker.service_url)
    try:
        end = client_reader.latest_position(client, topic)
        assert end is not None
        via_client = list(client_reader.read_range(client, topic, BEFORE_EARLIEST, end, settings=FAST))
    finally:
        client.close()
    via_raw = read_all(raw, topic)
    assert [(e.position, e.num_messages, e.publish_time) for e in via_raw] == [
        (e.position, e.num_messages, e.publish_time) for e in via_client
    ]
    for a, b in zip(via_raw, via_client, strict=True):
        via_a = [bytes(m.payload) for m in entry_messages(a.payload)]
        assert via_a == [bytes(m.payload) for m in entry_messages(b.payload)]


def test_a_clients_consumers_take_turns_on_one_connection_and_a_stalled_ones_is_closed(
    pulsar_broker: EmbeddedBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A task reads its ranges one after the other: each range's consumer uses the connection the one before
    left (unsubscribed, answered), so a hundred ranges cost one connection, not a hundred. A consumer that
    waited out a stall closes its connection: the next one starts on a new connection."""
    from streamoffload.pulsar import broker_connection

    opened: list[Any] = []
    original = broker_connection.BrokerConnection.__init__

    def counting(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        opened.append(self)

    monkeypatch.setattr(broker_connection.BrokerConnection, "__init__", counting)
    topics = [unique_topic(f"raw-turns-{n}") for n in range(3)]
    for n, topic in enumerate(topics):
        produce(pulsar_broker.service_url, topic, 5 + n, 16, batching=False)
    client = rr.RawClient(pulsar_broker.service_url)
    try:
        ledger: dict[str, int] = {}
        for _round in range(2):
            for n, topic in enumerate(topics):
                got = read_all(client, topic)
                ledger[topic] = got[0].position[0]
                assert [e.position for e in got] == [(ledger[topic], i) for i in range(5 + n)]
        assert len(opened) == 1, "six ranges, one connection"
        consumer = client.open_consumer(topics[0], (ledger[topics[0]], 4), 10)  # after its last entry
        for _ in range(5):  # the broker may hand out the start entry again (the reader drops such duplicates)
            if consumer.receive(200) is None:  # nothing more: waited out
                break
        else:
            pytest.fail("entries after the topic's last one")
        consumer.close()
        assert opened[0].sock.fileno() == -1, "the stalled consumer's connection is closed"
        assert [e.position for e in read_all(client, topics[1])][-1] == (ledger[topics[1]], 5)
        assert len(opened) == 2
    finally:
        client.close()
    assert all(conn.sock.fileno() == -1 for conn in opened), "close() closes the kept connections"


def test_probe_finds_the_next_entry_with_its_exact_size(pulsar_broker: EmbeddedBroker, raw: rr.RawClient) -> None:
    topic = unique_topic("raw-probe")
    produce(pulsar_broker.service_url, topic, 30, 100, batching=True, batch_size=10)
    entries = read_all(raw, topic)
    probe = rr.probe_after_raw(raw, topic, BEFORE_EARLIEST, settings=FAST)
    first = entries[0]
    assert probe == Probe(first.position, first.num_messages, len(first.payload), first.publish_time)
    after_first = rr.probe_after_raw(raw, topic, entries[0].position, settings=FAST)
    assert after_first is not None and after_first.position == entries[1].position
    assert rr.probe_after_raw(raw, topic, entries[-1].position, settings=FAST, attempts=1) is None


# --- scripted faults (the read loop, without a broker) -----------------------------------------


def _entry_bytes(ledger: int, entry: int) -> bytes:
    md = MessageMetadata(producer_name="fake", sequence_id=entry, publish_time=1000 + entry)
    return encode_entry(md, f"{ledger}:{entry}".encode())


STALL = object()


def plain(ledger: int, *entries: int) -> list[rr.RawMessage]:
    return [rr.RawMessage(ledger, e, 1000 + e, 1, _entry_bytes(ledger, e)) for e in entries]


@dataclass
class FakeConsumer:
    script: list[Any]
    closed: bool = False

    def receive(self, timeout_ms: int) -> rr.RawMessage | None:
        if not self.script:
            return None
        item = self.script.pop(0)
        if item is STALL:
            return None
        if isinstance(item, Exception):
            raise item
        return item

    def close(self) -> None:
        self.closed = True


@dataclass
class FakeRawClient:
    """Each subscription plays the next script whatever its start position, like a broker replaying too much."""

    scripts: list[list[Any]]
    opened_at: list[tuple[int, int]] = field(default_factory=list)

    def open_consumer(self, topic: str, after: tuple[int, int], queue_size: int) -> FakeConsumer:
        self.opened_at.append(after)
        if self.scripts and isinstance(self.scripts[0], Exception):
            raise self.scripts.pop(0)
        return FakeConsumer(list(self.scripts.pop(0)) if self.scripts else [])


QUICK = ReaderSettings(stall_timeout_ms=1, max_stall_timeout_ms=2, retry_timeout_s=5.0, initial_backoff_s=0.0)


def test_duplicates_stalls_and_errors_are_absorbed() -> None:
    client = FakeRawClient(
        [
            [*plain(1, 0, 1, 1, 0, 2), STALL],  # duplicates, then a stall with 3..5 still due
            ConnectionRefusedError("broker down"),  # a failed subscription: retried
            [*plain(1, 1, 2, 3), PulsarIOError("the broker closed the consumer")],
            plain(1, 3, 4, 5),
        ]
    )
    stats = ReadStats()
    entries = list(rr.read_range_raw(client, "t", BEFORE_EARLIEST, (1, 5), settings=QUICK, stats=stats))
    assert [e.position for e in entries] == [(1, 0), (1, 1), (1, 2), (1, 3), (1, 4), (1, 5)]
    assert [e.payload for e in entries] == [_entry_bytes(1, i) for i in range(6)]
    assert stats.duplicates == 5 and stats.stalls == 1 and stats.errors == 2
    assert client.opened_at == [BEFORE_EARLIEST, (1, 2), (1, 2), (1, 3)]


def test_gap_is_data_loss_once_confirmed_and_skipped_when_allowed() -> None:
    client = FakeRawClient([plain(1, 0, 1, 3, 4), plain(1, 3, 4)])
    with pytest.raises(DataLossError, match="t: entries between 1:1 and 1:3 are missing"):
        list(rr.read_range_raw(client, "t", BEFORE_EARLIEST, (1, 4), settings=QUICK))
    lenient = ReaderSettings(**{**QUICK.__dict__, "fail_on_data_loss": False})
    stats = ReadStats()
    client = FakeRawClient([plain(1, 0, 1) + plain(2, 5, 6), plain(2, 5, 6)])
    entries = list(rr.read_range_raw(client, "t", BEFORE_EARLIEST, (2, 6), settings=lenient, stats=stats))
    assert [e.position for e in entries] == [(1, 0), (1, 1), (2, 5), (2, 6)]
    assert stats.lost == [((1, 1), (2, 5))]


def test_range_ends_known_and_capped() -> None:
    client = FakeRawClient([plain(1, 5, 9), plain(1, 9)])
    with pytest.raises(DataLossError, match=r"entries after 1:5 up to 1:7 are missing \(the next entry"):
        list(rr.read_range_raw(client, "t", (1, 4), (1, 7), settings=QUICK))
    client = FakeRawClient([plain(1, 5, 6) + plain(3, 0, 1)])
    entries = list(rr.read_range_raw(client, "t", (1, 4), (1, 10), settings=QUICK, end_is_known=False))
    assert [e.position for e in entries] == [(1, 5), (1, 6)]


def test_a_first_entry_that_skips_is_asked_again_before_it_counts() -> None:
    """pulsar-lite resumes a subscription name it kept across a restart from its old place, whatever start a new
    subscription asks for (test_a_kept_subscription_name_does_not_make_a_read_skip has the real broker do it).
    Each subscription here plays its script whatever it asked, as such a broker does."""
    # A capped range (the end is not known to exist): the stale place is past the cap. Taken as the end of the
    # range, the whole range would have been skipped without a word.
    stats = ReadStats()
    client = FakeRawClient([plain(3, 618, 619), plain(0, 49928, 49929) + plain(3, 0)])
    entries = list(
        rr.read_range_raw(client, "t", (0, 49927), (0, 60000), settings=QUICK, end_is_known=False, stats=stats)
    )
    assert [e.position for e in entries] == [(0, 49928), (0, 49929)]
    assert stats.first_rechecks == 1 and client.opened_at == [(0, 49927), (0, 49927)]
    # The stale place is a later ledger's first entry: no gap shows, the old ledger's tail would be skipped.
    client = FakeRawClient([plain(3, 0, 1), plain(0, 49999) + plain(3, 0, 1)])
    entries = list(rr.read_range_raw(client, "t", (0, 49998), (3, 1), settings=QUICK))
    assert [e.position for e in entries] == [(0, 49999), (3, 0), (3, 1)]
    # A ledger that really ended: the same first entry twice is the broker's answer.
    stats = ReadStats()
    client = FakeRawClient([plain(3, 0, 1), plain(3, 0, 1)])
    entries = list(rr.read_range_raw(client, "t", (0, 49999), (3, 1), settings=QUICK, stats=stats))
    assert [e.position for e in entries] == [(3, 0), (3, 1)] and stats.first_rechecks == 1
    # Sequential deliveries are trusted: no second subscription at a ledger change within one.
    stats = ReadStats()
    client = FakeRawClient([plain(0, 49999) + plain(3, 0, 1)])
    entries = list(rr.read_range_raw(client, "t", (0, 49998), (3, 1), settings=QUICK, stats=stats))
    assert len(entries) == 3 and stats.first_rechecks == 0 and len(client.opened_at) == 1
    # A capped range that meets a gap past its cap is not taken as ended: the gap is confirmed, then lost.
    client = FakeRawClient([plain(1, 5, 6) + plain(3, 4), plain(3, 4)])
    with pytest.raises(
        DataLossError, match=r"entries after 1:6 up to 1:10 are missing \(the next entry the broker has is 3:4"
    ):
        list(rr.read_range_raw(client, "t", (1, 4), (1, 10), settings=QUICK, end_is_known=False))


def test_a_probe_asks_again_when_the_first_entry_skips() -> None:
    quick = ReaderSettings(stall_timeout_ms=1, max_stall_timeout_ms=2, initial_backoff_s=0.0)
    client = FakeRawClient([plain(3, 618), plain(0, 49928)])  # a kept place first, then the broker's next
    probe = rr.probe_after_raw(client, "t", (0, 49927), settings=quick)
    assert probe is not None and probe.position == (0, 49928) and len(client.opened_at) == 2
    client = FakeRawClient([plain(3, 0), plain(3, 0)])  # a ledger that ended: the same answer twice
    probe = rr.probe_after_raw(client, "t", (0, 49999), settings=quick)
    assert probe is not None and probe.position == (3, 0)
    client = FakeRawClient([plain(0, 7)])  # certainly the next: one subscription
    probe = rr.probe_after_raw(client, "t", (0, 6), settings=quick)
    assert probe is not None and probe.position == (0, 7) and len(client.opened_at) == 1


def test_endless_stalls_give_up_with_a_clear_error() -> None:
    client = FakeRawClient([plain(1, 0)])
    budget = ReaderSettings(stall_timeout_ms=1, max_stall_timeout_ms=1, retry_timeout_s=0.2, initial_backoff_s=0.0)
    with pytest.raises(PulsarIOError, match=r"t: no progress reading positions \(1:0, 1:3\] for 0.2 s"):
        list(rr.read_range_raw(client, "t", BEFORE_EARLIEST, (1, 3), settings=budget))


# --- a scripted broker on a socket: auth, lookups, proxies, corrupt entries ---------------------


def wait_for(condition: Callable[[], Any], timeout: float = 5.0) -> Any:
    """Poll ``condition`` until it is truthy (the scripted broker records commands on its own thread)."""
    deadline = time.monotonic() + timeout
    while not (result := condition()) and time.monotonic() < deadline:
        time.sleep(0.01)
    return result


def _frame(cmd: BaseCommand, payload: bytes = b"") -> bytes:
    body = cmd.SerializeToString()
    return struct.pack(">II", len(body) + 4 + len(payload), len(body)) + body + payload


def _read_command(conn: socket.socket) -> BaseCommand | None:
    head = conn.recv(8, socket.MSG_WAITALL)
    if len(head) < 8:
        return None
    total, size = struct.unpack(">II", head)
    body = conn.recv(total - 4, socket.MSG_WAITALL)
    return BaseCommand.FromString(body[:size])


class ScriptedBroker:
    """Answers CONNECT, LOOKUP (with ``lookup`` deciding the answer), SUBSCRIBE (refused with TopicNotFound for
    the topics in ``missing`` when the command does not ask to create them, as Pulsar does), FLOW (by pushing
    ``entries``), GET_LAST_MESSAGE_ID and UNSUBSCRIBE; records every command it receives."""

    def __init__(
        self,
        lookup: Callable[[BaseCommand], CommandLookupTopicResponse] | None = None,
        entries: list[tuple[int, int, bytes]] | None = None,
        challenge: bool = False,
        answer_unsubscribe: bool = True,
        missing: set[str] | None = None,
    ) -> None:
        self.missing = missing if missing is not None else set()
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.url = f"pulsar://127.0.0.1:{self.port}"
        self.lookup = lookup
        self.entries = entries or []
        self.challenge = challenge
        self.answer_unsubscribe = answer_unsubscribe
        self.seen: list[BaseCommand] = []
        self._stop = False
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self._stop:
            readable, _, _ = select.select([self.server], [], [], 0.05)
            if readable:
                conn, _ = self.server.accept()
                threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        consumers: dict[int, str] = {}  # this connection's consumers' topics
        with conn, contextlib.suppress(OSError):
            while (cmd := _read_command(conn)) is not None:
                self.seen.append(cmd)
                if cmd.type == T.CONNECT:
                    if self.challenge:
                        conn.sendall(
                            _frame(
                                BaseCommand(
                                    type=T.AUTH_CHALLENGE,
                                    authChallenge={
                                        "server_version": "scripted",
                                        "challenge": {"auth_method_name": "basic"},
                                    },
                                )
                            )
                        )
                        continue
                    conn.sendall(_frame(BaseCommand(type=T.CONNECTED, connected={"server_version": "scripted"})))
                elif cmd.type == T.AUTH_RESPONSE:
                    conn.sendall(_frame(BaseCommand(type=T.CONNECTED, connected={"server_version": "scripted"})))
                elif cmd.type == T.LOOKUP:
                    resp = CommandLookupTopicResponse(
                        response=CommandLookupTopicResponse.Connect, brokerServiceUrl=self.url
                    )
                    if self.lookup is not None:
                        resp = self.lookup(cmd)
                    resp.request_id = cmd.lookupTopic.request_id
                    reply = BaseCommand(type=T.LOOKUP_RESPONSE)
                    reply.lookupTopicResponse.CopyFrom(resp)
                    conn.sendall(_frame(reply))
                elif cmd.type == T.SUBSCRIBE:
                    sub = cmd.subscribe
                    if sub.topic in self.missing and not sub.force_topic_creation:
                        error = {"request_id": sub.request_id, "error": ServerError.TopicNotFound, "message": "gone"}
                        conn.sendall(_frame(BaseCommand(type=T.ERROR, error=error)))
                        continue
                    consumers[sub.consumer_id] = sub.topic
                    conn.sendall(_frame(BaseCommand(type=T.SUCCESS, success={"request_id": sub.request_id})))
                elif cmd.type == T.FLOW:
                    for ledger, entry, data in list(self.entries):
                        msg = BaseCommand(type=T.MESSAGE)
                        msg.message.consumer_id = cmd.flow.consumer_id
                        msg.message.message_id.ledgerId = ledger
                        msg.message.message_id.entryId = entry
                        conn.sendall(_frame(BaseCommand(type=T.PING, ping={})))
                        conn.sendall(_frame(msg, data))
                elif cmd.type == T.GET_LAST_MESSAGE_ID and self._gone(consumers, cmd.getLastMessageId.consumer_id):
                    # Its topic was deleted since it subscribed (Pulsar closes such consumers): not found.
                    rid = cmd.getLastMessageId.request_id
                    error = {"request_id": rid, "error": ServerError.ConsumerNotFound, "message": "closed"}
                    conn.sendall(_frame(BaseCommand(type=T.ERROR, error=error)))
                elif cmd.type == T.GET_LAST_MESSAGE_ID:
                    reply = BaseCommand(type=T.GET_LAST_MESSAGE_ID_RESPONSE)
                    reply.getLastMessageIdResponse.request_id = cmd.getLastMessageId.request_id
                    reply.getLastMessageIdResponse.last_message_id.ledgerId = 7
                    reply.getLastMessageIdResponse.last_message_id.entryId = 3
                    conn.sendall(_frame(reply))
                elif cmd.type == T.UNSUBSCRIBE and self.answer_unsubscribe:
                    conn.sendall(
                        _frame(BaseCommand(type=T.SUCCESS, success={"request_id": cmd.unsubscribe.request_id}))
                    )

    def _gone(self, consumers: dict[int, str], consumer_id: int) -> bool:
        return consumers.get(consumer_id) in self.missing

    def close(self) -> None:
        self._stop = True
        self.thread.join(2)
        self.server.close()

    def commands(self, kind: int) -> list[BaseCommand]:
        return [c for c in self.seen if c.type == kind]


@pytest.fixture
def scripted() -> Iterator[Callable[..., ScriptedBroker]]:
    brokers: list[ScriptedBroker] = []

    def make(**kwargs: Any) -> ScriptedBroker:
        brokers.append(ScriptedBroker(**kwargs))
        return brokers[-1]

    yield make
    for b in brokers:
        b.close()


def test_protocol_steps_and_auth_token(scripted: Callable[..., ScriptedBroker]) -> None:
    good = [(7, i, _entry_bytes(7, i)) for i in range(4)]
    broker = scripted(entries=good)
    raw = rr.RawClient(broker.url, {"authToken": "secret-token"})
    assert rr.latest_position_raw(raw, "persistent://public/default/x") == (7, 3)
    entries = list(rr.read_range_raw(raw, "persistent://public/default/x", (7, 0), (7, 3), settings=FAST))
    assert [e.position for e in entries] == [(7, 1), (7, 2), (7, 3)]
    connect = broker.commands(T.CONNECT)[0].connect
    assert connect.auth_method_name == "token" and connect.auth_data == b"secret-token"
    assert connect.protocol_version == 19 and connect.feature_flags.supports_broker_entry_metadata
    sub = broker.commands(T.SUBSCRIBE)[-1].subscribe
    assert sub.durable is False and sub.subType == 0 and sub.topic == "persistent://public/default/x"
    assert sub.HasField("force_topic_creation") and sub.force_topic_creation is False  # never creates a topic
    assert (sub.start_message_id.ledgerId, sub.start_message_id.entryId) == (7, 0)
    assert broker.commands(T.FLOW)[-1].flow.messagePermits == FAST.receiver_queue_size
    assert wait_for(lambda: broker.commands(T.PONG)), "pings must be answered"
    assert wait_for(lambda: broker.commands(T.UNSUBSCRIBE))  # a reader's subscription goes with it


def test_unanswered_unsubscribes_hold_the_positions_pass_only_briefly(
    scripted: Callable[..., ScriptedBroker],
) -> None:
    """A broker that answers the questions but not the unsubscribes: the pipelined latest-position pass returns
    its answers after the close wait, not after the operation timeout (30 s here), and keeps no name whose
    unsubscribe was not confirmed."""
    broker = scripted(answer_unsubscribe=False)
    raw = rr.RawClient(broker.url, {"operationTimeoutSeconds": 30})
    topics = [f"persistent://public/default/quiet-{i}" for i in range(3)]
    started = time.monotonic()
    answers = latest_positions_raw(raw, topics)
    took = time.monotonic() - started
    assert answers == dict.fromkeys(topics, (7, 3))
    assert len(broker.commands(T.UNSUBSCRIBE)) == 3
    assert rr.CLOSE_WAIT_S <= took < rr.CLOSE_WAIT_S + 5
    subscribed = {c.subscribe.subscription for c in broker.commands(T.SUBSCRIBE)}
    again = scripted()
    latest_positions_raw(rr.RawClient(again.url), topics)
    assert not subscribed & {c.subscribe.subscription for c in again.commands(T.SUBSCRIBE)}


def test_basic_auth_and_auth_challenge(scripted: Callable[..., ScriptedBroker]) -> None:
    broker = scripted(challenge=True)
    raw = rr.RawClient(
        broker.url,
        {
            "authPluginClassName": "org.apache.pulsar.client.impl.auth.AuthenticationBasic",
            "authParams": '{"userId": "alice", "password": "pw"}',
        },
    )
    assert rr.latest_position_raw(raw, "t") == (7, 3)
    connect = broker.commands(T.CONNECT)[0].connect
    assert (connect.auth_method_name, connect.auth_data) == ("basic", b"alice:pw")
    answer = broker.commands(T.AUTH_RESPONSE)[0].authResponse.response
    assert (answer.auth_method_name, answer.auth_data) == ("basic", b"alice:pw")


def test_lookup_redirect_and_proxy(scripted: Callable[..., ScriptedBroker]) -> None:
    owner = scripted(entries=[(7, 0, _entry_bytes(7, 0))])

    def redirect(cmd: BaseCommand) -> CommandLookupTopicResponse:
        return CommandLookupTopicResponse(
            response=CommandLookupTopicResponse.Redirect, brokerServiceUrl=owner.url, authoritative=True
        )

    front = scripted(lookup=redirect)
    raw = rr.RawClient(front.url)
    assert [e.position for e in rr.read_range_raw(raw, "t", BEFORE_EARLIEST, (7, 0), settings=FAST)] == [(7, 0)]
    assert owner.commands(T.LOOKUP)[0].lookupTopic.authoritative is True
    assert owner.commands(T.SUBSCRIBE) and not front.commands(T.SUBSCRIBE)

    def via_proxy(cmd: BaseCommand) -> CommandLookupTopicResponse:
        return CommandLookupTopicResponse(
            response=CommandLookupTopicResponse.Connect,
            brokerServiceUrl="pulsar://10.9.9.9:6650",
            proxy_through_service_url=True,
        )

    proxy = scripted(lookup=via_proxy, entries=[(7, 0, _entry_bytes(7, 0))])
    raw = rr.RawClient(proxy.url)
    assert [e.position for e in rr.read_range_raw(raw, "t", BEFORE_EARLIEST, (7, 0), settings=FAST)] == [(7, 0)]
    assert [c.connect.proxy_to_broker_url for c in proxy.commands(T.CONNECT)] == ["", "10.9.9.9:6650"]

    def failed(cmd: BaseCommand) -> CommandLookupTopicResponse:
        return CommandLookupTopicResponse(response=CommandLookupTopicResponse.Failed, error=11, message="no topic")

    with pytest.raises(PulsarIOError, match=r"lookup of t at 127.0.0.1:\d+ failed: no topic \(TopicNotFound\)"):
        rr.latest_position_raw(rr.RawClient(scripted(lookup=failed).url), "t")


def test_lookups_are_remembered_in_the_process_and_forgotten_when_a_consumer_fails(
    scripted: Callable[..., ScriptedBroker],
) -> None:
    """Each range a task reads opens a consumer: where its topic-partition lives is looked up once per process,
    not once per open (a round trip each), and looked up again once an open there fails (the topic moved)."""
    rr.LOOKUPS.clear()
    owner = scripted(entries=[(7, 0, _entry_bytes(7, 0))])

    def redirect(cmd: BaseCommand) -> CommandLookupTopicResponse:
        return CommandLookupTopicResponse(
            response=CommandLookupTopicResponse.Redirect, brokerServiceUrl=owner.url, authoritative=True
        )

    front = scripted(lookup=redirect)
    for _ in range(3):  # three tasks' clients
        raw = rr.RawClient(front.url)
        assert [e.position for e in rr.read_range_raw(raw, "t", BEFORE_EARLIEST, (7, 0), settings=FAST)] == [(7, 0)]
        raw.close()
    assert len(front.commands(T.LOOKUP)) == 1 and len(owner.commands(T.SUBSCRIBE)) == 3
    owner.missing.add("t")  # the owner no longer has it
    with pytest.raises(TopicNotFoundError):
        rr.latest_position_raw(rr.RawClient(front.url), "t")
    assert rr.LOOKUPS.get(front.url, "t") is None, "a failed open forgets where the topic was"
    owner.missing.clear()
    assert rr.latest_position_raw(rr.RawClient(front.url), "t") is not None
    assert len(front.commands(T.LOOKUP)) == 2, "looked up afresh"


def test_the_lookup_cache_expires_and_keeps_at_most_its_limit() -> None:
    now = [1000.0]
    cache = rr.LookupCache(ttl_s=300.0, limit=2, clock=lambda: now[0])
    here = ServiceAddress.parse("pulsar://127.0.0.1:6650")
    for topic in ("a", "b", "c"):
        cache.put("pulsar://svc", topic, here, None)
        now[0] += 100.0
    # Put at 1000, 1100 and 1200: "a" went for the limit; at 1300 "b" and "c" are within their 300 s.
    assert cache.get("pulsar://svc", "a") is None
    assert cache.get("pulsar://svc", "b") == (here, None) and cache.get("pulsar://svc", "c") == (here, None)
    assert cache.get("pulsar://other", "c") is None, "per service URL"
    now[0] = 1400.0  # "b" expires at 1400 (still kept at it), "c" at 1500
    assert cache.get("pulsar://svc", "b") == (here, None)
    now[0] = 1400.5
    assert cache.get("pulsar://svc", "b") is None and cache.get("pulsar://svc", "c") == (here, None)
    cache.put("pulsar://svc", "b", here, None)  # looked up again: a new 300 s from now
    now[0] = 1500.5
    assert cache.get("pulsar://svc", "c") is None and cache.get("pulsar://svc", "b") == (here, None)


def test_a_corrupt_entry_is_refused_and_read_again(scripted: Callable[..., ScriptedBroker]) -> None:
    good = _entry_bytes(7, 1)
    bad = bytearray(good)
    bad[-1] ^= 0x40
    broker = scripted(entries=[(7, 0, _entry_bytes(7, 0)), (7, 1, bytes(bad))])
    stats = ReadStats()

    def mend_once_refused() -> None:  # the corruption lasts until the reader refused it (whatever stalls came first)
        wait_for(lambda: stats.errors >= 1)
        broker.entries[1] = (7, 1, good)

    mender = threading.Thread(target=mend_once_refused, daemon=True)
    mender.start()
    it = rr.read_range_raw(rr.RawClient(broker.url), "t", BEFORE_EARLIEST, (7, 1), settings=QUICK, stats=stats)
    assert next(it).position == (7, 0)
    assert [e.payload for e in it] == [good]
    mender.join(5)
    assert stats.errors >= 1 and "checksum mismatch" in (stats.last_error or "")


def test_compressed_entry_bytes_pass_through_untouched(scripted: Callable[..., ScriptedBroker]) -> None:
    payload = b"abc" * 100
    md = MessageMetadata(
        producer_name="p",
        sequence_id=1,
        publish_time=5,
        compression=CompressionType.ZSTD,
        uncompressed_size=len(payload),
    )
    data = encode_entry(md, compress(CompressionType.ZSTD, payload))
    broker = scripted(entries=[(7, 0, data)])
    (entry,) = rr.read_range_raw(rr.RawClient(broker.url), "t", BEFORE_EARLIEST, (7, 0), settings=FAST)
    assert entry.payload == data and entry.publish_time == 5 and entry.num_messages == 1


def test_unsupported_auth_plugin_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="authPluginClassName: the raw-entry reader supports token, basic and TLS"):
        rr.RawClient("pulsar://h:1", {"authPluginClassName": "org.apache.pulsar.client.impl.auth.oauth2.X"})
    with pytest.raises(ConfigError, match="AuthenticationBasic needs userId and password"):
        rr.RawClient("pulsar://h:1", {"authPluginClassName": "AuthenticationBasic", "authParams": "{}"})


def test_received_entries_are_acknowledged_cumulatively(scripted: Callable[..., ScriptedBroker]) -> None:
    broker = scripted(entries=[(7, i, _entry_bytes(7, i)) for i in range(6)])
    small = ReaderSettings(**{**FAST.__dict__, "receiver_queue_size": 4})
    entries = list(rr.read_range_raw(rr.RawClient(broker.url), "t", BEFORE_EARLIEST, (7, 5), settings=small))
    assert len(entries) == 6
    acks = wait_for(lambda: broker.commands(T.ACK))
    assert acks and all(a.ack.ack_type == 1 for a in acks)  # Cumulative
    assert (acks[0].ack.message_id[0].ledgerId, acks[0].ack.message_id[0].entryId) == (7, 1)
    flows = broker.commands(T.FLOW)
    assert [f.flow.messagePermits for f in flows][:2] == [4, 2]  # the queue, then topped up by half


def test_a_topic_the_broker_does_not_have_is_answered_as_not_found_and_never_created(
    scripted: Callable[..., ScriptedBroker],
) -> None:
    """Every way of asking for a latest position tells a missing topic (Pulsar's TopicNotFound: our subscriptions
    do not ask it to create the topic) from a failure, so the planner can let go of a deleted topic."""
    gone, there = "persistent://public/default/gone", "persistent://public/default/there"
    broker = scripted(missing={gone})
    raw = rr.RawClient(broker.url)
    with pytest.raises(TopicNotFoundError, match="TopicNotFound"):
        rr.latest_position_raw(raw, gone)
    answers = latest_positions_raw(raw, [gone, there])
    assert isinstance(answers[gone], TopicNotFoundError) and answers[there] == (7, 3)
    held = HeldPositions(raw)
    try:
        answers = held.ask([gone, there])
        assert isinstance(answers[gone], TopicNotFoundError) and answers[there] == (7, 3)
        assert held.held() == 1, "nothing is held on a topic that does not exist"
    finally:
        held.close()
    assert all(not c.subscribe.force_topic_creation for c in broker.commands(T.SUBSCRIBE))


def test_a_kept_subscription_name_does_not_make_a_read_skip(tmp_path: Any) -> None:
    """pulsar-lite keeps a subscription whose consumer was connected when it was killed, with its place, and a
    new subscription under that name starts there, whatever start it asks for. Subscription names are reused by
    the next process on the same slot (subscription_names), so a restarted job can meet one: here a range capped
    before that place was taken as ended and read as empty, and its entries were never offloaded (the chaos
    bench's S3 run, 2026-11-28: 690 acknowledged messages missing at a ledger change)."""
    topic = "persistent://public/default/kept-name"
    with EmbeddedBroker(tmp_path / "broker") as broker:
        broker.start()
        produce(broker.service_url, topic, 30, 16, batching=False)
        client = rr.RawClient(broker.service_url)
        ledger = rr.latest_position_raw(client, topic)[0]  # type: ignore[index]
        # A held consumer at the latest position (the planner's watch), connected when the broker is killed.
        name = NAMES.take(topic)
        conn = client.connect_for(topic)
        consumer_id, rid = client.next_consumer_id(), conn.next_request_id()
        conn.request(rr.latest_subscribe_command(topic, consumer_id, rid, name), rid, "subscribing")
        broker.kill()
        conn.close()
        broker.start()
        produce(broker.service_url, topic, 20, 16, batching=False)  # 30..49, in the same ledger
        NAMES.give_back(topic, name)  # the next process on this slot names its first subscription the same
        stats = ReadStats()
        entries = list(
            rr.read_range_raw(client, topic, (ledger, 4), (ledger, 20), settings=FAST, end_is_known=False, stats=stats)
        )
        assert [e.position for e in entries] == [(ledger, i) for i in range(5, 21)]
        assert stats.first_rechecks == 1, "the kept place (30) came first, and was asked again"
        client.close()


def test_a_kept_connection_the_broker_closed_while_idle_is_not_reused(
    make_broker: Callable[..., EmbeddedBroker],
) -> None:
    """A client keeps a clean connection for its next consumer; if the broker closed it meanwhile (idle past its
    keep-alive), the next consumer opens a new one at once instead of failing on it first and retrying."""
    broker = make_broker(default_partitions=0, keep_alive_s=1)
    topic = unique_topic("kept-idle")
    produce(broker.service_url, topic, 3, 16, batching=False)
    raw = rr.RawClient(broker.service_url)
    try:
        assert len(list(rr.read_range_raw(raw, topic, BEFORE_EARLIEST, (0, 2), settings=FAST))) == 3
        assert wait_for(lambda: "liveness check timed out" in broker.log_path.read_text(), timeout=10)
        stats = ReadStats()
        assert len(list(rr.read_range_raw(raw, topic, BEFORE_EARLIEST, (0, 2), settings=FAST, stats=stats))) == 3
        assert (stats.errors, stats.reopens) == (0, 0)
    finally:
        raw.close()
