"""The latest positions of many topic-partitions in a few round trips, over Pulsar's binary protocol.

The source asks for every topic-partition's latest position at each trigger. One at a time
(:func:`raw_reader.latest_position_raw`) that is a connection, a lookup, a subscription, a
``GET_LAST_MESSAGE_ID`` and a close per topic-partition: five round trips each, every trigger. Here the
lookups of all of them go out pipelined on one connection to the service URL; the topic-partitions are
grouped by the broker that owns them, and on one connection per broker the subscriptions, then the
``GET_LAST_MESSAGE_ID`` requests, go out pipelined too (``window`` awaiting an answer at once). So a
trigger costs about three round trips per broker, whatever the number of topic-partitions.

``HeldPositions`` does the same for a long-lived asker (the source's planner) over consumers it keeps open
between passes: one ``GET_LAST_MESSAGE_ID`` per topic-partition and pass, one round trip per broker.

What cannot be answered this way is left to the caller, one topic-partition at a time, with its retries:
a lookup that redirects (a real cluster answers the first lookup with the owner or a proxy; a second hop
is rare), a refused subscription, and every topic-partition of a broker whose connection failed. Each
comes back as its ``PulsarIOError``.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import threading
from collections.abc import Iterable, Sequence

from streamoffload.codecs.positions import Position
from streamoffload.codecs.proto.pulsar_api_pb2 import BaseCommand, CommandLookupTopicResponse
from streamoffload.pulsar.broker_connection import BrokerConnection, lookup_refusal
from streamoffload.pulsar.client_options import ServiceAddress
from streamoffload.pulsar.exactly_once import BEFORE_EARLIEST, PulsarIOError
from streamoffload.pulsar.raw_reader import (
    CLOSE_WAIT_S,
    RawClient,
    flow_command,
    last_message_id_command,
    last_position,
    latest_subscribe_command,
    subscribe_command,
    unsubscribe_command,
)
from streamoffload.pulsar.subscription_names import NAMES
from streamoffload.pulsar.wire import T

Route = tuple[str, int, bool, str | None]
"""Where a topic-partition is served: host, port, TLS, and the broker URL to ask a proxy for (or None)."""

Answer = Position | None | PulsarIOError
"""A topic-partition's latest position, None when it has no entry, or why it could not be had here."""

KEEP_ALIVE_S = 2.0
"""How often :class:`HeldPositions` takes in what its idle connections received, answering the broker's PINGs.
Pulsar closes a connection whose PONG does not come within its keep-alive interval (30 s by default; pulsar-lite
10 s), and a micro-batch can last longer than that."""

log = logging.getLogger(__name__)


def latest_positions_raw(client: RawClient, topics: Sequence[str], *, window: int = 256) -> dict[str, Answer]:
    """Every topic's latest position (see the module's docstring); each topic has an answer."""
    answers: dict[str, Answer] = {}
    cfg = client.config
    try:
        service = BrokerConnection(cfg, cfg.service)
    except (OSError, PulsarIOError) as err:
        failed = PulsarIOError(f"cannot reach {cfg.service.host}:{cfg.service.port} for latest positions: {err}")
        return dict.fromkeys(topics, failed)
    try:
        routes = _routes(service, topics, window, answers)
        for route, routed in routes.items():
            here = route == _route_of(service)
            try:
                conn = service if here else _connect(client, route)
            except (OSError, PulsarIOError) as err:
                answers.update(dict.fromkeys(routed, PulsarIOError(f"cannot reach {route[0]}:{route[1]}: {err}")))
                continue
            try:
                answers.update(_positions_on(conn, routed, window))
            except (OSError, PulsarIOError) as err:
                failure = PulsarIOError(f"latest positions at {conn.name}: {err}")
                answers.update({t: failure for t in routed if t not in answers})
            finally:
                if not here:
                    conn.close()
    except (OSError, PulsarIOError) as err:
        failure = PulsarIOError(f"lookups at {service.name}: {err}")
        answers.update({t: failure for t in topics if t not in answers})
    finally:
        service.close()
    return answers


