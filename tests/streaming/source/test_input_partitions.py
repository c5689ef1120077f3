"""minPartitions: cutting topic-partition ranges into pieces never loses, doubles or reorders an entry,
and every piece ends at an entry that exists (so each keeps the exact-range contract)."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from streamoffload.streaming.source.input_partitions import (
    Range,
    cut,
    cuttable_entries,
    group_ranges,
    range_weight,
    split_ranges,
)

Position = tuple[int, int]


def entries(ledgers: dict[int, int], start: Position, end: Position) -> list[Position]:
    """The entries in (start, end] of a topic whose ledger L holds entries 0 .. ledgers[L] - 1."""
    return [(led, e) for led in sorted(ledgers) for e in range(ledgers[led]) if start < (led, e) <= end]


@st.composite
def topic_and_range(draw: st.DrawFn) -> tuple[dict[int, int], Range]:
    counts = draw(st.lists(st.integers(1, 40), min_size=1, max_size=4))
    ids = sorted(draw(st.sets(st.integers(0, 50), min_size=len(counts), max_size=len(counts))))
    ledgers = dict(zip(ids, counts, strict=True))
    everything = entries(ledgers, (-1, -1), (10**6, 0))
    i = draw(st.integers(-1, len(everything) - 2))
    j = draw(st.integers(i + 1, len(everything) - 1))
    start = (-1, -1) if i < 0 else everything[i]
    return ledgers, Range("t", start, everything[j], draw(st.booleans()))


@settings(max_examples=300, deadline=None)
@given(topic_and_range(), st.integers(1, 12))
def test_pieces_cover_the_range_exactly_and_end_at_existing_entries(case: tuple[dict[int, int], Range], k: int) -> None:
    ledgers, r = case
    pieces = cut(r, k)
    assert pieces[0].start == r.start and pieces[-1].end == r.end
    assert all(a.end == b.start for a, b in itertools.pairwise(pieces))  # consecutive
    read = [e for p in pieces for e in entries(ledgers, p.start, p.end)]
    assert read == entries(ledgers, r.start, r.end)  # nothing lost, doubled or out of order
    existing = set(entries(ledgers, (-1, -1), (10**6, 0)))
    for p in pieces[:-1]:
        assert p.end in existing and p.end_known and p.start < p.end
    if not r.end_known:
        assert pieces == [r]  # a cap of admission control may not be an entry: never cut
    assert len(pieces) == min(max(k, 1), max(cuttable_entries(r), 1))


def test_ranges_are_cut_in_proportion_to_their_cuttable_entries() -> None:
    big = Range("a", (3, 9), (3, 99), True)  # 90 entries in ledger 3
    small = Range("b", (-1, -1), (7, 9), True)  # earlier ledgers unknown, 10 entries of ledger 7
    capped = Range("c", (1, 0), (1, 50), False)
    out = split_ranges([big, small, capped], 6)
    assert [r.topic for r in out].count("a") == 6 and [r.topic for r in out].count("b") == 1
    assert [r for r in out if r.topic == "c"] == [capped]
    assert split_ranges([big, small], 2) == [big, small]  # already enough ranges
    assert [(r.start, r.end) for r in split_ranges([Range("a", (5, -1), (5, 3), True)], 8)] == [
        ((5, -1), (5, 0)),
        ((5, 0), (5, 1)),
        ((5, 1), (5, 2)),
        ((5, 2), (5, 3)),
    ]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 3), st.integers(-1, 50), st.integers(0, 400)), min_size=0, max_size=60),
    st.integers(1, 16),
)
def test_groups_hold_every_range_once_in_order_and_at_most_max_groups(
    spans: list[tuple[int, int, int]], max_groups: int
) -> None:
    ranges = [
        Range(f"t-{i}", (ledger, first), (ledger, first + 1 + n), True) for i, (ledger, first, n) in enumerate(spans)
    ]
    groups = group_ranges(ranges, max_groups)
    assert len(groups) <= max(max_groups, 0) or not ranges
    assert sorted(r for g in groups for r in g) == sorted(ranges)  # each range exactly once
    for g in groups:  # a group keeps the order it was given
        assert list(g) == sorted(g, key=ranges.index)
    if len(ranges) <= max_groups:
        assert groups == [(r,) for r in ranges]


def test_groups_balance_weight_heaviest_first() -> None:
    heavy = Range("heavy", (1, -1), (1, 999), True)  # 1,000 entries
    light = [Range(f"l{i}", (1, -1), (1, 9), True) for i in range(40)]  # 10 each
    groups = group_ranges([heavy, *light], 4)
    loads = sorted(sum(range_weight(r) for r in g) for g in groups)
    assert len(groups) == 4
    assert [r for g in groups for r in g if r.topic == "heavy"] == [heavy]
    assert (heavy,) in groups  # alone: the light ones fill the other three
    assert max(loads[:3]) - min(loads[:3]) <= range_weight(light[0])  # the light ones spread evenly
