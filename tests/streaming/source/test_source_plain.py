"""The Pulsar source's plain Python, without a broker or Spark: option parsing (source_options,
option_values), the max-min fair split of a micro-batch (admission) and the backlog (backlog)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamoffload.errors import ConfigError
from streamoffload.streaming.source.admission import fair_shares
from streamoffload.streaming.source.backlog import (
    PartitionBacklog,
    entries_between,
    read_backlog_file,
    write_backlog_file,
)
from streamoffload.streaming.source.option_values import (
    FALSE_WORDS,
    TRUE_WORDS,
    parse_bool,
    parse_positive,
    parse_size,
)
from streamoffload.streaming.source.source_options import SourceOptions, parse_pattern


def test_entries_between() -> None:
    assert entries_between((3, 10), (3, 15)) == (5, True)
    assert entries_between((3, 10), None) == (0, True)
    assert entries_between((3, 10), (3, 10)) == (0, True)
    assert entries_between((3, 10), (7, 4)) == (5, False)


@settings(max_examples=200, deadline=None)
@given(
    demands=st.lists(st.one_of(st.none(), st.integers(0, 50)), min_size=1, max_size=8),
    budget=st.integers(0, 200),
    rotation=st.integers(0, 20),
)
def test_fair_shares_are_max_min_fair(demands: list[int | None], budget: int, rotation: int) -> None:
    alloc = fair_shares(demands, budget, rotation)
    assert sum(alloc) <= budget
    assert all(d is None or a <= d for a, d in zip(alloc, demands, strict=True))
    if None in demands or sum(d for d in demands if d is not None) >= budget:
        assert sum(alloc) == budget
    else:
        assert alloc == demands
    # nobody left wanting has less than anyone else minus one unit
    wanting = [a for a, d in zip(alloc, demands, strict=True) if d is None or a < d]
    if wanting:
        assert max(alloc) - min(wanting) <= 1


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"topics": "t"}, "option serviceUrl is required"),
        ({"serviceUrl": "pulsar://h:1"}, "exactly one of the options topics"),
        ({"serviceUrl": "pulsar://h:1", "topics": "a", "topicsPattern": "a.*"}, "exactly one of the options"),
        ({"serviceUrl": "http://h:1", "topics": "a"}, "expected pulsar://HOST:PORT"),
        ({"serviceUrl": "pulsar://h:1", "topics": "a", "startingOffsets": "{"}, "startingOffsets: .*not valid JSON"),
        ({"serviceUrl": "pulsar://h:1", "topics": "a", "startingOffsets": '{"a": [1]}'}, "expected \\[ledgerId"),
        ({"serviceUrl": "pulsar://h:1", "topics": "a", "maxBytesPerTrigger": "lots"}, "maxBytesPerTrigger"),
        ({"serviceUrl": "pulsar://h:1", "topics": "a", "maxEntriesPerTrigger": "0"}, "maxEntriesPerTrigger: must be"),
        ({"serviceUrl": "pulsar://h:1", "topics": "a", "failOnDataLoss": "perhaps"}, "failOnDataLoss"),
        ({"serviceUrl": "pulsar://h:1", "topicsPattern": "a/b/c/("}, "bad regular expression"),
        ({"serviceUrl": "pulsar://h:1", "topics": "a", "pulsar.client.bogus": "1"}, "pulsar.client.bogus"),
        ({"serviceUrl": "pulsar://h:1", "topics": "a", "watchedPollSeconds": "-1"}, "watchedPollSeconds: must be >= 0"),
        ({"serviceUrl": "pulsar://h:1", "topics": "a", "watchedPollSeconds": "often"}, "watchedPollSeconds: expected"),
    ],
)
def test_bad_options_name_the_option(options: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        SourceOptions.parse(options)


def test_options_are_case_insensitive_and_normalised() -> None:
    opts = SourceOptions.parse(
        {
            "serviceurl": "pulsar://h:1",
            "topics": "a, tenant/ns/b",
            "startingoffsets": '{"a": [3, 7], "tenant/ns/b": "latest"}',
            "maxbytespertrigger": "64m",
            "pulsar.client.operationtimeoutseconds": "5",
        }
    )
    assert opts.topics == ("persistent://public/default/a", "persistent://tenant/ns/b")
    assert opts.starting_offsets == {"persistent://public/default/a": (3, 7), "persistent://tenant/ns/b": "latest"}
    assert opts.max_bytes_per_trigger == 64 << 20
    assert opts.client_opts == {"operationtimeoutseconds": "5"}
    assert parse_pattern("persistent://t/n/x-.*") == ("t/n", re.compile("x-.*"))


@pytest.mark.parametrize("word", [*TRUE_WORDS, "TRUE", " Yes ", "On"])
def test_every_true_word_is_true(word: str) -> None:
    assert parse_bool(word, "failOnDataLoss") is True


@pytest.mark.parametrize("word", [*FALSE_WORDS, "False", " NO ", "Off"])
def test_every_false_word_is_false(word: str) -> None:
    assert parse_bool(word, "failOnDataLoss") is False


def test_one_switch_parser_for_source_and_client_options() -> None:
    """The source's own switches and the pulsar.client.* ones accept the same words and name the option."""
    with pytest.raises(ConfigError, match="option sealAtEnd: expected true or false, got 'sometimes'"):
        parse_bool("sometimes", "sealAtEnd")
    base = {"serviceUrl": "pulsar://h:1", "topics": "a"}
    assert SourceOptions.parse({**base, "failOnDataLoss": "off"}).fail_on_data_loss is False
    assert SourceOptions.parse({**base, "sealAtEnd": "on"}).seal_at_end is True
    with pytest.raises(ConfigError, match=r"option pulsar\.client\.tlsAllowInsecureConnection: expected true or false"):
        SourceOptions.parse({**base, "pulsar.client.tlsAllowInsecureConnection": "maybe"})


