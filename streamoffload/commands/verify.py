"""``streamoffload verify``: check stored segments against themselves and each other.

For every Offloaded segment of the chosen topic-partitions (or for one segment named by its object keys):
both objects exist and carry format version 1 in their user metadata; the index decodes (magic, lengths,
order, offsets inside the data object); every data block decodes (magic, header, entry framing, padding,
order) and matches the index (``verify_against_blocks``); every entry parses as a Pulsar entry, its batch
splits into messages, and with ``--crc`` its CRC-32C matches; the manifest agrees with the objects (format,
lengths, start and end positions, counts, per-ledger spans); consecutive segments do not overlap.

Per topic-partition, the history as a whole: every manifest decodes (checksum frame, required fields, known
status: ``CorruptManifest`` names its key); every place of the history (``_meta/commits/<ordinal>``) from the
first one still offloaded is held by an Offloaded segment or a deletion record (``MissingSegment``,
``GapInHistory``); consecutive places follow each other within a ledger (``GapBetweenSegments``,
``OverlappingSegments``); Failed attempts (``FailedSegment``) and Assigned ones that are superseded or older
than ``--stale-minutes`` (``StaleSegment``) are problems. A topic whose segments were all deleted (deletion
records or commits remain) is fine; one with nothing at all is ``NoSegments``.

Every problem names the object and the byte offset. The exit status is 1 if there is any problem.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import re
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from google.protobuf.message import DecodeError

from streamoffload.checkpoints import manifest as mf
from streamoffload.cli_common import (
    add_store_args,
    config_from_args,
    float_arg,
    ledger_id_arg,
    open_existing_store,
    topic_arg,
)
from streamoffload.codecs.blocks import (
    BLOCK_HEADER_LENGTH,
    ENTRY_HEADER_LENGTH,
    BlockHeader,
    DecodedBlock,
    FormatVersion,
    OrderingError,
    decode_block,
)
from streamoffload.codecs.entry import CompressionType, decode_entry, split_messages
from streamoffload.codecs.errors import BadMagicError, FormatError, TruncatedError
from streamoffload.codecs.index import V1_INDEX_MAGIC, OffloadIndex, verify_against_blocks
from streamoffload.codecs.metadata import msb_lsb_to_uuid, parse_ledger_info, parse_ledger_metadata_v1
from streamoffload.codecs.proto.offload_manifest_pb2 import DeletedSegment, SegmentManifest
from streamoffload.codecs.topics import TopicName
from streamoffload.config import MAX_RETENTION_MINUTES
from streamoffload.errors import StreamOffloadError
from streamoffload.storage import keys
from streamoffload.storage.base import ObjectInfo, ObjectNotFoundError, ObjectStore
from streamoffload.storage.keys import FORMAT_VERSION_METADATA_KEY, SUPPORTED_FORMAT_VERSION, ledger_id_in_key

EPILOG = """\
examples:
  streamoffload verify --store file:///var/offload
  streamoffload verify --conf conf/streamoffload.toml persistent://public/default/orders-partition-0 --crc
  streamoffload verify --store s3://bucket/offload --s3-endpoint http://127.0.0.1:9000 --json
  streamoffload verify --store file:///var/offload --data-key public/default/t/UUID \\
      --index-key public/default/t/UUID-index

