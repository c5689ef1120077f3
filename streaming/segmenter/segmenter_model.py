"""What the segmenter reads, keeps and emits: its input entries and control requests, the actions it
hands the sink (``Action``; in Spark packed per topic-partition by ``pack_actions``), and its per-topic-partition
state (``TopicState`` with the open segment) behind ``SegmenterState``, which Spark's state store or
``MemoryState`` implements.

Plain data, no logic beyond (de)serialising it: ``streaming.segmenter.segmenter`` decides, this module holds.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from streamoffload.codecs.entry import crc32c

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


@dataclass(frozen=True)
class Entry:
    """One entry as the segmenter sees it: position, size, CRC-32C and publish time, never its bytes
    (the sink fetches those, ``streaming.sink.entry_fetch``)."""

    ledger_id: int
    entry_id: int
    size: int
    crc32c: int
    publish_time: int = 0

    @property
    def position(self) -> tuple[int, int]:
        return (self.ledger_id, self.entry_id)

    @classmethod
    def of(cls, ledger_id: int, entry_id: int, payload: bytes, publish_time: int = 0) -> Entry:
        """The metadata of an entry whose bytes are at hand (tests, benches, the fetcher's checks)."""
        return cls(ledger_id, entry_id, len(payload), crc32c(payload), publish_time)


@dataclass
class Action:
    """One instruction to the sink. ``data`` is the part's block layouts (``streaming.handoff.part_layout``) for
    ``part`` and the index bytes for ``seal``."""

    topic: str
    segment: str
    action: str
    part_number: int = 0
    data: bytes = b""
    manifest: bytes = b""
    data_key: str = ""
    index_key: str = ""
    info: str = "{}"


ACTION_COLUMNS = ["topic", "segment", "action", "part_number", "data", "manifest", "data_key", "index_key", "info"]

PACKED_ACTIONS_SCHEMA = "topic STRING, actions BINARY"
"""The segmenter's output in Spark: one row per topic-partition and micro-batch, its actions packed by
``pack_actions``. Two columns, not one per ``ACTION_COLUMNS``: PySpark converts each key's output frame column by
column, so every column cost each topic-partition every micro-batch (bench/README, session 32)."""

_PACKED_HEADER = struct.Struct("<i8I")
"""Per action: its part number, then the lengths of its eight other fields (``ACTION_COLUMNS`` order)."""
_PACKED_COUNT = struct.Struct("<I")
_TEXT_COLUMNS = frozenset({"topic", "segment", "action", "data_key", "index_key", "info"})
_PACKED_COLUMNS = [c for c in ACTION_COLUMNS if c != "part_number"]


def pack_actions(actions: Sequence[Action]) -> bytes:
    """Actions as one binary value: their count, then per action a fixed header (``_PACKED_HEADER``) and its
    fields' bytes. The count makes a value cut between two actions an error too."""
    if not actions:
        return b""
    out = bytearray(_PACKED_COUNT.pack(len(actions)))
    for action in actions:
        fields = [getattr(action, c) for c in _PACKED_COLUMNS]
        raw = [f.encode() if isinstance(f, str) else bytes(f) for f in fields]
        out += _PACKED_HEADER.pack(action.part_number, *(len(r) for r in raw))
        for r in raw:
            out += r
    return bytes(out)


def unpack_actions(packed: bytes) -> Iterator[dict[str, Any]]:
    """The actions ``pack_actions`` packed, as the sink's rows (``ACTION_COLUMNS`` keys)."""
    view = memoryview(packed)
    if not view:
        return
    if len(view) < _PACKED_COUNT.size:
        raise ValueError(f"packed actions end inside their count at byte 0 of {len(view)}")
    (count,) = _PACKED_COUNT.unpack_from(view, 0)
    pos = _PACKED_COUNT.size
    for _ in range(count):
        if pos + _PACKED_HEADER.size > len(view):
            raise ValueError(f"packed actions end inside a header at byte {pos} of {len(view)}")
        part_number, *lengths = _PACKED_HEADER.unpack_from(view, pos)
        pos += _PACKED_HEADER.size
        row: dict[str, Any] = {"part_number": part_number}
        for column, length in zip(_PACKED_COLUMNS, lengths, strict=True):
            if pos + length > len(view):
                raise ValueError(f"packed actions end inside {column!r} at byte {pos} of {len(view)}")
            value = bytes(view[pos : pos + length])
            row[column] = value.decode() if column in _TEXT_COLUMNS else value
            pos += length
        yield row
    if pos != len(view):
        raise ValueError(f"packed actions hold {len(view) - pos} bytes after their {count} actions")


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


BlockEntry = tuple[int, int, int, int]
"""An entry of the open block in state: (ledger id, entry id, size, crc32c)."""


class SegmenterState(Protocol):
    """Where the segmenter keeps its state between micro-batches."""

    def load(self) -> TopicState | None: ...
    def save(self, state: TopicState) -> None: ...
    def block_entries(self) -> list[BlockEntry]: ...
    def append_block_entries(self, entries: Sequence[BlockEntry]) -> None: ...
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
        self.block: list[BlockEntry] = []
        self.held: list[bytes] = []

    def load(self) -> TopicState | None:
        return TopicState.from_json(self.state) if self.state else None

    def save(self, state: TopicState) -> None:
        self.state = state.to_json()

    def block_entries(self) -> list[BlockEntry]:
        return list(self.block)

    def append_block_entries(self, entries: Sequence[BlockEntry]) -> None:
        self.block.extend(entries)

    def clear_block_entries(self) -> None:
        self.block = []

    def held_blocks(self) -> list[bytes]:
        return list(self.held)

    def append_held_blocks(self, blocks: Sequence[bytes]) -> None:
        self.held.extend(blocks)

    def clear_held_blocks(self) -> None:
        self.held = []
