"""Entry checksums recorded at offload (issue 23): what the sink writes, what readers do with segments sealed
before records existed, and what retention and cleanup do with the records.

Plain Python: real filesystem stores filled by the segmenter and sink, the CLI run in-process."""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path
from typing import Any

import pytest

from streamoffload.checkpoints import manifest as mf
from streamoffload.checkpoints.metadata_store import MetadataStore
from streamoffload.checkpoints.policy import OffloadPolicy
from streamoffload.cli import main
from streamoffload.codecs.checksums import BlockChecksums
from streamoffload.codecs.entry import crc32c
from streamoffload.codecs.errors import ChecksumError
from streamoffload.codecs.index import OffloadIndex
from streamoffload.codecs.proto.offload_manifest_pb2 import SegmentManifest
from streamoffload.read import dataset_plan as ofp
from streamoffload.read import dataset_read as ofr
from streamoffload.storage import keys
from streamoffload.storage.filesystem import FilesystemStore
from streamoffload.storage.location import ScopedStore
from streamoffload.streaming.segmenter.segmenter import run_segmenter
from streamoffload.streaming.segmenter.segmenter_model import CONTROL_SEAL, MemoryState, TopicState
from tests.fixtures.entries import holding, memory_sink, metas
from tests.read import BLOCK_SIZE, TOPIC, History, flip_byte, offload, pulsar_entries

MIB = 1024 * 1024


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def records_of(store: FilesystemStore, seg: SegmentManifest) -> list[str]:
    return sorted(i.key for i in store.list(keys.block_checksums_prefix(seg.dataKey)))


def as_written_before_checksums(store: FilesystemStore, meta: MetadataStore, seg: SegmentManifest) -> None:
    """Make ``seg`` what a version before issue 23 left in the store: no block checksum records, and a
    manifest (and commit) without the properties that name them and the index's CRC."""
    for key in records_of(store, seg):
        store.delete(key)
    old = SegmentManifest()
    old.CopyFrom(seg)
    props = [(p.key, p.value) for p in old.driverMetadata.properties]
    del old.driverMetadata.properties[:]
    for key, value in props:
        if key not in (mf.PROP_BLOCK_CHECKSUMS, mf.PROP_INDEX_CRC):
            old.driverMetadata.properties.add(key=key, value=value)
    meta.put_manifest(old)
    store.put(keys.commit_key(meta.prefix, old.topic, old.ordinal), mf.encode_manifest(old))


def test_the_sink_records_every_block_before_the_manifest(tmp_path: Path) -> None:
    store = FilesystemStore(tmp_path, fsync=False)
    history = pulsar_entries({3: 30, 4: 25, 8: 20}, seed=5, checksummed=False)
    meta = offload(ScopedStore(store), history, switch_at=40)
    crcs = {(e.ledger_id, e.entry_id): crc32c(e.payload) for e in history.entries}
    seen = 0
    for seg in meta.offloaded_segments(TOPIC):
        assert mf.checksum_blocks(seg) == seg.blockCount > 0
        index_bytes = store.get(seg.indexKey)
        assert mf.driver_property(seg, mf.PROP_INDEX_CRC) == f"{crc32c(index_bytes):08x}"
        ledger = seg.startLedgerId if seg.formatVersion == 1 else None
        blocks = OffloadIndex.decode(index_bytes, ledger_id=ledger).blocks()
        want = sorted(keys.block_checksums_key(seg.dataKey, n + 1) for n in range(len(blocks)))
        assert records_of(store, seg) == want
        for n, loc in enumerate(blocks, start=1):
            record = BlockChecksums.decode(store.get(keys.block_checksums_key(seg.dataKey, n)))
            assert (record.offset, record.ledger_id, record.first_entry_id) == (
                loc.offset,
                loc.ledger_id,
                loc.first_entry_id,
            )
            ids = range(record.first_entry_id, record.last_entry_id + 1)
            assert record.entry_ids is None and list(record.crcs) == [crcs[(loc.ledger_id, i)] for i in ids]
            seen += record.count
    assert seen == len(history.entries)