Without TOPIC, every topic-partition with offload metadata in the store is checked. Only Offloaded segments
are read; Assigned ones (work in progress) are counted in the summary, and are problems once superseded or
older than --stale-minutes; Failed ones are always problems (the next run, or cleanup, removes them).
Problems are printed as "PROBLEM <object> @<offset>: <error>: <message>"; the exit status is 1 if any."""

_SPLITTABLE = (CompressionType.NONE, CompressionType.ZLIB)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "verify",
        help="check offloaded objects: magic, lengths, index vs data, manifests, entries (and CRCs)",
        description=(
            "Check stored data and index objects and their offload metadata against each other, and every "
            "entry as a Pulsar entry; print a summary and exit non-zero on any problem, naming object and offset."
        ),
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_store_args(parser)
    parser.add_argument("topic_names", metavar="TOPIC", nargs="*", help="topic-partitions to check (default: all)")
    parser.add_argument("--crc", action="store_true", help="also check every entry's CRC-32C (Pulsar's checksum)")
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of a summary")
    parser.add_argument(
        "--stale-minutes",
        type=float,
        default=STALE_MINUTES,
        metavar="M",
        help="report Assigned segments open longer than this as stale (default %(default)g)",
    )
    parser.add_argument("--data-key", metavar="KEY", help="check this data object (no metadata needed)")
    parser.add_argument("--index-key", metavar="KEY", help="its index object (default: DATA_KEY-index)")
    parser.add_argument(
        "--ledger-id", type=int, metavar="N", help="ledger id of a v1 data object not named ...-ledger-<N>"
    )
    parser.set_defaults(func=run)


class VerifyError(StreamOffloadError):
    """Arguments that select nothing to verify."""


@dataclass
class Problem:
    object: str
    offset: int | None
    error: str
    message: str
    topic: str | None = None
    segment: str | None = None

    def line(self) -> str:
        at = f" @{self.offset}" if self.offset is not None else ""
        return f"PROBLEM {self.object}{at}: {self.error}: {self.message}"


@dataclass
class SegmentReport:
    data_key: str
    index_key: str
    topic: str | None = None
    segment: str | None = None
    format: str | None = None
    data_length: int = 0
    blocks: int = 0
    entries: int = 0
    entry_bytes: int = 0
    messages: int = 0
    crc_checked: int = 0
    compressed_unsplit: int = 0
    first: tuple[int, int] | None = None
    last: tuple[int, int] | None = None
    problems: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


@dataclass
class _LedgerTally:
    first: int
    last: int
    entries: int = 0
    size: int = 0


class _Checker:
    """Verifies one segment; records problems instead of stopping at the first object that fails."""

    def __init__(
        self,
        store: ObjectStore,
        report: SegmentReport,
        *,
        crc: bool,
        ledger_id: int | None,
        manifest: SegmentManifest | None,
        manifest_key: str | None,
    ) -> None:
        self.store = store
        self.report = report
        self.crc = crc
        self.ledger_id = ledger_id
        self.manifest = manifest
        self.manifest_key = manifest_key
        self.tallies: dict[int, _LedgerTally] = {}

    def problem(self, obj: str, offset: int | None, error: str, message: str) -> None:
        r = self.report
        r.problems.append(Problem(obj, offset, error, message, r.topic, r.segment))

    def failed(self, err: StreamOffloadError, default_object: str) -> None:
        if isinstance(err, FormatError):
            self.problem(err.where or default_object, err.offset, type(err).__name__, err.reason)
        else:
            self.problem(default_object, None, type(err).__name__, str(err))

    def head(self, key: str, what: str) -> ObjectInfo | None:
        try:
            info = self.store.head(key)
        except ObjectNotFoundError:
            self.problem(key, None, "MissingObject", f"{what} object does not exist")
            return None
        version = info.metadata.get(FORMAT_VERSION_METADATA_KEY)
        if version is not None and version != SUPPORTED_FORMAT_VERSION:
            self.problem(
                key,
                None,
                "UnsupportedFormatVersion",
                f"user metadata {FORMAT_VERSION_METADATA_KEY}={version!r}, expected {SUPPORTED_FORMAT_VERSION!r}",
            )
        return info

    def run(self) -> None:
        r = self.report
        data_info = self.head(r.data_key, "data")
        index_info = self.head(r.index_key, "index")
        index: OffloadIndex | None = None
        if index_info is not None:
            index = self.decode_index(index_info)
        if data_info is None:
            return
        r.data_length = data_info.size
        blocks = self.walk_data(data_info.size, index.version if index is not None else None)
        try:
            if index is not None:
                verify_against_blocks(index, blocks, data_info.size, where=r.data_key)
                self.check_index_metadata(index)
            else:
                for _ in blocks:
                    pass
        except StreamOffloadError as err:
            self.failed(err, r.data_key)
            return
        if self.manifest is not None:
            self.check_manifest(self.manifest, data_info, index_info)

    def decode_index(self, info: ObjectInfo) -> OffloadIndex | None:
        key = self.report.index_key
        try:
            raw = self.store.get(key)
        except ObjectNotFoundError:
            self.problem(key, None, "MissingObject", "index object disappeared while being verified")
            return None
        ledger_id = self.ledger_id
        if ledger_id is None:
            ledger_id = ledger_id_in_key(self.report.data_key)
        try:
            if raw[:4] == V1_INDEX_MAGIC.to_bytes(4, "big") and ledger_id is None:
                raise VerifyError(
                    "v1 index, which does not record its ledger id, of a data object not named -ledger-<id>: "
                    "give --ledger-id"
                )
            return OffloadIndex.decode(raw, ledger_id=ledger_id, where=key)
        except StreamOffloadError as err:
            self.failed(err, key)
            return None

    def walk_data(self, size: int, expected: FormatVersion | None) -> Iterator[DecodedBlock]:
        """Decode the data object block by block (one ranged GET per block), checking every entry."""
        r = self.report
        key = r.data_key
        offset = 0
        version: FormatVersion | None = None
        last: tuple[int, int] | None = None
        if size == 0:
            raise TruncatedError("data object is empty", offset=0, where=key)
        while offset < size:
            head = self.store.get_range(key, offset, min(BLOCK_HEADER_LENGTH, size - offset))
            header = BlockHeader.decode(head, where=key, base_offset=offset)
            if version is None:
                version = header.version
                r.format = version.label
                if expected is not None and version is not expected:
                    raise BadMagicError(
                        f"{version.label} data object, but its index is {expected.label}", offset=0, where=key
                    )
            elif header.version is not version:
                raise BadMagicError(
                    f"{header.version.label} block inside a {version.label} data object", offset=offset, where=key
                )
            if offset + header.block_length > size:
                raise TruncatedError(
                    f"block of {header.block_length} bytes runs past the end of the {size}-byte data object",
                    offset=offset,
                    where=key,
                )
            raw = self.store.get_range(key, offset, header.block_length)
            block = decode_block(raw, where=key, base_offset=offset)
            ledger = header.ledger_id if header.ledger_id is not None else self.v1_ledger()
            position = (ledger, header.first_entry_id)
            if last is not None and position <= last:
                raise OrderingError(
                    f"block starting at {position[0]}:{position[1]} does not follow the previous block, which ends "
                    f"at {last[0]}:{last[1]}",
                    offset=offset + (28 if version is FormatVersion.V2 else 20),
                    where=key,
                )
            for entry in block.entries:
                self.check_entry(ledger, entry.entry_id, entry.payload, offset + entry.offset + ENTRY_HEADER_LENGTH)
            last = (ledger, block.last_entry_id)
            r.last = last
            if r.first is None:
                r.first = position
            r.blocks += 1
            yield dataclasses.replace(block, offset=offset)
            offset += header.block_length

    def v1_ledger(self) -> int:
        if self.ledger_id is not None:
            return self.ledger_id
        if self.manifest is not None:
            return self.manifest.startLedgerId
        found = ledger_id_in_key(self.report.data_key)
        return -1 if found is None else found

    def check_entry(self, ledger: int, entry_id: int, payload: memoryview, at: int) -> None:
        r = self.report
        r.entries += 1
        r.entry_bytes += len(payload)
        tally = self.tallies.get(ledger)
        if tally is None:
            tally = self.tallies[ledger] = _LedgerTally(entry_id, entry_id)
        tally.last = entry_id
        tally.entries += 1
        tally.size += len(payload)
        try:
            decoded = decode_entry(payload, verify_checksum=self.crc)
            if self.crc and decoded.checksum is not None:
                r.crc_checked += 1
            if decoded.metadata.compression in _SPLITTABLE:
                r.messages += len(split_messages(decoded))
            else:
                r.compressed_unsplit += 1
        except FormatError as err:
            raise err.located(r.data_key, at) from None

    def check_index_metadata(self, index: OffloadIndex) -> None:
        """The per-ledger metadata in the index agrees with the entries found."""
        key = self.report.index_key
        for ledger in index.ledgers:
            tally = self.tallies.get(ledger.ledger_id)
            if tally is None:
                self.problem(key, None, "IndexMismatch", f"index lists ledger {ledger.ledger_id}, the data has none")
                continue
            try:
                if index.version is FormatVersion.V1:
                    meta = parse_ledger_metadata_v1(ledger.metadata, where=key)
                    if meta.HasField("lastEntryId") and meta.lastEntryId != tally.last:
                        self.problem(
                            key,
                            None,
                            "IndexMismatch",
                            f"ledger metadata says last entry {meta.lastEntryId}, the data ends at entry {tally.last}",
                        )
                else:
                    info = parse_ledger_info(ledger.metadata, where=key)
                    if info.ledgerId != ledger.ledger_id:
                        self.problem(
                            key,
                            None,
                            "IndexMismatch",
                            f"LedgerInfo of ledger {ledger.ledger_id} names ledger {info.ledgerId}",
                        )
            except FormatError as err:
                self.failed(err, key)

    def check_manifest(self, manifest: SegmentManifest, data: ObjectInfo, index: ObjectInfo | None) -> None:
        r = self.report
        where = self.manifest_key or r.data_key

        def mismatch(message: str, obj: str | None = None, offset: int | None = None) -> None:
            self.problem(obj or r.data_key, offset, "ManifestMismatch", f"{message} (manifest {where})")

        if r.format is not None and manifest.formatVersion != int(r.format[1:]):
            mismatch(f"manifest says format version {manifest.formatVersion}, the data object is {r.format}")
        if manifest.HasField("dataLength") and manifest.dataLength != data.size:
            mismatch(f"manifest says {manifest.dataLength} data bytes, the object has {data.size}", offset=data.size)
        if index is not None and manifest.HasField("indexLength") and manifest.indexLength != index.size:
            mismatch(f"manifest says {manifest.indexLength} index bytes, the object has {index.size}", obj=r.index_key)
        start = mf.start_position(manifest)
        if r.first is not None and r.first != start:
            mismatch(f"manifest starts at {start[0]}:{start[1]}, the data at {r.first[0]}:{r.first[1]}", offset=0)
        if manifest.HasField("endEntryId"):
            end = mf.end_position(manifest)
            if r.last is not None and r.last != end:
                mismatch(f"manifest ends at {end[0]}:{end[1]}, the data at {r.last[0]}:{r.last[1]}", offset=data.size)
        if manifest.HasField("entries") and manifest.entries != r.entries:
            mismatch(f"manifest counts {manifest.entries} entries, the data holds {r.entries}")
        if manifest.HasField("entryBytes") and manifest.entryBytes != r.entry_bytes:
            mismatch(f"manifest counts {manifest.entryBytes} entry bytes, the data holds {r.entry_bytes}")
        if manifest.HasField("blockCount") and manifest.blockCount != r.blocks:
            mismatch(f"manifest counts {manifest.blockCount} blocks, the data holds {r.blocks}")
        if manifest.formatVersion == 1:
            if manifest.startLedgerId != manifest.endLedgerId:
                mismatch(f"v1 segment spans ledgers {manifest.startLedgerId}..{manifest.endLedgerId}")
            if ledger_id_in_key(r.data_key) != manifest.startLedgerId:
                mismatch(
                    f"v1 data object of ledger {manifest.startLedgerId} is not named -ledger-{manifest.startLedgerId}"
                )
        try:
            spans = {s.ledger_id: s for s in mf.spans_of(manifest)}
        except (ValueError, OverflowError) as err:  # e.g. a firstEntryId property that is not a number
            bad = [
                f"ledger {info.ledgerId} has firstEntryId {p.value!r}"
                for info in manifest.ledgers
                for p in info.properties
                if p.key == "firstEntryId" and not re.fullmatch(r"\d+", p.value)
            ]
            detail = ", ".join(bad) if bad else str(err)
            self.problem(where, None, "CorruptManifest", f"ledger spans do not decode: {detail}")
            return
        if spans and sorted(spans) != sorted(self.tallies):
            mismatch(f"manifest lists ledgers {sorted(spans)}, the data holds {sorted(self.tallies)}")
        for ledger, span in spans.items():
            tally = self.tallies.get(ledger)
            if tally is None:
                continue
            found = (tally.first, tally.last, tally.entries, tally.size)
            said = (span.first_entry_id, span.last_entry_id, span.entries, span.size)
            if found != said:
                mismatch(
                    f"ledger {ledger}: manifest says entries {said[0]}..{said[1]} ({said[2]} entries, {said[3]} "
                    f"bytes), the data holds {found[0]}..{found[1]} ({found[2]} entries, {found[3]} bytes)"
                )


def verify_segment(
    store: ObjectStore,
    data_key: str,
    index_key: str,
    *,
    crc: bool = False,
    ledger_id: int | None = None,
    manifest: SegmentManifest | None = None,
    manifest_key: str | None = None,
    topic: str | None = None,
) -> SegmentReport:
    """Verify one segment's objects (and its manifest, if given); problems are in the report."""
    segment = str(mf.manifest_uuid(manifest)) if manifest is not None else None
    report = SegmentReport(data_key, index_key, topic=topic, segment=segment)
    checker = _Checker(store, report, crc=crc, ledger_id=ledger_id, manifest=manifest, manifest_key=manifest_key)
    try:
        checker.run()
    except StreamOffloadError as err:
        checker.failed(err, data_key)
    return report


