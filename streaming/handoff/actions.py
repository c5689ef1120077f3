"""What the segmenter tells the sink to do, one frozen class per kind, and their packed form (what crosses Spark).

Per topic-partition and micro-batch the segmenter emits, in order: ``OpenAction`` (write the segment's Assigned
manifest), ``PartAction`` (upload one part of its data object, as block layouts), ``SealAction`` (complete the
data object, write the index, commit, write the Offloaded manifest), ``RequestsAction`` (manual requests with
nothing to seal), and last ``StatsAction`` (its figures for the driver). The sink dispatches on the class.

In Spark the actions of a topic-partition travel as one binary value (``PACKED_ACTIONS_SCHEMA``): their count
(u32), then per action a header ``<i8I`` (its part number, then the lengths of its eight byte fields: topic,
segment, kind, data, manifest, data key, index key, info) and those fields. ``data`` is a part's layouts or a
seal's index; ``info`` is a JSON object with the kind's other fields (``OpenAction.ordinal``, ...). The bytes
cross processes, so :func:`unpack_actions` checks what it reads and names the field that is wrong.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any, ClassVar, NamedTuple

from streamoffload.codecs.blocks import FormatVersion
from streamoffload.codecs.positions import Position
from streamoffload.streaming.errors import StreamingError


class ActionPackError(StreamingError, ValueError):
    """Packed actions that do not decode: cut, padded, or a field that is not what its kind needs."""


@dataclass(frozen=True)
class OpenAction:
    """Open the segment: start its multipart upload, write its Assigned manifest (create-only)."""

    kind: ClassVar[str] = "open"
    topic: str
    segment: str
    manifest: bytes
    """The Assigned manifest (``checkpoints.manifest``), encoded."""
    data_key: str
    index_key: str
    ordinal: int
    method: str


@dataclass(frozen=True)
class PartAction:
    """Upload part ``part_number`` of the segment's data object: the blocks ``layouts`` describe
    (``streaming.handoff.part_layout``), built from entries the sink fetches."""

    kind: ClassVar[str] = "part"
    topic: str
    segment: str
    part_number: int
    layouts: bytes
    data_key: str
    manifest_key: str
    """Where the segment's Assigned manifest is (its upload id and encoding)."""
    format: FormatVersion
    length: int
    """The part's bytes in the clear (the sum of its blocks' lengths)."""
    offset: int
    """Where the part starts in the data object in the clear."""
    last: bool = False
    """The seal's part, which a store takes below its minimum part size."""
    first_block: int | None = None
    """The data object's ordinal of the part's first block, for the blocks' checksum records
    (``codecs.checksums``); None: the segment records none (opened by a version that did not)."""


@dataclass(frozen=True)
class SealAction:
    """Seal the segment: complete its data object from parts ``1..part_count``, write ``index``, check the
    lease, commit and write the Offloaded ``manifest``."""

    kind: ClassVar[str] = "seal"
    topic: str
    segment: str
    part_count: int
    index: bytes
    manifest: bytes
    data_key: str
    index_key: str
    reason: str
    """Why the segment was sealed (``segmenter_model.SEAL_*``; a metric label)."""
    data_length: int
    """The data object's bytes in the clear."""
    entries: int
    entry_bytes: int
    ordinal: int
    end: Position
    format: FormatVersion
    epoch: int
    """The writer's lease epoch: a fenced writer's commit is refused."""
    requests: tuple[str, ...] = ()
    """The manual requests this seal completes."""

    def summary(self) -> SealReport:
        """What the sink reports of the seal to the driver (``SinkStats.sealed``)."""
        return SealReport(
            topic=self.topic,
            segment=self.segment,
            reason=self.reason,
            parts=self.part_count,
            data_length=self.data_length,
            entries=self.entries,
            entry_bytes=self.entry_bytes,
            ordinal=self.ordinal,
            end=self.end,
            format=int(self.format),
            epoch=self.epoch,
            requests=self.requests,
        )


@dataclass(frozen=True)
class SealReport:
    """A committed seal as the sink reports it to the driver (``SinkStats.sealed``): metrics, logs, the retention
    subscription, the table follower. JSON between an executor and the driver (``to_json``/``from_json``)."""

    topic: str
    segment: str
    reason: str
    parts: int
    data_length: int
    entries: int
    entry_bytes: int
    ordinal: int
    end: Position
    format: int
    epoch: int
    requests: tuple[str, ...] = ()
    publish_time_last: int = 0
    """The last entry's publish time in ms; 0: not known here (the sink does not report it), so the metrics read
    it from the manifest."""

    def to_json(self) -> dict[str, object]:
        return {**asdict(self), "end": list(self.end), "requests": list(self.requests)}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> SealReport:
        end = doc["end"]
        return cls(**{**doc, "end": (int(end[0]), int(end[1])), "requests": tuple(doc.get("requests", ()))})


