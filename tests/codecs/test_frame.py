"""The checksum frame shared by manifests, commits and block checksum records (codecs/frame.py)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamoffload.codecs.errors import BadMagicError, ChecksumError, TruncatedError
from streamoffload.codecs.frame import FRAME_LENGTH, frame, unframe

MAGIC = b"TST\x01"


@given(st.binary(max_size=300))
def test_a_framed_body_comes_back_whole(body: bytes) -> None:
    framed = frame(MAGIC, body)
    assert len(framed) == FRAME_LENGTH + len(body)
    assert bytes(unframe(framed, MAGIC, what="test record")) == body


@given(st.binary(min_size=1, max_size=64), st.data())
def test_every_flipped_bit_is_an_error_naming_the_record_and_where(body: bytes, data: st.DataObject) -> None:
    framed = bytearray(frame(MAGIC, body))
    bit = data.draw(st.integers(0, len(framed) * 8 - 1))
    framed[bit // 8] ^= 1 << (bit % 8)
    with pytest.raises((BadMagicError, ChecksumError)) as err:
        unframe(bytes(framed), MAGIC, what="test record", where="some/key")
    assert "test record" in str(err.value) and err.value.where == "some/key"
    assert err.value.offset == (0 if bit < 32 else 4)  # the magic, else the stored CRC


def test_short_input_is_truncated_naming_the_header_it_needs() -> None:
    with pytest.raises(TruncatedError, match=r"test record of 5 bytes is shorter than its 12-byte header"):
        unframe(frame(MAGIC, b"x")[:5], MAGIC, what="test record", min_length=12)
    with pytest.raises(TruncatedError, match=r"shorter than its 8-byte checksum frame"):
        unframe(b"TST", MAGIC, what="test record")


def test_another_magic_is_refused_with_the_hint() -> None:
    with pytest.raises(BadMagicError, match=r"not a test record: starts with 0x534f4d01, expected 0x54535401 \(old\)"):
        unframe(frame(b"SOM\x01", b"body"), MAGIC, what="test record", not_magic_hint=" (old)")