@dataclass
class TopicReport:
    topic: str
    segments: list[SegmentReport] = field(default_factory=list)
    unfinished: dict[str, int] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)
    """Problems that belong to no one segment (manifests that do not decode, overlaps, no segments)."""

    @property
    def all_problems(self) -> list[Problem]:
        return self.problems + [p for s in self.segments for p in s.problems]


STALE_MINUTES = 60.0
"""An Assigned segment older than this is reported as stale (a live job seals or abandons its open
segments well within it)."""


@dataclass
class _Known:
    """A segment the topic's history accounts for: committed, offloaded or deleted."""

    ordinal: int | None
    segment: str
    start: tuple[int, int]
    end: tuple[int, int]
    key: str


def _decode_deleted_record(data: bytes, key: str) -> _Known:
    """A deleted-segment record: JSON (with its ordinal) or the older ``DeletedSegment`` protobuf."""
    if data[:1] == b"{":
        try:
            doc = json.loads(data)
            ordinal = doc.get("ordinal")
            return _Known(
                None if ordinal is None else int(ordinal),
                str(doc["segment"]),
                (int(doc["start"][0]), int(doc["start"][1])),
                (int(doc["end"][0]), int(doc["end"][1])),
                key,
            )
        except (ValueError, KeyError, TypeError, IndexError) as err:
            raise FormatError(f"not a deleted-segment record: {err}", where=key) from None
    record = DeletedSegment()
    try:
        record.ParseFromString(data)
    except DecodeError as err:
        raise FormatError(f"not a deleted-segment record: {err}", where=key) from None
    if not record.IsInitialized():
        raise FormatError("deleted-segment record is missing required fields", where=key)
    segment = str(msb_lsb_to_uuid(record.uidMsb, record.uidLsb))
    start, end = (record.startLedgerId, record.startEntryId), (record.endLedgerId, record.endEntryId)
    return _Known(None, segment, start, end, key)


