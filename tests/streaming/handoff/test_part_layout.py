"""Part layouts and the sink's data plane, without Spark or a broker: the layouts the segmenter sends round-trip,
a part built from them is byte for byte the blocks ``codecs.blocks`` encodes, and an entry that is not the
one the segmenter saw (changed, resized, gone) fails its topic-partition with nothing written."""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamoffload.checkpoints.metadata_store import MetadataStore
from streamoffload.checkpoints.policy import OffloadPolicy
from streamoffload.codecs.blocks import BLOCK_HEADER_LENGTH, FormatVersion, encode_block, framed_entry_size
from streamoffload.codecs.checksums import BlockChecksums
from streamoffload.codecs.entry import crc32c
from streamoffload.errors import StreamOffloadError
from streamoffload.pulsar.exactly_once import DataLossError
from streamoffload.storage.filesystem import FilesystemStore
from streamoffload.storage.location import ScopedStore
from streamoffload.streaming.governance.quarantine import TopicFailedError
from streamoffload.streaming.handoff.entry import Entry
from streamoffload.streaming.handoff.part_layout import (
    BlockLayout,
    LayoutError,
    build_part,
    checksum_records,
    decode_layouts,
    encode_layouts,
    part_length,
    part_refs,
)
from streamoffload.streaming.segmenter.segmenter import run_segmenter
from streamoffload.streaming.segmenter.segmenter_model import CONTROL_SEAL, MemoryState
from streamoffload.streaming.sink.entry_fetch import EntryChangedError, EntryGoneError, MemoryFetcher, fetch, match
from streamoffload.streaming.sink.sink import SegmentSink
from tests.fixtures.entries import Published, holding, memory_sink, metas, triples
from tests.fixtures.readback import read_entries

TOPIC = "persistent://public/default/layout-partition-0"
U32 = 2**32 - 1
MIB = 1024 * 1024
I64 = st.integers(-(2**63), 2**63 - 1)


# --- encode_layouts / decode_layouts ------------------------------------------------------------------------


@st.composite
def block_layouts(draw: st.DrawFn) -> BlockLayout:
    ids = sorted(draw(st.lists(st.integers(0, 2**63 - 1), min_size=1, max_size=12, unique=True)))
    entries = tuple((i, draw(st.integers(0, U32)), draw(st.integers(0, U32))) for i in ids)
    exact = BlockLayout(0, entries).length
    padded = draw(st.one_of(st.just(0), st.integers(exact, 2**64 - 1)))
    return BlockLayout(draw(st.integers(0, 2**64 - 1)), entries, padded, (draw(I64), draw(I64)))


@given(blocks=st.lists(block_layouts(), max_size=6), data=st.data())
def test_layouts_round_trip_and_join_by_concatenation(blocks: list[BlockLayout], data: st.DataObject) -> None:
    encoded = encode_layouts(blocks)
    assert decode_layouts(encoded) == blocks
    assert b"".join(encode_layouts([b]) for b in blocks) == encoded  # a part's layouts join by ``+``
    # Positions and sizes only: a fixed record per block and 16 bytes per entry, whatever the entries weigh.
    overhead = {len(encode_layouts([b])) - 16 * len(b.entries) for b in blocks}
    assert len(overhead) <= 1
    if blocks:
        # Cut anywhere inside the last block record: refused, never a shorter part.
        last = len(encode_layouts(blocks[-1:]))
        cut = data.draw(st.integers(len(encoded) - last + 1, len(encoded) - 1))
        with pytest.raises(LayoutError):
            decode_layouts(encoded[:cut])


def test_refs_and_lengths_of_a_layout() -> None:
    exact = BlockLayout(7, ((4, 10, 1), (5, 0, 2)), after=(7, 3))
    padded = BlockLayout(8, ((0, 3, 3),), padded_to=4096, after=(7, 5))
    assert exact.length == BLOCK_HEADER_LENGTH + framed_entry_size(10) + framed_entry_size(0)
    assert padded.length == 4096 and exact.first_entry_id == 4
    assert part_length([exact, padded]) == exact.length + 4096
    assert part_refs([exact, padded]) == [Entry(7, 4, 10, 1), Entry(7, 5, 0, 2), Entry(8, 0, 3, 3)]


