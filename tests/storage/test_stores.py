"""The same behaviour, checked on every store: the filesystem store and S3 (a real moto server over HTTP)."""

from __future__ import annotations

import errno
import os
import pickle
import select
import signal
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from streamoffload.errors import ConfigError
from streamoffload.storage.base import (
    InvalidKeyError,
    ObjectExistsError,
    ObjectNotFoundError,
    ObjectStore,
    StorageError,
    UploadNotFoundError,
)
from streamoffload.storage.filesystem import FilesystemStore
from streamoffload.storage.fs_sync import GroupSync
from streamoffload.storage.location import StoreLocation, open_store, parse_store_url
from streamoffload.storage.s3 import S3Store


@pytest.fixture(params=["filesystem", pytest.param("s3", marks=pytest.mark.s3)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ObjectStore]:
    if request.param == "filesystem":
        yield FilesystemStore(tmp_path / "store")
        return
    bucket = request.getfixturevalue("s3_bucket")
    settings = request.getfixturevalue("s3_settings")
    s3 = S3Store(bucket, "root/pfx", **settings)  # a key prefix, so every case also checks prefix handling
    yield s3
    s3.close()


def part_bytes(store: ObjectStore, tag: int, size: int | None = None) -> bytes:
    """A full-size part for ``store`` (5 MiB on S3, 1 KiB elsewhere), recognisable by ``tag``."""
    n = size if size is not None else max(store.min_part_size, 1024)
    pattern = bytes([tag]) + tag.to_bytes(2, "big") + b"part"
    return (pattern * (n // len(pattern) + 1))[:n]


def keys(store: ObjectStore, prefix: str = "") -> list[str]:
    return [info.key for info in store.list(prefix)]


# --- whole objects ---------------------------------------------------------------------------------------


def test_put_get_head_round_trip(store: ObjectStore) -> None:
    data = bytes(range(256)) * 16
    info = store.put("t/seg/obj", data, {"S3ManagedLedgerOffloaderFormatVersion": "1", "managedLedgerName": "a/b"})
    assert (info.key, info.size) == ("t/seg/obj", len(data))
    assert store.get("t/seg/obj") == data
    head = store.head("t/seg/obj")
    assert head.size == len(data)
    assert dict(head.metadata) == {"s3managedledgeroffloaderformatversion": "1", "managedledgername": "a/b"}
    assert head.last_modified > 1e9
    assert store.exists("t/seg/obj")
    assert not store.exists("t/seg/other")


def test_put_many_writes_every_object_with_its_metadata_and_overwrites(
    store: ObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.put("seg/b", b"old", {"x": "old"})
    store.put("other/old", b"")  # both directories exist: a new one is synced into its parent once more
    objects = [
        ("seg/a-crc-1", b"record", None),
        ("seg/b", memoryview(bytearray(b"__data__"))[2:6], {"ManagedLedgerName": "t/ns/p/t"}),
        ("seg/b-index", b"index", {"managedledgername": "t/ns/p/t"}),
        ("other/c", b"", None),
    ]
    if isinstance(store, FilesystemStore):
        # sync="file": every file fsynced, each directory once (not twice per object), and only once every object
        # is in place: the syncs go together, not one write-then-sync per file.
        per_file = FilesystemStore(store.root, sync="file")
        synced: list[str] = []
        in_place_at_first_sync: list[bool] = []
        real = os.fsync

        def recording_fsync(fd: int) -> None:
            if not synced:
                in_place_at_first_sync.append(all(store.exists(key) for key, _, _ in objects))
            synced.append(os.readlink(f"/proc/self/fd/{fd}"))
            real(fd)

        monkeypatch.setattr(os, "fsync", recording_fsync)
        per_file.put_many(objects)
        root = store.root
        assert in_place_at_first_sync == [True]
        assert synced == [
            str(root / "seg/a-crc-1"),
            str(root / "seg/b"),
            str(root / "seg/.b.meta.json"),
            str(root / "seg/b-index"),
            str(root / "seg/.b-index.meta.json"),
            str(root / "other/c"),
            str(root / "seg"),
            str(root / "other"),
        ], "the files under their final names, then one sync per directory"
        monkeypatch.setattr(os, "fsync", real)
        # The default, sync="group" (Linux): one syncfs for all of them, once every object is in place.
        group = store._syncer()
        if isinstance(group, GroupSync):
            in_place: list[bool] = []
            real_syncfs = group._syncfs

            def recording_syncfs(fd: int) -> None:
                in_place.append(all(store.exists(key) for key, _, _ in objects))
                real_syncfs(fd)

            monkeypatch.setattr(group, "_syncfs", recording_syncfs)
            store.put_many(objects)
            assert in_place == [True]
    else:
        store.put_many(objects)
    assert {k: store.get(k) for k in keys(store)} == {
        "other/c": b"",
        "other/old": b"",
        "seg/a-crc-1": b"record",
        "seg/b": b"data",
        "seg/b-index": b"index",
    }
    assert dict(store.head("seg/b").metadata) == {"managedledgername": "t/ns/p/t"}
    assert dict(store.head("seg/a-crc-1").metadata) == {}


def test_put_many_has_finished_every_put_when_it_fails(store: ObjectStore) -> None:
    """A failed put_many leaves nothing in flight: on S3 the other PUTs, sent at once, have ended (a PUT landing
    after the caller's retry cleaned up would bring back what it removed)."""
    objects = [("bad//key", b"x", None), *((f"seg/{n}", bytes(4 << 20), None) for n in range(8))]
    with pytest.raises(InvalidKeyError):
        store.put_many(objects)
    if isinstance(store, S3Store):
        assert keys(store, "seg/") == [f"seg/{n}" for n in range(8)]


def test_put_accepts_memoryview_and_empty_objects(store: ObjectStore) -> None:
    buf = bytearray(b"0123456789")
    store.put("mv", memoryview(buf)[2:6])
    assert store.get("mv") == b"2345"
    store.put("empty", b"")
    assert store.get("empty") == b""
    assert store.head("empty").size == 0
    assert store.get_range("empty", 0, 10) == b""


def test_missing_objects_raise_not_found_naming_the_key(store: ObjectStore) -> None:
    for call in (store.get, store.head, lambda k: store.get_range(k, 0, 10), lambda k: store.get_range(k, 0, 0)):
        with pytest.raises(ObjectNotFoundError, match="no/such/key") as err:
            call("no/such/key")
        assert err.value.key == "no/such/key"


def test_get_range_bounds(store: ObjectStore) -> None:
    data = bytes(range(100))
    store.put("r", data)
    assert store.get_range("r", 0, 10) == data[:10]
    assert store.get_range("r", 37, 13) == data[37:50]
    assert store.get_range("r", 95, 10) == data[95:]  # shorter only at the end
    assert store.get_range("r", 99, 1) == data[99:]
    assert store.get_range("r", 100, 5) == b""
    assert store.get_range("r", 1000, 5) == b""
    assert store.get_range("r", 10, 0) == b""
    with pytest.raises(ValueError, match="must be >= 0"):
        store.get_range("r", -1, 5)
    with pytest.raises(ValueError, match="must be >= 0"):
        store.get_range("r", 0, -5)


def test_overwrite_replaces_bytes_and_metadata(store: ObjectStore) -> None:
    store.put("k", b"first version", {"v": "1", "only-first": "x"})
    store.put("k", b"second", {"v": "2"})
    assert store.get("k") == b"second"
    assert dict(store.head("k").metadata) == {"v": "2"}
    store.put("k", b"third")
    assert store.get("k") == b"third"
    assert dict(store.head("k").metadata) == {}


def test_metadata_is_validated_the_same_everywhere(store: ObjectStore) -> None:
    with pytest.raises(StorageError, match="not printable ASCII"):
        store.put("m", b"x", {"name": "caf\u00e9"})
    with pytest.raises(StorageError, match="invalid user metadata name"):
        store.put("m", b"x", {"bad name": "v"})
    with pytest.raises(StorageError, match="given twice"):
        store.put("m", b"x", {"Name": "a", "name": "b"})
    with pytest.raises(StorageError, match="2048 bytes"):
        store.put("m", b"x", {"big": "v" * 3000})
    assert not store.exists("m")


def test_list_is_in_key_order_and_filters_by_prefix(store: ObjectStore) -> None:
    # '-' sorts before '/', which sorts before letters: a directory walk must not list a/... first.
    for key in ["b", "a/y/z", "ab", "a-c", "a/x", "a/y/a", "a/y-"]:
        store.put(key, key.encode(), {"k": "v"})
    assert keys(store) == ["a-c", "a/x", "a/y-", "a/y/a", "a/y/z", "ab", "b"]
    assert keys(store, "a/") == ["a/x", "a/y-", "a/y/a", "a/y/z"]
    assert keys(store, "a/y") == ["a/y-", "a/y/a", "a/y/z"]
    assert keys(store, "a/y/") == ["a/y/a", "a/y/z"]
    assert keys(store, "a") == ["a-c", "a/x", "a/y-", "a/y/a", "a/y/z", "ab"]
    assert keys(store, "nothing/") == []
    assert keys(store, "b/") == []  # 'b' is an object, not a prefix of one
    sizes = {info.key: info.size for info in store.list("")}
    assert sizes["a/y/a"] == len("a/y/a")


def test_delete_is_idempotent_and_removes_from_listing(store: ObjectStore) -> None:
    store.put("d/one", b"1", {"k": "v"})
    store.put("d/two", b"2")
    store.delete("d/one")
    store.delete("d/one")
    store.delete("never/existed")
    store.delete("d")  # a prefix of keys, not an object: nothing happens
    with pytest.raises(ObjectNotFoundError):
        store.get("d/one")
    assert keys(store) == ["d/two"]
    store.put("d/one", b"again")  # re-created without stale metadata
    assert dict(store.head("d/one").metadata) == {}


def test_put_if_absent(store: ObjectStore) -> None:
    store.put("once", b"first", {"v": "1"}, if_absent=True)
    with pytest.raises(ObjectExistsError, match="once") as err:
        store.put("once", b"second", {"v": "2"}, if_absent=True)
    assert err.value.key == "once"
    assert store.get("once") == b"first"
    assert dict(store.head("once").metadata) == {"v": "1"}
    store.delete("once")
    store.put("once", b"third", if_absent=True)
    assert store.get("once") == b"third"


def test_put_if_absent_has_exactly_one_winner_among_concurrent_creators(store: ObjectStore) -> None:
    writers = 6
    barrier = threading.Barrier(writers)
    outcome: dict[int, str] = {}

    def create(i: int) -> None:
        barrier.wait()
        try:
            store.put("race", f"writer {i}".encode(), {"writer": str(i)}, if_absent=True)
            outcome[i] = "won"
        except ObjectExistsError:
            outcome[i] = "lost"

    threads = [threading.Thread(target=create, args=(i,)) for i in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [i for i, result in outcome.items() if result == "won"]
    assert len(outcome) == writers
    assert len(winners) == 1
    assert store.get("race") == f"writer {winners[0]}".encode()
    assert dict(store.head("race").metadata) == {"writer": str(winners[0])}


@pytest.mark.parametrize(
    "bad",
    ["", "/abs/key", "a/../b", "..", "a/./b", "a//b", "a/", "a\\b", "a\x00b", ".hidden", "a/.multipart/x", "a\nb"],
)
def test_invalid_keys_are_refused_naming_the_key(store: ObjectStore, bad: str) -> None:
    for call in (
        lambda: store.put(bad, b"x"),
        lambda: store.get(bad),
        lambda: store.get_range(bad, 0, 1),
        lambda: store.head(bad),
        lambda: store.delete(bad),
        lambda: store.start_multipart(bad),
    ):
        with pytest.raises(InvalidKeyError) as err:
            call()
        assert err.value.key == bad
        assert repr(bad) in str(err.value)


@pytest.mark.parametrize("bad", ["/abs", "a/../", "a//", "\\x", ".h"])
def test_invalid_list_prefixes_are_refused(store: ObjectStore, bad: str) -> None:
    with pytest.raises(InvalidKeyError):
        list(store.list(bad))
    with pytest.raises(InvalidKeyError):
        list(store.pending_multiparts(bad))


def test_stores_pickle_for_spark_tasks(store: ObjectStore) -> None:
    store.put("p", b"before pickling")
    clone = pickle.loads(pickle.dumps(store))
    assert clone.url == store.url
    assert clone.get("p") == b"before pickling"
    clone.put("q", b"from the clone")
    assert store.get("q") == b"from the clone"


def test_unicode_keys(store: ObjectStore) -> None:
    store.put("t/caf\u00e9/\u6587\u5b57 x%2F", b"u")
    assert keys(store, "t/") == ["t/caf\u00e9/\u6587\u5b57 x%2F"]
    assert store.get("t/caf\u00e9/\u6587\u5b57 x%2F") == b"u"


# --- multipart -------------------------------------------------------------------------------------------


def test_multipart_parts_in_any_order_and_rewritten(store: ObjectStore) -> None:
    p1, p2, p2b = part_bytes(store, 1), part_bytes(store, 2), part_bytes(store, 22)
    tail = b"last part may be small"
    write = store.start_multipart("mp/obj", {"Format": "2"})
    write.write_part(3, tail)
    write.write_part(2, p2)
    write.write_part(1, p1)
    write.write_part(2, p2b)  # a replayed batch rewrites a part with new bytes: the last write wins
    info = write.complete([1, 2, 3])
    expected = p1 + p2b + tail
    assert info.key == "mp/obj"
    assert info.size == len(expected)
    assert dict(info.metadata) == {"format": "2"}
    assert store.get("mp/obj") == expected
    assert dict(store.head("mp/obj").metadata) == {"format": "2"}
    assert list(store.pending_multiparts("")) == []


def test_multipart_parts_given_as_buffers_are_their_concatenation(store: ObjectStore) -> None:
    """A part may be handed over as buffers (the sink's block headers, entries and padding, not joined): the
    object holds their concatenation, also past ``IOV_MAX`` (1024) buffers, in order and rewritten."""
    first = part_bytes(store, 1)
    pieces = [first[i : i + 997] for i in range(0, len(first), 997)]
    buffers = [bytearray(p) if i % 3 == 1 else memoryview(p) if i % 3 == 2 else p for i, p in enumerate(pieces)]
    many = [bytes([n % 251]) * 3 for n in range(2_500)]  # more buffers than one pwritev takes
    write = store.start_multipart("t/obj")
    write.write_part(1, buffers)
    write.write_part(2, many)
    write.write_part(2, many[:1_500])  # rewritten, shorter
    write.complete([1, 2])
    assert store.get("t/obj") == first + b"".join(many[:1_500])


def test_multipart_complete_uses_exactly_the_given_parts(store: ObjectStore) -> None:
    p1, p2, p3 = part_bytes(store, 1), part_bytes(store, 2), b"three"
    write = store.start_multipart("mp/exact")
    write.write_part(1, p1)
    write.write_part(2, p2)
    write.write_part(3, p3)
    write.write_part(4, b"four: written but not listed")
    assert write.complete([3, 1]).size == len(p1) + len(p3)  # given unsorted: assembled ascending
    assert store.get("mp/exact") == p1 + p3


def test_a_part_written_to_a_completed_upload_fails_and_leaves_the_object(store: ObjectStore) -> None:
    """What lets the sink ask whether a segment's object exists once per run, not before every part: an old writer
    that completed the upload meanwhile makes the next part fail, never change the object."""
    write = store.start_multipart("mp/completed")
    p1 = part_bytes(store, 1)
    write.write_part(1, p1)
    later = store.resume_multipart("mp/completed", write.upload_id)  # the same upload, another writer's handle
    write.complete([1])
    with pytest.raises(UploadNotFoundError, match="mp/completed"):
        later.write_part(2, b"after the end")
    assert store.get("mp/completed") == p1
    assert not list(store.pending_multiparts("mp/"))


def test_multipart_complete_with_a_missing_part_fails_and_keeps_the_upload(store: ObjectStore) -> None:
    write = store.start_multipart("mp/missing")
    write.write_part(1, b"only part")
    with pytest.raises(StorageError, match=r"parts \[2\] were never written; written parts are \[1\]"):
        write.complete([1, 2])
    assert not store.exists("mp/missing")
    assert [p.upload_id for p in store.pending_multiparts("mp/")] == [write.upload_id]
    assert write.complete([1]).size == len(b"only part")  # the caller can retry
    assert store.get("mp/missing") == b"only part"


def test_multipart_argument_checks(store: ObjectStore) -> None:
    write = store.start_multipart("mp/args")
    for bad in (0, -1, 10_001, True):
        with pytest.raises(ValueError, match="part numbers"):
            write.write_part(bad, b"x")
    write.write_part(1, b"x")
    with pytest.raises(ValueError, match="at least one part"):
        write.complete([])
    with pytest.raises(ValueError, match="duplicate"):
        write.complete([1, 1])
    write.abort()


def test_uncompleted_multipart_is_invisible(store: ObjectStore) -> None:
    write = store.start_multipart("mp/hidden/obj", {"k": "v"})
    write.write_part(1, b"some bytes")
    write.write_part(2, b"more bytes")
    assert keys(store) == []
    assert not store.exists("mp/hidden/obj")
    with pytest.raises(ObjectNotFoundError):
        store.get("mp/hidden/obj")


def test_resume_multipart_after_a_crash(store: ObjectStore, request: pytest.FixtureRequest) -> None:
    p1 = part_bytes(store, 1)
    first = store.start_multipart("mp/resumed", {"owner": "executor-1"})
    first.write_part(1, p1)
    upload_id = first.upload_id
    del first  # the writer "crashes": only the key and the upload id survive (in Spark state)

    again = _reopen(store, request)
    resumed = again.resume_multipart("mp/resumed", upload_id)
    assert (resumed.key, resumed.upload_id) == ("mp/resumed", upload_id)
    resumed.write_part(2, b"tail")
    info = resumed.complete([1, 2])
    assert again.get("mp/resumed") == p1 + b"tail"
    assert info.size == len(p1) + 4
    assert dict(again.head("mp/resumed").metadata) == {"owner": "executor-1"}
    with pytest.raises(UploadNotFoundError, match=upload_id):
        again.resume_multipart("mp/resumed", upload_id)  # completed: gone


def test_resume_refuses_unknown_ids_and_other_keys(store: ObjectStore) -> None:
    write = store.start_multipart("mp/a")
    write.write_part(1, b"x")
    with pytest.raises(UploadNotFoundError):
        store.resume_multipart("mp/b", write.upload_id)
    for bogus in ("0" * 32, "../../etc", "nope"):
        with pytest.raises(UploadNotFoundError):
            store.resume_multipart("mp/a", bogus)
    write.abort()


def test_pending_multiparts_listing_and_abort(store: ObjectStore) -> None:
    a = store.start_multipart("t1/seg-a")
    a.write_part(1, b"a")
    b = store.start_multipart("t1/seg-b")
    c = store.start_multipart("t2/seg-c")
    c.write_part(1, b"c")
    pending = list(store.pending_multiparts(""))
    assert [(p.key, p.upload_id) for p in pending] == [
        ("t1/seg-a", a.upload_id),
        ("t1/seg-b", b.upload_id),
        ("t2/seg-c", c.upload_id),
    ]
    assert all(p.initiated > 0 for p in pending)
    assert [p.key for p in store.pending_multiparts("t1/")] == ["t1/seg-a", "t1/seg-b"]
    assert [p.key for p in store.pending_multiparts("t2")] == ["t2/seg-c"]
    assert list(store.pending_multiparts("t3/")) == []

    a.abort()
    a.abort()  # idempotent
    store.resume_multipart("t1/seg-b", b.upload_id).abort()  # a cleanup job aborts what it found
    assert [p.key for p in store.pending_multiparts("")] == ["t2/seg-c"]
    with pytest.raises(UploadNotFoundError):
        a.write_part(2, b"too late")
    with pytest.raises(UploadNotFoundError):
        a.complete([1])
    assert keys(store) == []


def test_two_uploads_of_the_same_key_are_independent(store: ObjectStore) -> None:
    first = store.start_multipart("mp/same")
    second = store.start_multipart("mp/same")
    assert first.upload_id != second.upload_id
    first.write_part(1, b"first")
    second.write_part(1, b"second")
    second.complete([1])
    assert store.get("mp/same") == b"second"
    assert [p.upload_id for p in store.pending_multiparts("mp/")] == [first.upload_id]
    first.abort()
    assert store.get("mp/same") == b"second"


def _reopen(store: ObjectStore, request: pytest.FixtureRequest) -> ObjectStore:
    """A second store object on the same place, as another process would open it."""
    if isinstance(store, FilesystemStore):
        return FilesystemStore(store.root)
    assert isinstance(store, S3Store)
    return S3Store(store.bucket, store.prefix, **request.getfixturevalue("s3_settings"))


# --- crash safety ----------------------------------------------------------------------------------------

_CRASHING_WRITER = textwrap.dedent(
    """
    import os, sys, time
    from streamoffload.storage import filesystem

    def stall_half_way(f, chunks):
        data = b"".join(bytes(c) for c in chunks)
        f.write(data[: len(data) // 2])
        f.flush()
        os.fsync(f.fileno())
        print("HALF", len(data) // 2, flush=True)
        time.sleep(120)  # killed here

    copied = []
    real_copy = filesystem._copy_range

    def stall_after_the_first_part(src, dst, size, start=0):
        if copied:
            os.fsync(dst)
            print("HALF", sum(copied), flush=True)
            time.sleep(120)  # killed here
        real_copy(src, dst, size, start)
        copied.append(size)

    filesystem._write_chunks = stall_half_way
    filesystem._copy_range = stall_after_the_first_part
    store = filesystem.FilesystemStore(sys.argv[1])
    if sys.argv[2] == "put":
        store.put("t/obj", b"N" * 100_000, {"v": "new"})
    else:
        store.resume_multipart("t/obj", sys.argv[3]).complete([1, 2])
    """
)


def _kill_half_way(root: Path, *args: str) -> int:
    """Run a writer in a child process, SIGKILL it half-way through writing the object's bytes."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _CRASHING_WRITER, str(root), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 60)
        assert ready, "the writer never reached the middle of its write"
        line = proc.stdout.readline().decode()  # type: ignore[union-attr]
        assert line.startswith("HALF"), f"writer failed: {line!r} {proc.stderr.read().decode()}"  # type: ignore[union-attr]
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stdout.close()  # type: ignore[union-attr]
        proc.stderr.close()  # type: ignore[union-attr]
    assert proc.returncode == -signal.SIGKILL
    return int(line.split()[1])


@pytest.mark.slow
@pytest.mark.parametrize("existing", [False, True], ids=["new-key", "overwrite"])
def test_filesystem_put_killed_mid_write_leaves_no_partial_object(tmp_path: Path, existing: bool) -> None:
    root = tmp_path / "store"
    store = FilesystemStore(root)
    if existing:
        store.put("t/obj", b"OLD" * 10, {"v": "old"})
    written = _kill_half_way(root, "put")
    assert written == 50_000
    # The half-written bytes exist, but only under a temporary name nobody reads or lists.
    leftovers = list((root / "t").glob(".obj.tmp-*"))
    assert [p.stat().st_size for p in leftovers] == [50_000]
    if existing:
        assert store.get("t/obj") == b"OLD" * 10
        assert dict(store.head("t/obj").metadata) == {"v": "old"}
        assert keys(store) == ["t/obj"]
    else:
        with pytest.raises(ObjectNotFoundError):
            store.get("t/obj")
        assert keys(store) == []
    store.put("t/obj", b"after the crash")  # the leftover is in nobody's way
    assert store.get("t/obj") == b"after the crash"
    assert store.remove_stale_temporaries(older_than=3600) == 0  # too recent: might be a live writer
    assert store.remove_stale_temporaries(older_than=-1) == 1
    assert list((root / "t").glob(".obj.tmp-*")) == []
    assert store.get("t/obj") == b"after the crash"


@pytest.mark.slow
def test_filesystem_complete_killed_mid_write_leaves_no_partial_object(tmp_path: Path) -> None:
    root = tmp_path / "store"
    store = FilesystemStore(root)
    write = store.start_multipart("t/obj")
    # Out of order, so part 2 is a file of its own and ``complete`` copies (parts written in order are linked).
    write.write_part(2, b"2" * 30_000)
    write.write_part(1, b"1" * 30_000)
    assert _kill_half_way(root, "complete", write.upload_id) == 30_000
    with pytest.raises(ObjectNotFoundError):
        store.get("t/obj")
    assert keys(store) == []
    # The upload survived the crash: complete it again.
    assert [p.upload_id for p in store.pending_multiparts("t/")] == [write.upload_id]
    store.resume_multipart("t/obj", write.upload_id).complete([1, 2])
    assert store.get("t/obj") == b"1" * 30_000 + b"2" * 30_000
    assert list(store.pending_multiparts("")) == []


@pytest.mark.parametrize("parts", [1, 3])
def test_filesystem_complete_without_hard_links_or_kernel_copies_writes_the_same_object(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, parts: int
) -> None:
    """``complete`` links a lone part and has the kernel copy several; where the filesystem refuses either,
    it reads and writes them instead, with the same result."""

    def refused(*_args: object, **_kwargs: object) -> None:
        raise OSError(errno.EXDEV, "refused for the test")

    store = FilesystemStore(tmp_path / "store")
    write = store.start_multipart("t/obj", {"v": "1"})
    payloads = [bytes([n]) * (10_000 + n) for n in range(1, parts + 1)]
    for n, payload in enumerate(payloads, 1):
        write.write_part(n, payload)
    monkeypatch.setattr(os, "link", refused)
    monkeypatch.setattr(os, "copy_file_range", refused)
    info = write.complete(list(range(1, parts + 1)))
    assert store.get("t/obj") == b"".join(payloads) and info.size == sum(map(len, payloads))
    assert dict(store.head("t/obj").metadata) == {"v": "1"}
    assert list(store.pending_multiparts("")) == []


def _staged_names(store: FilesystemStore, upload_id: str) -> list[str]:
    return sorted(p.name for p in (store.root / ".multipart" / upload_id).iterdir() if p.name.startswith("part-"))


def test_filesystem_parts_written_in_order_are_placed_in_one_file_and_linked_by_complete(tmp_path: Path) -> None:
    """The offloader writes parts 1, 2, 3 in order: each goes at its offset into one staging file, and
    ``complete`` links that file as the object, so no byte is copied a second time."""
    store = FilesystemStore(tmp_path / "store")
    write = store.start_multipart("t/obj", {"v": "1"})
    payloads = [bytes([n]) * (5_000 * n) for n in range(1, 4)]
    for n, payload in enumerate(payloads, 1):
        write.write_part(n, payload)
    assert _staged_names(store, write.upload_id) == [
        "part-00001.at-0-5000",
        "part-00002.at-5000-10000",
        "part-00003.at-15000-15000",
    ]
    staged = store.root / ".multipart" / write.upload_id / "object"
    inode = staged.stat().st_ino
    info = write.complete([1, 2, 3])
    path = store.root / "t" / "obj"
    assert path.read_bytes() == b"".join(payloads) and info.size == 30_000
    assert path.stat().st_ino == inode and path.stat().st_nlink == 1  # linked, and the staging link is gone
    assert dict(store.head("t/obj").metadata) == {"v": "1"}
    assert list(store.pending_multiparts("")) == []


@pytest.mark.parametrize(
    ("writes", "complete"),
    [
        ([(2, b"b" * 7), (1, b"a" * 5), (3, b"c" * 9)], [1, 2, 3]),  # out of order: 1 placed, 2 and 3 files
        ([(1, b"a" * 5), (2, b"b" * 7), (1, b"A" * 6)], [1, 2]),  # a placed part rewritten longer: a file now
        ([(1, b"a" * 5), (2, b"b" * 7), (2, b"B" * 7)], [1, 2]),  # rewritten, same size: still never torn
        ([(1, b"a" * 5), (2, b"b" * 7), (3, b"c" * 9)], [1, 3]),  # a placed part left out of the object
        ([(1, b"a" * 5), (2, b"b" * 7), (3, b"c" * 9)], [2, 3]),  # the first left out
        ([(1, b"a" * 5), (2, b"b" * 7), (3, b"c" * 9)], [1, 2]),  # the last left out: the placed file is cut
    ],
    ids=["out-of-order", "rewrite-longer", "rewrite-same-size", "gap", "no-first", "no-last"],
)
def test_filesystem_parts_placed_or_not_complete_to_the_listed_parts_latest_bytes(
    tmp_path: Path, writes: list[tuple[int, bytes]], complete: list[int]
) -> None:
    store = FilesystemStore(tmp_path / "store")
    write = store.start_multipart("t/obj")
    latest: dict[int, bytes] = {}
    for number, data in writes:
        write.write_part(number, data)
        latest[number] = data
    assert store.resume_multipart("t/obj", write.upload_id).complete(complete).size == sum(
        len(latest[n]) for n in complete
    )
    assert store.get("t/obj") == b"".join(latest[n] for n in complete)
    assert list(store.pending_multiparts("")) == []


def test_filesystem_placed_part_killed_before_its_marker_is_not_a_part_and_its_bytes_are_cut(tmp_path: Path) -> None:
    """A placed write killed after its bytes but before its marker leaves bytes past the placed parts: the part
    does not exist (``complete`` refuses it), the next write of it overwrites them, and ``complete`` cuts
    whatever is left beyond the parts it lists."""
    store = FilesystemStore(tmp_path / "store")
    write = store.start_multipart("t/obj")
    write.write_part(1, b"a" * 10)
    staged = store.root / ".multipart" / write.upload_id / "object"
    with open(staged, "ab") as f:
        f.write(b"torn bytes of part 2, never marked")
    with pytest.raises(StorageError, match=r"parts \[2\] were never written; written parts are \[1\]"):
        write.complete([1, 2])
    write.write_part(2, b"b" * 4)
    write.complete([1, 2])
    assert store.get("t/obj") == b"a" * 10 + b"b" * 4


def test_filesystem_parts_of_one_upload_from_two_processes_are_serialised(tmp_path: Path) -> None:
    """Two writers of one upload (a retried Spark task beside a slow first attempt) take the upload's lock:
    every part lands whole, placed or not, and ``complete`` joins them in number order."""
    root = tmp_path / "store"
    store = FilesystemStore(root)
    write = store.start_multipart("t/obj")
    script = textwrap.dedent(
        """
        import sys
        from streamoffload.storage.filesystem import FilesystemStore
        write = FilesystemStore(sys.argv[1]).resume_multipart("t/obj", sys.argv[2])
        for n in range(1, 41):
            write.write_part(n, bytes([n]) * (1000 + n))
        """
    )
    procs = [subprocess.Popen([sys.executable, "-c", script, str(root), write.upload_id]) for _ in range(2)]
    assert [p.wait(60) for p in procs] == [0, 0]
    write.complete(list(range(1, 41)))
    assert store.get("t/obj") == b"".join(bytes([n]) * (1000 + n) for n in range(1, 41))


def test_filesystem_complete_of_one_part_is_the_part_and_outlives_its_staging(tmp_path: Path) -> None:
    store = FilesystemStore(tmp_path / "store", file_mode=0o640)
    write = store.start_multipart("t/obj")
    write.write_part(1, b"only part")
    write.complete([1])
    path = tmp_path / "store" / "t" / "obj"
    assert path.read_bytes() == b"only part"
    assert path.stat().st_nlink == 1  # the staging directory and its link are gone
    assert path.stat().st_mode & 0o777 == 0o640


def test_s3_uncompleted_multipart_is_invisible_after_the_writer_is_gone(s3_store: S3Store) -> None:
    write = s3_store.start_multipart("t/obj")
    write.write_part(1, b"x" * 1000)
    write.write_part(2, b"y" * 1000)
    del write  # the writer dies before complete
    assert keys(s3_store) == []
    assert not s3_store.exists("t/obj")
    assert [p.key for p in s3_store.pending_multiparts("")] == ["t/obj"]


# --- filesystem specifics --------------------------------------------------------------------------------


def test_filesystem_layout_and_hidden_files(tmp_path: Path) -> None:
    store = FilesystemStore(tmp_path, fsync=False)
    store.put("a/b/c", b"data", {"k": "v"})
    store.start_multipart("a/b/d").write_part(1, b"x")
    assert (tmp_path / "a" / "b" / "c").read_bytes() == b"data"
    assert (tmp_path / "a" / "b" / ".c.meta.json").exists()
    assert len(list((tmp_path / ".multipart").iterdir())) == 1
    assert keys(store) == ["a/b/c"]  # no sidecars, staging, locks or temporary files
    assert store.url == tmp_path.as_uri()


def test_filesystem_keys_never_escape_the_root(tmp_path: Path) -> None:
    root = tmp_path / "root"
    store = FilesystemStore(root)
    for bad in ("../outside", "a/../../outside", "/tmp/outside", "a/..", "..\\outside"):
        with pytest.raises(InvalidKeyError):
            store.put(bad, b"x")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["root"]


def test_filesystem_delete_prunes_empty_directories(tmp_path: Path) -> None:
    store = FilesystemStore(tmp_path / "s")
    store.put("x/y/z/obj", b"1")
    store.put("x/keep", b"2")
    store.delete("x/y/z/obj")
    assert not (tmp_path / "s" / "x" / "y").exists()
    assert (tmp_path / "s" / "x" / "keep").exists()
    store.put("x/y", b"a key where a directory was")
    assert store.get("x/y") == b"a key where a directory was"


def test_filesystem_key_that_is_also_a_prefix_gives_a_clear_error(tmp_path: Path) -> None:
    store = FilesystemStore(tmp_path)
    store.put("a/b", b"1")
    with pytest.raises(StorageError, match="both an object and a prefix") as err:
        store.put("a", b"2")
    assert "'a'" in str(err.value)
    with pytest.raises(StorageError, match="both an object and a prefix"):
        store.put("a/b/c", b"3")
    assert keys(store) == ["a/b"]


def test_filesystem_if_absent_across_processes(tmp_path: Path) -> None:
    script = textwrap.dedent(
        """
        import sys
        from streamoffload.storage.base import ObjectExistsError
        from streamoffload.storage.filesystem import FilesystemStore
        try:
            FilesystemStore(sys.argv[1]).put("k", sys.argv[2].encode(), {"who": sys.argv[2]}, if_absent=True)
            print("won")
        except ObjectExistsError:
            print("lost")
        """
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", script, str(tmp_path), f"p{i}"], stdout=subprocess.PIPE)
        for i in range(4)
    ]
    results = [p.communicate(timeout=60)[0].decode().strip() for p in procs]
    assert sorted(results) == ["lost", "lost", "lost", "won"]
    store = FilesystemStore(tmp_path)
    winner = f"p{results.index('won')}"
    assert store.get("k") == winner.encode()
    assert dict(store.head("k").metadata) == {"who": winner}


# --- opening stores by URL -------------------------------------------------------------------------------


def test_open_store_filesystem_urls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "dir with space"
    by_uri = open_store(target.as_uri())
    assert isinstance(by_uri, FilesystemStore)
    assert by_uri.root == target
    assert by_uri.url == target.as_uri()
    assert open_store(str(target)).url == target.as_uri()
    monkeypatch.chdir(tmp_path)
    assert open_store("relative/dir", fsync=False).url == (tmp_path / "relative" / "dir").as_uri()
    by_uri.put("k", b"v")
    assert open_store(by_uri.url).get("k") == b"v"


def test_open_store_s3_urls() -> None:
    store = open_store("s3://bucket/some/prefix/", endpoint_url="http://127.0.0.1:1", region=None, path_style=True)
    assert isinstance(store, S3Store)
    assert store.url == "s3://bucket/some/prefix"
    assert store.prefix == "some/prefix/"
    assert open_store("s3://bucket").url == "s3://bucket"


@pytest.mark.parametrize(
    ("url", "options", "message"),
    [
        ("ftp://host/x", {}, "unsupported scheme 'ftp'"),
        ("file://otherhost/x", {}, "not host 'otherhost'"),
        ("s3:///prefix", {}, "missing bucket"),
        ("s3://bucket/p?versionId=1", {}, "s3 URLs take no query or fragment"),
        ("file:///tmp/x#frag", {}, "file URLs take no query or fragment"),
        ("file://localhost", {}, "must be absolute"),
        ("s3://bucket/p", {"colour": "red"}, "unknown option"),
        ("file:///tmp/x", {"region": "eu"}, "unknown option"),
        ("", {}, "empty"),
        ("  ", {}, "empty"),
    ],
)
def test_open_store_errors(url: str, options: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        open_store(url, **options)


@pytest.mark.parametrize(
    ("url", "parsed"),
    [
        ("file:///abs/dir%20x", StoreLocation("file", path="/abs/dir x")),
        ("file://localhost/abs/dir", StoreLocation("file", path="/abs/dir")),
        ("FILE:///abs", StoreLocation("file", path="/abs")),
        ("rel/dir", StoreLocation("file", path="rel/dir")),
        ("odd:name", StoreLocation("file", path="odd:name")),  # no '://': a path, whatever its colons
        ("s3://bucket", StoreLocation("s3", bucket="bucket")),
        ("s3://bucket/some/prefix/", StoreLocation("s3", bucket="bucket", prefix="some/prefix")),
        ("S3://bucket/a%2Bb", StoreLocation("s3", bucket="bucket", prefix="a+b")),
    ],
)
def test_parse_store_url(url: str, parsed: StoreLocation) -> None:
    assert parse_store_url(url) == parsed


def test_the_store_class_of_a_url_is_known_without_opening_it(tmp_path: Path) -> None:
    missing = tmp_path / "not-created"
    assert parse_store_url(str(missing)).store_class is FilesystemStore
    assert parse_store_url("s3://no-such-bucket/p").store_class is S3Store
    assert not missing.exists()


def test_open_store_refuses_credentials_in_the_url_without_echoing_them() -> None:
    with pytest.raises(ConfigError) as err:
        open_store("s3://AKIDSECRET:hunter2@bucket/prefix")
    assert "hunter2" not in str(err.value)
    assert "AKIDSECRET" not in str(err.value)
