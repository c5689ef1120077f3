"""The one size grammar and the one duration grammar (``streamoffload.units``), as the configuration file and the
data source options read them (issue 53: the options' ``parse_size`` refused ``1.5g``, the file took it)."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamoffload.config import parse_config
from streamoffload.errors import ConfigError
from streamoffload.streaming.source.option_values import parse_size as option_size
from streamoffload.units import (
    GIB,
    KIB,
    MIB,
    TIB,
    format_duration_ms,
    format_size,
    parse_duration_ms,
    parse_size,
)

# Every spelling either grammar accepted before they were one, with its bytes.
SPELLINGS = {
    "1048576": 1 << 20,
    " 7 ": 7,
    "512b": 512,
    "512B": 512,
    "64k": 64 * KIB,
    "64KB": 64 * KIB,
    "64KiB": 64 * KIB,
    "64 kib": 64 * KIB,
    "64m": 64 * MIB,
    "64 mb": 64 * MIB,
    "64MiB": 64 * MIB,
    "1GiB": GIB,
    "1.5g": 3 * GIB // 2,
    "2TiB": 2 * TIB,
    "0.5k": 512,
    "64ki": 64 * KIB,  # the options' grammar took an "i" without "b"
    "3i": 3,
}


@pytest.mark.parametrize(("text", "size"), SPELLINGS.items())
def test_every_spelling_means_the_same_bytes_in_options_and_the_file(text: str, size: int) -> None:
    assert parse_size(text) == size
    assert option_size(text, "maxPartitionBytes") == size
    assert parse_config({"pulsar": {"max_bytes_per_trigger": text}}).pulsar.max_bytes_per_trigger == size
    if 64 * MIB <= size <= TIB:  # the offload buffer holds a (default, 64 MiB) block, and at most 1 TiB
        policy = parse_config({"offload": {"offloadBufferMaxBytes": text}}).policy_for("t")
        assert policy.offloadBufferMaxBytes == size


@pytest.mark.parametrize("text", ["", "k", "-1", "1e6", "1.5.2", "64 kk", "64mbi", "64 q", "1,5g", "0x10"])
def test_what_neither_grammar_accepts_is_refused_everywhere(text: str) -> None:
    with pytest.raises(ValueError, match=r"expected a size like 1048576, 64KiB, 64MiB or 1GiB, got"):
        parse_size(text)
    with pytest.raises(ConfigError, match=rf"^option maxPartitionBytes: expected a byte count like .*got {text!r}$"):
        option_size(text, "maxPartitionBytes")
    with pytest.raises(ConfigError, match=r"pulsar\.max_bytes_per_trigger must be a byte count"):
        parse_config({"pulsar": {"max_bytes_per_trigger": text}})


def test_a_fraction_of_a_byte_is_refused_naming_the_option() -> None:
    assert parse_size("1.5") == Fraction(3, 2)
    with pytest.raises(ConfigError, match=r"^option readBufferSize: expected a whole number of bytes, got '1\.5'$"):
        option_size("1.5", "readBufferSize")
    with pytest.raises(
        ConfigError, match=r"offload\.offloadBufferMaxBytes must be a whole number of bytes, got '1\.5'"
    ):
        parse_config({"offload": {"offloadBufferMaxBytes": "1.5"}})


def test_sizes_are_exact_past_a_float() -> None:
    big = "9007199254740993"  # 2**53 + 1: a float would round it
    assert parse_size(big) == 2**53 + 1 and option_size(big, "x") == 2**53 + 1


@given(st.integers(min_value=0, max_value=1 << 70))
def test_format_size_round_trips(size: int) -> None:
    text = format_size(size)
    assert parse_size(text) == size
    assert option_size(text, "x") == size


@pytest.mark.parametrize(
    ("size", "text"),
    [(0, "0"), (1000, "1000"), (1024, "1KiB"), (1536 * KIB, "1536KiB"), (64 * MIB, "64MiB"), (TIB, "1TiB")],
)
def test_format_size_takes_the_largest_exact_unit(size: int, text: str) -> None:
    assert format_size(size) == text


def test_durations() -> None:
    assert parse_duration_ms("500ms") == 500
    assert parse_duration_ms("90s") == 90_000
    assert parse_duration_ms("10m") == parse_duration_ms("10min") == 600_000
    assert parse_duration_ms("1h30m") == parse_duration_ms("1h 30m") == 5_400_000
    assert parse_duration_ms("2d") == 2 * 86_400_000
    assert parse_duration_ms("1.5s") == 1500
    for bad in ("", "-1s", "5", "5 years", "1h-30m", "s"):
        with pytest.raises(ValueError, match=r"expected a duration like 90s, 10m, 4h, 2d or 500ms"):
            parse_duration_ms(bad)


@given(st.integers(min_value=0, max_value=1 << 52))
def test_format_duration_round_trips(ms: int) -> None:
    text = format_duration_ms(ms)
    assert parse_duration_ms(text) == ms
    assert format_duration_ms(int(parse_duration_ms(text))) == text


def test_format_duration_takes_the_largest_units_first() -> None:
    assert format_duration_ms(0) == "0ms"
    assert format_duration_ms(90_000) == "1m30s"
    assert format_duration_ms(5_400_500) == "1h30m500ms"
    assert format_duration_ms(2 * 86_400_000) == "2d"
    with pytest.raises(ValueError, match="never negative"):
        format_duration_ms(-1)
    with pytest.raises(ValueError, match="never negative"):
        format_size(-1)