# --- build_part --------------------------------------------------------------------------------------------


def _layout(ledger: int, entries: list[tuple[int, bytes]], padded_to: int) -> BlockLayout:
    return BlockLayout(ledger, tuple((i, len(p), crc32c(p)) for i, p in entries), padded_to)


@settings(max_examples=60, deadline=None)
@given(
    version=st.sampled_from(list(FormatVersion)),
    padded=st.booleans(),
    blocks=st.lists(
        st.tuples(
            st.integers(0, 2**63 - 1),
            st.lists(st.tuples(st.integers(0, 50), st.binary(max_size=300)), min_size=1, max_size=6),
        ),
        min_size=1,
        max_size=4,
    ),
    slack=st.integers(0, 200),
)
def test_build_part_is_what_encode_block_encodes(
    version: FormatVersion, padded: bool, blocks: list[tuple[int, list[tuple[int, bytes]]]], slack: int
) -> None:
    layouts, payloads, expected = [], [], b""
    for ledger, raw in blocks:
        entries, entry_id = [], 0
        for gap, payload in raw:  # increasing ids, with gaps
            entries.append((entry_id, payload))
            entry_id += gap + 1
        exact = BLOCK_HEADER_LENGTH + sum(framed_entry_size(len(p)) for _, p in entries)
        block_length = exact + slack if padded else None
        layouts.append(_layout(ledger, entries, block_length or 0))
        payloads += [p for _, p in entries]
        expected += encode_block(version, ledger, entries, block_length)
    part = build_part(version, layouts, payloads)
    assert part == expected
    assert len(part) == part_length(layouts)
    assert build_part(version, decode_layouts(encode_layouts(layouts)), payloads) == expected


@settings(max_examples=50)
@given(blocks=st.lists(block_layouts(), min_size=1, max_size=6), first=st.integers(1, 1000), at=st.integers(0, 2**40))
def test_checksum_records_follow_the_blocks_of_a_part(blocks: list[BlockLayout], first: int, at: int) -> None:
    """One record per block, numbered from the part's first block, at the offsets the blocks take, holding
    the CRC-32C each layout carries (the source's, which the fetch checked)."""
    # Ledger ids and offsets are Java longs.
    blocks = [BlockLayout(b.ledger_id >> 1, b.entries, b.padded_to % 2**40, b.after) for b in blocks]
    records = checksum_records(blocks, first, at)
    assert [n for n, _ in records] == list(range(first, first + len(blocks)))
    offset = at
    for block, (_, raw) in zip(blocks, records, strict=True):
        record = BlockChecksums.decode(raw)
        assert (record.offset, record.ledger_id) == (offset, block.ledger_id)
        assert [record.crc_of(entry_id) for entry_id, _, _ in block.entries] == [crc for _, _, crc in block.entries]
        offset += block.length


def test_build_part_refuses_a_payload_count_that_is_not_the_layouts() -> None:
    layout = _layout(1, [(0, b"a"), (1, b"b")], 0)
    with pytest.raises(LayoutError, match="names 2 entries but 3 were fetched"):
        build_part(FormatVersion.V2, [layout], [b"a", b"b", b"c"])


# --- entry_fetch: match and MemoryFetcher ------------------------------------------------------------------


def _refs(entries: list[Published]) -> list[Entry]:
    return [Entry(e.ledger_id, e.entry_id, len(e.payload), crc32c(e.payload)) for e in entries]


ENTRIES = [Published(3, i, f"entry-{i}".encode() * 3) for i in range(6)] + [Published(5, 0, b"other ledger")]


