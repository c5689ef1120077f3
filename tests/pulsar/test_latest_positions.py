"""Latest positions of many topic-partitions in a few pipelined round trips (streamoffload/pulsar/latest_positions.py),
against the embedded broker, and the planner's fallback to one topic-partition at a time."""

from __future__ import annotations

import time
from typing import Any

import pytest

from streamoffload.embedded_broker import EmbeddedBroker
from streamoffload.produce import produce
from streamoffload.pulsar import broker_connection
from streamoffload.pulsar import raw_reader as rr
from streamoffload.pulsar.exactly_once import PulsarIOError
from streamoffload.pulsar.latest_positions import latest_positions_raw
from streamoffload.streaming.source.offset_planner import SourcePlanner
from streamoffload.streaming.source.source_options import SourceOptions
from tests.fixtures.broker import unique_topic

pytestmark = pytest.mark.broker


@pytest.fixture
def connections(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The brokers each new connection went to, in order."""
    opened: list[str] = []
    original = broker_connection.BrokerConnection.__init__

    def counting(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        opened.append(self.name)

    monkeypatch.setattr(broker_connection.BrokerConnection, "__init__", counting)
    return opened


def test_sixty_topic_partitions_on_one_connection_agree_with_one_at_a_time(
    pulsar_broker: EmbeddedBroker, connections: list[str]
) -> None:
    written = [unique_topic(f"latest-{n}") for n in range(4)]
    for n, topic in enumerate(written):
        produce(pulsar_broker.service_url, topic, 3 + n, 16, batching=False)
    topics = written + [unique_topic(f"latest-empty-{n}") for n in range(56)]
    client = rr.RawClient(pulsar_broker.service_url)

    batch = latest_positions_raw(client, topics, window=16)  # a window smaller than the batch: in waves
    assert len(connections) == 1, connections  # lookups, subscriptions and questions: all on one connection
    one_by_one = {topic: rr.latest_position_raw(client, topic) for topic in topics}
    assert batch == one_by_one
    assert all(batch[topic] is not None for topic in written) and all(batch[t] is None for t in topics[4:])


def test_a_broker_that_is_not_there_answers_every_topic_with_the_reason(
    connections: list[str],
) -> None:
    client = rr.RawClient("pulsar://127.0.0.1:9", {"connectionTimeoutMs": "500"})
    answers = latest_positions_raw(client, ["persistent://public/default/a", "persistent://public/default/b"])
    assert set(answers) == {"persistent://public/default/a", "persistent://public/default/b"}
    assert all(isinstance(a, PulsarIOError) and "cannot reach 127.0.0.1:9" in str(a) for a in answers.values())


def test_the_planner_asks_once_for_all_and_falls_back_one_at_a_time(
    pulsar_broker: EmbeddedBroker, connections: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    topics = [unique_topic(f"planner-latest-{n}") for n in range(3)]
    produce(pulsar_broker.service_url, topics[0], 5, 16, batching=False)
    planner = SourcePlanner(SourceOptions.parse({"service.url": pulsar_broker.service_url, "topics": ",".join(topics)}))
    expected = {topic: rr.latest_position_raw(planner.raw_client, topic) for topic in topics}
    connections.clear()
    assert planner.latest_positions(topics) == expected
    assert len(connections) == 1
    connections.clear()
    assert planner.latest_positions(topics) == expected
    assert connections == []  # the consumers and their connection are held between triggers

    # A topic the pipelined pass could not answer is asked again on its own (here: a lookup it was refused).
    from streamoffload.pulsar.latest_positions import HeldPositions

    real_ask = HeldPositions.ask

    def one_refused(self: HeldPositions, asked: list[str]) -> dict[str, Any]:
        answers = real_ask(self, asked)
        answers[topics[0]] = PulsarIOError("lookup refused")
        return answers

    monkeypatch.setattr(HeldPositions, "ask", one_refused)
    alone: list[str] = []
    real_alone = SourcePlanner._latest_position

    def recording_alone(self: SourcePlanner, tp: str) -> Any:
        alone.append(tp)
        return real_alone(self, tp)

    monkeypatch.setattr(SourcePlanner, "_latest_position", recording_alone)
    connections.clear()
    assert planner.latest_positions(topics) == expected
    assert alone == [topics[0]]  # the one topic alone
    # ... with a consumer of its own, on the connection the planner's raw client kept from the questions
    # above (a cleanly closed consumer's connection is kept for the next): no new connection.
    assert connections == []
    planner.close()


def test_quiet_topic_partitions_are_asked_about_when_their_watch_fires_and_else_rarely(
    pulsar_broker: EmbeddedBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Five quiet topic-partitions and one with new entries: after the first trigger, only the active one is
    asked about; a quiet one that gets entries is asked about at the next trigger (its held consumer's watch
    fired), with no time passing; the others only every ``watchedPollSeconds``, spread over triggers."""
    from streamoffload.streaming.source import offset_planner as planner_module

    topics = [unique_topic(f"idle-poll-{n}") for n in range(6)]
    busy, quiet = topics[0], topics[1:]
    for topic in topics:
        produce(pulsar_broker.service_url, topic, 1, 16, batching=False)
    clock = [1000.0]
    monkeypatch.setattr(planner_module.time, "monotonic", lambda: clock[0])
    asked: list[list[str]] = []
    real = SourcePlanner.latest_positions

    def recording(self: SourcePlanner, partitions: list[str]) -> dict[str, Any]:
        asked.append(sorted(partitions))
        return real(self, partitions)

    monkeypatch.setattr(SourcePlanner, "latest_positions", recording)
    watched_poll_s = 20.0  # not the default 30: the option is what counts
    options = {
        "service.url": pulsar_broker.service_url,
        "topics": ",".join(topics),
        "idlePollSeconds": "10",
        "watchedPollSeconds": str(watched_poll_s),
    }
    planner = SourcePlanner(SourceOptions.parse(options))
    start = planner.initial_offset()
    end = planner.latest_offset(start, None, None)  # everything is due the first time
    assert asked[-1] == sorted(topics)
    assert all(end[t] != start[t] for t in topics)
    produce(pulsar_broker.service_url, busy, 1, 16, batching=False)
    clock[0] += 1
    end = planner.latest_offset(end, None, None)  # all had something new last time: all asked again
    assert asked[-1] == sorted(topics)
    clock[0] += 1
    end = planner.latest_offset(end, None, None)
    assert asked[-1] == [busy], "the quiet ones were quiet at their last look"
    clock[0] += 1
    before = dict(end)
    end = planner.latest_offset(end, None, None)
    assert asked[-1] == [], "nobody had anything new at the last look, and no watch fired"
    assert end == before
    quiet_from = len(asked)
    produce(pulsar_broker.service_url, quiet[0], 2, 16, batching=False)
    seen = end
    for _ in range(100):  # the clock stands still: only the pushed entry can make it due
        seen = planner.latest_offset(end, None, None)
        if seen[quiet[0]] != end[quiet[0]]:
            break
        time.sleep(0.05)
    assert seen[quiet[0]] != end[quiet[0]], "a quiet topic-partition's new entries are seen at once"
    assert all(batch in ([], [quiet[0]]) for batch in asked[quiet_from:]), asked[quiet_from:]
    end = planner.latest_offset(seen, None, None)  # it moved at the last look: asked again, now quiet
    end = planner.latest_offset(end, None, None)
    asked.clear()
    clock[0] += 0.75 * watched_poll_s  # the watched quiet ones are asked again now and then
    for _ in range(int(watched_poll_s)):  # within 1.25 x of their last look, every one was
        clock[0] += 0.5
        end = planner.latest_offset(end, None, None)
    assert {t for batch in asked for t in batch} == set(topics)
    assert all(len(batch) < len(topics) for batch in asked), "spread over triggers, not all at once"
    planner.close()
