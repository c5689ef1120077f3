"""Every reader decrypts a store encrypted at rest with the configuration's ``[encryption] keysFile``: ``read
--conf`` (by topic and by object keys), ``read --follow`` (read-through from the store, then the broker),
``verify --conf``, the ``pulsar-offloaded`` DataFrame reader given ``conf``, and the live ``pulsar`` source's
read-through (``offloaded.keysFile``). The store is made by the segmenter and the sink (``bench.histories``)
with the key in the environment; the readers run without it, so the configuration's file is their only key."""

from __future__ import annotations

import base64
import json
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from streamoffload.checkpoints.keyring import ENV_KEY_PREFIX, ENV_KEYS_FILE, encryption_key_id
from streamoffload.cli import main
from streamoffload.embedded_broker import EmbeddedBroker
from streamoffload.errors import ConfigError
from streamoffload.storage.filesystem import FilesystemStore
from streamoffload.storage.location import ScopedStore
from tests.fixtures.broker import unique_topic
from tests.read import History, offload, pulsar_entries

KEY_ID = "k1"
KEY = base64.b64encode(bytes(range(32))).decode()


@dataclass(frozen=True)
class EncryptedStore:
    history: History
    store: Path
    conf: Path
    keys: Path
    segments: list[tuple[str, str]]
    """(data key, index key) of each segment."""


def _without_keys_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith(ENV_KEY_PREFIX) or name == ENV_KEYS_FILE:
            monkeypatch.delenv(name)


@pytest.fixture(autouse=True)
def no_keys_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    _without_keys_in_the_environment(monkeypatch)


@pytest.fixture(scope="module")
def encrypted(tmp_path_factory: pytest.TempPathFactory) -> EncryptedStore:
    tmp = tmp_path_factory.mktemp("key-file-readers")
    keys = tmp / "keys.toml"
    keys.write_text(f'{KEY_ID} = "{KEY}"\n')
    keys.chmod(0o600)
    history = replace(pulsar_entries({3: 30, 5: 25}), topic=unique_topic("encrypted"))
    scoped = ScopedStore(FilesystemStore(str(tmp / "store")))
    with pytest.MonkeyPatch.context() as mp:
        _without_keys_in_the_environment(mp)
        mp.setenv(f"{ENV_KEY_PREFIX}{KEY_ID}", KEY)  # the sink's key; the readers get theirs from the file
        metadata = offload(scoped, history, encryption_key_id=KEY_ID)
    manifests = metadata.offloaded_segments(history.topic)
    assert len(manifests) >= 2 and {encryption_key_id(m) for m in manifests} == {KEY_ID}
    conf = tmp / "streamoffload.toml"
    conf.write_text(
        '[store]\nmanagedLedgerOffloadDriver = "filesystem"\nroot = "store"\n\n[encryption]\nkeysFile = "keys.toml"\n'
    )
    segments = [(m.dataKey, m.indexKey) for m in manifests]
    scoped.store.close()
    return EncryptedStore(history, tmp / "store", conf, keys, segments)


def entry_lines(text: str) -> list[tuple[int, int, bytes]]:
    lines = [json.loads(line) for line in text.splitlines()]
    return [(line["ledger_id"], line["entry_id"], base64.b64decode(line["payload"])) for line in lines]


def test_read_with_conf_decrypts_with_its_key_file(
    encrypted: EncryptedStore, capsys: pytest.CaptureFixture[str]
) -> None:
    topic = encrypted.history.topic
    assert main(["read", "--store", str(encrypted.store), topic]) == 1  # no key: the store alone cannot be read
    assert f"needs encryption key '{KEY_ID}'" in capsys.readouterr().err
    assert main(["read", "--conf", str(encrypted.conf), topic]) == 0
    assert entry_lines(capsys.readouterr().out) == encrypted.history.expected
    # One segment by its object keys: the same key file.
    data_key, index_key = encrypted.segments[1]
    assert main(["read", "--conf", str(encrypted.conf), "--data-key", data_key, "--index-key", index_key]) == 0
    stored = entry_lines(capsys.readouterr().out)
    assert stored and stored == [e for e in encrypted.history.expected if stored[0][:2] <= e[:2] <= stored[-1][:2]]


