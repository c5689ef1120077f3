"""The plaintext view of an encrypted segment's data object (``codecs.block_cipher``), at plaintext offsets.

Everything that reads a data object through a ``RangedReader`` (the read handle's chunks, scans and
read-ahead) reads through this one unchanged: the index, the recorded checksums and the entries' framing are
the plaintext's. A read is served block by block: the stored block (its plaintext length plus
``OVERHEAD``, found :data:`~streamoffload.codecs.block_cipher.OVERHEAD` bytes later per block before it) is
fetched whole, authenticated and decrypted, and the last few plaintext blocks are kept for the reads that
follow (a sequential read asks for a block in several ranges).
"""

from __future__ import annotations

import bisect
import threading
from collections import OrderedDict
from collections.abc import Sequence

from streamoffload.checkpoints.keyring import SegmentCipher
from streamoffload.codecs.block_cipher import OVERHEAD, decrypt_block
from streamoffload.codecs.index import BlockLocation
from streamoffload.storage.base import RangedReader

KEPT_BLOCKS = 4


class DecryptingReader:
    """A ``RangedReader`` over the plaintext of an encrypted data object whose blocks are ``blocks``."""

    def __init__(self, inner: RangedReader, blocks: Sequence[BlockLocation], cipher: SegmentCipher) -> None:
        self.inner = inner
        self.store = inner.store
        self.key = inner.key
        self.remote = inner.remote
        self.readahead = inner.readahead
        self._offsets = [b.offset for b in blocks]
        self._lengths = [b.length for b in blocks]
        self._end = self._offsets[-1] + self._lengths[-1] if blocks else 0
        self._cipher = cipher
        self._kept: OrderedDict[int, bytes] = OrderedDict()
        self._lock = threading.Lock()  # the read-ahead reads from other threads

    def _plain(self, i: int) -> bytes:
        with self._lock:
            kept = self._kept.get(i)
            if kept is not None:
                self._kept.move_to_end(i)
                return kept
        offset = self._offsets[i]
        stored = self.inner.read(offset + OVERHEAD * i, self._lengths[i] + OVERHEAD)
        plain = decrypt_block(self._cipher.data_key, self._cipher.segment_id, offset, stored, where=self.key)
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
        pieces: list[bytes] = []
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


__all__ = ["DecryptingReader"]
