"""Read-through and ``startingTime`` decisions in plain Python: which side serves each position, where a
hole neither side holds is reported, and the probe searches over a broker of several ledgers."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamoffload.codecs.positions import Position
from streamoffload.pulsar.exactly_once import BEFORE_EARLIEST, DataLossError, Probe, ReadEntry, gap
from streamoffload.read.starting_time import broker_position_at
from streamoffload.read.through import BrokerFront, LedgerSpan, StoredHistory, read_through_range

TP = "persistent://public/default/t"


def entry(pos: Position, source: str) -> ReadEntry:
    return ReadEntry(TP, pos[0], pos[1], 1000 * pos[0] + pos[1], 1, source.encode())


class Sides:
    """A store holding ``stored`` positions and a broker holding ``broker`` ones (both sorted)."""

    def __init__(self, stored: list[Position], broker: list[Position]) -> None:
        self.stored, self.broker = stored, broker
        self.history = StoredHistory([LedgerSpan(lg, en, en, 10) for lg, en in stored])
        self.probes = 0

    def read_stored(self, after: Position, last: Position) -> Iterator[ReadEntry]:
        return (entry(p, "store") for p in self.stored if after < p <= last)

    def read_broker(self, after: Position, end: Position, known: bool) -> Iterator[ReadEntry]:
        last = after
        for p in self.broker:
            if p <= after:
                continue
            if p > end:
                return
            if gap(last, p):
                raise DataLossError(f"entries between {last} and {p} are missing")
            last = p
            yield entry(p, "broker")

    def probe(self, after: Position) -> Probe | None:
        self.probes += 1
        nxt = next((p for p in self.broker if p > after), None)
        return None if nxt is None else Probe(nxt, 1, 10, 1000 * nxt[0] + nxt[1])

    def read(self, start: Position, end: Position, *, fail: bool = True) -> list[tuple[Position, str]]:
        got = read_through_range(
            TP,
            start,
            end,
            history=self.history,
            read_stored=self.read_stored,
            read_broker=self.read_broker,
            broker=BrokerFront(self.probe),
            fail_on_data_loss=fail,
        )
        return [(e.position, e.payload.decode()) for e in got]


def ledger(lg: int, first: int, last: int) -> list[Position]:
    return [(lg, e) for e in range(first, last + 1)]


def test_the_store_serves_history_and_the_broker_the_rest() -> None:
    sides = Sides(ledger(1, 0, 9) + ledger(2, 0, 4), ledger(2, 3, 9) + ledger(5, 0, 3))
    got = sides.read(BEFORE_EARLIEST, (5, 3))
    assert [p for p, _ in got] == ledger(1, 0, 9) + ledger(2, 0, 9) + ledger(5, 0, 3)
    assert {p for p, src in got if src == "store"} == set(ledger(1, 0, 9) + ledger(2, 0, 4))
    # From inside the stored part, and a range ending there, touch the broker not at all.
    sides.probes = 0
    assert [p for p, _ in sides.read((1, 4), (2, 2))] == ledger(1, 5, 9) + ledger(2, 0, 2)
    assert sides.probes == 0


def test_a_broker_history_starting_before_the_store_is_read_from_the_broker() -> None:
    sides = Sides(ledger(4, 0, 5), ledger(2, 0, 3) + ledger(4, 0, 9))
    got = sides.read(BEFORE_EARLIEST, (4, 9))
    assert [p for p, _ in got] == ledger(2, 0, 3) + ledger(4, 0, 9)
    assert all(src == "broker" for _, src in got)


def test_a_hole_in_the_store_is_filled_by_the_broker_or_named() -> None:
    stored = ledger(1, 0, 9) + ledger(1, 20, 29)
    filled = Sides(stored, ledger(1, 5, 29) + ledger(3, 0, 2))
    assert [p for p, _ in filled.read(BEFORE_EARLIEST, (3, 2))] == ledger(1, 0, 29) + ledger(3, 0, 2)
    trimmed = Sides(stored, ledger(3, 0, 2))  # ledger 1 is gone from the broker: entries 10..19 are lost
    with pytest.raises(DataLossError, match=r"ledger 1 entries 10\.\.19 are in neither the broker nor"):
        trimmed.read(BEFORE_EARLIEST, (3, 2))
    got = trimmed.read(BEFORE_EARLIEST, (3, 2), fail=False)
    assert [p for p, _ in got] == ledger(1, 0, 9) + ledger(1, 20, 29) + ledger(3, 0, 2)


def test_a_broker_not_following_the_store_is_data_loss() -> None:
    sides = Sides(ledger(1, 0, 9), ledger(3, 4, 9))  # ledger 3's entries 0..3 are nowhere
    with pytest.raises(DataLossError, match=r"after 1:9 up to 3:4 \(ledger 3 entries 0\.\.3 at least\) are in neither"):
        sides.read(BEFORE_EARLIEST, (3, 9))


@given(
    st.lists(st.integers(1, 4), min_size=1, max_size=4),  # ledger lengths
    st.integers(0, 60),  # how many of the first entries the store holds
    st.integers(0, 60),  # where the broker's history starts
    st.integers(0, 60),
    st.integers(0, 60),
)
def test_every_position_once_in_order_whichever_side_holds_it(
    lengths: list[int], stored_count: int, trimmed: int, start_at: int, end_at: int
) -> None:
    positions = [(10 + i, e) for i, n in enumerate(lengths) for e in range(n)]
    stored_count = min(stored_count, len(positions))
    trimmed = min(trimmed, stored_count, len(positions) - 1)  # no hole: the broker keeps what was not stored
    # The broker drops whole ledgers from the front, as Pulsar's retention does.
    first_kept = positions[trimmed][0]
    broker = [p for p in positions if p[0] >= first_kept]
    sides = Sides(positions[:stored_count], broker)
    start = BEFORE_EARLIEST if start_at >= len(positions) else positions[start_at]
    end = positions[min(end_at, len(positions) - 1)]
    got = [p for p, _ in sides.read(start, end)]
    assert got == [p for p in positions if start < p <= end]


def test_broker_position_at_walks_ledgers_and_bisects_entry_ids() -> None:
    # Ledgers 3 (0..9), 7 (0..4), 9 (0..20); publish time = 1000 * ledger + entry.
    sides = Sides([], ledger(3, 0, 9) + ledger(7, 0, 4) + ledger(9, 0, 20))
    latest = (9, 20)
    for lg, en in sides.broker:
        assert broker_position_at(sides.probe, latest, 1000 * lg + en) == (lg, en)
    assert broker_position_at(sides.probe, latest, 0) == (3, 0)
    assert broker_position_at(sides.probe, latest, 3500) == (7, 0)  # between ledgers: the next ledger's first
    assert broker_position_at(sides.probe, latest, 9021) is None
    assert broker_position_at(sides.probe, None, 0) is None


@given(
    st.lists(st.tuples(st.integers(1, 500), st.integers(1, 64)), min_size=1, max_size=5),  # (entries, bytes each)
    st.integers(0, 3000),
    st.integers(1, 10),
    st.integers(256, 20_000),
)
def test_stored_cuts_are_stored_positions_in_order_of_about_piece_bytes(
    ledgers: list[tuple[int, int]], start_at: int, most: int, piece: int
) -> None:
    spans = [LedgerSpan(10 + i, 0, n - 1, n * size) for i, (n, size) in enumerate(ledgers)]
    history = StoredHistory(spans)
    positions = [(s.ledger_id, e) for s in spans for e in range(s.first, s.last + 1)]
    start = BEFORE_EARLIEST if start_at >= len(positions) else positions[start_at]
    end = positions[-1]
    cuts = history.stored_cuts(start, end, piece, most)
    assert cuts == sorted(set(cuts)) and len(cuts) <= most - 1
    assert all(c in positions and start < c < end for c in cuts)
    stored = sum(s.size for s in spans) if start == BEFORE_EARLIEST else None
    if stored is not None and stored >= 4 * piece and most >= 4 and len(positions) >= 8:
        assert cuts, "a large stored part is cut"
