"""The job's reads leave no subscription behind on the broker, and reuse their names.

Every micro-batch subscribes anew (a non-durable reader per topic-partition, and one per latest-position
question). Pulsar deletes a non-durable subscription with its last consumer; pulsar-lite kept it and then
walked every one it kept on each publish to the topic, warning "No dispatcher found" for each, and it keeps
every name ever used in its metadata, making each new subscribe dearer. Before the readers unsubscribed and
reused names, a 10-minute soak's broker log grew 1.3 GB in 3 minutes and the broker's CPU rose with the
job's age until the job fell behind. pulsar-lite has no admin API: its log and its metadata file are the
only views of its subscriptions, so those are what is checked."""

from __future__ import annotations

import json
import os
from collections.abc import Callable

import pytest

from streamoffload.embedded_broker import EmbeddedBroker
from streamoffload.produce import produce
from streamoffload.streaming.protocol import raw_reader as rr
from streamoffload.streaming.protocol.exactly_once import BEFORE_EARLIEST
from streamoffload.streaming.protocol.latest_positions import latest_positions_raw
from streamoffload.streaming.protocol.subscription_names import NAMES, PREFIX, SubscriptionNames
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

    metadata = json.loads((broker.data_dir / "db.metadata.json").read_text())
    kept = _subscriptions(metadata)
    assert set(kept) >= {topic.rsplit("/", 1)[1] for topic in topics}, kept
    # 5 rounds x 3 subscriptions per topic, one at a time: one name each, used over and over.
    assert all(len(names) == 1 and names[0].startswith(PREFIX) for names in kept.values()), kept

    log = broker.log_path.read_text()
    assert "No dispatcher found" not in log, log[-2000:]
    # Each close waits for the broker's answer: one into a closed socket is an error in its log.
    assert "Connection reset" not in log and "Broken pipe" not in log, log[-2000:]


def _subscriptions(node: object) -> dict[str, list[str]]:
    """Topic name -> the subscription names pulsar-lite's metadata holds for it (wherever it nests them)."""
    found: dict[str, list[str]] = {}
    if isinstance(node, dict):
        for key, value in node.items():
            if isinstance(value, dict) and isinstance(value.get("subscriptions"), dict):
                found[key] = sorted(value["subscriptions"])
            else:
                found.update(_subscriptions(value))
    return found


def test_names_are_reused_only_once_given_back_and_never_shared_with_a_forked_child() -> None:
    names = SubscriptionNames()
    first, second = names.take("t"), names.take("t")
    assert first != second  # two consumers open at once on one topic
    names.give_back("t", first)
    assert names.take("t") == first
    assert names.take("u") not in {first, second}  # another topic has its own free names
    module_name = NAMES.take("fork-test")
    NAMES.give_back("fork-test", module_name)  # free in this process
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child's pool was reset at the fork: it must not take the parent's free name
        os.write(write, NAMES.take("fork-test").encode())
        os._exit(0)
    os.waitpid(pid, 0)
    child = os.read(read, 200).decode()
    assert child.startswith(PREFIX) and child != module_name
    assert NAMES.take("fork-test") == module_name  # the parent still has it
