"""What reads return and what they are given: an entry read back, and a segment named by its object keys."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from streamoffload.codecs.entry import EntryMessage, entry_messages
from streamoffload.codecs.positions import Position


class OffloadedEntry(NamedTuple):
    """One entry read back: its position and its bytes (Pulsar "headers and payload", read-only view).
    (A named tuple: one is made per entry on the hot path, and tuples are the cheapest objects to make.)"""

    ledger_id: int
    entry_id: int
    payload: memoryview

    @property
    def position(self) -> Position:
        return (self.ledger_id, self.entry_id)

    def messages(self, *, verify_checksum: bool = True, where: str | None = None) -> list[EntryMessage]:
        """The Pulsar messages of this entry (one with ``batch_index`` -1 if it is not a batch)."""
        return entry_messages(
            self.payload, verify_checksum=verify_checksum, where=where or f"entry {self.ledger_id}:{self.entry_id}"
        )


@dataclass(frozen=True, slots=True)
class SegmentKeys:
    """A segment named by its object keys (before, or without, offload metadata). ``ledger_id`` is needed
    for a v1 object whose key does not end in ``-ledger-<id>``."""

    data_key: str
    index_key: str
    ledger_id: int | None = None
