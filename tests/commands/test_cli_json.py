"""``--json`` of cleanup, offload-now and delete-ledger round-trips (one document, the keys README documents), and
``cleanup --dry-run`` removes nothing and lists exactly what the real run then removes."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any

import pytest

from streamoffload.checkpoints import manifest as mf
from streamoffload.checkpoints.control_requests import pending_requests
from streamoffload.checkpoints.metadata_store import MetadataStore
from streamoffload.checkpoints.policy import OffloadPolicy
from streamoffload.checkpoints.retention import apply_retention
from streamoffload.cli import main
from streamoffload.storage.filesystem import FilesystemStore
from streamoffload.storage.location import ScopedStore
from tests.storage.test_leaks_and_modes import OLD, TOPIC, sealed


def leaky_store(root: Path) -> tuple[MetadataStore, str, Path]:
    """Five committed segments of TOPIC, four deleted by retention, a failure note of a gone attempt, an orphan
    object and a stale temporary file: (metadata store, the gone attempt's id, the orphan's path)."""
    store = FilesystemStore(root, fsync=False)
    meta = MetadataStore(ScopedStore(store))
    for ordinal in range(5):
        manifest = sealed(ordinal)
        store.put(manifest.dataKey, b"d")
        store.put(manifest.indexKey, b"i")
        meta.commit(manifest)
    gone_attempt = str(uuid.uuid4())
    meta.record_failure(TOPIC, gone_attempt, "OSError: no space left")
    apply_retention(meta, TOPIC, OffloadPolicy(retentionSizeInMB=1, managedLedgerOffloadDeletionLagMs=0), at_ms=10**7)
    orphan = root / "tenant" / "ns" / "leaky-partition-0" / f"{uuid.uuid4()}"
    orphan.write_bytes(b"nobody names me")
    stale = root / "tenant" / "ns" / ".x.tmp-99"
    stale.write_bytes(b"half a write")
    notes = root / "tenant" / "ns" / "leaky-partition-0" / "_meta" / "failures"
    for path in (orphan, stale, *notes.iterdir()):
        os.utime(path, (OLD, OLD))
    return meta, gone_attempt, orphan


def tree(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` and its bytes (locks aside: a lease file is the guard's)."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    assert main(list(argv)) == 0
    out = capsys.readouterr().out
    doc = json.loads(out)  # one document, nothing else on stdout
    assert isinstance(doc, dict)
    return doc


def test_cleanup_dry_run_removes_nothing_and_lists_what_the_real_run_removes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "store"
    meta, gone_attempt, orphan = leaky_store(root)
    before = tree(root)

    planned = run_json(capsys, "cleanup", "--store", str(root), "--grace-minutes", "1", "--dry-run", "--json")
    assert tree(root) == before  # not a byte written or deleted
    removed = planned["topics"][0]["removed"]
    assert planned["dry_run"] is True and planned["stale_temporaries"] == 0
    assert planned["topics"][0]["topic"] == TOPIC
    assert removed["orphan_objects"] == [str(orphan.relative_to(root))]
    assert removed["removed_failure_notes"] == [gone_attempt]
    assert sorted(removed["removed_commits"]) == [0, 1, 2, 3]  # the deleted segments' (the newest's stays)
    assert len(removed["folded_deleted_records"]) == 3
    assert planned["total"] == 1 + 1 + 4 + 3

    done = run_json(capsys, "cleanup", "--store", str(root), "--grace-minutes", "1", "--json")
    assert done["dry_run"] is False
    assert done["topics"] == planned["topics"]  # the same plan, item for item
    assert done["stale_temporaries"] == 1  # the filesystem sweep is the real run's only
    assert done["total"] == planned["total"] + 1
    assert not orphan.exists()
    assert meta.failures(TOPIC) == {}


def test_cleanup_dry_run_lines_say_would_remove(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "store"
    _, gone_attempt, orphan = leaky_store(root)
    assert main(["cleanup", "--store", str(root), "--grace-minutes", "1", "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert f"{TOPIC}: would remove orphan object {orphan.relative_to(root)}" in lines
    assert f"{TOPIC}: would remove failure note of a gone attempt {gone_attempt}" in lines
    assert lines[-1] == "cleanup --dry-run: 9 item(s) would remove from 1 topic-partition(s); nothing was removed"
    assert orphan.exists()


def test_offload_now_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "store"
    leaky_store(root)
    doc = run_json(capsys, "offload-now", "--store", str(root), TOPIC, "--json")
    scoped = ScopedStore(FilesystemStore(root, fsync=False))
    assert [r["topic"] for r in doc["requests"]] == [TOPIC]
    assert [r["request_id"] for r in doc["requests"]] == pending_requests(scoped)
    assert doc["follow"] == f"streamoffload offload-status --store {root} {TOPIC} --wait"


def test_delete_ledger_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "store"
    meta, _, _ = leaky_store(root)
    live = sealed(4)  # retention kept the newest segment, ledger 104
    lagged = run_json(capsys, "delete-ledger", "--store", str(root), TOPIC, "104", "--force", "--json")
    lag = lagged["deletion_lag_ms"]
    assert lag == 4 * 3_600_000  # the default deletion lag, 4 h: the segment waits for it
    assert lagged["ledgers"] == [{"ledger": 104, "newly_marked": True}] and lagged["deleted_segments"] == []
    doc = run_json(capsys, "delete-ledger", "--store", str(root), TOPIC, "104", "--now", "--force", "--json")
    assert doc == {
        "topic": TOPIC,
        "deletion_lag_ms": 0,
        "ledgers": [{"ledger": 104, "newly_marked": False}],
        "deleted_segments": [
            {"segment": str(mf.manifest_uuid(live)), "start": [104, 0], "end": [104, 4], "data_key": live.dataKey}
        ],
    }
    assert meta.offloaded_segments(TOPIC) == []
