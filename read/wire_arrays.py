"""A small vectorized decoder of the protobuf wire format: the fields of many messages in one buffer, read with
numpy a field of every message at a time, and byte ranges of the buffer cut out as Arrow arrays, with no Python
object per message or field. ``read.batch_arrays`` (``SingleMessageMetadata``) and ``read.entry_arrays``
(``MessageMetadata``) read through it.

It is the reader of fast paths: anything it does not read exactly as the protobuf runtime would raises
:class:`Irregular`, and the caller decodes those messages one by one with the runtime, which gives the values
or raises the error naming the message. Irregular here: a tag the caller does not know (which includes a wire
type other than the one its field has), a tag of more than one byte unless ``wide_tags`` (then a tag of two
bytes, never an overlong one), a varint of more than 10 bytes or above 64 bits, a length past the end of its
message.

Pure: no I/O.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

__all__ = ["MAX_JOINED", "PAD", "Irregular", "Round", "check_utf8", "cut", "records", "varints"]

MAX_JOINED = 0x7FFFFFFF - 16  # Arrow's binary arrays have 32-bit offsets
PAD = bytes(16)  # after the joined messages: a varint read near the end stays inside the buffer

Round = tuple[int | np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]
"""One round of :func:`records`: (the tag, or each field's tag when they differ; where the field's bytes start;
where they end; the varint after the tag (a value, or a length); the message it belongs to)."""


class Irregular(Exception):
    """Something a fast path leaves to the per-message decoder."""


def records(
    buf: np.ndarray,
    at: np.ndarray,
    end: np.ndarray,
    who: np.ndarray,
    known: np.ndarray,
    length_delimited: np.ndarray,
    *,
    wide_tags: bool = False,
) -> list[Round]:
    """The fields of the protobuf messages ``buf[at[i]:end[i]]``, round by round (one field of every message
    still unread per round). Every tag must be ``known`` (a table of 256 by tag), and a varint or
    length-delimited (``length_delimited`` says which); every field must end inside its message."""
    rounds: list[Round] = []
    while True:
        live = at < end
        if not live.all():
            at, end, who = at[live], end[live], who[live]
        if not len(at):
            return rounds
        tags, value_at = _tags(buf, at, wide_tags)
        first = int(tags[0])
        if (tags == first).all():
            if not known[first]:
                raise Irregular
            value, after = varints(buf, value_at)
            if length_delimited[first]:
                if (value > MAX_JOINED).any():
                    raise Irregular
                field_end = after + value.astype(np.int64)
            else:
                field_end = after
            rounds.append((first, after, field_end, value, who))
        else:
            if not known[tags].all():
                raise Irregular
            value, after = varints(buf, value_at)
            delimited = length_delimited[tags]
            if (delimited & (value > MAX_JOINED)).any():
                raise Irregular
            field_end = np.where(delimited, after + value.astype(np.int64), after)
            rounds.append((tags, after, field_end, value, who))
        if (field_end > end).any():
            raise Irregular
        at = field_end


def _tags(buf: np.ndarray, at: np.ndarray, wide: bool) -> tuple[np.ndarray, np.ndarray]:
    """Each field's tag (below 256) and where its value starts: one byte, or with ``wide`` two bytes for a tag of
    128 or more (the second byte is then not 0: a two-byte tag below 128 is overlong)."""
    tags = buf[at]
    wider = tags >= 0x80
    if not wider.any():
        return tags, at + 1
    if not wide:
        raise Irregular
    second = buf[at + wider]
    if (wider & (second != 1)).any():
        raise Irregular  # overlong (0), or a tag of 256 or more: no field of the messages read here has one
    return np.where(wider, (tags & 0x7F).astype(np.int64) | (second.astype(np.int64) << 7), tags), at + 1 + wider


def varints(buf: np.ndarray, at: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The varints starting at ``at`` (uint64) and where each ends, read a byte at a time for those that go on.
    More than 10 bytes, or above 64 bits, is irregular."""
    byte = buf[at]
    value = (byte & 0x7F).astype(np.uint64)
    going = np.flatnonzero(byte >= 0x80)
    if not len(going):
        return value, at + 1
    after = at + 1
    for k in range(1, 10):
        byte = buf[at[going] + k]
        value[going] |= (byte & 0x7F).astype(np.uint64) << np.uint64(7 * k)
        after[going] += 1
        if k == 9 and (byte > 1).any():
            raise Irregular  # above 64 bits
        going = going[byte >= 0x80]
        if not len(going):
            return value, after
    raise Irregular  # more than 10 bytes


def cut(data: pa.Buffer, total: int, at: np.ndarray, end: np.ndarray, null: np.ndarray | None = None) -> pa.Array:
    """``data[at[i]:end[i]]`` for every i (ascending, disjoint ranges) as a binary array, null where ``null``."""
    n = len(at)
    offsets = np.empty(2 * n + 2, dtype=np.int32)
    offsets[0] = 0
    offsets[1:-1:2] = at
    offsets[2:-1:2] = end
    offsets[-1] = total
    spans = pa.Array.from_buffers(pa.binary(), 2 * n + 1, [None, pa.py_buffer(offsets), data])
    index = np.arange(1, 2 * n, 2, dtype=np.int64)
    return spans.take(pa.array(index, mask=null if null is not None and null.any() else None))


def check_utf8(strings: pa.Array) -> pa.Array:
    """``strings`` as Arrow strings; not UTF-8 is irregular."""
    try:
        return strings.cast(pa.string())
    except pa.ArrowInvalid:
        raise Irregular from None
