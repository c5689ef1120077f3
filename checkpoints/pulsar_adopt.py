"""Pulsar's own offloaded ledgers adopted into the store: copied beside ours, with manifests, so every reader of
the store reads them as it reads our segments.

Apache Pulsar's jcloud offloader keeps a ledger as two v1 (PIP-17) objects at its bucket's root,
``<uuid>-ledger-<id>`` and ``<uuid>-ledger-<id>-index``, and records the UUID only in the broker's managed-ledger
metadata (``pulsar-admin topics info-internal``: ``offloadedContextUuid``); the objects say which managed ledger
they belong to in their user metadata (``managedledgername``). A failed or repeated offload leaves objects under
other UUIDs, so the broker's metadata, not a listing, says which objects are the ledger.

Adopting a ledger copies its two objects, byte for byte and with their user metadata, to the keys our layout
gives them in the topic's directory (``storage.keys``: the same names under ``<prefix>/<tenant>/<ns>/<topic>/``),
then commits a v1 segment (the ledger's UUID, ``method = ledger``) in the next place of the topic's history, as
the job commits its own. Copied, not named in place: a manifest is trusted only where it stands (its keys are
those of its topic's directory), and Pulsar deletes its objects when retention deletes the ledger, which must not
delete what a committed segment of ours names.

Before copying, each ledger is checked against what the broker says of it: both objects carry format version
``1`` and the topic's managed-ledger name, the index decodes as the v1 index of that ledger, its data object has
the length the index says, and its ``LedgerMetadataFormat`` is closed with the broker's last entry and length.
Ledgers are adopted in order and stop at the first one Pulsar has not offloaded (later ones would leave a gap);
a ledger at or before the store's last offloaded position is skipped, and one adopted before is reported so, so a
second run is a no-op (and publishes the manifest of an adoption whose commit a crash left without one). Entries
keep the ``0x0e01`` CRC-32C the broker stored, which readers check (no checksum records are written: they would
only repeat it). A segment's ``publishTimeLast`` is the ledger's close time from the broker (Pulsar's own time
retention uses it too); ``publishTimeFirst`` stays unknown.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from streamoffload.checkpoints import manifest as mf
from streamoffload.checkpoints.errors import CheckpointError
from streamoffload.checkpoints.metadata_store import MetadataStore, now_ms
from streamoffload.codecs.errors import FormatError
from streamoffload.codecs.index import OffloadIndex
from streamoffload.codecs.metadata import msb_lsb_to_uuid, parse_ledger_metadata_v1
from streamoffload.codecs.positions import MAX_ID, Position
from streamoffload.codecs.proto.bookkeeper_pb2 import LedgerMetadataFormat
from streamoffload.codecs.topics import TopicName
from streamoffload.storage import keys
from streamoffload.storage.base import ObjectInfo, ObjectNotFoundError, ObjectStore
from streamoffload.storage.location import ScopedStore

MANAGED_LEDGER_KEY = "managedledgername"
"""Object user metadata: the managed ledger (``tenant/namespace/persistent/topic``) Pulsar offloaded."""
ADOPTED_FROM = "adoptedFrom"
"""Driver property of an adopted segment: where its objects were copied from (``<store url>/<data key>``)."""
MAX_INDEX_BYTES = 64 * 1024 * 1024
"""A v1 index holds 20 bytes per block and a ledger's metadata: 64 MiB is millions of blocks."""
COPY_PART_BYTES = 16 * 1024 * 1024
"""A data object is copied through memory this many bytes at a time (one multipart part each)."""


class AdoptError(CheckpointError):
    """Pulsar's objects, or the broker's word on them, are not what adopting them needs; names the key."""


@dataclass(frozen=True)
class PulsarLedger:
    """One ledger of a managed ledger, as the broker's metadata lists it."""

    ledger_id: int
    entries: int
    size: int
    offload_uuid: uuid.UUID | None
    """The UUID of its offloaded objects (None: not offloaded, or not completely)."""
    closed_ms: int = 0
    """The broker's ``timestamp`` of the ledger (when it was closed; 0: not given), at or after its last publish."""


