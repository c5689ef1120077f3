"""verify: flip random bits in the data, index and manifest objects of a real store, one at a time.

Every flip is either harmless (padding, or bytes no reader uses) and ``read`` returns exactly the original
entries, or ``verify --crc`` reports it, naming the damaged segment's object (and the byte offset where one
applies); and ``read`` never returns wrong bytes: it prints exactly the original entries or fails with an
error (exit 1). Plain Python: a filesystem store filled by the segmenter and sink, the CLI run in-process.
"""

from __future__ import annotations

import base64
import json
import random
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from streamoffload.cli import main
from streamoffload.codecs.blocks import BLOCK_HEADER_LENGTH, ENTRY_HEADER_LENGTH, iter_blocks
from streamoffload.errors import StreamOffloadError
from streamoffload.read import dataset_plan as ofp
from streamoffload.read import dataset_read as ofr
from streamoffload.storage import keys
from streamoffload.storage.filesystem import FilesystemStore
from streamoffload.storage.location import ScopedStore
from tests.read import TOPIC, offload, pulsar_entries

FLIPS = 200
SEED = 20240611


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _offloaded_store(
    capsys: pytest.CaptureFixture[str], root: Path, *, seed: int, checksummed: bool
) -> tuple[FilesystemStore, Any, Any, list[dict[str, Any]]]:
    """Three ledgers offloaded as v1 then v2 segments; the undamaged store reads back exactly and verifies
    clean. Returns the store, the history, its metadata store and the ``read`` lines expected."""
    store = FilesystemStore(root, fsync=False)
    history = pulsar_entries({3: 30, 4: 25, 8: 20}, seed=seed, checksummed=checksummed)
    meta = offload(ScopedStore(store), history, switch_at=40)
    expected = [
        {"ledger_id": e.ledger_id, "entry_id": e.entry_id, "payload": base64.b64encode(e.payload).decode()}
        for e in history.entries
    ]
    code, out, _ = run_cli(capsys, "read", "--store", str(root), TOPIC)
    assert code == 0 and [json.loads(line) for line in out.splitlines()] == expected
    code, out, _ = run_cli(capsys, "verify", "--store", str(root), "--crc", "--json")
    assert code == 0, out
    return store, history, meta, expected


