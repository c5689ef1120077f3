"""The executor-local spool: what the source tasks spool the sink reads first, bounded, private, released
once written, and never trusted over the checks (a bad spool costs a broker read, never a wrong byte)."""

from __future__ import annotations

import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from streamoffload.checkpoints.policy import OffloadPolicy
from streamoffload.codecs.positions import Position
from streamoffload.storage.filesystem import FilesystemStore
from streamoffload.storage.location import ScopedStore
from streamoffload.storage.request_counts import CountingStore
from streamoffload.streaming.handoff import spool
from streamoffload.streaming.handoff.entry import Entry
from streamoffload.streaming.handoff.spool import SpoolFetcher, SpoolWriter, spool_bytes, spool_files
from streamoffload.streaming.segmenter.segmenter import run_segmenter
from streamoffload.streaming.segmenter.segmenter_model import CONTROL_SEAL, MemoryState
from streamoffload.streaming.sink.entry_fetch import EntryGoneError, FetchStats, MemoryFetcher, PartReader
from streamoffload.streaming.sink.sink import ByteBudget, SegmentSink, _plan_parts
from tests.fixtures.entries import Published, metas, triples
from tests.fixtures.readback import read_entries

TOPIC = "persistent://public/default/spooled-partition-0"
ENTRIES = [Published(4, i, bytes([i]) * (50 + i)) for i in range(20)] + [Published(6, 0, b"next ledger")]


class CountingFetcher(MemoryFetcher):
    """The broker: counts what the sink had to read from it."""

    def __init__(self) -> None:
        super().__init__({TOPIC: {e.position: e.payload for e in ENTRIES}})
        self.reads: list[tuple[tuple[int, int], tuple[int, int]]] = []

    def stream(self, topic, after, end):  # type: ignore[no-untyped-def]
        self.reads.append((after, end))
        yield from super().stream(topic, after, end)


def spool_range(root: Path, entries: list[Published], start: tuple[int, int], max_bytes: int = 1 << 20) -> None:
    writer = SpoolWriter(str(root), TOPIC, start, entries[-1].position, max_bytes)
    for e in entries:
        writer.add(e.ledger_id, e.entry_id, e.payload)
    writer.finish()


def refs(entries: list[Published]) -> list[Entry]:
    return [Entry(e.ledger_id, e.entry_id, e.meta.size, e.meta.crc32c) for e in entries]


def test_spooled_ranges_are_read_from_the_spool_and_the_rest_from_the_broker(tmp_path: Path) -> None:
    root = tmp_path / "spool"
    spool_range(root, ENTRIES[:10], (-1, -1))
    spool_range(root, ENTRIES[10:15], ENTRIES[9].position)
    broker = CountingFetcher()
    reader = PartReader(SpoolFetcher(str(root), broker))
    got = reader.take(TOPIC, refs(ENTRIES), (-1, -1), ENTRIES[-1].position)
    assert got == [e.payload for e in ENTRIES]
    assert broker.reads == [(ENTRIES[14].position, ENTRIES[-1].position)]  # only what no file held
    # Private: the spool holds topic data.
    assert stat.S_IMODE(root.stat().st_mode) == 0o700
    for spooled in spool_files(root, TOPIC):
        assert stat.S_IMODE(spooled.path.stat().st_mode) == 0o600


def test_entries_taken_from_the_spool_stay_readable_after_their_file_is_released(tmp_path: Path) -> None:
    """The spool hands out views of the mapped file (no copy): what the sink holds stays valid when the file is
    removed under it (the mapping outlives the name), and the file's descriptor and mapping go with the views."""
    root = tmp_path / "spool"
    spool_range(root, ENTRIES[:10], (-1, -1))
    fetcher = SpoolFetcher(str(root), CountingFetcher())
    got = PartReader(fetcher).take(TOPIC, refs(ENTRIES[:10]), (-1, -1), ENTRIES[9].position)
    assert all(isinstance(g, memoryview) and g.readonly for g in got)
    fetcher.release(TOPIC, ENTRIES[9].position)
    assert spool_files(root, TOPIC) == []
    assert [bytes(g) for g in got] == [e.payload for e in ENTRIES[:10]]


