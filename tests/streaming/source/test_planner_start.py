"""What the source's planner costs before its first lookup: no ``pulsar-client`` for what the raw protocol or the
names answer (``run --once`` plans on the driver and again in Spark's Python worker, each a new process)."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from streamoffload.config import ConfigError
from streamoffload.embedded_broker import EmbeddedBroker
from streamoffload.produce import produce
from streamoffload.pulsar import client_reader
from streamoffload.streaming.source.offset_planner import SourcePlanner
from streamoffload.streaming.source.source_options import SourceOptions
from tests.fixtures.broker import unique_topic


def test_partition_names_are_their_own_listing_without_a_client() -> None:
    started: list[str] = []

    def no_client() -> Any:
        started.append("client")
        raise AssertionError("a pulsar-client was started")

    topics = "persistent://public/default/a-partition-1,persistent://public/default/a-partition-0"
    options = SourceOptions.parse({"serviceUrl": "pulsar://127.0.0.1:1", "topics": topics})
    planner = SourcePlanner(options, client_factory=no_client)
    assert planner.topic_partitions(force=True) == [
        "persistent://public/default/a-partition-0",
        "persistent://public/default/a-partition-1",
    ]
    assert started == []


def test_a_topic_that_is_no_partition_is_asked_about(pulsar_broker: EmbeddedBroker) -> None:
    topic = unique_topic("planner-start")
    produce(pulsar_broker.service_url, topic, count=1, payload_size=8, batching=False)
    started: list[Any] = []

    def client() -> Any:
        started.append(client_reader.make_client(pulsar_broker.service_url))
        return started[-1]

    planner = SourcePlanner(SourceOptions.parse({"serviceUrl": pulsar_broker.service_url, "topics": topic}), client)
    try:
        assert planner.topic_partitions(force=True) == [topic]  # a plain topic: its own only partition
        assert len(started) == 1
    finally:
        planner.close()
        for made in started:
            made.close()


def test_options_without_client_settings_parse_without_importing_pulsar_client() -> None:
    code = (
        "import sys\n"
        "from streamoffload.streaming.source.source_options import SourceOptions\n"
        "SourceOptions.parse({'serviceUrl': 'pulsar://127.0.0.1:1', 'topics': 't-partition-0'})\n"
        "print('pulsar' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.strip() == "False"


def test_client_settings_are_still_checked_at_parse() -> None:
    with pytest.raises(ConfigError, match=r"pulsar\.client\.noSuchSetting"):
        SourceOptions.parse({"serviceUrl": "pulsar://127.0.0.1:1", "topics": "t", "pulsar.client.noSuchSetting": "1"})
