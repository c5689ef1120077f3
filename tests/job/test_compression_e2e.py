"""Compression at rest end to end: one topic holds plain, zstd-compressed, encrypted, and compressed-and-encrypted
segments as its policy changes, plus a compressed segment of entries the producer compressed already (stored as
they are); every reader gets the broker's bytes back, and a damaged frame is refused, never read as entries."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from streamoffload.checkpoints import manifest as mf
from streamoffload.checkpoints.keyring import encryption_key_id
from streamoffload.checkpoints.metadata_store import MetadataStore
from streamoffload.codecs.block_cipher import new_data_key
from streamoffload.codecs.block_frames import CODEC_NONE, CODEC_ZSTD
from streamoffload.codecs.errors import FormatError
from streamoffload.config import load_config
from streamoffload.produce import produce
from streamoffload.read.topic_reader import TopicReader
from streamoffload.storage import keys as store_keys
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


def publish_compressed(service_url: str, topic: str, count: int) -> None:
    """Messages a producer compressed itself (ZSTD): the sink must store their blocks as they are."""
    import pulsar

    client = pulsar.Client(service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    try:
        producer = client.create_producer(topic, compression_type=pulsar.CompressionType.ZSTD, batching_enabled=False)
        for i in range(count):
            producer.send(json.dumps({"seq": i, "text": "x" * 1200}).encode())
        producer.close()
    finally:
        client.close()


def test_mixed_segments_read_back_exactly_through_every_reader(
    spark: Any, pulsar_broker: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    topic = unique_topic("zstd")
    keys = tmp_path / "keys.json"
    keys.write_text(json.dumps({"k1": base64.b64encode(new_data_key()).decode()}))
    monkeypatch.setenv("STREAMOFFLOAD_KEYS_FILE", str(keys))  # the readers in this process
    store_url = f"file://{tmp_path / 'store'}"

    def run(policy: str, *, producer_compressed: bool = False) -> None:
        if producer_compressed:
            publish_compressed(pulsar_broker.service_url, topic, 20)
        else:
            produce(pulsar_broker.service_url, topic, count=20, payload_size=1500, batching=False)
        extra = f'\n[encryption]\nkeys_file = "{keys}"\n[topics."{topic}"]\n{policy}\n'
        config_path = write_config(
            tmp_path, pulsar_broker.service_url, [topic], fs_store(tmp_path), SMALL_SEGMENTS + extra
        )
        OffloadJob(load_config(config_path), str(config_path)).run_once(spark)

    run("")  # plain
    run('offloadCompression = "zstd"')
    run('offloadEncryptionKeyId = "k1"')
    run('offloadCompression = "zstd"\noffloadEncryptionKeyId = "k1"\noffloadCompressionLevel = 9')
    run('offloadCompression = "zstd"', producer_compressed=True)

    scoped = parse_store_url(store_url).open()
    segments = MetadataStore(scoped).offloaded_segments(topic)
    kinds = [(mf.frame_table(m) is not None, encryption_key_id(m)) for m in segments]
    assert kinds[0] == (False, None) and kinds[-1] == (True, None), kinds
    assert {(False, None), (True, None), (False, "k1"), (True, "k1")} <= set(kinds), kinds
    ran = [k for i, k in enumerate(kinds) if i == 0 or k != kinds[i - 1]]
    assert ran == [(False, None), (True, None), (False, "k1"), (True, "k1"), (True, None)], kinds
    for manifest, (compressed, _) in zip(segments, kinds, strict=True):
        if compressed:
            assert mf.driver_property(manifest, mf.PROP_COMPRESSION) == "zstd"
            # The frame records were joined into the manifest and removed.
            assert not list(scoped.store.list(store_keys.part_frames_prefix(manifest.dataKey)))
    producer_compressed = segments[-1]
    assert {f.codec for f in mf.frame_table(producer_compressed) or ()} == {CODEC_NONE}  # stored as they were
    ours = [m for m, k in zip(segments, kinds, strict=True) if k == (True, None) and m is not producer_compressed]
    for manifest in ours:  # the producer's payloads are repetitive: zstd shrinks them a lot
        assert {f.codec for f in mf.frame_table(manifest) or ()} == {CODEC_ZSTD}
        stored = scoped.store.head(manifest.dataKey).size
        assert stored < manifest.dataLength / 4, (stored, manifest.dataLength)

    expected = broker_entries(spark, pulsar_broker.service_url, topic)
    assert len(expected) == 100
    assert read_entries(scoped, topic) == expected  # the reference reader (whole objects, its own decoding)
    with TopicReader(scoped) as reader:  # the read path, through the stored-block view
        assert [(e.ledger_id, e.entry_id, bytes(e.payload)) for e in reader.read(topic)] == expected
    offloaded = spark.read.format("pulsar-offloaded").option("store", store_url).option("topics", topic)
    rows = offloaded.option("keysFile", str(keys)).option("output", "entries").load()
    assert [(r.ledger_id, r.entry_id, bytes(r.entry)) for r in rows.orderBy("ledger_id", "entry_id").collect()] == (
        expected
    )
    # The read-through source: from earliest, every entry the store holds comes from the store.
    through = (
        spark.read.format("pulsar")
        .option("serviceUrl", pulsar_broker.service_url)
        .option("topics", topic)
        .option("offloaded.store", store_url)
        .option("offloaded.keysFile", str(keys))
        .load()
    )
    got = [(r.ledger_id, r.entry_id, bytes(r.entry)) for r in through.orderBy("ledger_id", "entry_id").collect()]
    assert got == expected

    # verify --crc checks every entry of every kind of segment; read prints them.
    env = {"STREAMOFFLOAD_KEYS_FILE": str(keys)}
    verified = cli("verify", "--store", store_url, "--crc", env=env)
    assert verified.returncode == 0 and "NOTE" not in verified.stdout, verified.stdout + verified.stderr
    assert "CRC-32C of 100 of 100 entries" in verified.stdout, verified.stdout
    compressed = sum(1 for c, _ in kinds if c)
    assert f"{compressed} segment(s) compressed at rest" in verified.stdout, verified.stdout
    # Without the key, compressed-only segments are still checked in full; encrypted ones by structure.
    without = cli("verify", "--store", store_url, "--crc", env={})
    assert without.returncode == 0, without.stdout + without.stderr
    notes = [line for line in without.stdout.splitlines() if line.startswith("NOTE")]
    assert len(notes) == sum(1 for _, key_id in kinds if key_id), without.stdout
    printed = cli("read", "--store", store_url, topic, env=env)
    lines = [json.loads(line) for line in printed.stdout.splitlines()]
    assert [(d["ledger_id"], d["entry_id"], base64.b64decode(d["payload"])) for d in lines] == expected

    # One flipped bit inside a compressed frame: refused by the read and by verify, never returned as entries.
    victim = ours[0]
    path = tmp_path / "store" / victim.dataKey
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x10
    path.write_bytes(bytes(data))
    with pytest.raises(FormatError), TopicReader(scoped) as reader:
        list(reader.read(topic))
    flipped = cli("verify", "--store", store_url, "--crc", env=env)
    assert flipped.returncode == 1 and victim.dataKey in flipped.stdout, flipped.stdout