@dataclass(frozen=True)
class RequestsAction:
    """Manual requests done with no segment to show for them (nothing was open)."""

    kind: ClassVar[str] = "requests"
    topic: str
    requests: tuple[str, ...]


@dataclass(frozen=True)
class StatsAction:
    """The topic-partition's figures after the batch (``Segmenter.stats``), for the driver's metrics and the
    source's admission control; always the batch's last action."""

    kind: ClassVar[str] = "stats"
    topic: str
    buffered_bytes: int
    open_segment: str | None
    open_segment_entries: int
    open_segment_bytes: int
    open_segment_assigned_ms: int | None
    last_position: Position | None
    now_ms: int
    batch_entries: int
    """Entries (and their bytes) this micro-batch brought: the source sizes the next one by them."""
    batch_bytes: int
    wake_ms: int | None
    """When this topic-partition's timer fires (rollover, policy wake-up): the source plans a micro-batch then."""
    read_throttled_s: float
    """Seconds the source's read limits held this batch's entries back."""

    def to_json(self) -> dict[str, object]:
        """The figures as JSON (the sink's report to the driver, ``SinkStats.topics``)."""
        doc = asdict(self)
        doc["last_position"] = None if self.last_position is None else list(self.last_position)
        return doc

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> StatsAction:
        last = doc.get("last_position")
        return cls(**{**doc, "last_position": None if last is None else (int(last[0]), int(last[1]))})


Action = OpenAction | PartAction | SealAction | RequestsAction | StatsAction
SegmentAction = OpenAction | PartAction | SealAction
"""The actions that write a segment (the others name none)."""

PACKED_ACTIONS_SCHEMA = "topic STRING, actions BINARY"
"""The segmenter's output in Spark: one row per topic-partition and micro-batch, its actions packed by
``pack_actions``. Two columns, not one per field: PySpark converts each key's output frame column by column, so
every column cost each topic-partition every micro-batch (bench/README, session 32)."""

_PACKED_HEADER = struct.Struct("<i8I")
"""Per action: its part number, then the lengths of its eight byte fields (``_FIELDS`` order)."""
_PACKED_COUNT = struct.Struct("<I")
_FIELDS = ("topic", "segment", "kind", "data", "manifest", "data_key", "index_key", "info")
_TEXT_FIELDS = frozenset({"topic", "segment", "kind", "data_key", "index_key", "info"})


class _Packed(NamedTuple):
    """One action as its packed fields."""

    topic: str
    segment: str
    kind: str
    part_number: int = 0
    data: bytes = b""
    manifest: bytes = b""
    data_key: str = ""
    index_key: str = ""
    info: str = "{}"


def _dumps(doc: dict[str, object]) -> str:
    return json.dumps(doc, separators=(",", ":"))


def _packed(action: Action) -> _Packed:
    match action:
        case OpenAction():
            info = _dumps({"ordinal": action.ordinal, "method": action.method})
            return _Packed(
                action.topic,
                action.segment,
                action.kind,
                manifest=action.manifest,
                data_key=action.data_key,
                index_key=action.index_key,
                info=info,
            )
        case PartAction():
            doc: dict[str, object] = {
                "manifest_key": action.manifest_key,
                "format": int(action.format),
                "length": action.length,
                "offset": action.offset,
            }
            if action.last:
                doc["last"] = True
            if action.first_block is not None:
                doc["checksums"] = {"first_block": action.first_block, "offset": action.offset}
            return _Packed(
                action.topic,
                action.segment,
                action.kind,
                part_number=action.part_number,
                data=action.layouts,
                data_key=action.data_key,
                info=_dumps(doc),
            )
        case SealAction():
            doc = action.summary().to_json()
            del doc["topic"], doc["segment"], doc["publish_time_last"]  # the sink learns that from no action
            return _Packed(
                action.topic,
                action.segment,
                action.kind,
                part_number=action.part_count,
                data=action.index,
                manifest=action.manifest,
                data_key=action.data_key,
                index_key=action.index_key,
                info=_dumps(doc),
            )
        case RequestsAction():
            return _Packed(action.topic, "", action.kind, info=_dumps({"requests": list(action.requests)}))
        case StatsAction():
            figures = action.to_json()
            del figures["topic"]
            return _Packed(action.topic, "", action.kind, info=_dumps(figures))


