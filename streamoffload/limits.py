"""Limits that tie the offload policy to what the broker accepts.

A PIP-76 block (``managedLedgerOffloadMaxBlockSizeInBytes``) holds whole entries: a 128-byte block header,
then per entry a 4-byte length, an 8-byte entry id and the entry. An entry that does not fit stops the
job at that entry (``EntryTooLargeError``). Pulsar accepts entries up to its ``maxMessageSize`` (5 MiB by
default; the entry is the message metadata and payload, plus broker entry metadata when the broker adds
it), so a block smaller than that can stop the job whenever a producer sends a large batch; it is refused
when the configuration is loaded instead.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from streamoffload.codecs.compression import MAX_MESSAGE_SIZE
from streamoffload.errors import ConfigError

if TYPE_CHECKING:
    from streamoffload.config import Config

DEFAULT_MAX_MESSAGE_SIZE = MAX_MESSAGE_SIZE
"""Pulsar's ``maxMessageSize`` default (broker.conf): the largest entry the broker accepts."""

BLOCK_HEADER_BYTES = 128
ENTRY_FRAME_BYTES = 4 + 8
BROKER_ENTRY_METADATA_ROOM = 1024
"""Room for the broker entry metadata (``BrokerEntryMetadata``: a magic number, a size, a broker timestamp
and an index: a few tens of bytes) that a broker with entry metadata interceptors stores in front of the entry."""


class BlockSizeError(ConfigError):
    """The configured block size cannot hold the largest entry the broker accepts."""


def min_block_size(max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE) -> int:
    """The smallest ``managedLedgerOffloadMaxBlockSizeInBytes`` that holds any entry the broker accepts."""
    return BLOCK_HEADER_BYTES + ENTRY_FRAME_BYTES + max_message_size + BROKER_ENTRY_METADATA_ROOM


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
            f"{max_message_size} bytes; a block needs a 128-byte header and 12 bytes per entry): set it to at least "
            f"{needed}, or the job stops at the first entry that does not fit"
        )


def check_config_block_sizes(config: Config, max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE) -> None:
    """``check_block_size`` for every policy the configuration can apply: the configured topics', each
    namespace's and each topic's policy (and the broker defaults through them). For ``config.load_config``."""
    names: list[str] = [*config.pulsar.topics, *config.topic_policies]
    names += [f"persistent://{namespace}/{_PROBE}" for namespace in config.namespace_policies]
    if not names:
        names = [f"persistent://public/default/{_PROBE}"]
    for name in names:
        policy = config.policy_for(name)
        where = f"{config.source}: managedLedgerOffloadMaxBlockSizeInBytes"
        if not name.endswith(_PROBE):
            where += f" (policy of {name})"
        check_block_size(policy.managedLedgerOffloadMaxBlockSizeInBytes, max_message_size, where=where)


_PROBE = "streamoffload-block-size-check"
