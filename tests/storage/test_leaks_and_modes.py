"""The filesystem store creates private files (configurable), and ``streamoffload cleanup`` removes every
leak: stale temporaries, orphan metadata files, upload directories without a manifest, deleted-segment
records (counts kept), commits of deleted segments (never the newest), failure notes of gone attempts."""

from __future__ import annotations

import os
import stat
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from streamoffload.checkpoints import manifest as mf
from streamoffload.checkpoints.metadata_store import MetadataStore
from streamoffload.checkpoints.metadata_view import MetadataView
from streamoffload.checkpoints.policy import OffloadPolicy
from streamoffload.checkpoints.retention import apply_retention
from streamoffload.cli import main
from streamoffload.codecs.proto.offload_manifest_pb2 import SegmentManifest
from streamoffload.config import StoreSettings, load_config
from streamoffload.errors import ConfigError
from streamoffload.storage import keys
from streamoffload.storage.base import StorageError
from streamoffload.storage.filesystem import FilesystemStore, dir_mode_for
from streamoffload.storage.fs_sync import FileSync
from streamoffload.storage.location import ScopedStore, open_store
from streamoffload.units import MIB

TOPIC = "persistent://tenant/ns/leaky-partition-0"
OLD = 1_000_000_000.0  # 2001: older than any grace period


@pytest.fixture
def open_umask() -> Iterator[None]:
    """A permissive umask, so the modes seen are the store's doing and not the umask's."""
    previous = os.umask(0)
    try:
        yield
    finally:
        os.umask(previous)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def every_path(root: Path) -> list[Path]:
    return [Path(d) / n for d, dirs, files in os.walk(root) for n in [*dirs, *files]]


def test_files_are_0600_and_directories_0700_by_default(tmp_path: Path, open_umask: None) -> None:
    root = tmp_path / "store"
    store = FilesystemStore(root, fsync=False)
    store.put("a/b/plain", b"x")
    store.put("a/b/with-meta", b"x", {"k": "v"})
    store.put("a/created-once", b"x", if_absent=True)
    write = store.start_multipart("a/c/multi")
    write.write_part(1, b"part")
    open_write = store.start_multipart("a/c/open")  # staging left in place
    open_write.write_part(1, b"part")
    write.complete([1])
    assert mode(root) == 0o700
    paths = every_path(root)
    assert any(p.name.endswith(".meta.json") for p in paths) and any(".multipart" in str(p) for p in paths)
    assert any(".locks" in str(p) for p in paths)
    for path in paths:
        assert mode(path) == (0o700 if path.is_dir() else 0o600), path


def test_modes_are_configurable_in_the_store_section(tmp_path: Path, open_umask: None) -> None:
    conf = tmp_path / "so.toml"
    conf.write_text(f'[store]\nroot = "{tmp_path / "store"}"\nfileMode = "0640"\n')
    settings = load_config(conf).store
    assert settings.modes() == (0o640, None)
    store = settings.location.open().store
    store.put("x/y/z", b"1")
    assert mode(tmp_path / "store" / "x" / "y" / "z") == 0o640
    assert mode(tmp_path / "store" / "x" / "y") == 0o750
    assert mode(tmp_path / "store") == 0o750


def test_the_way_of_syncing_is_configurable_in_the_store_section(tmp_path: Path) -> None:
    conf = tmp_path / "so.toml"
    conf.write_text(f'[store]\nroot = "{tmp_path / "store"}"\nfileSync = "file"\n')
    store = load_config(conf).store.location.open().store
    assert isinstance(store, FilesystemStore) and isinstance(store._syncer(), FileSync)
    conf.write_text(f'[store]\nroot = "{tmp_path / "store"}"\n')
    default = load_config(conf).store.location.open().store
    assert isinstance(default, FilesystemStore) and default._sync_mode == "group"

    other = open_store(str(tmp_path / "other"), file_mode=0o644, dir_mode=0o711)
    other.put("p/q", b"1")
    assert (mode(tmp_path / "other" / "p" / "q"), mode(tmp_path / "other" / "p")) == (0o644, 0o711)
    assert dir_mode_for(0o600) == 0o700 and dir_mode_for(0o644) == 0o755


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"fileMode": "rw-r-----"}, "store.fileMode must be an octal permission mode"),
        ({"fileMode": "0400"}, "store.fileMode '0400' must give the store's owner at least 0600"),
        ({"dirMode": "0600"}, "store.dirMode '0600' must give the store's owner at least 0700"),
    ],
)
def test_a_malformed_mode_is_refused_naming_the_key(table: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        StoreSettings(**table)


def test_the_store_refuses_modes_that_lock_out_its_owner(tmp_path: Path) -> None:
    with pytest.raises(StorageError, match="file_mode 0400"):
        FilesystemStore(tmp_path, file_mode=0o400)


def test_stale_temporaries_orphan_metadata_and_manifestless_uploads_are_swept(tmp_path: Path) -> None:
    root = tmp_path / "store"
    store = FilesystemStore(root, fsync=False)
    store.put("t/kept", b"x", {"k": "v"})
    live_upload = store.start_multipart("t/live")
    live_upload.write_part(1, b"p")
    leaks = [
        root / "t" / ".gone.tmp-0123",
        root / "t" / ".gone.meta.json",
        root / ".multipart" / ("ab" * 16) / "part-00001",
    ]
    for path in leaks:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"leak")
    young = root / "t" / ".young.tmp-4567"
    young.write_bytes(b"a write in flight")
    for path in [*leaks, leaks[2].parent]:
        os.utime(path, (OLD, OLD))
    assert store.remove_stale_temporaries(older_than=3600) == 3
    assert not any(p.exists() for p in leaks) and not leaks[2].parent.exists()
    assert young.exists()  # younger than the grace: maybe a live writer
    assert store.get("t/kept") == b"x" and dict(store.head("t/kept").metadata) == {"k": "v"}
    live_upload.write_part(2, b"q")  # an upload with a manifest is MetadataStore.cleanup's business
    assert live_upload.complete([1, 2]).size == 2


