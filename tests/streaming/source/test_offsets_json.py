"""The Pulsar source's offset JSON, read in one place (``offset_planner.offset_positions``): by the source, which
refuses a malformed offset, and by the metrics, which read every source's progress and skip what is not ours."""

from __future__ import annotations

import json

import pytest

from streamoffload.metrics.model import Backlog
from streamoffload.metrics.sources import backlog_from_source_progress
from streamoffload.streaming.source.offset_planner import (
    SEALED_KEY,
    WAKE_KEY,
    offset_positions,
    offsets_json,
    split_offsets,
)

A = "persistent://public/default/a-partition-0"
B = "persistent://t/ns/b"


def test_positions_by_topic_partition_without_the_markers() -> None:
    doc = {A: [3, 9], B: [-1, -1], SEALED_KEY: True, WAKE_KEY: 1_700_000_000_000}
    assert offset_positions(doc) == {A: (3, 9), B: (-1, -1)}
    assert offset_positions(json.dumps(doc)) == {A: (3, 9), B: (-1, -1)}
    assert split_offsets(doc) == ({A: (3, 9), B: (-1, -1)}, True)
    assert split_offsets({A: [3, 9]}) == ({A: (3, 9)}, False)
    assert offset_positions(offsets_json({B: (1, 2), A: (3, 4)})) == {A: (3, 4), B: (1, 2)}


@pytest.mark.parametrize(
    "bad",
    [{A: [3]}, {A: [3, 9, 1]}, {A: "3:9"}, {A: [3.0, 9]}, {A: [True, 9]}, {A: None}, "[1, 2]", "not json", "7"],
)
def test_a_malformed_offset_is_refused(bad: object) -> None:
    with pytest.raises(ValueError, match="expected"):
        offset_positions(bad)  # type: ignore[arg-type]


def test_the_metrics_read_the_pulsar_sources_offsets_and_skip_others() -> None:
    progress = {"endOffset": json.dumps({A: [3, 4]}), "latestOffset": {A: [3, 9], WAKE_KEY: 5}}
    assert backlog_from_source_progress(progress) == {A: Backlog(latest=(3, 9), entries=5)}
    for other in ('{"last": "x"}', "12", "not json", json.dumps({A: [3]}), None):
        assert backlog_from_source_progress({"endOffset": other, "latestOffset": other}) == {}
