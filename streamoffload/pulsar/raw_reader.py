"""Reading topic-partitions as the broker stores them: entries byte for byte, over Pulsar's binary protocol.

:func:`read_range_raw` is :func:`streamoffload.pulsar.exactly_once.read_exactly_once` -- the loop the
``pulsar-client`` reader (:func:`streamoffload.pulsar.client_reader.read_range`) uses too: exact
``(start, end]`` ranges, once each and in order, duplicates dropped, stalled readers re-opened at the
last emitted position, reconnects with backoff, data loss confirmed by one re-read -- over
:class:`RawConsumer`. It does not rebuild entries: each
``CommandMessage`` frame the broker pushes carries one stored entry as headers-and-payload::

    [u32 totalSize][u32 commandSize][BaseCommand{MESSAGE}]
    ([u16 0x0e02][u32 n][BrokerEntryMetadata])? [u16 0x0e01][u32 crc32c][u32 m][MessageMetadata][payload]

and everything after the command is the entry, emitted untouched: compression, sequence ids,
encryption, schema versions, chunking fields, null values and keys stay as the producer wrote them.
The CRC-32C is verified on receipt (a mismatch re-opens the reader, like any error) and the message
count comes from the metadata (``num_messages_in_batch``), without unpacking anything. pulsar-lite
hands entries out without their ``0x0e01`` checksum section (a pre-v6 layout ``decode_entry`` accepts,
as Pulsar does): there nothing can be verified, and the entries are the producer's bytes after it.

Broker entry metadata (``0x0e02``, PIP-70): a broker with ``brokerEntryMetadataInterceptors`` stores
it in front of every entry, so Pulsar's offloaders, which copy the stored ledger entries, keep it.
A broker sends it to a consumer only when the consumer says it supports it (protocol version >= 18
and ``FeatureFlags.supports_broker_entry_metadata``, both sent here) and the broker has
``exposingBrokerEntryMetadataToClientEnabled=true``; with that setting the entries read here are the
stored bytes exactly. Without it the broker strips the prefix before sending, and the entries are
the stored bytes minus that prefix (pulsar-lite has no broker entry metadata at all).

Protocol steps (field numbers in ``codecs/proto/pulsar_api.proto``, checked against upstream
``PulsarApi.proto``): the connection's ``CONNECT`` handshake, TLS and authentication
(``streamoffload/pulsar/broker_connection.py``), then ``LOOKUP`` (``Redirect``
followed, ``Connect`` to the owning broker, ``proxy_through_service_url`` honoured by reconnecting to
the service URL with ``proxy_to_broker_url``), ``SUBSCRIBE`` (Exclusive, non-durable, a unique
subscription name, ``start_message_id`` = the last emitted position or earliest), ``FLOW`` permits
(counted in messages, topped up as they are used), ``MESSAGE`` frames, ``GET_LAST_MESSAGE_ID``,
cumulative ``ACK`` of what arrived (as Pulsar's own readers do), ``CLOSE_CONSUMER``; ``PING`` is
answered with ``PONG``.

Connection options (the source's ``pulsar.client.*`` options, prefix removed, names as
:func:`client_options.client_kwargs` takes them; parsed by :class:`client_options.ConnectionConfig`):
``authToken`` or ``authPluginClassName`` + ``authParams`` for the token (``token:...``, ``file:...``),
basic (``{"userId": .., "password": ..}`` or ``userId:..,password:..``) and TLS
(``tlsCertFile:..,tlsKeyFile:..``) plugins; ``pulsar+ssl://`` with ``tlsTrustCertsFilePath``,
``tlsAllowInsecureConnection``, ``tlsValidateHostname``; ``connectionTimeoutMs`` and
``operationTimeoutSeconds``. Other plugins (OAuth2, custom) raise
:class:`ConfigError`: read such clusters with the ``pulsar-client`` reader.

TLS failures that configuration causes are not retried (``streamoffload/pulsar/broker_connection.py``). What is
tested against what:
``tests/pulsar/test_raw_tls.py`` (TLS, through a TLS-terminating proxy in front of pulsar-lite) and
the module docstring of ``tests/pulsar/test_raw_reader.py``.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, NamedTuple

from streamoffload.codecs.entry import decode_entry, metadata_num_messages
from streamoffload.codecs.errors import FormatError
from streamoffload.codecs.positions import Position
from streamoffload.codecs.proto.pulsar_api_pb2 import (
    BaseCommand,
    CommandAck,
    CommandLookupTopicResponse,
    CommandSubscribe,
    MessageIdData,
)
from streamoffload.pulsar.broker_connection import BrokerConnection, lookup_refusal
from streamoffload.pulsar.client_options import ConnectionConfig, ServiceAddress
from streamoffload.pulsar.exactly_once import (
    BEFORE_EARLIEST,
    Probe,
    PulsarIOError,
    RangeConsumer,
    ReadEntry,
    ReaderSettings,
    ReadStats,
    TopicNotFoundError,
    follows,
    read_exactly_once,
)
from streamoffload.pulsar.subscription_names import NAMES
from streamoffload.pulsar.wire import T, server_error

log = logging.getLogger(__name__)

__all__ = [
    "RawClient",
    "RawConsumer",
    "RawMessage",
    "hold_subscription_raw",
    "latest_position_raw",
    "probe_after_raw",
    "read_range_raw",
]

_U64 = (1 << 64) - 1  # MessageId.earliest's -1, as the uint64 the protocol carries
_MAX_LOOKUP_HOPS = 8
CLOSE_WAIT_S = 2.0  # for the broker's answer to a closing consumer's unsubscribe
_ACK_EVERY = 16  # entries between cumulative acks (brokers redeliver what a consumer never acks)


# ---------------------------------------------------------------------------------------------
# client and consumer


class RawMessage(NamedTuple):
    """One entry as received: position, publish time (ms), message count and the stored bytes."""

    ledger_id: int
    entry_id: int
    publish_time: int
    num_messages: int
    payload: bytes | bytearray
    """A large entry is the ``bytearray`` it was received into (no copy)."""


_MAX_IDLE = 4
"""Connections a ``RawClient`` keeps for its next consumers."""


class LookupCache:
    """Where each topic-partition was found last (its broker, or the proxy and the broker to ask it for), per
    service URL, for this process: the job's tasks open a consumer per range, every micro-batch on the same
    active topic-partitions, and a lookup is one of the three round trips each open waits for. An entry is
    dropped when a consumer opened through it fails (the topic moved: the retry looks it up afresh) and
    after ``ttl_s`` of ``clock`` (seconds); at most ``limit`` are kept (the oldest go first)."""

    def __init__(
        self, ttl_s: float = 300.0, limit: int = 100_000, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.ttl_s = ttl_s
        self.limit = limit
        self._clock = clock
        self._found: dict[tuple[str, str], tuple[ServiceAddress, str | None, float]] = {}
        self._lock = threading.Lock()

    def get(self, service_url: str, topic: str) -> tuple[ServiceAddress, str | None] | None:
        with self._lock:
            found = self._found.get((service_url, topic))
            if found is None:
                return None
            if found[2] < self._clock():
                del self._found[(service_url, topic)]
                return None
            return found[0], found[1]

    def put(self, service_url: str, topic: str, address: ServiceAddress, proxy_to: str | None) -> None:
        with self._lock:
            self._found.pop((service_url, topic), None)
            self._found[(service_url, topic)] = (address, proxy_to, self._clock() + self.ttl_s)
            while len(self._found) > self.limit:
                del self._found[next(iter(self._found))]

    def forget(self, service_url: str, topic: str) -> None:
        with self._lock:
            self._found.pop((service_url, topic), None)

    def clear(self) -> None:
        with self._lock:
            self._found.clear()


LOOKUPS = LookupCache()
"""This process's lookups (``RawClient.connect_for``)."""


