"""Encryption at rest of a data object's blocks: AES-256-GCM under a data key of the segment's own.

Each block of an encrypted segment is stored as ``nonce (12) || ciphertext || tag (16)``: the plaintext is the
block exactly as an unencrypted segment stores it (header, entries, padding), so the index, the recorded
checksums and every reader's decoding are those of the plaintext object, at its offsets; only where the block
lies in the stored object moves, by :data:`OVERHEAD` bytes per block before it.

* **Nonces** are the block's offset in the plaintext object (big-endian, 12 bytes): unique per block, and a
  data key serves one segment only, so no nonce repeats under a key. A rewrite of a block after a crash writes
  the same bytes (the offset and the key are the same), so uploads stay idempotent.
* **Associated data** is the segment's id: a block moved into another segment fails authentication, as does
  any flipped bit (GCM's tag).
* **Data keys** are random, 32 bytes, wrapped (AES-256-GCM, random nonce, the segment id as associated data)
  under a key-encryption key the operator holds; the manifest records the wrapped key and the key's id, never
  a key. ``cryptography`` does the AES (no hand-rolled crypto).

Pure: bytes in, bytes out, no I/O.
"""

from __future__ import annotations

import os

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from streamoffload.codecs.errors import FormatError

ALGORITHM = "AES-256-GCM"
KEY_BYTES = 32
NONCE_BYTES = 12
TAG_BYTES = 16
OVERHEAD = NONCE_BYTES + TAG_BYTES
"""Stored bytes a block gains when encrypted."""


class BlockAuthenticationError(FormatError):
    """An encrypted block (or wrapped key) fails authentication: altered bytes, or the wrong key."""


def _nonce(offset: int) -> bytes:
    return offset.to_bytes(NONCE_BYTES, "big")


def stored_length(plain_length: int, blocks: int) -> int:
    """The stored size of a data object of ``plain_length`` plaintext bytes in ``blocks`` blocks."""
    return plain_length + OVERHEAD * blocks


def encrypt_block(key: bytes, segment_id: bytes, offset: int, plaintext: bytes | bytearray | memoryview) -> bytes:
    """The stored form of the block at plaintext ``offset`` of segment ``segment_id``."""
    nonce = _nonce(offset)
    return nonce + AESGCM(key).encrypt(nonce, bytes(plaintext), segment_id)


def decrypt_block(
    key: bytes, segment_id: bytes, offset: int, stored: bytes | memoryview, *, where: str | None = None
) -> bytes:
    """The plaintext of the stored block that belongs at plaintext ``offset``; :class:`BlockAuthenticationError`
    when it was altered, belongs elsewhere, or the key is not the one it was written with."""
    view = memoryview(stored)
    if len(view) < OVERHEAD or bytes(view[:NONCE_BYTES]) != _nonce(offset):
        raise BlockAuthenticationError(
            f"encrypted block at plaintext offset {offset} does not carry its own nonce (altered or misplaced)",
            offset=offset,
            where=where,
        )
    try:
        return AESGCM(key).decrypt(bytes(view[:NONCE_BYTES]), bytes(view[NONCE_BYTES:]), segment_id)
    except InvalidTag:
        raise BlockAuthenticationError(
            f"encrypted block at plaintext offset {offset} fails authentication (altered bytes, or another key)",
            offset=offset,
            where=where,
        ) from None


def new_data_key() -> bytes:
    return os.urandom(KEY_BYTES)


def wrap_key(kek: bytes, data_key: bytes, segment_id: bytes) -> bytes:
    """``data_key`` encrypted under the key-encryption key ``kek``, bound to the segment."""
    nonce = os.urandom(NONCE_BYTES)
    return nonce + AESGCM(kek).encrypt(nonce, data_key, segment_id)


def unwrap_key(kek: bytes, wrapped: bytes, segment_id: bytes, *, where: str | None = None) -> bytes:
    try:
        key = AESGCM(kek).decrypt(wrapped[:NONCE_BYTES], wrapped[NONCE_BYTES:], segment_id)
    except (InvalidTag, ValueError):
        raise BlockAuthenticationError(
            "the segment's wrapped data key does not open with the configured key of that id (another key "
            "under the same id, or an altered manifest)",
            where=where,
        ) from None
    if len(key) != KEY_BYTES:
        raise BlockAuthenticationError("the segment's data key has the wrong length", where=where)
    return key


__all__ = [
    "ALGORITHM",
    "OVERHEAD",
    "BlockAuthenticationError",
    "decrypt_block",
    "encrypt_block",
    "new_data_key",
    "stored_length",
    "unwrap_key",
    "wrap_key",
]