def pack_actions(actions: Sequence[Action]) -> bytes:
    """Actions as one binary value (the module docstring's shape). The count makes a value cut between two
    actions an error too."""
    if not actions:
        return b""
    out = bytearray(_PACKED_COUNT.pack(len(actions)))
    for action in actions:
        p = _packed(action)
        raw = (
            p.topic.encode(),
            p.segment.encode(),
            p.kind.encode(),
            p.data,
            p.manifest,
            p.data_key.encode(),
            p.index_key.encode(),
            p.info.encode(),
        )
        out += _PACKED_HEADER.pack(p.part_number, *map(len, raw))
        out += b"".join(raw)
    return bytes(out)


def unpack_actions(packed: bytes) -> Iterator[Action]:
    """The actions ``pack_actions`` packed, checked: :class:`ActionPackError` names where a value is cut or
    which field of which action is wrong."""
    view = memoryview(packed)
    if not view:
        return
    if len(view) < _PACKED_COUNT.size:
        raise ActionPackError(f"packed actions end inside their count at byte 0 of {len(view)}")
    (count,) = _PACKED_COUNT.unpack_from(view, 0)
    pos = _PACKED_COUNT.size
    for _ in range(count):
        if pos + _PACKED_HEADER.size > len(view):
            raise ActionPackError(f"packed actions end inside a header at byte {pos} of {len(view)}")
        part_number, *lengths = _PACKED_HEADER.unpack_from(view, pos)
        pos += _PACKED_HEADER.size
        raw: list[bytes] = []
        for name, length in zip(_FIELDS, lengths, strict=True):
            if pos + length > len(view):
                raise ActionPackError(f"packed actions end inside {name!r} at byte {pos} of {len(view)}")
            raw.append(bytes(view[pos : pos + length]))
            pos += length
        topic, segment, kind, data, manifest, data_key, index_key, info = raw
        yield _action_of(
            _Packed(
                _text(topic, 0, raw),
                _text(segment, 1, raw),
                _text(kind, 2, raw),
                part_number,
                data,
                manifest,
                _text(data_key, 5, raw),
                _text(index_key, 6, raw),
                _text(info, 7, raw),
            )
        )
    if pos != len(view):
        raise ActionPackError(f"packed actions hold {len(view) - pos} bytes after their {count} actions")


_MISSING = object()
_FORMATS = {int(v): v for v in FormatVersion}


def _text(value: bytes, i: int, fields: list[bytes]) -> str:
    """Field ``i`` of an action's ``fields``, as text."""
    try:
        return value.decode()
    except UnicodeDecodeError as err:
        raise ActionPackError(f"packed actions: the {_FIELDS[i]!r} of an action is not UTF-8 ({err})") from None


class _Info:
    """An action's info document, read field by field: each read checks the type and names the field. Cheap when
    all is well (a few hundred actions per task and micro-batch): the error's text is made only for an error."""

    def __init__(self, packed: _Packed, doc: dict[str, object], inside: str = "") -> None:
        self.packed = packed
        self.doc = doc
        self.inside = inside

    @classmethod
    def of(cls, packed: _Packed) -> _Info:
        info = cls(packed, {})
        try:
            doc = json.loads(packed.info)
        except ValueError as err:
            raise info.error(f"its info is not JSON ({err})") from None
        if type(doc) is not dict:
            raise info.error(f"its info is {type(doc).__name__}, not an object")
        info.doc = doc
        return info

    def error(self, why: str) -> ActionPackError:
        p = self.packed
        segment = f" segment {p.segment!r}" if p.segment else ""
        return ActionPackError(f"packed {p.kind} action of {p.topic!r}{segment}{self.inside}: {why}")

    def _wrong(self, key: str, value: object, expected: str) -> ActionPackError:
        if value is _MISSING:
            return self.error(f"field {key!r} is missing")
        return self.error(f"field {key!r} is {value!r}, not {expected}")

    def inner(self, key: str) -> _Info | None:
        """The object under ``key``, read the same way (None: none)."""
        value = self.doc.get(key)
        if value is None:
            return None
        if not isinstance(value, dict):
            raise self._wrong(key, value, "an object")
        return _Info(self.packed, value, f", its {key}")

    def integer(self, key: str, minimum: int | None = 0) -> int:
        value = self.doc.get(key, _MISSING)
        if not isinstance(value, int) or isinstance(value, bool):
            raise self._wrong(key, value, "an integer")
        if minimum is not None and value < minimum:
            raise self.error(f"field {key!r} is {value}, below {minimum}")
        return value

    def optional_integer(self, key: str) -> int | None:
        return None if self.doc.get(key, _MISSING) is None else self.integer(key, None)

    def text(self, key: str) -> str:
        value = self.doc.get(key, _MISSING)
        if not isinstance(value, str):
            raise self._wrong(key, value, "a string")
        return value

    def optional_text(self, key: str) -> str | None:
        return None if self.doc.get(key, _MISSING) is None else self.text(key)

    def flag(self, key: str) -> bool:
        value = self.doc.get(key, False)
        if not isinstance(value, bool):
            raise self._wrong(key, value, "true or false")
        return value

    def seconds(self, key: str) -> float:
        value = self.doc.get(key, _MISSING)
        if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value) or value < 0:
            raise self._wrong(key, value, "a number of seconds")
        return float(value)

    def texts(self, key: str) -> tuple[str, ...]:
        value = self.doc.get(key, _MISSING)
        if not isinstance(value, list):
            raise self._wrong(key, value, "a list of strings")
        texts = tuple(v for v in value if isinstance(v, str))
        if len(texts) != len(value):
            raise self._wrong(key, value, "a list of strings")
        return texts

    def position(self, key: str) -> Position:
        value = self.doc.get(key, _MISSING)
        ids = (
            tuple(v for v in value if isinstance(v, int) and not isinstance(v, bool)) if isinstance(value, list) else ()
        )
        if not isinstance(value, list) or len(value) != 2 or len(ids) != 2:
            raise self._wrong(key, value, "a position [ledgerId, entryId]")
        return (ids[0], ids[1])

    def optional_position(self, key: str) -> Position | None:
        return None if self.doc.get(key, _MISSING) is None else self.position(key)

    def format(self, key: str = "format") -> FormatVersion:
        value = self.integer(key)
        version = _FORMATS.get(value)
        if version is None:
            raise self.error(f"field {key!r} is {value}, not a format version (1 or 2)")
        return version


