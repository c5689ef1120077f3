"""Describing a data object (and its index) from local files: its format, blocks, ledgers and entries, the
index cross-checked against it. What ``streamoffload inspect`` prints; a corrupt object raises a
``FormatError`` naming the file and the byte offset."""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

import crc32c

from streamoffload.codecs.blocks import DecodedBlock, FormatVersion, iter_blocks
from streamoffload.codecs.index import OffloadIndex, verify_against_blocks
from streamoffload.read.segment.errors import ReadError
from streamoffload.storage.keys import ledger_id_in_key

UNKNOWN_LEDGER_KEY = "unknown"


class InspectError(ReadError):
    """A file that cannot be read, or arguments that do not fit the object."""


@contextmanager
def _mapped(path: str) -> Iterator[bytes | mmap.mmap]:
    """The file's bytes, memory-mapped so that large objects are not read into memory first."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size == 0:
                yield b""
                return
            mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except OSError as err:
        raise InspectError(f"cannot read {path}: {err.strerror or err}") from err
    try:
        yield mapped
    finally:
        # A decode error's traceback may still hold views of the map; it then closes when they are collected.
        with suppress(BufferError):
            mapped.close()


def ledger_id_from_name(*paths: str | None) -> int | None:
    """The ledger id in a v1 object name (``<uuid>-ledger-<N>`` or ``<uuid>-ledger-<N>-index``), if any."""
    for path in paths:
        if path:
            found = ledger_id_in_key(os.path.basename(path))
            if found is not None:
                return found
    return None


def inspect_objects(
    data_path: str,
    index_path: str | None = None,
    *,
    ledger_id: int | None = None,
    with_entries: bool = False,
) -> dict[str, Any]:
    """Decode the data object at ``data_path`` (and cross-check ``index_path``) into a JSON-ready report."""
    placed: list[DecodedBlock] = []
    with _mapped(data_path) as data:
        report = _describe_data(data, data_path, ledger_id, index_path, with_entries, placed)
    if index_path is not None:
        with _mapped(index_path) as raw_index:
            fmt = FormatVersion(int(report["format"][1:]))
            # A v1 index does not record its ledger id either; when it is unknown, any placeholder lets the
            # index decode (the id is not compared with anything and is not reported).
            index = OffloadIndex.decode(raw_index, ledger_id=report["_ledger_id"] or 0, where=index_path)
            index_length = len(raw_index)
        if index.version is not fmt:
            raise InspectError(f"{index_path}: {index.version.label} index for the {fmt.label} data object {data_path}")
        verify_against_blocks(index, placed, report["data_length"], where=index_path)
        report["index"] = {
            "file": index_path,
            "format": index.version.label,
            "length": index_length,
            "data_object_length": index.data_object_length,
            "blocks": len(index.blocks()),
            "ledgers": {
                (str(ledger.ledger_id) if index.version is FormatVersion.V2 else _ledger_key(report["_ledger_id"])): {
                    "blocks": len(ledger.entries),
                    "metadata_length": len(ledger.metadata),
                }
                for ledger in index.ledgers
            },
            "agrees_with_data": True,
        }
    del report["_ledger_id"]
    return report


def _ledger_key(ledger_id: int | None) -> str:
    return UNKNOWN_LEDGER_KEY if ledger_id is None else str(ledger_id)


def _describe_data(
    data: bytes | mmap.mmap,
    data_path: str,
    ledger_id: int | None,
    index_path: str | None,
    with_entries: bool,
    placed: list[DecodedBlock],
) -> dict[str, Any]:
    """Walk the data object once; ``placed`` receives each block's header and offset (without entries, which
    are views of the mapped file) for the index cross-check."""
    blocks: list[dict[str, Any]] = []
    ledgers: dict[str, dict[str, Any]] = {}
    entries: list[dict[str, Any]] = []
    fmt: FormatVersion | None = None
    v1_ledger: int | None = None
    for block in iter_blocks(data, where=data_path):
        header = block.header
        placed.append(DecodedBlock(header, block.offset, []))
        if fmt is None:
            fmt = header.version
            if fmt is FormatVersion.V1:
                v1_ledger = ledger_id if ledger_id is not None else ledger_id_from_name(data_path, index_path)
        block_ledger = header.ledger_id if fmt is FormatVersion.V2 else v1_ledger
        payload_bytes = sum(e.payload.nbytes for e in block.entries)
        blocks.append(
            {
                "offset": block.offset,
                "length": header.block_length,
                "ledger_id": block_ledger,
                "first_entry_id": header.first_entry_id,
                "last_entry_id": block.last_entry_id,
                "entry_count": len(block.entries),
                "payload_bytes": payload_bytes,
            }
        )
        summary = ledgers.get(_ledger_key(block_ledger))
        if summary is None:
            summary = ledgers[_ledger_key(block_ledger)] = {
                "entries": 0,
                "first_entry_id": header.first_entry_id,
                "last_entry_id": None,
                "bytes": 0,
                "blocks": 0,
            }
        summary["entries"] += len(block.entries)
        summary["last_entry_id"] = block.last_entry_id
        summary["bytes"] += payload_bytes
        summary["blocks"] += 1
        if with_entries:
            entries.extend(
                {
                    "ledger_id": block_ledger,
                    "entry_id": e.entry_id,
                    "length": e.payload.nbytes,
                    "crc32c": crc32c.crc32c(e.payload),
                }
                for e in block.entries
            )
        del block  # drop views of the mapped file before it is closed
    assert fmt is not None  # iter_blocks raises on an empty object
    report: dict[str, Any] = {
        "file": data_path,
        "format": fmt.label,
        "data_length": len(data),
        "blocks": blocks,
        "ledgers": ledgers,
        "_ledger_id": v1_ledger if fmt is FormatVersion.V1 else None,
    }
    if with_entries:
        report["entries"] = entries
    return report
