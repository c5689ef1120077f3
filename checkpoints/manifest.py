"""Segment manifests: the offload metadata of one segment (protobuf ``SegmentManifest``).

Pure code: building, encoding and decoding manifests. ``checkpoints.metadata_store`` does the I/O.

Stored manifests (``_meta/segments/...``) and commits (``_meta/commits/<ordinal>``) are framed with a magic
and a CRC-32C (``encode_manifest``) and decoded strictly (``decode_manifest``): a damaged manifest is an
error naming its key, never a different manifest.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from google.protobuf.message import DecodeError

from streamoffload import __version__
from streamoffload.codecs import checksums
from streamoffload.codecs.block_frames import Frame, decode_table
from streamoffload.codecs.errors import FormatError
from streamoffload.codecs.frame import FRAME_LENGTH, frame, unframe
from streamoffload.codecs.metadata import msb_lsb_to_uuid, uuid_to_msb_lsb
from streamoffload.codecs.positions import Position
from streamoffload.codecs.proto.offload_manifest_pb2 import DeletedLedger, DeletedSegment, SegmentManifest
from streamoffload.codecs.protobuf import missing_fields
from streamoffload.codecs.topics import TopicName, TopicNameError
from streamoffload.storage import keys

ASSIGNED = SegmentManifest.ASSIGNED
OFFLOADED = SegmentManifest.OFFLOADED
FAILED = SegmentManifest.FAILED
STATUS_NAMES: dict[int, str] = {ASSIGNED: "Assigned", OFFLOADED: "Offloaded", FAILED: "Failed"}

DRIVER_NAME = "streamoffload"

# Deterministic segment ids: a replayed micro-batch must reproduce the same object names.
_SEGMENT_NAMESPACE = uuid.UUID("6f1d3c1e-7a44-5d8e-9b0a-3c5e2f7d9a10")


def segment_uuid(topic: str, ordinal: int, start: Position, epoch: int = 0) -> uuid.UUID:
    """The segment's id: a function of the writer's lease epoch and the segment's place, so a replayed
    micro-batch reproduces it while no two writers (or two runs of one) ever share an id."""
    return uuid.uuid5(_SEGMENT_NAMESPACE, f"{topic}|{epoch}|{ordinal}|{start[0]}:{start[1]}")


# Driver metadata properties of our manifests (OffloadDriverMetadata, as Pulsar's offloaders keep theirs).
PROP_METHOD = "method"
PROP_EPOCH = "epoch"
PROP_POLICY = "policy"
"""The offload policy the segment was opened under (JSON): its replays use it, whatever the config says now."""
PROP_BLOCK_CHECKSUMS = checksums.PROP_BLOCK_CHECKSUMS
PROP_INDEX_CRC = checksums.PROP_INDEX_CRC
PROP_UPLOAD_ID = "uploadId"
"""The multipart upload that holds the segment's parts, recorded before the first part is written."""
PROP_COMPRESSION = "compression"
"""How a compressed segment's blocks are stored (``zstd``; ``codecs.block_frames``); absent: as they are."""
PROP_FRAMES = "frames"
"""A compressed segment's frame table (``codecs.block_frames.encode_table``): where each stored block lies."""


def frame_table(manifest: SegmentManifest) -> tuple[Frame, ...] | None:
    """The frame table of a compressed segment's Offloaded manifest; None for a segment stored uncompressed."""
    text = driver_property(manifest, PROP_FRAMES)
    if text is None:
        return None
    return decode_table(text, where=f"manifest of segment {manifest_uuid(manifest)} of {manifest.topic}")


def policy_field(manifest: SegmentManifest, name: str, default: str = "") -> str:
    """A field of the policy the segment was opened under (``PROP_POLICY``), as text (``default``: not recorded);
    ``FormatError`` naming the manifest's segment when the recorded policy is not a JSON object."""
    policy = driver_property(manifest, PROP_POLICY)
    if not policy:
        return default
    where = f"manifest of segment {manifest_uuid(manifest)} of {manifest.topic}"
    try:
        doc = json.loads(policy)
    except ValueError as err:  # JSONDecodeError; and an integer of more digits than Python converts
        raise FormatError(f"driver property {PROP_POLICY!r} is not JSON: {err}", where=where) from None
    if not isinstance(doc, dict):
        raise FormatError(f"driver property {PROP_POLICY!r} is not a JSON object but {type(doc).__name__}", where=where)
    value = doc.get(name)
    return default if value is None else str(value)