_KINDS = (OpenAction.kind, PartAction.kind, SealAction.kind, RequestsAction.kind, StatsAction.kind)
_SEGMENT_KINDS = frozenset((OpenAction.kind, PartAction.kind, SealAction.kind))


def _action_of(p: _Packed) -> Action:
    info = _Info.of(p)
    if p.kind not in _KINDS:
        raise info.error(f"its kind {p.kind!r} is none of {', '.join(_KINDS)}")
    if not p.topic:
        raise info.error("its topic is empty")
    if bool(p.segment) != (p.kind in _SEGMENT_KINDS):
        raise info.error("it names a segment" if p.segment else "it names no segment")
    if p.part_number < 0:
        raise info.error(f"its part number is {p.part_number}")
    if p.kind == OpenAction.kind:
        if p.part_number or p.data:
            raise info.error("it carries a part number or data")
        return OpenAction(
            p.topic, p.segment, p.manifest, p.data_key, p.index_key, info.integer("ordinal"), info.text("method")
        )
    if p.kind == PartAction.kind:
        if p.part_number < 1:
            raise info.error(f"its part number is {p.part_number}, not 1 or more")
        if not p.data:
            raise info.error("it carries no block layouts")
        if p.manifest or p.index_key:
            raise info.error("it carries a manifest or an index key")
        offset = info.integer("offset")
        first_block: int | None = None
        checksums = info.inner("checksums")
        if checksums is not None:
            first_block = checksums.integer("first_block", 1)
            at = checksums.integer("offset")
            if at != offset:
                raise info.error(f"its checksums start at {at}, the part at {offset}")
        return PartAction(
            p.topic,
            p.segment,
            p.part_number,
            p.data,
            p.data_key,
            info.text("manifest_key"),
            info.format(),
            info.integer("length"),
            offset,
            info.flag("last"),
            first_block,
        )
    if p.kind == SealAction.kind:
        parts = info.integer("parts")
        if parts != p.part_number:
            raise info.error(f"its info says {parts} parts, its header {p.part_number}")
        return SealAction(
            p.topic,
            p.segment,
            p.part_number,
            p.data,
            p.manifest,
            p.data_key,
            p.index_key,
            info.text("reason"),
            info.integer("data_length"),
            info.integer("entries"),
            info.integer("entry_bytes"),
            info.integer("ordinal"),
            info.position("end"),
            info.format(),
            info.integer("epoch"),
            info.texts("requests"),
        )
    if p.part_number or p.data or p.manifest or p.data_key or p.index_key:
        raise info.error("it carries a part number, data, a manifest or keys")
    if p.kind == RequestsAction.kind:
        return RequestsAction(p.topic, info.texts("requests"))
    return StatsAction(
        p.topic,
        info.integer("buffered_bytes"),
        info.optional_text("open_segment"),
        info.integer("open_segment_entries"),
        info.integer("open_segment_bytes"),
        info.optional_integer("open_segment_assigned_ms"),
        info.optional_position("last_position"),
        info.integer("now_ms", None),
        info.integer("batch_entries"),
        info.integer("batch_bytes"),
        info.optional_integer("wake_ms"),
        info.seconds("read_throttled_s"),
    )
