"""Entries with their bytes, for tests and benches that run the segmenter and the sink without a broker.

The segmenter sees an entry's metadata only (``Entry``: position, size, CRC-32C, publish time); the sink
fetches the bytes a part names through an ``EntryFetcher``. A test keeps the bytes in :class:`Published`
entries, hands the segmenter their metadata and the sink a ``MemoryFetcher`` holding the same bytes (the
broker's part).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from streamoffload.codecs.positions import Position
from streamoffload.storage.location import ScopedStore
from streamoffload.streaming.handoff.entry import Entry
from streamoffload.streaming.handoff.part_layout import decode_layouts
from streamoffload.streaming.segmenter.segmenter_model import SegmenterState
from streamoffload.streaming.sink.entry_fetch import MemoryFetcher
from streamoffload.streaming.sink.sink import SegmentSink


@dataclass(frozen=True)
class Published:
    """An entry as the broker holds it: its position, its bytes and its publish time."""

    ledger_id: int
    entry_id: int
    payload: bytes
    publish_time: int = 0

    @property
    def position(self) -> Position:
        return (self.ledger_id, self.entry_id)

    @property
    def meta(self) -> Entry:
        """What the segmenter sees of it."""
        return Entry.of(self.ledger_id, self.entry_id, self.payload, self.publish_time)


def metas(entries: Iterable[Published]) -> list[Entry]:
    return [e.meta for e in entries]


def triples(entries: Iterable[Published]) -> list[tuple[int, int, bytes]]:
    """``(ledger, entry, payload)`` of each entry: what reading the offloaded topic back must give."""
    return [(e.ledger_id, e.entry_id, e.payload) for e in entries]


def fetcher_of(sink: SegmentSink | MemoryFetcher) -> MemoryFetcher:
    fetcher = sink.fetcher if isinstance(sink, SegmentSink) else sink
    assert isinstance(fetcher, MemoryFetcher), f"not an in-memory fetcher: {fetcher!r}"
    return fetcher


def publish_to(target: SegmentSink | MemoryFetcher, topic: str, entries: Iterable[Published]) -> list[Entry]:
    """Put the entries' bytes where ``target``'s fetcher finds them; returns what the segmenter sees."""
    fetcher = fetcher_of(target)
    out = []
    for e in entries:
        fetcher.add(topic, e.ledger_id, e.entry_id, e.payload)
        out.append(e.meta)
    return out


def holding(topic: str, entries: Iterable[Published]) -> MemoryFetcher:
    """A fetcher holding ``entries`` of ``topic``."""
    fetcher = MemoryFetcher()
    publish_to(fetcher, topic, entries)
    return fetcher


def memory_sink(scoped: ScopedStore, fetcher: MemoryFetcher | None = None) -> SegmentSink:
    """A sink fetching from memory (empty unless ``fetcher`` is given: fill it with :func:`publish_to`)."""
    return SegmentSink(scoped, MemoryFetcher() if fetcher is None else fetcher)


def named_by_state(state: SegmenterState) -> set[Position]:
    """Positions of the entries the segmenter's state still names (its open block and the blocks it holds
    back): the only entries a later part of the open segment can take."""
    named = {e.position for e in state.block_entries()}
    for layout in state.held_blocks():
        named.update(ref.position for block in decode_layouts(layout) for ref in block.refs())
    return named


def forget_sent(target: SegmentSink | MemoryFetcher, topic: str, state: SegmenterState) -> None:
    """Drop the entries no later part can name (after the sink applied a batch's actions): a store of any
    size is built with the bytes of about one batch in memory."""
    fetcher = fetcher_of(target)
    keep = named_by_state(state)
    held = fetcher.entries.get(topic, {})
    fetcher.entries[topic] = {pos: data for pos, data in held.items() if pos in keep}