class RawClient:
    """A cluster to read raw entries from. A consumer has a connection to itself; once it was unsubscribed
    cleanly (the broker answered, and it never waited out a stall) its connection is kept for the client's
    next consumer, so a task reading a hundred ranges makes one connection, not a hundred (each a TCP
    connection, a ``CONNECT`` handshake and a lookup). A stalled or broken consumer's connection is closed
    with it, and consumer ids are never reused on a client, so nothing stale is read later. Threads may share
    one (the sink's fetches); ``close`` closes the kept connections."""

    def __init__(self, service_url: str, options: Mapping[str, str] | None = None) -> None:
        self.service_url = service_url
        self.config = ConnectionConfig.parse(service_url, options)
        self._idle: list[BrokerConnection] = []
        self._consumer_ids = itertools.count(1)
        self._lock = threading.Lock()

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    def next_consumer_id(self) -> int:
        with self._lock:
            return next(self._consumer_ids)

    def keep(self, conn: BrokerConnection) -> None:
        """``conn`` is clean (no consumer left on it): the next consumer may use it."""
        with self._lock:
            self._idle.append(conn)
            extra = self._idle[:-_MAX_IDLE]
            del self._idle[:-_MAX_IDLE]
        for old in extra:
            old.close()

    def _connection(self, address: ServiceAddress, proxy_to: str | None = None) -> BrokerConnection:
        """A kept connection to ``address`` (through a proxy to ``proxy_to``) that is still open, else a new one
        (the broker closes a connection left idle past its keep-alive)."""
        while True:
            with self._lock:
                kept = next(
                    (i for i, c in enumerate(self._idle) if c.address == address and c.proxy_to == proxy_to), None
                )
                conn = self._idle.pop(kept) if kept is not None else None
            if conn is None:
                return BrokerConnection(self.config, address, proxy_to_broker_url=proxy_to)
            try:
                conn.take_in_now()  # answers a PING on the way; raises if the broker closed it
                return conn
            except (OSError, PulsarIOError):
                conn.close()

    def connect_for(self, topic: str) -> BrokerConnection:
        """A connection to the broker that serves ``topic``: where a lookup found it before (``LOOKUPS``), else
        found by binary-protocol lookup now. A caller whose use of the connection fails calls ``LOOKUPS.forget``."""
        cached = LOOKUPS.get(self.service_url, topic)
        if cached is not None:
            return self._connection(*cached)
        conn = self._look_up(topic)
        LOOKUPS.put(self.service_url, topic, conn.address, conn.proxy_to)
        return conn

    def _look_up(self, topic: str) -> BrokerConnection:
        cfg = self.config
        conn = self._connection(cfg.service)
        authoritative = False
        try:
            for _hop in range(_MAX_LOOKUP_HOPS):
                resp = conn.lookup(topic, authoritative)
                if resp.response == CommandLookupTopicResponse.Failed:
                    raise lookup_refusal(resp, topic, conn.name)
                url = resp.brokerServiceUrlTls if cfg.service.tls else resp.brokerServiceUrl
                target = ServiceAddress.parse(url) if url else None
                if resp.proxy_through_service_url and target is not None:
                    # A proxy: keep talking to the service URL, asking it to forward to the broker.
                    self.keep(conn)
                    conn = self._connection(cfg.service, f"{target.host}:{target.port}")
                    if resp.response == CommandLookupTopicResponse.Connect:
                        return conn
                    authoritative = resp.authoritative
                    continue
                if target is None or (target.host, target.port) == (conn.address.host, conn.address.port):
                    # No URL for our scheme (e.g. a TLS terminator in front of a plain broker) or the
                    # broker we are talking to: stay on this connection.
                    if resp.response == CommandLookupTopicResponse.Connect or target is None:
                        return conn
                    authoritative = resp.authoritative
                    continue
                self.keep(conn)
                conn = self._connection(target)
                if resp.response == CommandLookupTopicResponse.Connect:
                    return conn
                authoritative = resp.authoritative
            raise PulsarIOError(f"lookup of {topic} was redirected more than {_MAX_LOOKUP_HOPS} times")
        except BaseException:
            conn.close()
            raise

    def open_consumer(self, topic: str, after: Position, queue_size: int) -> RawConsumer:
        return RawConsumer(self, topic, after, queue_size)


