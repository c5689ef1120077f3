"""One entry's metadata as the stages hand it on: position, size, CRC-32C and publish time, never its bytes.

The source's ``positionsOnly`` rows become ``Entry`` objects for the segmenter; the segmenter keeps the open
block's in its state and writes them into part layouts (``streaming.handoff.part_layout``); the sink fetches
the bytes (an ``EntryFetcher``: the broker, or the spool in front of it) and checks them against them
(``streaming.sink.entry_fetch``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

from streamoffload.codecs.entry import crc32c
from streamoffload.codecs.positions import Position
from streamoffload.storage.base import Buffer


@dataclass(frozen=True, slots=True)
class Entry:
    """One entry: where it is, how long it is, its CRC-32C and its publish time (0: unknown, as in a part
    layout or the segmenter's state, which do not record it)."""

    ledger_id: int
    entry_id: int
    size: int
    crc32c: int
    publish_time: int = 0

    @property
    def position(self) -> Position:
        return (self.ledger_id, self.entry_id)

    @classmethod
    def of(cls, ledger_id: int, entry_id: int, payload: bytes, publish_time: int = 0) -> Entry:
        """The metadata of an entry whose bytes are at hand (tests, benches, the fetcher's checks)."""
        return cls(ledger_id, entry_id, len(payload), crc32c(payload), publish_time)


class EntryFetcher(Protocol):
    @property
    def source(self) -> str:
        """Where the entries come from, for errors (``the broker at pulsar://...``)."""
        ...

    def stream(self, topic: str, after: Position, end: Position) -> Iterator[tuple[Position, Buffer]]:
        """The entries of ``topic`` in ``(after, end]``, in position order, as ``(position, bytes)``; the sink
        takes each part's entries from it in turn (:class:`PartReader`) and checks them (:func:`match`)."""
        ...
