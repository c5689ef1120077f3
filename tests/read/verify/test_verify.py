"""``streamoffload verify``: a clean store passes; every kind of damage fails, naming object and offset."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from streamoffload.checkpoints import manifest as mf
from streamoffload.checkpoints.metadata_store import MetadataStore
from streamoffload.cli import main
from streamoffload.codecs.blocks import BLOCK_HEADER_LENGTH, ENTRY_HEADER_LENGTH
from streamoffload.codecs.entry import decode_entry
from streamoffload.codecs.index import OffloadIndex
from streamoffload.storage.base import ObjectStore
from streamoffload.storage.filesystem import FilesystemStore
from streamoffload.storage.location import ScopedStore
from tests.fixtures.s3 import S3_REGION
from tests.read import TOPIC, History, flip_byte, offload, pulsar_entries, truncate


@pytest.fixture(params=["filesystem", "s3"])
def target(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[ObjectStore, list]:
    if request.param == "filesystem":
        root = tmp_path / "store"
        return FilesystemStore(root, fsync=False), ["--store", str(root)]
    store = request.getfixturevalue("s3_store")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    flags = ["--store", f"s3://{store.bucket}", "--s3-endpoint", request.getfixturevalue("moto_server")]
    return store, [*flags, "--s3-region", S3_REGION]


@pytest.fixture
def history() -> History:
    return pulsar_entries({3: 30, 4: 25, 8: 20}, seed=9)


@pytest.fixture
def offloaded(target: tuple[ObjectStore, list], history: History) -> MetadataStore:
    return offload(ScopedStore(target[0]), history, switch_at=40)


def verify(capsys: pytest.CaptureFixture[str], flags: list, *extra: str) -> tuple[int, dict[str, Any]]:
    code = main(["verify", *flags, "--json", *extra])
    out, _ = capsys.readouterr()
    return code, json.loads(out)


def only_problem(doc: dict[str, Any]) -> dict[str, Any]:
    assert not doc["ok"]
    assert len(doc["problems"]) == 1, doc["problems"]
    return doc["problems"][0]


def test_a_clean_store_passes(
    capsys: pytest.CaptureFixture[str], target: tuple, history: History, offloaded: MetadataStore
) -> None:
    code, doc = verify(capsys, target[1], "--crc")
    assert code == 0 and doc["ok"] and doc["problems"] == []
    totals = doc["totals"]
    assert totals["entries"] == len(history.entries) == totals["crc_checked"]
    assert totals["messages"] == sum(len(m) for m in history.messages.values())
    assert totals["v1_segments"] > 0 and totals["v2_segments"] > 0
    assert totals["segments"] == len(offloaded.offloaded_segments(TOPIC))
    # The text summary says the same.
    assert main(["verify", *target[1], TOPIC]) == 0
    out = capsys.readouterr().out
    assert f"{TOPIC}: {totals['segments']} offloaded segments (v1/v2)" in out and out.rstrip().endswith(": OK")


def test_flipped_byte_in_a_block_header(
    capsys: pytest.CaptureFixture[str], target: tuple, offloaded: MetadataStore
) -> None:
    store, flags = target
    seg = offloaded.offloaded_segments(TOPIC)[0]
    block = OffloadIndex.decode(store.get(seg.indexKey)).blocks()[1]
    flip_byte(store, seg.dataKey, block.offset + 1)  # the block magic
    code, doc = verify(capsys, flags)
    problem = only_problem(doc)
    assert code == 1
    assert (problem["object"], problem["offset"], problem["error"]) == (seg.dataKey, block.offset, "BadMagicError")
    # The text output names them too.
    assert main(["verify", *flags]) == 1
    assert f"PROBLEM {seg.dataKey} @{block.offset}: BadMagicError" in capsys.readouterr().out


def test_flipped_byte_in_an_entry_header(
    capsys: pytest.CaptureFixture[str], target: tuple, offloaded: MetadataStore
) -> None:
    store, flags = target
    seg = offloaded.offloaded_segments(TOPIC)[-1]
    entry_at = BLOCK_HEADER_LENGTH  # first entry header of the first block
    flip_byte(store, seg.dataKey, entry_at)  # the top byte of its length
    code, doc = verify(capsys, flags)
    problem = only_problem(doc)
    assert code == 1 and (problem["object"], problem["offset"]) == (seg.dataKey, entry_at)
    assert problem["error"] == "LengthMismatchError"


def test_flipped_payload_byte_needs_crc(
    capsys: pytest.CaptureFixture[str], target: tuple, offloaded: MetadataStore
) -> None:
    store, flags = target
    seg = offloaded.offloaded_segments(TOPIC)[1]
    data = store.get(seg.dataKey)
    # The last byte of the first entry's message payload: framing and metadata stay valid.
    length = int.from_bytes(data[BLOCK_HEADER_LENGTH : BLOCK_HEADER_LENGTH + 4], "big")
    start = BLOCK_HEADER_LENGTH + ENTRY_HEADER_LENGTH
    decoded = decode_entry(data[start : start + length])
    assert len(decoded.payload) > 0
    flip_byte(store, seg.dataKey, start + length - 1)
    code, doc = verify(capsys, flags)
    assert code == 0 and doc["ok"]
    code, doc = verify(capsys, flags, "--crc")
    problem = only_problem(doc)
    assert code == 1 and problem["error"] == "ChecksumError"
    assert (problem["object"], problem["offset"]) == (seg.dataKey, start + 2)  # where the stored CRC is


def test_missing_index_and_truncated_data(
    capsys: pytest.CaptureFixture[str], target: tuple, offloaded: MetadataStore
) -> None:
    store, flags = target
    first, second = offloaded.offloaded_segments(TOPIC)[:2]
    store.delete(first.indexKey)
    truncate(store, second.dataKey, second.dataLength - 5)
    code, doc = verify(capsys, flags)
    assert code == 1
    # Exactly these two problems, each naming its object and (for the cut one) the offset where it ends.
    assert doc["problems"] == [
        {
            "object": first.indexKey,
            "offset": None,
            "error": "MissingObject",
            "message": "index object does not exist",
            "topic": TOPIC,
            "segment": str(mf.manifest_uuid(first)),
        },
        {
            "object": second.dataKey,
            "offset": second.dataLength - 5,
            "error": "IndexMismatchError",
            "message": f"index says the data object is {second.dataLength} bytes, but it is {second.dataLength - 5}",
            "topic": TOPIC,
            "segment": str(mf.manifest_uuid(second)),
        },
    ]


def test_index_that_disagrees_with_its_data(
    capsys: pytest.CaptureFixture[str], target: tuple, offloaded: MetadataStore
) -> None:
    store, flags = target
    seg = next(s for s in offloaded.offloaded_segments(TOPIC) if s.formatVersion == 1)
    index = OffloadIndex.decode(store.get(seg.indexKey), ledger_id=seg.startLedgerId)
    raw = bytearray(store.get(seg.indexKey))
    # The first entry id of the second index entry (20-byte entries after the 32-byte header and metadata).
    at = 32 + len(index.ledgers[0].metadata) + 20 + 7
    raw[at] ^= 0x01
    store.put(seg.indexKey, bytes(raw), dict(store.head(seg.indexKey).metadata))
    code, doc = verify(capsys, flags)
    assert code == 1
    by_error = {p["error"]: p for p in doc["problems"]}
    assert sorted(by_error) == ["ChecksumError", "IndexMismatchError"], doc["problems"]
    # The CRC its manifest recorded says the index is damaged; checking it against the data says where.
    assert (by_error["ChecksumError"]["object"], by_error["ChecksumError"]["offset"]) == (seg.indexKey, 0)
    problem = by_error["IndexMismatchError"]
    assert problem["object"] == seg.dataKey and problem["offset"] == index.blocks()[1].offset


def test_manifest_that_disagrees_with_its_objects(
    capsys: pytest.CaptureFixture[str], target: tuple, offloaded: MetadataStore
) -> None:
    _, flags = target
    seg = offloaded.offloaded_segments(TOPIC)[-1]  # the last: moving its end overlaps no other segment
    seg.endEntryId += 1
    seg.entries += 1
    offloaded.put_manifest(seg)
    code, doc = verify(capsys, flags)
    assert code == 1
    messages = [p["message"] for p in doc["problems"]]
    assert all(p["error"] == "ManifestMismatch" and p["object"] == seg.dataKey for p in doc["problems"])
    assert any("manifest ends at" in m for m in messages) and any("entries" in m for m in messages)
    assert all(offloaded.manifest_key(seg) in m for m in messages)


def test_objects_by_key_without_metadata(
    capsys: pytest.CaptureFixture[str], target: tuple, offloaded: MetadataStore
) -> None:
    store, flags = target
    seg = next(s for s in offloaded.offloaded_segments(TOPIC) if s.formatVersion == 1)
    code, doc = verify(capsys, flags, "--data-key", seg.dataKey, "--crc")
    assert code == 0 and doc["totals"]["segments"] == 1 and doc["segments"][0]["format"] == "v1"
    assert doc["segments"][0]["first"] == [seg.startLedgerId, seg.startEntryId]
    flip_byte(store, seg.dataKey, 3)
    code, doc = verify(capsys, flags, "--data-key", seg.dataKey)
    problem = only_problem(doc)
    assert code == 1 and (problem["object"], problem["offset"]) == (seg.dataKey, 0)


def test_unknown_topic_is_one_error_line(
    capsys: pytest.CaptureFixture[str], target: tuple, offloaded: MetadataStore
) -> None:
    """A name the store holds nothing of is a typo, said in one line naming what the store holds."""
    code = main(["verify", *target[1], "--json", "persistent://public/default/nothing-here"])
    out, err = capsys.readouterr()
    assert code == 1 and out == "" and err.count("\n") == 1
    assert err.startswith(
        "streamoffload verify: error: no offloaded data for topic persistent://public/default/nothing"
    )
    assert "topics with offloaded data: persistent://" in err