def pulsar_managed_ledger(topic: TopicName) -> str:
    """Pulsar's managed-ledger name of a topic-partition: ``tenant/namespace/persistent/local-name``."""
    return f"{topic.tenant}/{topic.namespace}/{topic.domain}/{topic.local_name}"


def parse_internal_info(doc: Any, where: str) -> list[PulsarLedger]:
    """The ledgers of a managed ledger from ``pulsar-admin topics info-internal`` (``GET .../internal-info``) in
    ledger order: Pulsar 3 and 4 name an offloaded ledger's UUID ``offloadedContextUuid`` (with ``isOffloaded``);
    the ``ManagedLedgerInfo`` protobuf's JSON has ``offloadContext`` ``{uidMsb, uidLsb, complete}``."""
    ledgers = doc.get("ledgers") if isinstance(doc, dict) else None
    if not isinstance(ledgers, list):
        raise AdoptError(f"{where}: not a managed ledger's internal info (no 'ledgers' list)")
    out = []
    for i, item in enumerate(ledgers):
        at = f"{where}: ledgers[{i}]"
        if not isinstance(item, dict):
            raise AdoptError(f"{at}: expected an object, got {type(item).__name__}")
        ledger_id = _count(item.get("ledgerId"), f"{at}.ledgerId")
        entries = _count(item.get("entries", 0), f"{at}.entries")
        size = _count(item.get("size", 0), f"{at}.size")
        closed = _count(item.get("timestamp", 0), f"{at}.timestamp")
        out.append(PulsarLedger(ledger_id, entries, size, _offload_uuid(item, at), closed))
    return sorted(out, key=lambda ledger: ledger.ledger_id)


def _count(value: Any, what: str) -> int:
    number = int(value) if isinstance(value, str) and value.isdigit() else value
    if isinstance(number, bool) or not isinstance(number, int) or not 0 <= number <= MAX_ID:
        raise AdoptError(f"{what}: expected an integer in [0, 2^63), got {value!r}")
    return number


def _offload_uuid(item: Mapping[str, Any], at: str) -> uuid.UUID | None:
    text = item.get("offloadedContextUuid")
    if text is not None:
        if not item.get("isOffloaded", True):
            return None
        try:
            return uuid.UUID(str(text))
        except ValueError:
            raise AdoptError(f"{at}.offloadedContextUuid: {text!r} is not a UUID") from None
    context = item.get("offloadContext")
    if isinstance(context, dict) and context.get("complete") and "uidMsb" in context and "uidLsb" in context:
        try:
            return msb_lsb_to_uuid(int(context["uidMsb"]), int(context["uidLsb"]))
        except (TypeError, ValueError):
            raise AdoptError(f"{at}.offloadContext: uidMsb/uidLsb are not 64-bit integers") from None
    return None


@dataclass(frozen=True)
class LedgerOutcome:
    """What became of one ledger: ``adopted`` (now; ``to adopt`` in a dry run), ``adopted before``, or ``skipped``
    (with why)."""

    ledger_id: int
    outcome: str
    reason: str = ""
    offload_uuid: uuid.UUID | None = None
    entries: int = 0
    data_bytes: int = 0
    data_key: str = ""


@dataclass
class AdoptReport:
    topic: str
    ledgers: list[LedgerOutcome] = field(default_factory=list)

    def count(self, outcome: str) -> int:
        return sum(1 for ledger in self.ledgers if ledger.outcome == outcome)


@dataclass(frozen=True)
class _Checked:
    data_key: str
    index_key: str
    data: ObjectInfo
    index: ObjectInfo
    index_bytes: bytes
    blocks: int


