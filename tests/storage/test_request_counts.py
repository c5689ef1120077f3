"""storage/request_counts.py: a store's requests counted by operation, and a process's counts in a file when the
environment asks for it (bench/scale.py sums a job's processes that way)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from streamoffload.storage.filesystem import FilesystemStore
from streamoffload.storage.location import open_store
from streamoffload.storage.request_counts import (
    ENV,
    CountingStore,
    RequestCounts,
    by_class,
    counts_by_process,
    key_kind,
    read_counts,
)


def test_every_operation_is_counted_and_the_store_behaves_as_before(tmp_path: Path) -> None:
    counts = RequestCounts()
    store = CountingStore(FilesystemStore(str(tmp_path / "store")), counts)
    store.put("a/b", b"hello")
    assert store.get("a/b") == b"hello"
    assert store.get_range("a/b", 1, 3) == b"ell"
    assert store.head("a/b").size == 5
    assert store.exists("a/b") and not store.exists("a/c")
    assert [i.key for i in store.list("a/")] == ["a/b"]
    upload = store.start_multipart("a/m")
    upload.write_part(1, b"xy")
    upload.complete([1])
    reader = store.open_ranged_reader("a/m")
    assert reader.read(0, 2) == b"xy"
    reader.close()
    assert list(store.pending_multiparts("a/")) == []
    store.delete("a/b")
    store.put_many([("a/p", b"1", None), ("a/q", b"2", {"k": "v"})])  # a PUT each
    assert store.get("a/q") == b"2"
    assert store.min_part_size == FilesystemStore.min_part_size
    assert store.root == tmp_path / "store"  # beyond the interface: the inner store's
    assert counts.snapshot() == {
        "put": 3,
        "get": 2,
        "get_range": 2,
        "head": 3,
        "list": 1,
        "start_multipart": 1,
        "write_part": 1,
        "complete": 1,
        "pending_multiparts": 1,
        "delete": 1,
    }
    assert by_class(counts.snapshot()) == {"LIST": 2, "GET": 4, "HEAD": 3, "PUT": 6, "DELETE": 1}
    assert sum(counts.snapshot_where().values()) == sum(counts.snapshot().values())


def test_keys_are_told_apart_by_kind() -> None:
    assert key_kind("public/default/t-partition-0/_meta/segments/0001-0002-abc") == "topic _meta/segments"
    assert key_kind("public/default/t-partition-0/_meta/") == "topic _meta/"
    assert key_kind("offload/public/default/t/_meta/commits/00000000000000000001") == "topic _meta/commits"
    assert key_kind("public/default/t-partition-0/0f3c-index") == "topic data"
    assert key_kind("_meta/writers/00000000000000000003") == "store _meta/writers"
    assert key_kind("offload/_meta/policies/") == "store _meta/policies"
    assert key_kind("offload/_control/requests/") == "store _control/requests"


def test_open_store_counts_only_when_the_environment_asks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV, raising=False)
    assert isinstance(open_store(str(tmp_path / "plain")), FilesystemStore)
    counts_dir = tmp_path / "counts"
    counts_dir.mkdir()
    script = (
        "from streamoffload.storage.location import open_store\n"
        f"s = open_store({str(tmp_path / 'store')!r})\n"
        "s.put('k', b'v'); s.get('k'); list(s.list(''))\n"
    )
    env = {**os.environ, ENV: str(counts_dir)}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    per = counts_by_process(counts_dir)
    assert len(per) == 1  # written at exit
    assert read_counts(counts_dir) == {"put": 1, "get": 1, "list": 1}


def test_a_counting_store_pickles(tmp_path: Path) -> None:
    import pickle

    store = pickle.loads(pickle.dumps(CountingStore(FilesystemStore(str(tmp_path / "store")), RequestCounts())))
    store.put("k", b"v")
    assert store.get("k") == b"v"
