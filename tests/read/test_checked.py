"""Manifests checked end to end: verify reports corrupt manifests, gaps, stale and failed attempts, each naming
the key; a fully deleted topic is fine; read never returns bytes whose checksum fails; one corrupt manifest is
reported for its topic and skipped, not fatal for all (status, cleanup).

Plain Python: real filesystem stores filled by the segmenter and sink (``tests.read.offload``), the CLI run
in-process."""

from __future__ import annotations

import base64
import itertools
import json
import time
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from streamoffload.checkpoints import manifest as mf
from streamoffload.checkpoints.metadata_store import MetadataStore
from streamoffload.cli import main
from streamoffload.codecs.blocks import BLOCK_HEADER_LENGTH, ENTRY_HEADER_LENGTH
from streamoffload.codecs.errors import ChecksumError
from streamoffload.read.segment import ChunkCache
from streamoffload.read.topic_reader import TopicReader
from streamoffload.status import store_status
from streamoffload.storage import keys
from streamoffload.storage.filesystem import FilesystemStore
from streamoffload.storage.location import ScopedStore
from tests.fixtures.entries import Published
from tests.fixtures.readback import read_entries, read_messages
from tests.read import TOPIC, History, flip_byte, offload, pulsar_entries

OTHER = "persistent://public/default/other-partition-0"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "store"


@pytest.fixture
def store(root: Path) -> FilesystemStore:
    return FilesystemStore(root, fsync=False)


@pytest.fixture
def history() -> History:
    return pulsar_entries({3: 30, 4: 25, 8: 20}, seed=9)


@pytest.fixture
def meta(store: FilesystemStore, history: History) -> MetadataStore:
    offload(ScopedStore(store), history, switch_at=40)
    offload(ScopedStore(store), History(OTHER, history.entries, history.messages))
    return MetadataStore(ScopedStore(store))


def verify(capsys: pytest.CaptureFixture[str], root: Path, *extra: str) -> tuple[int, dict[str, Any]]:
    code = main(["verify", "--store", str(root), "--json", *extra])
    out, _ = capsys.readouterr()
    return code, json.loads(out)


def read(capsys: pytest.CaptureFixture[str], root: Path, *extra: str) -> tuple[int, list[dict[str, Any]], str]:
    code = main(["read", "--store", str(root), *extra])
    out, err = capsys.readouterr()
    return code, [json.loads(line) for line in out.splitlines()], err


