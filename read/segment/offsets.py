"""Learned offsets: where entries a handle has read start, so later reads need not walk from a block head
(Pulsar's ``OffsetsCache``, per handle and bounded by the read buffer size)."""

from __future__ import annotations

import bisect


class LearnedOffsets:
    """Learned entries of one block: sorted entry ids, where their 12-byte headers start, and their payload
    lengths (so a learned entry is read back with one exact ranged GET)."""

    __slots__ = ("ids", "last_entry_id", "lengths", "offsets")

    def __init__(self) -> None:
        self.ids: list[int] = []
        self.offsets: list[int] = []
        self.lengths: list[int] = []
        self.last_entry_id: int | None = None  # known once the block was read to its end

    def learn(self, entry_id: int, offset: int, length: int, spacing: int) -> None:
        """Remember an entry if it starts at least ``spacing`` bytes from the learned ones around it."""
        ids = self.ids
        if not ids or entry_id > ids[-1]:
            if not ids or offset - self.offsets[-1] >= spacing:
                ids.append(entry_id)
                self.offsets.append(offset)
                self.lengths.append(length)
            return
        i = bisect.bisect_left(ids, entry_id)
        if ids[i] == entry_id:
            return
        if (i == 0 or offset - self.offsets[i - 1] >= spacing) and self.offsets[i] - offset >= spacing:
            ids.insert(i, entry_id)
            self.offsets.insert(i, offset)
            self.lengths.insert(i, length)

    def best(self, entry_id: int) -> tuple[int, int] | None:
        """The learned (entry id, offset) closest at or before ``entry_id``."""
        i = bisect.bisect_right(self.ids, entry_id) - 1
        return None if i < 0 else (self.ids[i], self.offsets[i])

    def exact(self, entry_id: int) -> tuple[int, int] | None:
        """(offset of the entry's header, payload length) if this very entry was learned."""
        i = bisect.bisect_left(self.ids, entry_id)
        if i < len(self.ids) and self.ids[i] == entry_id:
            return self.offsets[i], self.lengths[i]
        return None