def checksum_blocks(manifest: SegmentManifest) -> int:
    """How many block checksum records (``storage.keys.block_checksums_key`` 1..n) a sealed segment has: its
    block count when its manifest says every block has one, else 0."""
    if driver_property(manifest, PROP_BLOCK_CHECKSUMS) is None or not manifest.HasField("blockCount"):
        return 0
    return manifest.blockCount


def driver_property(manifest: SegmentManifest, key: str) -> str | None:
    for prop in manifest.driverMetadata.properties:
        if prop.key == key:
            return str(prop.value)
    return None


def with_driver_property(manifest: SegmentManifest, key: str, value: str) -> SegmentManifest:
    out = SegmentManifest()
    out.CopyFrom(manifest)
    props = [(p.key, p.value) for p in out.driverMetadata.properties if p.key != key] + [(key, value)]
    del out.driverMetadata.properties[:]
    for k, v in sorted(props):
        out.driverMetadata.properties.add(key=k, value=v)
    return out


@dataclass(frozen=True, slots=True)
class LedgerSpan:
    """The part of one ledger inside a segment."""

    ledger_id: int
    first_entry_id: int
    last_entry_id: int
    entries: int
    size: int


def manifest_uuid(manifest: SegmentManifest) -> uuid.UUID:
    return msb_lsb_to_uuid(manifest.uidMsb, manifest.uidLsb)


def start_position(manifest: SegmentManifest) -> Position:
    return (manifest.startLedgerId, manifest.startEntryId)


def end_position(manifest: SegmentManifest) -> Position:
    return (manifest.endLedgerId, manifest.endEntryId)


def new_manifest(
    *,
    topic: str,
    segment_id: uuid.UUID,
    ordinal: int,
    format_version: int,
    start: Position,
    assigned_ms: int,
    data_key: str,
    index_key: str,
    driver_properties: Mapping[str, str] | None = None,
) -> SegmentManifest:
    """The manifest of a segment that was just opened (status Assigned)."""
    msb, lsb = uuid_to_msb_lsb(segment_id)
    manifest = SegmentManifest(
        uidMsb=msb,
        uidLsb=lsb,
        topic=topic,
        status=ASSIGNED,
        formatVersion=format_version,
        ordinal=ordinal,
        startLedgerId=start[0],
        startEntryId=start[1],
        assignedTimestamp=assigned_ms,
        dataKey=data_key,
        indexKey=index_key,
        softwareVersion=__version__,
    )
    manifest.driverMetadata.name = DRIVER_NAME
    for key, value in sorted((driver_properties or {}).items()):
        manifest.driverMetadata.properties.add(key=key, value=value)
    return manifest


def sealed_manifest(
    opened: SegmentManifest,
    *,
    end: Position,
    offloaded_ms: int,
    spans: Iterable[LedgerSpan],
    data_length: int,
    index_length: int,
    block_count: int,
    part_count: int,
    seal_reason: str,
    publish_time_first: int = 0,
    publish_time_last: int = 0,
) -> SegmentManifest:
    """The manifest of a finished segment (status Offloaded), with one LedgerInfo per spanned ledger
    whose OffloadContext holds this segment's OffloadSegment record, as PIP-76 lays the metadata out."""
    manifest = SegmentManifest()
    manifest.CopyFrom(opened)
    manifest.status = OFFLOADED
    manifest.endLedgerId, manifest.endEntryId = end
    manifest.offloadedTimestamp = offloaded_ms
    manifest.dataLength = data_length
    manifest.indexLength = index_length
    manifest.blockCount = block_count
    manifest.partCount = part_count
    manifest.sealReason = seal_reason
    manifest.ClearField("failure")
    if publish_time_first:
        manifest.publishTimeFirst = publish_time_first
    if publish_time_last:
        manifest.publishTimeLast = publish_time_last
    entries = 0
    entry_bytes = 0
    del manifest.ledgers[:]
    for span in sorted(spans, key=lambda s: s.ledger_id):
        entries += span.entries
        entry_bytes += span.size
        info = manifest.ledgers.add(ledgerId=span.ledger_id, entries=span.entries, size=span.size)
        info.timestamp = offloaded_ms
        context = info.offloadContext
        context.uidMsb, context.uidLsb = opened.uidMsb, opened.uidLsb
        context.timestamp = offloaded_ms
        record = context.offloadSegment.add(
            uidMsb=opened.uidMsb,
            uidLsb=opened.uidLsb,
            complete=True,
            assignedTimestamp=opened.assignedTimestamp,
            offloadedTimestamp=offloaded_ms,
            endEntryId=span.last_entry_id,
        )
        record.driverMetadata.CopyFrom(opened.driverMetadata)
        info.properties.add(key="firstEntryId", value=str(span.first_entry_id))
    manifest.entries = entries
    manifest.entryBytes = entry_bytes
    return manifest


