"""The operator's key-encryption keys, and a segment's data key as its manifest records it (encryption at rest).

A segment whose policy names a key id (``offloadEncryptionKeyId``) gets a random data key when it opens; the
Assigned manifest records the key id, the algorithm and the data key wrapped under that key-encryption key
(``codecs.block_cipher``), and the Offloaded manifest keeps them. Readers unwrap it with the key of that id, so
a segment stays readable as long as its key is configured: rotating means naming a new key id in the policy
(new segments use it) and keeping the old key until no segment needs it.

Keys come from a key file (JSON or TOML ``{"key-id": "<base64 of 32 bytes>"}``) named by
``STREAMOFFLOAD_KEYS_FILE`` and from environment variables ``STREAMOFFLOAD_KEK_<key-id>`` (base64), so Spark's
tasks, which inherit the job's environment, find them with no option carried through. :class:`KeyRing` is the
small interface; a KMS-backed one would implement ``key`` (or wrap and unwrap remotely). Key material never
reaches a log, a metric, a ``repr`` or an error: errors name the key id and where it was looked for.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from streamoffload.checkpoints import manifest as mf
from streamoffload.checkpoints.errors import CheckpointError
from streamoffload.codecs.block_cipher import ALGORITHM, KEY_BYTES, new_data_key, unwrap_key, wrap_key
from streamoffload.codecs.errors import FormatError
from streamoffload.errors import ConfigError, StreamOffloadError

if TYPE_CHECKING:
    from streamoffload.codecs.proto.offload_manifest_pb2 import SegmentManifest

ENV_KEYS_FILE = "STREAMOFFLOAD_KEYS_FILE"
ENV_KEY_PREFIX = "STREAMOFFLOAD_KEK_"
PROP_KEY_ID = "encryptionKeyId"
PROP_ALGORITHM = "encryptionAlgorithm"
PROP_WRAPPED_KEY = "encryptionWrappedKey"
KEY_ID = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")


class KeyUnavailableError(CheckpointError):
    """An encrypted segment (or a policy) needs a key id that is not configured."""

    def __init__(self, key_id: str, what: str) -> None:
        self.key_id = key_id
        super().__init__(
            f"{what} needs encryption key {key_id!r}, which is not configured (put it in the key file named by "
            f"{ENV_KEYS_FILE}, or in the environment variable {ENV_KEY_PREFIX}{key_id})"
        )


def check_key_id(key_id: str, where: str) -> str:
    if not KEY_ID.fullmatch(key_id):
        raise ConfigError(f"{where}: key id {key_id!r}: letters, digits, '_', '.' and '-' (at most 64), please")
    return key_id


def _decode_key(text: object, key_id: str, where: str) -> bytes:
    try:
        key = base64.b64decode(str(text), validate=True)
    except (binascii.Error, ValueError):
        raise ConfigError(f"{where}: key {key_id!r} is not base64") from None
    if len(key) != KEY_BYTES:
        raise ConfigError(f"{where}: key {key_id!r} must be {KEY_BYTES} bytes (AES-256), not {len(key)}")
    return key


def _check_private(stat: os.stat_result, where: str, path: str | os.PathLike[str]) -> None:
    """Refuse, as ssh does its private keys, a key file that group or others may read or write, or that another
    user (not root) owns: whoever can read it can decrypt every segment, whoever can write it choose the keys."""
    if os.name != "posix":
        return
    mode = stat.st_mode & 0o777
    if mode & 0o077:
        raise ConfigError(
            f"{where}: mode {mode:04o} lets group or others read or write it; a key file must be private to its "
            f"owner (chmod 600 {path})"
        )
    if stat.st_uid not in (os.geteuid(), 0):
        raise ConfigError(
            f"{where}: owned by uid {stat.st_uid}, not by this user (uid {os.geteuid()}) or root; a key file must be "
            "its owner's alone"
        )


@dataclass(frozen=True)
class KeyRing:
    """Key-encryption keys by id. ``repr`` shows the ids only."""

    keys: Mapping[str, bytes] = field(default_factory=dict, repr=False)

    def __repr__(self) -> str:
        return f"KeyRing(ids={sorted(self.keys)})"

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> KeyRing:
        where = f"key file {path}"
        try:
            with Path(path).open("rb") as file:
                _check_private(os.fstat(file.fileno()), where, path)
                text = file.read().decode("utf-8")
        except OSError as err:
            raise ConfigError(f"{where}: cannot be read ({err.strerror or err})") from None
        except UnicodeDecodeError:
            raise ConfigError(f"{where}: not UTF-8 text") from None
        try:
            doc = json.loads(text) if text.lstrip().startswith("{") else tomllib.loads(text)
        except (ValueError, tomllib.TOMLDecodeError):
            raise ConfigError(f"{where}: expected JSON or TOML of key id = base64 key") from None
        return cls({check_key_id(k, where): _decode_key(v, k, where) for k, v in doc.items()})

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> KeyRing:
        """The keys of ``STREAMOFFLOAD_KEYS_FILE`` and of ``STREAMOFFLOAD_KEK_<id>`` variables (these win)."""
        env = os.environ if environ is None else environ
        keys: dict[str, bytes] = {}
        if env.get(ENV_KEYS_FILE):
            keys.update(cls.from_file(env[ENV_KEYS_FILE]).keys)
        for name, value in env.items():
            if name.startswith(ENV_KEY_PREFIX) and len(name) > len(ENV_KEY_PREFIX):
                key_id = check_key_id(name[len(ENV_KEY_PREFIX) :], f"environment variable {name}")
                keys[key_id] = _decode_key(value, key_id, f"environment variable {name}")
        return cls(keys)

    @classmethod
    def with_file(cls, path: str | os.PathLike[str] | None) -> KeyRing | None:
        """The keys of ``path`` and of the environment (None without a path: the environment's, when needed)."""
        if not path:
            return None
        return cls({**cls.from_file(path).keys, **cls.from_env().keys})

    def key(self, key_id: str, what: str) -> bytes:
        found = self.keys.get(key_id)
        if found is None:
            raise KeyUnavailableError(key_id, what)
        return found


@dataclass(frozen=True)
class SegmentCipher:
    """What reads or writes an encrypted segment: its id (the associated data) and its data key."""

    key_id: str
    segment_id: bytes
    data_key: bytes = field(repr=False)


def encryption_key_id(manifest: SegmentManifest) -> str | None:
    """The key id an encrypted segment's manifest names (None: not encrypted)."""
    return mf.driver_property(manifest, PROP_KEY_ID) or None


def with_new_data_key(manifest: SegmentManifest, key_id: str, keyring: KeyRing) -> SegmentManifest:
    """``manifest`` recording a fresh data key wrapped under key ``key_id`` (an Assigned manifest, before any
    part is written)."""
    segment = mf.manifest_uuid(manifest)
    kek = keyring.key(key_id, f"segment {segment} of {manifest.topic} (its policy's offloadEncryptionKeyId)")
    wrapped = wrap_key(kek, new_data_key(), segment.bytes)
    out = mf.with_driver_property(manifest, PROP_KEY_ID, key_id)
    out = mf.with_driver_property(out, PROP_ALGORITHM, ALGORITHM)
    return mf.with_driver_property(out, PROP_WRAPPED_KEY, base64.b64encode(wrapped).decode("ascii"))


def copy_encryption(source: SegmentManifest, into: SegmentManifest) -> SegmentManifest:
    """``into`` with ``source``'s encryption properties (the sealed manifest takes the Assigned one's)."""
    out = into
    for prop in (PROP_KEY_ID, PROP_ALGORITHM, PROP_WRAPPED_KEY):
        value = mf.driver_property(source, prop)
        if value:
            out = mf.with_driver_property(out, prop, value)
    return out


def segment_cipher(
    manifest: SegmentManifest, keyring: KeyRing | None, *, where: str | None = None
) -> SegmentCipher | None:
    """The cipher of an encrypted segment (None for a plain one); :class:`KeyUnavailableError` without its key."""
    key_id = encryption_key_id(manifest)
    if key_id is None:
        return None
    segment = mf.manifest_uuid(manifest)
    what = f"segment {segment} of {manifest.topic}"
    algorithm = mf.driver_property(manifest, PROP_ALGORITHM)
    if algorithm != ALGORITHM:
        raise StreamOffloadError(f"{what} is encrypted with {algorithm!r}; this reader knows {ALGORITHM}")
    kek = (keyring if keyring is not None else KeyRing.from_env()).key(key_id, what)
    text = mf.driver_property(manifest, PROP_WRAPPED_KEY)
    if not text:
        raise FormatError(f"{what} is encrypted but its manifest records no {PROP_WRAPPED_KEY}", where=where)
    try:
        wrapped = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise FormatError(f"{what}: its manifest's {PROP_WRAPPED_KEY} is not base64", where=where) from None
    data_key = unwrap_key(kek, wrapped, segment.bytes, where=where or what)
    return SegmentCipher(key_id, segment.bytes, data_key)


__all__ = [
    "ENV_KEYS_FILE",
    "ENV_KEY_PREFIX",
    "KeyRing",
    "KeyUnavailableError",
    "SegmentCipher",
    "check_key_id",
    "copy_encryption",
    "encryption_key_id",
    "segment_cipher",
    "with_new_data_key",
]
