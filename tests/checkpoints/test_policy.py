"""The offload policy module (``checkpoints.policy``): every value has a rule, the rules hold for values built by
code (no TypeError escapes), and the block-size rule is sized by the block format's own constants."""

from __future__ import annotations

import math
import re
from dataclasses import fields
from typing import Any

import pytest

from streamoffload.checkpoints.policy import (
    RULES,
    BlockSizeError,
    OffloadPolicy,
    check_block_size,
    min_block_size,
    validated_policy,
)
from streamoffload.errors import ConfigError

NUMERIC = [f.name for f in fields(OffloadPolicy) if f.type in ("int", "float")]


def test_every_policy_value_has_a_rule() -> None:
    assert {rule.key for rule in RULES} == {f.name for f in fields(OffloadPolicy)}


def test_the_defaults_hold_every_rule() -> None:
    assert validated_policy({}, "c.toml", "offload") == OffloadPolicy()


@pytest.mark.parametrize("key", NUMERIC)
@pytest.mark.parametrize("bad", [math.nan, math.inf, "64MiB", None, [1]])
def test_a_value_a_document_built_by_code_may_hold_is_refused_naming_it(key: str, bad: Any) -> None:
    with pytest.raises(ConfigError, match=rf"^c\.toml: topics\.'t'\.{key} .*got {re.escape(repr(bad))}$") as err:
        validated_policy({key: bad}, "c.toml", "topics.'t'")
    assert "\n" not in str(err.value)


def test_the_first_broken_rule_is_the_one_reported() -> None:
    values = {"method": "tape", "offloadCompression": "lz4"}
    with pytest.raises(ConfigError, match=r"^c: offload\.method must be one of streaming, ledger, got 'tape'$"):
        validated_policy(values, "c", "offload")


def test_rules_across_values_name_both() -> None:
    with pytest.raises(
        ConfigError, match=r"^c: offload\.offloadBufferMaxBytes \(1048576\) must hold at least one block \(2097152\)$"
    ):
        validated_policy(
            {"offloadBufferMaxBytes": 1 << 20, "managedLedgerOffloadMaxBlockSizeInBytes": 2 << 20}, "c", "offload"
        )
    with pytest.raises(ConfigError, match=r"maxOffloadSegmentRolloverTimeMinutes must be positive \(at least 1 ms\)"):
        validated_policy({"maxOffloadSegmentRolloverTimeMinutes": 1 / 60_000 / 3}, "c", "offload")


def test_the_smallest_block_holds_the_header_an_entry_frame_the_message_and_broker_metadata() -> None:
    # 128-byte block header and 12-byte entry header (codecs.blocks), 1024 bytes of broker entry metadata room.
    assert min_block_size(0) == 128 + 12 + 1024
    assert min_block_size() == 5 * 1024 * 1024 + 128 + 12 + 1024
    check_block_size(min_block_size(1000), 1000)
    with pytest.raises(
        BlockSizeError, match=r"^managedLedgerOffloadMaxBlockSizeInBytes = 2163 cannot hold .*at least 2164,"
    ):
        check_block_size(min_block_size(1000) - 1, 1000)
