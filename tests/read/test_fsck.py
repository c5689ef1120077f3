"""fsck: flip random bits in the data, index and manifest objects of a real store, one at a time.

Every flip is either harmless (padding, or bytes no reader uses) and ``read`` returns exactly the original
entries, or ``verify --crc`` reports it, naming the damaged segment's object (and the byte offset where one
applies); and ``read`` never returns wrong bytes: it prints exactly the original entries or fails with an
error (exit 1). Plain Python: a filesystem store filled by the segmenter and sink, the CLI run in-process.
"""

from __future__ import annotations

import base64
import json
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from streamoffload.cli import main
from streamoffload.storage.filesystem import FilesystemStore
from tests.read import TOPIC, offload, pulsar_entries

FLIPS = 200
SEED = 20240611


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_random_bit_flips_are_harmless_or_reported_and_never_read_back(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    root = tmp_path / "store"
    store = FilesystemStore(root, fsync=False)
    history = pulsar_entries({3: 30, 4: 25, 8: 20}, seed=9)
    meta = offload(store, history, switch_at=40)
    flags = ["--store", str(root)]
    expected = [
        {"ledger_id": e.ledger_id, "entry_id": e.entry_id, "payload": base64.b64encode(e.payload).decode()}
        for e in history.entries
    ]

    # The undamaged store reads back exactly and verifies clean.
    code, out, _ = run_cli(capsys, "read", *flags, TOPIC)
    assert code == 0 and [json.loads(line) for line in out.splitlines()] == expected
    code, out, _ = run_cli(capsys, "verify", *flags, "--crc", "--json")
    assert code == 0, out

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