def errors(doc: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for p in doc["problems"]:
        out.setdefault(p["error"], []).append(p)
    return out


def test_the_two_topic_store_is_clean(capsys: pytest.CaptureFixture[str], root: Path, meta: MetadataStore) -> None:
    code, doc = verify(capsys, root, "--crc")
    assert code == 0 and doc["ok"], doc["problems"]
    assert doc["totals"]["topics"] == 2


# --- a corrupt manifest: reported with its key, skipped, fatal for nothing else ----------------------------------


def test_a_corrupt_manifest_is_reported_and_skipped_not_fatal(
    capsys: pytest.CaptureFixture[str], root: Path, store: FilesystemStore, meta: MetadataStore, history: History
) -> None:
    segments = meta.offloaded_segments(TOPIC)
    bad = segments[1]
    key = meta.manifest_key(bad)
    flip_byte(store, key, len(store.get(key)) - 3)

    # verify: the key, the error, exit 1; the other topic is fine.
    code, doc = verify(capsys, root, "--crc")
    assert code == 1
    corrupt = errors(doc)["CorruptManifest"]
    assert [(p["object"], p["offset"]) for p in corrupt] == [(key, 4)]
    assert "checksum mismatch" in corrupt[0]["message"]
    # Its commit now names a segment no Offloaded manifest holds: the gap is reported too.
    assert [p["segment"] for p in errors(doc)["MissingSegment"]] == [str(mf.manifest_uuid(bad))]
    by_topic = {t["topic"]: t["ok"] for t in doc["topics"]}
    assert by_topic == {TOPIC: False, OTHER: True}

    # The metadata store skips it and says so.
    assert [mf.manifest_uuid(m) for m in meta.offloaded_segments(TOPIC)] == [
        mf.manifest_uuid(m) for m in segments if m is not bad
    ]
    [found] = meta.corrupt_manifests(TOPIC)
    assert (found.key, found.start, found.segment_id) == (key, mf.start_position(bad), str(mf.manifest_uuid(bad)))

    # read: refuses a range the segment may hold, naming the key; reads a range it cannot hold.
    code, lines, err = read(capsys, root, TOPIC)
    assert code == 1 and lines == []
    assert err.startswith("streamoffload read: error: ") and key in err and len(err.strip().splitlines()) == 1
    last = segments[-1]
    code, lines, _ = read(capsys, root, TOPIC, "--from", f"{last.startLedgerId}:{last.startEntryId}")
    assert code == 0 and lines == _lines(e for e in history.entries if e.position >= mf.start_position(last))
    assert len(lines) == last.entries
    first = segments[0]
    code, lines, _ = read(capsys, root, TOPIC, "--to", f"{first.endLedgerId}:{first.endEntryId}")
    assert code == 0 and lines == _lines(e for e in history.entries if e.position <= mf.end_position(first))
    assert len(lines) == first.entries
    assert read(capsys, root, OTHER)[1] == _lines(history.entries)

    # status: shown for its topic, the others unaffected.
    rows = {r.topic: r for r in store_status(meta)}
    assert len(rows[TOPIC].corrupt_manifests) == 1 and key in rows[TOPIC].corrupt_manifests[0]
    assert rows[OTHER].corrupt_manifests == [] and rows[OTHER].entries == len(history.entries)
    assert main(["status", "--store", str(root)]) == 0
    assert f"corrupt manifest (skipped): {key}" in capsys.readouterr().out

    # cleanup: goes on with every topic and leaves the corrupt segment's objects alone (not orphans).
    assert main(["cleanup", "--store", str(root), "--grace-minutes", "0"]) == 0
    assert "2 topic-partition(s)" in capsys.readouterr().out
    assert store.exists(bad.dataKey) and store.exists(bad.indexKey) and store.exists(key)


def _lines(entries: Iterable[Published]) -> list[dict[str, Any]]:
    """What ``read`` prints for these entries: position and bytes."""
    return [
        {"ledger_id": e.ledger_id, "entry_id": e.entry_id, "payload": base64.b64encode(e.payload).decode()}
        for e in entries
    ]


def test_an_unframed_manifest_is_corrupt(
    capsys: pytest.CaptureFixture[str], root: Path, store: FilesystemStore, meta: MetadataStore
) -> None:
    seg = meta.offloaded_segments(TOPIC)[0]
    key = meta.manifest_key(seg)
    store.put(key, seg.SerializeToString())  # the old, unchecked encoding
    code, doc = verify(capsys, root)
    assert code == 1 and (errors(doc)["CorruptManifest"][0]["object"], errors(doc)["CorruptManifest"][0]["offset"]) == (
        key,
        0,
    )


def test_an_empty_manifest_is_corrupt_not_assigned(
    capsys: pytest.CaptureFixture[str], root: Path, store: FilesystemStore, meta: MetadataStore
) -> None:
    seg = meta.offloaded_segments(TOPIC)[2]
    key = meta.manifest_key(seg)
    store.put(key, b"")
    code, doc = verify(capsys, root, "--crc")
    assert code == 1 and errors(doc)["CorruptManifest"][0]["object"] == key
    assert doc["topics"][0]["unfinished"] == {}  # not counted as an Assigned segment
    assert read(capsys, root, TOPIC)[0] == 1


# --- read never returns bytes whose checksum fails -----------------------------------------------------------------


def _payload_byte(store: FilesystemStore, seg: Any) -> tuple[int, int]:
    """(offset of the first entry's last byte, offset of its first byte) in the segment's data object: a
    mismatch against the CRC-32C recorded at offload names where the entry starts."""
    data = store.get(seg.dataKey)
    length = int.from_bytes(data[BLOCK_HEADER_LENGTH : BLOCK_HEADER_LENGTH + 4], "big")
    start = BLOCK_HEADER_LENGTH + ENTRY_HEADER_LENGTH
    return start + length - 1, start


@pytest.mark.parametrize("messages", [False, True], ids=["entries", "messages"])
def test_a_flipped_payload_bit_fails_the_read_in_both_modes(
    capsys: pytest.CaptureFixture[str], root: Path, store: FilesystemStore, meta: MetadataStore, messages: bool
) -> None:
    first, seg = meta.offloaded_segments(TOPIC)[:2]
    # What the reference reader (whole objects, its own decoding) finds in the first segment, before the damage.
    before = {(e.ledger_id, e.entry_id) for e in _entries(store, first)}
    if messages:
        want = [(m.ledger_id, m.entry_id, m.batch_index, m.payload) for m in read_messages(ScopedStore(store), TOPIC)]
    else:
        want = [(ledger, entry, -2, payload) for ledger, entry, payload in read_entries(ScopedStore(store), TOPIC)]
    want = [w for w in want if w[:2] in before]
    at, crc_at = _payload_byte(store, seg)
    data = bytearray(store.get(seg.dataKey))
    data[at] ^= 0x10
    store.put(seg.dataKey, bytes(data), dict(store.head(seg.dataKey).metadata))
    code, lines, err = read(capsys, root, TOPIC, *(["--messages"] if messages else []))
    assert code == 1
    assert seg.dataKey in err and f"(at byte offset {crc_at})" in err and "checksum mismatch" in err
    assert len(err.strip().splitlines()) == 1
    # Nothing from the damaged entry (the second segment's first) on was printed: exactly the first segment's
    # entries or messages, in order, with their bytes.
    got = [
        (line["ledger_id"], line["entry_id"], line.get("batch_index", -2), base64.b64decode(line["payload"]))
        for line in lines
    ]
    assert got == want
    assert len({w[:2] for w in want}) == first.entries, "every entry of the first segment"


def _entries(store: FilesystemStore, seg: Any) -> list[Any]:
    with TopicReader(ScopedStore(store), cache=ChunkCache()) as reader:
        return list(reader.open_segment(seg).read_range())


def test_single_entry_reads_check_the_checksum_too(store: FilesystemStore, meta: MetadataStore) -> None:
    seg = meta.offloaded_segments(TOPIC)[0]
    # local_files=False: a held descriptor would keep reading the object as it was before the rewrite.
    with TopicReader(ScopedStore(store), cache=ChunkCache(), local_files=False) as reader:
        list(reader.read(TOPIC))  # learn offsets: the next read of the entry is one exact GET
        at, crc_at = _payload_byte(store, seg)
        flip_byte(store, seg.dataKey, at)
        reader.cache.clear()
        with pytest.raises(ChecksumError) as err:
            reader.read_entry(TOPIC, (seg.startLedgerId, seg.startEntryId))
        assert (err.value.where, err.value.offset) == (seg.dataKey, crc_at)
    with TopicReader(ScopedStore(store), cache=ChunkCache()) as reader, pytest.raises(ChecksumError):
        reader.read_entry(TOPIC, (seg.startLedgerId, seg.startEntryId))  # walked to, not learned


# --- gaps, stale and failed attempts, deleted topics ---------------------------------------------------------------


def test_a_missing_middle_segment_is_a_gap(
    capsys: pytest.CaptureFixture[str], root: Path, store: FilesystemStore, meta: MetadataStore
) -> None:
    middle = meta.offloaded_segments(TOPIC)[1]
    store.delete(meta.manifest_key(middle))
    code, doc = verify(capsys, root)
    assert code == 1
    [missing] = errors(doc)["MissingSegment"]
    assert missing["object"] == keys.commit_key("", TOPIC, middle.ordinal)
    assert f"{middle.startLedgerId}:{middle.startEntryId}" in missing["message"]
    # Without its commit either, the place itself is missing from the history.
    store.delete(keys.commit_key("", TOPIC, middle.ordinal))
    code, doc = verify(capsys, root)
    assert code == 1 and [p["object"] for p in errors(doc)["GapInHistory"]] == [
        keys.commit_key("", TOPIC, middle.ordinal)
    ]


def test_segments_that_do_not_follow_within_a_ledger_are_a_gap(
    capsys: pytest.CaptureFixture[str], root: Path, store: FilesystemStore, meta: MetadataStore
) -> None:
    segments = meta.offloaded_segments(TOPIC)
    a, b = next((a, b) for a, b in itertools.pairwise(segments) if a.endLedgerId == b.startLedgerId)
    # b's commit and manifest say it starts two entries after a's end + 1 (as a segmenter that skipped
    # entries would have written them, its manifest named by that start): entries in no segment.
    held = mf.decode_manifest(store.get(meta.manifest_key(b)))
    held.startEntryId += 2
    store.put(keys.commit_key("", TOPIC, b.ordinal), mf.encode_manifest(held))
    store.delete(meta.manifest_key(b))
    meta.put_manifest(held)
    code, doc = verify(capsys, root)
    assert code == 1
    [gap] = errors(doc)["GapBetweenSegments"]
    assert gap["object"] == meta.manifest_key(held)
    assert f"entries {a.endEntryId + 1}..{a.endEntryId + 2} of ledger {a.endLedgerId}" in gap["message"]


def test_stale_and_failed_attempts(
    capsys: pytest.CaptureFixture[str], root: Path, store: FilesystemStore, meta: MetadataStore
) -> None:
    last = meta.offloaded_segments(TOPIC)[-1]
    now = int(time.time() * 1000)

    def attempt(ordinal: int, start: tuple[int, int], assigned_ms: int) -> mf.SegmentManifest:
        seg_id = uuid.uuid4()
        manifest = mf.new_manifest(
            topic=TOPIC,
            segment_id=seg_id,
            ordinal=ordinal,
            format_version=2,
            start=start,
            assigned_ms=assigned_ms,
            data_key=keys.data_key("", TOPIC, seg_id),
            index_key=keys.index_key("", TOPIC, seg_id),
        )
        meta.put_manifest(manifest)
        return manifest

    # An open segment after the last one, just assigned: work in progress, fine.
    fresh = attempt(last.ordinal + 1, (last.endLedgerId, last.endEntryId + 1), now)
    code, doc = verify(capsys, root)
    assert code == 0 and doc["topics"][0]["unfinished"] == {"Assigned": 1}
    # The same, two hours old: stale (and not with a longer --stale-minutes).
    store.delete(meta.manifest_key(fresh))
    old = attempt(last.ordinal + 1, (last.endLedgerId, last.endEntryId + 1), now - 2 * 3_600_000)
    code, doc = verify(capsys, root)
    assert code == 1 and [p["object"] for p in errors(doc)["StaleSegment"]] == [meta.manifest_key(old)]
    assert "open for 120 minutes" in errors(doc)["StaleSegment"][0]["message"]
    assert verify(capsys, root, "--stale-minutes", "180")[0] == 0
    store.delete(meta.manifest_key(old))
    # An attempt at a place already committed (a replay, a fenced writer): superseded.
    superseded = attempt(last.ordinal, (last.startLedgerId, last.startEntryId), now)
    code, doc = verify(capsys, root)
    assert code == 1 and [p["object"] for p in errors(doc)["StaleSegment"]] == [meta.manifest_key(superseded)]
    assert "superseded" in errors(doc)["StaleSegment"][0]["message"]
    store.delete(meta.manifest_key(superseded))
    # A failed attempt: always a problem.
    failed = attempt(last.ordinal + 1, (last.endLedgerId, last.endEntryId + 1), now)
    meta.record_failure(TOPIC, str(mf.manifest_uuid(failed)), "upload refused: 403")
    code, doc = verify(capsys, root)
    assert code == 1 and [p["object"] for p in errors(doc)["FailedSegment"]] == [meta.manifest_key(failed)]
    assert doc["topics"][0]["unfinished"] == {"Failed": 1}


def test_a_store_holding_only_failed_segments_is_not_ok(
    capsys: pytest.CaptureFixture[str], root: Path, store: FilesystemStore
) -> None:
    meta = MetadataStore(ScopedStore(store))
    seg_id = uuid.uuid4()
    manifest = mf.new_manifest(
        topic=TOPIC,
        segment_id=seg_id,
        ordinal=0,
        format_version=2,
        start=(3, 0),
        assigned_ms=int(time.time() * 1000),
        data_key=keys.data_key("", TOPIC, seg_id),
        index_key=keys.index_key("", TOPIC, seg_id),
    )
    meta.open_attempt(manifest)
    meta.record_failure(TOPIC, str(seg_id), "boom")
    code, doc = verify(capsys, root, "--crc")
    assert code == 1 and not doc["ok"]
    assert [p["error"] for p in doc["problems"]] == ["FailedSegment"] and "boom" not in doc["problems"][0]["object"]
    assert main(["verify", "--store", str(root), "--crc"]) == 1
    assert capsys.readouterr().out.rstrip().endswith("1 PROBLEM(S)")


def test_a_fully_deleted_topic_is_fine(
    capsys: pytest.CaptureFixture[str], root: Path, store: FilesystemStore, meta: MetadataStore
) -> None:
    ledgers = sorted({info.ledgerId for m in meta.offloaded_segments(TOPIC) for info in m.ledgers})
    for ledger in ledgers:
        meta.mark_ledger_deleted(TOPIC, ledger, "test", at_ms=0)
    assert meta.apply_deletions(TOPIC, 0)
    assert meta.offloaded_segments(TOPIC) == []
    code, doc = verify(capsys, root, TOPIC)
    assert code == 0 and doc["ok"], doc["problems"]
    # A topic the store never held is still an error.
    assert main(["verify", "--store", str(root), "persistent://public/default/nothing-here"]) == 1
    assert "no offloaded data for topic persistent://public/default/nothing-here" in capsys.readouterr().err


def test_retention_from_the_front_is_not_a_gap(
    capsys: pytest.CaptureFixture[str], root: Path, store: FilesystemStore, meta: MetadataStore
) -> None:
    for ledger in (3, 4):
        meta.mark_ledger_deleted(TOPIC, ledger, "test", at_ms=0)
    deleted = meta.apply_deletions(TOPIC, 0)
    assert deleted and meta.offloaded_segments(TOPIC)
    assert verify(capsys, root, TOPIC)[0] == 0
    # Even with their deletion records and commits gone (compacted), the history starts later: fine.
    for seg in deleted:
        store.delete(meta.deleted_segment_key(seg))
        store.delete(keys.commit_key("", TOPIC, seg.ordinal))
    code, doc = verify(capsys, root, TOPIC)
    assert code == 0 and doc["ok"], doc["problems"]


@pytest.mark.parametrize("data", [b'{"segment": "x"}', b""], ids=["json-without-positions", "empty"])
def test_a_corrupt_deletion_record_is_reported_with_its_key(
    capsys: pytest.CaptureFixture[str], root: Path, store: FilesystemStore, meta: MetadataStore, data: bytes
) -> None:
    for ledger in (3, 4):
        meta.mark_ledger_deleted(TOPIC, ledger, "test", at_ms=0)
    deleted = meta.apply_deletions(TOPIC, 0)
    assert deleted
    key = meta.deleted_segment_key(deleted[0])
    store.put(key, data)
    code, doc = verify(capsys, root, TOPIC)
    assert code == 1
    corrupt = errors(doc)["CorruptDeletionRecord"]
    assert [p["object"] for p in corrupt] == [key]
    assert "not a deleted-segment record" in corrupt[0]["message"]