def subscribe_command(topic: str, consumer_id: int, request_id: int, after: Position, subscription: str) -> BaseCommand:
    """``SUBSCRIBE`` to a non-durable Exclusive subscription named ``subscription`` (no other consumer may
    be using it: see ``subscription_names``) starting after ``after``."""
    cmd = _non_durable_subscribe(topic, consumer_id, request_id, subscription)
    s = cmd.subscribe
    if after <= BEFORE_EARLIEST:
        s.start_message_id.CopyFrom(MessageIdData(ledgerId=_U64, entryId=_U64))
    else:
        # (L, -1), "before ledger L's first entry", starts at (L, 0): ids are unsigned on the wire, and
        # the reader drops whatever arrives at or before ``after`` anyway.
        s.start_message_id.CopyFrom(MessageIdData(ledgerId=after[0], entryId=max(after[1], 0)))
    s.initialPosition = CommandSubscribe.Earliest
    return cmd


def latest_subscribe_command(topic: str, consumer_id: int, request_id: int, subscription: str) -> BaseCommand:
    """``SUBSCRIBE`` to a non-durable Exclusive subscription starting at the topic's latest position: a consumer
    kept to ask ``GET_LAST_MESSAGE_ID`` on and, with one permit, to be pushed the next entry
    (``latest_positions.HeldPositions``), holding nothing older."""
    cmd = _non_durable_subscribe(topic, consumer_id, request_id, subscription)
    cmd.subscribe.initialPosition = CommandSubscribe.Latest
    return cmd


