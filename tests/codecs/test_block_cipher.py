"""Encryption at rest, pure: blocks and wrapped data keys round-trip, and any change is refused."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamoffload.checkpoints.keyring import KeyRing, KeyUnavailableError
from streamoffload.codecs.block_cipher import (
    OVERHEAD,
    BlockAuthenticationError,
    decrypt_block,
    encrypt_block,
    new_data_key,
    unwrap_key,
    wrap_key,
)
from streamoffload.errors import ConfigError

SEGMENT = bytes(range(16))


@given(st.binary(max_size=4096), st.integers(0, 2**40))
def test_a_block_round_trips_and_grows_by_the_overhead(plain: bytes, offset: int) -> None:
    key = new_data_key()
    stored = encrypt_block(key, SEGMENT, offset, plain)
    assert len(stored) == len(plain) + OVERHEAD
    assert decrypt_block(key, SEGMENT, offset, stored) == plain
    assert encrypt_block(key, SEGMENT, offset, plain) == stored  # a rewrite after a crash: the same bytes


@given(st.binary(min_size=1, max_size=512), st.data())
def test_any_flipped_bit_is_refused(plain: bytes, data: st.DataObject) -> None:
    key = new_data_key()
    stored = bytearray(encrypt_block(key, SEGMENT, 128, plain))
    bit = data.draw(st.integers(0, len(stored) * 8 - 1))
    stored[bit // 8] ^= 1 << (bit % 8)
    with pytest.raises(BlockAuthenticationError):
        decrypt_block(key, SEGMENT, 128, bytes(stored), where="obj")


def test_a_block_moved_keyed_or_placed_elsewhere_is_refused() -> None:
    key = new_data_key()
    stored = encrypt_block(key, SEGMENT, 4096, b"entries")
    with pytest.raises(BlockAuthenticationError, match="nonce"):
        decrypt_block(key, SEGMENT, 0, stored)  # another offset
    with pytest.raises(BlockAuthenticationError, match="authentication"):
        decrypt_block(key, bytes(16), 4096, stored)  # another segment
    with pytest.raises(BlockAuthenticationError, match="authentication"):
        decrypt_block(new_data_key(), SEGMENT, 4096, stored)  # another key


def test_a_data_key_unwraps_only_with_its_key_and_segment() -> None:
    kek, data_key = new_data_key(), new_data_key()
    wrapped = wrap_key(kek, data_key, SEGMENT)
    assert unwrap_key(kek, wrapped, SEGMENT) == data_key
    with pytest.raises(BlockAuthenticationError):
        unwrap_key(new_data_key(), wrapped, SEGMENT)
    with pytest.raises(BlockAuthenticationError):
        unwrap_key(kek, wrapped, bytes(16))


def test_keys_come_from_a_file_and_the_environment_and_never_show(tmp_path: Path) -> None:
    k1, k2 = new_data_key(), new_data_key()
    path = tmp_path / "keys.json"
    path.touch(mode=0o600)  # a key file is its owner's alone
    path.write_text(json.dumps({"k1": base64.b64encode(k1).decode()}))
    ring = KeyRing.from_env(
        {"STREAMOFFLOAD_KEYS_FILE": str(path), "STREAMOFFLOAD_KEK_k2": base64.b64encode(k2).decode()}
    )
    assert ring.key("k1", "test") == k1 and ring.key("k2", "test") == k2
    assert base64.b64encode(k1).decode() not in repr(ring) and "k1" in repr(ring)
    with pytest.raises(KeyUnavailableError, match=r"'k3'.*STREAMOFFLOAD_KEK_k3"):
        ring.key("k3", "segment x")
    path.write_text(json.dumps({"k1": base64.b64encode(b"short").decode()}))
    with pytest.raises(ConfigError, match="must be 32 bytes") as err:
        KeyRing.from_file(path)
    assert base64.b64encode(b"short").decode() not in str(err.value)
    path.write_text('k1 = "not base64!"')
    with pytest.raises(ConfigError, match="not base64") as err:
        KeyRing.from_file(path)
    assert "not base64!" not in str(err.value)