def test_memory_fetcher_returns_the_named_entries_in_order() -> None:
    fetcher = holding(TOPIC, ENTRIES)
    named = [ENTRIES[1], ENTRIES[2], ENTRIES[4], ENTRIES[6]]
    assert fetch(fetcher, TOPIC, _refs(named), (3, 0)) == [e.payload for e in named]
    other = MemoryFetcher({TOPIC: {e.position: e.payload for e in ENTRIES}})
    assert fetch(other, TOPIC, _refs(named)) == [e.payload for e in named]


def test_a_changed_byte_names_the_entry() -> None:
    changed = bytearray(ENTRIES[2].payload)
    changed[5] ^= 0x01
    fetcher = holding(TOPIC, ENTRIES)
    fetcher.add(TOPIC, 3, 2, bytes(changed))
    with pytest.raises(EntryChangedError, match=r"entry 3:2 .*CRC-32C"):
        fetch(fetcher, TOPIC, _refs(ENTRIES[:4]))


def test_another_size_names_the_entry() -> None:
    fetcher = holding(TOPIC, ENTRIES)
    fetcher.add(TOPIC, 3, 4, ENTRIES[4].payload + b"!")
    with pytest.raises(EntryChangedError, match=r"entry 3:4 .*has 22 bytes, but the source read 21"):
        fetch(fetcher, TOPIC, _refs(ENTRIES))


def test_a_missing_entry_is_gone_and_data_loss() -> None:
    fetcher = holding(TOPIC, [e for e in ENTRIES if e.position != (3, 3)])
    with pytest.raises(EntryGoneError, match=r"entry 3:3, read by the source, is gone") as info:
        fetch(fetcher, TOPIC, _refs(ENTRIES))
    assert isinstance(info.value, DataLossError)
    # The last named entry missing at the end of the delivery, too.
    with pytest.raises(EntryGoneError, match="entry 5:0"):
        fetch(holding(TOPIC, ENTRIES[:-1]), TOPIC, _refs(ENTRIES))
    with pytest.raises(EntryGoneError, match="entry 3:0"):
        fetch(MemoryFetcher(), TOPIC, _refs(ENTRIES[:1]))


def test_match_skips_delivered_entries_it_was_not_asked_for() -> None:
    """A range read delivers every entry in ``(after, last]``; those the source skipped (a gap with
    ``failOnDataLoss=false``) are passed over, not an error."""
    delivered = [(e.position, e.payload) for e in ENTRIES]
    named = [ENTRIES[0], ENTRIES[3], ENTRIES[6]]
    assert match(TOPIC, _refs(named), iter(delivered), "test") == [e.payload for e in named]
    assert match(TOPIC, [], iter(delivered), "test") == []
    # It stops at the last named entry: what comes after is never read.
    consumed: list[tuple[int, int]] = []

    def counting() -> Any:
        for pos, data in delivered:
            consumed.append(pos)
            yield pos, data

    match(TOPIC, _refs(ENTRIES[:2]), counting(), "test")
    assert consumed == [(3, 0), (3, 1)]


# --- the sink: an entry that is not the one the segmenter saw ----------------------------------------------

POLICY = OffloadPolicy(managedLedgerOffloadMaxBlockSizeInBytes=4096, maxSizePerOffloadSegmentMbytes=1.0)


def _published(count: int = 40) -> list[Published]:
    rnd = random.Random(4)
    return [
        Published(3 if i < 25 else 4, i if i < 25 else i - 25, rnd.randbytes(rnd.randint(1, 400))) for i in range(count)
    ]


VICTIM = (3, 17)


def _changed(held: list[Published]) -> list[Published]:
    return [
        Published(*e.position, bytes([e.payload[0] ^ 0xFF]) + e.payload[1:]) if e.position == VICTIM else e
        for e in held
    ]


def _resized(held: list[Published]) -> list[Published]:
    return [Published(*e.position, e.payload + b"x") if e.position == VICTIM else e for e in held]


def _gone(held: list[Published]) -> list[Published]:
    return [e for e in held if e.position != VICTIM]


