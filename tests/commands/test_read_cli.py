"""``streamoffload read``: JSON lines of entries and messages, on the filesystem store and on S3 (moto)."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest

from streamoffload.checkpoints import manifest as mf
from streamoffload.checkpoints.metadata_store import MetadataStore
from streamoffload.cli import main
from streamoffload.codecs.compression import CompressionType, DecompressionError, compress
from streamoffload.codecs.entry import MessageMetadata, encode_entry
from streamoffload.read.dataset_plan import ReadTask
from streamoffload.read.dataset_read import read_task, rows
from streamoffload.storage.base import ObjectStore
from streamoffload.storage.filesystem import FilesystemStore
from streamoffload.storage.location import ScopedStore
from tests.fixtures.entries import Published
from tests.fixtures.s3 import S3_REGION
from tests.read import MIB, TOPIC, History, offload, pulsar_entries

PREFIX = "offload"


@pytest.fixture(params=["filesystem", "s3"])
def target(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[ObjectStore, list]:
    """A store holding nothing yet, and the CLI flags that name it (S3 keys live under a prefix)."""
    if request.param == "filesystem":
        root = tmp_path / "store"
        return FilesystemStore(root, fsync=False), ["--store", root.as_uri()]
    from streamoffload.storage.s3 import S3Store

    endpoint = request.getfixturevalue("moto_server")
    bucket = request.getfixturevalue("s3_bucket")
    settings = request.getfixturevalue("s3_settings")
    # The CLI takes credentials from the standard AWS chain.
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    flags = ["--store", f"s3://{bucket}/{PREFIX}", "--s3-endpoint", endpoint, "--s3-region", S3_REGION]
    return S3Store(bucket, **settings), flags


@pytest.fixture
def history() -> History:
    return pulsar_entries({3: 30, 4: 25, 8: 20}, seed=5)


@pytest.fixture
def offloaded(target: tuple[ObjectStore, list], history: History) -> MetadataStore:
    store, flags = target
    prefix = PREFIX if flags[1].startswith("s3://") else ""
    return offload(ScopedStore(store, prefix), history, switch_at=40)


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[dict[str, Any]], str]:
    code = main(["read", *argv])
    out, err = capsys.readouterr()
    return code, [json.loads(line) for line in out.splitlines()], err


def test_reads_every_entry_as_json_lines(
    capsys: pytest.CaptureFixture[str], target: tuple, history: History, offloaded: MetadataStore
) -> None:
    _, flags = target
    code, lines, _ = cli(capsys, *flags, TOPIC)
    assert code == 0
    assert [(d["ledger_id"], d["entry_id"], base64.b64decode(d["payload"])) for d in lines] == history.expected
    assert set(lines[0]) == {"ledger_id", "entry_id", "payload"}
    assert {s.formatVersion for s in offloaded.offloaded_segments(TOPIC)} == {1, 2}


def test_messages_recover_payload_key_and_properties(
    capsys: pytest.CaptureFixture[str], target: tuple, history: History, offloaded: MetadataStore
) -> None:
    _, flags = target
    code, lines, _ = cli(capsys, *flags, "orders-partition-0", "--messages", "--from", "4:20", "--to", "8:3")
    assert code == 0
    expected = []
    for entry in history.entries:
        if (4, 20) <= (entry.ledger_id, entry.entry_id) <= (8, 3):
            sent = history.messages[(entry.ledger_id, entry.entry_id)]
            for i, msg in enumerate(sent):
                expected.append(
                    {
                        "ledger_id": entry.ledger_id,
                        "entry_id": entry.entry_id,
                        "batch_index": -1 if len(sent) == 1 else i,
                        "key": msg.key,
                        "properties": msg.properties,
                        "publish_time": entry.publish_time,
                        "event_time": msg.event_time,
                        "payload": base64.b64encode(msg.payload).decode(),
                    }
                )
    assert lines == expected
    assert any(d["batch_index"] >= 0 for d in lines) and any(d["properties"] for d in lines)


def test_range_and_limit(
    capsys: pytest.CaptureFixture[str], target: tuple, history: History, offloaded: MetadataStore
) -> None:
    _, flags = target
    code, lines, _ = cli(capsys, *flags, TOPIC, "--from", "3:28", "--limit", "5", "--no-readahead")
    assert code == 0
    assert [(d["ledger_id"], d["entry_id"]) for d in lines] == [(3, 28), (3, 29), (4, 0), (4, 1), (4, 2)]
    code, lines, _ = cli(capsys, *flags, TOPIC, "--to", "3:1")
    assert [(d["ledger_id"], d["entry_id"]) for d in lines] == [(3, 0), (3, 1)]


def test_reads_one_segment_by_its_object_keys(
    capsys: pytest.CaptureFixture[str], target: tuple, history: History, offloaded: MetadataStore
) -> None:
    _, flags = target
    segments = offloaded.offloaded_segments(TOPIC)
    v1 = next(s for s in segments if s.formatVersion == 1)
    v2 = next(s for s in segments if s.formatVersion == 2)
    for seg in (v1, v2):
        code, lines, _ = cli(capsys, *flags, "--data-key", seg.dataKey, "--index-key", seg.indexKey)
        assert code == 0
        got = [(d["ledger_id"], d["entry_id"]) for d in lines]
        start, end = (seg.startLedgerId, seg.startEntryId), (seg.endLedgerId, seg.endEntryId)
        assert got == [p for p in history.positions() if start <= p <= end]


def test_clear_errors(capsys: pytest.CaptureFixture[str], target: tuple, offloaded: MetadataStore) -> None:
    store, flags = target
    code, lines, err = cli(capsys, *flags, "persistent://public/default/missing")
    assert (code, lines) == (1, [])
    assert "no offloaded segments for topic persistent://public/default/missing" in err and TOPIC in err
    code, lines, err = cli(capsys, *flags, TOPIC, "--from", "5:0")
    assert (code, lines) == (1, [])
    assert "position 5:0 is not offloaded" in err and "first offloaded entry after it is 8:0" in err
    code, _, err = cli(capsys, *flags, TOPIC, "--from", "x")
    assert code == 1 and "--from" in err and "LEDGER:ENTRY" in err
    seg = offloaded.offloaded_segments(TOPIC)[1]
    store.delete(seg.indexKey)
    code, _, err = cli(capsys, *flags, TOPIC)
    assert code == 1 and seg.indexKey in err and "missing" in err


def test_reads_with_a_configuration_file(capsys: pytest.CaptureFixture[str], tmp_path: Path, history: History) -> None:
    root = tmp_path / "store"
    offload(ScopedStore(FilesystemStore(root, fsync=False)), history)
    conf = tmp_path / "so.toml"
    conf.write_text(
        f'[store]\nmanagedLedgerOffloadDriver = "filesystem"\nroot = "{root}"\n\n'
        "[offload]\nmanagedLedgerOffloadReadBufferSizeInBytes = 512\n"
    )
    code, lines, _ = cli(capsys, "--conf", str(conf), TOPIC)
    assert code == 0
    assert [(d["ledger_id"], d["entry_id"], base64.b64decode(d["payload"])) for d in lines] == history.expected


def test_messages_inflate_up_to_the_configured_brokers_max_message_size(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A producer's 7 MiB message compressed (zstd): above the cap of Pulsar's default ``maxMessageSize`` (5 MiB
    and 1 MiB of batch framing), so refused naming it; read once ``[pulsar] max_message_size`` says the broker
    takes 8 MiB. The same bound reaches the DataFrame reader's ``read_task``."""
    body = bytes(7 * MIB)
    md = MessageMetadata(
        producer_name="p", sequence_id=0, publish_time=1, compression=CompressionType.ZSTD, uncompressed_size=len(body)
    )
    root = tmp_path / "store"
    scoped = ScopedStore(FilesystemStore(root, fsync=False))
    meta = offload(scoped, History(TOPIC, [Published(3, 0, encode_entry(md, compress(CompressionType.ZSTD, body)), 1)]))
    store_conf = f'[store]\nmanagedLedgerOffloadDriver = "filesystem"\nroot = "{root}"\n'
    default, larger = tmp_path / "default.toml", tmp_path / "larger.toml"
    default.write_text(store_conf)
    larger.write_text(f"[pulsar]\nmax_message_size = {8 * MIB}\n\n{store_conf}")

    code, lines, err = cli(capsys, "--conf", str(default), "--messages", TOPIC)
    assert (code, lines) == (1, [])
    assert f"ZSTD payload with uncompressed_size {7 * MIB} refused: it is above the 6291456-byte bound" in err
    code, lines, err = cli(capsys, "--conf", str(larger), "--messages", TOPIC)
    assert code == 0, err
    assert [(d["ledger_id"], d["entry_id"], base64.b64decode(d["payload"]) == body) for d in lines] == [(3, 0, True)]

    (segment,) = meta.offloaded_segments(TOPIC)
    task = ReadTask(TOPIC, mf.encode_manifest(segment), None, None)
    with pytest.raises(DecompressionError, match="above the 6291456-byte bound"):
        list(read_task(scoped, task))
    (batch,) = read_task(scoped, task, max_uncompressed=9 * MIB)
    assert [r["value"] == body for r in rows(batch)] == [True]