def test_a_replayed_batch_rewrites_the_same_records(tmp_path: Path) -> None:
    """Deterministic names and bytes: applying a micro-batch's actions twice (a retried Spark task) leaves
    the store exactly as once."""
    history = pulsar_entries({3: 40}, seed=6, checksummed=False)
    policy = OffloadPolicy(managedLedgerOffloadMaxBlockSizeInBytes=BLOCK_SIZE, offloadBufferMaxBytes=64 * MIB)
    stores = []
    for replays in (1, 2):
        store = FilesystemStore(tmp_path / f"r{replays}", fsync=False)
        sink = memory_sink(ScopedStore(store), holding(TOPIC, history.entries))
        state = MemoryState()
        for chunk, controls in ((metas(history.entries[:25]), []), (metas(history.entries[25:]), [CONTROL_SEAL])):
            saved = state.state, list(state.block), list(state.held)
            for _ in range(replays):  # a retry starts from the state the batch started from
                state.state, state.block, state.held = saved[0], list(saved[1]), list(saved[2])
                actions = run_segmenter(TOPIC, policy, state, chunk, controls, now_ms=1_000, min_part_size=1)
                sink.apply(actions)
        stores.append(store)
    listing = [sorted((i.key, s.get(i.key)) for i in s.list("") if "-crc-" in i.key) for s in stores]
    assert listing[0] == listing[1] and listing[0]


def test_a_segment_opened_before_the_upgrade_is_sealed_without_records(tmp_path: Path) -> None:
    """State written by a version that recorded nothing (no ``checksums`` in its open segment): the segment
    is finished as it began, its manifest says no records, and it reads back."""
    store = FilesystemStore(tmp_path, fsync=False)
    history = pulsar_entries({3: 30}, seed=8, checksummed=False)
    policy = OffloadPolicy(managedLedgerOffloadMaxBlockSizeInBytes=BLOCK_SIZE, offloadBufferMaxBytes=64 * MIB)
    sink = memory_sink(ScopedStore(store), holding(TOPIC, history.entries))
    state = MemoryState()
    actions = run_segmenter(TOPIC, policy, state, metas(history.entries[:10]), now_ms=1_000, min_part_size=1)
    sink.apply(actions)
    # What the older version saved: the same state without the field (and the records it never wrote).
    doc = json.loads(TopicState.from_json(state.state or "").to_json())
    del doc["open"]["checksums"]
    state.state = json.dumps(doc)
    for info in list(store.list("")):
        if "-crc-" in info.key:
            store.delete(info.key)
    actions = run_segmenter(
        TOPIC, policy, state, metas(history.entries[10:]), [CONTROL_SEAL], now_ms=2_000, min_part_size=1
    )
    sink.apply(actions)
    [seg] = MetadataStore(ScopedStore(store)).offloaded_segments(TOPIC)
    assert mf.checksum_blocks(seg) == 0 and records_of(store, seg) == []
    assert mf.driver_property(seg, mf.PROP_INDEX_CRC) is not None  # the index is covered all the same
    rows = [
        r for t in ofp.plan(ScopedStore(store), [TOPIC], {}) for b in ofr.read_task(ScopedStore(store), t) for r in [b]
    ]
    assert sum(len(b[0]) for b in rows) == sum(len(history.messages[p]) for p in history.positions())


@pytest.fixture
def mixed(tmp_path: Path) -> tuple[Path, FilesystemStore, MetadataStore, History, list[SegmentManifest]]:
    """A store whose first two segments were sealed before issue 23 (entries with their 0x0e01 section, as a
    real broker keeps it), the rest after."""
    root = tmp_path / "store"
    store = FilesystemStore(root, fsync=False)
    history = pulsar_entries({3: 30, 4: 25, 8: 20}, seed=9)
    meta = offload(ScopedStore(store), history, switch_at=40)
    old = meta.offloaded_segments(TOPIC)[:2]
    for seg in old:
        as_written_before_checksums(store, meta, seg)
    return root, store, meta, history, old