def _non_durable_subscribe(topic: str, consumer_id: int, request_id: int, subscription: str) -> BaseCommand:
    cmd = BaseCommand(type=T.SUBSCRIBE)
    s = cmd.subscribe
    s.topic = topic
    s.subscription = subscription
    s.subType = CommandSubscribe.Exclusive
    s.consumer_id = consumer_id
    s.request_id = request_id
    s.durable = False
    s.read_compacted = False
    # A reader never creates a topic: one an operator deleted is not brought back by the offloader asking
    # about it (Pulsar creates a missing topic on subscribe by default). The broker answers TopicNotFound.
    s.force_topic_creation = False
    return cmd


def last_message_id_command(consumer_id: int, request_id: int) -> BaseCommand:
    cmd = BaseCommand(type=T.GET_LAST_MESSAGE_ID)
    cmd.getLastMessageId.consumer_id = consumer_id
    cmd.getLastMessageId.request_id = request_id
    return cmd


def last_position(answer: BaseCommand | PulsarIOError) -> Position | None:
    """The position a ``GET_LAST_MESSAGE_ID`` answer names; None when the topic has no entry (a -1 id, or
    pulsar-lite's "no messages" error); other errors are raised."""
    if isinstance(answer, PulsarIOError):
        if "no messages" in str(answer).lower():  # pulsar-lite's answer for an empty topic
            return None
        raise answer
    last = answer.getLastMessageIdResponse.last_message_id
    ledger, entry = last.ledgerId, last.entryId
    if ledger >= 1 << 63 or entry >= 1 << 63:  # -1 as uint64
        return None
    return (ledger, entry)


def flow_command(consumer_id: int, permits: int) -> BaseCommand:
    """``permits`` more entries the broker may push to the consumer."""
    cmd = BaseCommand(type=T.FLOW)
    cmd.flow.consumer_id = consumer_id
    cmd.flow.messagePermits = permits
    return cmd


def unsubscribe_command(consumer_id: int, request_id: int) -> BaseCommand:
    """``UNSUBSCRIBE``: closes the consumer and deletes its subscription. A reader's non-durable subscription
    goes with its last consumer in Pulsar, but pulsar-lite keeps it, and then walks every one it kept on each
    publish to the topic (logging a warning for each): a source that subscribes anew every micro-batch would
    make each publish cost more the longer the job runs. Pulsar answers it like a close."""
    cmd = BaseCommand(type=T.UNSUBSCRIBE)
    cmd.unsubscribe.consumer_id = consumer_id
    cmd.unsubscribe.request_id = request_id
    return cmd


def close_consumer_command(consumer_id: int, request_id: int) -> BaseCommand:
    cmd = BaseCommand(type=T.CLOSE_CONSUMER)
    cmd.close_consumer.consumer_id = consumer_id
    cmd.close_consumer.request_id = request_id
    return cmd


