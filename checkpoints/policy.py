"""The offload policy of one topic-partition: a value every layer that sizes, seals or retains segments reads.

Field names are Pulsar's (``OffloadPolicies``) so a policy reads like a broker's; ``streamoffload.config``
parses and validates them from the configuration file."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from streamoffload.units import MIB

COMPRESSED_PART_FACTOR = 8
"""How many times a store's minimum part a compressed segment gathers per part (``min_part_bytes``)."""


@dataclass(frozen=True)
class OffloadPolicy:
    """The effective offload policy of one topic-partition (after broker/namespace/topic merging)."""

    enabled: bool = True
    method: str = "streaming"
    maxSizePerOffloadSegmentMbytes: float = 1024.0
    maxOffloadSegmentRolloverTimeMinutes: float = 10.0
    managedLedgerOffloadMaxBlockSizeInBytes: int = 64 * MIB
    managedLedgerOffloadReadBufferSizeInBytes: int = 1 * MIB
    offloadBufferMaxBytes: int = 128 * MIB
    """Bound of the PIP-76 offload buffer: bytes accepted but not yet uploaded, per topic-partition."""
    retentionTimeInMinutes: float = -1.0
    """Offloaded ledgers older than this are marked deleted; -1 keeps them forever."""
    retentionSizeInMB: float = -1.0
    """Oldest ledgers are marked deleted while the offloaded total exceeds this; -1: no limit."""
    managedLedgerOffloadDeletionLagMs: int = 4 * 60 * 60 * 1000
    """How long a segment whose ledgers are all marked deleted stays readable before its objects go."""
    offloadReadRateBytesPerSecond: int = -1
    """Entry bytes per second read from the broker for this topic-partition (the source's read and the sink's
    re-read each count); -1: no limit. Applied to the micro-batches after a change's effective time."""
    offloadUploadRateBytesPerSecond: int = -1
    """Bytes per second of this topic-partition's parts uploaded to the store; -1: no limit."""
    offloadTotalReadRateBytesPerSecond: int = -1
    """The job's read limit over all its topic-partitions (``[offload]`` only: it is not a topic's); -1: none."""
    offloadTotalUploadRateBytesPerSecond: int = -1
    """The job's upload limit over all its topic-partitions (``[offload]`` only); -1: none."""
    offloadEncryptionKeyId: str = ""
    """Encrypt new segments at rest (AES-256-GCM, a data key per segment) under the key-encryption key of this
    id (``checkpoints.keyring``); empty (the default): stored in the clear, as Pulsar's own readers read them.
    Naming another id rotates: new segments use it, older ones keep theirs."""
    offloadCompression: str = "none"
    """Compress new segments' blocks at rest: ``zstd``, or ``none`` (the default: objects Pulsar's own readers
    read). Blocks whose entries the producer compressed already, and blocks that would not shrink, are stored as
    they are (``codecs.block_frames``)."""
    offloadCompressionLevel: int = 1
    """zstd's level for ``offloadCompression = "zstd"`` (1 fastest .. 19 smallest). 1: on JSON events it keeps
    all but half a percent of level 3's ratio at 1.4 times its speed (bench/README.md "compression at rest")."""

    @property
    def max_segment_bytes(self) -> int:
        # round, not int: 24000 / MIB * MIB or "65s" in minutes * 60_000 may land a hair below the integer.
        return round(self.maxSizePerOffloadSegmentMbytes * MIB)

    @property
    def rollover_ms(self) -> int:
        return round(self.maxOffloadSegmentRolloverTimeMinutes * 60_000)

    @property
    def compressed(self) -> bool:
        return self.offloadCompression != "none"

    def min_part_bytes(self, store_min_part: int) -> int:
        """The plaintext bytes the segmenter gathers into a part on a store whose parts (but the last) must be
        at least ``store_min_part`` bytes: that, or for a compressed segment ``COMPRESSED_PART_FACTOR`` times
        it, so that a part compressed by up to that factor is still big enough (one that shrinks more is
        filled up by the sink, ``codecs.block_frames``). A store without a minimum needs no more."""
        if self.compressed and store_min_part > 1:
            return store_min_part * COMPRESSED_PART_FACTOR
        return max(1, store_min_part)

    @property
    def block_size(self) -> int:
        return self.managedLedgerOffloadMaxBlockSizeInBytes

    def rate_limit(self, kind: str) -> tuple[int, int]:
        """``(per topic-partition, job total)`` bytes per second of ``kind`` (``read`` or ``upload``); -1: none."""
        if kind == "read":
            return self.offloadReadRateBytesPerSecond, self.offloadTotalReadRateBytesPerSecond
        if kind == "upload":
            return self.offloadUploadRateBytesPerSecond, self.offloadTotalUploadRateBytesPerSecond
        raise ValueError(f"unknown rate limit kind {kind!r}")

    def to_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}
