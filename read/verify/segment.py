"""Checking one stored segment: both objects, every block and entry, the index and the manifest against them.

Both objects exist and carry format version 1 in their user metadata; the index decodes (magic, lengths,
order, offsets inside the data object); every data block decodes (magic, header, entry framing, padding,
order) and matches the index (``verify_against_blocks``); every entry parses as a Pulsar entry, its batch
splits into messages, and with ``crc`` its CRC-32C matches: the one recorded at offload in the block's checksum
record (``codecs.checksums``) and Pulsar's own 0x0e01 one where the entry carries it; the index's CRC-32C
matches the one its manifest recorded; the manifest agrees with the objects (format,
lengths, start and end positions, counts, per-ledger spans: the rules of ``read.segment.checks``, which the
read handle applies too). Problems are collected, each naming the object and the byte offset, instead of
stopping at the first.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from dataclasses import dataclass, field

from streamoffload.checkpoints import manifest as mf
from streamoffload.checkpoints.keyring import KeyRing, KeyUnavailableError, encryption_key_id, segment_cipher
from streamoffload.codecs.blocks import (
    BLOCK_HEADER_LENGTH,
    ENTRY_HEADER_LENGTH,
    BlockHeader,
    DecodedBlock,
    FormatVersion,
    OrderingError,
    decode_block,
)
from streamoffload.codecs.checksums import BlockChecksums, RecordedChecksums, index_checksum, recorded_checksums
from streamoffload.codecs.entry import CompressionType, decode_entry, split_messages
from streamoffload.codecs.errors import BadMagicError, ChecksumError, FormatError, TruncatedError
from streamoffload.codecs.index import OffloadIndex, is_v1_index, verify_against_blocks
from streamoffload.codecs.metadata import parse_ledger_info, parse_ledger_metadata_v1
from streamoffload.codecs.proto.offload_manifest_pb2 import SegmentManifest
from streamoffload.errors import StreamOffloadError
from streamoffload.read.segment import manifest_disagreements, unsupported_format_version
from streamoffload.read.segment.checks import MAX_INDEX_READ_BYTES, position_text
from streamoffload.read.segment.errors import ReadError
from streamoffload.read.segment.stored_block_reader import StoredBlockReader, stored_layout, stored_otherwise
from streamoffload.storage import keys
from streamoffload.storage.base import ObjectInfo, ObjectNotFoundError, ObjectStore
from streamoffload.storage.keys import FORMAT_VERSION_METADATA_KEY, SUPPORTED_FORMAT_VERSION, ledger_id_in_key

_SPLITTABLE = (CompressionType.NONE, CompressionType.ZLIB)
"""Compressions whose batches are split into messages here (the others are counted as unsplit)."""


class MissingRecordError(FormatError):
    """A block checksum record the segment's manifest promises is not in the store."""


class VerifyError(ReadError):
    """What to verify cannot be made out: arguments that select nothing, or a v1 index of an object whose
    ledger id is not known."""


