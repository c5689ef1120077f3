"""Data blocks of offloaded objects: PIP-17 (v1, ledger-based) and PIP-76 (v2, streaming).

A data object is a run of blocks. Each block is a 128-byte header followed by whole entries framed as
``[u32 length][u64 entryId][payload]`` and padded up to the block length with the repeating bytes
``FE DC DE AD`` (the pattern starting at the first padding byte). All integers are big-endian.

v1 header: magic ``0xFBDBABCB``, u64 header length (128), u64 block length, u64 first entry id, zeros.
v2 header: magic ``0x26A66D32``, the same fields, then u64 ledger id at offset 28, then zeros.

Decoding validates every field, never reads past the buffer it is given and never copies an entry
payload: payloads come back as ``memoryview`` slices of the caller's buffer.
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from enum import IntEnum

from streamoffload.codecs.errors import (
    BadMagicError,
    EntryTooLargeError,
    FormatError,
    LengthMismatchError,
    TruncatedError,
)
from streamoffload.codecs.positions import MAX_ID

V1_BLOCK_MAGIC = 0xFBDBABCB
V2_BLOCK_MAGIC = 0x26A66D32
BLOCK_HEADER_LENGTH = 128
ENTRY_HEADER_LENGTH = 12
PADDING_PATTERN = b"\xfe\xdc\xde\xad"

# Pulsar's Java code holds block sizes and entry lengths in a signed int: anything from 2^31 up cannot be
# read back by it (and a negative length is how its reader recognises padding).
MAX_BLOCK_LENGTH = 2**31 - 1
# The smallest block: a header and one empty entry.
MIN_BLOCK_LENGTH = BLOCK_HEADER_LENGTH + ENTRY_HEADER_LENGTH
MAX_PAYLOAD_LENGTH = MAX_BLOCK_LENGTH - BLOCK_HEADER_LENGTH - ENTRY_HEADER_LENGTH
# Ledger and entry ids are Java longs; negative ones do not exist.

PADDING_WORD = int.from_bytes(PADDING_PATTERN, "big")
_V1_HEADER = struct.Struct(">IQQQ")  # magic, header length, block length, first entry id
_V2_HEADER = struct.Struct(">IQQQQ")  # ... and ledger id
ENTRY_HEADER = struct.Struct(">IQ")  # payload length, entry id
_U32 = struct.Struct(">I")
_V1_ZEROS = bytes(BLOCK_HEADER_LENGTH - _V1_HEADER.size)
_V2_ZEROS = bytes(BLOCK_HEADER_LENGTH - _V2_HEADER.size)
# Padding is compared in chunks against this (its length is a multiple of 4, so every chunk starts in phase).
_PADDING_CHUNK = PADDING_PATTERN * 16384


class FormatVersion(IntEnum):
    """Offload format: 1 = PIP-17 ledger-based objects, 2 = PIP-76 streaming objects."""

    V1 = 1
    V2 = 2

    @property
    def label(self) -> str:
        return f"v{int(self)}"


_MAGIC_BY_VERSION = {FormatVersion.V1: V1_BLOCK_MAGIC, FormatVersion.V2: V2_BLOCK_MAGIC}
_VERSION_BY_MAGIC = {magic: version for version, magic in _MAGIC_BY_VERSION.items()}


class OrderingError(FormatError):
    """Ids or positions that must be strictly increasing are not (entries in a block, blocks, ledgers)."""


class InvalidFieldError(FormatError):
    """A field holds a value its format does not allow (non-zero reserved bytes, a negative id, ...)."""


def _as_view(buf: bytes | bytearray | memoryview | mmap.mmap) -> memoryview:
    view = buf if isinstance(buf, memoryview) else memoryview(buf)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    return view


def _fail(cls: type[FormatError], message: str, offset: int, where: str | None) -> FormatError:
    return cls(message, offset=offset, where=where)


@dataclass(frozen=True, slots=True)
class BlockHeader:
    """The 128-byte header of a data block. ``ledger_id`` is None for v1 (its header has no ledger id)."""

    version: FormatVersion
    block_length: int
    first_entry_id: int
    ledger_id: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "version", FormatVersion(self.version))  # frozen: accept 1 / 2 as well
        if self.version is FormatVersion.V1 and self.ledger_id is not None:
            raise ValueError("a v1 block header has no ledger id; pass ledger_id=None")
        if self.version is FormatVersion.V2 and self.ledger_id is None:
            raise ValueError("a v2 block header needs a ledger id")
        if not MIN_BLOCK_LENGTH <= self.block_length <= MAX_BLOCK_LENGTH:
            raise ValueError(f"block length {self.block_length} outside {MIN_BLOCK_LENGTH}..{MAX_BLOCK_LENGTH}")
        if not 0 <= self.first_entry_id <= MAX_ID:
            raise ValueError(f"first entry id {self.first_entry_id} outside 0..{MAX_ID}")
        if self.ledger_id is not None and not 0 <= self.ledger_id <= MAX_ID:
            raise ValueError(f"ledger id {self.ledger_id} outside 0..{MAX_ID}")

    def encode(self) -> bytes:
        if self.version is FormatVersion.V1:
            return (
                _V1_HEADER.pack(V1_BLOCK_MAGIC, BLOCK_HEADER_LENGTH, self.block_length, self.first_entry_id) + _V1_ZEROS
            )
        return (
            _V2_HEADER.pack(V2_BLOCK_MAGIC, BLOCK_HEADER_LENGTH, self.block_length, self.first_entry_id, self.ledger_id)
            + _V2_ZEROS
        )

    @classmethod
    def decode(
        cls,
        buf: bytes | bytearray | memoryview,
        offset: int = 0,
        *,
        where: str | None = None,
        base_offset: int = 0,
    ) -> BlockHeader:
        """Decode and validate the header at ``offset``. Error offsets are ``base_offset + position in buf``
        (pass the buffer's position in its object when decoding a ranged read)."""
        view = _as_view(buf)
        return _decode_header(view, offset, where, base_offset)


def _decode_header(view: memoryview, offset: int, where: str | None, base: int) -> BlockHeader:
    at = base + offset
    available = len(view) - offset
    if offset < 0 or available < 4:
        raise _fail(
            TruncatedError,
            f"block header needs {BLOCK_HEADER_LENGTH} bytes but only {max(available, 0)} remain",
            at,
            where,
        )
    (magic,) = _U32.unpack_from(view, offset)
    version = _VERSION_BY_MAGIC.get(magic)
    if version is None:
        raise _fail(
            BadMagicError,
            f"bad data block magic 0x{magic:08X} (expected 0x{V1_BLOCK_MAGIC:08X} for v1 or "
            f"0x{V2_BLOCK_MAGIC:08X} for v2)",
            at,
            where,
        )
    if available < BLOCK_HEADER_LENGTH:
        raise _fail(
            TruncatedError,
            f"{version.label} block header needs {BLOCK_HEADER_LENGTH} bytes but only {available} remain",
            at,
            where,
        )
    ledger_id: int | None
    if version is FormatVersion.V1:
        _, header_length, block_length, first_entry_id = _V1_HEADER.unpack_from(view, offset)
        ledger_id = None
        zeros_at, zeros = offset + _V1_HEADER.size, _V1_ZEROS
    else:
        _, header_length, block_length, first_entry_id, ledger_id = _V2_HEADER.unpack_from(view, offset)
        zeros_at, zeros = offset + _V2_HEADER.size, _V2_ZEROS
    if header_length != BLOCK_HEADER_LENGTH:
        raise _fail(
            LengthMismatchError,
            f"block header length field is {header_length}, expected {BLOCK_HEADER_LENGTH}",
            at + 4,
            where,
        )
    if not MIN_BLOCK_LENGTH <= block_length <= MAX_BLOCK_LENGTH:
        raise _fail(
            LengthMismatchError,
            f"block length field is {block_length}, outside {MIN_BLOCK_LENGTH}..{MAX_BLOCK_LENGTH}",
            at + 12,
            where,
        )
    if first_entry_id > MAX_ID:
        raise _fail(InvalidFieldError, f"first entry id {first_entry_id} is negative as a Java long", at + 20, where)
    if ledger_id is not None and ledger_id > MAX_ID:
        raise _fail(InvalidFieldError, f"ledger id {ledger_id} is negative as a Java long", at + 28, where)
    reserved = bytes(view[zeros_at : offset + BLOCK_HEADER_LENGTH])
    if reserved != zeros:
        first_bad = next(i for i, b in enumerate(reserved) if b)
        raise _fail(
            InvalidFieldError,
            f"reserved block header byte is 0x{reserved[first_bad]:02X}, expected zero",
            base + zeros_at + first_bad,
            where,
        )
    return BlockHeader(version, block_length, first_entry_id, ledger_id)


def framed_entry_size(payload_length: int) -> int:
    """Bytes one entry takes in a block: its 12-byte header plus its payload."""
    return ENTRY_HEADER_LENGTH + payload_length


def padding(length: int) -> bytes:
    """``length`` bytes of block padding (the pattern starts at the first padding byte)."""
    return (PADDING_PATTERN * (length // 4 + 1))[:length]


def check_id(kind: str, value: int) -> None:
    if not 0 <= value <= MAX_ID:
        raise ValueError(f"{kind} {value} outside 0..{MAX_ID}")


def encode_block(
    version: FormatVersion,
    ledger_id: int,
    entries: Sequence[tuple[int, bytes | bytearray | memoryview]],
    block_length: int | None = None,
) -> bytes:
    """Encode one block holding ``entries`` (``(entry_id, payload)`` in strictly increasing id order).

    ``block_length`` None makes the block fit exactly; otherwise it is padded up to ``block_length``.
    ``ledger_id`` is written into v2 headers only (v1 headers have no ledger id).
    Raises EntryTooLargeError when an entry cannot fit even alone in a block of ``block_length``.
    """
    return b"".join(encode_block_chunks(version, ledger_id, entries, block_length))


def encode_block_chunks(
    version: FormatVersion,
    ledger_id: int,
    entries: Sequence[tuple[int, bytes | bytearray | memoryview]],
    block_length: int | None = None,
) -> list[bytes | bytearray | memoryview]:
    """:func:`encode_block` as the buffers whose concatenation is the block (header, each entry's header and
    payload, padding), for a writer that can write them without joining them first (``os.pwritev``)."""
    version = FormatVersion(version)
    if not entries:
        raise ValueError("a block holds at least one entry")
    check_id("ledger id", ledger_id)
    needed = BLOCK_HEADER_LENGTH
    previous = -1
    for entry_id, payload in entries:
        check_id("entry id", entry_id)
        if entry_id <= previous:
            raise ValueError(f"entry ids must strictly increase within a block: {entry_id} follows {previous}")
        previous = entry_id
        size = payload_size(payload)
        if block_length is not None and BLOCK_HEADER_LENGTH + ENTRY_HEADER_LENGTH + size > block_length:
            raise EntryTooLargeError(
                f"entry {entry_id} of ledger {ledger_id} has {size} bytes; framed with its {ENTRY_HEADER_LENGTH}-byte"
                f" header it does not fit in a block of {block_length} bytes ({BLOCK_HEADER_LENGTH}-byte header)"
            )
        needed += ENTRY_HEADER_LENGTH + size
    if block_length is None:
        block_length = needed
    elif needed > block_length:
        raise ValueError(f"entries need a block of {needed} bytes, more than the requested {block_length}")
    if block_length > MAX_BLOCK_LENGTH:
        raise EntryTooLargeError(
            f"block of ledger {ledger_id} from entry {entries[0][0]} would be {block_length} bytes, "
            f"more than the largest block Pulsar can read ({MAX_BLOCK_LENGTH})"
        )
    parts: list[bytes | bytearray | memoryview] = []
    pack = ENTRY_HEADER.pack
    for entry_id, payload in entries:
        parts.append(pack(payload_size(payload), entry_id))
        parts.append(payload)
    return block_chunks(version, ledger_id, entries[0][0], parts, needed, block_length)


def payload_size(payload: bytes | bytearray | memoryview) -> int:
    return payload.nbytes if type(payload) is memoryview else len(payload)


def assemble_block(
    version: FormatVersion,
    ledger_id: int,
    first_entry_id: int,
    parts: list[bytes | bytearray | memoryview],
    used: int,
    block_length: int,
) -> bytes:
    """Header + already framed entries (``parts``, ``used`` bytes with the header) + padding, in one copy.
    The caller has validated everything."""
    return b"".join(block_chunks(version, ledger_id, first_entry_id, parts, used, block_length))


def block_chunks(
    version: FormatVersion,
    ledger_id: int,
    first_entry_id: int,
    parts: list[bytes | bytearray | memoryview],
    used: int,
    block_length: int,
) -> list[bytes | bytearray | memoryview]:
    """:func:`assemble_block`'s buffers, not joined."""
    if version is FormatVersion.V1:
        header = _V1_HEADER.pack(V1_BLOCK_MAGIC, BLOCK_HEADER_LENGTH, block_length, first_entry_id) + _V1_ZEROS
    else:
        header = (
            _V2_HEADER.pack(V2_BLOCK_MAGIC, BLOCK_HEADER_LENGTH, block_length, first_entry_id, ledger_id) + _V2_ZEROS
        )
    tail = [padding(block_length - used)] if used < block_length else []
    return [header, *parts, *tail]


@dataclass(frozen=True, slots=True)
class EntryRef:
    """One entry of a decoded block. ``offset`` is where its 12-byte header starts in the buffer decoded;
    ``payload`` is a zero-copy view of that buffer."""

    entry_id: int
    offset: int
    payload: memoryview


_new_object = object.__new__
# The slots' own setters (a frozen dataclass refuses attribute assignment): mypy does not type slot descriptors.
_set_entry_id: Callable[[EntryRef, int], None] = EntryRef.__dict__["entry_id"].__set__
_set_entry_offset: Callable[[EntryRef, int], None] = EntryRef.__dict__["offset"].__set__
_set_entry_payload: Callable[[EntryRef, memoryview], None] = EntryRef.__dict__["payload"].__set__


@dataclass(frozen=True, slots=True)
class DecodedBlock:
    """A decoded block: its header, where it starts in the buffer decoded, and its entries in id order."""

    header: BlockHeader
    offset: int
    entries: list[EntryRef]

    @property
    def first_entry_id(self) -> int:
        return self.header.first_entry_id

    @property
    def last_entry_id(self) -> int:
        return self.entries[-1].entry_id

    @property
    def end(self) -> int:
        """Offset just past the block in the buffer decoded."""
        return self.offset + self.header.block_length


def first_non_padding(view: bytes | memoryview, start: int, end: int) -> int | None:
    """Index in ``view`` of the first byte of ``[start, end)`` that is not block padding (the pattern in
    phase from ``start``), or None when they all are. The one padding rule: the read handle and the block
    decoder both apply it."""
    pos = start
    while pos < end:
        n = min(end - pos, len(_PADDING_CHUNK))
        # bytes() first: comparing a memoryview to bytes goes item by item and is ~100x slower than memcmp.
        chunk = bytes(view[pos : pos + n])
        expected = _PADDING_CHUNK[:n]
        if chunk != expected:
            return pos + next(i for i in range(n) if chunk[i] != expected[i])
        pos += n
    return None


def _check_padding(view: memoryview, start: int, end: int, where: str | None, base: int) -> None:
    """The bytes from ``start`` to the block ``end`` must be the padding pattern, in phase from ``start``."""
    at = first_non_padding(view, start, end)
    if at is None:
        return
    bad = (at - start) % len(_PADDING_CHUNK)
    if at - bad == start and bad < 4 and end - start < ENTRY_HEADER_LENGTH:
        what = f"the last {end - start} bytes of the block are too few for an entry header and not padding"
    elif at - bad == start and bad < 4:
        what = "neither an entry header nor padding"
    else:
        what = f"block padding (FE DC DE AD from offset {base + start}) is broken"
    raise _fail(
        LengthMismatchError,
        f"{what}: byte 0x{view[at]:02X} where padding has 0x{PADDING_PATTERN[(at - start) % 4]:02X}",
        base + at,
        where,
    )


def decode_block(
    buf: bytes | bytearray | memoryview,
    offset: int = 0,
    *,
    where: str | None = None,
    base_offset: int = 0,
) -> DecodedBlock:
    """Decode and validate the block starting at ``offset`` of ``buf``; payloads are views of ``buf``.

    The whole block must be inside ``buf``. Error offsets are ``base_offset + position in buf``.
    """
    view = _as_view(buf)
    header = _decode_header(view, offset, where, base_offset)
    end = offset + header.block_length
    if end > len(view):
        raise _fail(
            TruncatedError,
            f"block of {header.block_length} bytes extends past the end of the data "
            f"({len(view) - offset} bytes remain from its start)",
            base_offset + offset,
            where,
        )
    entries: list[EntryRef] = []
    append = entries.append
    unpack_entry = ENTRY_HEADER.unpack_from
    pos = offset + BLOCK_HEADER_LENGTH
    previous = -1
    while True:
        remaining = end - pos
        if remaining < ENTRY_HEADER_LENGTH:
            # Too little room for another entry header: whatever is left must be padding.
            if remaining:
                _check_padding(view, pos, end, where, base_offset)
            break
        length, entry_id = unpack_entry(view, pos)
        if length == PADDING_WORD:
            _check_padding(view, pos, end, where, base_offset)
            break
        if length > remaining - ENTRY_HEADER_LENGTH:
            if length > MAX_PAYLOAD_LENGTH:
                raise _fail(
                    LengthMismatchError,
                    f"neither an entry header nor padding: length word 0x{length:08X} is not a possible entry "
                    f"length, and padding starts with 0x{PADDING_WORD:08X}",
                    base_offset + pos,
                    where,
                )
            raise _fail(
                LengthMismatchError,
                f"entry header declares {length} payload bytes but only {remaining - ENTRY_HEADER_LENGTH} "
                f"remain before the block end at offset {base_offset + end}",
                base_offset + pos,
                where,
            )
        if not previous < entry_id <= MAX_ID:
            if entry_id > MAX_ID:
                raise _fail(
                    InvalidFieldError, f"entry id {entry_id} is negative as a Java long", base_offset + pos + 4, where
                )
            raise _fail(
                OrderingError,
                f"entry id {entry_id} does not follow entry id {previous} (ids must strictly increase)",
                base_offset + pos + 4,
                where,
            )
        previous = entry_id
        start = pos + ENTRY_HEADER_LENGTH
        # EntryRef built without its frozen __init__ (which costs three object.__setattr__ calls): this is the
        # per-entry hot path of every read.
        ref = _new_object(EntryRef)
        _set_entry_id(ref, entry_id)
        _set_entry_offset(ref, pos)
        pos = start + length
        _set_entry_payload(ref, view[start:pos])
        append(ref)
    if not entries:
        raise _fail(
            LengthMismatchError, "block holds no entries (padding right after the header)", base_offset + offset, where
        )
    if entries[0].entry_id != header.first_entry_id:
        raise _fail(
            LengthMismatchError,
            f"first entry id {entries[0].entry_id} differs from the block header's first entry id "
            f"{header.first_entry_id}",
            base_offset + offset + BLOCK_HEADER_LENGTH + 4,
            where,
        )
    return DecodedBlock(header, offset, entries)


def detect_format(buf: bytes | bytearray | memoryview, *, where: str | None = None) -> FormatVersion:
    """The format of a data object (or block) from the magic at its offset 0."""
    view = _as_view(buf)
    if len(view) < 4:
        raise _fail(TruncatedError, f"{len(view)} bytes are too few to hold a block magic", 0, where)
    (magic,) = _U32.unpack_from(view, 0)
    version = _VERSION_BY_MAGIC.get(magic)
    if version is None:
        raise _fail(
            BadMagicError,
            f"bad data block magic 0x{magic:08X} (expected 0x{V1_BLOCK_MAGIC:08X} for v1 or "
            f"0x{V2_BLOCK_MAGIC:08X} for v2)",
            0,
            where,
        )
    return version


def iter_blocks(
    data: bytes | bytearray | memoryview | mmap.mmap, *, where: str | None = None, base_offset: int = 0
) -> Iterator[DecodedBlock]:
    """Walk a whole data object block by block, validating each block and their order.

    All blocks must have the format of the first; positions (ledger id, entry id) must strictly increase
    from block to block, and the last block must end exactly at the end of ``data``.
    """
    view = _as_view(data)
    if len(view) == 0:
        raise _fail(TruncatedError, "data object is empty", base_offset, where)
    version: FormatVersion | None = None
    offset = 0
    last_position: tuple[int, int] | None = None
    while offset < len(view):
        block = decode_block(view, offset, where=where, base_offset=base_offset)
        header = block.header
        if version is None:
            version = header.version
        elif header.version is not version:
            raise _fail(
                BadMagicError,
                f"{header.version.label} block inside a {version.label} data object",
                base_offset + offset,
                where,
            )
        position = (header.ledger_id or 0, header.first_entry_id)
        if last_position is not None and position <= last_position:
            what = "ledger id and first entry id" if version is FormatVersion.V2 else "first entry id"
            raise _fail(
                OrderingError,
                f"block {what} {position if version is FormatVersion.V2 else position[1]} does not follow the "
                f"previous block, which ends at {last_position if version is FormatVersion.V2 else last_position[1]}",
                base_offset + offset + (28 if version is FormatVersion.V2 else 20),
                where,
            )
        last_position = (header.ledger_id or 0, block.last_entry_id)
        yield block
        offset = block.end


__all__ = [
    "BLOCK_HEADER_LENGTH",
    "ENTRY_HEADER_LENGTH",
    "MAX_BLOCK_LENGTH",
    "MAX_ID",
    "MAX_PAYLOAD_LENGTH",
    "MIN_BLOCK_LENGTH",
    "PADDING_PATTERN",
    "V1_BLOCK_MAGIC",
    "V2_BLOCK_MAGIC",
    "BlockHeader",
    "DecodedBlock",
    "EntryRef",
    "FormatVersion",
    "InvalidFieldError",
    "OrderingError",
    "assemble_block",
    "block_chunks",
    "check_id",
    "decode_block",
    "detect_format",
    "encode_block",
    "encode_block_chunks",
    "first_non_padding",
    "framed_entry_size",
    "iter_blocks",
    "padding",
    "payload_size",
]
