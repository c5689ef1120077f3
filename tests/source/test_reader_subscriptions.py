"""The job's reads leave no subscription behind on the broker.

Every micro-batch subscribes anew (a non-durable reader per topic-partition, and one per latest-position
question). Pulsar deletes a non-durable subscription with its last consumer; pulsar-lite keeps it and then
walks every one it kept on each publish to the topic, warning "No dispatcher found" for each. Before the
readers unsubscribed, a 10-minute soak's broker log grew 1.3 GB in 3 minutes and the broker's CPU per
publish rose with the job's age until the job fell behind. The broker's own log is the only view of its
subscriptions that pulsar-lite gives (it has no admin API), so that is what is checked."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from streamoffload.embedded_broker import EmbeddedBroker
from streamoffload.produce import produce
from streamoffload.streaming.protocol import raw_reader as rr
from streamoffload.streaming.protocol.exactly_once import BEFORE_EARLIEST
from streamoffload.streaming.protocol.latest_positions import latest_positions_raw
from tests.fixtures.broker import unique_topic

pytestmark = pytest.mark.broker


def test_reads_and_position_questions_leave_no_subscription_that_publishing_pays_for(
    make_broker: Callable[..., EmbeddedBroker],
) -> None:
    broker = make_broker(default_partitions=0)
    topics = [unique_topic(f"subs-{n}") for n in range(3)]
    for topic in topics:
        produce(broker.service_url, topic, 5, 16, batching=False)
    client = rr.RawClient(broker.service_url)
    for _round in range(5):  # five micro-batches' worth of the source's broker traffic
        positions = latest_positions_raw(client, topics)
        for topic in topics:
            assert rr.latest_position_raw(client, topic) == positions[topic]
            read = list(rr.read_range_raw(client, topic, BEFORE_EARLIEST, positions[topic]))
            assert len(read) == 5
    for topic in topics:
        produce(broker.service_url, topic, 20, 16, batching=False)  # each publish meets every subscription kept

    log = broker.log_path.read_text()
    assert "No dispatcher found" not in log, log[-2000:]
    # Each close waits for the broker's answer: one into a closed socket is an error in its log.
    assert "Connection reset" not in log and "Broken pipe" not in log, log[-2000:]