@dataclass
class Problem:
    """One problem found: the object and byte offset it is at, its kind (``error``) and what is wrong."""

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
    """What was found in one segment's objects, and its problems."""

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
    recorded_checksums: bool | None = None
    """Whether the segment recorded its entries' checksums at offload (None: checked without a manifest).
    A segment sealed before they were written has none: only entries carrying 0x0e01 are CRC-checked."""
    first: tuple[int, int] | None = None
    last: tuple[int, int] | None = None
    problems: list[Problem] = field(default_factory=list)
    encryption_key: str | None = None
    """The key id of a segment encrypted at rest (``checkpoints.keyring``)."""
    unchecked: str | None = None
    """What could not be checked, and why (an encrypted segment whose key is not configured)."""
    compression: str | None = None
    """How a segment compressed at rest stores its blocks (``zstd``; ``codecs.block_frames``)."""
    plain_length: int = 0
    """The data object's plaintext length (its index's) when it is stored otherwise (compressed, encrypted)."""

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
        keyring: KeyRing | None = None,
    ) -> None:
        self.store = store
        self.keyring = keyring
        self._plain: StoredBlockReader | None = None
        self.report = report
        self.crc = crc
        self.ledger_id = ledger_id
        self.manifest = manifest
        self.manifest_key = manifest_key
        self.tallies: dict[int, _LedgerTally] = {}
        self.recorded = RecordedChecksums(False, None)
        if manifest is not None:
            try:
                self.recorded = recorded_checksums([(p.key, p.value) for p in manifest.driverMetadata.properties])
            except FormatError as err:
                self.problem(manifest_key or report.data_key, None, "CorruptManifest", err.reason)
            report.recorded_checksums = self.recorded.blocks

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
        version = unsupported_format_version(info)
        if version is not None:
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
        if self.manifest is not None and stored_otherwise(self.manifest):
            data_info = self.open_stored(self.manifest, data_info, index)
            if data_info is None:
                return
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

    def open_stored(self, manifest: SegmentManifest, data: ObjectInfo, index: OffloadIndex | None) -> ObjectInfo | None:
        """A segment stored encrypted and/or compressed: its stored size checked against the index (the
        plaintext's) and the manifest's frame table, and, with its key if it has one, the plaintext view the walk
        reads (``data`` as the plaintext's info). Without the key: the structure is checked, the report says
        what was not, and None (no walk)."""
        r = self.report
        key_id = r.encryption_key = encryption_key_id(manifest)
        r.compression = mf.driver_property(manifest, mf.PROP_COMPRESSION)
        if index is None:
            return None
        r.plain_length = index.data_object_length
        blocks = index.blocks()
        try:
            layout = stored_layout(manifest, blocks)
        except FormatError as err:
            self.problem(self.manifest_key or r.data_key, None, "ManifestMismatch", err.reason)
            return None
        assert layout is not None
        if data.size != layout.size:
            how = "compressed" if mf.driver_property(manifest, mf.PROP_FRAMES) else "encrypted"
            self.problem(
                r.data_key,
                min(data.size, layout.size),
                "LengthMismatch",
                f"{how} data object has {data.size} bytes; its index's {len(blocks)} blocks of "
                f"{index.data_object_length} plaintext bytes are {layout.size} bytes {how}",
            )
            return None
        if key_id is None:
            self._plain = StoredBlockReader(
                self.store.open_ranged_reader(r.data_key), layout.blocks, None, layout.block_size
            )
            return dataclasses.replace(data, size=index.data_object_length)
        try:
            cipher = segment_cipher(manifest, self.keyring, where=r.data_key)
        except KeyUnavailableError:
            r.unchecked = (
                f"encrypted with key {key_id!r}, which is not configured: the index, the object's size and the "
                "manifest were checked; the blocks' contents (entries, checksums) were not"
            )
            r.blocks = len(blocks)
            if manifest.dataLength != index.data_object_length:
                self.problem(
                    self.manifest_key or r.data_key,
                    None,
                    "ManifestMismatch",
                    f"manifest says {manifest.dataLength} data bytes, the index {index.data_object_length}",
                )
            return None
        assert cipher is not None
        self._plain = StoredBlockReader(
            self.store.open_ranged_reader(r.data_key), layout.blocks, cipher, layout.block_size
        )
        return dataclasses.replace(data, size=index.data_object_length)

    def get_range(self, key: str, offset: int, length: int) -> bytes:
        if self._plain is not None and key == self.report.data_key:
            return self._plain.read(offset, length)
        return self.store.get_range(key, offset, length)

    def decode_index(self, info: ObjectInfo) -> OffloadIndex | None:
        key = self.report.index_key
        if info.size > MAX_INDEX_READ_BYTES:  # refused on its size, before any of it is read
            self.problem(
                key,
                None,
                "IndexTooLarge",
                f"index object has {info.size} bytes, more than a reader takes ({MAX_INDEX_READ_BYTES})",
            )
            return None
        try:
            # Its size and one byte more: one that grew since its HEAD is told from one of that size.
            raw = self.store.get_range(key, 0, info.size + 1)
        except ObjectNotFoundError:
            self.problem(key, None, "MissingObject", "index object disappeared while being verified")
            return None
        if len(raw) != info.size:
            self.problem(
                key,
                None,
                "LengthMismatch",
                f"index object changed while being verified: it had {info.size} "
                f"bytes, then {'more' if len(raw) > info.size else len(raw)}",
            )
            return None
        ledger_id = self.ledger_id
        if ledger_id is None:
            ledger_id = ledger_id_in_key(self.report.data_key)
        try:
            if is_v1_index(raw) and ledger_id is None:
                raise VerifyError(
                    "v1 index, which does not record its ledger id, of a data object not named -ledger-<id>: "
                    "give --ledger-id"
                )
            index = OffloadIndex.decode(raw, ledger_id=ledger_id, where=key)
            want = self.recorded.index_crc
            if want is not None and index_checksum(raw) != want:
                # Reported, and the decoded index still checked against the data: that names where it is wrong.
                self.problem(
                    key,
                    0,
                    "ChecksumError",
                    f"index object CRC-32C 0x{index_checksum(raw):08x} does not match 0x{want:08x} recorded in its "
                    f"manifest (the damage is somewhere in its {len(raw)} bytes)",
                )
            return index
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
            head = self.get_range(key, offset, min(BLOCK_HEADER_LENGTH, size - offset))
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
            raw = self.get_range(key, offset, header.block_length)
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
            sums = self.block_sums(r.blocks + 1, offset, ledger, header.first_entry_id)
            for entry in block.entries:
                at = offset + entry.offset + ENTRY_HEADER_LENGTH
                self.check_entry(ledger, entry.entry_id, entry.payload, at)
                if sums is not None:
                    self.check_recorded(sums, r.blocks + 1, entry.entry_id, entry.payload, at)
            if sums is not None and block.last_entry_id != sums.last_entry_id:
                raise ChecksumError(
                    f"block of ledger {ledger} ends with entry {block.last_entry_id}, but its checksum record "
                    f"{keys.block_checksums_key(key, r.blocks + 1)} ends with entry {sums.last_entry_id}",
                    offset=offset + header.block_length,
                    where=key,
                )
            last = (ledger, block.last_entry_id)
            r.last = last
            if r.first is None:
                r.first = position
            r.blocks += 1
            yield dataclasses.replace(block, offset=offset)
            offset += header.block_length

    def block_sums(self, ordinal: int, offset: int, ledger: int, first_entry_id: int) -> BlockChecksums | None:
        """The checksum record of the data object's ``ordinal``-th block (with ``crc``, when recorded)."""
        if not (self.crc and self.recorded.blocks):
            return None
        key = keys.block_checksums_key(self.report.data_key, ordinal)
        try:
            raw = self.store.get(key)
        except ObjectNotFoundError:
            raise MissingRecordError(
                f"checksum record of block {ordinal} (offset {offset}) does not exist; its manifest says every block "
                "has one",
                where=key,
            ) from None
        sums = BlockChecksums.decode(raw, where=key)
        if (sums.offset, sums.ledger_id, sums.first_entry_id) != (offset, ledger, first_entry_id):
            raise ChecksumError(
                f"checksum record is of the block of ledger {sums.ledger_id} from entry {sums.first_entry_id} at "
                f"offset {sums.offset}, but block {ordinal} is ledger {ledger} from entry {first_entry_id} at offset "
                f"{offset}",
                offset=12,
                where=key,
            )
        return sums

    def check_recorded(self, sums: BlockChecksums, ordinal: int, entry_id: int, payload: memoryview, at: int) -> None:
        record = keys.block_checksums_key(self.report.data_key, ordinal)
        sums.check(entry_id, payload, at=at, record=record, where=self.report.data_key)
        self.report.crc_checked += 1

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
            if self.crc and decoded.checksum is not None and not self.recorded.blocks:
                r.crc_checked += 1  # (with a record, check_recorded counts it)
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

        facts = manifest_disagreements(
            manifest,
            format_version=int(r.format[1:]) if r.format is not None else None,
            data_length=data.size,
            index_length=index.size if index is not None else None,
            first=r.first,
            last=r.last,
            entries=r.entries,
            entry_bytes=r.entry_bytes,
            blocks=r.blocks,
        )
        for name, said, found in facts:
            if name == "formatVersion":
                mismatch(f"manifest says format version {said}, the data object is {r.format}")
            elif name == "dataLength":
                mismatch(f"manifest says {said} data bytes, the object has {found}", offset=data.size)
            elif name == "indexLength":
                mismatch(f"manifest says {said} index bytes, the object has {found}", obj=r.index_key)
            elif name in ("start", "end"):
                mismatch(
                    f"manifest {name}s at {position_text(said)}, the data at {position_text(found)}",
                    offset=0 if name == "start" else data.size,
                )
            else:
                what = {"entries": "entries", "entryBytes": "entry bytes", "blockCount": "blocks"}[name]
                mismatch(f"manifest counts {said} {what}, the data holds {found}")
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
    keyring: KeyRing | None = None,
) -> SegmentReport:
    """Verify one segment's objects (and its manifest, if given); problems are in the report. An encrypted
    segment is read through its key (``keyring``, else the environment's); without it, see ``unchecked``."""
    segment = str(mf.manifest_uuid(manifest)) if manifest is not None else None
    report = SegmentReport(data_key, index_key, topic=topic, segment=segment)
    checker = _Checker(
        store, report, crc=crc, ledger_id=ledger_id, manifest=manifest, manifest_key=manifest_key, keyring=keyring
    )
    try:
        checker.run()
    except StreamOffloadError as err:
        checker.failed(err, data_key)
    return report