def sealed(ordinal: int) -> SegmentManifest:
    ledger = 100 + ordinal
    seg_id = mf.segment_uuid(TOPIC, ordinal, (ledger, 0))
    opened = mf.new_manifest(
        topic=TOPIC,
        segment_id=seg_id,
        ordinal=ordinal,
        format_version=2,
        start=(ledger, 0),
        assigned_ms=1,
        data_key=keys.data_key("", TOPIC, seg_id),
        index_key=keys.index_key("", TOPIC, seg_id),
    )
    return mf.sealed_manifest(
        opened,
        end=(ledger, 4),
        offloaded_ms=1_000 + ordinal,
        spans=[mf.LedgerSpan(ledger, 0, 4, 5, MIB)],
        data_length=MIB,
        index_length=8,
        block_count=1,
        part_count=1,
        seal_reason="size",
        publish_time_last=1_000 + ordinal,
    )


def test_cleanup_command_removes_every_leak(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "store"
    store = FilesystemStore(root, fsync=False)
    meta = MetadataStore(ScopedStore(store))
    for ordinal in range(5):
        manifest = sealed(ordinal)
        store.put(manifest.dataKey, b"d")
        store.put(manifest.indexKey, b"i")
        meta.commit(manifest)
    gone_attempt = str(uuid.uuid4())
    meta.record_failure(TOPIC, gone_attempt, "OSError: no space left")
    policy = OffloadPolicy(retentionSizeInMB=1, managedLedgerOffloadDeletionLagMs=0)
    report = apply_retention(meta, TOPIC, policy, at_ms=10_000_000)
    assert len(report.deleted_segments) == 4
    assert len(meta.deleted_segment_ids(TOPIC)) == 4
    stale = root / "tenant" / "ns" / ".x.tmp-99"
    stale.write_bytes(b"half a write")
    orphan_upload = root / ".multipart" / ("cd" * 16)
    orphan_upload.mkdir(parents=True)
    notes = root / "tenant" / "ns" / "leaky-partition-0" / "_meta" / "failures"
    for path in (stale, orphan_upload, *notes.iterdir()):
        os.utime(path, (OLD, OLD))

    assert main(["cleanup", "--store", str(root), "--grace-minutes", "1"]) == 0
    out = capsys.readouterr().out
    assert "removed failure note of a gone attempt " + gone_attempt in out
    assert out.count("removed deleted-segment record") == 3
    assert out.count("removed commit of deleted segment") == 4
    assert "removed 2 stale temporary file(s)" in out

    assert not stale.exists() and not orphan_upload.exists()
    assert meta.failures(TOPIC) == {}
    snap = MetadataView(meta).refresh(TOPIC)
    assert len(snap.deleted) == 1  # the newest stays: the topic was deleted by retention
    assert sorted(snap.commits) == [4]  # the live segment's, which is also the newest
    assert snap.deleted_totals().entries == 4 * 5  # the counts of the folded records are kept
    assert [m.ordinal for m in snap.offloaded()] == [4]
    # A second cleanup finds nothing.
    assert main(["cleanup", "--store", str(root), "--grace-minutes", "1"]) == 0
    assert "cleanup: 0 item(s) removed" in capsys.readouterr().out
