"""Shared builders for the read-path tests: real offloaded histories (made in bench/histories.py, which
bench/fuzz.py uses too, re-exported here) and ways to damage a stored object."""

from __future__ import annotations

from bench.histories import BLOCK_SIZE, MIB, SEGMENT_BYTES, TOPIC, History, offload, pulsar_entries, strip_checksum
from streamoffload.storage.base import ObjectStore

__all__ = [
    "BLOCK_SIZE",
    "MIB",
    "SEGMENT_BYTES",
    "TOPIC",
    "History",
    "flip_byte",
    "offload",
    "pulsar_entries",
    "strip_checksum",
    "truncate",
]


def flip_byte(store: ObjectStore, key: str, offset: int) -> None:
    """Corrupt one byte of an object in place (a rewrite keeps its user metadata)."""
    info = store.head(key)
    data = bytearray(store.get(key))
    data[offset] ^= 0xFF
    store.put(key, bytes(data), dict(info.metadata))


def truncate(store: ObjectStore, key: str, length: int) -> None:
    info = store.head(key)
    store.put(key, store.get(key)[:length], dict(info.metadata))
