"""The offload policy of one topic-partition: its type, what each value may be (bounds and rules), and the
block-size rule that ties it to the broker. Every layer that sizes, seals or retains segments reads it.

Field names are Pulsar's (``OffloadPolicies``) so a policy reads like a broker's; ``streamoffload.config`` turns
the configuration file's sections into the values, :func:`validated_policy` checks them. Bounds keep every size
and time far inside a Java long (Pulsar keeps them in ints and longs), so no arithmetic on them can overflow."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any

from streamoffload.checkpoints.keyring import KEY_ID
from streamoffload.codecs.block_frames import COMPRESSIONS
from streamoffload.codecs.blocks import BLOCK_HEADER_LENGTH, ENTRY_HEADER_LENGTH, MAX_BLOCK_LENGTH, MIN_BLOCK_LENGTH
from streamoffload.codecs.compression import MAX_MESSAGE_SIZE
from streamoffload.errors import ConfigError
from streamoffload.units import DAY_MS, MIB, MINUTE_MS, TIB

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
    offloadTable: bool = False
    """Keep the topic's Apache Iceberg table current from the job (``streaming.job.tables``): after its segments
    are committed, their messages are appended to the table, exactly once. A partitioned topic's table (one for
    all its partitions) follows the partitioned topic's policy. False (the default): no table is written by the
    job (``streamoffload table sync`` still makes one on demand)."""
    offloadTableSchema: str = ""
    """The topic's value schema for its table (``streamoffload.table.schema``): a JSON Schema (values are JSON) or
    an Avro record (values are Avro binary, as Pulsar's AVRO schema writes them), inline (text starting with
    ``{``) or ``@PATH`` to a file holding it; or ``broker``: the topic's AVRO or JSON schema in the broker's schema
    registry, asked at each sync, each message decoded with its own schema version (``table.registry_schema``).
    Values are decoded into the table's ``value_decoded`` column; those that do not decode also go to its
    dead-letter table. Empty (the default): raw values only."""

    @property
    def max_segment_bytes(self) -> int:
        # round, not int: 24000 / MIB * MIB or "65s" in minutes * 60_000 may land a hair below the integer.
        return round(self.maxSizePerOffloadSegmentMbytes * MIB)

    @property
    def rollover_ms(self) -> int:
        return round(self.maxOffloadSegmentRolloverTimeMinutes * MINUTE_MS)

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


METHODS = ("streaming", "ledger")
RATE_KEYS = (
    "offloadReadRateBytesPerSecond",
    "offloadUploadRateBytesPerSecond",
    "offloadTotalReadRateBytesPerSecond",
    "offloadTotalUploadRateBytesPerSecond",
)
JOB_ONLY_KEYS = ("offloadTotalReadRateBytesPerSecond", "offloadTotalUploadRateBytesPerSecond")
"""Policy keys of the whole job: allowed in ``[offload]`` only, not in a namespace's or a topic's section."""

# Bounds (see conf/streamoffload.toml).
HEADER_AND_ONE_ENTRY = MIN_BLOCK_LENGTH + 1
"""The smallest block: a header and one framed entry of one byte."""
MAX_BLOCK_BYTES = MAX_BLOCK_LENGTH
"""managedLedgerOffloadMaxBlockSizeInBytes and ...ReadBufferSizeInBytes: Pulsar's int."""
MAX_SEGMENT_MB = TIB // MIB
"""maxSizePerOffloadSegmentMbytes: 1 TiB."""
MAX_BUFFER_BYTES = TIB
"""offloadBufferMaxBytes: 1 TiB."""
MAX_ROLLOVER_MINUTES = 30 * 24 * 60
"""maxOffloadSegmentRolloverTimeMinutes: 30 days."""
MAX_RETENTION_MINUTES = 100 * 366 * 24 * 60
"""retentionTimeInMinutes: 100 years (-1 keeps forever)."""
MAX_RETENTION_MB = 2**40
"""retentionSizeInMB: 1 EiB (-1 for no limit)."""
MAX_DELETION_LAG_MS = 100 * 366 * DAY_MS
"""managedLedgerOffloadDeletionLagMs: 100 years."""
MAX_RATE_BYTES_PER_SECOND = TIB
"""The rate limits (offload...RateBytesPerSecond): 1 TiB/s (-1 for no limit)."""
MAX_COMPRESSION_LEVEL = 19
"""zstd's smallest-output level."""


def _table_schema(value: object) -> bool:
    """Empty, ``broker``, ``@PATH``, or a JSON object (what it maps to is checked by the sync, ``table.schema``)."""
    if not isinstance(value, str):
        return False
    if value in ("", "broker") or (value.startswith("@") and value[1:].strip()):
        return True
    try:
        return isinstance(json.loads(value), dict)
    except ValueError:
        return False


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _within(low: float, high: float, *, unlimited: bool = False) -> Callable[[Any], bool]:
    """``low <= value <= high`` for a real number (or -1 where ``unlimited``); nan, inf outside the range and
    non-numbers fail it."""
    return lambda value: (unlimited and value == -1) or (_number(value) and low <= value <= high)


@dataclass(frozen=True)
class Rule:
    """What one policy value may be: ``holds(value, policy)``, and the problem said when it does not (formatted
    with ``value`` and ``p``, the policy). Rules are checked in order; the first that fails is the error."""

    key: str
    holds: Callable[[Any, OffloadPolicy], bool]
    problem: str


def _on_value(test: Callable[[Any], bool]) -> Callable[[Any, OffloadPolicy], bool]:
    return lambda value, _p: test(value)


_RATE_PROBLEM = (
    f"must be -1 (no limit) or bytes per second between 1 and {MAX_RATE_BYTES_PER_SECOND} (1 TiB/s; "
    "to pause a topic set enabled = false), got {value!r}"
)

RULES: tuple[Rule, ...] = (
    Rule("enabled", _on_value(lambda v: isinstance(v, bool)), "must be true or false, got {value!r}"),
    Rule("offloadTable", _on_value(lambda v: isinstance(v, bool)), "must be true or false, got {value!r}"),
    Rule(
        "offloadTableSchema",
        _on_value(_table_schema),
        'must be empty, a JSON Schema or Avro record as JSON text, @PATH to a file holding one, or "broker" (the '
        "broker's schema registry), got {value!r:.80}",
    ),
    Rule("method", _on_value(lambda v: v in METHODS), f"must be one of {', '.join(METHODS)}, got {{value!r}}"),
    Rule(
        "offloadEncryptionKeyId",
        _on_value(lambda v: v == "" or (isinstance(v, str) and bool(KEY_ID.fullmatch(v)))),
        "must be empty (no encryption) or a key id: letters, digits, '_', '.' and '-' (at most 64), got {value!r}",
    ),
    Rule(
        "offloadCompression",
        _on_value(lambda v: v in COMPRESSIONS),
        f"must be one of {', '.join(COMPRESSIONS)}, got {{value!r}}",
    ),
    Rule(
        "offloadCompressionLevel",
        _on_value(lambda v: isinstance(v, int) and 1 <= v <= MAX_COMPRESSION_LEVEL),
        f"must be a zstd level from 1 (fastest) to {MAX_COMPRESSION_LEVEL} (smallest), got {{value!r}}",
    ),
    Rule(
        "managedLedgerOffloadMaxBlockSizeInBytes",
        _on_value(_within(HEADER_AND_ONE_ENTRY, MAX_BLOCK_BYTES)),
        f"must be at least {HEADER_AND_ONE_ENTRY} (a 128-byte header and one framed entry) and at most "
        f"{MAX_BLOCK_BYTES} (Pulsar's int), got {{value!r}}",
    ),
    Rule(
        "maxSizePerOffloadSegmentMbytes",
        lambda v, p: _within(0, MAX_SEGMENT_MB)(v) and v > 0 and p.max_segment_bytes >= 1,
        f"must be positive (at least 1 byte) and at most {MAX_SEGMENT_MB} (1 TiB), got {{value!r}}",
    ),
    Rule(
        "maxOffloadSegmentRolloverTimeMinutes",
        lambda v, p: _within(0, MAX_ROLLOVER_MINUTES)(v) and p.rollover_ms >= 1,
        f"must be positive (at least 1 ms) and at most {MAX_ROLLOVER_MINUTES} (30 days), got {{value!r}}",
    ),
    Rule(
        "offloadBufferMaxBytes",
        _on_value(_within(0, MAX_BUFFER_BYTES)),
        f"must be at most {MAX_BUFFER_BYTES} (1 TiB), got {{value!r}}",
    ),
    Rule(
        "offloadBufferMaxBytes",
        lambda v, p: v >= p.block_size,
        "({value}) must hold at least one block ({p.block_size})",
    ),
    Rule(
        "managedLedgerOffloadReadBufferSizeInBytes",
        _on_value(_within(1, MAX_BLOCK_BYTES)),
        f"must be positive and at most {MAX_BLOCK_BYTES} (Pulsar's int), got {{value!r}}",
    ),
    Rule(
        "retentionTimeInMinutes",
        _on_value(_within(0, MAX_RETENTION_MINUTES, unlimited=True)),
        f"must be -1 (keep forever) or between 0 and {MAX_RETENTION_MINUTES} (100 years), got {{value!r}}",
    ),
    Rule(
        "retentionSizeInMB",
        _on_value(_within(0, MAX_RETENTION_MB, unlimited=True)),
        f"must be -1 (no limit) or between 0 and {MAX_RETENTION_MB} (1 EiB), got {{value!r}}",
    ),
    Rule(
        "managedLedgerOffloadDeletionLagMs",
        _on_value(_within(0, MAX_DELETION_LAG_MS)),
        f"must be between 0 and {MAX_DELETION_LAG_MS} (100 years), got {{value!r}}",
    ),
    *(Rule(key, _on_value(_within(1, MAX_RATE_BYTES_PER_SECOND, unlimited=True)), _RATE_PROBLEM) for key in RATE_KEYS),
)
"""Every policy value's rule, written so that nan fails it (comparisons with nan are False), for values that
did not come through the configuration's parsing (policy documents built by code)."""


def validated_policy(values: Mapping[str, Any], source: str, section: str) -> OffloadPolicy:
    """The policy of ``values`` (field name -> value, the rest defaults), every :data:`RULES` checked:
    ``ConfigError`` ``"{source}: {section}.{key} {problem}"`` for the first that fails."""
    policy = OffloadPolicy(**values)
    for rule in RULES:
        value = getattr(policy, rule.key)
        try:
            good = rule.holds(value, policy)
        except (TypeError, ValueError, OverflowError):  # a value of the wrong type from a policy document
            good = False
        if not good:
            raise ConfigError(f"{source}: {section}.{rule.key} {rule.problem.format(value=value, p=policy)}")
    return policy


# The block-size rule. A PIP-76 block (managedLedgerOffloadMaxBlockSizeInBytes) holds whole entries: a block
# header (codecs.blocks), then per entry a length, an entry id and the entry. An entry that does not fit stops
# the job at that entry (EntryTooLargeError). Pulsar accepts entries up to its maxMessageSize (5 MiB by default;
# the entry is the message metadata and payload, plus broker entry metadata when the broker adds it), so a block
# smaller than that could stop the job whenever a producer sends a large batch: it is refused at load instead.

DEFAULT_MAX_MESSAGE_SIZE = MAX_MESSAGE_SIZE
"""Pulsar's ``maxMessageSize`` default (broker.conf): the largest entry the broker accepts."""
BROKER_ENTRY_METADATA_ROOM = 1024
"""Room for the broker entry metadata (``BrokerEntryMetadata``: a magic number, a size, a broker timestamp
and an index: a few tens of bytes) that a broker with entry metadata interceptors stores in front of the entry."""


class BlockSizeError(ConfigError):
    """The configured block size cannot hold the largest entry the broker accepts."""


def min_block_size(max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE) -> int:
    """The smallest ``managedLedgerOffloadMaxBlockSizeInBytes`` that holds any entry the broker accepts."""
    return BLOCK_HEADER_LENGTH + ENTRY_HEADER_LENGTH + max_message_size + BROKER_ENTRY_METADATA_ROOM


def check_block_size(
    block_size: int,
    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
    *,
    where: str = "managedLedgerOffloadMaxBlockSizeInBytes",
) -> None:
    """``BlockSizeError`` (one line, with the reason and the smallest accepted value) when ``block_size`` is
    smaller than ``min_block_size(max_message_size)``."""
    if max_message_size <= 0:
        raise ConfigError(f"maxMessageSize must be positive, got {max_message_size}")
    needed = min_block_size(max_message_size)
    if block_size < needed:
        raise BlockSizeError(
            f"{where} = {block_size} cannot hold the largest entry the broker accepts (maxMessageSize = "
            f"{max_message_size} bytes; a block needs a {BLOCK_HEADER_LENGTH}-byte header and {ENTRY_HEADER_LENGTH} "
            f"bytes per entry): set it to at least {needed}, or the job stops at the first entry that does not fit"
        )
