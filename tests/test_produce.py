"""`streamoffload produce` and its function API: deterministic content, partitions, summary, errors."""

from __future__ import annotations

import json
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamoffload.cli import main
from streamoffload.embedded_broker import EmbeddedBroker, free_port
from streamoffload.produce import (
    ProduceError,
    expected_key,
    expected_payload,
    expected_properties,
    partition_topics,
    produce,
)
from tests.fixtures.broker import read_published, unique_topic

pytestmark = pytest.mark.broker


@settings(max_examples=100, deadline=None)
@given(topic=st.text(min_size=1, max_size=30), seq=st.integers(0, 10**12), size=st.integers(0, 5000))
def test_expected_payload_is_deterministic_and_sized(topic: str, seq: int, size: int) -> None:
    payload = expected_payload(topic, seq, size)
    assert len(payload) == size
    assert payload == expected_payload(topic, seq, size)
    if size >= 40:
        assert payload.startswith(b"%d:" % seq)
        assert payload != expected_payload(topic, seq + 1, size)
        assert payload != expected_payload(topic + "x", seq, size)


def test_key_and_properties_scheme() -> None:
    assert expected_key(7, 0) is None
    assert expected_key(7, 3) == "key-1"
    assert expected_properties(5, {"a": "b"}) == {"a": "b", "seq": "5"}
    assert partition_topics("t", 0) == ["persistent://public/default/t"]
    assert partition_topics("tenant/ns/t", 2) == [
        "persistent://tenant/ns/t-partition-0",
        "persistent://tenant/ns/t-partition-1",
    ]


@pytest.mark.parametrize("batching", [False, True], ids=["unbatched", "batched"])
def test_published_messages_read_back_exactly(pulsar_broker: EmbeddedBroker, batching: bool) -> None:
    topic = unique_topic("produce")
    summary = produce(
        pulsar_broker.service_url,
        [topic],
        250,
        300,
        keys=4,
        properties={"source": "test"},
        batching=batching,
        batch_size=32,
    )
    assert summary.messages == 250 and summary.bytes == 250 * 300
    part = summary.partitions[topic]
    assert part.messages == 250
    messages = read_published(pulsar_broker.service_url, topic, 250)
    for seq, msg in enumerate(messages):
        assert msg.data() == expected_payload(topic, seq, 300)
        assert msg.partition_key() == expected_key(seq, 4)
        assert msg.properties() == expected_properties(seq, {"source": "test"})
    last = messages[-1].message_id()
    assert part.last_message_id == (last.ledger_id(), last.entry_id(), last.batch_index())
    if batching:
        assert last.batch_index() >= 0  # really batched: several messages per entry
        assert len({(m.message_id().ledger_id(), m.message_id().entry_id()) for m in messages}) < 250
    else:
        assert last.batch_index() == -1


def test_partitions_are_named_topics_with_own_sequences(pulsar_broker: EmbeddedBroker) -> None:
    base = unique_topic("parts")
    summary = produce(pulsar_broker.service_url, base, 30, 64, partitions=3, batching=False)
    names = [f"{base}-partition-{i}" for i in range(3)]
    assert list(summary.partitions) == names
    for name in names:
        assert summary.partitions[name].messages == 10
        payloads = [m.data() for m in read_published(pulsar_broker.service_url, name, 10)]
        assert payloads == [expected_payload(name, seq, 64) for seq in range(10)]


def test_rate_and_duration(pulsar_broker: EmbeddedBroker) -> None:
    topic = unique_topic("rate")
    started = time.monotonic()
    summary = produce(pulsar_broker.service_url, topic, 20, 10, rate=100.0, batching=False)
    assert summary.messages == 20
    assert time.monotonic() - started >= 0.18  # 20 messages at 100/s cannot finish sooner
    timed = produce(pulsar_broker.service_url, topic, None, 10, duration=0.3, rate=200.0, batching=False)
    assert 0 < timed.messages <= 70
    assert timed.seconds >= 0.3


def test_cli_json_summary(pulsar_broker: EmbeddedBroker, capsys: pytest.CaptureFixture[str]) -> None:
    topic = unique_topic("cli")
    code = main(
        [
            "produce",
            "--service-url",
            pulsar_broker.service_url,
            "--topic",
            topic,
            "--partitions",
            "2",
            "--count",
            "40",
            "--payload-size",
            "50",
            "--properties",
            "a=1",
            "b=x=y",
            "--no-batching",
            "--json",
        ]
    )
    out = capsys.readouterr()
    assert code == 0, out.err
    doc = json.loads(out.out)
    assert doc["messages"] == 40 and doc["bytes"] == 2000
    assert set(doc["partitions"]) == {f"{topic}-partition-0", f"{topic}-partition-1"}
    assert all(p["messages"] == 20 and len(p["last_message_id"]) == 3 for p in doc["partitions"].values())
    msg = read_published(pulsar_broker.service_url, f"{topic}-partition-1", 20)[0]
    assert msg.properties() == {"a": "1", "b": "x=y", "seq": "0"}


def test_cli_text_summary_and_progress(pulsar_broker: EmbeddedBroker, capsys: pytest.CaptureFixture[str]) -> None:
    topic = unique_topic("clitext")
    assert main(["produce", "--service-url", pulsar_broker.service_url, "--topic", topic, "--count", "5"]) == 0
    out = capsys.readouterr()
    assert "published 5 messages" in out.out and topic in out.out
    assert "produce: 5/5 (100%) acked" in out.err


def test_bad_property_is_a_clear_error(pulsar_broker: EmbeddedBroker, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["produce", "--service-url", pulsar_broker.service_url, "--topic", "t", "--properties", "novalue"])
    assert code == 1
    assert "expected KEY=VALUE, got 'novalue'" in capsys.readouterr().err


def test_unreachable_broker_is_a_clear_error() -> None:
    url = f"pulsar://127.0.0.1:{free_port()}"
    with pytest.raises(ProduceError, match=r"cannot create a producer on .* at pulsar://127\.0\.0\.1"):
        produce(url, "t", 1, 10, client_options={"operation_timeout_seconds": 2, "connection_timeout_ms": 500})


def test_argument_errors() -> None:
    with pytest.raises(ProduceError, match="count or a duration"):
        produce("pulsar://127.0.0.1:1", "t", None)
    with pytest.raises(ProduceError, match="rate must be > 0"):
        produce("pulsar://127.0.0.1:1", "t", 1, rate=0)