def _pos(p: tuple[int, int]) -> str:
    return f"{p[0]}:{p[1]}"


def verify_topic(
    store: ObjectStore,
    prefix: str,
    topic: TopicName,
    *,
    crc: bool = False,
    stale_ms: float = STALE_MINUTES * 60_000,
    now_ms: int | None = None,
) -> TopicReport:
    """Verify every Offloaded segment of ``topic`` and the topic's history as a whole.

    Beyond each segment's objects: manifests that do not decode (checksum, required fields, status);
    overlapping segments; gaps (a place of the history, ``_meta/commits/<ordinal>``, that no Offloaded
    segment, deletion record or commit accounts for; consecutive places whose positions do not follow
    within a ledger); commits that disagree with the manifests; Failed attempts and stale Assigned ones
    (superseded, or older than ``stale_ms``). A topic whose segments were all deleted is fine; one with
    nothing at all is ``NoSegments``."""
    name = str(topic)
    now = int(time.time() * 1000) if now_ms is None else now_ms
    report = TopicReport(name)

    def problem(obj: str, error: str, message: str, segment: str | None = None, offset: int | None = None) -> None:
        report.problems.append(Problem(obj, offset, error, message, name, segment))

    topic_dir = keys.topic_dir(prefix, topic)
    manifests_prefix = keys.manifests_prefix(prefix, topic)
    listed_anything = False

    # Manifests, strictly decoded.
    offloaded: list[tuple[SegmentManifest, str]] = []
    unfinished: list[tuple[SegmentManifest, str]] = []
    for info in store.list(manifests_prefix):
        listed_anything = True
        try:
            manifest = mf.decode_manifest(store.get(info.key), where=info.key)
        except ObjectNotFoundError:
            continue
        except FormatError as err:
            problem(info.key, "CorruptManifest", err.reason, offset=err.offset)
            continue
        except StreamOffloadError as err:
            problem(info.key, "CorruptManifest", str(err))
            continue
        (offloaded if manifest.status == mf.OFFLOADED else unfinished).append((manifest, info.key))

    # Commits: one per place of the topic's history.
    commits: dict[int, _Known] = {}
    for info in store.list(keys.commits_prefix(prefix, topic)):
        listed_anything = True
        try:
            ordinal = keys.parse_commit_name(info.key)
        except ValueError:
            continue
        try:
            held = mf.decode_manifest(store.get(info.key), where=info.key)
        except ObjectNotFoundError:
            continue
        except FormatError as err:
            problem(info.key, "CorruptCommit", err.reason, offset=err.offset)
            commits[ordinal] = _Known(ordinal, "", (-1, -1), (-1, -1), info.key)  # the place is taken
            continue
        if held.ordinal != ordinal:
            problem(info.key, "CorruptCommit", f"commit of place {ordinal} holds segment of place {held.ordinal}")
        commits[ordinal] = _Known(
            ordinal, str(mf.manifest_uuid(held)), mf.start_position(held), mf.end_position(held), info.key
        )

    # Deletion records (retention, delete-ledger) and failure notes.
    deleted: dict[str, _Known] = {}
    for info in store.list(topic_dir + keys.DELETED_SEGMENTS_DIR + "/"):
        listed_anything = True
        try:
            record = _decode_deleted_record(store.get(info.key), info.key)
        except ObjectNotFoundError:
            continue
        except FormatError as err:
            problem(info.key, "CorruptDeletionRecord", err.reason, offset=err.offset)
            continue
        deleted[record.segment] = record
    failures_prefix = keys.failures_prefix(prefix, topic)
    failed_ids = {info.key[len(failures_prefix) :]: info.key for info in store.list(failures_prefix)}
    marks = {
        ledger
        for info in store.list(keys.deleted_marks_prefix(prefix, topic))
        for ledger in _mark_ledger(info.key)
    }

    # Each Offloaded segment: its objects, its place among its neighbours, its commit.
    previous: tuple[SegmentManifest, str] | None = None
    for manifest, key in offloaded:
        seg_id = str(mf.manifest_uuid(manifest))
        if previous is not None and mf.start_position(manifest) <= mf.end_position(previous[0]):
            s, e = mf.start_position(manifest), mf.end_position(previous[0])
            problem(
                key,
                "OverlappingSegments",
                f"segment starts at {_pos(s)}, before the previous segment ({previous[1]}) ends at {_pos(e)}",
                seg_id,
            )
        previous = (manifest, key)
        commit = commits.get(manifest.ordinal)
        if commit is None:
            problem(
                key,
                "UncommittedSegment",
                f"Offloaded segment of place {manifest.ordinal} has no commit "
                f"{keys.commit_key(prefix, topic, manifest.ordinal)}",
                seg_id,
            )
        elif commit.segment and commit.segment != seg_id:
            problem(
                key,
                "ConflictingCommit",
                f"Offloaded segment {seg_id} of place {manifest.ordinal}, but the commit {commit.key} holds "
                f"segment {commit.segment}",
                seg_id,
            )
        report.segments.append(
            verify_segment(
                store, manifest.dataKey, manifest.indexKey, crc=crc, manifest=manifest, manifest_key=key, topic=name
            )
        )

    # The history: every place from the first one still offloaded (earlier ones may have gone to retention,
    # their commits compacted) to the newest commit is offloaded, deleted, or at least committed.
    by_ordinal: dict[int, _Known] = {}
    for ordinal, commit in commits.items():
        by_ordinal[ordinal] = commit
    for record in deleted.values():
        if record.ordinal is not None:
            by_ordinal.setdefault(record.ordinal, record)
    live = {m.ordinal: (m, key) for m, key in reversed(offloaded)}
    for ordinal, (m, key) in live.items():
        by_ordinal[ordinal] = _Known(ordinal, str(mf.manifest_uuid(m)), mf.start_position(m), mf.end_position(m), key)
    deleted_ids = set(deleted)
    for ordinal, commit in sorted(commits.items()):
        if ordinal in live or not commit.segment or commit.segment in deleted_ids:
            continue
        problem(
            commit.key,
            "MissingSegment",
            f"place {ordinal} of the history was committed to segment {commit.segment} "
            f"({_pos(commit.start)}..{_pos(commit.end)}), which has no Offloaded manifest and no deletion "
            f"record: its entries cannot be read",
            commit.segment,
        )
    if live:
        first = min(live)
        last = max(by_ordinal)
        for ordinal in range(first, last + 1):
            if ordinal in by_ordinal:
                continue
            before = max((o for o in by_ordinal if o < ordinal), default=None)
            after = min((o for o in by_ordinal if o > ordinal), default=None)
            lo = by_ordinal[before].end if before is not None else None
            hi = by_ordinal[after].start if after is not None else None
            if lo is not None and hi is not None and lo[0] >= 0 and hi[0] >= 0 and any(
                lo[0] <= ledger <= hi[0] for ledger in marks
            ):
                continue  # deleted by retention or delete-ledger, its records compacted away
            where = keys.commit_key(prefix, topic, ordinal)
            span = f" (between {_pos(lo)} and {_pos(hi)})" if lo is not None and hi is not None else ""
            problem(
                where,
                "GapInHistory",
                f"place {ordinal} of the history is missing: no commit, no Offloaded segment, no deletion record{span}",
            )
        ordered = sorted(by_ordinal.items())
        for (o1, a), (o2, b) in itertools.pairwise(ordered):
            if o2 != o1 + 1 or a.end[0] < 0 or b.start[0] < 0:
                continue
            if o1 in live and o2 in live and b.start <= a.end:
                continue  # reported above, by manifest
            if b.start[0] == a.end[0] and b.start[1] != a.end[1] + 1:
                kind = "GapBetweenSegments" if b.start[1] > a.end[1] + 1 else "OverlappingSegments"
                problem(
                    b.key,
                    kind,
                    f"place {o2} starts at {_pos(b.start)}, but place {o1} ({a.key}) ends at {_pos(a.end)}: "
                    + (
                        f"entries {a.end[1] + 1}..{b.start[1] - 1} of ledger {a.end[0]} are in no segment"
                        if kind == "GapBetweenSegments"
                        else "they overlap"
                    ),
                    b.segment,
                )
            elif b.start < a.end:
                problem(
                    b.key,
                    "OverlappingSegments",
                    f"place {o2} starts at {_pos(b.start)}, before place {o1} ({a.key}) ends at {_pos(a.end)}",
                    b.segment,
                )

    # Unfinished attempts: Failed ones always, Assigned ones once superseded or stale.
    newest_end = max((k.end for k in by_ordinal.values() if k.end[0] >= 0), default=None)
    for manifest, key in unfinished:
        seg_id = str(mf.manifest_uuid(manifest))
        failed = manifest.status == mf.FAILED or seg_id in failed_ids
        status = "Failed" if failed else mf.STATUS_NAMES[manifest.status]
        report.unfinished[status] = report.unfinished.get(status, 0) + 1
        start = mf.start_position(manifest)
        holder = by_ordinal.get(manifest.ordinal)
        age_ms = now - manifest.assignedTimestamp if manifest.HasField("assignedTimestamp") else None
        if failed:
            why = manifest.failure if manifest.status == mf.FAILED else ""
            problem(
                key,
                "FailedSegment",
                f"attempt at place {manifest.ordinal} from {_pos(start)} failed"
                + (f": {why}" if why else f" (see {failed_ids[seg_id]})" if seg_id in failed_ids else "")
                + "; the job's next run abandons it and reads its entries again, cleanup removes it",
                seg_id,
            )
        elif (holder is not None and holder.segment and holder.segment != seg_id) or (
            newest_end is not None and start <= newest_end
        ):
            problem(
                key,
                "StaleSegment",
                f"Assigned attempt at place {manifest.ordinal} from {_pos(start)} is superseded by a committed "
                "segment; cleanup removes it",
                seg_id,
            )
        elif age_ms is not None and age_ms > stale_ms:
            problem(
                key,
                "StaleSegment",
                f"Assigned attempt at place {manifest.ordinal} from {_pos(start)} has been open for "
                f"{age_ms / 60_000:.0f} minutes (more than {stale_ms / 60_000:g}): no job is finishing it",
                seg_id,
            )

    if not listed_anything:
        problem(manifests_prefix, "NoSegments", "no segment manifests for this topic-partition")
    return report