def adopt_ledgers(
    source: ScopedStore,
    into: ScopedStore,
    topic: TopicName,
    ledgers: Sequence[PulsarLedger],
    *,
    dry_run: bool = False,
    clock: Callable[[], int] = now_ms,
) -> AdoptReport:
    """Adopt the offloaded ``ledgers`` of ``topic`` from Pulsar's objects in ``source`` (keys under its prefix, at
    the root where Pulsar keeps them) into the store ``into`` (module docstring). ``dry_run``: check, copy and
    commit nothing. Raises :class:`AdoptError` at the first ledger whose objects fail a check, after committing
    the ledgers before it (each commit is whole; a rerun continues)."""
    meta = MetadataStore(into)
    report = AdoptReport(str(topic))
    adopted = {mf.manifest_uuid(m): m for m in meta.offloaded_segments(topic)}
    committed = meta.last_commit(topic)
    if (
        committed is not None
        and mf.driver_property(committed, ADOPTED_FROM)
        and mf.manifest_uuid(committed) not in adopted
    ):
        # A crash between an adoption's commit and its manifest: publish it, as the commit says (recover does so too).
        if not dry_run:
            meta.put_manifest(committed)
        adopted[mf.manifest_uuid(committed)] = committed
    point = meta.resume_point(topic)
    last, ordinal = point.last, point.next_ordinal
    managed_ledger = pulsar_managed_ledger(topic)
    for ledger in ledgers:
        if ledger.offload_uuid is None:
            # Pulsar offloads in ledger order; the open ledger is never offloaded.
            report.ledgers.append(
                LedgerOutcome(ledger.ledger_id, "skipped", "not offloaded by Pulsar (it and every later ledger)")
            )
            break
        if ledger.entries == 0:
            report.ledgers.append(LedgerOutcome(ledger.ledger_id, "skipped", "empty", ledger.offload_uuid))
            continue
        held = adopted.get(ledger.offload_uuid)
        if held is not None:
            report.ledgers.append(
                LedgerOutcome(
                    ledger.ledger_id,
                    "adopted before",
                    offload_uuid=ledger.offload_uuid,
                    entries=held.entries,
                    data_bytes=held.dataLength,
                    data_key=held.dataKey,
                )
            )
            continue
        end: Position = (ledger.ledger_id, ledger.entries - 1)
        if last is not None and (ledger.ledger_id, 0) <= last:
            report.ledgers.append(
                LedgerOutcome(
                    ledger.ledger_id,
                    "skipped",
                    f"at or before the store's last offloaded position {last[0]}:{last[1]}",
                    ledger.offload_uuid,
                )
            )
            continue
        checked = _check(source, ledger, managed_ledger)
        data_key = keys.data_key(into.prefix, topic, ledger.offload_uuid, ledger_id=ledger.ledger_id)
        if not dry_run:
            _copy(source.store, checked.data_key, checked.data, into.store, data_key)
            index_key = keys.index_key_for(data_key)
            into.store.put(index_key, checked.index_bytes, checked.index.metadata)
            at = clock()
            opened = mf.new_manifest(
                topic=str(topic),
                segment_id=ledger.offload_uuid,
                ordinal=ordinal,
                format_version=1,
                start=(ledger.ledger_id, 0),
                assigned_ms=at,
                data_key=data_key,
                index_key=index_key,
                driver_properties={
                    mf.PROP_METHOD: "ledger",
                    ADOPTED_FROM: f"{source.store.url.rstrip('/')}/{checked.data_key}",
                },
            )
            sealed = mf.sealed_manifest(
                opened,
                end=end,
                offloaded_ms=at,
                spans=[mf.LedgerSpan(ledger.ledger_id, 0, end[1], ledger.entries, ledger.size)],
                data_length=checked.data.size,
                index_length=checked.index.size,
                block_count=checked.blocks,
                part_count=checked.blocks,
                seal_reason="ledger",
                # At or after the ledger's last publish: pruning and retention by time stay on the safe side.
                publish_time_last=ledger.closed_ms,
            )
            meta.commit(sealed)
        report.ledgers.append(
            LedgerOutcome(
                ledger.ledger_id,
                "to adopt" if dry_run else "adopted",
                offload_uuid=ledger.offload_uuid,
                entries=ledger.entries,
                data_bytes=checked.data.size,
                data_key=data_key,
            )
        )
        last, ordinal = end, ordinal + 1
    return report