def test_segments_sealed_before_are_read_and_verify_says_they_have_no_records(
    capsys: pytest.CaptureFixture[str], mixed: tuple[Path, FilesystemStore, MetadataStore, History, Any]
) -> None:
    root, _store, meta, history, old = mixed
    flags = ["--store", str(root)]
    code, out, _ = run(capsys, "read", *flags, TOPIC)
    assert code == 0
    assert [json.loads(line) for line in out.splitlines()] == [
        {"ledger_id": e.ledger_id, "entry_id": e.entry_id, "payload": base64.b64encode(e.payload).decode()}
        for e in history.entries
    ]
    code, out, _ = run(capsys, "read", *flags, TOPIC, "--messages")
    assert code == 0 and len(out.splitlines()) == sum(len(m) for m in history.messages.values())

    code, out, _ = run(capsys, "verify", *flags, "--crc", "--json")
    doc = json.loads(out)
    assert code == 0 and doc["ok"], doc["problems"]
    recorded = {s["data_key"]: s["recorded_checksums"] for s in doc["segments"]}
    assert recorded == {s.dataKey: s.dataKey not in {o.dataKey for o in old} for s in meta.offloaded_segments(TOPIC)}
    assert doc["totals"]["segments_without_recorded_checksums"] == 2
    # Their entries carry Pulsar's own CRC, which is checked: every entry is still CRC-checked here.
    assert doc["totals"]["crc_checked"] == len(history.entries)

    code, out, _ = run(capsys, "verify", *flags, "--crc")
    assert code == 0
    notes = [line for line in out.splitlines() if line.startswith("NOTE ")]
    assert notes == [
        f"NOTE {seg.dataKey}: no recorded checksums (sealed by an older version): its entries are CRC-checked "
        "only where they carry their own 0x0e01 section"
        for seg in old
    ]


def test_a_flip_in_a_segment_sealed_before_is_caught_by_the_entry_s_own_crc(
    capsys: pytest.CaptureFixture[str], mixed: tuple[Path, FilesystemStore, MetadataStore, History, Any]
) -> None:
    root, store, _meta, _history, old = mixed
    flip_byte(store, old[0].dataKey, 128 + 12 + 40)  # inside the first entry of its first block
    code, _, err = run(capsys, "read", "--store", str(root), TOPIC)
    assert code == 1 and old[0].dataKey in err and "checksum mismatch" in err


def test_a_missing_record_is_an_error_naming_it(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """The manifest says every block has a record: deleting one must not turn the check off."""
    store = FilesystemStore(tmp_path, fsync=False)
    meta = offload(ScopedStore(store), pulsar_entries({3: 30}, seed=3, checksummed=False))
    seg = meta.offloaded_segments(TOPIC)[0]
    gone = keys.block_checksums_key(seg.dataKey, 2)
    store.delete(gone)
    code, _, err = run(capsys, "read", "--store", str(tmp_path), TOPIC)
    assert code == 1 and gone in err and "missing" in err
    code, out, _ = run(capsys, "verify", "--store", str(tmp_path), "--crc", "--json")
    problems = json.loads(out)["problems"]
    assert code == 1 and [p["object"] for p in problems] == [gone]


def test_a_record_of_another_block_is_refused(tmp_path: Path) -> None:
    store = FilesystemStore(tmp_path, fsync=False)
    meta = offload(ScopedStore(store), pulsar_entries({3: 30}, seed=3, checksummed=False))
    seg = meta.offloaded_segments(TOPIC)[0]
    first, second = (keys.block_checksums_key(seg.dataKey, n) for n in (1, 2))
    store.put(second, store.get(first))
    with pytest.raises(ChecksumError) as err:
        for task in ofp.plan(ScopedStore(store), [TOPIC], {}):
            for _ in ofr.read_task(ScopedStore(store), task):
                pass
    assert err.value.where == second


def test_retention_and_cleanup_delete_records_with_their_segment(tmp_path: Path) -> None:
    store = FilesystemStore(tmp_path, fsync=False)
    history = pulsar_entries({3: 30, 4: 25, 8: 20}, seed=4, checksummed=False)
    meta = offload(ScopedStore(store), history, switch_at=40)
    segments = meta.offloaded_segments(TOPIC)
    doomed, kept = segments[0], segments[1:]
    # cleanup leaves every live segment's records alone, however old they are
    later = int(time.time() * 1000) + 1000
    report = meta.cleanup(TOPIC, grace_ms=0, at_ms=later)
    assert report.orphan_objects == []
    assert all(records_of(store, s) for s in segments)
    # an orphan record (an abandoned attempt's) goes
    stray = keys.block_checksums_key(keys.data_key("", TOPIC, "00000000-0000-0000-0000-000000000001"), 1)
    store.put(stray, b"x")
    assert meta.cleanup(TOPIC, grace_ms=0, at_ms=later + 1000).orphan_objects == [stray]
    # deleting a segment deletes its records (named by its manifest, no listing)
    meta.delete_segment(doomed)
    assert records_of(store, doomed) == []
    assert all(len(records_of(store, s)) == s.blockCount for s in kept)
