"""The embedded pulsar-lite broker: start, handshake, restart with data kept, clean errors."""

from __future__ import annotations

import os
import socket
import stat
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pulsar
import pytest

from streamoffload.embedded_broker import (
    BrokerError,
    EmbeddedBroker,
    find_binary,
    free_port,
    pulsar_handshake,
)
from tests.fixtures.broker import read_published, unique_topic

pytestmark = pytest.mark.broker


def _publish(service_url: str, topic: str, payloads: list[bytes]) -> None:
    client = pulsar.Client(service_url, operation_timeout_seconds=10)
    try:
        producer = client.create_producer(topic, batching_enabled=False)
        for payload in payloads:
            producer.send(payload)
        producer.close()
    finally:
        client.close()


def test_shared_broker_speaks_pulsar(pulsar_broker: EmbeddedBroker) -> None:
    assert pulsar_broker.is_running
    assert pulsar_broker.service_url == f"pulsar://127.0.0.1:{pulsar_broker.port}"
    assert pulsar_handshake("127.0.0.1", pulsar_broker.port)
    topic = unique_topic("roundtrip")
    _publish(pulsar_broker.service_url, topic, [b"a", b"b", b"c"])
    assert [m.data() for m in read_published(pulsar_broker.service_url, topic, 3)] == [b"a", b"b", b"c"]


def test_config_is_what_pulsar_lite_reads(tmp_path: Path) -> None:
    broker = EmbeddedBroker(tmp_path, port=1234, default_partitions=3)
    text = broker.config_text()
    assert f'db_path = "{tmp_path / "db"}"' in text
    assert "default_partitions = 3" in text
    assert "[metrics]\nenabled = false" in text
    with_metrics = EmbeddedBroker(tmp_path, port=1234, metrics_port=9999).config_text()
    assert 'enabled = true\naddr = "127.0.0.1:9999"' in with_metrics


def test_restart_keeps_port_and_data(make_broker: Callable[..., EmbeddedBroker]) -> None:
    broker = make_broker()
    port, first_pid = broker.port, broker.pid
    topic = unique_topic("restart")
    _publish(broker.service_url, topic, [b"before"])
    broker.restart()
    assert broker.port == port and broker.pid != first_pid and broker.is_running
    _publish(broker.service_url, topic, [b"after"])
    assert [m.data() for m in read_published(broker.service_url, topic, 2)] == [b"before", b"after"]


def test_stop_ends_the_process_and_is_idempotent(make_broker: Callable[..., EmbeddedBroker]) -> None:
    broker = make_broker()
    pid = broker.pid
    assert pid is not None
    broker.stop()
    assert not broker.is_running and broker.pid is None
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    broker.stop()
    assert not pulsar_handshake("127.0.0.1", broker.port, timeout=0.5)


def test_kill_then_start_recovers_data(make_broker: Callable[..., EmbeddedBroker]) -> None:
    broker = make_broker()
    topic = unique_topic("crash")
    _publish(broker.service_url, topic, [b"x", b"y"])
    broker.kill()
    assert not broker.is_running
    broker.start()
    assert [m.data() for m in read_published(broker.service_url, topic, 2)] == [b"x", b"y"]


def test_context_manager_removes_its_temporary_dir() -> None:
    with EmbeddedBroker() as broker:
        data_dir = broker.data_dir
        assert (data_dir / "pulsar-lite.toml").is_file()
        assert pulsar_handshake("127.0.0.1", broker.port)
    assert not data_dir.exists()


def test_metrics_endpoint_on_chosen_loopback_port(make_broker: Callable[..., EmbeddedBroker]) -> None:
    metrics_port = free_port()
    make_broker(metrics_port=metrics_port)
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as response:
        assert response.status == 200


def test_binary_that_dies_gives_error_with_log_tail(tmp_path: Path) -> None:
    fake = tmp_path / "fake-pulsar-lite"
    fake.write_text("#!/bin/sh\necho 'fatal: cannot open database' >&2\nexit 3\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    broker = EmbeddedBroker(tmp_path / "data", binary=str(fake))
    with pytest.raises(BrokerError, match=r"exited with code 3(.|\n)*cannot open database"):
        broker.start()
    assert not broker.is_running


def test_binary_that_never_answers_times_out(tmp_path: Path) -> None:
    fake = tmp_path / "silent-pulsar-lite"
    fake.write_text("#!/bin/sh\necho 'listening soon'\nexec sleep 60\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    broker = EmbeddedBroker(tmp_path / "data", binary=str(fake), start_timeout=0.5)
    with pytest.raises(BrokerError, match=r"did not answer a Pulsar handshake(.|\n)*listening soon"):
        broker.start()
    assert not broker.is_running


def test_finds_the_installed_binary() -> None:
    path = find_binary()
    assert os.access(path, os.X_OK)


def test_missing_binary_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PULSAR_LITE_BINARY", str(tmp_path / "nope"))
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr("sys.executable", str(tmp_path / "python"))
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    with pytest.raises(BrokerError, match="cannot find the pulsar-lite executable"):
        find_binary()


def test_broker_command_runs_until_sigterm(tmp_path: Path) -> None:
    import signal
    import subprocess
    import sys

    data_dir = tmp_path / "cli-broker"
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamoffload", "broker", "--data-dir", str(data_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        assert url.startswith("pulsar://127.0.0.1:"), url
        port = int(url.rsplit(":", 1)[1])
        assert pulsar_handshake("127.0.0.1", port)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
        assert not pulsar_handshake("127.0.0.1", port, timeout=0.5)
        assert (data_dir / "pulsar-lite.toml").is_file()  # a given data dir is kept
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_picked_port_taken_meanwhile_is_picked_again(tmp_path: Path) -> None:
    """The port we picked is bound by someone else before the broker binds it: start picks another and serves."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        broker = EmbeddedBroker(tmp_path / "data")
        broker.port = taken.getsockname()[1]
        try:
            broker.start()
            assert broker.port != taken.getsockname()[1]
            assert pulsar_handshake("127.0.0.1", broker.port)
            assert "streamoffload: starting" in broker.log_tail(200)
        finally:
            broker.close()


def test_a_given_port_that_is_taken_is_an_error(tmp_path: Path) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        broker = EmbeddedBroker(tmp_path / "data", port=taken.getsockname()[1], start_timeout=20)
        with pytest.raises(BrokerError, match=r"exited with code"):
            broker.start()
        assert broker.port == taken.getsockname()[1]