@pytest.mark.parametrize(
    ("mutate", "error"),
    [(_changed, EntryChangedError), (_resized, EntryChangedError), (_gone, EntryGoneError)],
    ids=["changed", "resized", "gone"],
)
def test_a_sink_fetching_other_bytes_writes_no_part_and_commits_nothing(
    tmp_path: Path, mutate: Any, error: type[Exception]
) -> None:
    store = FilesystemStore(tmp_path / "store", fsync=False)
    published = _published()
    # S3-sized parts: the segment's blocks go out as one part, at the seal.
    actions = run_segmenter(
        TOPIC, POLICY, MemoryState(), metas(published), [CONTROL_SEAL], now_ms=1_000, min_part_size=5 * MIB
    )
    assert [a.kind for a in actions] == ["open", "part", "seal", "stats"]
    sink = memory_sink(ScopedStore(store), fetcher=holding(TOPIC, mutate(published)))
    with pytest.raises(TopicFailedError) as info:
        sink.apply(list(actions))
    assert info.value.topic == TOPIC and isinstance(info.value.__cause__, error)
    assert "entry 3:17" in str(info.value)
    assert MetadataStore(ScopedStore(store)).offloaded_segments(TOPIC) == []
    assert list(store.root.rglob("part-*")) == [], "a part was written"
    assert list(store.root.rglob("*-crc-*")) == [], "a checksum record was written"
    assert not store.exists(actions[-2].data_key), "the data object was completed"

    # The same actions with the entries the segmenter saw: the segment is written as it should be.
    fresh = FilesystemStore(tmp_path / "fresh", fsync=False)
    memory_sink(ScopedStore(fresh), fetcher=holding(TOPIC, published)).apply(list(actions))
    assert read_entries(ScopedStore(fresh), TOPIC) == triples(published)


def test_a_sink_without_a_fetcher_refuses_to_write_a_part(tmp_path: Path) -> None:
    store = FilesystemStore(tmp_path, fsync=False)
    actions = run_segmenter(TOPIC, POLICY, MemoryState(), metas(_published(5)), [CONTROL_SEAL], now_ms=1_000)
    with pytest.raises(StreamOffloadError, match="no entry fetcher"):
        SegmentSink(ScopedStore(store)).apply(list(actions))
    assert MetadataStore(ScopedStore(store)).offloaded_segments(TOPIC) == []


# --- what a part asks the fetcher for ----------------------------------------------------------------------


class RecordingFetcher(MemoryFetcher):
    def __init__(self, entries: list[Published]) -> None:
        super().__init__({TOPIC: {e.position: e.payload for e in entries}})
        self.calls: list[tuple[tuple[int, int], list[tuple[int, int]]]] = []

    def stream(self, topic: str, after: tuple[int, int], end: tuple[int, int]) -> Iterator[tuple[Any, bytes]]:
        """Records each read: where it starts after, and the positions the sink took from it."""
        taken: list[tuple[int, int]] = []
        self.calls.append((after, taken))
        for position, data in super().stream(topic, after, end):
            taken.append(position)
            yield position, data


