"""Encryption and compression at rest end to end, in one topic whose policy changes run by run: plain, zstd,
k1-encrypted, then k2-encrypted and zstd (a key rotation, both on), then zstd over entries the producer compressed
itself (stored as they are). Every reader gets the broker's bytes back; a missing key, a wrong key, a flipped
ciphertext bit and a flipped bit in a compressed frame are each one clear error, with no key material in it."""

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
from streamoffload.checkpoints.keyring import KeyRing, KeyUnavailableError, encryption_key_id
from streamoffload.checkpoints.metadata_store import MetadataStore
from streamoffload.codecs.block_cipher import NONCE_BYTES, OVERHEAD, BlockAuthenticationError, new_data_key
from streamoffload.codecs.block_frames import CODEC_NONE, CODEC_ZSTD, FrameError, StoredBlock, stored_blocks
from streamoffload.codecs.index import OffloadIndex
from streamoffload.config import load_config
from streamoffload.produce import produce
from streamoffload.read.topic_reader import TopicReader
from streamoffload.storage import keys as store_keys
from streamoffload.storage.location import parse_store_url
from streamoffload.streaming.job.offload_job import OffloadJob
from tests.fixtures.broker import unique_topic
from tests.fixtures.job import SMALL_SEGMENTS, fs_store, write_config
from tests.fixtures.readback import read_entries

pytestmark = [pytest.mark.spark, pytest.mark.broker]

RUNS = (
    ("plain", ""),
    ("zstd", 'offloadCompression = "zstd"'),
    ("k1", 'offloadEncryptionKeyId = "k1"'),
    ("k2+zstd", 'offloadEncryptionKeyId = "k2"\noffloadCompression = "zstd"\noffloadCompressionLevel = 9'),
    ("zstd, producer-compressed", 'offloadCompression = "zstd"'),
)


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
    frame = (
        spark.read.format("pulsar")
        .option("output", "entries")
        .option("serviceUrl", service_url)
        .option("topics", topic)
        .load()
    )
    return [(r.ledger_id, r.entry_id, bytes(r.entry)) for r in frame.orderBy("ledger_id", "entry_id").collect()]


