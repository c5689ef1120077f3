"""Latest positions over consumers held between passes (``latest_positions.HeldPositions``), on pulsar-lite:
right answers that follow new publishes, one subscription per topic-partition for all the passes, nothing
pushed to the held consumers, and a broker restart that costs a pass, not the asker."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import pytest

from streamoffload.embedded_broker import EmbeddedBroker
from streamoffload.produce import produce
from streamoffload.streaming.protocol import raw_reader as rr
from streamoffload.streaming.protocol.exactly_once import PulsarIOError
from streamoffload.streaming.protocol.latest_positions import HeldPositions, latest_positions_raw
from tests.fixtures.broker import unique_topic
from tests.source.test_reader_subscriptions import _subscriptions

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
