"""``ObjectStore.open_ranged_reader``: the filesystem store's reader (one held descriptor) and the default
reader built on ``get_range`` (S3 over a real moto server, and the filesystem store's own ``get_range``)
return the same bytes for the same ranges."""

from __future__ import annotations

import random
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from streamoffload.storage.base import ObjectNotFoundError, ObjectStore, RangedReader
from streamoffload.storage.filesystem import FilesystemStore
from streamoffload.storage.local_files import FileRangedReader
from streamoffload.storage.s3 import S3Store

KEY = "public/default/t/obj"
SIZE = 200_003  # not a multiple of anything below, so ranges end at odd places
RANGES = [
    (0, 0),
    (0, 1),
    (0, 4096),
    (1, 4095),
    (65_536, 65_536),
    (131_071, 2),
    (SIZE - 12, 12),
    (SIZE - 1, 1),
    (0, SIZE),
    (SIZE - 100, 1000),  # runs past the end: shorter, only at the end
    (SIZE, 10),
]


@pytest.fixture
def data() -> bytes:
    return random.Random(15).randbytes(SIZE)


@pytest.fixture
def fs_store(tmp_path: Path, data: bytes) -> FilesystemStore:
    store = FilesystemStore(tmp_path / "store", fsync=False)
    store.put(KEY, data)
    return store


@pytest.fixture
def s3_with_object(s3_bucket: str, s3_settings: dict[str, Any], data: bytes) -> Iterator[S3Store]:
    store = S3Store(s3_bucket, "pfx", **s3_settings)
    store.put(KEY, data)
    yield store
    store.close()


def read_all(reader: RangedReader) -> list[bytes]:
    try:
        return [reader.read(start, length) for start, length in RANGES]
    finally:
        reader.close()


@pytest.mark.s3
def test_the_held_descriptor_and_get_range_return_the_same_bytes_on_every_store(
    fs_store: FilesystemStore, s3_with_object: S3Store, data: bytes
) -> None:
    expected = [data[start : start + length] for start, length in RANGES]
    held = fs_store.open_ranged_reader(KEY)
    assert isinstance(held, FileRangedReader)
    s3 = s3_with_object.open_ranged_reader(KEY)
    assert type(s3) is RangedReader  # S3 keeps the default: one ranged GET per read
    readers = {
        "filesystem, held descriptor": held,
        "filesystem, get_range per read": fs_store.open_ranged_reader(KEY, hold_open=False),
        "filesystem, the default reader": RangedReader(fs_store, KEY),
        "s3": s3,
    }
    got = {name: read_all(reader) for name, reader in readers.items()}
    for name, ranges in got.items():
        assert ranges == expected, name
    assert got["s3"][-2] == data[SIZE - 100 :] and got["s3"][-1] == b""


@pytest.mark.s3
def test_each_reader_says_whether_reads_are_remote_and_whether_read_ahead_pays_off(
    fs_store: FilesystemStore, s3_with_object: S3Store
) -> None:
    def traits(store: ObjectStore, **kwargs: bool) -> tuple[bool, bool]:
        reader = store.open_ranged_reader(KEY, **kwargs)
        try:
            return reader.remote, reader.readahead
        finally:
            reader.close()

    # The kernel reads ahead through a held descriptor; nothing does for per-read opens or GETs.
    assert traits(fs_store) == (False, False)
    assert traits(fs_store, hold_open=False) == (False, True)
    assert traits(s3_with_object) == (True, True)
    assert traits(s3_with_object, hold_open=False) == (True, True)


def test_the_held_descriptor_reads_the_object_it_opened(fs_store: FilesystemStore, data: bytes) -> None:
    held = fs_store.open_ranged_reader(KEY)
    fresh = fs_store.open_ranged_reader(KEY, hold_open=False)
    try:
        assert held.read(10, 20) == fresh.read(10, 20) == data[10:30]
        fs_store.delete(KEY)
        assert held.read(SIZE - 5, 5) == data[-5:]  # the open file outlives its name
        with pytest.raises(ObjectNotFoundError):
            fresh.read(10, 20)
    finally:
        held.close()
        fresh.close()


@pytest.mark.s3
def test_a_missing_object_raises_object_not_found_from_every_reader(
    fs_store: FilesystemStore, s3_with_object: S3Store
) -> None:
    readers = [
        fs_store.open_ranged_reader("public/default/t/absent"),
        fs_store.open_ranged_reader("public/default/t/absent", hold_open=False),
        s3_with_object.open_ranged_reader("public/default/t/absent"),
    ]
    for reader in readers:
        with pytest.raises(ObjectNotFoundError):
            reader.read(0, 10)
        reader.close()


@pytest.mark.s3
@pytest.mark.parametrize("length", [64 * 1024 * 1024 + 1, 2**62])
def test_a_read_past_the_end_takes_no_more_memory_than_the_object_holds(
    tmp_path: Path, s3_bucket: str, s3_settings: dict[str, Any], length: int
) -> None:
    """A length read from a hostile manifest or index (the 64 MiB index cap plus one, or 2**62) asked of a
    2 KiB object: every reader returns the 2 KiB and allocates about that, not the length asked for (``os.pread``
    allocates its length before it reads)."""
    small = random.Random(52).randbytes(2048)
    fs = FilesystemStore(tmp_path / "store", fsync=False)
    fs.put(KEY, small)
    s3 = S3Store(s3_bucket, "pfx", **s3_settings)
    s3.put(KEY, small)
    try:
        reads = {
            "filesystem get_range": lambda: fs.get_range(KEY, 0, length),
            "filesystem, held descriptor": lambda: read_once(fs.open_ranged_reader(KEY), length),
            "filesystem, get_range per read": lambda: read_once(fs.open_ranged_reader(KEY, hold_open=False), length),
            "s3 get_range": lambda: s3.get_range(KEY, 0, length),
        }
        for name, read in reads.items():
            read()  # first uses (lazy imports, connections) are not the read's
            tracemalloc.start()
            try:
                assert read() == small, name
                assert fs.get_range(KEY, 1000, length) == small[1000:], name
                peak = tracemalloc.get_traced_memory()[1]
            finally:
                tracemalloc.stop()
            assert peak < 1024 * 1024, f"{name}: {peak} bytes"
    finally:
        s3.close()


def read_once(reader: RangedReader, length: int) -> bytes:
    try:
        return reader.read(0, length)
    finally:
        reader.close()