def _check(source: ScopedStore, ledger: PulsarLedger, managed_ledger: str) -> _Checked:
    """Pulsar's two objects of ``ledger``, checked against the broker's word (module docstring)."""
    assert ledger.offload_uuid is not None
    name = keys.data_name(ledger.offload_uuid, ledger_id=ledger.ledger_id)
    data_key = f"{source.prefix}/{name}" if source.prefix else name
    index_key = keys.index_key_for(data_key)
    infos = {}
    for key, role in ((data_key, "data"), (index_key, "index")):
        try:
            info = source.store.head(key)
        except ObjectNotFoundError:
            raise AdoptError(
                f"ledger {ledger.ledger_id}: the broker says it is offloaded as {ledger.offload_uuid}, but its {role} "
                f"object {key} is not in {source.describe()}"
            ) from None
        metadata = {k.lower(): v for k, v in info.metadata.items()}
        version = metadata.get(keys.FORMAT_VERSION_METADATA_KEY)
        if version != keys.SUPPORTED_FORMAT_VERSION:
            raise AdoptError(
                f"{key}: offloader format version {version!r} (metadata {keys.FORMAT_VERSION_METADATA_KEY}), "
                f"expected {keys.SUPPORTED_FORMAT_VERSION!r}"
            )
        owner = metadata.get(MANAGED_LEDGER_KEY)
        if owner != managed_ledger:
            raise AdoptError(
                f"{key}: its metadata {MANAGED_LEDGER_KEY} is {owner!r}, not the topic's managed ledger "
                f"{managed_ledger!r}"
            )
        infos[role] = info
    data, index = infos["data"], infos["index"]
    if index.size > MAX_INDEX_BYTES:
        raise AdoptError(f"{index_key}: {index.size} bytes, more than an index of a ledger holds ({MAX_INDEX_BYTES})")
    index_bytes = source.store.get(index_key)
    try:
        decoded = OffloadIndex.decode(index_bytes, ledger_id=ledger.ledger_id, where=index_key)
        ledger_meta = parse_ledger_metadata_v1(decoded.ledgers[0].metadata, where=index_key)
    except FormatError as err:
        raise AdoptError(f"{index_key}: not a v1 index of ledger {ledger.ledger_id}: {err}") from None
    if decoded.version != 1:
        raise AdoptError(f"{index_key}: a {decoded.version.label} index, not Pulsar's v1 (ledger-based)")
    if decoded.data_object_length != data.size:
        raise AdoptError(f"{data_key}: {data.size} bytes, but its index {index_key} says {decoded.data_object_length}")
    said = (ledger_meta.state, ledger_meta.lastEntryId, ledger_meta.length)
    expected = (LedgerMetadataFormat.CLOSED, ledger.entries - 1, ledger.size)
    if said != expected:
        raise AdoptError(
            f"{index_key}: its ledger metadata says state {said[0]}, last entry {said[1]}, length {said[2]}; the "
            f"broker says ledger {ledger.ledger_id} is closed ({expected[0]}) with last entry {expected[1]} and "
            f"length {expected[2]}"
        )
    return _Checked(data_key, index_key, data, index, index_bytes, len(decoded.ledgers[0].entries))


def _copy(source: ObjectStore, key: str, info: ObjectInfo, into: ObjectStore, target: str) -> None:
    """Copy an object byte for byte with its user metadata, through memory a part at a time. A rerun after a crash
    before the commit writes the same bytes again; the target is visible only once whole (put, or multipart)."""
    if info.size <= COPY_PART_BYTES:
        data = source.get(key)
        if len(data) != info.size:
            raise AdoptError(f"{key}: read {len(data)} bytes, its listing says {info.size}")
        into.put(target, data, info.metadata)
        return
    upload = into.start_multipart(target, info.metadata)
    try:
        numbers = []
        for number, start in enumerate(range(0, info.size, COPY_PART_BYTES), start=1):
            part = source.get_range(key, start, min(COPY_PART_BYTES, info.size - start))
            if len(part) != min(COPY_PART_BYTES, info.size - start):
                raise AdoptError(f"{key}: read {len(part)} bytes at {start}, its listing says {info.size} in all")
            upload.write_part(number, part)
            numbers.append(number)
        upload.complete(numbers)
    except BaseException:
        upload.abort()
        raise