def _route_of(conn: BrokerConnection, proxy_to: str | None = None) -> Route:
    return (conn.address.host, conn.address.port, conn.address.tls, proxy_to)


def _routes(
    service: BrokerConnection, topics: Sequence[str], window: int, answers: dict[str, Answer]
) -> dict[Route, list[str]]:
    """The topics grouped by the connection that serves them; those that cannot be placed go to
    ``answers`` as errors."""
    requests = []
    for topic in topics:
        rid = service.next_request_id()
        cmd = BaseCommand(type=T.LOOKUP)
        cmd.lookupTopic.topic = topic
        cmd.lookupTopic.request_id = rid
        cmd.lookupTopic.authoritative = False
        requests.append((cmd, rid, f"lookup of {topic}"))
    replies = service.request_many(requests, window=window)
    routes: dict[Route, list[str]] = {}
    tls = service.config.service.tls
    for (_cmd, rid, _what), topic in zip(requests, topics, strict=True):
        reply = replies[rid]
        if isinstance(reply, PulsarIOError):
            answers[topic] = reply
            continue
        resp = reply.lookupTopicResponse
        if resp.response == CommandLookupTopicResponse.Failed:
            answers[topic] = lookup_refusal(resp, topic, service.name)
            continue
        url = resp.brokerServiceUrlTls if tls else resp.brokerServiceUrl
        target = ServiceAddress.parse(url) if url else None
        if resp.response != CommandLookupTopicResponse.Connect and target is not None:
            answers[topic] = PulsarIOError(f"lookup of {topic} redirected to {url}: asked again on its own")
            continue
        if target is None or (target.host, target.port) == (service.address.host, service.address.port):
            route = _route_of(service)
        elif resp.proxy_through_service_url:
            route = _route_of(service, f"{target.host}:{target.port}")
        else:
            route = (target.host, target.port, target.tls, None)
        routes.setdefault(route, []).append(topic)
    return routes


def _connect(client: RawClient, route: Route) -> BrokerConnection:
    host, port, tls, proxy_to = route
    cfg = client.config
    if proxy_to is not None:
        return BrokerConnection(cfg, cfg.service, proxy_to_broker_url=proxy_to)
    return BrokerConnection(cfg, ServiceAddress(host, port, tls))


def _positions_on(conn: BrokerConnection, topics: Sequence[str], window: int) -> dict[str, Answer]:
    """On one broker: subscribe to every topic (one consumer each), ask each its last message id, close."""
    answers: dict[str, Answer] = {}
    subscribes = []
    names = [NAMES.take(topic) for topic in topics]
    for consumer_id, (topic, name) in enumerate(zip(topics, names, strict=True), start=1):
        rid = conn.next_request_id()
        command = subscribe_command(topic, consumer_id, rid, BEFORE_EARLIEST, name)
        subscribes.append((command, rid, f"subscribing to {topic}"))
    subscribed = conn.request_many(subscribes, window=window)
    asked: list[tuple[str, int, str]] = []  # (topic, consumer id, subscription) of the subscriptions made
    asks = []
    for consumer_id, ((_cmd, rid, _what), topic, name) in enumerate(
        zip(subscribes, topics, names, strict=True), start=1
    ):
        reply = subscribed[rid]
        if isinstance(reply, PulsarIOError):
            answers[topic] = reply
            continue
        ask_id = conn.next_request_id()
        asks.append((last_message_id_command(consumer_id, ask_id), ask_id, f"GetLastMessageId of {topic}"))
        asked.append((topic, consumer_id, name))
    try:
        lasts = conn.request_many(asks, window=window)
        for (topic, _consumer_id, _name), (_cmd, ask_id, _what) in zip(asked, asks, strict=True):
            try:
                answers[topic] = last_position(lasts[ask_id])
            except PulsarIOError as err:
                answers[topic] = err
    finally:
        # Unsubscribed, not only closed: pulsar-lite keeps a closed reader's subscription and pays for it on
        # every publish (raw_reader.unsubscribe_command). The answers are awaited (pipelined, one round trip)
        # because a broker answering into a closed socket logs an error each time, for at most a reader's close
        # wait: a broker that stopped answering must not hold the planner for another operation timeout.
        with contextlib.suppress(OSError, PulsarIOError):
            _unsubscribe(conn, asked, window)
    return answers


