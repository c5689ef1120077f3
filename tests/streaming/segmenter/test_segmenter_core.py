"""The segmenter and sink without Spark: entries in, objects and manifests out, on a real store."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from streamoffload.checkpoints import manifest as mf
from streamoffload.checkpoints.metadata_store import MetadataStore
from streamoffload.checkpoints.policy import OffloadPolicy
from streamoffload.codecs.blocks import iter_blocks
from streamoffload.codecs.errors import EntryTooLargeError
from streamoffload.codecs.index import OffloadIndex
from streamoffload.codecs.metadata import parse_ledger_info
from streamoffload.storage.filesystem import FilesystemStore
from streamoffload.storage.location import ScopedStore
from streamoffload.streaming.handoff.actions import PartAction, StatsAction
from streamoffload.streaming.handoff.entry import Entry
from streamoffload.streaming.handoff.part_layout import decode_layouts, encode_layouts, part_length
from streamoffload.streaming.segmenter.segmenter import rollover_start, run_segmenter
from streamoffload.streaming.segmenter.segmenter_model import CONTROL_SEAL, MemoryState
from streamoffload.streaming.sink.sink import SegmentSink
from tests.fixtures.entries import Published, fetcher_of, memory_sink, metas, publish_to, triples

TOPIC = "persistent://public/default/orders-partition-0"


def policy(**overrides: object) -> OffloadPolicy:
    base = dict(
        managedLedgerOffloadMaxBlockSizeInBytes=4096,
        maxSizePerOffloadSegmentMbytes=20_000 / (1024 * 1024),
        maxOffloadSegmentRolloverTimeMinutes=1.0,
        offloadBufferMaxBytes=1 << 20,
    )
    base.update(overrides)
    return OffloadPolicy(**base)  # type: ignore[arg-type]


def published_for(ledgers: dict[int, int], seed: int = 1) -> list[Published]:
    rnd = random.Random(seed)
    out = []
    for ledger, count in ledgers.items():
        for entry_id in range(count):
            out.append(Published(ledger, entry_id, rnd.randbytes(rnd.randint(0, 700)), 1000 + entry_id))
    return out


def apply(sink: SegmentSink, actions: list) -> None:
    sink.apply(actions)


def read_back(store: FilesystemStore, meta: MetadataStore) -> list[tuple[int, int, bytes]]:
    out = []
    for manifest in meta.offloaded_segments(TOPIC):
        data = store.get(manifest.dataKey)
        ledger = manifest.startLedgerId if manifest.formatVersion == 1 else None
        index = OffloadIndex.decode(store.get(manifest.indexKey), ledger_id=ledger)
        assert index.data_object_length == len(data) == manifest.dataLength
        for block in iter_blocks(data):
            ledger_id = block.header.ledger_id if block.header.ledger_id is not None else manifest.startLedgerId
            loc = index.lookup(ledger_id, block.header.first_entry_id)
            assert loc.offset == block.offset
            out.extend((ledger_id, e.entry_id, bytes(e.payload)) for e in block.entries)
    return out


@pytest.fixture
def env(tmp_path: Path) -> tuple[FilesystemStore, MetadataStore, SegmentSink, MemoryState]:
    store = FilesystemStore(tmp_path / "store")
    return store, MetadataStore(ScopedStore(store)), memory_sink(ScopedStore(store)), MemoryState()


def published_to(sink: SegmentSink, ledgers: dict[int, int], seed: int = 1) -> tuple[list[Entry], list[tuple]]:
    """``published_for``'s entries, their bytes put where ``sink`` fetches them: what the segmenter sees, and
    what reading the offloaded topic back must give."""
    published = published_for(ledgers, seed)
    return publish_to(sink, TOPIC, published), triples(published)


def part_bytes(action: PartAction) -> int:
    """The length of the part an action writes (it holds the blocks' layouts, not their bytes)."""
    length = part_length(decode_layouts(action.layouts))
    assert action.length == length
    return length


def test_streaming_segments_hold_every_entry_once_within_the_size_bound(env: tuple) -> None:
    store, meta, sink, state = env
    entries, expected = published_to(sink, {3: 120, 4: 40, 7: 25})
    pol = policy()
    # Deliver in uneven micro-batches, with duplicates, as the source may after a broker fault.
    now = 10_000
    for start in range(0, len(entries), 37):
        batch = entries[start : start + 37] + entries[max(0, start - 3) : start]
        apply(sink, run_segmenter(TOPIC, pol, state, batch, now_ms=now))
        now += 100
    apply(sink, run_segmenter(TOPIC, pol, state, [], [CONTROL_SEAL], now_ms=now))

    assert read_back(store, meta) == expected
    segments = meta.offloaded_segments(TOPIC)
    assert len(segments) > 3
    for seg in segments:
        assert seg.dataLength <= pol.max_segment_bytes
        assert seg.formatVersion == 2
    assert [s.ordinal for s in segments] == list(range(len(segments)))
    # Segments chain: each starts right after the previous one ends.
    reasons = [s.sealReason for s in segments]
    assert reasons[:-1] == ["size"] * (len(segments) - 1) and reasons[-1] == "manual"
    # The ledger view lists every segment holding part of a ledger (PIP-76 OffloadContext).
    ledgers = meta.ledgers(TOPIC)
    assert [info.ledgerId for info in ledgers] == [3, 4, 7]
    assert sum(info.entries for info in ledgers) == len(entries)


def test_rollover_by_time_seals_without_new_entries(env: tuple) -> None:
    _store, meta, sink, state = env
    pol = policy(maxOffloadSegmentRolloverTimeMinutes=0.5)  # 30 s
    entries, _ = published_to(sink, {1: 5})
    apply(sink, run_segmenter(TOPIC, pol, state, entries, now_ms=0))
    apply(sink, run_segmenter(TOPIC, pol, state, [], now_ms=29_999))
    assert meta.offloaded_segments(TOPIC) == []
    apply(sink, run_segmenter(TOPIC, pol, state, [], now_ms=30_000))
    [seg] = meta.offloaded_segments(TOPIC)
    assert seg.sealReason == "time" and seg.entries == 5


def test_rollover_counts_from_the_first_entrys_publish_time_on_a_live_topic(env: tuple) -> None:
    """Read 1.5 s after it was published (the next trigger), the entry is readable about the rollover time
    after it was published, not 1.5 s later."""
    _store, meta, sink, state = env
    pol = policy(maxOffloadSegmentRolloverTimeMinutes=0.5)  # 30 s
    live = [Published(e.ledger_id, e.entry_id, e.payload, 98_500 + e.entry_id) for e in published_for({1: 5})]
    apply(sink, run_segmenter(TOPIC, pol, state, publish_to(sink, TOPIC, live), now_ms=100_000))
    apply(sink, run_segmenter(TOPIC, pol, state, [], now_ms=128_499))
    assert meta.offloaded_segments(TOPIC) == []
    apply(sink, run_segmenter(TOPIC, pol, state, [], now_ms=128_500))
    [seg] = meta.offloaded_segments(TOPIC)
    assert seg.sealReason == "time" and seg.entries == 5


@pytest.mark.parametrize(
    ("published", "rollover_ms", "starts"),
    [
        (98_500, 30_000, 98_500),  # live: its publish time
        (1_000, 30_000, 90_000),  # a backlog: at most 10 s early, so backlog segments are not due at once
        (90_000, 5_000, 97_500),  # at most half a short rollover early
        (0, 30_000, 100_000),  # no publish time: when it was read
        (100_400, 30_000, 100_000),  # a producer clock ahead: never later than when it was read
    ],
)
def test_rollover_start(published: int, rollover_ms: int, starts: int) -> None:
    assert rollover_start(published, 100_000, rollover_ms) == starts


def test_a_v2_index_counts_a_ledgers_entries_from_entry_0_as_pulsar_does(env: tuple) -> None:
    """Pulsar's LedgerInfo.entries is the ledger's entry count from entry 0 (its streaming reader takes
    entries - 1 of a ledger's last index as the last entry), so a segment that holds entries 40..59 of a
    ledger says 60, not 20."""
    store, meta, sink, state = env
    entries, _expected = published_to(sink, {3: 120, 4: 40})
    apply(sink, run_segmenter(TOPIC, policy(), state, entries, now_ms=10_000))
    apply(sink, run_segmenter(TOPIC, policy(), state, [], [CONTROL_SEAL], now_ms=10_100))
    said: list[tuple[int, int, int, int]] = []  # (ledger, first entry, last entry, LedgerInfo.entries)
    for manifest in meta.offloaded_segments(TOPIC):
        index = OffloadIndex.decode(store.get(manifest.indexKey))
        for info in manifest.ledgers:
            first = manifest.startEntryId if info.ledgerId == manifest.startLedgerId else 0
            entries_said = parse_ledger_info(index.ledger(info.ledgerId).metadata).entries
            said.append((info.ledgerId, first, first + info.entries - 1, entries_said))
    assert len({ledger for ledger, first, _last, _said in said if first > 0}) >= 1, said
    assert [s for s in said if s[3] != s[2] + 1] == []


def test_ledger_mode_writes_one_v1_object_per_ledger_and_method_switch_seals(env: tuple) -> None:
    store, meta, sink, state = env
    entries, expected = published_to(sink, {1: 30, 2: 30, 3: 30, 4: 10})
    apply(sink, run_segmenter(TOPIC, policy(), state, entries[:45], now_ms=0))  # streaming: ledger 1 + half of 2
    apply(sink, run_segmenter(TOPIC, policy(method="ledger"), state, entries[45:], now_ms=1))
    apply(sink, run_segmenter(TOPIC, policy(method="ledger"), state, [], [CONTROL_SEAL], now_ms=2))
    segments = meta.offloaded_segments(TOPIC)
    assert [s.sealReason for s in segments][:1] == ["method-switch"] or segments[0].sealReason == "size"
    v1 = [s for s in segments if s.formatVersion == 1]
    assert [(s.startLedgerId, s.endLedgerId) for s in v1] == [(2, 2), (3, 3), (4, 4)]
    assert v1[0].startEntryId == 15 and v1[1].startEntryId == 0
    assert all("-ledger-" in s.dataKey for s in v1)
    assert read_back(store, meta) == expected


def test_replayed_batch_is_idempotent(env: tuple) -> None:
    store, meta, sink, state = env
    entries, expected = published_to(sink, {1: 100})
    pol = policy()
    apply(sink, run_segmenter(TOPIC, pol, state, entries[:50], now_ms=0))
    saved = (state.state, list(state.block), list(state.held))
    actions = run_segmenter(TOPIC, pol, state, entries[50:], [CONTROL_SEAL], now_ms=5)
    apply(sink, actions[: len(actions) // 2])  # crash midway through the sink
    state.state, state.block, state.held = saved  # Spark reloads the previous state version
    replay = run_segmenter(TOPIC, pol, state, entries[50:], [CONTROL_SEAL], now_ms=5)
    assert replay == actions
    apply(memory_sink(ScopedStore(store), fetcher=fetcher_of(sink)), replay)  # a new executor process
    apply(memory_sink(ScopedStore(store), fetcher=fetcher_of(sink)), replay)  # and a second replay after success
    assert read_back(store, meta) == expected
    assert all(m.status == mf.OFFLOADED for m in meta.manifests(TOPIC))
    assert meta.cleanup(TOPIC, grace_ms=0).total == 0


def test_s3_sized_parts_hold_blocks_until_the_minimum(env: tuple) -> None:
    _store, _meta, _sink, state = env
    entries = metas(published_for({1: 200}))  # no sink here: the segmenter alone
    actions = run_segmenter(TOPIC, policy(), state, entries, [CONTROL_SEAL], now_ms=0, min_part_size=10_000)
    segments = {a.segment for a in actions if a.kind == "seal"}
    assert len(segments) > 2
    for segment in segments:
        parts = [a for a in actions if isinstance(a, PartAction) and a.segment == segment]
        assert all(part_bytes(p) >= 10_000 for p in parts[:-1])
        assert [p.part_number for p in parts] == list(range(1, len(parts) + 1))


def test_entry_larger_than_a_block_is_a_clear_error(env: tuple) -> None:
    _, _, _, state = env
    big = Entry.of(1, 0, b"x" * 5000)
    with pytest.raises(EntryTooLargeError, match="managedLedgerOffloadMaxBlockSizeInBytes"):
        run_segmenter(TOPIC, policy(), state, [big], now_ms=0)


def test_deletion_waits_for_every_ledger_of_a_segment(env: tuple) -> None:
    store, meta, sink, state = env
    entries, _ = published_to(sink, {1: 10, 2: 10, 3: 10})
    pol = policy(maxSizePerOffloadSegmentMbytes=1.0)
    apply(sink, run_segmenter(TOPIC, pol, state, entries[:15], [CONTROL_SEAL], now_ms=0))  # ledgers 1-2
    apply(sink, run_segmenter(TOPIC, pol, state, entries[15:], [CONTROL_SEAL], now_ms=1))  # ledgers 2-3
    first, second = meta.offloaded_segments(TOPIC)
    meta.mark_ledger_deleted(TOPIC, 1, "test", at_ms=0)
    assert meta.apply_deletions(TOPIC, lag_ms=0, at_ms=10) == []
    meta.mark_ledger_deleted(TOPIC, 2, "test", at_ms=0)
    assert [mf.manifest_uuid(m) for m in meta.apply_deletions(TOPIC, lag_ms=0, at_ms=10)] == [mf.manifest_uuid(first)]
    assert not store.exists(first.dataKey) and not store.exists(first.indexKey)
    assert store.exists(second.dataKey)
    assert [mf.manifest_uuid(m) for m in meta.offloaded_segments(TOPIC)] == [mf.manifest_uuid(second)]


def state_bytes(state: MemoryState) -> int:
    """Entry and block bytes the segmenter's state store describes (the open block's entries, the blocks
    held back), once checked that it holds their positions and sizes only, never an entry's bytes."""
    for item in state.block:
        assert isinstance(item, Entry), f"not an entry's metadata: {item!r}"
    for layout in state.held:
        assert encode_layouts(decode_layouts(layout)) == layout, "a held block is not a layout"
    return sum(e.size for e in state.block) + sum(part_length(decode_layouts(b)) for b in state.held)


def test_under_a_backlog_entry_bytes_never_reach_the_state_store(env: tuple) -> None:
    store, meta, sink, state = env
    entries, expected = published_to(sink, {1: 150, 2: 150})
    pol = policy(maxSizePerOffloadSegmentMbytes=1.0)
    min_part = 10_000
    for start in range(0, len(entries), 60):  # every batch carries more than one minimum part
        actions = run_segmenter(TOPIC, pol, state, entries[start : start + 60], now_ms=start, min_part_size=min_part)
        apply(sink, actions)
        assert state_bytes(state) == 0, f"batch at {start}: entries were left in state"
        assert any(a.kind == "part" for a in actions)
    apply(sink, run_segmenter(TOPIC, pol, state, [], [CONTROL_SEAL], now_ms=10_000, min_part_size=min_part))
    assert read_back(store, meta) == expected


def test_state_holds_less_than_one_minimum_part_and_parts_meet_the_minimum(env: tuple) -> None:
    store, meta, sink, state = env
    entries, expected = published_to(sink, {1: 300}, seed=7)
    pol = policy(maxSizePerOffloadSegmentMbytes=1.0)
    min_part = 6_000
    rnd = random.Random(3)
    parts: list = []
    now, start = 0, 0
    while start < len(entries):
        size = rnd.choice([1, 2, 5, 30])  # a trickle, with the odd larger batch
        actions = run_segmenter(TOPIC, pol, state, entries[start : start + size], now_ms=now, min_part_size=min_part)
        apply(sink, actions)
        parts += [a for a in actions if isinstance(a, PartAction)]
        assert state_bytes(state) < min_part
        assert isinstance(actions[-1], StatsAction) and actions[-1].buffered_bytes < min_part
        start, now = start + size, now + 10
    sealing = run_segmenter(TOPIC, pol, state, [], [CONTROL_SEAL], now_ms=now, min_part_size=min_part)
    apply(sink, sealing)
    parts += [a for a in sealing if isinstance(a, PartAction)]
    assert state_bytes(state) == 0
    [segment] = meta.offloaded_segments(TOPIC)
    assert segment.partCount == len(parts) > 2
    assert all(part_bytes(p) >= min_part for p in parts[:-1])
    assert read_back(store, meta) == expected


def test_replay_of_a_batch_boundary_cut_sends_the_same_parts(env: tuple) -> None:
    store, meta, sink, state = env
    entries, expected = published_to(sink, {1: 90}, seed=5)
    pol, min_part = policy(), 8_000
    apply(sink, run_segmenter(TOPIC, pol, state, entries[:7], now_ms=0, min_part_size=min_part))
    assert 0 < state_bytes(state) < min_part  # a remainder from the first batch
    saved = (state.state, list(state.block), list(state.held))
    actions = run_segmenter(TOPIC, pol, state, entries[7:40], now_ms=5, min_part_size=min_part)
    apply(sink, actions[:1])
    state.state, state.block, state.held = saved
    replay = run_segmenter(TOPIC, pol, state, entries[7:40], now_ms=5, min_part_size=min_part)
    assert replay == actions
    apply(memory_sink(ScopedStore(store), fetcher=fetcher_of(sink)), replay)
    apply(sink, run_segmenter(TOPIC, pol, state, entries[40:], [CONTROL_SEAL], now_ms=9, min_part_size=min_part))
    assert read_back(store, meta) == expected


def test_ledger_method_keeps_pip17_blocks_full_and_holds_only_the_open_block(env: tuple) -> None:
    store, meta, sink, state = env
    entries, expected = published_to(sink, {1: 60}, seed=9)
    pol = policy(method="ledger")
    for start in range(0, len(entries), 4):
        apply(sink, run_segmenter(TOPIC, pol, state, entries[start : start + 4], now_ms=start, min_part_size=1))
        assert state.held == [] and state_bytes(state) < pol.block_size
    apply(sink, run_segmenter(TOPIC, pol, state, [], [CONTROL_SEAL], now_ms=100, min_part_size=1))
    [segment] = meta.offloaded_segments(TOPIC)
    blocks = list(iter_blocks(store.get(segment.dataKey)))
    assert all(b.header.block_length == pol.block_size for b in blocks[:-1])
    assert read_back(store, meta) == expected


def test_a_segment_records_its_earliest_and_latest_publish_time(env: tuple) -> None:
    """Producers' clocks differ: the manifest's range is the min and max publish time, not the first and
    last entry's, so a reader pruning segments by time never drops one holding a message in its window."""
    _store, meta, sink, state = env
    times = [5_000, 3_000, 9_000, 7_000]
    entries = publish_to(sink, TOPIC, [Published(3, i, b"x" * 10, t) for i, t in enumerate(times)])
    apply(sink, run_segmenter(TOPIC, policy(), state, entries, [CONTROL_SEAL], now_ms=10_000))
    [segment] = meta.offloaded_segments(TOPIC)
    assert (segment.publishTimeFirst, segment.publishTimeLast) == (3_000, 9_000)


def test_a_segment_below_one_part_goes_out_whole_at_its_seal(env: tuple) -> None:
    """Its open, part and seal come in the seal's batch, so the sink writes it whole: before that the store holds
    nothing of it (no Assigned manifest, no multipart upload), and, with ``cut_every_batch`` (a filesystem
    store's way), the state holds one layout per batch (each batch's block cut at its end), never an entry row."""
    store, meta, sink, state = env
    entries, expected = published_to(sink, {1: 30}, seed=11)
    min_part = 1 << 20
    for i, start in enumerate(range(0, 30, 10)):
        actions = run_segmenter(
            TOPIC,
            policy(),
            state,
            entries[start : start + 10],
            now_ms=i,
            min_part_size=min_part,
            whole_small_segments=True,
            cut_every_batch=True,
        )
        assert [a.kind for a in actions] == ["stats"]
        apply(sink, actions)
        assert state.block == [] and len(state.held) > i
        assert list(store.list("")) == [] and list(store.pending_multiparts("")) == []
    held = len(state.held)
    sealing = run_segmenter(
        TOPIC,
        policy(),
        state,
        [],
        [CONTROL_SEAL],
        now_ms=9,
        min_part_size=min_part,
        whole_small_segments=True,
        cut_every_batch=True,
    )
    assert [a.kind for a in sealing] == ["open", "part", "seal", "stats"]
    apply(sink, sealing)
    [segment] = meta.offloaded_segments(TOPIC)
    assert segment.partCount == 1 and segment.blockCount == held
    assert [m.status for m in meta.manifests(TOPIC)] == [mf.OFFLOADED]
    assert read_back(store, meta) == expected


def test_a_segment_goes_out_opened_with_its_first_part_once(env: tuple) -> None:
    """A segment that makes a part before its seal: its open right before that part, and never again."""
    store, meta, sink, state = env
    entries, expected = published_to(sink, {1: 90}, seed=12)
    pol, min_part = policy(maxSizePerOffloadSegmentMbytes=1.0), 8_000
    sent: list[str] = []
    for start in range(0, 90, 6):
        actions = run_segmenter(
            TOPIC,
            pol,
            state,
            entries[start : start + 6],
            now_ms=start,
            min_part_size=min_part,
            whole_small_segments=True,
        )
        apply(sink, actions)
        sent += [a.kind for a in actions if a.kind in ("open", "part")]
    apply(
        sink,
        run_segmenter(
            TOPIC, pol, state, [], [CONTROL_SEAL], now_ms=999, min_part_size=min_part, whole_small_segments=True
        ),
    )
    assert sent[0] == "open" and sent.count("open") == 1 and sent.count("part") >= 2
    assert read_back(store, meta) == expected


def test_an_open_segment_from_state_written_before_lazy_opens_is_not_opened_again(env: tuple) -> None:
    """State saved by a version that sent the open at once has no ``open_sent``: that segment counts as opened."""
    store, meta, sink, state = env
    entries, expected = published_to(sink, {1: 20}, seed=13)
    first = run_segmenter(TOPIC, policy(), state, entries[:10], now_ms=0, min_part_size=1)
    assert [a.kind for a in first][:2] == ["open", "part"]
    apply(sink, first)
    saved = json.loads(state.state)
    del saved["open"]["open_sent"]
    state.state = json.dumps(saved)
    rest = run_segmenter(
        TOPIC, policy(), state, entries[10:], [CONTROL_SEAL], now_ms=1, min_part_size=1, whole_small_segments=True
    )
    assert "open" not in [a.kind for a in rest]
    apply(sink, rest)
    assert read_back(store, meta) == expected


def test_without_a_cut_every_batch_a_trickle_segment_stays_one_block_until_its_seal(env: tuple) -> None:
    """On S3 (a 5 MiB minimum part) the job does not end the block at every micro-batch: a trickle's segment
    is one block and one checksum record at its seal, not one of each per micro-batch, and still goes out
    opened, written and sealed in the seal's batch."""
    store, meta, sink, state = env
    entries, expected = published_to(sink, {1: 12}, seed=14)
    pol = policy(managedLedgerOffloadMaxBlockSizeInBytes=64 * 1024)
    for i in range(0, 12, 3):
        actions = run_segmenter(
            TOPIC, pol, state, entries[i : i + 3], now_ms=i, min_part_size=5 << 20, whole_small_segments=True
        )
        assert [a.kind for a in actions] == ["stats"]
        assert len(state.block) == i + 3 and state.held == []
        apply(sink, actions)
    sealing = run_segmenter(
        TOPIC, pol, state, [], [CONTROL_SEAL], now_ms=99, min_part_size=5 << 20, whole_small_segments=True
    )
    assert [a.kind for a in sealing] == ["open", "part", "seal", "stats"]
    apply(sink, sealing)
    [segment] = meta.offloaded_segments(TOPIC)
    assert segment.blockCount == 1 and segment.partCount == 1
    assert read_back(store, meta) == expected
