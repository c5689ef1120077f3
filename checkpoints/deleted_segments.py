"""Deleted-segment records and their summary: what retention (or ``delete-ledger``) leaves of a segment
it deleted, so offload totals survive the deletion, and the rule choosing what may be deleted.

A deletion writes ``_meta/deleted-segments/<uuid>`` (a :class:`DeletedRecord`, with the segment's counts)
before it drops the manifest and the objects; compaction (``checkpoints.metadata_view``) later folds the
records into a create-only version of ``_meta/deleted-summary/<seq>`` (a :class:`DeletedSummary`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TypeVar

from google.protobuf.message import DecodeError

from streamoffload.checkpoints import manifest as mf
from streamoffload.codecs.errors import FormatError
from streamoffload.codecs.metadata import msb_lsb_to_uuid
from streamoffload.codecs.positions import Position
from streamoffload.codecs.proto.offload_manifest_pb2 import DeletedLedger, DeletedSegment, SegmentManifest


@dataclass(frozen=True)
class DeletedRecord:
    """What ``_meta/deleted-segments/<uuid>`` says of a segment retention (or ``delete-ledger``) deleted.

    Records are JSON (the ``DeletedSegment`` protobuf has no counts and ``offload_manifest.proto`` is not
    regenerated here); records written before are protobuf and decode with the counts unknown (None)."""

    segment_id: str
    start: Position
    end: Position
    deleted_ms: int
    ordinal: int | None = None
    entries: int | None = None
    entry_bytes: int | None = None
    data_length: int | None = None
    seal_reason: str = ""
    data_key: str = ""
    index_key: str = ""
    checksum_blocks: int = 0
    """How many block checksum records the segment had (``<data key>-crc-1..n``; 0: none recorded)."""

    @classmethod
    def of(cls, manifest: SegmentManifest, deleted_ms: int) -> DeletedRecord:
        return cls(
            segment_id=str(mf.manifest_uuid(manifest)),
            start=mf.start_position(manifest),
            end=mf.end_position(manifest),
            deleted_ms=deleted_ms,
            ordinal=manifest.ordinal,
            entries=manifest.entries,
            entry_bytes=manifest.entryBytes,
            data_length=manifest.dataLength,
            seal_reason=manifest.sealReason,
            data_key=manifest.dataKey,
            index_key=manifest.indexKey,
            checksum_blocks=mf.checksum_blocks(manifest),
        )

    def encode(self) -> bytes:
        doc = {
            "segment": self.segment_id,
            "ordinal": self.ordinal,
            "start": list(self.start),
            "end": list(self.end),
            "deletedTimestamp": self.deleted_ms,
            "entries": self.entries,
            "entryBytes": self.entry_bytes,
            "dataLength": self.data_length,
            "sealReason": self.seal_reason,
            "dataKey": self.data_key,
            "indexKey": self.index_key,
            **({"checksumBlocks": self.checksum_blocks} if self.checksum_blocks else {}),
        }
        return json.dumps(doc, sort_keys=True).encode()

    @classmethod
    def decode(cls, data: bytes, where: str) -> DeletedRecord:
        if data[:1] == b"{":
            try:
                doc = json.loads(data)
                return cls(
                    segment_id=str(doc["segment"]),
                    start=(int(doc["start"][0]), int(doc["start"][1])),
                    end=(int(doc["end"][0]), int(doc["end"][1])),
                    deleted_ms=int(doc["deletedTimestamp"]),
                    ordinal=_opt_int(doc.get("ordinal")),
                    entries=_opt_int(doc.get("entries")),
                    entry_bytes=_opt_int(doc.get("entryBytes")),
                    data_length=_opt_int(doc.get("dataLength")),
                    seal_reason=str(doc.get("sealReason") or ""),
                    data_key=str(doc.get("dataKey") or ""),
                    index_key=str(doc.get("indexKey") or ""),
                    checksum_blocks=int(doc.get("checksumBlocks") or 0),
                )
            except (ValueError, KeyError, TypeError, IndexError) as err:
                raise FormatError(f"not a deleted-segment record: {err}", where=where) from None
        record = DeletedSegment()
        try:
            record.ParseFromString(data)
        except DecodeError as err:
            raise FormatError(f"not a deleted-segment record: {err}", where=where) from None
        if not record.IsInitialized():  # an empty or cut-short object parses, as zeros
            raise FormatError("not a deleted-segment record: required fields missing", where=where)
        return cls(
            segment_id=str(msb_lsb_to_uuid(record.uidMsb, record.uidLsb)),
            start=(record.startLedgerId, record.startEntryId),
            end=(record.endLedgerId, record.endEntryId),
            deleted_ms=record.deletedTimestamp,
        )

    @property
    def has_counts(self) -> bool:
        return self.entries is not None and self.entry_bytes is not None and self.data_length is not None


def _opt_int(value: object) -> int | None:
    return None if value is None else int(value)  # type: ignore[call-overload]


@dataclass
class DeletedTotals:
    """Counts of deleted segments: what metrics need to keep their totals across restarts."""

    segments: int = 0
    entries: int = 0
    entry_bytes: int = 0
    data_length: int = 0
    seals: dict[str, int] = field(default_factory=dict)
    size_log2: dict[int, int] = field(default_factory=dict)
    """Data object sizes by ``ceil(log2(size))`` (a size ``s`` is <= ``2**k`` for every ``k`` >= its class)."""

    def add(self, entries: int, entry_bytes: int, data_length: int, reason: str) -> None:
        self.segments += 1
        self.entries += entries
        self.entry_bytes += entry_bytes
        self.data_length += data_length
        reason = reason or "unknown"
        self.seals[reason] = self.seals.get(reason, 0) + 1
        klass = size_class(data_length)
        self.size_log2[klass] = self.size_log2.get(klass, 0) + 1

    def add_record(self, record: DeletedRecord) -> None:
        if record.has_counts:
            self.add(record.entries or 0, record.entry_bytes or 0, record.data_length or 0, record.seal_reason)

    def remove(self, entries: int, entry_bytes: int, data_length: int, reason: str) -> None:
        """Undo one ``add`` of the same figures (a folded segment deleted: ``MetadataView``'s fold)."""
        self.segments -= 1
        self.entries -= entries
        self.entry_bytes -= entry_bytes
        self.data_length -= data_length
        _decrement(self.seals, reason or "unknown")
        _decrement(self.size_log2, size_class(data_length))

    def merge(self, other: DeletedTotals) -> None:
        self.segments += other.segments
        self.entries += other.entries
        self.entry_bytes += other.entry_bytes
        self.data_length += other.data_length
        for reason, n in other.seals.items():
            self.seals[reason] = self.seals.get(reason, 0) + n
        for klass, n in other.size_log2.items():
            self.size_log2[klass] = self.size_log2.get(klass, 0) + n

    def copy(self) -> DeletedTotals:
        return DeletedTotals(
            self.segments, self.entries, self.entry_bytes, self.data_length, dict(self.seals), dict(self.size_log2)
        )

    def to_json(self) -> dict[str, object]:
        return {
            "segments": self.segments,
            "entries": self.entries,
            "entryBytes": self.entry_bytes,
            "dataLength": self.data_length,
            "seals": dict(sorted(self.seals.items())),
            "sizeLog2": {str(k): v for k, v in sorted(self.size_log2.items())},
        }

    @classmethod
    def from_json(cls, doc: dict[str, object]) -> DeletedTotals:
        seals = doc.get("seals") or {}
        sizes = doc.get("sizeLog2") or {}
        return cls(
            int(doc.get("segments", 0)),  # type: ignore[call-overload]
            int(doc.get("entries", 0)),  # type: ignore[call-overload]
            int(doc.get("entryBytes", 0)),  # type: ignore[call-overload]
            int(doc.get("dataLength", 0)),  # type: ignore[call-overload]
            {str(k): int(v) for k, v in seals.items()},  # type: ignore[attr-defined]
            {int(k): int(v) for k, v in sizes.items()},  # type: ignore[attr-defined]
        )


K = TypeVar("K")


def _decrement(counts: dict[K, int], key: K) -> None:
    left = counts.get(key, 0) - 1
    if left > 0:
        counts[key] = left
    else:
        counts.pop(key, None)


def size_class(size: int) -> int:
    """``ceil(log2(size))`` (0 for sizes up to 1)."""
    return max(0, (int(size) - 1).bit_length())


@dataclass(frozen=True)
class DeletedSummary:
    """One version of ``_meta/deleted-summary/``: the totals of every folded record, and the ids folded by
    the compaction that wrote it (``pending``: a record still listed with one of those ids is already
    counted here, its removal was interrupted)."""

    seq: int
    totals: DeletedTotals
    pending: frozenset[str]

    def encode(self) -> bytes:
        doc = {"seq": self.seq, "totals": self.totals.to_json(), "pending": sorted(self.pending)}
        return json.dumps(doc, sort_keys=True).encode()

    @classmethod
    def decode(cls, data: bytes, where: str) -> DeletedSummary:
        try:
            doc = json.loads(data)
            return cls(int(doc["seq"]), DeletedTotals.from_json(doc["totals"]), frozenset(map(str, doc["pending"])))
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise FormatError(f"not a deleted-segment summary: {err}", where=where) from None


def select_deletable(
    segments: list[SegmentManifest], marks: dict[int, DeletedLedger], lag_ms: int, at_ms: int
) -> list[SegmentManifest]:
    """Offloaded segments whose ledgers are ALL marked deleted, the newest mark older than the lag."""
    return [m for m in segments if all_marked([info.ledgerId for info in m.ledgers], marks, lag_ms, at_ms)]


def all_marked(ledger_ids: list[int], marks: dict[int, DeletedLedger], lag_ms: int, at_ms: int) -> bool:
    """Every one of a segment's ledgers (at least one) is marked deleted, each mark older than the lag."""
    return bool(ledger_ids) and all(
        lid in marks and marks[lid].deletedTimestamp + lag_ms <= at_ms for lid in ledger_ids
    )