def test_each_part_fetches_after_the_entry_the_segmenter_saw_before_it(tmp_path: Path) -> None:
    """``after`` is the position just before the part's first entry as the source delivered them (a range read
    starts after it), across ledgers, gaps in entry ids, micro-batches and segments."""
    rnd = random.Random(8)
    published, ledger, entry = [], 2, 0
    for _ in range(160):
        published.append(Published(ledger, entry, rnd.randbytes(rnd.randint(1, 500))))
        entry += 1 + (rnd.random() < 0.1)  # a gap the source skipped
        if rnd.random() < 0.05:
            ledger, entry = ledger + rnd.randint(1, 3), rnd.randint(0, 2)
    fetcher = RecordingFetcher(published)
    store = FilesystemStore(tmp_path, fsync=False)
    sink = SegmentSink(ScopedStore(store), fetcher=fetcher)
    state = MemoryState()
    policy = OffloadPolicy(managedLedgerOffloadMaxBlockSizeInBytes=4096, maxSizePerOffloadSegmentMbytes=0.015)
    parts = applied = 0
    for i, start in enumerate(range(0, len(published), 23)):
        batch = metas(published[start : start + 23])
        parts += sink.apply(list(run_segmenter(TOPIC, policy, state, batch, now_ms=i, min_part_size=3000))).parts
        applied += 1
    seal = run_segmenter(TOPIC, policy, state, [], [CONTROL_SEAL], now_ms=99, min_part_size=3000)
    parts += sink.apply(list(seal)).parts
    applied += 1
    assert len(MetadataStore(ScopedStore(store)).offloaded_segments(TOPIC)) > 2

    before = {e.position: p.position for p, e in itertools.pairwise(published)}
    before[published[0].position] = (-1, -1)
    fetched = [pos for _, positions in fetcher.calls for pos in positions]
    assert fetched == [e.position for e in published], "every entry fetched once, in order"
    assert all(after == before[positions[0]] for after, positions in fetcher.calls)
    # Consecutive parts of one micro-batch share one read: at most one read per micro-batch.
    assert len(fetcher.calls) <= min(applied, parts)
    assert read_entries(ScopedStore(store), TOPIC) == triples(published)


# --- many topic-partitions at once ------------------------------------------------------------------------


def _topic_actions(topics: list[str], published: list[Published]) -> list[dict[str, Any]]:
    """Each topic-partition's open, parts and seal, interleaved as a micro-batch's rows are."""
    per_topic = [
        list(run_segmenter(t, POLICY, MemoryState(), metas(published), [CONTROL_SEAL], now_ms=1_000, min_part_size=1))
        for t in topics
    ]
    rows: list[dict[str, Any]] = []
    for i in range(max(len(p) for p in per_topic)):
        rows.extend(p[i] for p in per_topic if i < len(p))
    return rows


def test_a_sink_writes_many_topic_partitions_at_once_as_it_writes_them_one_by_one(tmp_path: Path) -> None:
    """Threads (one topic-partition each at a time) write the same objects, byte for byte, as one thread; a
    budget of one byte lets only one part be held at a time, and still everything is written."""
    published = _published()
    topics = [f"{TOPIC}-{i}" for i in range(12)]
    rows = _topic_actions(topics, published)
    written: dict[str, dict[str, bytes]] = {}
    for name, threads, budget in (("one", 1, 0), ("many", 8, 64 << 20), ("tight", 8, 1)):
        store = FilesystemStore(tmp_path / name, fsync=False)
        fetcher = MemoryFetcher({t: {e.position: e.payload for e in published} for t in topics})
        stats = SegmentSink(ScopedStore(store), fetcher=fetcher, threads=threads, part_budget=budget).apply(rows)
        assert len(stats.sealed) == len(topics) and stats.errors == 0
        for topic in topics:
            assert read_entries(ScopedStore(store), topic) == triples(published)
        written[name] = {
            str(p.relative_to(store.root)): p.read_bytes()
            for p in store.root.rglob("*")
            if p.is_file() and "_meta" not in p.parts
        }
    assert written["many"] == written["one"] == written["tight"]


def test_one_failing_topic_partition_does_not_stop_the_others(tmp_path: Path) -> None:
    published = _published()
    topics = [f"{TOPIC}-{i}" for i in range(6)]
    rows = _topic_actions(topics, published)
    victim = topics[2]
    entries = {t: {e.position: e.payload for e in (_changed(published) if t == victim else published)} for t in topics}
    store = FilesystemStore(tmp_path / "store", fsync=False)
    with pytest.raises(TopicFailedError) as info:
        SegmentSink(ScopedStore(store), fetcher=MemoryFetcher(entries), threads=4).apply(rows)
    assert info.value.topic == victim and isinstance(info.value.__cause__, EntryChangedError)
    assert MetadataStore(ScopedStore(store)).offloaded_segments(victim) == []
    for topic in topics:
        if topic != victim:
            assert read_entries(ScopedStore(store), topic) == triples(published)