class RawConsumer:
    """A non-durable Exclusive subscription that starts after ``after`` and receives raw entries."""

    def __init__(self, client: RawClient, topic: str, after: Position, queue_size: int, *, flow: bool = True) -> None:
        self.topic = topic
        self._client = client
        self.conn = client.connect_for(topic)
        self.consumer_id = client.next_consumer_id()
        self._stalled = False
        """A ``receive`` waited out its timeout: the connection is not kept for another consumer."""
        self._queue = max(int(queue_size), 1)
        self._used = 0
        self._unacked = 0
        self._acked_to: Position = BEFORE_EARLIEST
        self._closed = False
        self.subscription = NAMES.take(topic)
        try:
            rid = self.conn.next_request_id()
            self.conn.request(
                subscribe_command(topic, self.consumer_id, rid, after, self.subscription),
                rid,
                f"subscribing to {topic}",
            )
            if flow:
                self._flow(self._queue)
        except BaseException:
            LOOKUPS.forget(client.service_url, topic)  # it may have moved: the retry looks it up again
            self.conn.close()
            raise

    def _ack(self) -> None:
        """Acknowledge cumulatively up to the highest position received, as Pulsar's readers do for
        their non-durable subscriptions: the broker then neither keeps nor redelivers those entries
        (pulsar-lite redelivers unacknowledged entries over and over)."""
        self._unacked = 0
        if self._acked_to < (0, 0):
            return
        cmd = BaseCommand(type=T.ACK)
        cmd.ack.consumer_id = self.consumer_id
        cmd.ack.ack_type = CommandAck.Cumulative
        cmd.ack.message_id.add(ledgerId=self._acked_to[0], entryId=self._acked_to[1])
        self.conn.send(cmd)

    def _flow(self, permits: int) -> None:
        self.conn.send(flow_command(self.consumer_id, permits))

    def receive(self, timeout_ms: int) -> RawMessage | None:
        """The next entry, its CRC-32C verified; None when none arrives within ``timeout_ms``."""
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            got = self.conn.read(deadline)
            if got is None:
                self._stalled = True
                return None
            cmd, payload = got
            kind = cmd.type
            if kind == T.MESSAGE:
                m = cmd.message
                if m.consumer_id != self.consumer_id:
                    continue
                if payload is None:
                    raise PulsarIOError(f"{self.topic}: message frame without an entry from {self.conn.name}")
                mid = m.message_id
                where = f"{self.topic} entry {mid.ledgerId}:{mid.entryId}"
                decoded = decode_entry(payload, where=where)  # checks the CRC-32C and the metadata
                count = metadata_num_messages(decoded.metadata)
                self._used += count
                self._unacked += 1
                if (mid.ledgerId, mid.entryId) > self._acked_to:
                    self._acked_to = (mid.ledgerId, mid.entryId)
                if self._unacked >= _ACK_EVERY or self._used >= (self._queue + 1) // 2:
                    self._ack()
                if self._used >= (self._queue + 1) // 2:
                    self._flow(self._used)
                    self._used = 0
                return RawMessage(mid.ledgerId, mid.entryId, decoded.metadata.publish_time, count, payload)
            if kind == T.CLOSE_CONSUMER and cmd.close_consumer.consumer_id == self.consumer_id:
                raise PulsarIOError(f"{self.topic}: the broker {self.conn.name} closed the consumer")
            if kind == T.ERROR:
                log.warning("%s: broker error: %s (%s)", self.topic, cmd.error.message, server_error(cmd.error.error))

    def last_message_id(self) -> Position | None:
        """The broker's last position of the topic; None when it has no entry."""
        rid = self.conn.next_request_id()
        cmd = last_message_id_command(self.consumer_id, rid)
        try:
            return last_position(self.conn.request(cmd, rid, f"GetLastMessageId of {self.topic}"))
        except PulsarIOError as err:
            return last_position(err)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        clean = False
        try:
            # Waits for the answer (one round trip, bounded): a broker that answers into a closed socket
            # logs an error for it.
            rid = self.conn.next_request_id()
            with contextlib.suppress(Exception):
                self.conn.request(
                    unsubscribe_command(self.consumer_id, rid), rid, "unsubscribing", timeout_s=CLOSE_WAIT_S
                )
                NAMES.give_back(self.topic, self.subscription)  # only once the broker said it is gone
                clean = not self._stalled
        finally:
            if clean:
                self._client.keep(self.conn)
            else:
                LOOKUPS.forget(self._client.service_url, self.topic)
                self.conn.close()


# ---------------------------------------------------------------------------------------------
# positions


def latest_position_raw(client: RawClient, topic: str) -> Position | None:
    """The position of the last entry of a topic-partition (``GetLastMessageId`` on a non-durable
    subscription, which goes with its consumer), ``None`` when it has none."""
    try:
        consumer = RawConsumer(client, topic, BEFORE_EARLIEST, 1, flow=False)
    except TopicNotFoundError:
        raise
    except (OSError, PulsarIOError) as err:
        raise PulsarIOError(f"cannot ask {topic} for its last entry: {err}") from err
    try:
        return consumer.last_message_id()
    except (OSError, PulsarIOError) as err:
        raise PulsarIOError(f"cannot ask {topic} for its last entry: {err}") from err
    finally:
        consumer.close()


