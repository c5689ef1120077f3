"""Apache Pulsar standalone as the project starts it: serving, on loopback only, rolling ledgers as configured;
and the launcher's errors and configuration without a broker."""

from __future__ import annotations

import contextlib
import ipaddress
import os
from pathlib import Path

import pytest

from streamoffload.embedded_broker import BrokerError
from streamoffload.produce import expected_payload, produce
from streamoffload.pulsar_standalone import PulsarStandalone
from tests.fixtures.broker import unique_topic
from tests.fixtures.pulsar import ROLLOVER_ENTRIES
from tests.pulsar.standalone.broker_truth import held_messages, internal_ledgers


def _listening(pid: int) -> set[tuple[str, int]]:
    """(address, port) of every TCP socket the process listens on, from /proc (no ss or lsof needed)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target.startswith("socket:["):
                inodes.add(target.removeprefix("socket:[").removesuffix("]"))
    found = set()
    for table in ("tcp", "tcp6"):
        with open(f"/proc/{pid}/net/{table}") as fh:
            for line in fh.readlines()[1:]:
                local, state, inode = line.split()[1], line.split()[3], line.split()[9]
                if state == "0A" and inode in inodes:  # 0A: LISTEN
                    address, port = local.split(":")
                    found.add((_address(address), int(port, 16)))
    return found


def _address(hex_address: str) -> str:
    """/proc/net/tcp's address: 32-bit words, each in the host's (little-endian) byte order."""
    raw = bytes.fromhex(hex_address)
    ip = ipaddress.ip_address(b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4)))
    mapped = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) else None
    return str(mapped or ip)


@pytest.mark.pulsar
def test_standalone_serves_on_loopback_and_rolls_ledgers(apache_pulsar: PulsarStandalone) -> None:
    assert apache_pulsar.is_running
    assert apache_pulsar.admin("GET", "/admin/v2/clusters") == ["standalone"]
    assert apache_pulsar.admin("GET", "/admin/v2/brokers/health") == "ok"
    # Every port it listens on is on 127.0.0.1, and each is one we chose.
    listening = _listening(apache_pulsar.pid or 0)
    assert listening == {
        ("127.0.0.1", apache_pulsar.port),
        ("127.0.0.1", apache_pulsar.web_port),
        ("127.0.0.1", apache_pulsar.bookie_port),
    }

    topic = unique_topic("standalone")
    count = 2 * ROLLOVER_ENTRIES + 10
    summary = produce(apache_pulsar.service_url, topic, count, 40, batching=False)
    got = [(m.ledger_id, m.entry_id, m.payload) for m in held_messages(apache_pulsar, topic)]
    assert [payload for _, _, payload in got] == [expected_payload(topic, seq, 40) for seq in range(count)]
    # Three ledgers of 50, 50 and 10 entries, each numbered from 0; nothing trimmed (retention is kept).
    ledgers = sorted({ledger for ledger, _, _ in got})
    assert len(ledgers) == 3
    assert [(ledger, entry) for ledger, entry, _ in got] == [
        (ledger, entry) for ledger, n in zip(ledgers, (50, 50, 10), strict=True) for entry in range(n)
    ]
    assert summary.partitions[topic].first_message_id[:2] == (ledgers[0], 0)
    assert internal_ledgers(apache_pulsar, topic) == ledgers


def test_a_missing_release_names_the_fetch_command(tmp_path: Path) -> None:
    with pytest.raises(BrokerError, match=r"pulsar-broker-4\.0\.7\.jar does not exist.*scripts/pulsar\.sh fetch"):
        PulsarStandalone(tmp_path / "data", lib_dir=tmp_path / "lib", version="4.0.7")


def test_config_binds_loopback_keeps_ledgers_and_takes_overrides(tmp_path: Path) -> None:
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "pulsar-broker-9.9.9.jar").write_bytes(b"")
    broker = PulsarStandalone(
        tmp_path / "data",
        port=1111,
        web_port=2222,
        bookie_port=3333,
        max_entries_per_ledger=7,
        config={"defaultRetentionTimeInMinutes": 5, "exposingBrokerEntryMetadataToClientEnabled": True},
        version="9.9.9",
        lib_dir=lib,
    )
    values = broker.config_values()
    assert (values["bindAddress"], values["advertisedAddress"], values["listeningInterface"]) == (
        "127.0.0.1",
        "127.0.0.1",
        "lo",
    )
    assert (values["brokerServicePort"], values["webServicePort"]) == ("1111", "2222")
    assert values["managedLedgerMaxEntriesPerLedger"] == "7"
    assert values["managedLedgerMinLedgerRolloverTimeMinutes"] == "0"
    assert values["defaultRetentionTimeInMinutes"] == "5"  # the override wins
    assert values["defaultRetentionSizeInMB"] == "-1"
    assert values["exposingBrokerEntryMetadataToClientEnabled"] == "true"
    assert values["functionsWorkerEnabled"] == "false"
    assert "managedLedgerMaxEntriesPerLedger=7\n" in broker.config_text()
    command = broker.command()
    assert command[command.index("--bookkeeper-port") + 1] == "3333"
    assert {"--no-functions-worker", "--no-stream-storage", "-Xmx512m"} <= set(command)
    assert command[command.index("-cp") + 1] == f"{lib}/*"
    assert (broker.service_url, broker.admin_url) == ("pulsar://127.0.0.1:1111", "http://127.0.0.1:2222")
    with pytest.raises(BrokerError, match="cannot span lines"):
        PulsarStandalone(tmp_path / "d2", config={"clusterName": "a\nb"}, version="9.9.9", lib_dir=lib).config_text()
    with pytest.raises(BrokerError, match="max_entries_per_ledger must be >= 1"):
        PulsarStandalone(tmp_path / "d3", max_entries_per_ledger=0, version="9.9.9", lib_dir=lib)