def test_sizes_and_positive_numbers() -> None:
    assert parse_size("1048576", "x") == 1 << 20
    assert parse_size("64m", "x") == parse_size("64MiB", "x") == parse_size("64 mb", "x") == 64 << 20
    assert parse_size("1GiB", "x") == 1 << 30
    assert parse_size("1.5g", "x") == 3 << 29  # one grammar with the configuration file's (streamoffload.units)
    with pytest.raises(ConfigError, match="option arrowBatchBytes: expected a byte count"):
        parse_size("1,5g", "arrowBatchBytes")
    with pytest.raises(ConfigError, match="option arrowBatchBytes: expected a whole number of bytes"):
        parse_size("1.5", "arrowBatchBytes")
    assert parse_positive("2.5", "retryTimeoutSeconds", float) == 2.5
    with pytest.raises(ConfigError, match="option stallTimeoutMs: must be > 0"):
        parse_positive("0", "stallTimeoutMs")
    with pytest.raises(ConfigError, match="option stallTimeoutMs: expected a positive number"):
        parse_positive("soon", "stallTimeoutMs")


def test_backlog_file_round_trip(tmp_path: Path) -> None:
    path = str(tmp_path / "dash" / "backlog.json")
    write_backlog_file(path, {"t": PartitionBacklog("t", (3, 9), (3, 4), 5, True, 500)})
    doc = read_backlog_file(path)
    assert doc["partitions"] == {
        "t": {"topic": "t", "latest": [3, 9], "consumed": [3, 4], "entries": 5, "exact": True, "bytes": 500}
    }
    assert isinstance(doc["updated"], float)
    assert os.listdir(tmp_path / "dash") == ["backlog.json"]  # no temporary file left behind


def test_a_backlog_file_that_cannot_be_written_is_logged_not_raised(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    write_backlog_file(str(blocker / "backlog.json"), {"t": PartitionBacklog("t", None, (-1, -1), 0, True, None)})
    assert "cannot write backlogFile" in caplog.text
    assert blocker.read_text() == "not a directory"