def failed_manifest(manifest: SegmentManifest, failure: str) -> SegmentManifest:
    failed = SegmentManifest()
    failed.CopyFrom(manifest)
    failed.status = FAILED
    failed.failure = failure[:4000]
    return failed


def spans_of(manifest: SegmentManifest) -> list[LedgerSpan]:
    """The ledger spans of an offloaded segment, in ledger order."""
    spans = []
    for info in manifest.ledgers:
        first = next((int(p.value) for p in info.properties if p.key == "firstEntryId"), 0)
        last = info.offloadContext.offloadSegment[0].endEntryId if info.offloadContext.offloadSegment else -1
        spans.append(LedgerSpan(info.ledgerId, first, last, info.entries, info.size))
    return spans


MANIFEST_MAGIC = b"SOM\x01"
"""The first bytes of every manifest and commit object: "SOM" and the frame version 1. No protobuf
``SegmentManifest`` starts with them (0x53 would be field 10 as a deprecated group), so a frame is never
mistaken for an unframed manifest."""


def encode_manifest(manifest: SegmentManifest) -> bytes:
    """``[4-byte magic "SOM\\x01"][u32 big-endian CRC-32C of the protobuf][protobuf SegmentManifest]``.

    The checksum makes any corruption of a stored manifest (or commit) detectable: protobuf alone parses
    most damaged or empty byte strings into *some* message."""
    body = manifest.SerializeToString(deterministic=True)
    return frame(MANIFEST_MAGIC, body)


def decode_manifest(data: bytes, where: str | None = None) -> SegmentManifest:
    """The manifest framed by ``encode_manifest``, checked strictly; ``FormatError`` naming ``where``
    (the object key) and the byte offset otherwise.

    Checked: the magic and the CRC-32C of the frame, that the protobuf parses, has every required field
    (``IsInitialized``; the upb parser does not enforce proto2 ``required``) and a known status. Unframed
    manifests (written before manifests carried a checksum) are refused like any other corruption: they
    cannot be told from damaged bytes."""
    body = unframe(
        data,
        MANIFEST_MAGIC,
        what="segment manifest",
        where=where,
        not_magic_hint=" (corrupt, or written before manifests carried a checksum)",
    )
    manifest = SegmentManifest()
    try:
        manifest.ParseFromString(bytes(body))
    except DecodeError as err:
        raise FormatError(f"not a segment manifest: {err}", offset=FRAME_LENGTH, where=where) from None
    if not manifest.IsInitialized():
        missing = missing_fields(manifest)
        raise FormatError(f"segment manifest is missing required fields: {missing}", offset=FRAME_LENGTH, where=where)
    if manifest.status not in STATUS_NAMES:
        raise FormatError(
            f"segment manifest has unknown status {manifest.status} (known: "
            + ", ".join(f"{n} {name}" for n, name in sorted(STATUS_NAMES.items()))
            + ")",
            offset=FRAME_LENGTH,
            where=where,
        )
    return manifest


class MisplacedManifestError(FormatError):
    """A manifest that decodes but does not stand where it was written: its topic, its own key or a key it names
    (data and index objects, and with the data key its checksum records, frame records and upload) differ from
    what its place implies (the topic directory holding it, the store's prefix). It is reported and left alone:
    never read as the topic's data, never followed to delete anything.

    ``named`` is what the manifest named instead; ``moved_from`` the prefix its keys are under when they are
    right but for the prefix (a store moved or copied to a new prefix)."""

    def __init__(self, message: str, *, where: str, named: str, moved_from: str | None = None) -> None:
        super().__init__(message, where=where)
        self.named = named
        self.moved_from = moved_from


def segment_keys(
    prefix: str, topic: TopicName | str, segment_id: uuid.UUID | str, start_ledger: int, format_version: int
) -> tuple[str, str]:
    """The data and index keys a segment's objects must have (``storage.keys``: v1 names carry the segment's
    one ledger, its start ledger)."""
    ledger = start_ledger if format_version == 1 else None
    data = keys.data_key(prefix, topic, segment_id, ledger_id=ledger)
    return data, keys.index_key_for(data)


