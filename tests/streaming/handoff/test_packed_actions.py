"""The segmenter's actions packed into one binary value per topic-partition (its Spark output) and unpacked
by the sink: every action comes back equal, in order; a cut value, a damaged header or a field that is not what
its kind needs is an error that says where and which field."""

from __future__ import annotations

import json
import struct
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamoffload.codecs.blocks import FormatVersion
from streamoffload.streaming.handoff.actions import (
    Action,
    ActionPackError,
    OpenAction,
    PartAction,
    RequestsAction,
    SealAction,
    StatsAction,
    pack_actions,
    unpack_actions,
)

names = st.text(min_size=1, max_size=30)
texts = st.text(max_size=30)
counts = st.integers(0, 2**62)
positions = st.tuples(st.integers(-1, 2**62), st.integers(-1, 2**62))
formats = st.sampled_from(FormatVersion)
requests = st.lists(texts, max_size=3).map(tuple)

opens = st.builds(
    OpenAction,
    topic=names,
    segment=names,
    manifest=st.binary(max_size=100),
    data_key=texts,
    index_key=texts,
    ordinal=counts,
    method=texts,
)
parts = st.builds(
    PartAction,
    topic=names,
    segment=names,
    part_number=st.integers(1, 2**31 - 1),
    layouts=st.binary(min_size=1, max_size=300),
    data_key=texts,
    manifest_key=texts,
    format=formats,
    length=counts,
    offset=counts,
    last=st.booleans(),
    first_block=st.none() | st.integers(1, 2**40),
)
seals = st.builds(
    SealAction,
    topic=names,
    segment=names,
    part_count=st.integers(0, 2**31 - 1),
    index=st.binary(max_size=200),
    manifest=st.binary(max_size=100),
    data_key=texts,
    index_key=texts,
    reason=texts,
    data_length=counts,
    entries=counts,
    entry_bytes=counts,
    ordinal=counts,
    end=positions,
    format=formats,
    epoch=counts,
    requests=requests,
)
requests_done = st.builds(RequestsAction, topic=names, requests=requests)
stats = st.builds(
    StatsAction,
    topic=names,
    buffered_bytes=counts,
    open_segment=st.none() | names,
    open_segment_entries=counts,
    open_segment_bytes=counts,
    open_segment_assigned_ms=st.none() | counts,
    last_position=st.none() | positions,
    now_ms=st.integers(-(2**62), 2**62),
    batch_entries=counts,
    batch_bytes=counts,
    wake_ms=st.none() | counts,
    read_throttled_s=st.floats(0, 1e9, allow_nan=False, allow_infinity=False),
)
actions: st.SearchStrategy[Action] = opens | parts | seals | requests_done | stats


def packed_by_hand(
    kind: str,
    *,
    topic: bytes = b"t",
    segment: bytes = b"",
    part_number: int = 0,
    data: bytes = b"",
    manifest: bytes = b"",
    data_key: bytes = b"",
    index_key: bytes = b"",
    info: Any = None,
) -> bytes:
    """One action in the documented shape: count, header ``<i8I``, then the eight fields."""
    raw_info = info if isinstance(info, bytes) else json.dumps(info if info is not None else {}).encode()
    fields = [topic, segment, kind.encode(), data, manifest, data_key, index_key, raw_info]
    return struct.pack("<I", 1) + struct.pack("<i8I", part_number, *map(len, fields)) + b"".join(fields)


def info_of(action: Action) -> dict[str, Any]:
    """The info document ``pack_actions`` wrote for one action (its last field)."""
    packed = pack_actions([action])
    lengths = struct.unpack_from("<i8I", packed, 4)[1:]
    return dict(json.loads(packed[len(packed) - lengths[-1] :]))


def with_info(action: Action, info: dict[str, Any]) -> bytes:
    """``action`` packed with another info document."""
    packed = pack_actions([action])
    part_number, *lengths = struct.unpack_from("<i8I", packed, 4)
    raw = json.dumps(info).encode()
    head = struct.pack("<I", 1) + struct.pack("<i8I", part_number, *lengths[:-1], len(raw))
    return head + packed[4 + 36 : len(packed) - lengths[-1]] + raw


PART = PartAction(
    "persistent://t/n/a", "seg", 2, b"L" * 40, "data", "mkey", FormatVersion.V2, 4096, 8192, first_block=3
)


@given(st.lists(actions, max_size=6))
def test_every_action_comes_back_equal_and_in_order(batch: list[Action]) -> None:
    assert list(unpack_actions(pack_actions(batch))) == batch


def test_no_actions_pack_to_nothing() -> None:
    assert pack_actions([]) == b""
    assert list(unpack_actions(b"")) == []


def test_a_part_packs_to_the_documented_shape() -> None:
    info = {"manifest_key": "mkey", "format": 2, "length": 4096, "offset": 8192}
    info["checksums"] = {"first_block": 3, "offset": 8192}
    raw = json.dumps(info, separators=(",", ":")).encode()
    expected = packed_by_hand(
        "part", topic=b"persistent://t/n/a", segment=b"seg", part_number=2, data=b"L" * 40, data_key=b"data", info=raw
    )
    assert pack_actions([PART]) == expected