def _mark_ledger(key: str) -> list[int]:
    try:
        return [keys.parse_deleted_mark(key)]
    except ValueError:
        return []


def _under(prefix: str, key: str) -> str:
    key = key.strip("/")
    if not prefix or key.startswith(prefix + "/"):
        return key
    return f"{prefix}/{key}"


def _segment_json(s: SegmentReport) -> dict[str, Any]:
    return {
        "topic": s.topic,
        "segment": s.segment,
        "data_key": s.data_key,
        "index_key": s.index_key,
        "format": s.format,
        "data_length": s.data_length,
        "blocks": s.blocks,
        "entries": s.entries,
        "entry_bytes": s.entry_bytes,
        "messages": s.messages,
        "crc_checked": s.crc_checked,
        "compressed_unsplit": s.compressed_unsplit,
        "first": list(s.first) if s.first else None,
        "last": list(s.last) if s.last else None,
        "ok": s.ok,
    }


def _refuse_unknown_topics(store: ObjectStore, prefix: str, names: list[TopicName]) -> None:
    """A named topic-partition with no object at all in the store is a mistyped name: one error line listing
    what the store holds (as ``read`` says), not a report of one problem. One with objects but no manifest
    stays a problem of the report."""
    stored = keys.list_topic_dirs(store, prefix)
    missing = [str(n) for n in names if n not in stored]
    if missing:
        shown = ", ".join(str(t) for t in stored[:10]) + (", ..." if len(stored) > 10 else "")
        raise VerifyError(
            f"no offloaded data for topic {', '.join(missing)} in {store.url}"
            + (f" under prefix {prefix!r}" if prefix else "")
            + (f" (topics with offloaded data: {shown})" if stored else " (no topic has offloaded data there)")
        )