def _unsubscribe(
    conn: BrokerConnection, consumers: Sequence[tuple[str, int, str]], window: int, *, give_back: bool = True
) -> set[int]:
    """Unsubscribe ``(topic, consumer id, subscription)`` consumers, pipelined, awaiting the answers at most
    ``CLOSE_WAIT_S``; returns the consumer ids whose unsubscribe was answered, and (``give_back``) their names go
    back to the pool. Raises when the connection fails."""
    closes = []
    for _topic, consumer_id, _name in consumers:
        rid = conn.next_request_id()
        closes.append((unsubscribe_command(consumer_id, rid), rid, "unsubscribing"))
    gone = conn.request_many(closes, window=window, timeout_s=CLOSE_WAIT_S)
    answered = set()
    for (topic, consumer_id, name), (_cmd, rid, _what) in zip(consumers, closes, strict=True):
        if rid in gone and not isinstance(gone[rid], PulsarIOError):
            answered.add(consumer_id)
            if give_back:
                NAMES.give_back(topic, name)
    return answered


class HeldPositions:
    """Latest positions over consumers kept open between passes: for a long-lived asker (the source's planner)
    that asks about the same topic-partitions trigger after trigger.

    A pass of ``latest_positions_raw`` costs per topic-partition a lookup, a subscription, a question and an
    unsubscription, and a connection per pass. Here a topic-partition is looked up and subscribed once and each
    pass is one ``GET_LAST_MESSAGE_ID`` per topic-partition, pipelined on one connection per broker kept open
    between passes. The consumers are non-durable and start at the latest position, so they hold nothing back
    on the broker.

    Each consumer is also a watch: it has one permit, so the broker pushes it the first entry published after
    it was subscribed, and :meth:`changed` names the topic-partitions whose consumer received one. The asker
    need not ask about the others (``armed``: nothing new since their watch was set) more than now and then.
    A consumer that received its entry is set again (unsubscribed, subscribed at the latest position, given a
    permit) once a pass finds its topic-partition unchanged since the pass before; the new consumer's answer
    is compared with the old, so an entry published in between is not missed.

    A failed connection drops its consumers and is made again within the same call, once; what still fails
    is answered with the failure, as a consumer's error answer is (the broker may have closed it: it is
    dropped and subscribed again next time); the caller asks those alone, with its retries. ``keep_only``
    lets go of topic-partitions no longer asked about; ``close`` of all. One asker; its calls and the keep-alive
    take turns on a lock.

    **Kept alive between passes.** The broker PINGs an idle connection and closes it when no PONG comes in time,
    and the asker reads its connections only while it asks: a micro-batch longer than the broker's keep-alive (on
    pulsar-lite 10 s, the first micro-batch of new traffic at 10,000 topic-partitions) lost every watch, and
    holding 10,000 of them again stalled the broker for minutes (bench/README, "Issue 24, session 39"). So a
    daemon thread takes in what the connections received every ``keep_alive_s`` (answering PINGs on the way;
    a pushed entry marks its topic-partition changed, as ``changed`` would)."""

    def __init__(self, client: RawClient, *, window: int = 256, keep_alive_s: float = KEEP_ALIVE_S) -> None:
        self.client = client
        self.window = window
        self.keep_alive_s = keep_alive_s
        self._lock = threading.RLock()
        self._stopped = threading.Event()
        self._keeper: threading.Thread | None = None
        self._connections: dict[Route, BrokerConnection] = {}
        self._held: dict[str, tuple[Route, int, str]] = {}
        """topic-partition -> (its connection's route, consumer id, subscription name)"""
        self._topic_of: dict[tuple[Route, int], str] = {}
        self._consumer_ids = itertools.count(1)
        self._armed: set[str] = set()
        """Held topic-partitions whose consumer has its permit and has received nothing."""
        self._changed: set[str] = set()
        """Topic-partitions whose consumer received an entry (or was closed by the broker) since ``changed``."""
        self._answered: dict[str, Position | None] = {}
        """Each held topic-partition's last answer, to tell when a fired watch can be set again."""

    def ask(self, topics: Sequence[str]) -> dict[str, Answer]:
        """Every topic's latest position, or why it could not be had here. A connection found broken (the
        broker restarted, or closed it while it was idle) is made again and its topic-partitions asked once
        more in the same call."""
        with self._lock:
            answers = self._ask(topics)
        self._start_keeper()
        return answers

    def _ask(self, topics: Sequence[str]) -> dict[str, Answer]:
        answers: dict[str, Answer] = {}
        for attempt in range(2):
            pending = [t for t in topics if t not in answers]
            new = [t for t in pending if t not in self._held]
            if new:
                self._hold(new, answers)
            broken = self._ask_held([t for t in pending if t in self._held and t not in answers], answers)
            if not broken:
                break
            if attempt == 1:
                answers.update(broken)
        unchanged = []
        for topic in topics:
            got = answers.get(topic)
            if isinstance(got, PulsarIOError) or topic not in self._held:
                continue
            if topic not in self._armed and topic in self._answered and self._answered[topic] == got:
                unchanged.append(topic)
            self._answered[topic] = got
        if unchanged:
            self._rearm(unchanged, answers)
        return answers

    def changed(self) -> set[str]:
        """The topic-partitions whose watch fired since the last call (an entry was pushed, the broker closed
        the consumer, or its connection failed): ask about these. Takes in what the connections received."""
        with self._lock:
            self._take_in()
            changed, self._changed = self._changed, set()
        return changed

    def _take_in(self) -> None:
        """Read what every connection received (PINGs answered, pushes noted); a failed one is dropped and its
        topic-partitions marked changed."""
        for route, conn in list(self._connections.items()):
            try:
                conn.poll()
            except (OSError, PulsarIOError):
                self._changed.update(t for t, (r, _i, _n) in self._held.items() if r == route)
                self._drop(route)

    def _start_keeper(self) -> None:
        if self._keeper is None and self.keep_alive_s > 0 and not self._stopped.is_set():
            self._keeper = threading.Thread(target=self._keep_alive, name="held-positions-keep-alive", daemon=True)
            self._keeper.start()

    def _keep_alive(self) -> None:
        while not self._stopped.wait(self.keep_alive_s):
            try:
                with self._lock:
                    if not self._stopped.is_set():
                        self._take_in()
            except Exception:  # never let the keeper die; the asker sees a broken connection itself
                log.debug("latest positions: keep-alive pass failed", exc_info=True)

    def armed(self, topic: str) -> bool:
        """Whether ``topic``'s watch is set: the broker will push its consumer the next entry published."""
        return topic in self._armed

    def _pushed(self, route: Route, cmd: BaseCommand) -> None:
        """A connection's ``on_push``: a watch fired (MESSAGE), or the broker let a consumer go."""
        if cmd.type == T.MESSAGE:
            consumer_id = cmd.message.consumer_id
        elif cmd.type == T.CLOSE_CONSUMER:
            consumer_id = cmd.close_consumer.consumer_id
        else:
            consumer_id = cmd.reachedEndOfTopic.consumer_id
        topic = self._topic_of.get((route, consumer_id))
        if topic is None:
            return
        self._armed.discard(topic)
        self._changed.add(topic)
        if cmd.type == T.CLOSE_CONSUMER:  # gone on the broker's side: subscribed again when next asked
            self._forget(topic)

    def _ask_held(self, topics: Sequence[str], answers: dict[str, Answer]) -> dict[str, PulsarIOError]:
        """Ask the held consumers of ``topics``; returns the topics of connections that failed, with the error."""
        broken: dict[str, PulsarIOError] = {}
        by_route: dict[Route, list[str]] = {}
        for topic in topics:
            by_route.setdefault(self._held[topic][0], []).append(topic)
        for route, routed in by_route.items():
            conn = self._connections[route]
            asks = []
            for topic in routed:
                rid = conn.next_request_id()
                asks.append((last_message_id_command(self._held[topic][1], rid), rid, f"GetLastMessageId of {topic}"))
            try:
                got = conn.request_many(asks, window=self.window)
            except (OSError, PulsarIOError) as err:
                self._drop(route)
                broken.update(dict.fromkeys(routed, PulsarIOError(f"latest positions at {conn.name}: {err}")))
                continue
            for topic, (_cmd, rid, _what) in zip(routed, asks, strict=True):
                try:
                    answers[topic] = last_position(got[rid])
                except PulsarIOError as err:
                    answers[topic] = err
                    self._release([topic])  # the broker may have closed it: subscribe again next time
        return broken

    def _hold(self, topics: Sequence[str], answers: dict[str, Answer]) -> None:
        """Look up and subscribe ``topics``; what fails goes to ``answers``."""
        cfg = self.client.config
        service_route: Route = (cfg.service.host, cfg.service.port, cfg.service.tls, None)
        service = self._connections.get(service_route)
        try:
            if service is None:
                service = BrokerConnection(cfg, cfg.service)
        except (OSError, PulsarIOError) as err:
            failed = PulsarIOError(f"cannot reach {cfg.service.host}:{cfg.service.port} for latest positions: {err}")
            answers.update(dict.fromkeys(topics, failed))
            return
        try:
            routes = _routes(service, topics, self.window, answers)
        except (OSError, PulsarIOError) as err:
            self._drop(service_route)
            service.close()
            failure = PulsarIOError(f"lookups at {service.name}: {err}")
            answers.update({t: failure for t in topics if t not in answers})
            return
        # The lookups' connection serves the topic-partitions the service address owns (one broker, or a proxy).
        if service_route in routes:
            self._keep(service_route, service)
        elif self._connections.get(service_route) is not service:
            service.close()
        for route, routed in routes.items():
            try:
                conn = self._connections.get(route) or self._keep(route, _connect(self.client, route))
                self._subscribe(route, conn, [(t, NAMES.take(t)) for t in routed], answers)
            except (OSError, PulsarIOError) as err:
                self._drop(route)
                answers.update({t: PulsarIOError(f"cannot hold {t} at {route[0]}:{route[1]}: {err}") for t in routed})

    def _keep(self, route: Route, conn: BrokerConnection) -> BrokerConnection:
        conn.on_push = functools.partial(self._pushed, route)
        self._connections[route] = conn
        return conn

    def _subscribe(
        self, route: Route, conn: BrokerConnection, named: Sequence[tuple[str, str]], answers: dict[str, Answer]
    ) -> list[tuple[str, int]]:
        """Subscribe ``(topic, subscription)`` at the latest position on ``conn``, each consumer with one permit
        (its watch); returns the ``(topic, consumer id)`` held. A refusal goes to ``answers`` (the name stays
        taken: the broker may hold it). Raises when the connection fails."""
        subscribes = []
        for topic, name in named:
            consumer_id, rid = next(self._consumer_ids), conn.next_request_id()
            subscribes.append((topic, consumer_id, name, rid, latest_subscribe_command(topic, consumer_id, rid, name)))
        requests = [(c, rid, f"subscribing to {t}") for t, _i, _n, rid, c in subscribes]
        got = conn.request_many(requests, window=self.window)
        held: list[tuple[str, int]] = []
        for topic, consumer_id, name, rid, _cmd in subscribes:
            reply = got[rid]
            if isinstance(reply, PulsarIOError):
                answers[topic] = reply
                continue
            self._held[topic] = (route, consumer_id, name)
            self._topic_of[(route, consumer_id)] = topic
            conn.send(flow_command(consumer_id, 1))
            self._armed.add(topic)
            held.append((topic, consumer_id))
        return held

    def _rearm(self, topics: Sequence[str], answers: dict[str, Answer]) -> None:
        """Set the fired watches of ``topics`` (unchanged since the last pass) again: unsubscribe, subscribe at
        the latest position with a permit, and ask the new consumer; an answer that differs from the pass's
        replaces it (an entry came in between: the asker sees it now, not at the next look)."""
        by_route: dict[Route, list[tuple[str, int, str]]] = {}
        for topic in topics:
            route, consumer_id, name = self._held[topic]
            by_route.setdefault(route, []).append((topic, consumer_id, name))
        for route, consumers in by_route.items():
            conn = self._connections[route]
            try:
                # Awaited before subscribing again under the same names: pulsar-lite drops a connection that
                # subscribes a second consumer to a subscription in use.
                gone = _unsubscribe(conn, consumers, self.window, give_back=False)
                named = []
                for topic, consumer_id, name in consumers:
                    self._forget(topic)
                    if consumer_id in gone:
                        named.append((topic, name))
                held = self._subscribe(route, conn, named, answers)
                asks = []
                for topic, consumer_id in held:
                    rid = conn.next_request_id()
                    asks.append((topic, rid, last_message_id_command(consumer_id, rid)))
                requests = [(c, rid, f"GetLastMessageId of {t}") for t, rid, c in asks]
                got = conn.request_many(requests, window=self.window)
            except (OSError, PulsarIOError):
                self._drop(route)  # asked again (and held anew) at the next pass
                continue
            for topic, rid, _cmd in asks:
                with contextlib.suppress(PulsarIOError):
                    now = last_position(got[rid])
                    self._answered[topic] = now
                    if now != answers.get(topic):
                        answers[topic] = now

    def _forget(self, topic: str) -> None:
        """``topic``'s consumer is gone (its name stays taken unless given back by the caller)."""
        held = self._held.pop(topic, None)
        if held is not None:
            self._topic_of.pop((held[0], held[1]), None)
        self._armed.discard(topic)
        self._answered.pop(topic, None)

    def _drop(self, route: Route) -> None:
        """A connection failed: its consumers are gone with it (their names are not reused in this process)."""
        conn = self._connections.pop(route, None)
        if conn is not None:
            conn.close()
        for topic in [t for t, (r, _i, _n) in self._held.items() if r == route]:
            self._forget(topic)

    def _release(self, topics: Sequence[str]) -> None:
        """Unsubscribe ``topics`` (answers awaited at most ``CLOSE_WAIT_S``); a name comes back once answered."""
        by_route: dict[Route, list[tuple[str, int, str]]] = {}
        for topic in topics:
            held = self._held.get(topic)
            if held is not None:
                by_route.setdefault(held[0], []).append((topic, held[1], held[2]))
                self._forget(topic)
        for route, consumers in by_route.items():
            try:
                _unsubscribe(self._connections[route], consumers, self.window)
            except (OSError, PulsarIOError):
                self._drop(route)

    def keep_only(self, topics: Iterable[str]) -> None:
        """Let go of every held topic-partition not in ``topics`` (no longer discovered, paused)."""
        keep = set(topics)
        with self._lock:
            gone = [t for t in self._held if t not in keep]
            if gone:
                self._release(gone)

    def held(self) -> int:
        return len(self._held)

    def close(self) -> None:
        self._stopped.set()
        with self._lock:
            with contextlib.suppress(Exception):
                self._release(list(self._held))
            for conn in self._connections.values():
                conn.close()
            self._connections.clear()
            self._held.clear()
            self._topic_of.clear()
            self._armed.clear()
            self._answered.clear()


__all__ = ["HeldPositions", "latest_positions_raw"]