def probe_after_raw(
    client: Any,
    topic: str,
    after: Position,
    *,
    settings: ReaderSettings | None = None,
    attempts: int = 3,
) -> Probe | None:
    """The first entry after ``after`` with its exact size and message count, or ``None`` if none
    arrives in ``attempts`` subscriptions. One that is not certainly the next (``follows``) counts once a second
    subscription delivers it too: a kept subscription name resumes at its old place (``read_exactly_once``)."""
    settings = settings or ReaderSettings()
    timeout = max(settings.stall_timeout_ms, 500)
    candidate: Probe | None = None
    for _ in range(attempts):
        try:
            consumer = client.open_consumer(topic, after, 1)
        except (OSError, PulsarIOError) as err:
            log.warning("%s: probe after %s could not subscribe: %s", topic, after, err)
            time.sleep(settings.initial_backoff_s)
            continue
        try:
            while True:
                msg = consumer.receive(timeout)
                if msg is None:
                    break
                pos = (msg.ledger_id, msg.entry_id)
                if pos <= after:
                    continue
                probe = Probe(pos, msg.num_messages, len(msg.payload), msg.publish_time)
                if follows(after, pos) or (candidate is not None and candidate.position == pos):
                    return probe
                candidate = probe  # asked again on a new subscription (this one is unsubscribed below)
                break
        except (OSError, PulsarIOError, FormatError) as err:
            log.warning("%s: probe after %s failed: %s", topic, after, err)
        finally:
            consumer.close()
        if candidate is None:
            timeout = min(timeout * 2, settings.max_stall_timeout_ms)
    return candidate


# ---------------------------------------------------------------------------------------------
# reading ranges


def read_range_raw(
    client: Any,
    topic: str,
    start: Position,
    end: Position,
    *,
    settings: ReaderSettings | None = None,
    end_is_known: bool = True,
    stats: ReadStats | None = None,
) -> Iterator[ReadEntry]:
    """The stored entries of ``topic`` with positions in ``(start, end]``, in order, once each.

    ``client`` is a :class:`RawClient` (or anything with ``open_consumer(topic, after, queue_size)``
    returning a :class:`~streamoffload.pulsar.exactly_once.RangeConsumer`). The contract, including
    ``end_is_known`` and the fault handling, is
    :func:`~streamoffload.pulsar.exactly_once.read_exactly_once`'s, which this is.
    """
    settings = settings or ReaderSettings()

    def open_consumer(after: Position) -> RangeConsumer:
        consumer: RangeConsumer = client.open_consumer(topic, after, settings.receiver_queue_size)
        return consumer

    # The stall timeout is not reset on progress: a broker that pauses every dozen entries (as
    # pulsar-lite does) would otherwise cost a re-subscription each time.
    return read_exactly_once(
        open_consumer, topic, start, end, settings=settings, end_is_known=end_is_known, stats=stats
    )


# ---------------------------------------------------------------------------------------------
# holding the broker's retention


def hold_subscription_raw(client: RawClient, topic: str, subscription: str, position: Position) -> None:
    """Acknowledge the durable subscription ``subscription`` of ``topic`` cumulatively up to ``position``
    (created at the earliest entry if it does not exist): the broker keeps every entry after it. A
    ``Failover`` subscription (cumulative acks allowed, and a second holder does not fail), no permits (it
    receives nothing); the consumer is closed with a request, so the ack is processed before the connection
    goes."""
    conn = client.connect_for(topic)
    try:
        consumer_id = 1
        rid = conn.next_request_id()
        cmd = BaseCommand(type=T.SUBSCRIBE)
        s = cmd.subscribe
        s.topic = topic
        s.subscription = subscription
        s.subType = CommandSubscribe.Failover
        s.consumer_id = consumer_id
        s.request_id = rid
        s.durable = True
        s.initialPosition = CommandSubscribe.Earliest
        conn.request(cmd, rid, f"subscribing {subscription} to {topic}")
        ack = BaseCommand(type=T.ACK)
        ack.ack.consumer_id = consumer_id
        ack.ack.ack_type = CommandAck.Cumulative
        ack.ack.message_id.add(ledgerId=position[0], entryId=position[1])
        conn.send(ack)
        rid = conn.next_request_id()
        conn.request(close_consumer_command(consumer_id, rid), rid, f"closing {subscription} of {topic}")
    finally:
        conn.close()
