"""Runs of entries (``read.segment.runs``): a sequential read that checks runs of entries together reads, and
refuses, exactly what the entry-by-entry walk does (``SegmentReadHandle.checked_runs = False``), with the
entries' recorded checksums and with their own only; ``read_into`` gives ``read_range``'s entries as columns."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamoffload.checkpoints.metadata_store import MetadataStore
from streamoffload.codecs.blocks import BLOCK_HEADER_LENGTH, ENTRY_HEADER
from streamoffload.codecs.errors import FormatError
from streamoffload.codecs.index import OffloadIndex
from streamoffload.codecs.proto.offload_manifest_pb2 import SegmentManifest
from streamoffload.read.segment import SegmentReadHandle
from streamoffload.read.segment.runs import JoinedEntries, entry_run
from streamoffload.storage.base import ObjectStore
from streamoffload.storage.filesystem import FilesystemStore
from streamoffload.storage.location import ScopedStore
from tests.read import TOPIC, History, offload, pulsar_entries
from tests.read.segment.test_read_handle import FlakyStore
from tests.read.test_recorded_checksums import as_written_before_checksums

Outcome = tuple[list[tuple[int, int, bytes]], tuple[str, str, Any, Any] | None]


@pytest.fixture(scope="module", params=["recorded", "own"])
def offloaded(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[FilesystemStore, History, list[SegmentManifest]]]:
    """Segments whose blocks have checksum records (the sink's), or only the entries' own CRCs (a segment
    sealed before records existed)."""
    store = FilesystemStore(tmp_path_factory.mktemp("runs") / "store", fsync=False)
    history = pulsar_entries({1: 50, 2: 40, 5: 50}, seed=3, max_payload=1500)
    meta = offload(ScopedStore(store), history, switch_at=100)
    if request.param == "own":
        for seg in meta.offloaded_segments(TOPIC):
            as_written_before_checksums(store, meta, seg)
        meta = MetadataStore(ScopedStore(store))
    yield store, history, meta.offloaded_segments(TOPIC)


def outcome(
    store: ObjectStore,
    seg: SegmentManifest,
    buf: int,
    start: tuple[int, int] | None,
    end: tuple[int, int] | None,
    *,
    runs: bool,
    into: bool = False,
    readahead: bool = False,
) -> Outcome:
    """The entries a read gives (up to its error) and its error: type, text, offset, object."""
    handle = SegmentReadHandle.open(store, seg, read_buffer_size=buf, readahead=readahead)
    handle.checked_runs = runs
    got: list[tuple[int, int, bytes]] = []
    read = JoinedEntries()
    try:
        if into:
            handle.read_into(read, start, end)
        else:
            for entry in handle.read_range(start, end):
                got.append((entry.ledger_id, entry.entry_id, bytes(entry.payload)))
    except FormatError as err:
        return got, (type(err).__name__, str(err), err.offset, err.where)
    finally:
        handle.close()
    if into:
        joined, ledgers = read.joined(), read.ledger_ids()
        got = [
            (ledgers[k], read.entry_ids[k], joined[read.starts[k] : read.starts[k] + read.lengths[k]])
            for k in range(len(read))
        ]
    return got, None


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    buf=st.sampled_from([128, 300, 1000, 4096, 1 << 20]),
    which=st.integers(0, 20),
    i=st.integers(0, 200),
    n=st.integers(0, 200),
    into=st.booleans(),
    remote=st.booleans(),
)
def test_any_range_of_a_segment_reads_as_entry_by_entry(
    offloaded: tuple[FilesystemStore, History, list[SegmentManifest]],
    buf: int,
    which: int,
    i: int,
    n: int,
    into: bool,
    remote: bool,
) -> None:
    """``remote``: the same files read as a remote store is (back-to-back ranges, read ahead in a thread, entries
    joined across them) instead of through a held descriptor."""
    fs_store, history, segments = offloaded
    store: ObjectStore = FlakyStore(fs_store) if remote else fs_store
    seg = segments[which % len(segments)]
    first, last = (seg.startLedgerId, seg.startEntryId), (seg.endLedgerId, seg.endEntryId)
    inside = [p for p in history.positions() if first <= p <= last]
    start = inside[i % len(inside)] if i % 7 else None
    end = inside[min(i % len(inside) + n, len(inside) - 1)] if n % 5 else None
    got = outcome(store, seg, buf, start, end, runs=True, into=into, readahead=remote)
    assert got == outcome(store, seg, buf, start, end, runs=False)
    assert got[1] is None
    lo, hi = start or first, end or last
    assert got[0] == [e for e in history.expected if lo <= (e[0], e[1]) <= hi]


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    buf=st.sampled_from([300, 4096, 1 << 20]),
    which=st.integers(0, 20),
    at=st.floats(0, 1, exclude_max=True),
    into=st.booleans(),
)
def test_a_byte_flipped_anywhere_is_refused_as_entry_by_entry(
    offloaded: tuple[FilesystemStore, History, list[SegmentManifest]], buf: int, which: int, at: float, into: bool
) -> None:
    """The same error (type, text, offset) after the same entries, wherever the byte is: a block or entry
    header, an entry id, a payload, padding."""
    store, _, segments = offloaded
    seg = segments[which % len(segments)]
    path = Path(store.root) / seg.dataKey
    data = bytearray(path.read_bytes())
    offset = int(at * len(data))
    data[offset] ^= 0xFF
    original = path.read_bytes()
    path.write_bytes(bytes(data))
    try:
        got = outcome(store, seg, buf, None, None, runs=True, into=into)
        want = outcome(store, seg, buf, None, None, runs=False)
    finally:
        path.write_bytes(original)
    if into:  # an error leaves what was read to the caller to drop (read_tasks does): the error is the same
        assert got[1] == want[1]
        assert got[1] is not None or got[0] == want[0]
    else:
        assert got == want


def entries(*pairs: tuple[int, bytes]) -> bytes:
    return b"".join(ENTRY_HEADER.pack(len(payload), entry_id) + payload for entry_id, payload in pairs)


def test_a_run_stops_before_an_entry_it_cannot_vouch_for() -> None:
    buf = entries((5, b"ab"), (6, b"cde"), (7, b""), (9, b"f"))
    run = entry_run(memoryview(buf), 0, len(buf), 4)
    assert (run.ids, run.heads, run.lengths, run.end) == ([5, 6, 7, 9], [0, 14, 29, 41], [2, 3, 0, 1], len(buf))
    # An entry across the end (of the buffer or the block): the run ends before it.
    assert entry_run(memoryview(buf), 0, len(buf) - 1, 4).ids == [5, 6, 7]
    # An id that does not follow: before it (the entry-by-entry walk names it).
    assert entry_run(memoryview(entries((5, b"a"), (5, b"b"))), 0, 26, 4).ids == [5]
    assert entry_run(memoryview(buf), 0, len(buf), 5).ids == []
    # Padding: its length word (0xFEDCDEAD) is past any block.
    padded = buf + bytes.fromhex("FEDCDEAD") * 4
    assert entry_run(memoryview(padded), 0, len(padded), 4).end == len(buf)
    # Past the read's end: the first entry past it ends the run, in it (the walk stops there).
    assert entry_run(memoryview(buf), 0, len(buf), 4, hi=6).ids == [5, 6, 7]
    assert entry_run(memoryview(buf), 14, len(buf), 5).ids == [6, 7, 9]


def test_joined_entries_are_columns_of_the_payloads() -> None:
    buf = memoryview(entries((5, b"ab"), (6, b"cde"), (7, b"g")))
    read = JoinedEntries()
    read.add_run(3, buf, entry_run(buf, 0, len(buf), -1), 0, 2)
    mark = read.mark()
    read.add(4, 0, memoryview(b"xyz"))
    joined = read.joined(b"PAD")
    assert [joined[s : s + n] for s, n in zip(read.starts, read.lengths, strict=True)] == [b"ab", b"cde", b"xyz"]
    assert joined.endswith(b"cdexyzPAD") and (read.ledger_ids(), read.entry_ids) == ([3, 3, 4], [5, 6, 0])
    read.truncate(mark)
    assert (len(read), read.ledger_ids(), read.joined()) == (
        2,
        [3, 3],
        struct.pack(">IQ", 2, 5) + b"ab" + buf[14:26].tobytes() + b"cde",
    )


def entry_heads(data: bytes, block_offset: int, block_length: int) -> list[int]:
    """Where each entry header of the block at ``block_offset`` starts (its entries, walked by their lengths)."""
    heads, at, end = [], block_offset + BLOCK_HEADER_LENGTH, block_offset + block_length
    while at + 12 <= end:
        length, _ = ENTRY_HEADER.unpack_from(data, at)
        if at + 12 + length > end:
            break
        heads.append(at)
        at += 12 + length
    return heads


@pytest.mark.parametrize("mask", [0xFF, 0x01, 0x80])
def test_every_byte_of_an_entry_header_changed_is_refused_as_entry_by_entry(
    offloaded: tuple[FilesystemStore, History, list[SegmentManifest]], mask: int
) -> None:
    """A length or an id changed: the first entry of a block, the second, one in the middle and the last."""
    store, _, segments = offloaded
    seg = max(segments, key=lambda s: s.blockCount)
    path = Path(store.root) / seg.dataKey
    original = path.read_bytes()
    index = OffloadIndex.decode(store.get(seg.indexKey), ledger_id=seg.startLedgerId)
    checked = 0
    for block in index.blocks()[:3]:
        heads = entry_heads(original, block.offset, block.length)
        for head in {heads[0], heads[1], heads[len(heads) // 2], heads[-1]}:
            for offset in range(head, head + 12):
                data = bytearray(original)
                data[offset] ^= mask
                path.write_bytes(bytes(data))
                try:
                    for buf in (300, 1 << 20):
                        want = outcome(store, seg, buf, None, None, runs=False)
                        assert outcome(store, seg, buf, None, None, runs=True) == want, (offset, buf)
                        assert outcome(store, seg, buf, None, None, runs=True, into=True)[1] == want[1]
                        checked += want[1] is not None
                finally:
                    path.write_bytes(original)
    assert checked > 100  # most such changes are refused (a low bit of a length may be a smaller payload)
