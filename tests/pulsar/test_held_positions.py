"""Latest positions over consumers held between passes (``latest_positions.HeldPositions``), on pulsar-lite:
right answers that follow new publishes, one subscription per topic-partition for all the passes, a watch per
consumer (the broker pushes the next entry, and the watch is set again once the topic-partition is quiet), and
a broker restart that costs a pass, not the asker."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import pytest

from streamoffload.codecs.proto.pulsar_api_pb2 import BaseCommand
from streamoffload.embedded_broker import EmbeddedBroker
from streamoffload.produce import produce
from streamoffload.pulsar import latest_positions as lp
from streamoffload.pulsar import raw_reader as rr
from streamoffload.pulsar.broker_connection import BrokerConnection
from streamoffload.pulsar.exactly_once import PulsarIOError
from streamoffload.pulsar.latest_positions import HeldPositions, latest_positions_raw
from tests.fixtures.broker import unique_topic
from tests.pulsar.test_reader_subscriptions import _subscriptions

pytestmark = pytest.mark.broker


def test_held_consumers_answer_what_a_fresh_pass_answers_pass_after_pass(
    make_broker: Callable[..., EmbeddedBroker],
) -> None:
    broker = make_broker(default_partitions=0)
    busy, empty = unique_topic("held-busy"), unique_topic("held-empty")
    produce(broker.service_url, busy, 3, 16, batching=False)
    client = rr.RawClient(broker.service_url)
    held = HeldPositions(client)
    try:
        first = held.ask([busy, empty])
        assert first == latest_positions_raw(client, [busy, empty])
        assert first[empty] is None and first[busy] is not None
        for more in (2, 5):
            produce(broker.service_url, busy, more, 16, batching=False)
            produce(broker.service_url, empty, 1, 16, batching=False)
            assert held.ask([busy, empty]) == latest_positions_raw(client, [busy, empty])
        assert held.held() == 2
        held.keep_only([busy])
        assert held.held() == 1
        assert held.ask([busy])[busy] == latest_positions_raw(client, [busy])[busy]
    finally:
        held.close()
    kept = _subscriptions(json.loads((broker.data_dir / "db.metadata.json").read_text()))
    assert all(len(kept[t.rsplit("/", 1)[1]]) <= 2 for t in (busy, empty)), kept  # held one + the fresh passes' one
    assert "No dispatcher found" not in broker.log_path.read_text()


def test_a_broker_restart_costs_one_pass_then_the_consumers_are_held_again(
    make_broker: Callable[..., EmbeddedBroker],
) -> None:
    broker = make_broker(default_partitions=0)
    topic = unique_topic("held-restart")
    produce(broker.service_url, topic, 4, 16, batching=False)
    held = HeldPositions(rr.RawClient(broker.service_url))
    try:
        before = held.ask([topic])[topic]
        broker.restart()
        produce(broker.service_url, topic, 1, 16, batching=False)
        answers = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            answer = held.ask([topic])[topic]
            answers.append(answer)
            if not isinstance(answer, PulsarIOError) and answer is not None and answer > before:
                break
            time.sleep(0.2)
        assert answers[-1] == latest_positions_raw(rr.RawClient(broker.service_url), [topic])[topic] != before
        # The dead connection is found and made again within the call: no answer is an error.
        assert not any(isinstance(a, PulsarIOError) for a in answers), answers
        assert held.held() == 1
    finally:
        held.close()


def poll_until(condition: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout_s:.0f} s waiting for {what}"
        time.sleep(0.05)


def log_count(broker: EmbeddedBroker, text: str) -> int:
    return broker.log_path.read_text().count(text)


def _counting_pongs(conn: BrokerConnection) -> list[float]:
    """The PONGs ``conn`` sends from now on (when each went), counted on the way out."""
    sent: list[float] = []
    real = conn.send

    def send(command: BaseCommand) -> None:
        if command.type == BaseCommand.PONG:
            sent.append(time.monotonic())
        real(command)

    conn.send = send  # type: ignore[method-assign]
    return sent


def _changed_until(held: HeldPositions, topic: str, timeout_s: float = 60.0) -> set[str]:
    """Everything ``held.changed()`` names until it has named ``topic`` (a push takes a moment to arrive)."""
    seen: set[str] = set()

    def named() -> bool:
        seen.update(held.changed())
        return topic in seen

    poll_until(named, f"a change of {topic}", timeout_s)
    return seen


def _changed_soon(held: HeldPositions, timeout_s: float = 10.0) -> set[str]:
    """``held.changed()`` once it names something (a pushed entry takes a moment to arrive)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        changed = held.changed()
        if changed:
            return changed
        time.sleep(0.05)
    return set()


