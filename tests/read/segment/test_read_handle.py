"""The offloaded ReadHandle and TopicReader, on the filesystem store and on S3 (moto), with the same cases."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamoffload.checkpoints.metadata_store import MetadataStore
from streamoffload.codecs.blocks import BLOCK_HEADER_LENGTH
from streamoffload.codecs.errors import FormatError, LengthMismatchError, TruncatedError
from streamoffload.read.segment import (
    ChunkCache,
    EntryNotFoundError,
    MissingObjectError,
    SegmentKeys,
    SegmentReadHandle,
    TopicNotOffloadedError,
    UnsupportedFormatVersionError,
)
from streamoffload.read.topic_reader import TopicReader, parse_position
from streamoffload.storage.base import ObjectStore
from streamoffload.storage.filesystem import FilesystemStore
from streamoffload.storage.location import ScopedStore
from tests.read import TOPIC, History, flip_byte, offload, pulsar_entries, truncate

# Ledgers 3, 4, 7, 9, 12: the last two ledgers are offloaded ledger-based (v1), the rest streaming (v2).
LEDGERS = {3: 60, 4: 45, 7: 40, 9: 25, 12: 30}
SWITCH_AT = 160
BUF = 1000  # read buffer: smaller than most blocks, so entries straddle chunks


def readahead_threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name.startswith("streamoffload-readahead"))


@pytest.fixture(params=["filesystem", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> ObjectStore:
    if request.param == "filesystem":
        return FilesystemStore(tmp_path / "store", fsync=False)
    return request.getfixturevalue("s3_store")


@pytest.fixture
def history() -> History:
    return pulsar_entries(LEDGERS)


@pytest.fixture
def offloaded(store: ObjectStore, history: History) -> MetadataStore:
    return offload(ScopedStore(store), history, switch_at=SWITCH_AT)


def read_all(reader: TopicReader, *args: Any) -> list[tuple[int, int, bytes]]:
    return [(e.ledger_id, e.entry_id, bytes(e.payload)) for e in reader.read(TOPIC, *args)]


def test_reads_everything_back_byte_for_byte_across_segments_ledgers_and_formats(
    store: ObjectStore, history: History, offloaded: MetadataStore
) -> None:
    segments = offloaded.offloaded_segments(TOPIC)
    assert {s.formatVersion for s in segments} == {1, 2}
    assert len(segments) >= 5 and any(s.startLedgerId != s.endLedgerId for s in segments)
    results = {}
    for readahead in (True, False):
        with TopicReader(ScopedStore(store), read_buffer_size=BUF, readahead=readahead, cache=ChunkCache(0)) as reader:
            results[readahead] = read_all(reader)
            stats = reader.stats
        assert results[readahead] == history.expected
        # Ranged GETs of about the read buffer size, never one per entry.
        data = sum(s.dataLength for s in segments)
        assert stats.gets < len(history.entries)
        if isinstance(store, FilesystemStore):
            # Entry-aligned ranges: what is read twice (an unfinished entry at a range end) stays a fraction.
            assert data * 0.9 <= stats.bytes_fetched < data * 1.5
        else:
            # Back-to-back ranges over the network: every byte fetched once.
            assert stats.gets == sum(-(-s.dataLength // BUF) for s in segments)
            assert stats.bytes_fetched == data
        assert (stats.readahead_chunks > 0) is readahead
    assert results[True] == results[False]
    assert readahead_threads() == 0


def test_readahead_defaults_to_a_thread_for_remote_stores_only(store: ObjectStore, offloaded: MetadataStore) -> None:
    seg = offloaded.offloaded_segments(TOPIC)[0]
    with SegmentReadHandle.open(store, seg) as handle:
        # A filesystem object is read through one held descriptor, which the kernel reads ahead.
        assert handle.readahead is not isinstance(store, FilesystemStore)
    with SegmentReadHandle.open(store, seg, local_files=False) as handle:
        assert handle.readahead is True


def test_random_single_entry_reads(store: ObjectStore, history: History, offloaded: MetadataStore) -> None:
    rnd = random.Random(3)
    picks = rnd.sample(history.entries, 25)
    with TopicReader(ScopedStore(store), read_buffer_size=BUF, cache=ChunkCache(0)) as cold:
        for entry in picks:
            got = cold.read_entry(TOPIC, entry.position)
            assert (got.ledger_id, got.entry_id, bytes(got.payload)) == (entry.ledger_id, entry.entry_id, entry.payload)
    # After a sequential read the handles know where entries start: a random read then costs at most the
    # chunks of its entry plus one, never a walk from the block head.
    with TopicReader(ScopedStore(store), read_buffer_size=BUF, cache=ChunkCache(0)) as warm:
        read_all(warm)
        for entry in picks:
            before = warm.stats.gets
            got = warm.read_entry(TOPIC, entry.position)
            assert bytes(got.payload) == entry.payload
            assert warm.stats.gets - before <= len(entry.payload) // BUF + 2
    assert readahead_threads() == 0


def test_reads_from_the_middle_and_ranges_across_segments(
    store: ObjectStore, history: History, offloaded: MetadataStore
) -> None:
    expected = history.expected
    positions = history.positions()
    with TopicReader(ScopedStore(store), read_buffer_size=BUF) as reader:
        for i, j in [(0, 0), (37, 180), (59, 60), (104, 105), (150, len(positions) - 1), (len(positions) - 1, None)]:
            end = positions[j] if j is not None else None
            assert read_all(reader, positions[i], end) == expected[i : (j + 1 if j is not None else None)]
        # A start between ledgers (ledger 5 does not exist) begins with the next ledger; past the end, nothing.
        assert read_all(reader, (5, 0), (7, 2)) == [e for e in expected if (7, 0) <= e[:2] <= (7, 2)]
        assert read_all(reader, (12, 30)) == []
        assert read_all(reader, None, (3, 2)) == expected[:3]
        with pytest.raises(EntryNotFoundError, match="5:0"):
            reader.read_entry(TOPIC, (5, 0))
        with pytest.raises(EntryNotFoundError):
            reader.read_entry(TOPIC, (12, 30))


def test_handle_answers_like_pulsars_read_handle(
    store: ObjectStore, history: History, offloaded: MetadataStore
) -> None:
    v2 = next(
        s for s in offloaded.offloaded_segments(TOPIC) if s.formatVersion == 2 and s.startLedgerId != s.endLedgerId
    )
    v1 = next(s for s in offloaded.offloaded_segments(TOPIC) if s.formatVersion == 1)
    payloads = {(e.ledger_id, e.entry_id): e.payload for e in history.entries}
    with SegmentReadHandle.open(store, v2, read_buffer_size=BUF) as handle:
        assert handle.first_position == (v2.startLedgerId, v2.startEntryId)
        assert handle.last_position == (v2.endLedgerId, v2.endEntryId)
        assert handle.get_length() == v2.dataLength
        lid = v2.startLedgerId
        last = handle.last_add_confirmed(lid)
        got = handle.read(v2.startEntryId, last, lid)
        assert [bytes(e.payload) for e in got] == [payloads[(lid, i)] for i in range(v2.startEntryId, last + 1)]
        with pytest.raises(EntryNotFoundError, match="not all in segment"):
            handle.read(v2.startEntryId, last + 1, lid)
    # Without the manifest: keys only. A v1 object's ledger id comes from its name, its LAC from its index.
    keys = SegmentKeys(v1.dataKey, v1.indexKey)
    with SegmentReadHandle.open(store, keys, read_buffer_size=BUF) as handle:
        assert handle.ledger_ids == [v1.startLedgerId]
        assert handle.last_add_confirmed() == v1.endEntryId
        assert [e.position for e in handle.read_range()] == [
            p
            for p in history.positions()
            if (v1.startLedgerId, v1.startEntryId) <= p <= (v1.endLedgerId, v1.endEntryId)
        ]
    with SegmentReadHandle.open(store, SegmentKeys(v2.dataKey, v2.indexKey), read_buffer_size=BUF) as handle:
        assert handle.last_position == (v2.endLedgerId, v2.endEntryId)  # found by reading the last block


def test_read_objects_without_metadata(store: ObjectStore, history: History, offloaded: MetadataStore) -> None:
    segments = offloaded.offloaded_segments(TOPIC)
    with TopicReader(ScopedStore(store), read_buffer_size=BUF) as reader:
        got = []
        for seg in segments:
            got += [(e.ledger_id, e.entry_id, bytes(e.payload)) for e in reader.read_objects(seg.dataKey)]
    assert got == history.expected


def test_messages_of_read_entries(store: ObjectStore, history: History, offloaded: MetadataStore) -> None:
    with TopicReader(ScopedStore(store), read_buffer_size=BUF) as reader:
        for entry in reader.read(TOPIC, (7, 0), (9, 5)):
            sent = history.messages[entry.position]
            got = entry.messages()
            assert [bytes(m.payload) for m in got] == [m.payload for m in sent]
            assert [m.key for m in got] == [m.key for m in sent]
            assert [m.properties for m in got] == [m.properties for m in sent]
            assert [m.batch_index for m in got] == ([-1] if len(sent) == 1 else list(range(len(sent))))


def test_key_prefix(store: ObjectStore, history: History) -> None:
    offload(ScopedStore(store, "offload/cluster-a"), history, switch_at=SWITCH_AT)
    with TopicReader(ScopedStore(store, "offload/cluster-a"), read_buffer_size=BUF) as reader:
        assert read_all(reader) == history.expected
    with (
        TopicReader(ScopedStore(store, "other"), read_buffer_size=BUF) as reader,
        pytest.raises(TopicNotOffloadedError),
    ):
        reader.read(TOPIC)


def test_missing_topic_and_missing_index(store: ObjectStore, offloaded: MetadataStore) -> None:
    with TopicReader(ScopedStore(store), read_buffer_size=BUF) as reader:
        with pytest.raises(TopicNotOffloadedError, match="orders-partition-0"):
            reader.read("persistent://public/default/nope")
        seg = offloaded.offloaded_segments(TOPIC)[1]
        store.delete(seg.indexKey)
        with pytest.raises(MissingObjectError, match=r"index object .*-index .*is missing") as err:
            read_all(reader)
        assert err.value.key == seg.indexKey


def test_truncated_data_object(store: ObjectStore, offloaded: MetadataStore) -> None:
    seg = offloaded.offloaded_segments(TOPIC)[2]
    cut = seg.dataLength - 700
    truncate(store, seg.dataKey, cut)
    with TopicReader(ScopedStore(store), read_buffer_size=BUF) as reader, pytest.raises(TruncatedError) as err:
        read_all(reader)
    assert err.value.where == seg.dataKey and err.value.offset == cut
    assert seg.dataKey in str(err.value) and f"offset {cut}" in str(err.value)
    # Without the HEAD check the short read is caught where it happens, with the same key and offset.
    handle = SegmentReadHandle.open(store, seg, read_buffer_size=BUF, check_metadata=False, readahead=False)
    with pytest.raises(TruncatedError) as err:
        list(handle.read_range())
    assert err.value.where == seg.dataKey and err.value.offset == cut


def test_flipped_byte_in_a_block_header(store: ObjectStore, offloaded: MetadataStore) -> None:
    from streamoffload.codecs.index import OffloadIndex

    seg = next(s for s in offloaded.offloaded_segments(TOPIC) if s.blockCount > 2)
    index = OffloadIndex.decode(store.get(seg.indexKey), ledger_id=seg.startLedgerId)
    block = index.blocks()[2]
    flip_byte(store, seg.dataKey, block.offset + 15)  # inside the block length field
    with TopicReader(ScopedStore(store), read_buffer_size=BUF) as reader, pytest.raises(FormatError) as err:
        read_all(reader)
    assert err.value.where == seg.dataKey
    assert block.offset <= err.value.offset < block.offset + BLOCK_HEADER_LENGTH


def test_flipped_byte_in_an_entry_header(store: ObjectStore, offloaded: MetadataStore) -> None:
    seg = offloaded.offloaded_segments(TOPIC)[1]
    first_entry = BLOCK_HEADER_LENGTH  # the first entry header of the first block
    flip_byte(store, seg.dataKey, first_entry)  # the top byte of its length
    with TopicReader(ScopedStore(store), read_buffer_size=BUF) as reader, pytest.raises(LengthMismatchError) as err:
        read_all(reader)
    assert (err.value.where, err.value.offset) == (seg.dataKey, first_entry)
    assert readahead_threads() == 0


def test_format_version_metadata_is_checked(store: ObjectStore, offloaded: MetadataStore) -> None:
    seg = offloaded.offloaded_segments(TOPIC)[0]
    info = store.head(seg.dataKey)
    assert info.metadata["s3managedledgeroffloaderformatversion"] == "1"
    store.put(seg.dataKey, store.get(seg.dataKey), {**info.metadata, "s3managedledgeroffloaderformatversion": "2"})
    with pytest.raises(UnsupportedFormatVersionError, match="format version") as err:
        SegmentReadHandle.open(store, seg)
    assert err.value.where == seg.dataKey


class FlakyStore(ObjectStore):
    """Delegates to a store, records ranged GETs, and fails the one covering ``fail_at``."""

    def __init__(self, inner: ObjectStore, fail_at: int | None = None) -> None:
        self.inner = inner
        self.fail_at = fail_at
        self.gets: list[int] = []

    @property
    def url(self) -> str:
        return self.inner.url

    def get_range(self, key: str, start: int, length: int) -> bytes:
        self.gets.append(start)
        if self.fail_at is not None and start <= self.fail_at < start + length:
            raise OSError(f"injected failure reading {key} at {start}")
        return self.inner.get_range(key, start, length)

    def __getattr__(self, name: str) -> Callable[..., Any]:
        return getattr(self.inner, name)

    # The abstract methods, delegated.
    def put(self, *a: Any, **k: Any) -> Any:
        return self.inner.put(*a, **k)

    def get(self, key: str) -> bytes:
        return self.inner.get(key)

    def head(self, key: str) -> Any:
        return self.inner.head(key)

    def list(self, prefix: str) -> Iterator[Any]:
        return self.inner.list(prefix)

    def delete(self, key: str) -> None:
        self.inner.delete(key)

    def start_multipart(self, *a: Any, **k: Any) -> Any:
        return self.inner.start_multipart(*a, **k)

    def resume_multipart(self, *a: Any, **k: Any) -> Any:
        return self.inner.resume_multipart(*a, **k)

    def pending_multiparts(self, prefix: str) -> Iterator[Any]:
        return self.inner.pending_multiparts(prefix)


class RecordingStore(FlakyStore):
    """Delegates to a store and records every read request: (what, key)."""

    def __init__(self, inner: ObjectStore) -> None:
        super().__init__(inner)
        self.calls: list[tuple[str, str]] = []

    def head(self, key: str) -> Any:
        self.calls.append(("head", key))
        return self.inner.head(key)

    def get(self, key: str) -> bytes:
        self.calls.append(("get", key))
        return self.inner.get(key)

    def get_range(self, key: str, start: int, length: int) -> bytes:
        self.calls.append(("get_range", key))
        return self.inner.get_range(key, start, length)

    def open_ranged_reader(self, key: str, *, hold_open: bool = True) -> Any:
        self.calls.append(("open_ranged_reader", key))
        return self.inner.open_ranged_reader(key, hold_open=hold_open)


def test_open_does_the_io_and_the_constructor_none(store: ObjectStore, offloaded: MetadataStore) -> None:
    """Pulsar's ``BlobStoreBackedReadHandleImpl.open``: the factory HEADs both objects, reads the index and
    opens the data object; a handle built from what it opened reads the same entries, and building one asks
    the store for nothing."""
    seg = offloaded.offloaded_segments(TOPIC)[0]
    recording = RecordingStore(store)
    with SegmentReadHandle.open(recording, seg) as opened:
        assert recording.calls == [
            ("head", seg.dataKey),
            ("head", seg.indexKey),
            ("get_range", seg.indexKey),
            ("open_ranged_reader", seg.dataKey),
        ]
        expected = [(e.ledger_id, e.entry_id, bytes(e.payload)) for e in opened.read_range()]
        recording.calls.clear()
        built = SegmentReadHandle(
            recording,
            data_key=opened.data_key,
            index_key=opened.index_key,
            manifest=opened.manifest,
            index=opened.index,
            reader=store.open_ranged_reader(seg.dataKey),
            recorded=opened.recorded,
            cipher=None,
            transformed=False,
        )
        assert recording.calls == []
        with built:
            assert [(e.ledger_id, e.entry_id, bytes(e.payload)) for e in built.read_range()] == expected
    assert expected[0][:2] == (seg.startLedgerId, seg.startEntryId)
    assert expected[-1][:2] == (seg.endLedgerId, seg.endEntryId)


def _poll(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.005)


def _biggest_segment(meta: MetadataStore) -> Any:
    return max(meta.offloaded_segments(TOPIC), key=lambda s: s.dataLength)


def test_readahead_error_surfaces_in_the_reader_at_its_chunk(store: ObjectStore, offloaded: MetadataStore) -> None:
    seg = _biggest_segment(offloaded)
    flaky = FlakyStore(store, fail_at=seg.dataLength - 10)
    handle = SegmentReadHandle.open(flaky, seg, read_buffer_size=BUF, readahead=True, readahead_bytes=2 * BUF)
    read = []
    with pytest.raises(OSError, match="injected failure"):
        for entry in handle.read_range():
            read.append(entry.position)
    assert read and read[-1] < (seg.endLedgerId, seg.endEntryId)  # everything before the bad chunk came through
    assert handle.readahead_threads == 0 and readahead_threads() == 0


def test_readahead_is_bounded_and_stops_when_abandoned(store: ObjectStore, offloaded: MetadataStore) -> None:
    seg = _biggest_segment(offloaded)
    assert seg.dataLength >= 12 * BUF
    window = 3 * BUF
    handle = SegmentReadHandle.open(
        FlakyStore(store), seg, read_buffer_size=BUF, readahead=True, readahead_bytes=window
    )
    iterator = handle.read_range()
    first = next(iterator)
    assert first.position == (seg.startLedgerId, seg.startEntryId)
    # The consumer stalls: the read-ahead fills its window and parks.
    (prefetch,) = handle._prefetchers
    _poll(lambda: prefetch.ready_bytes >= prefetch.window)
    assert prefetch.ready_bytes < window + BUF  # it stops at the first range that reaches the window
    # What was read: the range being consumed, the window, and re-read tails; not the whole segment.
    assert handle.stats.bytes_fetched <= 2 * (window + 2 * BUF) < seg.dataLength
    iterator.close()  # abandoning the read stops the thread
    assert handle.readahead_threads == 0
    _poll(lambda: readahead_threads() == 0)
    handle.close()


def test_cache_is_shared_and_stays_within_its_bound(
    store: ObjectStore, history: History, offloaded: MetadataStore
) -> None:
    bound = 8 * BUF
    cache = ChunkCache(max_bytes=bound)
    with TopicReader(ScopedStore(store), read_buffer_size=BUF, cache=cache) as reader:
        # A catch-up scan does not fill the cache (it would only evict what random reads use).
        assert read_all(reader) == history.expected
        assert cache.current_bytes == 0
        # An entry the scan learned is read again with one GET of exactly its bytes.
        target = history.entries[-5]
        gets, fetched = reader.stats.gets, reader.stats.bytes_fetched
        assert bytes(reader.read_entry(TOPIC, target.position).payload) == target.payload
        assert (reader.stats.gets - gets, reader.stats.bytes_fetched - fetched) == (1, len(target.payload))
    # Single-entry reads of a reader that has learned nothing walk through chunks and fill the cache, within
    # its bound.
    with TopicReader(ScopedStore(store), read_buffer_size=BUF, cache=cache) as reader:
        for entry in random.Random(5).sample(history.entries, 30):
            assert bytes(reader.read_entry(TOPIC, entry.position).payload) == entry.payload
            assert cache.current_bytes <= bound
        stats = cache.stats()
        assert stats.evictions > 0 and 0 < stats.bytes <= bound and stats.misses > 0
    # Readers share it: a new reader walks the target's block from its head (it has learned no offsets) and
    # caches the chunks it returns the entry from; a second new reader finds those in the cache.
    gets = []
    for _ in range(2):
        with TopicReader(ScopedStore(store), read_buffer_size=BUF, cache=cache) as other:
            hits = cache.hits
            assert bytes(other.read_entry(TOPIC, target.position).payload) == target.payload
            gets.append(other.stats.gets)
            assert cache.current_bytes <= bound
    assert gets[1] < gets[0] and cache.hits > hits


def test_parse_position() -> None:
    assert parse_position("12:0") == (12, 0)
    for bad in ["12", "a:1", "1:-1", "1:2:3", ""]:
        with pytest.raises(ValueError, match="position"):
            parse_position(bad)


@pytest.fixture(scope="module")
def fs_history(tmp_path_factory: pytest.TempPathFactory) -> tuple[FilesystemStore, History]:
    store = FilesystemStore(tmp_path_factory.mktemp("prop") / "store", fsync=False)
    history = pulsar_entries({1: 50, 2: 40, 5: 50}, seed=11, max_payload=1500)
    offload(ScopedStore(store), history, switch_at=100)
    return store, history


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    buf=st.sampled_from([128, 300, 1000, 4096, 1 << 20]),
    readahead=st.booleans(),
    window=st.integers(0, 6),
    i=st.integers(0, 139),
    n=st.integers(0, 139),
    cache=st.sampled_from([0, 2000, 1 << 20]),
    remote=st.booleans(),
)
def test_any_range_reads_exactly_the_entries_in_it(
    fs_history: tuple[FilesystemStore, History],
    buf: int,
    readahead: bool,
    window: int,
    i: int,
    n: int,
    cache: int,
    remote: bool,
) -> None:
    # remote: the same files behind a store that is not a FilesystemStore, read as a remote store is
    # (back-to-back ranges, entries joined across them) instead of entry-aligned ranges.
    fs_store, history = fs_history
    store: ObjectStore = FlakyStore(fs_store) if remote else fs_store
    positions = history.positions()
    j = min(i + n, len(positions) - 1)
    with TopicReader(
        ScopedStore(store),
        read_buffer_size=buf,
        readahead=readahead,
        readahead_bytes=window * buf,
        cache=ChunkCache(cache),
    ) as reader:
        assert read_all(reader, positions[i], positions[j]) == history.expected[i : j + 1]
        entry = history.entries[(i * 7 + n) % len(positions)]
        assert bytes(reader.read_entry(TOPIC, entry.position).payload) == entry.payload
    assert readahead_threads() == 0


def test_a_topic_whose_only_manifests_are_corrupt_is_refused_naming_them(tmp_path: Path) -> None:
    """No readable segment, but manifests there: the error names each one and why (it said only that the
    topic had no offloaded segments, and listed the other topics)."""
    store = FilesystemStore(tmp_path / "store", fsync=False)
    scoped = ScopedStore(store)
    meta = offload(scoped, pulsar_entries({3: 10}))
    (key,) = [meta.manifest_key(m) for m in meta.offloaded_segments(TOPIC)]
    flip_byte(store, key, 20)
    (error,) = [c.error for c in meta.corrupt_manifests(TOPIC)]
    assert error.startswith(f"{key}: ")
    with TopicReader(scoped) as reader, pytest.raises(TopicNotOffloadedError) as err:
        reader.read(TOPIC)
    assert str(err.value) == (
        f"no readable offloaded segments for topic {TOPIC} in {scoped.describe()}: 1 manifest cannot be used: {error}"
    )