def verify_totals(args: list[str], capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    code = main(["verify", *args, "--crc", "--json"])
    doc: dict[str, Any] = json.loads(capsys.readouterr().out)
    assert code == (0 if doc["ok"] else 1)
    return doc["totals"]


def test_verify_with_conf_checks_every_entry_of_the_encrypted_segments(
    encrypted: EncryptedStore, capsys: pytest.CaptureFixture[str]
) -> None:
    segments, entries = len(encrypted.segments), len(encrypted.history.entries)
    without = verify_totals(["--store", str(encrypted.store)], capsys)
    assert (without["encrypted_segments"], without["encrypted_unchecked"]) == (segments, segments)
    totals = verify_totals(["--conf", str(encrypted.conf)], capsys)
    assert (totals["encrypted_segments"], totals["encrypted_unchecked"], totals["problems"]) == (segments, 0, 0)
    assert (totals["entries"], totals["crc_checked"]) == (entries, entries)
    data_key, index_key = encrypted.segments[0]
    one = verify_totals(["--conf", str(encrypted.conf), "--data-key", data_key, "--index-key", index_key], capsys)
    assert (one["segments"], one["encrypted_unchecked"], one["problems"]) == (1, 0, 0)
    assert one["crc_checked"] == one["entries"] > 0


@pytest.mark.broker
def test_read_follow_reads_through_the_store_with_the_conf_key_file(
    encrypted: EncryptedStore, pulsar_broker: EmbeddedBroker, capsys: pytest.CaptureFixture[str]
) -> None:
    """The broker holds nothing of the topic (its retention took it all): the store serves every entry up to --to."""
    last = encrypted.history.expected[-1]
    command = ["read", "--conf", str(encrypted.conf), encrypted.history.topic, "--follow"]
    command += ["--service-url", pulsar_broker.service_url, "--to", f"{last[0]}:{last[1]}", "--poll-seconds", "0.1"]
    assert main(command) == 0
    assert entry_lines(capsys.readouterr().out) == encrypted.history.expected


@pytest.mark.spark
def test_the_dataframe_readers_decrypt_with_the_key_file(
    encrypted: EncryptedStore, spark: Any, pulsar_broker: EmbeddedBroker
) -> None:
    """``pulsar-offloaded`` given only ``conf`` (its store and key file), and the ``pulsar`` source's read-through
    given ``offloaded.keysFile``; both in one Spark session."""
    topic = encrypted.history.topic
    offloaded = (
        spark.read.format("pulsar-offloaded")
        .option("conf", str(encrypted.conf))
        .option("topics", topic)
        .option("output", "entries")
        .load()
    )
    rows = offloaded.orderBy("ledger_id", "entry_id").collect()
    assert [(r.ledger_id, r.entry_id, bytes(r.entry)) for r in rows] == encrypted.history.expected

    through_reader = (
        spark.read.format("pulsar")
        .option("output", "entries")  # the entry rows, compared with the history's entries
        .option("serviceUrl", pulsar_broker.service_url)
        .option("topics", topic)
        .option("stallTimeoutMs", "100")
        .option("offloaded.store", f"file://{encrypted.store}")
        .option("offloaded.keysFile", str(encrypted.keys))
    )
    rows = through_reader.load().orderBy("ledger_id", "entry_id").collect()
    assert [(r.ledger_id, r.entry_id, bytes(r.entry)) for r in rows] == encrypted.history.expected
    # startingTime: the planner finds the first entry published at or after it in the encrypted store.
    at = encrypted.history.entries[20].publish_time
    rows = through_reader.option("startingTime", str(at)).load().orderBy("ledger_id", "entry_id").collect()
    assert [(r.ledger_id, r.entry_id, bytes(r.entry)) for r in rows] == encrypted.history.expected[20:]


def test_the_offloaded_readers_conf_option_gives_the_store_and_the_key_file(encrypted: EncryptedStore) -> None:
    pytest.importorskip("pyspark")
    from streamoffload.streaming.source.offloaded_source import OffloadedOptions

    topic = encrypted.history.topic
    parsed = OffloadedOptions.parse({"CONF": str(encrypted.conf), "topics": topic})
    assert (parsed.location.scheme, parsed.location.path, parsed.keys_file) == (
        "file",
        str(encrypted.store),
        str(encrypted.keys),
    )
    # The options say more than the file: they win.
    other = OffloadedOptions.parse(
        {"conf": str(encrypted.conf), "store": "/elsewhere", "keysFile": "/etc/k.toml", "topics": topic}
    )
    assert (other.location.path, other.keys_file) == ("/elsewhere", "/etc/k.toml")
    with pytest.raises(ConfigError, match=r"^configuration file not found: /nonexistent\.toml$"):
        OffloadedOptions.parse({"conf": "/nonexistent.toml", "topics": topic})
