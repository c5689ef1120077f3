"""The plaintext view of a data object whose blocks are stored encrypted and/or compressed, at plaintext offsets.

Everything that reads a data object through a ``RangedReader`` (the read handle's chunks, scans and
read-ahead, ``verify``'s walk) reads through this one unchanged: the index, the recorded checksums and the
entries' framing are the plaintext's. A read is served block by block: the stored frame
(``codecs.block_frames.StoredBlock``: where the frame table, or the cipher's fixed overhead, puts it) is
fetched whole, authenticated and decrypted (``codecs.block_cipher``), decompressed
(``codecs.block_frames``), and the last few plaintext blocks are kept for the reads that follow (a
sequential read asks for a block in several ranges).
"""

from __future__ import annotations

import bisect
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from streamoffload.checkpoints import manifest as mf
from streamoffload.checkpoints.keyring import SegmentCipher, encryption_key_id
from streamoffload.codecs.block_cipher import OVERHEAD, decrypt_block
from streamoffload.codecs.block_frames import (
    CODEC_NONE,
    MAX_BLOCK,
    FrameError,
    StoredBlock,
    decompress_block,
    stored_blocks,
    stored_size,
)
from streamoffload.codecs.errors import FormatError
from streamoffload.codecs.index import BlockLocation
from streamoffload.codecs.proto.offload_manifest_pb2 import SegmentManifest
from streamoffload.storage.base import RangedReader

KEPT_BLOCKS = 4


@dataclass(frozen=True)
class StoredLayout:
    """Where a segment's blocks lie as stored, and the data object's stored size."""

    blocks: list[StoredBlock]
    size: int
    block_size: int = MAX_BLOCK
    """The segment's block size (its policy's ``managedLedgerOffloadMaxBlockSizeInBytes``): no compressed block's
    plaintext is longer, so none is inflated beyond it."""


def _block_size(manifest: SegmentManifest) -> int:
    """The block size the segment was opened with; ``MAX_BLOCK`` when its manifest does not say (or says it in
    a form that does not read: the manifest's checks report that)."""
    try:
        text = mf.policy_field(manifest, "managedLedgerOffloadMaxBlockSizeInBytes")
    except FormatError:
        return MAX_BLOCK
    return int(text) if text.isdigit() and 0 < int(text) <= MAX_BLOCK else MAX_BLOCK


def stored_otherwise(manifest: SegmentManifest) -> bool:
    """Whether the segment's blocks are not stored as its index says (encrypted, compressed, or both)."""
    return encryption_key_id(manifest) is not None or mf.driver_property(manifest, mf.PROP_FRAMES) is not None


def stored_layout(manifest: SegmentManifest | None, blocks: Sequence[BlockLocation]) -> StoredLayout | None:
    """How the segment's blocks (the index's, plaintext) are stored: its manifest's frame table (compressed),
    or each block the cipher's overhead longer (encrypted); None when they are stored as the index says.
    Needs no key: the sizes are the manifest's."""
    if manifest is None or not stored_otherwise(manifest):
        return None
    frames = mf.frame_table(manifest)
    plain = [(b.offset, b.length) for b in blocks]
    if frames is not None:
        block_size = _block_size(manifest)
        laid = stored_blocks(plain, frames)
        for i, block in enumerate(laid):
            if block.codec != CODEC_NONE and block.plain_length > block_size:
                raise FrameError(
                    f"block {i + 1} at plaintext offset {block.plain_offset} is compressed and its index says it holds "
                    f"{block.plain_length} bytes, above the segment's {block_size}-byte block size"
                )
        return StoredLayout(laid, stored_size(frames), block_size)
    laid = stored_blocks(plain, None, OVERHEAD)
    return StoredLayout(laid, sum(b.stored_length for b in laid))


class StoredBlockReader(RangedReader):
    """A ``RangedReader`` over the plaintext of a data object whose blocks are stored as ``blocks`` say,
    sealed with ``cipher`` when it is not None."""

    def __init__(
        self,
        inner: RangedReader,
        blocks: Sequence[StoredBlock],
        cipher: SegmentCipher | None,
        block_size: int = MAX_BLOCK,
    ) -> None:
        super().__init__(inner.store, inner.key)
        self.inner = inner
        self.remote = inner.remote
        self.readahead = inner.readahead
        self._blocks = list(blocks)
        self._offsets = [b.plain_offset for b in blocks]
        self._end = blocks[-1].plain_offset + blocks[-1].plain_length if blocks else 0
        self._cipher = cipher
        self._block_size = block_size
        self._kept: OrderedDict[int, bytes | bytearray] = OrderedDict()
        self._lock = threading.Lock()  # the read-ahead reads from other threads

    def _plain(self, i: int) -> bytes | bytearray:
        with self._lock:
            kept = self._kept.get(i)
            if kept is not None:
                self._kept.move_to_end(i)
                return kept
        block = self._blocks[i]
        frame = self.inner.read(block.stored_offset, block.stored_length)
        if self._cipher is not None:
            frame = decrypt_block(
                self._cipher.data_key, self._cipher.segment_id, block.plain_offset, frame, where=self.key
            )
        plain = decompress_block(
            block.codec, frame, block.plain_length, offset=block.plain_offset, where=self.key, max_size=self._block_size
        )
        with self._lock:
            self._kept[i] = plain
            while len(self._kept) > KEPT_BLOCKS:
                self._kept.popitem(last=False)
        return plain

    def read(self, start: int, length: int) -> bytes:
        end = min(start + length, self._end)
        if start >= end:
            return b""
        i = max(bisect.bisect_right(self._offsets, start) - 1, 0)
        pieces: list[bytes | bytearray] = []
        pos = start
        while pos < end:
            plain = self._plain(i)
            rel = pos - self._offsets[i]
            take = min(end - pos, len(plain) - rel)
            pieces.append(plain[rel : rel + take])
            pos += take
            i += 1
        return b"".join(pieces)

    def close(self) -> None:
        self._kept.clear()
        self.inner.close()


__all__ = ["StoredBlockReader", "StoredLayout", "stored_layout", "stored_otherwise"]
