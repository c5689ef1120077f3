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
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from streamoffload.embedded_broker import EmbeddedBroker
from streamoffload.produce import produce
from streamoffload.pulsar import raw_reader as rr
from streamoffload.pulsar.exactly_once import BEFORE_EARLIEST
from streamoffload.pulsar.latest_positions import latest_positions_raw
from streamoffload.pulsar.subscription_names import NAMES, PREFIX, SLOTS_DIR_ENV, SubscriptionNames
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


def test_a_restarted_process_subscribes_under_the_names_its_predecessor_used(
    make_broker: Callable[..., EmbeddedBroker], tmp_path: Path
) -> None:
    """A name new to a topic is what pulsar-lite pays for (~16 ms of CPU each at 10,000 topics): two processes
    one after the other, each asking every position and reading every topic, leave one name per topic."""
    broker = make_broker(default_partitions=0)
    topics = [unique_topic(f"restart-{n}") for n in range(3)]
    for topic in topics:
        produce(broker.service_url, topic, 4, 16, batching=False)
    script = (
        "import sys\n"
        "from streamoffload.pulsar import raw_reader as rr\n"
        "from streamoffload.pulsar.exactly_once import BEFORE_EARLIEST\n"
        "from streamoffload.pulsar.latest_positions import latest_positions_raw\n"
        "client = rr.RawClient(sys.argv[1])\n"
        "positions = latest_positions_raw(client, sys.argv[2:])\n"
        "for topic in sys.argv[2:]:\n"
        "    assert len(list(rr.read_range_raw(client, topic, BEFORE_EARLIEST, positions[topic]))) == 4\n"
    )
    env = {**os.environ, SLOTS_DIR_ENV: str(tmp_path / "slots")}
    for _process in range(2):
        subprocess.run([sys.executable, "-c", script, broker.service_url, *topics], env=env, check=True, timeout=120)

    kept = _subscriptions(json.loads((broker.data_dir / "db.metadata.json").read_text()))
    names = {name for topic in topics for name in kept[topic.rsplit("/", 1)[1]]}
    assert all(len(kept[topic.rsplit("/", 1)[1]]) == 1 for topic in topics), kept
    assert len(names) == 1 and names.pop().endswith("-0"), kept


def test_a_process_takes_the_lowest_free_slot_and_its_successor_the_same_names(tmp_path: Path) -> None:
    first = SubscriptionNames(str(tmp_path))
    a, b = first.take("t"), first.take("t")
    assert a.startswith(first.prefix) and a.endswith("-0") and b.endswith("-1")  # two consumers open at once
    first.give_back("t", a)
    assert first.take("t") == a  # free again once its unsubscribe was answered
    assert first.take("u") == a  # names are per topic: the same name on another topic
    c = first.take("t")
    assert c not in {a, b}  # a and b open (b never given back: its unsubscribe was not answered)
    other = SubscriptionNames(str(tmp_path))  # another process, while the first one lives
    assert other.prefix != first.prefix and other.take("t") not in {a, b, c}
    first.reset()  # the first process ends: its slot is free again
    successor = SubscriptionNames(str(tmp_path))
    assert successor.prefix == a.rsplit("-", 1)[0]  # the first one's slot, so its names
    assert successor.take("t") == a


def test_without_a_slot_directory_a_process_names_its_own(tmp_path: Path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("")  # not a directory: no slot can be claimed
    one, two = SubscriptionNames(str(blocked / "slots")), SubscriptionNames(str(blocked / "slots"))
    assert one.prefix.startswith(PREFIX) and one.prefix != two.prefix


def test_a_forked_child_never_takes_a_name_its_parent_holds() -> None:
    module_name = NAMES.take("fork-test")
    NAMES.give_back("fork-test", module_name)  # free in this process
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child's names were reset at the fork: it must not take the parent's free name
        os.write(write, NAMES.take("fork-test").encode())
        os._exit(0)
    os.waitpid(pid, 0)
    child = os.read(read, 200).decode()
    assert child.startswith(PREFIX) and child != module_name
    assert NAMES.take("fork-test") == module_name  # the parent still has it