def test_random_bit_flips_are_harmless_or_reported_and_never_read_back(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    root = tmp_path / "store"
    store, _history, meta, expected = _offloaded_store(capsys, root, seed=9, checksummed=True)
    flags = ["--store", str(root)]

    segments = meta.offloaded_segments(TOPIC)
    assert {s.formatVersion for s in segments} == {1, 2}
    targets: list[tuple[str, str, frozenset[str]]] = []  # (kind, key, the keys of its segment)
    for seg in segments:
        own = frozenset((seg.dataKey, seg.indexKey, meta.manifest_key(seg)))
        targets += [("data", seg.dataKey, own), ("index", seg.indexKey, own), ("manifest", meta.manifest_key(seg), own)]

    rnd = random.Random(SEED)
    outcomes: Counter[tuple[str, str]] = Counter()
    for flip in range(FLIPS):
        kind, key, own = rnd.choice(targets)
        original = store.get(key)
        metadata = dict(store.head(key).metadata)
        bit = rnd.randrange(len(original) * 8)
        damaged = bytearray(original)
        damaged[bit // 8] ^= 1 << (bit % 8)
        store.put(key, bytes(damaged), metadata)
        what = f"flip {flip}: {kind} object {key}, byte {bit // 8} bit {bit % 8}"
        try:
            code, out, err = run_cli(capsys, "read", *flags, TOPIC)
            lines = [json.loads(line) for line in out.splitlines()]
            if code == 0:
                assert lines == expected, f"{what}: read returned wrong entries with exit 0"
            else:
                assert code == 1 and err.startswith("streamoffload read: error: "), f"{what}: {err}"
                assert len(err.strip().splitlines()) == 1, f"{what}: {err}"
                # What it printed before it stopped is the original, in order.
                assert lines == expected[: len(lines)], f"{what}: read printed wrong entries before failing"
            harmless = code == 0

            code, out, _ = run_cli(capsys, "verify", *flags, "--crc", "--json")
            doc: dict[str, Any] = json.loads(out)
            problems = doc["problems"]
            if harmless:
                outcomes[(kind, "harmless" if not problems else "harmless, reported")] += 1
                continue
            assert code == 1 and problems, f"{what}: read failed ({err.strip()}) but verify found nothing"
            named = [p for p in problems if p["object"] in own]
            assert named, f"{what}: verify did not name the damaged segment's objects: {problems}"
            assert any(p["offset"] is not None for p in named), f"{what}: no offset: {named}"
            if kind == "manifest":
                assert any(p["object"] == key and p["error"] == "CorruptManifest" for p in named), what
            outcomes[(kind, "reported")] += 1
        finally:
            store.put(key, original, metadata)

    # Every kind of object was hit and most flips were caught; the store is whole again.
    assert sum(outcomes.values()) == FLIPS
    for kind in ("data", "index", "manifest"):
        assert outcomes[(kind, "reported")] > 0, outcomes
    assert outcomes[("manifest", "harmless")] == 0, "every manifest flip fails its checksum"
    code, out, _ = run_cli(capsys, "verify", *flags, "--crc", "--json")
    assert code == 0, out


def _covered_ranges(store: FilesystemStore, seg: Any) -> list[tuple[int, int]]:
    """The byte ranges of a data object that hold block headers and entries (not block padding)."""
    ranges = []
    for block in iter_blocks(store.get(seg.dataKey)):
        ranges.append((block.offset, block.offset + BLOCK_HEADER_LENGTH))
        for e in block.entries:  # (offsets within the object)
            ranges.append((e.offset, e.offset + ENTRY_HEADER_LENGTH + len(e.payload)))
    return ranges


def _dataframe_read(store: FilesystemStore) -> list[dict[str, Any]]:
    """Every row the ``pulsar-offloaded`` reader gives for the topic (its plain core, without Spark)."""
    out: list[dict[str, Any]] = []
    for task in ofp.plan(ScopedStore(store), [TOPIC], {}):
        for batch in ofr.read_task(ScopedStore(store), task, output=ofr.OUTPUT_ENTRIES):
            out += ofr.rows(batch, ofr.ENTRY_COLUMNS)
    return out


def test_every_flip_in_checksum_less_entries_headers_or_index_is_caught(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Issue 23: entries without the optional 0x0e01 section (as pulsar-lite hands them out), so only the
    CRC-32C recorded at offload covers them. 200 random flips in entry bytes (headers and payloads), block
    headers, indexes, block checksum records and manifests: every one is refused by ``read``, ``read
    --messages``, the DataFrame reader and ``verify --crc``, naming the damaged segment's object and an
    offset. Block padding is left out here (no reader returns it; ``verify`` checks it, the test above)."""
    root = tmp_path / "store"
    store, history, meta, expected = _offloaded_store(capsys, root, seed=11, checksummed=False)
    assert all(e.payload[:2] != b"\x0e\x01" for e in history.entries)
    flags = ["--store", str(root)]
    code, out, _ = run_cli(capsys, "verify", *flags, "--crc", "--json")
    doc = json.loads(out)
    assert code == 0 and doc["totals"]["crc_checked"] == len(history.entries), out
    assert all(s["recorded_checksums"] for s in doc["segments"])
    assert len(_dataframe_read(store)) == len(history.entries)

    segments = meta.offloaded_segments(TOPIC)
    assert {s.formatVersion for s in segments} == {1, 2}
    # (kind, key, byte ranges that may be flipped, the keys of its segment)
    targets: list[tuple[str, str, list[tuple[int, int]], frozenset[str]]] = []
    for seg in segments:
        records = [keys.block_checksums_key(seg.dataKey, n) for n in range(1, seg.blockCount + 1)]
        own = frozenset((seg.dataKey, seg.indexKey, meta.manifest_key(seg), *records))
        whole = lambda key: [(0, store.head(key).size)]  # noqa: E731
        targets.append(("data", seg.dataKey, _covered_ranges(store, seg), own))
        targets.append(("index", seg.indexKey, whole(seg.indexKey), own))
        targets.append(("manifest", meta.manifest_key(seg), whole(meta.manifest_key(seg)), own))
        targets += [("record", key, whole(key), own) for key in records]

    rnd = random.Random(SEED + 23)
    caught: Counter[str] = Counter()
    for flip in range(FLIPS):
        # Data objects get half the flips: they hold most of the bytes.
        kind, key, ranges, own = rnd.choice([t for t in targets if t[0] == "data"]) if flip % 2 else rnd.choice(targets)
        start, end = rnd.choice(ranges)
        byte = rnd.randrange(start, end)
        bit = rnd.randrange(8)
        original = store.get(key)
        metadata = dict(store.head(key).metadata)
        damaged = bytearray(original)
        damaged[byte] ^= 1 << bit
        store.put(key, bytes(damaged), metadata)
        what = f"flip {flip}: {kind} object {key}, byte {byte} bit {bit}"
        try:
            for mode in ([], ["--messages"]):
                code, out, err = run_cli(capsys, "read", *flags, TOPIC, *mode)
                assert code == 1, f"{what}: read {mode} exited {code}"
                assert err.startswith("streamoffload read: error: ") and len(err.strip().splitlines()) == 1, err
                assert any(k in err for k in own) and re.search(r"offset \d+", err), f"{what}: {err}"
                if not mode:  # what it printed before it stopped is the original, in order
                    lines = [json.loads(line) for line in out.splitlines()]
                    assert lines == expected[: len(lines)], f"{what}: read printed wrong entries"
            with pytest.raises(StreamOffloadError) as refused:
                _dataframe_read(store)
            assert any(k in str(refused.value) for k in own), f"{what}: {refused.value}"
            if kind != "manifest":  # a manifest that does not decode names its key; there is no offset in it
                assert re.search(r"offset \d+", str(refused.value)), f"{what}: {refused.value}"

            code, out, _ = run_cli(capsys, "verify", *flags, "--crc", "--json")
            problems = json.loads(out)["problems"]
            assert code == 1 and problems, f"{what}: verify found nothing"
            named = [p for p in problems if p["object"] in own]
            assert named and any(p["offset"] is not None for p in named), f"{what}: {problems}"
            caught[kind] += 1
        finally:
            store.put(key, original, metadata)

    assert sum(caught.values()) == FLIPS, caught
    assert set(caught) == {"data", "index", "manifest", "record"}, caught
    code, out, _ = run_cli(capsys, "verify", *flags, "--crc", "--json")
    assert code == 0, out