def test_release_removes_the_files_whose_entries_are_written(tmp_path: Path) -> None:
    root = tmp_path / "spool"
    spool_range(root, ENTRIES[:10], (-1, -1))
    spool_range(root, ENTRIES[10:], ENTRIES[9].position)
    fetcher = SpoolFetcher(str(root), CountingFetcher())
    fetcher.release(TOPIC, ENTRIES[12].position)
    assert [f.end for f in spool_files(root, TOPIC)] == [ENTRIES[-1].position]
    assert spool.topic_dir(root, TOPIC).is_dir()
    fetcher.release(TOPIC, ENTRIES[-1].position)
    assert spool_files(root, TOPIC) == [] and spool_bytes(root) == 0
    # The emptied directory goes with its last file (counting the spool walks every directory), and the
    # next range of the topic-partition makes it again.
    assert list(root.iterdir()) == []
    spool_range(root, ENTRIES[:3], (-1, -1))
    assert [f.end for f in spool_files(root, TOPIC)] == [ENTRIES[2].position]


def test_a_directory_with_a_range_being_written_is_not_removed(tmp_path: Path) -> None:
    """A sink releasing a topic-partition's last file while a source task spools its next range: the directory
    stays (the writer's temporary file is in it), and the range is published whole."""
    root = tmp_path / "spool"
    spool_range(root, ENTRIES[:10], (-1, -1))
    writer = SpoolWriter(str(root), TOPIC, ENTRIES[9].position, ENTRIES[-1].position, 1 << 20)
    SpoolFetcher(str(root), CountingFetcher()).release(TOPIC, ENTRIES[9].position)
    for e in ENTRIES[10:]:
        writer.add(e.ledger_id, e.entry_id, e.payload)
    writer.finish()
    fetcher = SpoolFetcher(str(root), CountingFetcher())
    assert [f.start for f in spool_files(root, TOPIC)] == [ENTRIES[9].position]
    got = PartReader(fetcher).take(TOPIC, refs(ENTRIES[10:]), ENTRIES[9].position, ENTRIES[-1].position)
    assert [bytes(g) for g in got] == [e.payload for e in ENTRIES[10:]] and fetcher.fallback.reads == []


def test_a_writer_whose_directory_was_removed_makes_it_again(tmp_path: Path) -> None:
    """The race the removal opens: the directory goes between a writer's check and its ``open``."""
    root = tmp_path / "spool"
    spool_range(root, ENTRIES[:1], (-1, -1))
    SpoolFetcher(str(root), CountingFetcher()).release(TOPIC, ENTRIES[0].position)
    assert not spool.topic_dir(root, TOPIC).exists()
    spool_range(root, ENTRIES[1:4], ENTRIES[0].position)
    assert [f.end for f in spool_files(root, TOPIC)] == [ENTRIES[3].position]


