"""The segmenter's actions packed into one binary value per topic-partition (its Spark output) and unpacked
by the sink: every field comes back exactly, in order, and a cut value is an error that says where."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamoffload.streaming.segmenter.segmenter_model import ACTION_COLUMNS, Action, pack_actions, unpack_actions

texts = st.text(max_size=40)
actions = st.builds(
    Action,
    topic=texts,
    segment=texts,
    action=st.sampled_from(["open", "part", "seal", "abandon"]) | texts,
    part_number=st.integers(-(2**31), 2**31 - 1),
    data=st.binary(max_size=300),
    manifest=st.binary(max_size=100),
    data_key=texts,
    index_key=texts,
    info=texts,
)


@given(st.lists(actions, max_size=6))
def test_every_field_of_every_action_comes_back_in_order(batch: list[Action]) -> None:
    rows = list(unpack_actions(pack_actions(batch)))
    assert rows == [{c: getattr(a, c) for c in ACTION_COLUMNS} for a in batch]


def test_no_actions_pack_to_nothing() -> None:
    assert pack_actions([]) == b""
    assert list(unpack_actions(b"")) == []


@given(st.lists(actions, min_size=1, max_size=3), st.data())
def test_a_cut_value_is_an_error_naming_where_it_ends(batch: list[Action], data: st.DataObject) -> None:
    packed = pack_actions(batch)
    cut = data.draw(st.integers(1, len(packed) - 1))
    rows = unpack_actions(packed[:cut])
    with pytest.raises(ValueError, match=rf"packed actions end inside .* at byte \d+ of {cut}"):
        list(rows)


def test_a_value_cut_between_two_actions_or_with_bytes_after_them_is_an_error() -> None:
    one, two = Action("t", "s", "part", 1, b"x"), Action("t", "s", "seal", 0, b"y", info="{}")
    first = pack_actions([one])
    both = pack_actions([one, two])
    assert len(both) > len(first)
    with pytest.raises(ValueError, match="end inside"):
        list(unpack_actions(both[: len(first)]))
    with pytest.raises(ValueError, match="3 bytes after their 2 actions"):
        list(unpack_actions(both + b"abc"))
