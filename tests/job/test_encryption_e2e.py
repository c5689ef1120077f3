"""Encryption at rest end to end: the job writes plain, k1- and k2-encrypted segments into one topic as its
policy changes (a rotation), every reader gets the broker's bytes back, and a missing key, a wrong key or a
flipped ciphertext bit is one clear error, with no key material in it."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from streamoffload.checkpoints.keyring import KeyRing, KeyUnavailableError, encryption_key_id
from streamoffload.checkpoints.metadata_store import MetadataStore
from streamoffload.codecs.block_cipher import BlockAuthenticationError, new_data_key
from streamoffload.config import load_config
from streamoffload.produce import produce
from streamoffload.read.topic_reader import TopicReader
from streamoffload.storage.location import parse_store_url
from streamoffload.streaming.job.offload_job import OffloadJob
from tests.fixtures.broker import unique_topic
from tests.job.readback import read_entries
from tests.job.test_job_e2e import SMALL_SEGMENTS, fs_store, write_config

pytestmark = [pytest.mark.spark, pytest.mark.broker]


def cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("STREAMOFFLOAD_K")}
    return subprocess.run(
        [sys.executable, "-m", "streamoffload", *args],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def broker_entries(spark: Any, service_url: str, topic: str) -> list[tuple[int, int, bytes]]:
    frame = spark.read.format("pulsar").option("serviceUrl", service_url).option("topics", topic).load()
    return [(r.ledger_id, r.entry_id, bytes(r.entry)) for r in frame.orderBy("ledger_id", "entry_id").collect()]


def test_plain_and_encrypted_segments_with_a_rotation_read_back_exactly(
    spark: Any, pulsar_broker: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    topic = unique_topic("enc")
    k1, k2 = new_data_key(), new_data_key()
    keys = tmp_path / "keys.json"
    keys.write_text(json.dumps({"k1": base64.b64encode(k1).decode(), "k2": base64.b64encode(k2).decode()}))
    monkeypatch.setenv("STREAMOFFLOAD_KEYS_FILE", str(keys))  # the readers in this process
    marker = b"plaintext-marker-"

    def run(key_id: str) -> None:
        produce(
            pulsar_broker.service_url,
            topic,
            count=20,
            payload_size=1500,
            batching=False,
            properties={"m": marker.decode()},
        )
        policy = f'\n[encryption]\nkeys_file = "{keys}"\n[topics."{topic}"]\noffloadEncryptionKeyId = "{key_id}"\n'
        config_path = write_config(
            tmp_path, pulsar_broker.service_url, [topic], fs_store(tmp_path), SMALL_SEGMENTS + policy
        )
        OffloadJob(load_config(config_path), str(config_path)).run_once(spark)

    run("")  # plain
    run("k1")
    run("k2")  # rotated: new segments use k2, older ones keep theirs
    scoped = parse_store_url(f"file://{tmp_path / 'store'}").open()
    segments = MetadataStore(scoped).offloaded_segments(topic)
    ids = [encryption_key_id(m) for m in segments]
    assert ids[0] is None and "k1" in ids and ids[-1] == "k2" and ids == sorted(ids, key=lambda i: i or ""), ids
    for manifest in segments:  # ciphertext at rest: the producer's bytes are not in an encrypted object
        data = scoped.store.get(manifest.dataKey)
        assert (marker in data) == (encryption_key_id(manifest) is None), manifest.dataKey

    expected = broker_entries(spark, pulsar_broker.service_url, topic)
    assert len(expected) == 60
    assert read_entries(scoped, topic) == expected  # the reference reader (whole objects, decrypted)
    with TopicReader(scoped) as reader:  # the read path, through the decrypting view
        assert [(e.ledger_id, e.entry_id, bytes(e.payload)) for e in reader.read(topic)] == expected
    frame = (
        spark.read.format("pulsar-offloaded").option("store", f"file://{tmp_path / 'store'}").option("topics", topic)
    )
    frame = frame.option("keysFile", str(keys))  # Spark's workers do not see this process's environment
    rows = frame.option("output", "entries").load().orderBy("ledger_id", "entry_id").collect()
    assert [(r.ledger_id, r.entry_id, bytes(r.entry)) for r in rows] == expected

    # Without k1 (only k2 configured): one error naming the key id, and no key material anywhere in it.
    only_k2 = KeyRing({"k2": k2})
    with (
        pytest.raises(KeyUnavailableError, match=r"needs encryption key 'k1'") as err,
        TopicReader(scoped, keyring=only_k2) as reader,
    ):
        list(reader.read(topic))
    for secret in (k1, k2):
        assert base64.b64encode(secret).decode() not in str(err.value) and secret.hex() not in str(err.value)
    # A different key under the name k1: refused, not garbage.
    wrong = KeyRing({"k1": new_data_key(), "k2": k2})
    with (
        pytest.raises(BlockAuthenticationError, match="wrapped data key"),
        TopicReader(scoped, keyring=wrong) as reader,
    ):
        list(reader.read(topic))

    # verify: with the keys every entry is checked; without them the structure is, and it says what was not.
    store_url = f"file://{tmp_path / 'store'}"
    with_keys = cli("verify", "--store", store_url, "--crc", env={"STREAMOFFLOAD_KEYS_FILE": str(keys)})
    assert with_keys.returncode == 0 and "NOTE" not in with_keys.stdout, with_keys.stdout + with_keys.stderr
    assert "CRC-32C of 60 of 60 entries" in with_keys.stdout, with_keys.stdout
    without = cli("verify", "--store", store_url, "--crc", env={})
    assert without.returncode == 0, without.stdout + without.stderr
    notes = [line for line in without.stdout.splitlines() if line.startswith("NOTE")]
    encrypted = sum(1 for m in segments if encryption_key_id(m))
    assert len(notes) == encrypted and all("which is not configured" in n for n in notes), without.stdout
    printed = cli("read", "--store", store_url, topic, env={"STREAMOFFLOAD_KEYS_FILE": str(keys)})
    lines = [json.loads(line) for line in printed.stdout.splitlines()]
    assert [(d["ledger_id"], d["entry_id"], base64.b64decode(d["payload"])) for d in lines] == expected

    # One flipped bit in an encrypted object's ciphertext: the read refuses it.
    victim = next(m for m in segments if encryption_key_id(m) == "k1")
    path = tmp_path / "store" / victim.dataKey
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x10
    path.write_bytes(bytes(data))
    with pytest.raises(BlockAuthenticationError, match="fails authentication"), TopicReader(scoped) as reader:
        list(reader.read(topic))
    flipped = cli("verify", "--store", store_url, "--crc", env={"STREAMOFFLOAD_KEYS_FILE": str(keys)})
    assert flipped.returncode == 1 and "BlockAuthenticationError" in flipped.stdout, flipped.stdout