def check_place(manifest: SegmentManifest, *, key: str, prefix: str, topic: TopicName | str) -> SegmentManifest:
    """``manifest`` if it may be trusted where it stands: read from ``key`` (a manifest or commit key) in the
    directory of ``topic`` in a store under ``prefix``. Its topic must be ``topic``, ``key`` the key a manifest
    (or the commit) of its segment has there, and its data and index keys those its segment's objects have
    there; else ``MisplacedManifestError`` naming ``key`` and what the manifest named."""
    place = topic if isinstance(topic, TopicName) else TopicName.parse(topic)
    try:
        own: TopicName | None = TopicName.parse(manifest.topic)
    except TopicNameError:
        own = None
    if own != place:
        raise MisplacedManifestError(
            f"segment manifest is of topic {manifest.topic!r}, but stands in the directory of {place}",
            where=key,
            named=manifest.topic,
        )
    if manifest.formatVersion not in (1, 2):
        raise MisplacedManifestError(
            f"segment manifest has unknown format version {manifest.formatVersion} (known: 1, 2)",
            where=key,
            named=str(manifest.formatVersion),
        )
    seg_id = manifest_uuid(manifest)
    try:
        places = (
            keys.manifest_key(prefix, place, manifest.startLedgerId, manifest.startEntryId, seg_id),
            keys.commit_key(prefix, place, manifest.ordinal),
        )
        wanted = segment_keys(prefix, place, seg_id, manifest.startLedgerId, manifest.formatVersion)
        relative = segment_keys("", place, seg_id, manifest.startLedgerId, manifest.formatVersion)
    except ValueError as err:  # a negative start or ordinal: no key could hold it
        raise MisplacedManifestError(f"segment manifest: {err}", where=key, named=manifest.topic) from None
    if key not in places:
        raise MisplacedManifestError(
            f"segment manifest of segment {seg_id} (place {manifest.ordinal}, starting at "
            f"{manifest.startLedgerId}:{manifest.startEntryId}) stands at a key of another segment; its keys are "
            f"{places[0]} and {places[1]}",
            where=key,
            named=places[0],
        )
    base = prefix.strip("/")
    for what, named, want, tail in (
        ("data object", manifest.dataKey, wanted[0], relative[0]),
        ("index object", manifest.indexKey, wanted[1], relative[1]),
    ):
        if named == want:
            continue
        old = named.removesuffix(tail).rstrip("/") if named.endswith(tail) else None
        if old is not None and (old == "" or named == f"{old}/{tail}") and old != base:
            raise MisplacedManifestError(
                f"segment manifest names its {what} {named!r} under {_prefix_text(old)}, not under this store's "
                f"{_prefix_text(base)}: the store was moved or copied from {_prefix_text(old)}. A manifest is "
                f"trusted only where it was written: copy the store back under {_prefix_text(old)} to read it",
                where=key,
                named=named,
                moved_from=old,
            )
        raise MisplacedManifestError(
            f"segment manifest names the {what} {named!r}, but the {what} of its segment is {want!r}",
            where=key,
            named=named,
        )
    return manifest


def _prefix_text(prefix: str) -> str:
    return f"prefix {prefix!r}" if prefix else "no prefix (the store's root)"


def encode_deleted_ledger(ledger_id: int, deleted_ms: int, reason: str) -> bytes:
    return DeletedLedger(ledgerId=ledger_id, deletedTimestamp=deleted_ms, reason=reason).SerializeToString()


def decode_deleted_ledger(data: bytes, where: str | None = None) -> DeletedLedger:
    mark = DeletedLedger()
    try:
        mark.ParseFromString(data)
    except DecodeError as err:
        raise FormatError(f"not a deleted-ledger mark: {err}", where=where) from None
    return mark


def deleted_segment_record(manifest: SegmentManifest, deleted_ms: int) -> bytes:
    return DeletedSegment(
        uidMsb=manifest.uidMsb,
        uidLsb=manifest.uidLsb,
        startLedgerId=manifest.startLedgerId,
        startEntryId=manifest.startEntryId,
        endLedgerId=manifest.endLedgerId,
        endEntryId=manifest.endEntryId,
        deletedTimestamp=deleted_ms,
    ).SerializeToString()