def test_a_held_consumer_watches_its_topic_partition_and_is_set_again_once_it_is_quiet(
    make_broker: Callable[..., EmbeddedBroker],
) -> None:
    broker = make_broker(default_partitions=0)
    moving, still = unique_topic("watch-moving"), unique_topic("watch-still")
    for topic in (moving, still):
        produce(broker.service_url, topic, 1, 16, batching=False)
    held = HeldPositions(rr.RawClient(broker.service_url))
    try:
        first = held.ask([moving, still])
        assert held.armed(moving) and held.armed(still)
        time.sleep(0.3)
        assert held.changed() == set(), "nothing published since the consumers were subscribed"
        produce(broker.service_url, moving, 2, 16, batching=False)
        assert _changed_soon(held) == {moving}
        assert not held.armed(moving) and held.armed(still)
        second = held.ask([moving, still])
        assert second[still] == first[still] and second[moving] > first[moving]  # type: ignore[operator]
        assert not held.armed(moving), "it moved since the pass before: not quiet yet"
        assert held.ask([moving, still]) == second
        assert held.armed(moving), "unchanged over two passes: its watch is set again"
        produce(broker.service_url, moving, 1, 16, batching=False)
        assert _changed_soon(held) == {moving}
        assert held.ask([moving])[moving] > second[moving]  # type: ignore[operator]
        assert held.held() == 2
    finally:
        held.close()
    kept = _subscriptions(json.loads((broker.data_dir / "db.metadata.json").read_text()))
    assert len(kept[moving.rsplit("/", 1)[1]]) == 1, "set again under the same name"


def test_an_entry_published_while_a_watch_is_set_again_is_answered_in_that_pass(
    make_broker: Callable[..., EmbeddedBroker], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The new consumer starts at the latest position: an entry published between the pass's question and the
    new subscription would be pushed to nobody. The new consumer is asked too, and its answer replaces the
    pass's."""
    broker = make_broker(default_partitions=0)
    topic = unique_topic("watch-race")
    produce(broker.service_url, topic, 1, 16, batching=False)
    held = HeldPositions(rr.RawClient(broker.service_url))
    try:
        held.ask([topic])
        produce(broker.service_url, topic, 1, 16, batching=False)
        assert _changed_soon(held) == {topic}
        moved = held.ask([topic])[topic]
        real = lp._unsubscribe

        def publishing_meanwhile(*args: object, **kwargs: object) -> set[int]:
            produce(broker.service_url, topic, 1, 16, batching=False)
            return real(*args, **kwargs)  # type: ignore[arg-type]

        monkeypatch.setattr(lp, "_unsubscribe", publishing_meanwhile)
        answer = held.ask([topic])[topic]
        monkeypatch.setattr(lp, "_unsubscribe", real)
        assert answer is not None and moved is not None and answer > moved  # type: ignore[operator]
        assert answer == latest_positions_raw(rr.RawClient(broker.service_url), [topic])[topic]
        assert held.armed(topic)
    finally:
        held.close()


def test_idle_held_connections_answer_the_brokers_pings_between_passes(
    make_broker: Callable[..., EmbeddedBroker],
) -> None:
    """A micro-batch may last longer than the broker's keep-alive: the held connections answer its PINGs
    meanwhile (a keep-alive thread), so the watches outlive the gap, and a push that arrives in it is kept for
    ``changed``. Without it the broker closes the connection and every watch must be held again."""
    # PING every 2 s, closed 2 s after an unanswered one. Not 1 s: with a second test file on the other core the
    # keep-alive thread was once late by more than a second, and the broker closed the held connection too.
    broker = make_broker(default_partitions=0, keep_alive_s=2)
    quiet, moving = unique_topic("keepalive-quiet"), unique_topic("keepalive-moving")
    for topic in (quiet, moving):
        produce(broker.service_url, topic, 1, 16, batching=False)
    held = HeldPositions(rr.RawClient(broker.service_url), keep_alive_s=0.25)
    unkept = HeldPositions(rr.RawClient(broker.service_url), keep_alive_s=0)
    try:
        first = held.ask([quiet, moving])
        [conn] = held._connections.values()
        pongs = _counting_pongs(conn)
        unkept.ask([quiet])
        # No pass meanwhile: the held connection answers PINGs (two: it outlived the first one's deadline), and
        # the broker closes the unkept one, whose PING went unanswered.
        poll_until(lambda: len(pongs) >= 2 and log_count(broker, "liveness check timed out") == 1, "the PINGs")
        produce(broker.service_url, moving, 1, 16, batching=False)
        fired = _changed_until(held, moving)
        assert fired == {moving}, "the quiet watch survived; the moving one fired during the gap"
        assert held.held() == 2 and held.armed(quiet)
        assert held.ask([quiet, moving])[moving] > first[moving]  # type: ignore[operator]
        assert _changed_until(unkept, quiet) == {quiet}, "without the keep-alive the broker closed it"
        assert unkept.held() == 0
    finally:
        held.close()
        unkept.close()
    log = broker.log_path.read_text()
    assert log.count("liveness check timed out") == 1, log[-2000:]  # the unkept asker's connection only
