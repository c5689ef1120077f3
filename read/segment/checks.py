"""The rules the read path checks stored objects against, each written once.

The read handle raises on the first rule broken; ``verify`` (``read.verify``) collects every one as a
problem. So the rules return what disagrees, and each caller decides what to do with it.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING, NamedTuple

from streamoffload.codecs.entry import crc32c, decode_entry
from streamoffload.codecs.errors import ChecksumError, FormatError
from streamoffload.codecs.positions import Position
from streamoffload.storage.base import ObjectInfo
from streamoffload.storage.keys import FORMAT_VERSION_METADATA_KEY, SUPPORTED_FORMAT_VERSION

if TYPE_CHECKING:
    from streamoffload.codecs.proto.offload_manifest_pb2 import SegmentManifest

_U32 = struct.Struct(">I")
_CRC_HEADER = 6  # u16 magic 0x0e01, u32 CRC-32C

MAX_INDEX_READ_BYTES = 64 * 1024 * 1024
"""The largest index object a reader downloads: 20 bytes per block, so 3,355,443 blocks. The largest index a
configuration can write is far below: a segment of at most ``maxSizePerOffloadSegmentMbytes`` (1 TiB, the
configuration's bound) in blocks of at least ``maxMessageSize`` + 1,164 bytes (5 MiB by default;
``checkpoints.policy``) is 209,669 blocks, 4.2 MB of entries (the defaults, 1 GiB in 64 MiB blocks: 16 blocks,
320 bytes), plus per ledger a 16-byte header and its LedgerInfo (a few thousand ledgers at most: Pulsar rolls a
ledger over no sooner than every 10 minutes, a segment after 30 days). An index is read whole, and no further
than its HEAD size, so this bounds what a hostile or damaged object can make a reader allocate; a manifest's
``indexLength`` other than the object's size is refused before the read."""


def index_read_length(manifest: SegmentManifest | None, where: str) -> int:
    """How many bytes to fetch of a segment's index object: the length its manifest records (and one more, so
    a longer object is told from one of that length), else the cap; ``FormatError`` naming ``where`` when the
    manifest records more than the cap."""
    if manifest is None or not manifest.HasField("indexLength"):
        return MAX_INDEX_READ_BYTES + 1
    if not 0 < manifest.indexLength <= MAX_INDEX_READ_BYTES:
        raise FormatError(
            f"its manifest records an index of {manifest.indexLength} bytes, outside the 1..{MAX_INDEX_READ_BYTES} "
            "a reader takes",
            where=where,
        )
    return manifest.indexLength + 1


def index_length_problem(manifest: SegmentManifest | None, fetched: int) -> str | None:
    """What is wrong with an index object of which ``fetched`` bytes came back from ``index_read_length``."""
    if manifest is not None and manifest.HasField("indexLength"):
        want = manifest.indexLength
        if fetched != want:
            got = f"more than {want}" if fetched > want else str(fetched)
            return f"index object has {got} bytes, but its manifest records {want}"
        return None
    if fetched > MAX_INDEX_READ_BYTES:
        return f"index object has more than {MAX_INDEX_READ_BYTES} bytes, more than a reader takes"
    return None


def index_size_problem(manifest: SegmentManifest | None, size: int) -> str | None:
    """What is wrong with an index object whose HEAD says ``size`` bytes, before any of it is read: a size other
    than its manifest's ``indexLength``, or one above the cap."""
    if manifest is not None and manifest.HasField("indexLength"):
        if size != manifest.indexLength:
            return f"index object has {size} bytes, but its manifest records {manifest.indexLength}"
        return None
    if size > MAX_INDEX_READ_BYTES:
        return f"index object has {size} bytes, more than the {MAX_INDEX_READ_BYTES} a reader takes"
    return None


