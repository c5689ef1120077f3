"""What the segmenter reads and keeps: its control requests, and its per-topic-partition state (``TopicState``
with the open segment) behind ``SegmenterState``, which Spark's state store or ``MemoryState`` implements. Its
input entries (``Entry``) and the actions it hands the sink are the stages' contract, in ``streaming.handoff``.

Plain data, no logic beyond (de)serialising it: ``streaming.segmenter.segmenter`` decides, this module holds.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from streamoffload.streaming.handoff.entry import Entry

# Why a segment was sealed (also a metric label).
SEAL_SIZE = "size"
SEAL_TIME = "time"
SEAL_MANUAL = "manual"
SEAL_LEDGER = "ledger"
SEAL_METHOD_SWITCH = "method-switch"
SEAL_DISABLED = "disabled"

CONTROL_SEAL = "seal"
CONTROL_POLICY = "policy"
"""The job published a policy version: look at the open segment again when it takes effect."""


@dataclass(frozen=True)
class ControlRequest:
    kind: str
    request_id: str | None = None
    effective_ms: int | None = None
    """For ``policy``: when the new policy version takes effect (the segmenter wakes up then)."""

    @classmethod
    def parse(cls, text: str) -> ControlRequest:
        """A control row's value: JSON ``{"kind": ..., "id": ..., "effective_ms": ...}`` or a bare kind."""
        if text.startswith("{"):
            doc = json.loads(text)
            effective = doc.get("effective_ms")
            return cls(str(doc.get("kind", CONTROL_SEAL)), doc.get("id"), None if effective is None else int(effective))
        return cls(text)


@dataclass
class OpenSegment:
    uuid: str
    ordinal: int
    version: int
    method: str
    start: list[int]
    last: list[int]
    assigned_ms: int
    manifest: str
    """The Assigned manifest, hex, so the sealed one is derived from exactly what was written."""
    policy: dict[str, Any] = field(default_factory=dict)
    """The policy the segment was opened under (``OffloadPolicy.to_json``); it governs the segment."""
    data_key: str = ""
    data_bytes: int = 0
    """Bytes of the blocks already cut: the data-object offset of the open block."""
    parts: int = 0
    blocks: list[list[int]] = field(default_factory=list)
    """Index entries so far: [ledger_id, first_entry_id, part_id, offset]."""
    spans: dict[str, list[int]] = field(default_factory=dict)
    """Per ledger: [first_entry_id, last_entry_id, entries, payload bytes]."""
    block_ledger: int = -1
    block_first_entry: int = -1
    block_after: list[int] = field(default_factory=lambda: [-1, -1])
    """The position before the open block's first entry: a fetch of its entries reads after it."""
    block_bytes: int = 0
    """Bytes the open block would take if cut now (header + framed entries); 0 when none is open."""
    block_entries_stored: int = 0
    """Entries of the open block already in the state store (from earlier batches)."""
    held_bytes: int = 0
    """Data-object bytes of the blocks cut but not yet sent as a part (their layouts wait in state)."""
    held_stored: int = 0
    publish_first: int = 0
    publish_last: int = 0
    entries: int = 0
    rollover_from_ms: int = 0
    """When the rollover time counts from (``segmenter.rollover_start``); 0: ``assigned_ms``."""
    checksums: bool = False
    """Every part of this segment records its blocks' entry checksums (``codecs.checksums``); False for a
    segment opened by a version that did not, whose sealed manifest then says none were recorded."""
    open_sent: bool = True
    """Whether the segment's ``open`` action went out (with its first part: ``Segmenter._send_open``); True for a
    segment opened by a version that sent it at once."""


TIMER_UNKNOWN = -1
"""``TopicState.timer_ms`` of a state that does not say which timer is registered."""


@dataclass
class TopicState:
    topic: str
    next_ordinal: int = 0
    last: list[int] | None = None
    """The last position assigned to a segment: anything at or before it is a duplicate."""
    method: str | None = None
    open: OpenSegment | None = None
    sealed_count: int = 0
    wake_ms: int | None = None
    """When a published policy version takes effect (a timer re-runs the topic then, traffic or not)."""
    timer_ms: int | None = None
    """The processing-time timer the Spark processor registered for this topic-partition (None: none), so it
    need not list its timers every micro-batch (a round trip to the JVM each, ~20 ms); ``TIMER_UNKNOWN`` in a
    state written before it was recorded: the processor lists them once."""

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> TopicState:
        raw = json.loads(text)
        raw.setdefault("timer_ms", TIMER_UNKNOWN)  # written before the timer was recorded
        seg = raw.pop("open")
        return cls(**raw, open=OpenSegment(**seg) if seg else None)


class SegmenterState(Protocol):
    """Where the segmenter keeps its state between micro-batches."""

    def load(self) -> TopicState | None: ...
    def save(self, state: TopicState) -> None: ...
    def block_entries(self) -> list[Entry]: ...
    def append_block_entries(self, entries: Sequence[Entry]) -> None: ...
    def clear_block_entries(self) -> None: ...
    def held_blocks(self) -> list[bytes]:
        """Layouts (``part_layout.encode_layouts``) of the blocks cut but not yet sent."""
        ...

    def append_held_blocks(self, blocks: Sequence[bytes]) -> None: ...
    def clear_held_blocks(self) -> None: ...


class MemoryState:
    """In-memory ``SegmenterState`` for tests and for running the segmenter without Spark."""

    def __init__(self) -> None:
        self.state: str | None = None
        self.block: list[Entry] = []
        self.held: list[bytes] = []

    def load(self) -> TopicState | None:
        return TopicState.from_json(self.state) if self.state else None

    def save(self, state: TopicState) -> None:
        self.state = state.to_json()

    def block_entries(self) -> list[Entry]:
        return list(self.block)

    def append_block_entries(self, entries: Sequence[Entry]) -> None:
        self.block.extend(entries)

    def clear_block_entries(self) -> None:
        self.block = []

    def held_blocks(self) -> list[bytes]:
        return list(self.held)

    def append_held_blocks(self, blocks: Sequence[bytes]) -> None:
        self.held.extend(blocks)

    def clear_held_blocks(self) -> None:
        self.held = []
