"""How a segment's blocks are stored at rest: compressed (zstd, ``codecs.block_frames``), then encrypted (AES-GCM,
``codecs.block_cipher``) block by block, both as the policy its Assigned manifest recorded says.

Pure: blocks in, stored buffers (and the part's frame records) out; the sink fetches the entries and writes the
results.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from streamoffload.checkpoints import manifest as mf
from streamoffload.checkpoints.keyring import KeyRing, SegmentCipher, encryption_key_id, segment_cipher
from streamoffload.codecs.block_cipher import encrypt_block
from streamoffload.codecs.block_frames import CODEC_NONE, DEFAULT_LEVEL, FILLER, Frame, PartFrames, compress_block
from streamoffload.codecs.entry import entry_incompressible
from streamoffload.codecs.proto.offload_manifest_pb2 import SegmentManifest
from streamoffload.storage.base import Buffer, buffers_size
from streamoffload.streaming.handoff.part_layout import BlockLayout


@dataclass(frozen=True)
class BlockEncoding:
    """How a segment's blocks are stored: sealed with ``cipher`` (None: in the clear), compressed at ``level``
    (None: as they are), both from the policy its Assigned manifest recorded."""

    cipher: SegmentCipher | None = None
    level: int | None = None

    @property
    def plain(self) -> bool:
        return self.cipher is None and self.level is None

    @classmethod
    def of(cls, written: SegmentManifest, keyring: KeyRing) -> BlockEncoding:
        """The encoding of the segment whose Assigned manifest is ``written`` (its data key unwrapped by
        ``keyring``)."""
        cipher = segment_cipher(written, keyring) if encryption_key_id(written) else None
        return cls(cipher, policy_compression_level(written))


def policy_key_id(manifest: SegmentManifest) -> str:
    """The encryption key id of the policy the segment was opened under ("" : not encrypted)."""
    return mf.policy_field(manifest, "offloadEncryptionKeyId")


def policy_compression_level(manifest: SegmentManifest) -> int | None:
    """The zstd level of the policy the segment was opened under (None: not compressed)."""
    if mf.policy_field(manifest, "offloadCompression", "none") == "none":
        return None
    return int(mf.policy_field(manifest, "offloadCompressionLevel", str(DEFAULT_LEVEL)))


def encode_part(
    encoding: BlockEncoding,
    layouts: Sequence[BlockLayout],
    blocks: Sequence[Sequence[Buffer]],
    payloads: Sequence[Buffer],
    *,
    offset: int,
    min_part_size: int,
    last: bool,
) -> tuple[list[Buffer], PartFrames | None]:
    """A part's blocks (``blocks``: each block's buffers, as ``layouts`` built them from ``payloads``) as stored:
    each block compressed (skipped when all its entries are incompressible already), then sealed at its plaintext
    ``offset`` in the data object. With compression, also the part's frames (recorded beside the part), and a
    part below ``min_part_size`` but the ``last`` filled up (S3 refuses it; the frame table skips the filler)."""
    stored: list[Buffer] = []
    frames: list[Frame] = []
    first = 0
    for layout, chunks in zip(layouts, blocks, strict=True):
        plain = b"".join(chunks)
        codec = CODEC_NONE
        body: Buffer = plain
        if encoding.level is not None:
            entries = payloads[first : first + len(layout.entries)]
            skip = all(entry_incompressible(entry) for entry in entries)
            codec, body = compress_block(plain, encoding.level, skip=skip)
        first += len(layout.entries)
        cipher = encoding.cipher
        if cipher is not None:
            body = encrypt_block(cipher.data_key, cipher.segment_id, offset, body)
        stored.append(body)
        frames.append(Frame(codec, buffers_size([body])))
        offset += layout.length
    if encoding.level is None:
        return stored, None
    filler = min_part_size - sum(f.stored_length for f in frames)
    if filler > 0 and not last:
        stored.append(FILLER * filler)
        frames[-1] = Frame(frames[-1].codec, frames[-1].stored_length, filler)
    return stored, PartFrames(tuple(frames))
