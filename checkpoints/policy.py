"""The offload policy of one topic-partition: a value every layer that sizes, seals or retains segments reads.

Field names are Pulsar's (``OffloadPolicies``) so a policy reads like a broker's; ``streamoffload.config``
parses and validates them from the configuration file."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from streamoffload.units import MIB


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

    @property
    def max_segment_bytes(self) -> int:
        # round, not int: 24000 / MIB * MIB or "65s" in minutes * 60_000 may land a hair below the integer.
        return round(self.maxSizePerOffloadSegmentMbytes * MIB)

    @property
    def rollover_ms(self) -> int:
        return round(self.maxOffloadSegmentRolloverTimeMinutes * 60_000)

    @property
    def block_size(self) -> int:
        return self.managedLedgerOffloadMaxBlockSizeInBytes

    def to_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}