def run(args: argparse.Namespace) -> int:
    ledger_id_arg(args.ledger_id, "--ledger-id")
    float_arg(args.stale_minutes, "--stale-minutes", 0, MAX_RETENTION_MINUTES, "the staleness age is minutes")
    config, _ = config_from_args(args)
    prefix = config.store.key_prefix
    if args.index_key and not args.data_key:
        raise VerifyError("--index-key needs --data-key")
    names = [topic_arg(t, config) for t in args.topic_names]
    store = open_existing_store(config.store)
    try:
        topics: list[TopicReport] = []
        loose: list[SegmentReport] = []
        if args.data_key:
            data_key = _under(prefix, args.data_key)
            index_key = _under(prefix, args.index_key) if args.index_key else keys.index_key_for(data_key)
            loose.append(verify_segment(store, data_key, index_key, crc=args.crc, ledger_id=args.ledger_id))
        if names:
            _refuse_unknown_topics(store, prefix, names)
        elif not args.data_key:
            names = keys.list_topic_dirs(store, prefix)
            if not names:
                raise VerifyError(
                    f"no offloaded topics in {store.url}" + (f" under prefix {prefix!r}" if prefix else "")
                )
        for name in names:
            topics.append(verify_topic(store, prefix, name, crc=args.crc, stale_ms=args.stale_minutes * 60_000))
    finally:
        store.close()

    segments = loose + [s for t in topics for s in t.segments]
    problems = [p for s in loose for p in s.problems] + [p for t in topics for p in t.all_problems]
    totals = {
        "topics": len(topics),
        "segments": len(segments),
        "v1_segments": sum(1 for s in segments if s.format == "v1"),
        "v2_segments": sum(1 for s in segments if s.format == "v2"),
        "blocks": sum(s.blocks for s in segments),
        "entries": sum(s.entries for s in segments),
        "entry_bytes": sum(s.entry_bytes for s in segments),
        "data_bytes": sum(s.data_length for s in segments),
        "messages": sum(s.messages for s in segments),
        "crc_checked": sum(s.crc_checked for s in segments),
        "problems": len(problems),
    }
    if args.json:
        doc = {
            "ok": not problems,
            "crc": args.crc,
            "totals": totals,
            "topics": [
                {
                    "topic": t.topic,
                    "segments": len(t.segments),
                    "unfinished": t.unfinished,
                    "ok": not t.all_problems,
                }
                for t in topics
            ],
            "segments": [_segment_json(s) for s in segments],
            "problems": [dataclasses.asdict(p) for p in problems],
        }
        json.dump(doc, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        _print_summary(topics, loose, problems, totals, crc=args.crc)
    return 1 if problems else 0


def _print_summary(
    topics: list[TopicReport],
    loose: list[SegmentReport],
    problems: list[Problem],
    totals: dict[str, int],
    *,
    crc: bool,
) -> None:
    out = sys.stdout
    for s in loose:
        state = "OK" if s.ok else f"{len(s.problems)} problem(s)"
        out.write(
            f"{s.data_key}: {s.format or '?'}, {s.blocks} blocks, {s.entries} entries, {s.data_length} bytes: {state}\n"
        )
    for t in topics:
        versions = sorted({s.format for s in t.segments if s.format})
        extra = "".join(f", {n} {status}" for status, n in sorted(t.unfinished.items()))
        state = "OK" if not t.all_problems else f"{len(t.all_problems)} problem(s)"
        out.write(
            f"{t.topic}: {len(t.segments)} offloaded segments ({'/'.join(versions) or '-'}){extra}, "
            f"{sum(s.entries for s in t.segments)} entries: {state}\n"
        )
    for p in problems:
        out.write(p.line() + "\n")
    checks = "framing, index, manifests, entries" + (", CRC-32C" if crc else "")
    verdict = "OK" if not problems else f"{len(problems)} PROBLEM(S)"
    out.write(
        f"verified {totals['segments']} segments ({totals['v2_segments']} v2, {totals['v1_segments']} v1), "
        f"{totals['blocks']} blocks, {totals['entries']} entries, {totals['data_bytes']} data bytes "
        f"[{checks}]: {verdict}\n"
    )