def publish_compressed(service_url: str, topic: str, count: int) -> None:
    """Messages a producer compressed itself (ZSTD): the sink stores their blocks as they are."""
    import pulsar

    client = pulsar.Client(service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    try:
        producer = client.create_producer(topic, compression_type=pulsar.CompressionType.ZSTD, batching_enabled=False)
        for i in range(count):
            producer.send(json.dumps({"seq": i, "text": "x" * 1200}).encode())
        producer.close()
    finally:
        client.close()


def middle_block(scoped: Any, manifest: Any) -> StoredBlock:
    """The middle block of a segment, with where its frame is stored in the data object."""
    v1_ledger = manifest.startLedgerId if manifest.formatVersion == 1 else None
    index = OffloadIndex.decode(scoped.store.get(manifest.indexKey), ledger_id=v1_ledger)
    overhead = OVERHEAD if encryption_key_id(manifest) else 0
    laid = stored_blocks([(b.offset, b.length) for b in index.blocks()], mf.frame_table(manifest), overhead)
    return laid[len(laid) // 2]


def kind_of(manifest: Any) -> tuple[bool, str | None]:
    """(compressed, key id) of a segment, from its manifest."""
    return mf.frame_table(manifest) is not None, encryption_key_id(manifest)


def test_plain_compressed_and_encrypted_segments_with_a_rotation_read_back_exactly(
    spark: Any, pulsar_broker: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    topic = unique_topic("at-rest")
    k1, k2 = new_data_key(), new_data_key()
    keys = tmp_path / "keys.json"
    keys.write_text(json.dumps({"k1": base64.b64encode(k1).decode(), "k2": base64.b64encode(k2).decode()}))
    keys.chmod(0o600)  # a key file is its owner's alone
    monkeypatch.setenv("STREAMOFFLOAD_KEYS_FILE", str(keys))  # the readers in this process
    store_url = f"file://{tmp_path / 'store'}"
    marker = b"plaintext-marker-"

    for name, policy in RUNS:
        if "producer" in name:
            publish_compressed(pulsar_broker.service_url, topic, 20)
        else:
            produce(
                pulsar_broker.service_url,
                topic,
                count=20,
                payload_size=1500,
                batching=False,
                properties={"m": marker.decode()},
            )
        extra = f'\n[encryption]\nkeys_file = "{keys}"\n[topics."{topic}"]\n{policy}\n'
        config_path = write_config(
            tmp_path, pulsar_broker.service_url, [topic], fs_store(tmp_path), SMALL_SEGMENTS + extra
        )
        OffloadJob(load_config(config_path), str(config_path)).run_once(spark)

    scoped = parse_store_url(store_url).open()
    segments = MetadataStore(scoped).offloaded_segments(topic)
    kinds = [kind_of(m) for m in segments]
    ran = [k for i, k in enumerate(kinds) if i == 0 or k != kinds[i - 1]]
    # In order, a run of segments each; the rotation: new segments use k2, older ones keep k1.
    assert ran == [(False, None), (True, None), (False, "k1"), (True, "k2"), (True, None)], kinds
    for manifest, (compressed, key_id) in zip(segments, kinds, strict=True):
        data = scoped.store.get(manifest.dataKey)
        # Ciphertext at rest: the producer's bytes are not in an encrypted object (compression may keep a first
        # occurrence as a literal, so compressed-only objects are not asked).
        if key_id is not None or not compressed:
            assert (marker in data) == (key_id is None), manifest.dataKey
        if compressed:
            assert mf.driver_property(manifest, mf.PROP_COMPRESSION) == "zstd"
            # The parts' frame records were joined into the manifest, then removed.
            assert not list(scoped.store.list(store_keys.part_frames_prefix(manifest.dataKey)))
    producer_compressed = segments[-1]
    assert {f.codec for f in mf.frame_table(producer_compressed) or ()} == {CODEC_NONE}  # stored as they were
    zstd_only = [m for m, k in zip(segments, kinds, strict=True) if k == (True, None) and m is not producer_compressed]
    for manifest in zstd_only:  # the producer's payloads repeat themselves: zstd shrinks them a lot
        assert {f.codec for f in mf.frame_table(manifest) or ()} == {CODEC_ZSTD}
        assert scoped.store.head(manifest.dataKey).size < manifest.dataLength / 4

    expected = broker_entries(spark, pulsar_broker.service_url, topic)
    assert len(expected) == 20 * len(RUNS)
    assert read_entries(scoped, topic) == expected  # the reference reader (whole objects, its own decoding)
    with TopicReader(scoped) as reader:  # the read path, through the stored-block view
        assert [(e.ledger_id, e.entry_id, bytes(e.payload)) for e in reader.read(topic)] == expected
    offloaded = spark.read.format("pulsar-offloaded").option("store", store_url).option("topics", topic)
    # Spark's workers do not see this process's environment: the reader's keysFile names the keys.
    rows = offloaded.option("keysFile", str(keys)).option("output", "entries").load().orderBy("ledger_id", "entry_id")
    assert [(r.ledger_id, r.entry_id, bytes(r.entry)) for r in rows.collect()] == expected
    # The read-through source: from earliest, every entry the store holds comes from the store.
    through = (
        spark.read.format("pulsar")
        .option("output", "entries")
        .option("serviceUrl", pulsar_broker.service_url)
        .option("topics", topic)
        .option("offloaded.store", store_url)
        .option("offloaded.keysFile", str(keys))
        .load()
    )
    got = [(r.ledger_id, r.entry_id, bytes(r.entry)) for r in through.orderBy("ledger_id", "entry_id").collect()]
    assert got == expected

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

    # verify: with the keys every entry of every kind of segment is checked; without them, compressed-only and
    # plain segments still are, encrypted ones by structure, and it says what was not checked.
    env = {"STREAMOFFLOAD_KEYS_FILE": str(keys)}
    with_keys = cli("verify", "--store", store_url, "--crc", env=env)
    assert with_keys.returncode == 0 and "NOTE" not in with_keys.stdout, with_keys.stdout + with_keys.stderr
    assert f"CRC-32C of {len(expected)} of {len(expected)} entries" in with_keys.stdout, with_keys.stdout
    compressed = sum(1 for c, _ in kinds if c)
    assert f"{compressed} segment(s) compressed at rest" in with_keys.stdout, with_keys.stdout
    without = cli("verify", "--store", store_url, "--crc", env={})
    assert without.returncode == 0, without.stdout + without.stderr
    notes = [line for line in without.stdout.splitlines() if line.startswith("NOTE")]
    encrypted = sum(1 for _, key_id in kinds if key_id)
    assert len(notes) == encrypted and all("which is not configured" in n for n in notes), without.stdout
    printed = cli("read", "--store", store_url, topic, env=env)
    lines = [json.loads(line) for line in printed.stdout.splitlines()]
    assert [(d["ledger_id"], d["entry_id"], base64.b64decode(d["payload"])) for d in lines] == expected

    # One flipped bit in a k1-encrypted object's ciphertext, and one in a compressed frame: each read refuses it,
    # and verify names both objects.
    encrypted_victim = next(m for m, k in zip(segments, kinds, strict=True) if k == (False, "k1"))
    compressed_victim = zstd_only[0]
    # The middle block of each: in the ciphertext past its nonce (the tag fails), in the zstd frame's magic number
    # (its header no longer declares the block's size; a bit deeper in a frame without a checksum could decompress
    # to other bytes, refused by another check).
    hit = {victim.dataKey: middle_block(scoped, victim) for victim in (encrypted_victim, compressed_victim)}
    for victim, at in ((encrypted_victim, NONCE_BYTES + 100), (compressed_victim, 0)):
        path = tmp_path / "store" / victim.dataKey
        data = bytearray(path.read_bytes())
        data[hit[victim.dataKey].stored_offset + at] ^= 0x10
        path.write_bytes(bytes(data))
    # Each victim read alone: one error naming its object and the plaintext offset of the block it hit.
    block = hit[encrypted_victim.dataKey]
    with pytest.raises(BlockAuthenticationError) as refused, TopicReader(scoped) as reader:
        list(reader.open_segment(encrypted_victim).read_range())
    assert str(refused.value) == (
        f"{encrypted_victim.dataKey}: encrypted block at plaintext offset {block.plain_offset} fails authentication "
        f"(altered bytes, or another key) (at byte offset {block.plain_offset})"
    )
    block = hit[compressed_victim.dataKey]
    with pytest.raises(FrameError) as broken, TopicReader(scoped) as reader:
        list(reader.open_segment(compressed_victim).read_range())
    assert str(broken.value) == (
        f"{compressed_victim.dataKey}: zstd frame of the block at plaintext offset {block.plain_offset} says it "
        f"holds an unknown number of bytes, the index says {block.plain_length} (at byte offset {block.plain_offset})"
    )
    # The topic read whole stops at the first of them in position order (the zstd run comes before k1's).
    with pytest.raises(FrameError) as first_refused, TopicReader(scoped) as reader:
        list(reader.read(topic))
    assert str(first_refused.value) == str(broken.value)
    flipped = cli("verify", "--store", store_url, "--crc", env=env)
    assert flipped.returncode == 1 and "BlockAuthenticationError" in flipped.stdout, flipped.stdout
    assert encrypted_victim.dataKey in flipped.stdout and compressed_victim.dataKey in flipped.stdout, flipped.stdout