def check_entry_checksum(payload: memoryview, where: str, at: int, ledger_id: int, entry_id: int) -> None:
    """Raise a ``FormatError`` naming ``where`` and the absolute offset unless ``payload`` (an entry whose
    bytes start at offset ``at`` of object ``where``) is a Pulsar entry whose CRC-32C matches.

    The common entry (checksum first) is checked here directly; one with broker entry metadata ahead of the
    checksum, or written without one, goes through the full entry decoder."""
    if len(payload) >= _CRC_HEADER and payload[0] == 0x0E and payload[1] == 0x01:
        stored = _U32.unpack_from(payload, 2)[0]
        actual = crc32c(payload[_CRC_HEADER:])
        if actual != stored:
            raise ChecksumError(
                f"entry {ledger_id}:{entry_id} checksum mismatch: stored CRC-32C 0x{stored:08x}, computed "
                f"0x{actual:08x} over {len(payload) - _CRC_HEADER} bytes (corrupt entry)",
                offset=at + 2,
                where=where,
            )
        return
    try:
        decode_entry(payload, verify_checksum=True)
    except FormatError as err:
        located = err.located(where, at)
        raise type(located)(
            f"entry {ledger_id}:{entry_id}: {located.reason}", offset=located.offset, where=where
        ) from None


def unsupported_format_version(info: ObjectInfo) -> str | None:
    """The object's ``s3managedledgeroffloaderformatversion`` user metadata when it is present and not the
    version Pulsar's readers read (``SUPPORTED_FORMAT_VERSION``); None when the object is readable."""
    version = info.metadata.get(FORMAT_VERSION_METADATA_KEY)
    if version is not None and version != SUPPORTED_FORMAT_VERSION:
        return version
    return None


class ManifestDisagreement(NamedTuple):
    """One manifest field that disagrees with the objects: what the manifest says, what was found."""

    field: str
    """``formatVersion``, ``dataLength``, ``indexLength``, ``start``, ``end``, ``entries``, ``entryBytes`` or
    ``blockCount``."""
    said: object
    found: object


def position_text(value: object) -> str:
    """A ``start`` or ``end`` disagreement's position as Pulsar writes one, ``ledger:entry``."""
    if isinstance(value, tuple) and len(value) == 2:
        return f"{value[0]}:{value[1]}"
    return str(value)


def manifest_disagreements(
    manifest: SegmentManifest,
    *,
    format_version: int | None = None,
    data_length: int | None = None,
    index_length: int | None = None,
    first: Position | None = None,
    last: Position | None = None,
    entries: int | None = None,
    entry_bytes: int | None = None,
    blocks: int | None = None,
) -> list[ManifestDisagreement]:
    """Where ``manifest`` disagrees with what its objects hold, in the order above. A fact left None is not
    known (not checked); optional manifest fields that are absent are not compared; the end position is
    compared only when the manifest records it (a segment still being written does not)."""
    out: list[ManifestDisagreement] = []
    if format_version is not None and manifest.formatVersion != format_version:
        out.append(ManifestDisagreement("formatVersion", manifest.formatVersion, format_version))
    if data_length is not None and manifest.HasField("dataLength") and manifest.dataLength != data_length:
        out.append(ManifestDisagreement("dataLength", manifest.dataLength, data_length))
    if index_length is not None and manifest.HasField("indexLength") and manifest.indexLength != index_length:
        out.append(ManifestDisagreement("indexLength", manifest.indexLength, index_length))
    start = (manifest.startLedgerId, manifest.startEntryId)
    if first is not None and first != start:
        out.append(ManifestDisagreement("start", start, first))
    end = (manifest.endLedgerId, manifest.endEntryId)
    if last is not None and manifest.HasField("endEntryId") and last != end:
        out.append(ManifestDisagreement("end", end, last))
    for name, found in (("entries", entries), ("entryBytes", entry_bytes), ("blockCount", blocks)):
        if found is not None and manifest.HasField(name) and getattr(manifest, name) != found:
            out.append(ManifestDisagreement(name, getattr(manifest, name), found))
    return out