@given(st.lists(actions, min_size=1, max_size=3), st.data())
def test_a_cut_value_is_an_error_naming_where_it_ends(batch: list[Action], data: st.DataObject) -> None:
    packed = pack_actions(batch)
    cut = data.draw(st.integers(1, len(packed) - 1))
    with pytest.raises(ActionPackError, match=rf"packed actions end inside .* at byte \d+ of {cut}"):
        list(unpack_actions(packed[:cut]))


def test_a_value_cut_between_two_actions_or_with_bytes_after_them_is_an_error() -> None:
    two = RequestsAction("t", ("r1",))
    first = pack_actions([PART])
    both = pack_actions([PART, two])
    assert len(both) > len(first)
    with pytest.raises(ActionPackError, match="end inside"):
        list(unpack_actions(both[: len(first)]))
    with pytest.raises(ActionPackError, match="3 bytes after their 2 actions"):
        list(unpack_actions(both + b"abc"))


@given(actions, st.data())
def test_a_field_of_the_wrong_type_is_refused_by_name(action: Action, data: st.DataObject) -> None:
    info = info_of(action)
    key = data.draw(st.sampled_from(sorted(info)))
    info[key] = [[]]  # no field of any kind is a list holding a list
    with pytest.raises(ActionPackError, match=rf"packed {action.kind} action of .*: field '{key}' is \[\[\]\], not "):
        list(unpack_actions(with_info(action, info)))


@given(actions, st.data())
def test_a_missing_field_is_refused_by_name(action: Action, data: st.DataObject) -> None:
    info = info_of(action)
    key = data.draw(st.sampled_from(sorted(set(info) - {"last", "checksums"})))  # those two have defaults
    del info[key]
    with pytest.raises(ActionPackError, match=rf"field '{key}' is missing"):
        list(unpack_actions(with_info(action, info)))


@pytest.mark.parametrize(
    ("packed", "message"),
    [
        (packed_by_hand("abandon", segment=b"s"), "its kind 'abandon' is none of open, part, seal, requests, stats"),
        (packed_by_hand("stats", topic=b"\xff"), "the 'topic' of an action is not UTF-8"),
        (packed_by_hand("requests", info=b"{"), "packed requests action of 't': its info is not JSON"),
        (packed_by_hand("requests", info=["r"]), "its info is list, not an object"),
        (packed_by_hand("requests", topic=b"", info={"requests": []}), "its topic is empty"),
        (packed_by_hand("stats", segment=b"s"), "packed stats action of 't' segment 's': it names a segment"),
        (packed_by_hand("requests", data=b"x", info={"requests": []}), "it carries a part number, data"),
        (packed_by_hand("part", part_number=1, data=b"x"), "packed part action of 't': it names no segment"),
        (packed_by_hand("part", segment=b"s", part_number=-1), "its part number is -1"),
        (packed_by_hand("part", segment=b"s", part_number=0, data=b"x"), "its part number is 0, not 1 or more"),
        (packed_by_hand("part", segment=b"s", part_number=1), "it carries no block layouts"),
        (packed_by_hand("open", segment=b"s", data=b"x"), "it carries a part number or data"),
    ],
)
def test_a_damaged_action_is_refused_saying_what_is_wrong(packed: bytes, message: str) -> None:
    with pytest.raises(ActionPackError, match=message):
        list(unpack_actions(packed))


def test_values_out_of_their_range_are_refused_by_name() -> None:
    def refused(info: dict[str, Any], message: str, action: Action = PART) -> None:
        with pytest.raises(ActionPackError, match=message):
            list(unpack_actions(with_info(action, {**info_of(action), **info})))

    refused({"format": 3}, "field 'format' is 3, not a format version")
    refused({"length": -1}, "field 'length' is -1, below 0")
    refused({"length": True}, "field 'length' is True, not an integer")
    refused({"last": 1}, "field 'last' is 1, not true or false")
    refused({"checksums": {"first_block": 0, "offset": 8192}}, "its checksums: field 'first_block' is 0, below 1")
    refused({"checksums": {"first_block": 3, "offset": 0}}, "its checksums start at 0, the part at 8192")
    seal = SealAction("t", "s", 2, b"i", b"m", "d", "x", "size", 10, 1, 1, 0, (1, 2), FormatVersion.V2, 0)
    refused({"parts": 3}, "its info says 3 parts, its header 2", seal)
    refused({"end": [1]}, r"field 'end' is \[1\], not a position", seal)
    refused({"requests": ["a", 1]}, "field 'requests' is .* not a list of strings", seal)
    figures = StatsAction("t", 0, None, 0, 0, None, None, 0, 0, 0, None, 0.5)
    refused({"read_throttled_s": -0.5}, "field 'read_throttled_s' is -0.5, not a number of seconds", figures)
    refused({"open_segment": 7}, "field 'open_segment' is 7, not a string", figures)