def test_the_spool_is_bounded_in_bytes(tmp_path: Path) -> None:
    root = tmp_path / "spool"
    spool_range(root, ENTRIES[:10], (-1, -1), max_bytes=400)  # ~750 bytes do not fit: nothing is spooled
    assert spool_files(root, TOPIC) == [] and spool_bytes(root) == 0
    spool_range(root, ENTRIES[:3], (-1, -1), max_bytes=400)
    assert len(spool_files(root, TOPIC)) == 1
    spool_range(root, ENTRIES[3:6], ENTRIES[2].position, max_bytes=spool_bytes(root))  # full: not spooled
    assert len(spool_files(root, TOPIC)) == 1
    broker = CountingFetcher()
    got = PartReader(SpoolFetcher(str(root), broker)).take(TOPIC, refs(ENTRIES[:6]), (-1, -1), ENTRIES[5].position)
    assert got == [e.payload for e in ENTRIES[:6]]
    assert broker.reads == [(ENTRIES[2].position, ENTRIES[5].position)]


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_a_damaged_spool_file_costs_a_broker_read_never_a_wrong_byte(tmp_path: Path, damage: str) -> None:
    root = tmp_path / "spool"
    spool_range(root, ENTRIES[:10], (-1, -1))
    [spooled] = spool_files(root, TOPIC)
    data = bytearray(spooled.path.read_bytes())
    if damage == "flip":
        data[len(data) // 2] ^= 0x01
    else:
        del data[-7:]
    spooled.path.write_bytes(bytes(data))
    broker = CountingFetcher()
    got = PartReader(SpoolFetcher(str(root), broker)).take(TOPIC, refs(ENTRIES[:10]), (-1, -1), ENTRIES[9].position)
    assert got == [e.payload for e in ENTRIES[:10]]
    assert broker.reads  # the broker was asked


def test_an_entry_neither_holds_is_gone(tmp_path: Path) -> None:
    root = tmp_path / "spool"
    spool_range(root, ENTRIES[:5], (-1, -1))
    empty = MemoryFetcher()
    with pytest.raises(EntryGoneError, match="entry 4:0"):  # the part is asked of the broker again, whole
        PartReader(SpoolFetcher(str(root), empty)).take(TOPIC, refs(ENTRIES[:8]), (-1, -1), ENTRIES[7].position)


def test_the_spool_is_counted_again_when_old_or_half_full(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A task counts the spool's files at most once a second while it is under half its bound (a count is a
    ``stat`` per file); what other tasks spooled is seen once the count is older, and near the bound always."""
    clock = [100.0]
    monkeypatch.setattr(spool.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(spool, "_USAGE", spool._SpoolUsage(max_age_s=1.0))
    root = tmp_path / "spool"
    spool_range(root, ENTRIES[:3], (-1, -1), max_bytes=10_000)
    counted = spool_bytes(root)
    foreign = root / "other-topic"
    foreign.mkdir()
    (foreign / "x.spool").write_bytes(b"x" * 5_000)  # another task's range, not counted by this one yet
    assert spool._USAGE.room(root, 10_000) == 10_000 - counted
    clock[0] += 1.5
    assert spool._USAGE.room(root, 10_000) == 10_000 - counted - 5_000
    # Past half the bound, every range counts again, however recent the last count.
    (foreign / "y.spool").write_bytes(b"y" * 100)
    assert spool._USAGE.room(root, 10_000) == 10_000 - counted - 5_100


def test_the_sink_releases_the_spool_files_of_the_parts_it_wrote(tmp_path: Path) -> None:
    """The sink tells a fetcher that keeps entries (``ReleasingFetcher``: the spool) which it has written: the files
    of a sealed segment's entries go, those of entries the segmenter holds for a later part stay."""
    root = tmp_path / "spool"
    spool_range(root, ENTRIES[:10], (-1, -1))
    spool_range(root, ENTRIES[10:], ENTRIES[9].position)
    broker = CountingFetcher()
    scoped = ScopedStore(FilesystemStore(str(tmp_path / "store")))
    sink = SegmentSink(scoped, SpoolFetcher(str(root), broker))
    policy = OffloadPolicy(managedLedgerOffloadMaxBlockSizeInBytes=4096)
    state = MemoryState()
    sink.apply(run_segmenter(TOPIC, policy, state, metas(ENTRIES[:10]), [CONTROL_SEAL], now_ms=1, min_part_size=1))
    assert [f.end for f in spool_files(root, TOPIC)] == [ENTRIES[-1].position]
    sink.apply(run_segmenter(TOPIC, policy, state, metas(ENTRIES[10:]), [CONTROL_SEAL], now_ms=2, min_part_size=1))
    assert spool_files(root, TOPIC) == []
    assert broker.reads == []  # every entry came from the spool
    assert read_entries(scoped, TOPIC) == triples(ENTRIES)


class StatsFetcher(MemoryFetcher):
    """The broker as ``BrokerFetcher`` counts it (``stats``: entries delivered, reads opened)."""

    def __init__(self) -> None:
        super().__init__({TOPIC: {e.position: e.payload for e in ENTRIES}})
        self.stats = FetchStats()

    def stream(self, topic: str, after: Position, end: Position) -> Iterator[tuple[Position, bytes]]:
        self.stats.reads += 1
        for position, data in super().stream(topic, after, end):
            self.stats.entries += 1
            yield position, data


def test_the_sink_reports_what_came_from_the_spool_and_what_from_the_broker(tmp_path: Path) -> None:
    """``SinkStats`` counts the entries the spool served and those (and the reads) its fallback, the broker, did;
    a fetcher that counts nothing (``MemoryFetcher``) reports none."""
    root = tmp_path / "spool"
    spool_range(root, ENTRIES[:12], (-1, -1))
    broker = StatsFetcher()
    scoped = ScopedStore(FilesystemStore(str(tmp_path / "store")))
    sink = SegmentSink(scoped, SpoolFetcher(str(root), broker))
    policy = OffloadPolicy(managedLedgerOffloadMaxBlockSizeInBytes=4096)
    stats = sink.apply(run_segmenter(TOPIC, policy, MemoryState(), metas(ENTRIES), [CONTROL_SEAL], now_ms=1))
    assert (stats.spooled_entries, stats.broker_entries, stats.broker_reads) == (12, len(ENTRIES) - 12, 1)
    assert read_entries(scoped, TOPIC) == triples(ENTRIES)

    plain = SegmentSink(ScopedStore(FilesystemStore(str(tmp_path / "other"))), CountingFetcher())
    stats = plain.apply(run_segmenter(TOPIC, policy, MemoryState(), metas(ENTRIES), [CONTROL_SEAL], now_ms=1))
    assert (stats.spooled_entries, stats.broker_entries, stats.broker_reads) == (0, 0, 0) and stats.parts > 0


def test_holds_says_whether_the_files_cover_a_range(tmp_path: Path) -> None:
    root = tmp_path / "spool"
    fetcher = SpoolFetcher(str(root), CountingFetcher())
    assert not fetcher.holds(TOPIC, (-1, -1), ENTRIES[0].position)  # no files yet
    spool_range(root, ENTRIES[10:15], ENTRIES[9].position)
    assert not fetcher.holds(TOPIC, (-1, -1), ENTRIES[12].position)  # a gap before the file
    assert fetcher.holds(TOPIC, ENTRIES[9].position, ENTRIES[14].position)
    assert fetcher.holds(TOPIC, ENTRIES[11].position, ENTRIES[13].position)  # within it
    spool_range(root, ENTRIES[:10], (-1, -1))
    assert fetcher.holds(TOPIC, (-1, -1), ENTRIES[14].position)  # two files end to end
    assert not fetcher.holds(TOPIC, (-1, -1), ENTRIES[15].position)  # one entry past them


class RecordingBudget(ByteBudget):
    def __init__(self) -> None:
        super().__init__(1)
        self.asked: list[int] = []

    def hold(self, size: int):  # type: ignore[no-untyped-def]
        self.asked.append(size)
        return super().hold(size)


def test_parts_mapped_from_the_spool_hold_none_of_the_sinks_byte_budget(tmp_path: Path) -> None:
    """A part whose entries the spool holds makes no copy of them: it takes nothing of the budget, so parts of
    several topic-partitions are written at once however large; one read from the broker holds its length."""
    policy = OffloadPolicy(managedLedgerOffloadMaxBlockSizeInBytes=256)
    # Parts of an open segment (a segment sealed in the same batch is written whole, in one request).
    actions = run_segmenter(TOPIC, policy, MemoryState(), metas(ENTRIES), [], now_ms=1, min_part_size=1)
    planned = _plan_parts(actions)
    spooled_to = ENTRIES[14].position
    expected = [0 if planned[i].last <= spooled_to else actions[i].length for i in sorted(planned)]
    assert 0 in expected and any(expected)  # parts of both kinds
    root = tmp_path / "spool"
    spool_range(root, ENTRIES[:15], (-1, -1))
    scoped = ScopedStore(FilesystemStore(str(tmp_path / "store")))
    sink = SegmentSink(scoped, SpoolFetcher(str(root), CountingFetcher()))
    sink.budget = budget = RecordingBudget()
    sink.apply(actions)
    assert budget.asked == expected
    plain = SegmentSink(ScopedStore(FilesystemStore(str(tmp_path / "other"))), CountingFetcher())
    plain.budget = held = RecordingBudget()
    plain.apply(actions)
    assert held.asked == [actions[i].length for i in sorted(planned)]  # from the broker: each its length


class CopyingStore(FilesystemStore):
    """A store whose part writes copy their bytes, as an S3 body does."""

    copies_parts = True


def test_parts_mapped_from_the_spool_hold_their_length_where_the_store_copies_them(tmp_path: Path) -> None:
    """An S3 part is a copy of its buffers while it is sent: mapped from the spool or not, it holds its length,
    so 32 threads never hold 32 blocks' copies at once."""
    policy = OffloadPolicy(managedLedgerOffloadMaxBlockSizeInBytes=256)
    actions = run_segmenter(TOPIC, policy, MemoryState(), metas(ENTRIES), [], now_ms=1, min_part_size=1)
    planned = _plan_parts(actions)
    root = tmp_path / "spool"
    spool_range(root, ENTRIES, (-1, -1))
    sink = SegmentSink(ScopedStore(CopyingStore(str(tmp_path / "store"))), SpoolFetcher(str(root), CountingFetcher()))
    sink.budget = budget = RecordingBudget()
    sink.apply(actions)
    assert budget.asked == [actions[i].length for i in sorted(planned)]
    assert CountingStore(CopyingStore(str(tmp_path / "other"))).copies_parts  # a wrapper says what its store does
